//! Turning what a caller sent (query strings, JSON filters, path segments) into
//! the ports' values, refusing anything malformed with a 400 that names it.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use outbox_core::{Lifecycle, MessageId, Timestamp};
use outbox_ports::{MessageFilter, PageCursor};
use time::format_description::well_known::Rfc3339;

use crate::AdminError;
use crate::model::{FilterBody, MessageQuery};

/// Page size when none is asked for.
pub const DEFAULT_LIMIT: u32 = 50;
/// The largest page.
pub const MAX_LIMIT: u32 = 1_000;
/// A bulk action's cap unless the request raises it.
pub const DEFAULT_BULK_MAX: u64 = 10_000;

/// Which side a status belongs to: each side has its own status type
/// ([`outbox_core::OutboxStatus`], [`outbox_core::InboxStatus`]) and names.
pub use outbox_core::Side;

/// The status named `name` on `S`'s side.
///
/// # Errors
/// `bad_status` for a name unknown there (naming that side's statuses).
pub fn parse_status<S: Lifecycle>(name: &str) -> Result<S, AdminError> {
    S::parse(name).ok_or_else(|| {
        AdminError::bad(
            "bad_status",
            format!(
                "unknown status `{name}` here; expected one of {}",
                S::SIDE.status_names().join(", ")
            ),
        )
    })
}

/// A text filter or a name, refused when it holds a NUL character (see
/// [`crate::model::TEXT_PATTERN`]: no stored value can, and PostgreSQL would
/// fail the whole query instead of matching nothing).
///
/// # Errors
/// `bad_text`.
pub fn text(field: &str, value: String) -> Result<String, AdminError> {
    if value.contains('\0') {
        return Err(AdminError::bad(
            "bad_text",
            format!("{field} must not contain a NUL character"),
        ));
    }
    Ok(value)
}

fn text_opt(field: &str, value: Option<&String>) -> Result<Option<String>, AdminError> {
    value.map(|v| text(field, v.clone())).transpose()
}

/// An RFC 3339 time.
///
/// # Errors
/// `bad_time`.
pub fn parse_time(field: &str, value: &str) -> Result<Timestamp, AdminError> {
    Timestamp::parse(value, &Rfc3339).map_err(|_| {
        AdminError::bad(
            "bad_time",
            format!("{field} must be an RFC 3339 time like 2026-11-30T00:00:00Z, got `{value}`"),
        )
    })
}

/// A time as the API shows it.
#[must_use]
pub fn format_time(at: Timestamp) -> String {
    // Formatting a UTC offset date-time as RFC 3339 fails only for years outside
    // 0..=9999, which no stored timestamp has; show it plainly then.
    at.format(&Rfc3339).unwrap_or_else(|_| at.to_string())
}

/// A message id from a path or query.
///
/// # Errors
/// `bad_id`.
pub fn parse_message_id(value: &str) -> Result<MessageId, AdminError> {
    // Only the hyphenated form the API shows and documents (`MESSAGE_ID_PATTERN`):
    // `MessageId`'s own parser also takes braces, a urn: prefix, no hyphens and
    // surrounding blanks, which the document does not allow.
    let hyphenated = value.len() == 36
        && value.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_hexdigit(),
        });
    hyphenated
        .then(|| value.parse().ok())
        .flatten()
        .ok_or_else(|| AdminError::bad("bad_id", format!("`{value}` is not a message id (UUID)")))
}

/// A dead letter id.
///
/// # Errors
/// `bad_id`.
pub fn parse_dead_letter_id(value: &str) -> Result<u64, AdminError> {
    value.parse().map_err(|_| {
        AdminError::bad(
            "bad_id",
            format!("`{value}` is not a dead letter id (a number)"),
        )
    })
}

/// A chart's window, `1h` when absent.
///
/// # Errors
/// `bad_window` for anything but `1h`, `24h` and `7d`.
pub fn parse_window(value: Option<&str>) -> Result<outbox_ports::ChartWindow, AdminError> {
    match value {
        None => Ok(outbox_ports::ChartWindow::default()),
        Some(v) => outbox_ports::ChartWindow::parse(v)
            .ok_or_else(|| AdminError::bad("bad_window", "window: expected 1h, 24h or 7d")),
    }
}

/// A page size, 1 to [`MAX_LIMIT`], [`DEFAULT_LIMIT`] when absent.
///
/// # Errors
/// `bad_limit`.
pub fn parse_limit(value: Option<&str>) -> Result<u32, AdminError> {
    let Some(value) = value else {
        return Ok(DEFAULT_LIMIT);
    };
    match value.parse::<u32>() {
        Ok(n) if (1..=MAX_LIMIT).contains(&n) => Ok(n),
        _ => Err(AdminError::bad(
            "bad_limit",
            format!("limit must be a whole number from 1 to {MAX_LIMIT}, got `{value}`"),
        )),
    }
}

/// The cursor as the API shows it: the store's position as 8 big-endian bytes in
/// unpadded base64url, so it is URL-safe and says nothing callers should rely on.
#[must_use]
pub fn encode_cursor(cursor: PageCursor) -> String {
    URL_SAFE_NO_PAD.encode(cursor.0.to_be_bytes())
}

/// A cursor from [`encode_cursor`].
///
/// # Errors
/// `bad_cursor`.
pub fn parse_cursor(value: Option<&str>) -> Result<Option<PageCursor>, AdminError> {
    let Some(value) = value else {
        return Ok(None);
    };
    let bad = || {
        AdminError::bad(
            "bad_cursor",
            "cursor must be a next_cursor returned by an earlier page",
        )
    };
    let bytes = URL_SAFE_NO_PAD.decode(value).map_err(|_| bad())?;
    let bytes: [u8; 8] = bytes.try_into().map_err(|_| bad())?;
    Ok(Some(PageCursor(u64::from_be_bytes(bytes))))
}

/// A bulk action's cap: [`DEFAULT_BULK_MAX`] unless given, at least 1.
///
/// # Errors
/// `bad_max`.
pub fn parse_max(value: Option<u64>) -> Result<u64, AdminError> {
    match value {
        None => Ok(DEFAULT_BULK_MAX),
        Some(0) => Err(AdminError::bad("bad_max", "max must be at least 1")),
        // The document says int64 (the stores count in it); a larger number is not
        // a cap but a mistake.
        Some(n) if i64::try_from(n).is_err() => Err(AdminError::bad(
            "bad_max",
            format!("max must be at most {}", i64::MAX),
        )),
        Some(n) => Ok(n),
    }
}

/// A filter from a bulk action's JSON.
///
/// # Errors
/// `bad_status`, `bad_time`.
pub fn filter_from_body<S: Lifecycle>(body: &FilterBody) -> Result<MessageFilter<S>, AdminError> {
    Ok(MessageFilter {
        status: body.status.as_deref().map(parse_status).transpose()?,
        exchange: text_opt("exchange", body.exchange.as_ref())?,
        routing_key: text_opt("routing_key", body.routing_key.as_ref())?,
        message_type: text_opt("type", body.message_type.as_ref())?,
        created_after: body
            .created_after
            .as_deref()
            .map(|t| parse_time("created_after", t))
            .transpose()?,
        created_before: body
            .created_before
            .as_deref()
            .map(|t| parse_time("created_before", t))
            .transpose()?,
        q: text_opt("q", body.q.as_ref())?,
        error_group: text_opt("error", body.error.as_ref())?
            .map(|e| outbox_core::failure_group::failure_group(&e)),
        oldest_first: false,
    })
}

/// A filter, page position and size from a list's query string.
///
/// # Errors
/// `bad_status`, `bad_time`, `bad_limit`, `bad_cursor`.
pub fn list_from_query<S: Lifecycle>(
    query: MessageQuery,
) -> Result<(MessageFilter<S>, Option<PageCursor>, u32), AdminError> {
    let limit = parse_limit(query.limit.as_deref())?;
    let cursor = parse_cursor(query.cursor.as_deref())?;
    let oldest_first = parse_sort(query.sort.as_deref())?;
    let body = FilterBody {
        status: query.status,
        exchange: query.exchange,
        routing_key: query.routing_key,
        message_type: query.message_type,
        created_after: query.created_after,
        created_before: query.created_before,
        q: query.q,
        error: query.error,
    };
    let filter = MessageFilter {
        oldest_first,
        ..filter_from_body(&body)?
    };
    Ok((filter, cursor, limit))
}

/// A list's order: `newest` first (the default) or `oldest` first; whether it is
/// oldest first.
///
/// # Errors
/// `bad_sort`.
pub fn parse_sort(value: Option<&str>) -> Result<bool, AdminError> {
    match value {
        None | Some("" | "newest") => Ok(false),
        Some("oldest") => Ok(true),
        Some(_) => Err(AdminError::bad("bad_sort", "sort must be newest or oldest")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_garbage_is_refused() {
        for n in [0, 1, 42, u64::MAX] {
            let text = encode_cursor(PageCursor(n));
            assert!(
                text.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            );
            assert_eq!(
                parse_cursor(Some(&text)).ok().flatten(),
                Some(PageCursor(n))
            );
        }
        for bad in ["", "!!", "AAAA", "AAAAAAAAAAAAAAAAAAAA"] {
            assert!(parse_cursor(Some(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn each_side_knows_only_its_own_statuses() {
        use outbox_core::{InboxStatus, OutboxStatus};
        assert!(parse_status::<OutboxStatus>("received").is_err());
        assert!(parse_status::<OutboxStatus>("consumed").is_err());
        assert!(parse_status::<InboxStatus>("pending").is_err());
        let sent = parse_status::<InboxStatus>("sent").expect_err("an outbox name");
        assert!(sent.to_string().contains("received, consumed"), "{sent}");
        assert_eq!(
            parse_status::<InboxStatus>("received").ok(),
            Some(InboxStatus::Received)
        );
        assert_eq!(
            parse_status::<OutboxStatus>("sent").ok(),
            Some(OutboxStatus::Sent)
        );
    }

    #[test]
    fn message_ids_are_hyphenated_uuids_only() {
        let id = "0190f3a5-6b1c-7d2e-8f00-0123456789ab";
        assert!(parse_message_id(id).is_ok());
        assert!(parse_message_id(&id.to_uppercase()).is_ok());
        for bad in [
            "0190f3a56b1c7d2e8f000123456789ab",
            "{0190f3a5-6b1c-7d2e-8f00-0123456789ab}",
            "urn:uuid:0190f3a5-6b1c-7d2e-8f00-0123456789ab",
            " 0190f3a5-6b1c-7d2e-8f00-0123456789ab",
            "0190f3a5-6b1c-7d2e-8f00-0123456789ag",
        ] {
            assert!(parse_message_id(bad).is_err(), "{bad}");
        }
        let pattern = crate::model::MESSAGE_ID_PATTERN;
        assert!(pattern.starts_with('^') && pattern.ends_with('$'));
    }

    #[test]
    fn limits_outside_one_to_a_thousand_are_refused() {
        assert_eq!(parse_limit(None).ok(), Some(50));
        assert_eq!(parse_limit(Some("1000")).ok(), Some(1000));
        for bad in ["0", "1001", "-1", "ten", ""] {
            assert!(parse_limit(Some(bad)).is_err(), "{bad}");
        }
    }
}
