//! A transactional outbox, an idempotent inbox and a retry relay for RabbitMQ.
//!
//! This is the crate to depend on. It re-exports the domain ([`outbox_core`]'s
//! types at the root), the ports ([`ports`]), the relay ([`relay`]) and the
//! consumers ([`consumer`]), and, by feature, the adapters:
//!
//! | feature | module | brings |
//! |---|---|---|
//! | `postgres` (default) | [`postgres`] | outbox and inbox stores, lock, sweep state, migrations; `PgConsumerWorker`, `PgHandler` (exactly once in effect), `PgWakeupSource` |
//! | `rabbitmq` (default) | [`rabbitmq`] | publisher with confirms, subscriber, topology |
//! | `redis` | [`redis`] | lock and sweep state |
//! | `memory` | [`memory`] | every port in memory, with fault injection |
//! | `admin` | [`admin`] | the admin API and dashboard as an axum `Router` |
//! | `otel` | | `send` and `process` spans continuing the trace stored at enqueue |
//! | `derive` (default) | | `#[derive(Event)]` for typed messages |
//!
//! With `default-features = false` it pulls no database, broker or cache driver.
//! `use outbox::prelude::*;` brings the names an application uses and every port
//! trait (anonymously, so their methods can be called).
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

pub use outbox_core::*;

/// `#[derive(Event)]`: implements [`Event`] from
/// `#[event(type = "..", exchange = "..", version = N, routing_key = "..")]`
/// (`version` and `routing_key` optional).
#[cfg(feature = "derive")]
pub use outbox_macros::Event;

/// The ports: the traits every adapter implements.
pub use outbox_ports as ports;

/// The relay: dispatcher, publish retries, retention, `RelayBuilder`.
pub use outbox_relay as relay;

/// The consumers: handlers, the inbox worker, consume retries, retention.
pub use outbox_consumer as consumer;

/// What the relay and the consumers run on: sweeper, leases, stall watchdog.
pub use outbox_runtime as runtime;

/// The PostgreSQL adapter.
#[cfg(feature = "postgres")]
pub use outbox_adapters_postgres as postgres;

/// The RabbitMQ adapter.
#[cfg(feature = "rabbitmq")]
pub use outbox_adapters_rabbitmq as rabbitmq;

/// The Redis adapter.
#[cfg(feature = "redis")]
pub use outbox_adapters_redis as redis;

/// The in-memory adapters, with fault injection.
#[cfg(feature = "memory")]
pub use outbox_adapters_memory as memory;

/// The admin API and dashboard.
#[cfg(feature = "admin")]
pub use outbox_admin as admin;

/// For implementing [`consumer::Handler`] and the ports without a dependency of
/// your own.
pub use async_trait::async_trait;

pub use outbox_consumer::{
    ConsumeRetryTask, ConsumerBuilder, ConsumerConfig, ConsumerHandles, ConsumerRetention,
    ConsumerWorker, Context, EventHandler, Handler, HandlerError, HandlerRegistry, handler_fn,
};
#[cfg(feature = "postgres")]
pub use outbox_consumer::{
    PgConsumeRetryTask, PgConsumerWorker, PgEventHandler, PgHandler, PgHandlerRegistry,
};
#[cfg(feature = "postgres")]
pub use outbox_relay::PgWakeupSource;
pub use outbox_relay::{
    Dispatcher, DispatcherConfig, PublishRetryTask, RelayBuilder, RelayHandles, RetentionConfig,
};
pub use outbox_runtime::{
    CancellationToken, EnqueueEvents, LeaseFactory, RetrySweeper, new_message_id,
};

/// The names an application uses, and every port trait anonymously.
pub mod prelude {
    pub use outbox_ports::prelude::*;
    pub use outbox_ports::{Clock, InboxStore, OutboxStore, PortError, Publisher, SystemClock};

    pub use crate::{
        CancellationToken, ConsumerBuilder, ConsumerConfig, ConsumerWorker, Context, Dispatcher,
        DispatcherConfig, EnqueueEvents, Event, EventHandler, Handler, HandlerError,
        HandlerRegistry, InboxStatus, IntoNewMessage, Message, MessageId, NewMessage, OutboxStatus,
        PublishRetryTask, RelayBuilder, RetryPolicy, RetrySweeper, SweepConfig, async_trait,
        handler_fn, new_message_id,
    };
    #[cfg(feature = "postgres")]
    pub use crate::{
        PgConsumeRetryTask, PgConsumerWorker, PgEventHandler, PgHandler, PgHandlerRegistry,
        PgWakeupSource,
    };
    #[cfg(feature = "postgres")]
    pub use outbox_adapters_postgres::{PgDatabase, PgOutbox, PgOutboxStore, PgPool, PgSchema};
}
