//! Typed messages: a serde value in, the same value out.
//!
//! An [`Event`] is an application message: a Rust type with a stable type name, a
//! version, and where it goes. [`to_new_message`] turns a value into a
//! [`NewMessage`] (body encoded by a [`Codec`], JSON by default); [`decode`] turns a
//! received [`Message`] back into the value, or says why it cannot
//! ([`DecodeError`], always permanent: trying again cannot help). A store's
//! enqueue takes `&event` as it takes a [`NewMessage`] ([`IntoNewMessage`]).
//!
//! What travels with the message, so that a consumer in any language can read it:
//!
//! | what | where |
//! |---|---|
//! | [`Event::TYPE`] | `message_type` (the row's column, AMQP `type`) |
//! | [`Event::VERSION`] | the header [`VERSION_HEADER`] (`outbox-version`) |
//! | the codec's content type | `content_type` (`application/json`) |
//! | the body | `payload`, as the codec encodes it |
//! | the message it was sent while handling ([`IntoNewMessage::caused_by`]) | the header [`CAUSATION_HEADER`](crate::message::CAUSATION_HEADER) (`outbox-causation-id`); `correlation_id` kept |
//!
//! A producer in another language writes a row a typed consumer accepts with
//! `message_type` set to the type name and a JSON body; without a version header
//! the message counts as version 1, and without a content type it is JSON.

use std::any::type_name;
use std::borrow::Cow;
use std::error::Error as StdError;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::message::{DEFAULT_MAX_PAYLOAD_BYTES, Message, MessageError, NewMessage};

/// The header carrying an event's [`Event::VERSION`], as decimal digits.
pub const VERSION_HEADER: &str = "outbox-version";

/// The version of a message that carries no [`VERSION_HEADER`] (written by a
/// producer that knows nothing of versions).
pub const DEFAULT_VERSION: u32 = 1;

/// An application message: a value with a stable type name, encoded with serde.
///
/// The type name ([`TYPE`](Event::TYPE)) is what consumers pick a handler by; keep
/// it stable when the Rust type is renamed or moved. Change
/// [`VERSION`](Event::VERSION) when the body changes in a way old consumers cannot
/// read; [`decode`] refuses a message of another version.
///
/// A plain impl is all it takes:
///
/// ```
/// use std::borrow::Cow;
///
/// use outbox_core::event::{self, Event};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Debug, PartialEq, Serialize, Deserialize)]
/// struct OrderCreated {
///     order_id: u64,
///     total_cents: u64,
///     customer: String,
/// }
///
/// impl Event for OrderCreated {
///     const TYPE: &'static str = "order.created";
///     const EXCHANGE: &'static str = "shop.orders";
///
///     // Optional: all messages of one customer, in the order they were written.
///     fn ordering_key(&self) -> Option<String> {
///         Some(format!("customer:{}", self.customer))
///     }
/// }
///
/// let order = OrderCreated { order_id: 42, total_cents: 1999, customer: "ada".into() };
/// let message = event::to_new_message(&order)?;
/// assert_eq!(message.exchange, "shop.orders");
/// assert_eq!(message.routing_key, "order.created");
/// assert_eq!(message.message_type.as_deref(), Some("order.created"));
/// assert_eq!(message.content_type.as_deref(), Some("application/json"));
/// assert_eq!(message.headers.get(event::VERSION_HEADER).map(String::as_str), Some("1"));
/// assert_eq!(message.ordering_key.as_deref(), Some("customer:ada"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// With the facade's `derive` feature, `#[derive(outbox::Event)]` writes the
/// constants (and a fixed routing key) from an `#[event(..)]` attribute.
pub trait Event: Serialize + DeserializeOwned + Send + Sync + 'static {
    /// The stable type name: the message's `message_type` (AMQP `type`), what a
    /// consumer picks a handler by. At most 255 bytes.
    const TYPE: &'static str;

    /// The version of the body's shape, sent in the header [`VERSION_HEADER`].
    /// A message without the header counts as version [`DEFAULT_VERSION`].
    const VERSION: u32 = DEFAULT_VERSION;

    /// The exchange it is published to (`""`: the AMQP default exchange).
    const EXCHANGE: &'static str;

    /// The routing key; by default the type name.
    fn routing_key(&self) -> Cow<'_, str> {
        Cow::Borrowed(Self::TYPE)
    }

    /// Messages with the same key are published and handled one after another, in
    /// the order they were written; by default none (no order).
    fn ordering_key(&self) -> Option<String> {
        None
    }

    /// How long after it is enqueued it is published at the earliest; by default
    /// at once.
    fn delay(&self) -> Option<Duration> {
        None
    }
}

/// An encoding of message bodies.
///
/// [`Json`] is the one there is; the functions taking a codec
/// ([`to_new_message_with`], [`decode_with`]) are how another one is used.
pub trait Codec {
    /// The content type of what [`encode`](Codec::encode) writes, set on the
    /// message (AMQP `content_type`, the row's `content_type`).
    const CONTENT_TYPE: &'static str;

    /// Why a value could not be encoded or a body decoded.
    type Error: StdError + Send + Sync + 'static;

    /// Encodes a value.
    ///
    /// # Errors
    /// When the value cannot be written in this encoding.
    fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, Self::Error>;

    /// Decodes a body.
    ///
    /// # Errors
    /// When the body is not a `T` in this encoding.
    fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Self::Error>;

    /// Whether a message with this content type can be decoded. By default when
    /// its media type (before any `;` parameters) is [`CONTENT_TYPE`](Codec::CONTENT_TYPE),
    /// ignoring ASCII case, or when it is empty (not set).
    fn accepts(content_type: &str) -> bool {
        let essence = content_type
            .split_once(';')
            .map_or(content_type, |(essence, _)| essence)
            .trim();
        essence.is_empty() || essence.eq_ignore_ascii_case(Self::CONTENT_TYPE)
    }
}

/// JSON with `serde_json`: `application/json`, the default codec.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Json;

impl Codec for Json {
    const CONTENT_TYPE: &'static str = "application/json";
    type Error = serde_json::Error;

    fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, Self::Error> {
        serde_json::to_vec(value)
    }

    fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Self::Error> {
        serde_json::from_slice(bytes)
    }
}

/// Why an event could not become a [`NewMessage`]. Nothing is written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EventError {
    /// The codec could not encode the value (JSON: e.g. a map whose keys are not
    /// strings, or a `Serialize` impl that fails).
    #[error("cannot encode {rust_type} as {message_type}: {error}")]
    Encode {
        /// [`Event::TYPE`].
        message_type: &'static str,
        /// The Rust type, as [`std::any::type_name`] spells it.
        rust_type: &'static str,
        /// The codec's error.
        error: Box<dyn StdError + Send + Sync>,
    },
    /// The message breaks a limit of [`NewMessage::validate`] (payload too large,
    /// a routing or ordering key longer than AMQP allows, ...).
    #[error("{message_type} from {rust_type} is refused: {error}")]
    Invalid {
        /// [`Event::TYPE`].
        message_type: &'static str,
        /// The Rust type, as [`std::any::type_name`] spells it.
        rust_type: &'static str,
        /// The limit broken.
        error: MessageError,
    },
}

/// Why a received message could not be decoded as an [`Event`].
///
/// Every one is permanent ([`is_permanent`](DecodeError::is_permanent)): the
/// message will never decode as this type, however often it is tried. Each names
/// the message's type and the Rust type it was decoded as.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The message's type is not the event's [`Event::TYPE`] (or it has none).
    #[error("cannot decode {} as {rust_type}: it expects message type {expected}", found.as_deref().unwrap_or("a message without a type"))]
    WrongType {
        /// The message's type.
        found: Option<String>,
        /// [`Event::TYPE`].
        expected: &'static str,
        /// The Rust type, as [`std::any::type_name`] spells it.
        rust_type: &'static str,
    },
    /// The version header names another version than [`Event::VERSION`], or is
    /// not a number.
    #[error(
        "cannot decode {message_type} as {rust_type}: version {found:?} is not supported, only {expected}"
    )]
    UnsupportedVersion {
        /// The message's type.
        message_type: String,
        /// The value of the header [`VERSION_HEADER`].
        found: String,
        /// [`Event::VERSION`].
        expected: u32,
        /// The Rust type, as [`std::any::type_name`] spells it.
        rust_type: &'static str,
    },
    /// The message's content type is not the codec's.
    #[error(
        "cannot decode {message_type} as {rust_type}: content type {found:?} is not {expected}"
    )]
    UnsupportedContentType {
        /// The message's type.
        message_type: String,
        /// The message's content type.
        found: String,
        /// [`Codec::CONTENT_TYPE`].
        expected: &'static str,
        /// The Rust type, as [`std::any::type_name`] spells it.
        rust_type: &'static str,
    },
    /// The body does not decode as the Rust type: not JSON, a missing field, a
    /// field of another type, ...
    #[error("cannot decode {message_type} as {rust_type}: {error}")]
    Body {
        /// The message's type.
        message_type: String,
        /// The Rust type, as [`std::any::type_name`] spells it.
        rust_type: &'static str,
        /// The codec's error (for JSON a `serde_json::Error`, with line and column).
        error: Box<dyn StdError + Send + Sync>,
    },
}

impl DecodeError {
    /// Whether trying again cannot help: true for every variant there is, so a
    /// consumer marks such a message dead at once.
    #[must_use]
    pub fn is_permanent(&self) -> bool {
        match self {
            Self::WrongType { .. }
            | Self::UnsupportedVersion { .. }
            | Self::UnsupportedContentType { .. }
            | Self::Body { .. } => true,
        }
    }
}

/// The [`NewMessage`] for an event, its body in JSON: exchange
/// ([`Event::EXCHANGE`]), routing key, type, content type, version header,
/// ordering key and delay as the event says, checked as
/// [`NewMessage::validate`] checks with [`DEFAULT_MAX_PAYLOAD_BYTES`].
///
/// # Errors
/// [`EventError::Encode`] when the value cannot be written as JSON,
/// [`EventError::Invalid`] when the message breaks a limit.
pub fn to_new_message<E: Event>(event: &E) -> Result<NewMessage, EventError> {
    to_new_message_with::<Json, E>(event, DEFAULT_MAX_PAYLOAD_BYTES)
}

/// [`to_new_message`] with another codec and payload limit (a store's
/// configured one).
///
/// # Errors
/// [`EventError::Encode`] when the codec cannot encode the value,
/// [`EventError::Invalid`] when the message breaks a limit.
pub fn to_new_message_with<C: Codec, E: Event>(
    event: &E,
    max_payload_bytes: usize,
) -> Result<NewMessage, EventError> {
    let payload = C::encode(event).map_err(|error| EventError::Encode {
        message_type: E::TYPE,
        rust_type: type_name::<E>(),
        error: Box::new(error),
    })?;
    let mut message = NewMessage::new(E::EXCHANGE, event.routing_key(), payload)
        .with_type(E::TYPE)
        .with_content_type(C::CONTENT_TYPE)
        .with_header(VERSION_HEADER, E::VERSION.to_string());
    message.ordering_key = event.ordering_key();
    if let Some(delay) = event.delay() {
        message = message.deliver_after(delay);
    }
    message
        .validate(max_payload_bytes)
        .map_err(|error| EventError::Invalid {
            message_type: E::TYPE,
            rust_type: type_name::<E>(),
            error,
        })?;
    Ok(message)
}

/// What a store's enqueue accepts: a [`NewMessage`] as it is, or a reference to
/// an [`Event`], which becomes one as [`to_new_message_with`] makes it (JSON,
/// checked against the store's payload limit). So one `enqueue` takes both:
///
/// ```
/// use outbox_core::event::{Event, IntoNewMessage};
/// use outbox_core::message::{DEFAULT_MAX_PAYLOAD_BYTES, NewMessage};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize)]
/// struct OrderCreated {
///     order_id: u64,
/// }
///
/// impl Event for OrderCreated {
///     const TYPE: &'static str = "order.created";
///     const EXCHANGE: &'static str = "shop.orders";
/// }
///
/// fn enqueue(message: impl IntoNewMessage) -> Result<NewMessage, outbox_core::EventError> {
///     message.into_new_message(DEFAULT_MAX_PAYLOAD_BYTES)
/// }
///
/// let typed = enqueue(&OrderCreated { order_id: 42 })?;
/// let plain = enqueue(NewMessage::new("shop.orders", "order.created", br#"{"order_id":42}"#.to_vec()))?;
/// assert_eq!(typed.payload, plain.payload);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait IntoNewMessage {
    /// The message, or why the value cannot become one (nothing is written).
    ///
    /// # Errors
    /// For an event, [`EventError::Encode`] when it cannot be written as JSON and
    /// [`EventError::Invalid`] when the message breaks a limit (a payload over
    /// `max_payload_bytes`, a key longer than AMQP allows). A [`NewMessage`] is
    /// returned as it is: the store checks it and refuses it with a
    /// [`MessageError`], as it always has.
    fn into_new_message(self, max_payload_bytes: usize) -> Result<NewMessage, EventError>;

    /// The same message, sent while handling `cause`: see
    /// [`NewMessage::caused_by`] (correlation id kept, causation header set).
    /// `outbox.enqueue(&mut tx, event.caused_by(&incoming))` with an event.
    #[must_use]
    fn caused_by(self, cause: &Message) -> CausedBy<'_, Self>
    where
        Self: Sized,
    {
        CausedBy {
            message: self,
            cause,
        }
    }
}

impl IntoNewMessage for NewMessage {
    fn into_new_message(self, _max_payload_bytes: usize) -> Result<NewMessage, EventError> {
        Ok(self)
    }
}

impl<E: Event> IntoNewMessage for &E {
    fn into_new_message(self, max_payload_bytes: usize) -> Result<NewMessage, EventError> {
        to_new_message_with::<Json, E>(self, max_payload_bytes)
    }
}

/// A message sent while handling another: made by [`IntoNewMessage::caused_by`].
#[derive(Debug, Clone, Copy)]
pub struct CausedBy<'a, M> {
    message: M,
    cause: &'a Message,
}

impl<M: IntoNewMessage> IntoNewMessage for CausedBy<'_, M> {
    fn into_new_message(self, max_payload_bytes: usize) -> Result<NewMessage, EventError> {
        Ok(self
            .message
            .into_new_message(max_payload_bytes)?
            .caused_by(self.cause))
    }
}

/// The event a received message carries, its body in JSON.
///
/// Checked in this order: the message's type is [`Event::TYPE`]; its version
/// (header [`VERSION_HEADER`], [`DEFAULT_VERSION`] when absent) is
/// [`Event::VERSION`]; its content type is JSON (`application/json`, with or
/// without parameters such as `; charset=utf-8`, or empty); its body decodes.
///
/// # Errors
/// A [`DecodeError`] naming what failed, the message's type and the Rust type.
pub fn decode<E: Event>(message: &Message) -> Result<E, DecodeError> {
    decode_with::<Json, E>(message)
}

/// The version `message` says it has: its [`VERSION_HEADER`], or
/// [`DEFAULT_VERSION`] without one; `None` for a header that is no number.
#[must_use]
pub fn version_of(message: &Message) -> Option<u32> {
    match message.headers.get(VERSION_HEADER) {
        None => Some(DEFAULT_VERSION),
        Some(v) => v.trim().parse().ok(),
    }
}

/// [`decode`] with another codec.
///
/// # Errors
/// A [`DecodeError`] naming what failed, the message's type and the Rust type.
pub fn decode_with<C: Codec, E: Event>(message: &Message) -> Result<E, DecodeError> {
    let rust_type = type_name::<E>();
    let message_type = match message.message_type.as_deref() {
        Some(t) if t == E::TYPE => t,
        found => {
            return Err(DecodeError::WrongType {
                found: found.map(str::to_owned),
                expected: E::TYPE,
                rust_type,
            });
        }
    };
    if let Some(found) = message.headers.get(VERSION_HEADER) {
        if version_of(message) != Some(E::VERSION) {
            return Err(DecodeError::UnsupportedVersion {
                message_type: message_type.to_owned(),
                found: found.clone(),
                expected: E::VERSION,
                rust_type,
            });
        }
    } else if E::VERSION != DEFAULT_VERSION {
        return Err(DecodeError::UnsupportedVersion {
            message_type: message_type.to_owned(),
            found: format!("{DEFAULT_VERSION} (no {VERSION_HEADER} header)"),
            expected: E::VERSION,
            rust_type,
        });
    }
    if !C::accepts(&message.content_type) {
        return Err(DecodeError::UnsupportedContentType {
            message_type: message_type.to_owned(),
            found: message.content_type.clone(),
            expected: C::CONTENT_TYPE,
            rust_type,
        });
    }
    C::decode(&message.payload).map_err(|error| DecodeError::Body {
        message_type: message_type.to_owned(),
        rust_type,
        error: Box::new(error),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::MessageId;
    use crate::{Headers, Timestamp};
    use proptest::prelude::*;
    use serde::Deserialize;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct OrderCreated {
        order_id: u64,
        total_cents: u64,
        customer: String,
        lines: Vec<(String, u32)>,
        note: Option<String>,
    }

    impl Event for OrderCreated {
        const TYPE: &'static str = "order.created";
        const EXCHANGE: &'static str = "shop.orders";

        fn routing_key(&self) -> Cow<'_, str> {
            Cow::Owned(format!("order.created.{}", self.customer))
        }

        fn ordering_key(&self) -> Option<String> {
            Some(format!("customer:{}", self.customer))
        }

        fn delay(&self) -> Option<Duration> {
            (self.total_cents == 0).then(|| Duration::from_secs(60))
        }
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Minimal {
        order_id: u64,
    }

    impl Event for Minimal {
        const TYPE: &'static str = "order.created";
        const EXCHANGE: &'static str = "";
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct MinimalV2 {
        order_id: u64,
    }

    impl Event for MinimalV2 {
        const TYPE: &'static str = "order.created";
        const VERSION: u32 = 2;
        const EXCHANGE: &'static str = "";
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Blob {
        bytes: String,
    }

    impl Event for Blob {
        const TYPE: &'static str = "blob";
        const EXCHANGE: &'static str = "blobs";
    }

    /// Fails to encode: JSON map keys must be strings.
    #[derive(Debug, Serialize, Deserialize)]
    struct BadKeys {
        map: std::collections::BTreeMap<(u8, u8), u8>,
    }

    impl Event for BadKeys {
        const TYPE: &'static str = "bad.keys";
        const EXCHANGE: &'static str = "x";
    }

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_unix_timestamp(secs).expect("valid")
    }

    fn received(
        message_type: Option<&str>,
        headers: Headers,
        content_type: &str,
        body: &[u8],
    ) -> Message {
        let mut new =
            NewMessage::new("", "order.created", body.to_vec()).with_content_type(content_type);
        new.message_type = message_type.map(str::to_owned);
        new.headers = headers;
        new.into_message(MessageId::v7(at(0), [7; 10]), at(0))
    }

    fn v(n: &str) -> Headers {
        Headers::from([(VERSION_HEADER.to_owned(), n.to_owned())])
    }

    #[test]
    fn the_message_carries_what_the_event_says() {
        let order = OrderCreated {
            order_id: 42,
            total_cents: 0,
            customer: "ada".into(),
            lines: vec![("book".into(), 2)],
            note: None,
        };
        let m = to_new_message(&order).expect("valid");
        assert_eq!(m.exchange, "shop.orders");
        assert_eq!(m.routing_key, "order.created.ada");
        assert_eq!(m.message_type.as_deref(), Some("order.created"));
        assert_eq!(m.content_type.as_deref(), Some("application/json"));
        assert_eq!(m.headers, v("1"));
        assert_eq!(m.ordering_key.as_deref(), Some("customer:ada"));
        assert_eq!(m.due, Some(crate::Due::After(Duration::from_secs(60))));
        let body: serde_json::Value = serde_json::from_slice(&m.payload).expect("JSON");
        assert_eq!(body["order_id"], 42);

        let m = to_new_message(&Minimal { order_id: 1 }).expect("valid");
        assert_eq!(
            (m.exchange.as_str(), m.routing_key.as_str()),
            ("", "order.created")
        );
        assert_eq!((m.ordering_key, m.due), (None, None));
        assert_eq!(
            to_new_message(&MinimalV2 { order_id: 1 })
                .expect("valid")
                .headers,
            v("2")
        );
    }

    #[test]
    fn a_wrong_field_type_names_the_rust_type_and_the_serde_error() {
        let m = received(
            Some("order.created"),
            Headers::new(),
            "application/json",
            br#"{"order_id":"x"}"#,
        );
        let err = decode::<Minimal>(&m).expect_err("a string is no u64");
        assert!(matches!(err, DecodeError::Body { .. }), "{err:?}");
        assert!(err.is_permanent());
        assert_eq!(
            err.to_string(),
            format!(
                "cannot decode order.created as {}: invalid type: string \"x\", expected u64 at line 1 column 15",
                type_name::<Minimal>()
            )
        );
        assert!(err.to_string().contains("event::tests::Minimal"), "{err}");
    }

    #[test]
    fn a_body_that_is_not_json_is_refused() {
        let m = received(
            Some("order.created"),
            Headers::new(),
            "application/json",
            b"order 42",
        );
        let err = decode::<Minimal>(&m).expect_err("not JSON");
        assert!(matches!(err, DecodeError::Body { .. }), "{err:?}");
        assert!(err.is_permanent());
        assert!(
            err.to_string()
                .contains("expected value at line 1 column 1"),
            "{err}"
        );
    }

    #[test]
    fn a_wrong_type_name_or_none_is_refused() {
        let body = br#"{"order_id":1}"#;
        let err = decode::<Minimal>(&received(Some("order.paid"), Headers::new(), "", body))
            .expect_err("another type");
        assert!(matches!(err, DecodeError::WrongType { .. }), "{err:?}");
        assert!(err.is_permanent());
        assert_eq!(
            err.to_string(),
            format!(
                "cannot decode order.paid as {}: it expects message type order.created",
                type_name::<Minimal>()
            )
        );
        let err =
            decode::<Minimal>(&received(None, Headers::new(), "", body)).expect_err("no type");
        assert!(
            err.to_string().contains("a message without a type"),
            "{err}"
        );
    }

    #[test]
    fn another_version_is_refused_and_a_missing_header_is_version_1() {
        let body = br#"{"order_id":1}"#;
        let ok = |h: Headers| {
            decode::<Minimal>(&received(
                Some("order.created"),
                h,
                "application/json",
                body,
            ))
        };
        assert_eq!(
            ok(Headers::new()).expect("no header: version 1"),
            Minimal { order_id: 1 }
        );
        assert_eq!(ok(v(" 1 ")).expect("version 1"), Minimal { order_id: 1 });
        for bad in ["2", "0", "one", ""] {
            let err = ok(v(bad)).expect_err(bad);
            assert!(
                matches!(err, DecodeError::UnsupportedVersion { .. }),
                "{err:?}"
            );
            assert!(err.is_permanent());
            assert!(err.to_string().contains("only 1"), "{err}");
        }
        let err = ok(v("2")).expect_err("v2");
        assert_eq!(
            err.to_string(),
            format!(
                "cannot decode order.created as {}: version \"2\" is not supported, only 1",
                type_name::<Minimal>()
            )
        );
        let v2 = |h: Headers| decode::<MinimalV2>(&received(Some("order.created"), h, "", body));
        assert_eq!(v2(v("2")).expect("version 2"), MinimalV2 { order_id: 1 });
        let err = v2(Headers::new()).expect_err("no header is version 1");
        assert!(
            matches!(err, DecodeError::UnsupportedVersion { .. }),
            "{err:?}"
        );
        assert!(
            err.to_string().contains("no outbox-version header"),
            "{err}"
        );
    }

    #[test]
    fn a_content_type_other_than_json_is_refused_and_parameters_are_allowed() {
        let body = br#"{"order_id":1}"#;
        let with = |ct: &str| {
            decode::<Minimal>(&received(Some("order.created"), Headers::new(), ct, body))
        };
        for ok in [
            "application/json",
            "application/json; charset=utf-8",
            "Application/JSON",
            "",
        ] {
            assert_eq!(with(ok).expect(ok), Minimal { order_id: 1 });
        }
        for bad in ["text/plain", "application/x-protobuf", "application/jsonx"] {
            let err = with(bad).expect_err(bad);
            assert!(
                matches!(err, DecodeError::UnsupportedContentType { .. }),
                "{err:?}"
            );
            assert!(err.is_permanent());
            assert!(err.to_string().contains("is not application/json"), "{err}");
        }
    }

    #[test]
    fn an_oversize_payload_is_refused_by_validation() {
        let big = Blob {
            bytes: "x".repeat(DEFAULT_MAX_PAYLOAD_BYTES),
        };
        let err = to_new_message(&big).expect_err("over 1 MiB with its quotes");
        assert!(
            matches!(
                err,
                EventError::Invalid {
                    error: MessageError::PayloadTooLarge {
                        max: DEFAULT_MAX_PAYLOAD_BYTES,
                        ..
                    },
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(err.to_string().starts_with("blob from "), "{err}");
        // The same value under a larger limit of a store's.
        let m = to_new_message_with::<Json, _>(&big, 2 * DEFAULT_MAX_PAYLOAD_BYTES).expect("fits");
        assert_eq!(
            m.payload.len(),
            DEFAULT_MAX_PAYLOAD_BYTES + r#"{"bytes":""}"#.len()
        );
    }

    #[test]
    fn a_routing_key_longer_than_amqp_allows_is_refused() {
        let order = OrderCreated {
            order_id: 1,
            total_cents: 1,
            customer: "c".repeat(300),
            lines: vec![],
            note: None,
        };
        let err = to_new_message(&order).expect_err("too long");
        assert!(
            matches!(
                err,
                EventError::Invalid {
                    error: MessageError::TooLong {
                        field: "routing_key",
                        ..
                    },
                    ..
                }
            ),
            "{err:?}"
        );
    }

    #[test]
    fn a_value_json_cannot_write_is_an_encode_error() {
        let bad = BadKeys {
            map: [((1, 2), 3)].into(),
        };
        let err = to_new_message(&bad).expect_err("tuple keys");
        assert!(matches!(err, EventError::Encode { .. }), "{err:?}");
        assert!(err.to_string().starts_with("cannot encode "), "{err}");
        assert!(err.to_string().contains("key must be a string"), "{err}");
    }

    #[test]
    fn into_new_message_takes_events_as_to_new_message_and_messages_as_they_are() {
        let order = OrderCreated {
            order_id: 7,
            total_cents: 5,
            customer: "bo".into(),
            lines: vec![],
            note: Some("gift".into()),
        };
        assert_eq!(
            (&order)
                .into_new_message(DEFAULT_MAX_PAYLOAD_BYTES)
                .expect("valid"),
            to_new_message(&order).expect("valid")
        );
        // The store's own limit, not the default one.
        let err = (&order).into_new_message(10).expect_err("over 10 bytes");
        assert!(
            matches!(
                err,
                EventError::Invalid {
                    error: MessageError::PayloadTooLarge { max: 10, .. },
                    ..
                }
            ),
            "{err:?}"
        );
        let bad = BadKeys {
            map: [((1, 2), 3)].into(),
        };
        assert!(matches!(
            (&bad).into_new_message(DEFAULT_MAX_PAYLOAD_BYTES),
            Err(EventError::Encode { .. })
        ));
        // A plain message is not checked here (the store checks it, as before).
        let plain = NewMessage::new("e", "k", vec![0; 11]);
        assert_eq!(plain.clone().into_new_message(10).expect("as it is"), plain);
    }

    #[test]
    fn caused_by_wraps_an_event_or_a_message() {
        use crate::message::CAUSATION_HEADER;

        let incoming = received(Some("order.created"), Headers::new(), "", b"{}");
        let cause = incoming.id.to_string();
        let order = Minimal { order_id: 3 };
        // Autoref: the event itself, not a reference, is what the call reads.
        let m = order
            .caused_by(&incoming)
            .into_new_message(DEFAULT_MAX_PAYLOAD_BYTES)
            .expect("valid");
        assert_eq!(m.correlation_id.as_deref(), Some(cause.as_str()));
        assert_eq!(m.headers.get(CAUSATION_HEADER), Some(&cause));
        assert_eq!(m.headers.get(VERSION_HEADER).map(String::as_str), Some("1"));
        assert_eq!(m.message_type.as_deref(), Some("order.created"));

        let plain = IntoNewMessage::caused_by(NewMessage::new("e", "k", vec![]), &incoming)
            .into_new_message(0)
            .expect("as it is");
        assert_eq!(plain.correlation_id.as_deref(), Some(cause.as_str()));
        assert!(
            (&Blob {
                bytes: "x".repeat(20)
            })
                .caused_by(&incoming)
                .into_new_message(10)
                .is_err()
        );
    }

    fn order() -> impl Strategy<Value = OrderCreated> {
        (
            any::<u64>(),
            any::<u64>(),
            "\\PC{0,40}",
            proptest::collection::vec(("\\PC{0,10}", any::<u32>()), 0..5),
            proptest::option::of("\\PC{0,20}"),
        )
            .prop_map(
                |(order_id, total_cents, customer, lines, note)| OrderCreated {
                    order_id,
                    total_cents,
                    customer,
                    lines,
                    note,
                },
            )
    }

    proptest! {
        #[test]
        fn values_round_trip_through_a_message(order in order(), secs in 0i64..4_000_000_000) {
            let new = to_new_message(&order).expect("valid");
            let message = new.into_message(MessageId::v7(at(secs), [9; 10]), at(secs));
            prop_assert_eq!(message.message_type.as_deref(), Some(OrderCreated::TYPE));
            prop_assert_eq!(&message.exchange, OrderCreated::EXCHANGE);
            prop_assert_eq!(message.routing_key.clone(), format!("order.created.{}", order.customer));
            prop_assert_eq!(message.ordering_key.clone(), order.ordering_key());
            prop_assert_eq!(message.not_before.is_some(), order.total_cents == 0);
            prop_assert_eq!(decode::<OrderCreated>(&message).expect("decodes"), order);
        }
    }
}
