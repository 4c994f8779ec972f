//! Deprecated: the services moved into crates of their own. This crate keeps the
//! old paths working for one release, as re-exports:
//!
//! - the relay (`Dispatcher`, `RelayBuilder`, retention): `outbox-relay`;
//! - the consumers (`ConsumerWorker`, `PgConsumerWorker`, handlers): `outbox-consumer`;
//! - what both run on (sweeper, leases, stall watchdog, supervision): `outbox-runtime`;
//! - the `outbox` binary, its configuration, HTTP endpoints and the demo: `outbox-cli`.
//!
//! New code depends on the `outbox` facade (features `postgres`, `rabbitmq`,
//! `redis`, `memory`, `admin`, `otel`). The features of this crate keep their
//! meaning and forward to the crates above.

#[cfg(feature = "admin")]
pub use outbox_cli::admin_api;
#[cfg(feature = "http")]
pub use outbox_cli::http;
#[cfg(feature = "otel")]
pub use outbox_cli::otel;
#[cfg(feature = "cli")]
pub use outbox_cli::{admin_cli, cli, config, demo, demo_serve, logging, topology_config, wiring};
#[cfg(feature = "postgres")]
pub use outbox_consumer::pg as pg_consumer;
pub use outbox_consumer::retention as consumer_retention;
pub use outbox_consumer::worker as consumer;
pub use outbox_relay::dispatcher as relay;
#[cfg(feature = "postgres")]
pub use outbox_relay::pg_wakeup;
pub use outbox_relay::{sent_retention, service};
pub use outbox_runtime::{lease, stall, supervision, sweeper, throughput};

pub use outbox_consumer::{
    AttemptContext, ConsumeRetryTask, ConsumerConfig, ConsumerCounters, ConsumerRetention,
    ConsumerWorker, Failure, Handled, Handler, HandlerError, HandlerRegistry, Handlers, InboxPath,
    InboxRetryTask, InboxWorker, NeutralInbox, Unrecorded, handler_fn,
};
#[cfg(feature = "postgres")]
pub use outbox_consumer::{
    PgConsumeRetryTask, PgConsumerWorker, PgHandler, PgHandlerRegistry, PgTxInbox,
};
#[cfg(feature = "postgres")]
pub use outbox_relay::PgWakeupSource;
pub use outbox_relay::{
    Dispatcher, DispatcherConfig, PublishCounts, PublishRetryTask, RelayBuilder, RelayCounters,
    RelayHandles, RetentionConfig, SentRetentionTask, VacuumMode,
};
pub use outbox_runtime::{
    CancellationToken, DEFAULT_STALL_AFTER, LeaseFactory, Random, RetrySweeper, ServiceHealth,
    SweepTask, ThroughputRecorder, default_random, sleep_or_cancel,
};
