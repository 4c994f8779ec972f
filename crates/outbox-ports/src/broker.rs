//! The message broker: publishing with per-message outcomes, and subscribing with
//! manual acknowledgement.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::{Headers, Message, MessageId, Timestamp, message::DEFAULT_CONTENT_TYPE};

use crate::PortError;

/// What became of one published message.
#[derive(Debug)]
pub enum PublishOutcome {
    /// The broker confirmed it (and it was routed).
    Confirmed,
    /// The broker refused it (negative confirm).
    Nacked(String),
    /// The broker returned it: no queue is bound for its routing key. A failure, even
    /// though the broker also confirms returned messages.
    Unroutable(String),
    /// It could not be published, or its confirm never came (connection lost,
    /// timeout): it may or may not have reached the broker, so it is retried.
    Failed(PortError),
    /// It was never sent: the broker could not be reached, or it blocks publishers
    /// (a memory or disk alarm), the batch's time ran out before its turn, or the
    /// connection broke before it was handed over. Nothing about the message is
    /// wrong, so a relay spends no attempt on it: it gives the message back and
    /// waits for the broker.
    NotSent(PortError),
    /// It can never be published as it is (e.g. a routing key longer than AMQP's
    /// 255 bytes): permanent, so a relay marks it dead at once with this reason.
    Rejected(String),
}

impl PublishOutcome {
    /// Whether the message is safely with the broker.
    #[must_use]
    pub const fn is_confirmed(&self) -> bool {
        matches!(self, Self::Confirmed)
    }
}

impl fmt::Display for PublishOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Confirmed => f.write_str("confirmed"),
            Self::Nacked(why) => write!(f, "nacked by the broker: {why}"),
            Self::Unroutable(why) => write!(f, "unroutable: {why}"),
            Self::Failed(e) => write!(f, "{e}"),
            Self::NotSent(e) => write!(f, "not sent: {e}"),
            Self::Rejected(why) => write!(f, "cannot be published: {why}"),
        }
    }
}

/// The budget of a publish without a lease: a year, i.e. no deadline but the
/// publisher's own timeouts (adapters add it to an instant without overflowing).
pub const NO_PUBLISH_DEADLINE: Duration = Duration::from_secs(365 * 24 * 3600);

/// Publishes messages with confirms.
#[cfg_attr(feature = "mocks", mockall::automock)]
#[async_trait]
pub trait Publisher: Send + Sync {
    /// Publishes a batch (pipelined where the broker allows) and waits for every
    /// outcome, all within `budget` from now. The result has one outcome per
    /// message, in the same order; a failure of the whole batch shows as `Failed`
    /// for each message.
    ///
    /// The budget is what is left of the claim's lease: after it, another relay may
    /// claim the same rows. So no message is handed to the broker once it is spent
    /// (those are `NotSent`), and every wait (connecting, the channel, checks,
    /// confirms) ends with it: a confirm still missing then is `Failed`.
    async fn publish_within(&self, messages: &[Message], budget: Duration) -> Vec<PublishOutcome>;

    /// [`Publisher::publish_within`] for callers holding no lease: bounded only by
    /// the publisher's own timeouts.
    async fn publish(&self, messages: &[Message]) -> Vec<PublishOutcome> {
        self.publish_within(messages, NO_PUBLISH_DEADLINE).await
    }

    /// Whether the broker is reachable (for readiness checks).
    ///
    /// # Errors
    /// [`PortError::Transient`] when it is not.
    async fn check(&self) -> Result<(), PortError>;

    /// What the broker cannot serve now though it is reachable, one line each (on
    /// RabbitMQ: queues of the topology whose home node is down, passed over when
    /// the connection was opened). Shown by readiness as detail, never a failure:
    /// every other route still publishes.
    fn degraded(&self) -> Vec<String> {
        Vec::new()
    }
}

/// The AMQP header that carries a message's ordering key to consumers (AMQP has no
/// property for it). A consumer that keeps order by key reads it back.
pub const ORDERING_KEY_HEADER: &str = "x-ordering-key";

/// The AMQP header that carries the exchange a message was written for when the
/// relay published it to one shard of a sharded exchange (`orders` for a message
/// published to `orders.shard-2`), so that a consumer records the exchange the
/// producer named. Reserved like [`ORDERING_KEY_HEADER`]: a consumer reads it as the
/// exchange, whoever set it.
pub const EXCHANGE_HEADER: &str = "x-outbox-exchange";

/// The header naming the message an operator's replay stands in for (the first
/// of a chain: a replay of a replay names the same one), set by edit and replay
/// ([`replay_root`]). A consumer records a delivery carrying it under that id
/// ([`Envelope::to_message`]): the replay is the original, edited, so an inbox
/// that recorded the original (consumed, failing or dead) absorbs the replay as a
/// duplicate, and the original arriving after its replay is absorbed the same way.
/// A dead message does not prove it reached no queue (a confirm that timed out
/// after the frame was written): without this, a replay could run a handler a
/// second time. Reserved like [`EXCHANGE_HEADER`]: whoever sets it, a consumer
/// reads it so (a value that is not a message id is ignored).
pub const REPLAY_OF_HEADER: &str = "x-outbox-replay-of";

/// The id a replay of `original` stands in for: the one `original` names in
/// [`REPLAY_OF_HEADER`] when it is itself a replay, else its own.
#[must_use]
pub fn replay_root(original: &Message) -> MessageId {
    original
        .headers
        .get(REPLAY_OF_HEADER)
        .and_then(|v| v.parse().ok())
        .unwrap_or(original.id)
}

/// Stamps `headers` (a replay's) with [`REPLAY_OF_HEADER`] naming what a replay of
/// `original` stands in for ([`replay_root`]), whatever they said before: every
/// replay, however it is edited and whoever makes it, is then recorded by a
/// consumer as the message it replaces.
pub fn stamp_replay_of(headers: &mut Headers, original: &Message) {
    headers.insert(
        REPLAY_OF_HEADER.to_owned(),
        replay_root(original).to_string(),
    );
}

/// What the broker recorded when it dead-lettered a delivery: the newest entry of
/// RabbitMQ's `x-death` header (and `x-delivery-count`, when it is there).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Death {
    /// Why: `delivery_limit` (a quorum queue's limit), `rejected`, `expired`,
    /// `maxlen`.
    pub reason: String,
    /// How many times it was dead-lettered from `queue` for `reason`.
    pub count: u64,
    /// The queue it was dead-lettered from.
    pub queue: String,
    /// The exchange it had been published to.
    pub exchange: String,
    /// The routing keys it had been published with.
    pub routing_keys: Vec<String>,
    /// The queue's `x-delivery-count` of the delivery, if the broker sent one.
    pub delivery_count: Option<u64>,
}

impl fmt::Display for Death {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "x-death reason {:?}, count {}, from queue {:?}",
            self.reason, self.count, self.queue
        )?;
        if let Some(n) = self.delivery_count {
            write!(f, ", x-delivery-count {n}")?;
        }
        Ok(())
    }
}

/// A delivery as it came from the broker, before it is trusted as a [`Message`].
#[derive(Clone, PartialEq, Eq)]
pub struct Envelope {
    /// AMQP `message_id`, if any.
    pub message_id: Option<String>,
    /// Exchange it was published to.
    pub exchange: String,
    /// Routing key.
    pub routing_key: String,
    /// AMQP `type`.
    pub message_type: Option<String>,
    /// Headers.
    pub headers: Headers,
    /// The raw body.
    pub body: Vec<u8>,
    /// AMQP `content_type`.
    pub content_type: Option<String>,
    /// AMQP `correlation_id`.
    pub correlation_id: Option<String>,
    /// AMQP `app_id`: the producing service.
    pub source: Option<String>,
    /// AMQP `timestamp`.
    pub timestamp: Option<Timestamp>,
    /// The message's ordering key (header [`ORDERING_KEY_HEADER`]).
    pub ordering_key: Option<String>,
    /// Set when the broker dead-lettered this delivery (its `x-death` header).
    pub death: Option<Death>,
}

impl fmt::Debug for Envelope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Envelope")
            .field("message_id", &self.message_id)
            .field("exchange", &self.exchange)
            .field("routing_key", &self.routing_key)
            .field("message_type", &self.message_type)
            .field("ordering_key", &self.ordering_key)
            .field("death", &self.death)
            .field("body_len", &self.body.len())
            .finish_non_exhaustive()
    }
}

/// Why a delivery cannot be taken as a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// It has no `message_id`, so it cannot be deduplicated.
    #[error("delivery has no message id")]
    MissingMessageId,
    /// Its `message_id` is not a UUID.
    #[error("message id {0:?} is not a UUID")]
    InvalidMessageId(String),
    /// Its ordering key (header [`ORDERING_KEY_HEADER`]) is longer than an ordering
    /// key may be (255 bytes, as on the producing side), so no inbox could keep it.
    #[error("ordering key of {0} bytes is over the limit of 255")]
    OrderingKeyTooLong(usize),
}

impl Envelope {
    /// The envelope of a message, as a publisher sends it.
    #[must_use]
    pub fn of(message: &Message) -> Self {
        Self {
            message_id: Some(message.id.to_string()),
            exchange: message.exchange.clone(),
            routing_key: message.routing_key.clone(),
            message_type: message.message_type.clone(),
            headers: message.headers.clone(),
            body: message.payload.clone(),
            content_type: Some(message.content_type.clone()),
            correlation_id: message.correlation_id.clone(),
            source: message.source.clone(),
            timestamp: Some(message.created_at),
            ordering_key: message.ordering_key.clone(),
            death: None,
        }
    }

    /// The message inside; `received_at` stands in for a missing timestamp. A
    /// replay ([`REPLAY_OF_HEADER`]) has the id of the message it stands in for.
    ///
    /// # Errors
    /// [`DecodeError`] when there is no usable message id.
    pub fn to_message(&self, received_at: Timestamp) -> Result<Message, DecodeError> {
        let raw = self
            .message_id
            .as_deref()
            .filter(|s| !s.is_empty())
            .ok_or(DecodeError::MissingMessageId)?;
        let own: MessageId = raw
            .parse()
            .map_err(|_| DecodeError::InvalidMessageId(raw.to_owned()))?;
        // A replay is recorded as the message it stands in for (REPLAY_OF_HEADER).
        let id = self
            .headers
            .get(REPLAY_OF_HEADER)
            .and_then(|v| v.parse().ok())
            .unwrap_or(own);
        if let Some(k) = self
            .ordering_key
            .as_ref()
            .filter(|k| k.len() > outbox_core::message::MAX_SHORT_STRING)
        {
            return Err(DecodeError::OrderingKeyTooLong(k.len()));
        }
        Ok(Message {
            id,
            exchange: self.exchange.clone(),
            routing_key: self.routing_key.clone(),
            message_type: self.message_type.clone(),
            headers: self.headers.clone(),
            payload: self.body.clone(),
            content_type: self
                .content_type
                .clone()
                .unwrap_or_else(|| DEFAULT_CONTENT_TYPE.to_owned()),
            source: self.source.clone(),
            correlation_id: self.correlation_id.clone(),
            created_at: self.timestamp.unwrap_or(received_at),
            // Delivered: whatever delay it had is over. The key stays: a consumer
            // that keeps order by key handles its deliveries one after another.
            not_before: None,
            ordering_key: self.ordering_key.clone(),
        })
    }
}

/// Acknowledges one delivery.
#[cfg_attr(feature = "mocks", mockall::automock)]
#[async_trait]
pub trait Acker: Send + Sync {
    /// The delivery is done with; the broker forgets it.
    ///
    /// # Errors
    /// [`PortError::Transient`] when the channel is gone (the broker will redeliver;
    /// the inbox absorbs the duplicate).
    async fn ack(&self) -> Result<(), PortError>;

    /// The delivery was not handled; `requeue` asks the broker to deliver it again.
    ///
    /// # Errors
    /// [`PortError::Transient`] when the channel is gone.
    async fn nack(&self, requeue: bool) -> Result<(), PortError>;
}

/// One delivery from a queue.
pub struct Delivery {
    /// What arrived.
    pub envelope: Envelope,
    /// Whether the broker delivered it before.
    pub redelivered: bool,
    /// Acknowledges it.
    pub acker: Box<dyn Acker>,
}

impl fmt::Debug for Delivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Delivery")
            .field("envelope", &self.envelope)
            .field("redelivered", &self.redelivered)
            .finish_non_exhaustive()
    }
}

/// Deliveries of one subscription.
#[async_trait]
pub trait DeliveryStream: Send {
    /// The next delivery; `None` when the subscription ended.
    ///
    /// # Errors
    /// [`PortError::Transient`] when the connection was lost (adapters that
    /// reconnect by themselves do so before returning further deliveries).
    async fn next(&mut self) -> Option<Result<Delivery, PortError>>;

    /// Asks the broker to send no more deliveries. Those it sent before still come
    /// out of [`next`](Self::next), to be handled and settled as usual; then `next`
    /// answers `None`. Nothing is handed back to the queue by the cancel itself.
    ///
    /// # Errors
    /// [`PortError::Transient`] when the connection was lost (its unsettled
    /// deliveries go back to the queue, as with any lost connection).
    async fn cancel(&mut self) -> Result<(), PortError>;
}

/// Subscribes to queues with manual acknowledgement.
#[cfg_attr(feature = "mocks", mockall::automock)]
#[async_trait]
pub trait Subscriber: Send + Sync {
    /// Starts consuming `queue`, with at most `prefetch` unacknowledged deliveries.
    ///
    /// # Errors
    /// [`PortError::NotFound`] when the queue does not exist;
    /// [`PortError::Transient`] when the broker cannot be reached.
    async fn subscribe(
        &self,
        queue: &str,
        prefetch: u16,
    ) -> Result<Box<dyn DeliveryStream>, PortError>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_core::NewMessage;

    #[test]
    fn a_message_survives_its_envelope() {
        let at = Timestamp::from_unix_timestamp(1_700_000_000).expect("valid");
        let m = NewMessage::new("orders", "order.created", b"{}".to_vec())
            .with_type("OrderCreated")
            .with_header("traceparent", "00-abc-def-01")
            .with_ordering_key("customer-7")
            .into_message(MessageId::v7(at, [7; 10]), at);
        assert_eq!(Envelope::of(&m).to_message(at).expect("decodes"), m);
    }

    #[test]
    fn a_replay_is_read_as_the_message_it_stands_in_for() {
        let at = Timestamp::now_utc();
        let original =
            NewMessage::new("e", "k", b"{}".to_vec()).into_message(MessageId::v7(at, [1; 10]), at);
        assert_eq!(replay_root(&original), original.id);
        let mut replay = original.clone();
        replay.id = MessageId::v7(at, [2; 10]);
        replay.headers.insert(
            REPLAY_OF_HEADER.to_owned(),
            replay_root(&original).to_string(),
        );
        let read = Envelope::of(&replay).to_message(at).expect("decodes");
        assert_eq!(read.id, original.id);
        // A replay of the replay names the same original.
        assert_eq!(replay_root(&replay), original.id);
        // A value that is no message id is ignored.
        replay
            .headers
            .insert(REPLAY_OF_HEADER.to_owned(), "not-an-id".to_owned());
        assert_eq!(
            Envelope::of(&replay).to_message(at).expect("decodes").id,
            replay.id
        );
        assert_eq!(replay_root(&replay), replay.id);
    }

    #[test]
    fn envelopes_without_a_usable_id_are_refused() {
        let at = Timestamp::from_unix_timestamp(0).expect("valid");
        let m = NewMessage::new("e", "k", vec![]).into_message(MessageId::v7(at, [1; 10]), at);
        let mut env = Envelope::of(&m);
        env.message_id = None;
        assert_eq!(env.to_message(at), Err(DecodeError::MissingMessageId));
        env.message_id = Some("42".into());
        assert_eq!(
            env.to_message(at),
            Err(DecodeError::InvalidMessageId("42".into()))
        );
    }

    /// A foreign delivery's ordering key is untrusted: one longer than a producer
    /// may set is refused (kept as a dead letter), not handed to an inbox that
    /// cannot index it (which would return it to the broker for ever).
    #[test]
    fn an_overlong_ordering_key_is_refused() {
        let at = Timestamp::from_unix_timestamp(0).expect("valid");
        let m = NewMessage::new("e", "k", vec![]).into_message(MessageId::v7(at, [1; 10]), at);
        let mut env = Envelope::of(&m);
        env.ordering_key = Some("k".repeat(255));
        assert!(env.to_message(at).is_ok());
        env.ordering_key = Some("k".repeat(256));
        assert_eq!(
            env.to_message(at),
            Err(DecodeError::OrderingKeyTooLong(256))
        );
    }
}
