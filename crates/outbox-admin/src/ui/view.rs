//! What the pages show, ready for the templates: status badges that say what each
//! status means, payloads pretty-printed (JSON), as text, or as hex (the charts are
//! in `chart`).

use std::fmt::Write as _;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;

use crate::params::Side;

/// Payloads larger than this are cut unless "show all" is asked for.
pub(crate) const SHOWN_BYTES: usize = 16 * 1024;

/// A status with its meaning.
#[derive(Debug, Clone)]
pub(crate) struct Badge {
    pub(crate) name: String,
    pub(crate) class: &'static str,
    pub(crate) meaning: &'static str,
}

/// What `status` means (users confuse "pending" and "sent": sent is not consumed).
pub(crate) fn meaning(status: &str) -> &'static str {
    match status {
        "pending" => "written to the outbox, not yet published",
        "sent" => "published: the broker confirmed it (this says nothing about consumers)",
        "publish_failed" => "publishing failed; a retry is scheduled",
        "dead" => "out of retries; nothing more happens until an operator acts",
        "received" => "received by the consumer; the handler has not succeeded yet",
        "consumed" => "the handler succeeded",
        "consume_failed" => "the handler failed; a retry is scheduled",
        _ => "",
    }
}

/// The badge of an outbox message: a pending one with a due time is "scheduled"
/// (still `pending` in the API, whose status filter finds it so).
pub(crate) fn message_badge(status: &str, due_at: Option<&str>) -> Badge {
    match due_at {
        Some(_) if status == "pending" => Badge {
            name: "scheduled".to_owned(),
            class: "info",
            meaning: "pending, delayed: published at its due time (or when an operator says publish now)",
        },
        _ => badge(status),
    }
}

pub(crate) fn badge(status: &str) -> Badge {
    let class = match status {
        "dead" => "bad",
        "publish_failed" | "consume_failed" => "warn",
        "sent" | "consumed" => "ok",
        _ => "info",
    };
    Badge {
        name: status.to_owned(),
        class,
        meaning: meaning(status),
    }
}

/// The statuses of a side, in their order, as the API names them.
pub(crate) const fn statuses(side: Side) -> [&'static str; 4] {
    side.status_names()
}

/// One `<option>` of a status `<select>`.
#[derive(Debug, Clone)]
pub(crate) struct StatusOption {
    pub(crate) value: &'static str,
    pub(crate) meaning: &'static str,
    pub(crate) selected: bool,
}

pub(crate) fn status_options(side: Side, selected: Option<&str>) -> Vec<StatusOption> {
    statuses(side)
        .iter()
        .map(|s| StatusOption {
            value: s,
            meaning: meaning(s),
            selected: selected == Some(*s),
        })
        .collect()
}

/// The most a page shows of a payload with "show all": beyond it the page says
/// so and the JSON API's detail gives the whole payload. A bound, because a
/// multi-megabyte body (dead letters keep what the broker delivered) rendered
/// whole would take the process serving the page down with it.
pub(crate) const SHOW_ALL_BYTES: usize = 1024 * 1024;

/// A payload as shown on a detail page.
#[derive(Debug, Clone)]
pub(crate) struct PayloadView {
    /// `json`, `text` or `hex`.
    pub(crate) kind: &'static str,
    pub(crate) text: String,
    /// Cut to [`SHOWN_BYTES`] (or, with "show all", to [`SHOW_ALL_BYTES`]).
    pub(crate) cut: bool,
}

/// `shown` (text, or base64 when `base64`) as JSON indented, text, or hex; cut to
/// [`SHOWN_BYTES`], or [`SHOW_ALL_BYTES`] when `all`.
///
/// JSON is indented from its own text, token by token, not parsed into values
/// and printed again: what is shown is what was stored (key order, duplicate keys,
/// numbers beyond f64 all kept), and the work stops at the cut, so deep nesting
/// cannot make the indented text explode in memory.
pub(crate) fn payload(shown: &str, base64: bool, all: bool) -> PayloadView {
    let limit = if all { SHOW_ALL_BYTES } else { SHOWN_BYTES };
    if base64 {
        // A hex dump line takes 16 bytes to 78 characters: about five per byte.
        let max = limit / 5;
        let bytes = STANDARD.decode(shown).unwrap_or_default();
        let cut = bytes.len() > max;
        return PayloadView {
            kind: "hex",
            text: hex_dump(&bytes[..bytes.len().min(max)]),
            cut,
        };
    }
    let trimmed = shown.trim_start();
    let is_json = trimmed.starts_with(['{', '['])
        && serde_json::from_str::<serde::de::IgnoredAny>(shown).is_ok();
    if is_json {
        let (text, cut) = indent_json(trimmed, limit);
        return PayloadView {
            kind: "json",
            text,
            cut,
        };
    }
    let cut = shown.len() > limit;
    PayloadView {
        kind: "text",
        text: shown[..floor_char_boundary(shown, limit)].to_owned(),
        cut,
    }
}

/// The largest char boundary of `s` at or below `at`.
fn floor_char_boundary(s: &str, at: usize) -> usize {
    let mut end = at.min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    end
}

/// Valid JSON text indented by two spaces a level, at most `limit` bytes of it;
/// true when cut.
fn indent_json(json: &str, limit: usize) -> (String, bool) {
    let mut out = String::with_capacity(json.len().min(limit) + 64);
    let mut depth = 0_usize;
    let mut in_string = false;
    let mut escaped = false;
    let newline = |out: &mut String, depth: usize| {
        out.push('\n');
        for _ in 0..depth {
            out.push_str("  ");
        }
    };
    let mut chars = json.chars().peekable();
    while let Some(c) = chars.next() {
        if out.len() >= limit {
            let end = floor_char_boundary(&out, limit);
            out.truncate(end);
            return (out, true);
        }
        if in_string {
            out.push(c);
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => {
                in_string = true;
                out.push(c);
            }
            '{' | '[' => {
                out.push(c);
                // An empty object or array stays on one line.
                while chars.peek().is_some_and(|n| n.is_ascii_whitespace()) {
                    chars.next();
                }
                if chars.peek().is_some_and(|n| matches!(n, '}' | ']')) {
                    if let Some(close) = chars.next() {
                        out.push(close);
                    }
                } else {
                    depth += 1;
                    newline(&mut out, depth);
                }
            }
            '}' | ']' => {
                depth = depth.saturating_sub(1);
                newline(&mut out, depth);
                out.push(c);
            }
            ',' => {
                out.push(c);
                newline(&mut out, depth);
            }
            ':' => out.push_str(": "),
            c if c.is_ascii_whitespace() => {}
            c => out.push(c),
        }
    }
    let cut = out.len() > limit;
    if cut {
        out.truncate(floor_char_boundary(&out, limit));
    }
    (out, cut)
}

/// 16 bytes a line: offset, hex, and the printable ASCII.
pub(crate) fn hex_dump(bytes: &[u8]) -> String {
    let mut out = String::new();
    for (n, chunk) in bytes.chunks(16).enumerate() {
        let _ = write!(out, "{:08x}  ", n * 16);
        for b in chunk {
            let _ = write!(out, "{b:02x} ");
        }
        for _ in chunk.len()..16 {
            out.push_str("   ");
        }
        out.push(' ');
        out.extend(chunk.iter().map(|&b| {
            if b.is_ascii_graphic() || b == b' ' {
                char::from(b)
            } else {
                '.'
            }
        }));
        out.push('\n');
    }
    out
}

/// A list preview: at most `chars` characters, with an ellipsis when cut.
pub(crate) fn preview(text: &str, base64: bool, chars: usize) -> String {
    if base64 {
        return "(binary)".to_owned();
    }
    let mut shown: String = text.chars().take(chars).collect();
    if text.chars().nth(chars).is_some() {
        shown.push('…');
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_are_pretty_json_text_or_hex_and_cut_unless_all() {
        let json = payload(r#"{"a":1,"b":[2]}"#, false, false);
        assert_eq!(json.kind, "json");
        assert!(json.text.contains("\n  \"a\": 1"), "{}", json.text);
        let text = payload("plain words", false, false);
        assert_eq!((text.kind, text.text.as_str()), ("text", "plain words"));
        let hex = payload(&STANDARD.encode([0xff, 0x00, b'A']), true, false);
        assert_eq!(hex.kind, "hex");
        assert!(hex.text.starts_with("00000000  ff 00 41"), "{}", hex.text);
        assert!(hex.text.trim_end().ends_with("..A"), "{}", hex.text);
        let big = "x".repeat(SHOWN_BYTES + 10);
        let cut = payload(&big, false, false);
        assert!(cut.cut && cut.text.len() == SHOWN_BYTES);
        let whole = payload(&big, false, true);
        assert!(!whole.cut && whole.text.len() == big.len());
        let huge = "x".repeat(SHOW_ALL_BYTES + 1);
        let capped = payload(&huge, false, true);
        assert!(capped.cut && capped.text.len() == SHOW_ALL_BYTES);
    }

    #[test]
    fn json_is_indented_from_its_own_text() {
        let stored = r#"{"z": 1, "a": [], "id": 123456789012345678901234, "a": "x,\"}{", "e": {}}"#;
        let shown = payload(stored, false, false);
        assert_eq!(shown.kind, "json");
        assert_eq!(
            shown.text,
            "{\n  \"z\": 1,\n  \"a\": [],\n  \"id\": 123456789012345678901234,\n  \"a\": \"x,\\\"}{\",\n  \"e\": {}\n}",
            "key order, duplicate keys, big numbers and strings with brackets kept"
        );
    }

    #[test]
    fn deep_json_stays_within_the_cut() {
        // 127 levels of nesting around many short elements: printed whole with
        // two spaces a level it would be about 100 times its size.
        let inner = vec!["0"; 200_000].join(",");
        let deep = format!("{}{inner}{}", "[".repeat(127), "]".repeat(127));
        let shown = payload(&deep, false, false);
        assert_eq!(shown.kind, "json");
        assert!(
            shown.cut && shown.text.len() <= SHOWN_BYTES,
            "{}",
            shown.text.len()
        );
        let all = payload(&deep, false, true);
        assert!(all.cut && all.text.len() <= SHOW_ALL_BYTES);
    }

    #[test]
    fn hex_dumps_are_bounded_too() {
        let body = STANDARD.encode(vec![7_u8; SHOW_ALL_BYTES]);
        let all = payload(&body, true, true);
        assert!(
            all.cut && all.text.len() <= SHOW_ALL_BYTES + 80,
            "{}",
            all.text.len()
        );
    }

    #[test]
    fn previews_are_cut_with_an_ellipsis() {
        assert_eq!(preview("abcdef", false, 3), "abc…");
        assert_eq!(preview("abc", false, 3), "abc");
        assert_eq!(preview("AAAA", true, 3), "(binary)");
    }
}

/// `n` and the noun in the number it takes: `1 message`, `3 messages`,
/// `321,000 messages`.
pub(crate) fn count(n: u64, one: &str, many: &str) -> String {
    format!("{} {}", thousands(n), if n == 1 { one } else { many })
}

/// `n` with a comma between each group of three digits: `321,000`.
pub(crate) fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, d) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(d);
    }
    out
}

#[cfg(test)]
mod count_tests {
    #[test]
    fn one_is_singular_and_the_rest_plural() {
        assert_eq!(super::count(1, "message", "messages"), "1 message");
        assert_eq!(super::count(0, "delivery", "deliveries"), "0 deliveries");
        assert_eq!(super::count(2, "delivery", "deliveries"), "2 deliveries");
        assert_eq!(
            super::count(321_000, "message", "messages"),
            "321,000 messages"
        );
        for (n, text) in [(0, "0"), (999, "999"), (1_000, "1,000"), (20_003, "20,003")] {
            assert_eq!(super::thousands(n), text);
        }
        assert_eq!(super::thousands(u64::MAX), "18,446,744,073,709,551,615");
    }
}

/// How long ago `at` (RFC 3339) was, seen from `now`: "12 s ago", "5 min ago",
/// "3 h ago", "2 d ago" ("in 4 s" for a time ahead, a clock's skew); `at` itself
/// when it does not parse.
pub(crate) fn ago(at: &str, now: time::OffsetDateTime) -> String {
    let Ok(t) = time::OffsetDateTime::parse(at, &time::format_description::well_known::Rfc3339)
    else {
        return at.to_owned();
    };
    let seconds = (now - t).whole_seconds();
    let span = |s: i64| match s {
        s if s < 60 => format!("{s} s"),
        s if s < 3600 => format!("{} min", s / 60),
        s if s < 86_400 => format!("{} h", s / 3600),
        s => format!("{} d", s / 86_400),
    };
    if seconds >= 0 {
        format!("{} ago", span(seconds))
    } else {
        format!("in {}", span(-seconds))
    }
}

/// The last 8 characters of an id after an ellipsis, for a dense list (the full
/// id in its tooltip and on its page): the library's ids are UUIDv7, whose first
/// characters are their time (alike for every row of a minute) and whose last
/// are random.
pub(crate) fn short_id(id: &str) -> String {
    let chars: Vec<char> = id.chars().collect();
    let tail: String = chars[chars.len().saturating_sub(8)..].iter().collect();
    if chars.len() > 8 {
        format!("…{tail}")
    } else {
        tail
    }
}

#[cfg(test)]
mod dense_tests {
    use super::*;

    #[test]
    fn times_read_as_how_long_ago() {
        let now = time::OffsetDateTime::parse(
            "2026-12-06T10:00:00Z",
            &time::format_description::well_known::Rfc3339,
        )
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
        assert_eq!(ago("2026-12-06T09:59:48Z", now), "12 s ago");
        assert_eq!(ago("2026-12-06T09:55:00Z", now), "5 min ago");
        assert_eq!(ago("2026-12-06T07:00:00Z", now), "3 h ago");
        assert_eq!(ago("2026-12-04T10:00:00Z", now), "2 d ago");
        assert_eq!(ago("2026-12-06T10:00:04Z", now), "in 4 s");
        assert_eq!(ago("not a time", now), "not a time");
        assert_eq!(
            short_id("0190f0a2-7c3e-7a41-8f00-0123456789ab"),
            "…456789ab"
        );
        assert_eq!(short_id("abc"), "abc");
        // Ids made in one millisecond differ in what is shown.
        let at = outbox_core::Timestamp::UNIX_EPOCH;
        let ids: std::collections::HashSet<String> = (0..1_000_u128)
            .map(|i| {
                let bits = i.wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835);
                let mut random = [0_u8; 10];
                random.copy_from_slice(&bits.to_be_bytes()[6..]);
                short_id(&outbox_core::MessageId::v7(at, random).to_string())
            })
            .collect();
        assert_eq!(ids.len(), 1_000);
    }
}
