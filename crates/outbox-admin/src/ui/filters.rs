//! The list filters as they travel in the page's URL (`?status=dead&exchange=orders`)
//! and in the bulk forms: empty fields mean "any", times are RFC 3339 or a
//! browser's `datetime-local` value (read as UTC). They become the same
//! [`MessageFilter`] as the JSON API's, through the same parsing.

use outbox_core::Lifecycle;
use outbox_ports::{MessageFilter, PageCursor};
use serde::Deserialize;

use crate::AdminError;
use crate::model::FilterBody;
use crate::params::{filter_from_body, parse_cursor, parse_limit};

/// A list's query string (and a bulk form's fields).
#[derive(Debug, Default, Clone, Deserialize)]
pub(crate) struct ListQuery {
    pub(crate) status: Option<String>,
    pub(crate) exchange: Option<String>,
    pub(crate) routing_key: Option<String>,
    #[serde(rename = "type")]
    pub(crate) message_type: Option<String>,
    pub(crate) created_after: Option<String>,
    pub(crate) created_before: Option<String>,
    pub(crate) q: Option<String>,
    /// A failure group (or an error text, meaning its group).
    pub(crate) error: Option<String>,
    /// `newest` (the default) or `oldest` first.
    pub(crate) sort: Option<String>,
    pub(crate) limit: Option<String>,
    pub(crate) cursor: Option<String>,
    /// A bulk action to confirm (shows the dialog with the dry-run count).
    pub(crate) confirm: Option<String>,
    /// What the last action did (after a redirect).
    pub(crate) notice: Option<String>,
    /// The bulk form's CSRF token.
    pub(crate) csrf: Option<String>,
}

fn clean(value: Option<&String>) -> Option<String> {
    value
        .map(|v| v.trim())
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
}

/// A `datetime-local` value (`2026-01-31T10:00`, seconds optional) as RFC 3339 UTC;
/// anything else is passed on as given.
fn as_rfc3339(value: Option<String>) -> Option<String> {
    value.map(|v| {
        let b = v.as_bytes();
        let local = (b.len() == 16 || b.len() == 19)
            && b.get(10) == Some(&b'T')
            && v.bytes().all(|c| c.is_ascii_digit() || b"-T:".contains(&c));
        if local {
            if b.len() == 16 {
                format!("{v}:00Z")
            } else {
                format!("{v}Z")
            }
        } else {
            v
        }
    })
}

impl ListQuery {
    /// The filter fields, cleaned (what the API would take as its filter body).
    pub(crate) fn body(&self) -> FilterBody {
        FilterBody {
            status: clean(self.status.as_ref()),
            exchange: clean(self.exchange.as_ref()),
            routing_key: clean(self.routing_key.as_ref()),
            message_type: clean(self.message_type.as_ref()),
            created_after: as_rfc3339(clean(self.created_after.as_ref())),
            created_before: as_rfc3339(clean(self.created_before.as_ref())),
            q: clean(self.q.as_ref()),
            error: clean(self.error.as_ref()),
        }
    }

    /// The filter for the side `S`.
    ///
    /// # Errors
    /// `bad_status`, `bad_time`.
    pub(crate) fn filter<S: Lifecycle>(&self) -> Result<MessageFilter<S>, AdminError> {
        Ok(MessageFilter {
            oldest_first: crate::params::parse_sort(clean(self.sort.as_ref()).as_deref())?,
            ..filter_from_body(&self.body())?
        })
    }

    /// The page position and size.
    ///
    /// # Errors
    /// `bad_cursor`, `bad_limit`.
    pub(crate) fn page(&self) -> Result<(Option<PageCursor>, u32), AdminError> {
        let cursor = parse_cursor(clean(self.cursor.as_ref()).as_deref())?;
        let limit = parse_limit(clean(self.limit.as_ref()).as_deref())?;
        Ok((cursor, limit))
    }

    /// The filter as `(name, value)` pairs (set fields only), for links and hidden
    /// form fields.
    pub(crate) fn pairs(&self) -> Vec<(&'static str, String)> {
        let body = self.body();
        let mut pairs = Vec::new();
        let fields = [
            ("status", body.status),
            ("exchange", body.exchange),
            ("routing_key", body.routing_key),
            ("type", body.message_type),
            ("created_after", body.created_after),
            ("created_before", body.created_before),
            ("q", body.q),
            ("error", body.error),
        ];
        for (name, value) in fields {
            if let Some(value) = value {
                pairs.push((name, value));
            }
        }
        if let Some(sort) = clean(self.sort.as_ref()) {
            pairs.push(("sort", sort));
        }
        if let Some(limit) = clean(self.limit.as_ref()) {
            pairs.push(("limit", limit));
        }
        pairs
    }

    /// The filter as a query string (no leading `?`), with `extra` pairs after it.
    pub(crate) fn query_string(&self, extra: &[(&str, &str)]) -> String {
        let mut parts: Vec<String> = self
            .pairs()
            .iter()
            .map(|(k, v)| format!("{k}={}", encode(v)))
            .collect();
        parts.extend(extra.iter().map(|(k, v)| format!("{k}={}", encode(v))));
        parts.join("&")
    }
}

/// `path` with `pairs` as its query string (each value percent-encoded), or
/// `path` alone when there are none: the links and redirects of the lists.
pub(crate) fn with_query<'a>(
    path: &str,
    pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> String {
    let query: Vec<String> = pairs
        .into_iter()
        .map(|(k, v)| format!("{k}={}", encode(v)))
        .collect();
    if query.is_empty() {
        path.to_owned()
    } else {
        format!("{path}?{}", query.join("&"))
    }
}

/// Percent-encodes everything but unreserved characters (RFC 3986), so a value is
/// safe in a query string and in a path segment.
pub(crate) fn encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use outbox_core::{InboxStatus, OutboxStatus};

    use super::*;

    #[test]
    fn empty_fields_are_no_filter_and_local_times_are_utc() {
        let q = ListQuery {
            status: Some("dead".into()),
            exchange: Some("  ".into()),
            created_after: Some("2026-01-31T10:00".into()),
            q: Some("a b&c".into()),
            ..ListQuery::default()
        };
        let body = q.body();
        assert_eq!(body.exchange, None);
        assert_eq!(body.created_after.as_deref(), Some("2026-01-31T10:00:00Z"));
        assert!(q.filter::<OutboxStatus>().is_ok());
        assert_eq!(
            q.query_string(&[("cursor", "x")]),
            "status=dead&created_after=2026-01-31T10%3A00%3A00Z&q=a%20b%26c&cursor=x"
        );
        let pending = ListQuery {
            status: Some("pending".into()),
            ..ListQuery::default()
        };
        assert!(pending.filter::<OutboxStatus>().is_ok());
        assert!(pending.filter::<InboxStatus>().is_err(), "an outbox status");
    }

    #[test]
    fn bad_values_are_refused_not_ignored() {
        let bad_status = ListQuery {
            status: Some("queued".into()),
            ..ListQuery::default()
        };
        assert!(bad_status.filter::<OutboxStatus>().is_err());
        let bad_time = ListQuery {
            created_before: Some("yesterday".into()),
            ..ListQuery::default()
        };
        assert!(bad_time.filter::<OutboxStatus>().is_err());
        let bad_limit = ListQuery {
            limit: Some("0".into()),
            ..ListQuery::default()
        };
        assert!(bad_limit.page().is_err());
    }
}
