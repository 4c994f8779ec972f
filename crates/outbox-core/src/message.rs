//! Messages: what a producer enqueues ([`NewMessage`]) and what the relay publishes
//! and the consumer receives ([`Message`]).

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::Timestamp;

/// Message headers, carried as AMQP headers (e.g. `traceparent`). Ordered, so that a
/// message always serializes the same way.
pub type Headers = BTreeMap<String, String>;

/// The content type a message gets when the producer names none.
pub const DEFAULT_CONTENT_TYPE: &str = "application/json";

/// The header naming the message that caused this one: set by
/// [`NewMessage::caused_by`] to the incoming message's id, read by
/// [`Message::causation_id`].
pub const CAUSATION_HEADER: &str = "outbox-causation-id";

/// Payload limit used when none is configured: 1 MiB.
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 1 << 20;

/// AMQP short strings (exchange, routing key, type, ids) are at most 255 bytes.
pub const MAX_SHORT_STRING: usize = 255;

/// The most header bytes a message may carry, as AMQP encodes them: per header its
/// name and value plus 6 bytes of framing (name length, type tag, value length).
/// A broker closes the whole connection when a message's content header (headers
/// and properties, one frame) exceeds the negotiated `frame_max` (RabbitMQ's
/// default: 128 KiB), failing every message in flight on it; 64 KiB leaves room for
/// the other properties (at most about 2 KiB) under that default. The outbox
/// table's `outbox_messages_headers_size_amqp` constraint computes the same sum.
pub const MAX_HEADERS_BYTES: usize = 64 * 1024;

/// The size of `headers` as AMQP encodes them, counted as [`MAX_HEADERS_BYTES`] is.
#[must_use]
pub fn amqp_headers_len(headers: &Headers) -> usize {
    headers
        .iter()
        .map(|(name, value)| name.len().saturating_add(value.len()).saturating_add(6))
        .fold(0, usize::saturating_add)
}

/// A message's identity: a UUID, version 7 when made by this library (time ordered),
/// any version when written by a foreign producer.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct MessageId(uuid::Uuid);

impl MessageId {
    /// A version 7 id from a time and ten random bytes. The caller supplies both, so
    /// that this crate stays free of clocks and random sources.
    #[must_use]
    pub fn v7(at: Timestamp, random: [u8; 10]) -> Self {
        let millis = u64::try_from(at.unix_timestamp_nanos() / 1_000_000).unwrap_or(0);
        Self(uuid::Builder::from_unix_timestamp_millis(millis, &random).into_uuid())
    }

    /// Wraps an existing UUID.
    #[must_use]
    pub const fn from_uuid(id: uuid::Uuid) -> Self {
        Self(id)
    }

    /// The UUID inside.
    #[must_use]
    pub const fn as_uuid(&self) -> &uuid::Uuid {
        &self.0
    }
}

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl fmt::Debug for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MessageId({})", self.0)
    }
}

impl std::str::FromStr for MessageId {
    type Err = MessageError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        uuid::Uuid::parse_str(s.trim())
            .map(Self)
            .map_err(|_| MessageError::InvalidId(s.to_owned()))
    }
}

/// Why a message was refused. Nothing is written when a message is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MessageError {
    /// A field longer than AMQP allows.
    #[error("{field} is {len} bytes long; at most {max} are allowed")]
    TooLong {
        /// Which field.
        field: &'static str,
        /// Its length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The payload exceeds the configured limit.
    #[error("payload is {len} bytes; the configured limit is {max}")]
    PayloadTooLarge {
        /// The payload's size.
        len: usize,
        /// The configured limit.
        max: usize,
    },
    /// The headers take more bytes than one AMQP frame may safely carry.
    #[error("headers are {len} bytes as AMQP encodes them; at most {max} are allowed")]
    HeadersTooLarge {
        /// Their encoded size ([`amqp_headers_len`]).
        len: usize,
        /// [`MAX_HEADERS_BYTES`].
        max: usize,
    },
    /// A header with an empty name.
    #[error("a header name is empty")]
    EmptyHeaderName,
    /// A text that is not a UUID was given as a message id.
    #[error("{0:?} is not a message id (a UUID)")]
    InvalidId(String),
}

/// A message as the producer describes it, before it has an id and a creation time.
///
/// Only exchange, routing key and payload are required; everything else has a default.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewMessage {
    /// Target exchange (`""` is the AMQP default exchange).
    pub exchange: String,
    /// Routing key.
    pub routing_key: String,
    /// The message type (AMQP `type`), used by consumers to pick a handler.
    pub message_type: Option<String>,
    /// Headers, e.g. `traceparent`.
    pub headers: Headers,
    /// The body.
    pub payload: Vec<u8>,
    /// MIME type of the body; [`DEFAULT_CONTENT_TYPE`] when `None`.
    pub content_type: Option<String>,
    /// The producing service.
    pub source: Option<String>,
    /// Correlation id (AMQP `correlation_id`).
    pub correlation_id: Option<String>,
    /// When it may be published at the earliest; `None`: at once.
    #[serde(default)]
    pub due: Option<Due>,
    /// Messages with the same key are published one after another in commit
    /// order; `None`: no order.
    #[serde(default)]
    pub ordering_key: Option<String>,
}

/// When a delayed message becomes due.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Due {
    /// At this time.
    At(#[serde(with = "time::serde::rfc3339")] Timestamp),
    /// This long after the message is created (enqueued).
    After(std::time::Duration),
}

impl NewMessage {
    /// A message with the three required fields and every other one defaulted.
    #[must_use]
    pub fn new(
        exchange: impl Into<String>,
        routing_key: impl Into<String>,
        payload: impl Into<Vec<u8>>,
    ) -> Self {
        Self {
            exchange: exchange.into(),
            routing_key: routing_key.into(),
            message_type: None,
            headers: Headers::new(),
            payload: payload.into(),
            content_type: None,
            source: None,
            correlation_id: None,
            due: None,
            ordering_key: None,
        }
    }

    /// Orders it after every earlier message with the same key: none of them is
    /// published before the one before it is confirmed (see `docs/ordering.md`).
    #[must_use]
    pub fn with_ordering_key(mut self, key: impl Into<String>) -> Self {
        self.ordering_key = Some(key.into());
        self
    }

    /// Publishes it no earlier than `at` (a delayed message: `pending` until then,
    /// then published as any other).
    #[must_use]
    pub fn deliver_at(mut self, at: Timestamp) -> Self {
        self.due = Some(Due::At(at));
        self
    }

    /// Publishes it no earlier than `delay` after it is enqueued.
    #[must_use]
    pub fn deliver_after(mut self, delay: std::time::Duration) -> Self {
        self.due = Some(Due::After(delay));
        self
    }

    /// Sets the message type.
    #[must_use]
    pub fn with_type(mut self, message_type: impl Into<String>) -> Self {
        self.message_type = Some(message_type.into());
        self
    }

    /// Adds a header.
    #[must_use]
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(name.into(), value.into());
        self
    }

    /// Sets the content type.
    #[must_use]
    pub fn with_content_type(mut self, content_type: impl Into<String>) -> Self {
        self.content_type = Some(content_type.into());
        self
    }

    /// Sets the source.
    #[must_use]
    pub fn with_source(mut self, source: impl Into<String>) -> Self {
        self.source = Some(source.into());
        self
    }

    /// Sets the correlation id.
    #[must_use]
    pub fn with_correlation_id(mut self, correlation_id: impl Into<String>) -> Self {
        self.correlation_id = Some(correlation_id.into());
        self
    }

    /// Marks it as sent while handling `cause`: it keeps the conversation's
    /// correlation id (`cause`'s correlation id, or `cause`'s own id when it has
    /// none, so the first message of a conversation names it) and carries `cause`'s
    /// id as its causation id (the header [`CAUSATION_HEADER`]). Replaces a
    /// correlation id or causation header set before.
    ///
    /// ```
    /// use outbox_core::message::{CAUSATION_HEADER, MessageId, NewMessage};
    /// use outbox_core::Timestamp;
    ///
    /// let now = Timestamp::UNIX_EPOCH;
    /// let incoming = NewMessage::new("shop.orders", "order.created", b"{}".to_vec())
    ///     .into_message(MessageId::v7(now, [1; 10]), now);
    /// let reply = NewMessage::new("shop.billing", "invoice.created", b"{}".to_vec())
    ///     .caused_by(&incoming);
    /// let id = incoming.id.to_string();
    /// assert_eq!(reply.correlation_id.as_deref(), Some(id.as_str()));
    /// assert_eq!(reply.headers.get(CAUSATION_HEADER), Some(&id));
    /// ```
    #[must_use]
    pub fn caused_by(self, cause: &Message) -> Self {
        self.caused_by_id(cause.id, cause.correlation_id.as_deref())
    }

    /// [`Self::caused_by`] from the cause's id and correlation id alone (what a
    /// handler's context keeps of the message it handles).
    #[must_use]
    pub fn caused_by_id(mut self, cause: MessageId, correlation_id: Option<&str>) -> Self {
        let id = cause.to_string();
        self.correlation_id = Some(correlation_id.map_or_else(|| id.clone(), str::to_owned));
        self.headers.insert(CAUSATION_HEADER.to_owned(), id);
        self
    }

    /// Checks the limits that the broker or the configuration impose.
    ///
    /// # Errors
    /// [`MessageError`] naming the first field that breaks a limit.
    pub fn validate(&self, max_payload_bytes: usize) -> Result<(), MessageError> {
        check_limits(
            [
                ("exchange", Some(self.exchange.as_str())),
                ("routing_key", Some(self.routing_key.as_str())),
                ("message_type", self.message_type.as_deref()),
                ("content_type", self.content_type.as_deref()),
                ("source", self.source.as_deref()),
                ("correlation_id", self.correlation_id.as_deref()),
                ("ordering_key", self.ordering_key.as_deref()),
            ],
            &self.headers,
            self.payload.len(),
            max_payload_bytes,
        )
    }

    /// Gives the message its identity and creation time. The time is kept to the
    /// microsecond, as databases store it, so a stored message reads back equal.
    #[must_use]
    pub fn into_message(self, id: MessageId, created_at: Timestamp) -> Message {
        let created_at = created_at
            .replace_nanosecond(created_at.nanosecond() / 1_000 * 1_000)
            .unwrap_or(created_at);
        let micros = |t: Timestamp| {
            t.replace_nanosecond(t.nanosecond() / 1_000 * 1_000)
                .unwrap_or(t)
        };
        let not_before = self.due.map(|due| {
            micros(match due {
                Due::At(at) => at,
                Due::After(delay) => {
                    let delay = time::Duration::try_from(delay).unwrap_or(time::Duration::MAX);
                    created_at.checked_add(delay).unwrap_or(LATEST_DUE)
                }
            })
        });
        Message {
            id,
            exchange: self.exchange,
            routing_key: self.routing_key,
            message_type: self.message_type,
            headers: self.headers,
            payload: self.payload,
            content_type: self
                .content_type
                .unwrap_or_else(|| DEFAULT_CONTENT_TYPE.to_owned()),
            source: self.source,
            correlation_id: self.correlation_id,
            created_at,
            not_before: not_before.map(|t| t.min(LATEST_DUE)),
            ordering_key: self.ordering_key,
        }
    }
}

/// The latest due time a store can hold (PostgreSQL and the relay read times up
/// to the year 9999).
pub const LATEST_DUE: Timestamp = {
    let Ok(day) = time::Date::from_calendar_date(9999, time::Month::December, 31) else {
        panic!("a valid date")
    };
    let Ok(at) = day.with_hms(23, 59, 59) else {
        panic!("a valid time")
    };
    at.assume_utc()
};

/// A message with its identity, as stored, published and consumed.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// Unique id, also the AMQP `message_id` and the inbox's dedup key.
    pub id: MessageId,
    /// Target exchange.
    pub exchange: String,
    /// Routing key.
    pub routing_key: String,
    /// Message type (AMQP `type`).
    pub message_type: Option<String>,
    /// Headers.
    pub headers: Headers,
    /// The body.
    pub payload: Vec<u8>,
    /// MIME type of the body.
    pub content_type: String,
    /// The producing service.
    pub source: Option<String>,
    /// Correlation id.
    pub correlation_id: Option<String>,
    /// When the producer enqueued it.
    pub created_at: Timestamp,
    /// A delayed message's due time: not published before it. `None`: at once.
    /// Scheduling only: it is not sent to the broker.
    #[serde(default)]
    pub not_before: Option<Timestamp>,
    /// Its ordering key: published only after every earlier message with the same
    /// key was confirmed (scheduling only, as `not_before`).
    #[serde(default)]
    pub ordering_key: Option<String>,
}

impl Message {
    /// The id of the message this one was sent while handling (the header
    /// [`CAUSATION_HEADER`], see [`NewMessage::caused_by`]), as written: a foreign
    /// producer may put any text there. `None` when it has none.
    #[must_use]
    pub fn causation_id(&self) -> Option<&str> {
        self.headers.get(CAUSATION_HEADER).map(String::as_str)
    }

    /// Checks the same limits as [`NewMessage::validate`], e.g. before storing a
    /// message made elsewhere.
    ///
    /// # Errors
    /// [`MessageError`] naming the first field that breaks a limit.
    pub fn validate(&self, max_payload_bytes: usize) -> Result<(), MessageError> {
        check_limits(
            [
                ("exchange", Some(self.exchange.as_str())),
                ("routing_key", Some(self.routing_key.as_str())),
                ("message_type", self.message_type.as_deref()),
                ("content_type", Some(self.content_type.as_str())),
                ("source", self.source.as_deref()),
                ("correlation_id", self.correlation_id.as_deref()),
                ("ordering_key", self.ordering_key.as_deref()),
            ],
            &self.headers,
            self.payload.len(),
            max_payload_bytes,
        )
    }
}

impl Message {
    /// Checks what AMQP itself cannot carry, whatever the configuration: exchange,
    /// routing key, type, content type, correlation id and source are AMQP short
    /// strings (at most [`MAX_SHORT_STRING`] bytes), and so are header names; the
    /// headers together take at most [`MAX_HEADERS_BYTES`]. A
    /// message failing this can never be published: a relay marks it dead at once
    /// instead of spending attempts on it (or handing it to a client library that
    /// panics on it).
    ///
    /// # Errors
    /// [`MessageError`] naming the first field AMQP cannot carry.
    pub fn check_amqp(&self) -> Result<(), MessageError> {
        check_limits(
            [
                ("exchange", Some(self.exchange.as_str())),
                ("routing_key", Some(self.routing_key.as_str())),
                ("message_type", self.message_type.as_deref()),
                ("content_type", Some(self.content_type.as_str())),
                ("source", self.source.as_deref()),
                ("correlation_id", self.correlation_id.as_deref()),
                ("ordering_key", self.ordering_key.as_deref()),
            ],
            &self.headers,
            0,
            usize::MAX,
        )
    }
}

fn check_limits(
    short: [(&'static str, Option<&str>); 7],
    headers: &Headers,
    payload_len: usize,
    max_payload_bytes: usize,
) -> Result<(), MessageError> {
    for (field, value) in short {
        if let Some(v) = value.filter(|v| v.len() > MAX_SHORT_STRING) {
            return Err(MessageError::TooLong {
                field,
                len: v.len(),
                max: MAX_SHORT_STRING,
            });
        }
    }
    for name in headers.keys() {
        if name.is_empty() {
            return Err(MessageError::EmptyHeaderName);
        }
        if name.len() > MAX_SHORT_STRING {
            return Err(MessageError::TooLong {
                field: "headers (a name)",
                len: name.len(),
                max: MAX_SHORT_STRING,
            });
        }
    }
    let headers_len = amqp_headers_len(headers);
    if headers_len > MAX_HEADERS_BYTES {
        return Err(MessageError::HeadersTooLarge {
            len: headers_len,
            max: MAX_HEADERS_BYTES,
        });
    }
    if payload_len > max_payload_bytes {
        return Err(MessageError::PayloadTooLarge {
            len: payload_len,
            max: max_payload_bytes,
        });
    }
    Ok(())
}

// Payloads can hold personal data and be large: Debug shows their size only.
impl fmt::Debug for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Message")
            .field("id", &self.id)
            .field("exchange", &self.exchange)
            .field("routing_key", &self.routing_key)
            .field("message_type", &self.message_type)
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field("payload_len", &self.payload.len())
            .field("content_type", &self.content_type)
            .field("created_at", &self.created_at)
            .field("not_before", &self.not_before)
            .field("ordering_key", &self.ordering_key)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_unix_timestamp(secs).expect("valid")
    }

    #[test]
    fn v7_ids_are_version_7_and_ordered_by_time() {
        let a = MessageId::v7(at(1_700_000_000), [0xff; 10]);
        let b = MessageId::v7(at(1_700_000_001), [0x00; 10]);
        assert_eq!(a.as_uuid().get_version_num(), 7);
        assert!(a < b);
    }

    #[test]
    fn defaults_fill_content_type() {
        let m = NewMessage::new("orders", "order.created", b"{}".to_vec())
            .into_message(MessageId::v7(at(0), [1; 10]), at(0));
        assert_eq!(m.content_type, DEFAULT_CONTENT_TYPE);
        assert!(m.headers.is_empty());
    }

    #[test]
    fn validate_names_the_offending_field() {
        let long = "x".repeat(256);
        let err = NewMessage::new(long.clone(), "k", vec![])
            .validate(10)
            .expect_err("too long");
        assert_eq!(
            err,
            MessageError::TooLong {
                field: "exchange",
                len: 256,
                max: 255
            }
        );
        let err = NewMessage::new("e", "k", vec![0; 11])
            .validate(10)
            .expect_err("too big");
        assert_eq!(err, MessageError::PayloadTooLarge { len: 11, max: 10 });
        let err = NewMessage::new("e", "k", vec![])
            .with_header("", "v")
            .validate(10)
            .expect_err("empty header");
        assert_eq!(err, MessageError::EmptyHeaderName);
        assert!(
            NewMessage::new("", "queue", vec![0; 10])
                .validate(10)
                .is_ok()
        );
    }

    #[test]
    fn amqp_checks_name_the_field_and_ignore_the_payload_limit() {
        let ok = NewMessage::new("e", "k", vec![0; 2 << 20])
            .into_message(MessageId::v7(at(0), [1; 10]), at(0));
        assert_eq!(ok.check_amqp(), Ok(()));
        let m = |f: fn(NewMessage) -> NewMessage| {
            f(NewMessage::new("e", "k", vec![])).into_message(MessageId::v7(at(0), [1; 10]), at(0))
        };
        let long = || "é".repeat(128);
        type Edit = fn(NewMessage) -> NewMessage;
        let cases: [(Edit, &str); 7] = [
            (
                |n| NewMessage {
                    exchange: "é".repeat(128),
                    ..n
                },
                "exchange",
            ),
            (
                |n| NewMessage {
                    routing_key: "é".repeat(128),
                    ..n
                },
                "routing_key",
            ),
            (|n| n.with_type("é".repeat(128)), "message_type"),
            (|n| n.with_content_type("é".repeat(128)), "content_type"),
            (|n| n.with_source("é".repeat(128)), "source"),
            (|n| n.with_correlation_id("é".repeat(128)), "correlation_id"),
            (|n| n.with_header("é".repeat(128), "v"), "headers"),
        ];
        assert_eq!(long().len(), 256);
        for (make, field) in cases {
            let err = m(make).check_amqp().expect_err(field).to_string();
            assert!(err.starts_with(field), "{err}");
        }
    }

    #[test]
    fn headers_are_limited_by_their_encoded_size_with_framing() {
        let m = |headers: Headers| {
            let mut n = NewMessage::new("e", "k", vec![]);
            n.headers = headers;
            n.into_message(MessageId::v7(at(0), [1; 10]), at(0))
        };
        let one = |len: usize| Headers::from([("big".to_owned(), "v".repeat(len))]);
        // 3 (name) + value + 6 (framing) bytes.
        assert_eq!(m(one(MAX_HEADERS_BYTES - 9)).check_amqp(), Ok(()));
        let err = m(one(MAX_HEADERS_BYTES - 8))
            .check_amqp()
            .expect_err("over");
        assert_eq!(
            err,
            MessageError::HeadersTooLarge {
                len: MAX_HEADERS_BYTES + 1,
                max: MAX_HEADERS_BYTES
            }
        );
        assert!(err.to_string().starts_with("headers"), "{err}");
        // Many empty headers: the framing alone goes over.
        let many: Headers = (0..10_000)
            .map(|i| (format!("h{i}"), String::new()))
            .collect();
        assert!(matches!(
            m(many.clone()).check_amqp(),
            Err(MessageError::HeadersTooLarge { .. })
        ));
        let mut n = NewMessage::new("e", "k", vec![]);
        n.headers = many;
        assert!(matches!(
            n.validate(10),
            Err(MessageError::HeadersTooLarge { .. })
        ));
    }

    proptest::proptest! {
        #[test]
        fn amqp_check_accepts_exactly_short_strings_up_to_255_bytes(
            key in "\\PC{0,300}",
            name in "\\PC{1,300}",
        ) {
            let m = NewMessage::new("e", key.clone(), vec![])
                .with_header(name.clone(), "v")
                .into_message(MessageId::v7(at(0), [1; 10]), at(0));
            let fits = key.len() <= MAX_SHORT_STRING && name.len() <= MAX_SHORT_STRING;
            proptest::prop_assert_eq!(m.check_amqp().is_ok(), fits);
        }
    }

    #[test]
    fn debug_hides_the_payload() {
        let m = NewMessage::new("e", "k", b"secret-card-number".to_vec())
            .into_message(MessageId::v7(at(0), [1; 10]), at(0));
        let shown = format!("{m:?}");
        assert!(!shown.contains("secret"), "{shown}");
        assert!(shown.contains("payload_len: 18"), "{shown}");
    }

    #[test]
    fn caused_by_keeps_the_correlation_and_names_the_cause() {
        let first = NewMessage::new("shop.orders", "order.created", b"{}".to_vec())
            .into_message(MessageId::v7(at(1), [1; 10]), at(1));
        assert_eq!(first.causation_id(), None);

        // The first of a conversation: its id becomes the correlation id.
        let second = NewMessage::new("shop.billing", "invoice.created", b"{}".to_vec())
            .with_header("traceparent", "00-abc-def-01")
            .caused_by(&first);
        let first_id = first.id.to_string();
        assert_eq!(second.correlation_id.as_deref(), Some(first_id.as_str()));
        assert_eq!(second.headers.get(CAUSATION_HEADER), Some(&first_id));
        assert_eq!(
            second.headers.get("traceparent").map(String::as_str),
            Some("00-abc-def-01"),
            "other headers stay"
        );
        let second = second.into_message(MessageId::v7(at(2), [2; 10]), at(2));
        assert_eq!(second.causation_id(), Some(first_id.as_str()));

        // Later ones keep the conversation's correlation id, and name their own cause
        // (replacing whatever was set before).
        let third = NewMessage::new("shop.mail", "mail.sent", b"{}".to_vec())
            .with_correlation_id("stale")
            .with_header(CAUSATION_HEADER, "stale")
            .caused_by(&second);
        assert_eq!(third.correlation_id.as_deref(), Some(first_id.as_str()));
        assert_eq!(
            third.headers.get(CAUSATION_HEADER),
            Some(&second.id.to_string())
        );
        assert_eq!(third.headers.len(), 1);

        // A correlation id of a foreign producer is kept as it is.
        let foreign = NewMessage::new("", "q", b"{}".to_vec())
            .with_correlation_id("order-42")
            .into_message(MessageId::v7(at(3), [3; 10]), at(3));
        let reply = NewMessage::new("", "r", b"{}".to_vec()).caused_by(&foreign);
        assert_eq!(reply.correlation_id.as_deref(), Some("order-42"));
        assert!(reply.validate(DEFAULT_MAX_PAYLOAD_BYTES).is_ok());
    }

    #[test]
    fn ids_parse_and_reject_garbage() {
        let id = MessageId::v7(at(5), [3; 10]);
        assert_eq!(id.to_string().parse::<MessageId>(), Ok(id));
        assert!(matches!(
            "nope".parse::<MessageId>(),
            Err(MessageError::InvalidId(_))
        ));
    }
}
