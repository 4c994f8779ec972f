//! The services of `outbox`, built on the ports, and the `outbox` binary.
//!
//! - [`Dispatcher`]: the relay's fast path. Claims pending messages in batches under
//!   a lease, publishes them with confirms, marks each outcome.
//! - [`RetrySweeper`]: the seed's retry background service over the ports, driven by
//!   `outbox-core`'s scheduling decisions. It runs a [`SweepTask`]:
//!   [`PublishRetryTask`] in the relay, [`ConsumeRetryTask`] in a consumer.
//! - [`ConsumerWorker`]: takes deliveries, deduplicates them in the inbox, runs the
//!   registered [`Handler`], stores failures for the consume sweep.
//!
//! Every service stops cleanly when its [`CancellationToken`] is cancelled: it
//! finishes the batch or deliveries in hand and returns.

pub mod cli;
pub mod config;
pub mod consumer;
pub mod consumer_retention;
pub mod demo;
pub mod http;
pub mod lease;
pub mod pg_consumer;
pub mod relay;
pub mod sent_retention;
pub mod service;
pub mod supervision;
pub mod sweeper;
pub mod wiring;

pub use consumer::{
    ConsumeRetryTask, ConsumerConfig, ConsumerCounters, ConsumerWorker, Handler, HandlerError,
    HandlerRegistry, Handlers, handler_fn,
};
pub use consumer_retention::ConsumerRetention;
pub use lease::LeaseFactory;
pub use pg_consumer::{PgConsumeRetryTask, PgConsumerWorker, PgHandler, PgHandlerRegistry};
pub use relay::{Dispatcher, DispatcherConfig, PublishCounts, PublishRetryTask, RelayCounters};
pub use sent_retention::SentRetentionTask;
pub use service::{RelayBuilder, RelayHandles};
pub use supervision::ServiceHealth;
pub use sweeper::{RetrySweeper, SweepTask};
pub use tokio_util::sync::CancellationToken;

/// A source of uniform random numbers in `[0, 1)` for retry jitter. A plain function
/// pointer, so tests can pin it.
pub type Random = fn() -> f64;

/// The default jitter source.
#[must_use]
pub fn default_random() -> f64 {
    fastrand::f64()
}

/// Locks a std mutex even if a panicking thread poisoned it (the data guarded in
/// this crate stays consistent across a panic).
pub(crate) fn lock_ignoring_poison<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Sleeps for `d`, or less if `cancel` fires first. Returns `false` when cancelled.
pub async fn sleep_or_cancel(d: std::time::Duration, cancel: &CancellationToken) -> bool {
    tokio::select! {
        () = cancel.cancelled() => false,
        () = tokio::time::sleep(d) => true,
    }
}
