//! The relay: it publishes what producers committed to the outbox.
//!
//! - [`Dispatcher`]: the fast path. Claims pending messages in batches under a
//!   lease, publishes them with confirms, marks each outcome.
//! - [`PublishRetryTask`]: failed publishes, retried by the cluster-wide
//!   [`RetrySweeper`].
//! - [`SentRetentionTask`]: deletes old sent messages.
//! - [`RelayBuilder`]: all of the above from the adapters, supervised, with the
//!   stall watchdog behind `/readyz`.
//!
//! Every task stops cleanly when its [`CancellationToken`] is cancelled: it
//! finishes the batch in hand and returns.
//!
//! # Features
//!
//! None by default: the relay takes any [`outbox_ports::OutboxStore`] and
//! [`outbox_ports::Publisher`].
//! - `postgres`: [`PgWakeupSource`] (commits wake an idle dispatcher).
//! - `otel`: `send <exchange>` spans continuing the trace stored at enqueue
//!   ([`otel`]). Without it no opentelemetry crate is built.

pub mod dispatcher;
mod failure_log;
pub mod layer;
#[cfg(feature = "otel")]
pub mod otel;
#[cfg(feature = "postgres")]
pub mod pg_wakeup;
pub mod sent_retention;
pub mod service;

pub use dispatcher::{
    Dispatcher, DispatcherConfig, PublishCounts, PublishRetryTask, RelayCounters,
};
pub use layer::PublishLayer;

/// The publish layer a relay runs unless told otherwise: `send` spans
/// ([`otel::SendSpans`]) with the `otel` feature, none without. (Here, not in
/// `layer`, so that `layer` and `otel` do not import each other.)
#[must_use]
pub fn default_publish_layer() -> Option<std::sync::Arc<dyn PublishLayer>> {
    #[cfg(feature = "otel")]
    let layer: Option<std::sync::Arc<dyn PublishLayer>> =
        Some(std::sync::Arc::new(otel::SendSpans));
    #[cfg(not(feature = "otel"))]
    let layer = None;
    layer
}
pub use outbox_runtime::{
    CancellationToken, LeaseFactory, NamedTally, RetrySweeper, ServiceHealth, SweepTask,
    TallyRecorder, ThroughputRecorder,
};
#[cfg(feature = "postgres")]
pub use pg_wakeup::PgWakeupSource;
pub use sent_retention::{RetentionConfig, SentRetentionTask, VacuumMode};
pub use service::{RelayBuilder, RelayHandles};
