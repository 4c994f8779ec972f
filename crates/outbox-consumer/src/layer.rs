//! Cross-cutting work around each handling of a delivery (tracing today), as a
//! layer the worker and its retry task call, so the handling path carries no
//! feature switches: with the `otel` feature the default layer is
//! [`crate::otel::ProcessSpans`]; without it there is none, and the handling
//! future is awaited as it is (no box).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use outbox_core::Message;

use crate::config::ConsumerConfig;
use crate::outcome::{Handled, Unrecorded};

/// One handling of a delivery: its handler run and its outcome recorded.
pub type Handling<'a> = Pin<Box<dyn Future<Output = Result<Handled, Unrecorded>> + Send + 'a>>;

/// What a layer is told of the handling it wraps.
#[derive(Debug, Clone, Copy)]
pub struct HandlingOf<'a> {
    /// The consumer.
    pub config: &'a ConsumerConfig,
    /// The message handled.
    pub message: &'a Message,
    /// This attempt's number, from 1.
    pub attempt: u32,
    /// A retry by the consume sweep (also how a reconsume runs), not a delivery.
    pub retry: bool,
}

/// A layer around each handling.
pub trait HandlingLayer: Send + Sync {
    /// `handling`, wrapped.
    fn layer<'a>(&self, of: HandlingOf<'_>, handling: Handling<'a>) -> Handling<'a>;
}

/// The layer a consumer runs unless told otherwise: `process` spans with the
/// `otel` feature, none without.
#[must_use]
pub fn default_handling_layer() -> Option<Arc<dyn HandlingLayer>> {
    #[cfg(feature = "otel")]
    let layer: Option<Arc<dyn HandlingLayer>> = Some(Arc::new(crate::otel::ProcessSpans));
    #[cfg(not(feature = "otel"))]
    let layer = None;
    layer
}

/// `handling` run through `layer`, if any.
pub(crate) async fn run<'a, F>(
    layer: Option<&dyn HandlingLayer>,
    of: HandlingOf<'_>,
    handling: F,
) -> Result<Handled, Unrecorded>
where
    F: Future<Output = Result<Handled, Unrecorded>> + Send + 'a,
{
    match layer {
        Some(layer) => layer.layer(of, Box::pin(handling)).await,
        None => handling.await,
    }
}

#[cfg(feature = "otel")]
impl HandlingLayer for crate::otel::ProcessSpans {
    fn layer<'a>(&self, of: HandlingOf<'_>, handling: Handling<'a>) -> Handling<'a> {
        use tracing::Instrument as _;
        let span = crate::otel::process_span(of.config, of.message, of.attempt, of.retry);
        Box::pin(async move {
            let result = handling.instrument(span.clone()).await;
            crate::otel::handled(&span, &result);
            result
        })
    }
}
