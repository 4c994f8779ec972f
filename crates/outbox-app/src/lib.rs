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
//!
//! # Features
//!
//! All on by default (the `outbox` binary needs them all). The services above need
//! none: with `default-features = false` this crate brings no database, broker,
//! cache, HTTP or command-line crate, and the adapters are chosen by the caller.
//!
//! - `postgres`: [`PgConsumerWorker`], [`PgHandler`], [`PgConsumeRetryTask`] (exactly
//!   once in effect over the PostgreSQL inbox, with inbox retention) and
//!   [`PgWakeupSource`] (commits wake an idle dispatcher).
//! - `rabbitmq`, `redis`: the adapters, for the command line's configuration.
//! - `http`: `/healthz`, `/readyz` and `/metrics` ([`http`]).
//! - `admin`: the admin API ([`outbox_admin`]) and its settings ([`admin_api`]),
//!   served at `/api/v1` by [`http::serve_with_admin`]; turns on `http`.
//! - `otel`: OpenTelemetry ([`otel`]): the producer's trace context stored at
//!   enqueue, `send` spans in the relay and `process` spans in consumers continuing
//!   it, the OTLP exporter of `outbox run`. Without it no opentelemetry crate is
//!   built and nothing changes.
//! - `cli`: the `outbox` command ([`cli`], [`config`], [`wiring`], the demo); turns
//!   on every feature above.

#[cfg(feature = "admin")]
pub mod admin_api;
#[cfg(feature = "cli")]
pub mod admin_cli;
#[cfg(feature = "cli")]
mod admin_output;
#[cfg(feature = "cli")]
pub mod cli;
#[cfg(feature = "cli")]
pub mod config;
pub mod consumer;
pub mod consumer_retention;
#[cfg(feature = "cli")]
pub mod demo;
#[cfg(feature = "cli")]
pub mod demo_serve;
#[cfg(feature = "http")]
pub mod http;
pub mod lease;
#[cfg(feature = "cli")]
pub mod logging;
#[cfg(feature = "otel")]
pub mod otel;
#[cfg(feature = "postgres")]
mod pg_batch;
#[cfg(feature = "postgres")]
pub mod pg_consumer;
#[cfg(feature = "postgres")]
pub mod pg_wakeup;
pub mod relay;
pub mod sent_retention;
pub mod service;
pub mod stall;
pub mod supervision;
pub mod sweeper;
pub mod throughput;
#[cfg(feature = "cli")]
pub mod topology_config;
#[cfg(feature = "cli")]
pub mod wiring;

pub use consumer::{
    AttemptContext, ConsumeRetryTask, ConsumerConfig, ConsumerCounters, ConsumerWorker, Failure,
    Handled, Handler, HandlerError, HandlerRegistry, Handlers, InboxPath, InboxRetryTask,
    InboxWorker, NeutralInbox, Unrecorded, handler_fn,
};
pub use consumer_retention::ConsumerRetention;
pub use lease::LeaseFactory;
#[cfg(feature = "postgres")]
pub use pg_consumer::{
    PgConsumeRetryTask, PgConsumerWorker, PgHandler, PgHandlerRegistry, PgTxInbox,
};
#[cfg(feature = "postgres")]
pub use pg_wakeup::PgWakeupSource;
pub use relay::{Dispatcher, DispatcherConfig, PublishCounts, PublishRetryTask, RelayCounters};
pub use sent_retention::{RetentionConfig, SentRetentionTask, VacuumMode};
pub use service::{RelayBuilder, RelayHandles};
pub use stall::DEFAULT_STALL_AFTER;
pub use supervision::ServiceHealth;
pub use sweeper::{RetrySweeper, SweepTask};
pub use throughput::ThroughputRecorder;
pub use tokio_util::sync::CancellationToken;

/// A source of uniform random numbers in `[0, 1)` for retry jitter. A plain function
/// pointer, so tests can pin it.
pub type Random = fn() -> f64;

/// The default jitter source.
#[must_use]
pub fn default_random() -> f64 {
    fastrand::f64()
}

/// Sleeps for `d`, or less if `cancel` fires first. Returns `false` when cancelled.
pub async fn sleep_or_cancel(d: std::time::Duration, cancel: &CancellationToken) -> bool {
    tokio::select! {
        () = cancel.cancelled() => false,
        () = tokio::time::sleep(d) => true,
    }
}
