//! Values made storable before they are written.
//!
//! PostgreSQL refuses a NUL byte in `text` (SQLSTATE 22021) and `\u0000` in `jsonb`
//! (22P05). Such a refusal is not a failed attempt that a retry could fix: the same
//! value is refused every time. When the value came from outside (a foreign
//! delivery's routing key or headers, a handler's error, a panic message, a broker's
//! error text), the write that should record the delivery's fate would fail forever
//! and the delivery would loop (nacked and redelivered, or left to its lease again
//! and again). So every such value is written with each NUL replaced by U+FFFD, and
//! error texts are also cut to [`MAX_ERROR_BYTES`] so a huge panic message cannot
//! bloat every row it fails.

use std::borrow::Cow;

use outbox_core::{Headers, Message};

/// The longest error text stored (in bytes, cut at a character boundary).
pub(crate) const MAX_ERROR_BYTES: usize = 4096;

/// What replaces a NUL byte.
const REPLACEMENT: char = '\u{FFFD}';

/// Marks an error text that was cut.
const CUT: &str = " …[cut]";

/// `s` with every NUL replaced by U+FFFD; borrowed when there is none.
pub(crate) fn text(s: &str) -> Cow<'_, str> {
    if s.contains('\0') {
        Cow::Owned(s.replace('\0', &REPLACEMENT.to_string()))
    } else {
        Cow::Borrowed(s)
    }
}

/// As [`text`], for an optional value.
pub(crate) fn opt_text(s: Option<&str>) -> Option<Cow<'_, str>> {
    s.map(text)
}

/// An error text as stored: NULs replaced, at most [`MAX_ERROR_BYTES`] bytes.
pub(crate) fn error_text(s: &str) -> String {
    let s = text(s);
    if s.len() <= MAX_ERROR_BYTES {
        return s.into_owned();
    }
    let mut end = MAX_ERROR_BYTES - CUT.len();
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{CUT}", &s[..end])
}

/// Headers with NULs replaced in names and values; borrowed when there is none.
/// Two names that differ only where one has a NUL and the other U+FFFD would merge;
/// the later one (in name order) wins. That is a foreign publisher's own mess, and
/// losing one header value beats never recording the delivery.
pub(crate) fn headers(h: &Headers) -> Cow<'_, Headers> {
    if h.iter()
        .all(|(k, v)| !k.contains('\0') && !v.contains('\0'))
    {
        return Cow::Borrowed(h);
    }
    Cow::Owned(
        h.iter()
            .map(|(k, v)| (text(k).into_owned(), text(v).into_owned()))
            .collect(),
    )
}

/// `m` with every text field storable; borrowed when it already is.
pub(crate) fn message(m: &Message) -> Cow<'_, Message> {
    let texts = [
        Some(m.exchange.as_str()),
        Some(m.routing_key.as_str()),
        m.message_type.as_deref(),
        Some(m.content_type.as_str()),
        m.source.as_deref(),
        m.correlation_id.as_deref(),
        m.ordering_key.as_deref(),
    ];
    let clean = texts.iter().flatten().all(|s| !s.contains('\0'))
        && matches!(headers(&m.headers), Cow::Borrowed(_));
    if clean {
        return Cow::Borrowed(m);
    }
    let owned = |s: &str| text(s).into_owned();
    Cow::Owned(Message {
        exchange: owned(&m.exchange),
        routing_key: owned(&m.routing_key),
        message_type: m.message_type.as_deref().map(owned),
        headers: headers(&m.headers).into_owned(),
        content_type: owned(&m.content_type),
        source: m.source.as_deref().map(owned),
        correlation_id: m.correlation_id.as_deref().map(owned),
        ordering_key: m.ordering_key.as_deref().map(owned),
        ..m.clone()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nul_bytes_are_replaced_and_clean_text_is_borrowed() {
        assert_eq!(text("a\0b\0"), "a\u{FFFD}b\u{FFFD}");
        assert!(matches!(text("plain"), Cow::Borrowed("plain")));
        assert_eq!(opt_text(Some("\0")).as_deref(), Some("\u{FFFD}"));
        assert_eq!(opt_text(None), None);
    }

    #[test]
    fn error_texts_are_cut_at_a_char_boundary_with_a_mark() {
        assert_eq!(error_text("short\0"), "short\u{FFFD}");
        let long = "é".repeat(5_000); // 10,000 bytes, two per char
        let cut = error_text(&long);
        assert!(cut.len() <= MAX_ERROR_BYTES, "{}", cut.len());
        assert!(cut.ends_with(CUT));
        assert!(cut.starts_with("éé"));
        let exact = "x".repeat(MAX_ERROR_BYTES);
        assert_eq!(error_text(&exact), exact);
    }

    #[test]
    fn every_text_field_of_a_message_and_its_headers_is_made_storable() {
        let mut m = outbox_core::NewMessage::new("ex\0", "key\0", b"body\0".to_vec())
            .with_type("t\0")
            .into_message(
                outbox_core::MessageId::v7(outbox_core::Timestamp::UNIX_EPOCH, [0; 10]),
                outbox_core::Timestamp::UNIX_EPOCH,
            );
        m.headers.insert("h\0".into(), "v\0".into());
        m.headers.insert("ok".into(), "fine".into());
        m.content_type = "c\0".into();
        m.source = Some("s\0".into());
        m.correlation_id = Some("r\0".into());
        let s = message(&m);
        for t in [
            &s.exchange,
            &s.routing_key,
            &s.content_type,
            s.message_type.as_ref().expect("type"),
            s.source.as_ref().expect("source"),
            s.correlation_id.as_ref().expect("correlation"),
        ] {
            assert!(!t.contains('\0') && t.ends_with('\u{FFFD}'), "{t:?}");
        }
        assert_eq!(
            s.headers.get("h\u{FFFD}").map(String::as_str),
            Some("v\u{FFFD}")
        );
        assert_eq!(s.headers.get("ok").map(String::as_str), Some("fine"));
        assert_eq!(
            s.payload, b"body\0",
            "the payload is bytea: kept as it came"
        );
        assert_eq!(s.id, m.id);
        let clean = message(&s);
        assert!(matches!(clean, Cow::Borrowed(_)));
    }
}
