//! The consumers of `outbox`: handlers, the inbox-deduplicating worker, per-key
//! lanes, consume retries and inbox retention.
//!
//! - [`ConsumerWorker`]: takes deliveries, deduplicates them in any inbox store,
//!   runs the registered [`Handler`], stores failures for the consume sweep (at
//!   least once in effect: handlers must be idempotent).
//! - [`PgConsumerWorker`] (feature `postgres`): the handler ([`PgHandler`]) writes
//!   through the inbox row's own transaction, so its effect is exactly once.
//! - [`ConsumeRetryTask`] / [`PgConsumeRetryTask`]: failed deliveries, retried by
//!   the cluster-wide [`RetrySweeper`].
//!
//! Every task stops cleanly when its [`CancellationToken`] is cancelled: it
//! finishes the deliveries in hand and returns.
//!
//! # Features
//!
//! None by default.
//! - `postgres`: the transactional path over the PostgreSQL inbox, with inbox
//!   retention.
//! - `otel`: `process <queue>` spans continuing the delivery's trace ([`otel`]).

pub mod builder;
pub mod config;
pub mod counters;
pub mod handler;
pub mod handler_error;
mod lanes;
pub mod layer;
#[cfg(feature = "otel")]
pub mod otel;
pub mod outcome;
pub mod pause;
#[cfg(feature = "postgres")]
pub mod pg;
#[cfg(feature = "postgres")]
mod pg_batch;
pub mod retention;
pub mod typed;
pub mod worker;

pub use builder::{ConsumerBuilder, ConsumerHandles};
pub use counters::ConsumerCounters;
pub use handler_error::HandlerResult;
pub use layer::HandlingLayer;
pub use outbox_runtime::{
    CancellationToken, LeaseFactory, RetrySweeper, SweepTask, ThroughputRecorder,
};
#[cfg(feature = "postgres")]
pub use pg::{
    PgConsumeRetryTask, PgConsumerWorker, PgEventFn, PgEventHandler, PgHandler, PgHandlerRegistry,
    PgTxInbox,
};
pub use retention::ConsumerRetention;
pub use typed::{CAUSATION_HEADER, Context, EventHandler};
pub use worker::{
    AttemptContext, ConsumeRetryTask, ConsumerConfig, ConsumerWorker, Failure, Handled, Handler,
    HandlerError, HandlerRegistry, Handlers, InboxPath, InboxRetryTask, InboxWorker, NeutralInbox,
    Unrecorded, handler_fn,
};
