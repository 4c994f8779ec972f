//! A transactional outbox, an idempotent inbox and a retry relay for RabbitMQ.
//!
//! This is the crate to depend on. Its root names what an application uses: the
//! [`Service`] builder (the embedded relay, consumers, shutdown), typed messages
//! ([`Event`]), handlers and their [`Context`]. Further modules hold what fewer
//! need: [`service`] (the builders), [`relay`] and [`consumer`] (wiring by hand),
//! [`ports`] (the traits adapters implement) and, by feature, the adapters:
//!
//! | feature | module | brings |
//! |---|---|---|
//! | `postgres` (default) | `outbox::postgres` | outbox and inbox stores, lock, sweep state, migrations, sqlx; transactional handlers (`PgHandler`, `PgEventHandler`: exactly once in effect); with `rabbitmq`, `Service::postgres` |
//! | `rabbitmq` (default) | `outbox::rabbitmq` | publisher with confirms, subscriber, topology, lapin |
//! | `redis` | `outbox::redis` | lock and sweep state |
//! | `memory` | `outbox::memory` | every port in memory, with fault injection; `Service::memory` |
//! | `admin` | `outbox::admin` | the admin API and dashboard as an axum `Router` |
//! | `telemetry` | `outbox::telemetry` | the log as `outbox run` writes it, the Prometheus recorder, a consumer's `/healthz`, `/readyz`, `/metrics` |
//! | `otel` | | `send` and `process` spans continuing the trace stored at enqueue (with `telemetry`, the OTLP exporter) |
//! | `derive` (default) | | `#[derive(Event)]` for typed messages |
//!
//! With `default-features = false` it pulls no database, broker or cache driver.
//! `use outbox::prelude::*;` brings the names an application uses and every port
//! trait (anonymously, so their methods can be called).
//!
//! Versions: a transaction given to the producer is one of sqlx 0.9, re-exported
//! as [`postgres::sqlx`]; the broker client is lapin 4 ([`rabbitmq::lapin`]).
//!
//! ```
//! use outbox::prelude::*;
//!
//! let message = NewMessage::new("orders", "order.created", br#"{"order":42}"#.to_vec())
//!     .with_type("order.created");
//! assert!(message.validate(1 << 20).is_ok());
//! let _config = DispatcherConfig::default();
//! ```
//!
//! Typed messages: a serde type implementing [`Event`] becomes a [`NewMessage`]
//! with [`event::to_new_message`], and a received [`Message`] becomes the value
//! again with [`event::decode`]. A plain impl:
//!
//! ```
//! use outbox::prelude::*;
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Debug, PartialEq, Serialize, Deserialize)]
//! struct OrderCreated {
//!     order_id: u64,
//!     total_cents: u64,
//! }
//!
//! impl Event for OrderCreated {
//!     const TYPE: &'static str = "order.created";
//!     const EXCHANGE: &'static str = "shop.orders";
//! }
//!
//! let order = OrderCreated { order_id: 42, total_cents: 1999 };
//! let message = outbox::event::to_new_message(&order)?;
//! assert_eq!(message.routing_key, "order.created");
//! assert_eq!(message.message_type.as_deref(), Some("order.created"));
//!
//! // What a consumer receives decodes back into the value.
//! let now = outbox::Timestamp::now_utc();
//! let received = message.into_message(new_message_id(now), now);
//! assert_eq!(outbox::event::decode::<OrderCreated>(&received)?, order);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! With the feature `derive` (on by default) the attribute says the same:
//! `#[derive(Serialize, Deserialize, outbox::Event)]` and
//! `#[event(type = "order.created", exchange = "shop.orders")]`, optionally with
//! `version = 2` and a fixed `routing_key = "..."`.
//!
//! Producing: in your own sqlx transaction, `PgOutbox::enqueue(&mut tx, &event)`
//! and `PgOutbox::enqueue_all(&mut tx, &events)` (one statement) take events as
//! they take a [`NewMessage`] ([`IntoNewMessage`]); without one, every
//! [`ports::OutboxStore`] has [`EnqueueEvents`] (in the prelude). An event that
//! cannot become a message is refused before anything is written
//! ([`ports::PortError::InvalidEvent`]). See `docs/typed-messages.md`.
//!
//! ```
//! use outbox::prelude::*;
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! struct OrderCreated {
//!     order_id: u64,
//! }
//!
//! impl Event for OrderCreated {
//!     const TYPE: &'static str = "order.created";
//!     const EXCHANGE: &'static str = "shop.orders";
//! }
//!
//! async fn place(store: &dyn OutboxStore, order: &OrderCreated) -> Result<MessageId, PortError> {
//!     store.enqueue_event(order).await
//! }
//!
//! /// A message sent while handling another keeps its correlation id.
//! async fn react(store: &dyn OutboxStore, incoming: &Message) -> Result<MessageId, PortError> {
//!     store.enqueue_event(OrderCreated { order_id: 7 }.caused_by(incoming)).await
//! }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

// The root lists each name once; the prelude repeats the common ones.

pub use outbox_app::{Service, ServiceError};

/// `#[derive(Event)]`: implements [`Event`] from
/// `#[event(type = "..", exchange = "..", version = N, routing_key = "..")]`
/// (`version` and `routing_key` optional).
#[cfg(feature = "derive")]
#[cfg_attr(docsrs, doc(cfg(feature = "derive")))]
pub use outbox_macros::Event;

pub use outbox_core::{
    ConfigError, DecodeError, Due, Event, EventError, Headers, InboxStatus, IntoNewMessage,
    Message, MessageId, NewMessage, OutboxStatus, RetryPolicy, SweepConfig, Timestamp,
};
pub use outbox_runtime::{CancellationToken, EnqueueEvents, new_message_id};

pub use outbox_consumer::{
    ConsumerConfig, Context, EventHandler, Handler, HandlerError, HandlerRegistry, HandlerResult,
    handler_fn,
};
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use outbox_consumer::{PgEventFn, PgEventHandler, PgHandler, PgHandlerRegistry};
pub use outbox_relay::{DispatcherConfig, RetentionConfig};

/// For implementing [`Handler`] and the ports without a dependency of your own.
pub use async_trait::async_trait;

/// Typed messages: encoding an [`Event`] and decoding a received [`Message`].
pub mod event {
    pub use outbox_core::event::{
        DEFAULT_VERSION, VERSION_HEADER, decode, to_new_message, version_of,
    };
}

/// Durations as `outbox.toml` writes them (`200ms`, `5s`, `1h`).
pub mod duration {
    pub use outbox_core::duration::{format, parse};
}

/// The builders behind [`Service`]: their settings and what a running service
/// offers.
pub mod service {
    pub use outbox_app::keys;
    #[cfg(feature = "memory")]
    #[cfg_attr(docsrs, doc(cfg(feature = "memory")))]
    pub use outbox_app::{Memory, MemoryServiceBuilder};
    #[cfg(all(feature = "postgres", feature = "rabbitmq"))]
    #[cfg_attr(docsrs, doc(cfg(all(feature = "postgres", feature = "rabbitmq"))))]
    pub use outbox_app::{PgServiceBuilder, PgSource, Postgres};
}

/// The relay by hand, for wiring it without [`Service`].
pub mod relay {
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub use outbox_relay::PgWakeupSource;
    pub use outbox_relay::{
        Dispatcher, PublishRetryTask, RelayBuilder, RelayCounters, RelayHandles, VacuumMode,
    };
}

/// Consumers by hand, for wiring them without [`Service`].
pub mod consumer {
    pub use outbox_consumer::typed::CAUSATION_HEADER;
    pub use outbox_consumer::{
        ConsumerBuilder, ConsumerCounters, ConsumerHandles, ConsumerRetention, ConsumerWorker,
    };
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub use outbox_consumer::{PgConsumerWorker, PgTxInbox};
}

/// The ports: the traits every adapter implements.
pub use outbox_ports as ports;

/// The PostgreSQL adapter (`sqlx` 0.9 as [`postgres::sqlx`]).
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use outbox_adapters_postgres as postgres;

/// The RabbitMQ adapter (`lapin` 4 as [`rabbitmq::lapin`]).
#[cfg(feature = "rabbitmq")]
#[cfg_attr(docsrs, doc(cfg(feature = "rabbitmq")))]
pub use outbox_adapters_rabbitmq as rabbitmq;

/// The Redis adapter.
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use outbox_adapters_redis as redis;

/// The in-memory adapters, with fault injection.
#[cfg(feature = "memory")]
#[cfg_attr(docsrs, doc(cfg(feature = "memory")))]
pub use outbox_adapters_memory as memory;

/// The process's log, the span exporter (with `otel`), the Prometheus recorder and
/// a consumer's health and metrics endpoints.
#[cfg(feature = "telemetry")]
#[cfg_attr(docsrs, doc(cfg(feature = "telemetry")))]
pub use outbox_telemetry as telemetry;

/// The admin API and dashboard.
#[cfg(feature = "admin")]
#[cfg_attr(docsrs, doc(cfg(feature = "admin")))]
pub use outbox_admin as admin;

/// The names a service uses, and every port trait anonymously (so their methods
/// can be called): `use outbox::prelude::*;`.
pub mod prelude {
    #[doc(no_inline)]
    pub use outbox_ports::prelude::*;
    #[doc(no_inline)]
    pub use outbox_ports::{InboxStore, OutboxStore, PortError};

    #[doc(no_inline)]
    pub use crate::{
        CancellationToken, ConsumerConfig, Context, DispatcherConfig, EnqueueEvents, Event,
        EventHandler, Handler, HandlerError, HandlerRegistry, HandlerResult, InboxStatus,
        IntoNewMessage, Message, MessageId, NewMessage, OutboxStatus, RetryPolicy, Service,
        ServiceError, async_trait, handler_fn, new_message_id,
    };
    #[cfg(feature = "postgres")]
    #[doc(no_inline)]
    pub use crate::{PgEventHandler, PgHandler, PgHandlerRegistry};
    #[cfg(feature = "postgres")]
    #[doc(no_inline)]
    pub use outbox_adapters_postgres::{PgConnection, PgPool, sqlx};
    #[cfg(feature = "rabbitmq")]
    #[doc(no_inline)]
    pub use outbox_adapters_rabbitmq::{ExchangeKind, Topology};
}
