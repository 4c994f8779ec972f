//! Cross-cutting work around each batch the relay hands to its publisher
//! (tracing today), as a layer the relay calls, so the publish path carries no
//! feature switches: with the `otel` feature the default layer
//! ([`crate::default_publish_layer`]) is `otel::SendSpans`; without it there is
//! none, and nothing is spent.

use outbox_core::{Headers, Message, MessageId};
use outbox_ports::PublishOutcome;

/// What a layer does once the publisher answered: it is told each message's
/// outcome, in the batch's order.
pub type AfterPublish = Box<dyn FnOnce(&[PublishOutcome]) + Send>;

/// One message about to be published, as a layer sees it: what it is, read only,
/// and its headers, which the layer may change (e.g. add a trace context). The
/// id and the rest cannot change: the relay marks outcomes by id.
#[derive(Debug)]
#[non_exhaustive]
pub struct Outgoing<'a> {
    /// The message's id.
    pub id: MessageId,
    /// Where it is published.
    pub exchange: &'a str,
    /// Its routing key.
    pub routing_key: &'a str,
    /// Its body's size in bytes.
    pub payload_len: usize,
    /// Attempts already spent on it.
    pub attempts: u32,
    /// Whether an operator requeued it.
    pub requeued: bool,
    /// Its headers, as they will go to the broker. Headers that break AMQP's
    /// limits make the message dead at once (the relay checks them again after
    /// the layer).
    pub headers: &'a mut Headers,
}

/// A layer around the publishing of each batch.
pub trait PublishLayer: Send + Sync {
    /// Before `batch` goes to the publisher; returns what is told the outcomes.
    fn before_publish(&self, batch: &mut [Outgoing<'_>]) -> AfterPublish;
}

/// `messages` as a layer sees them (see [`Outgoing`]).
pub(crate) fn outgoing<'a>(
    messages: &'a mut [Message],
    attempts: &[u32],
    requeued: &[bool],
) -> Vec<Outgoing<'a>> {
    messages
        .iter_mut()
        .zip(attempts)
        .zip(requeued)
        .map(|((m, attempts), requeued)| Outgoing {
            id: m.id,
            exchange: &m.exchange,
            routing_key: &m.routing_key,
            payload_len: m.payload.len(),
            attempts: *attempts,
            requeued: *requeued,
            headers: &mut m.headers,
        })
        .collect()
}
