//! Cross-cutting work around each batch the relay hands to its publisher
//! (tracing today), as a layer the relay calls, so the publish path carries no
//! feature switches: with the `otel` feature the default layer is
//! [`crate::otel::SendSpans`]; without it there is none, and nothing is spent.

use std::sync::Arc;

use outbox_core::Message;
use outbox_ports::PublishOutcome;

/// What a layer does once the publisher answered: it is told each message's
/// outcome, in the batch's order.
pub type AfterPublish = Box<dyn FnOnce(&[PublishOutcome]) + Send>;

/// A layer around the publishing of each batch.
pub trait PublishLayer: Send + Sync {
    /// Before `messages` go to the publisher: may add headers (e.g. a trace
    /// context); `attempts` are the attempts already spent on each, `requeued`
    /// whether an operator requeued it. Returns what is told the outcomes.
    fn before_publish(
        &self,
        messages: &mut [Message],
        attempts: &[u32],
        requeued: &[bool],
    ) -> AfterPublish;
}

/// The layer a relay runs unless told otherwise: `send` spans with the `otel`
/// feature, none without.
#[must_use]
pub fn default_publish_layer() -> Option<Arc<dyn PublishLayer>> {
    #[cfg(feature = "otel")]
    let layer: Option<Arc<dyn PublishLayer>> = Some(Arc::new(crate::otel::SendSpans));
    #[cfg(not(feature = "otel"))]
    let layer = None;
    layer
}

#[cfg(feature = "otel")]
impl PublishLayer for crate::otel::SendSpans {
    fn before_publish(
        &self,
        messages: &mut [Message],
        attempts: &[u32],
        requeued: &[bool],
    ) -> AfterPublish {
        let spans = crate::otel::send_spans(messages, attempts, requeued);
        Box::new(move |outcomes| crate::otel::publish_outcomes(&spans, outcomes))
    }
}
