//! Wiring a service on `outbox`: one builder that starts the embedded relay (with
//! its wake-up and publish-retry sweep), any number of consumers (each with its
//! consume-retry sweep, under keys derived from its name) and stops them all
//! gracefully, on a future or on the process's signals.
//!
//! - [`Service::postgres`] (features `postgres` and `rabbitmq`): the outbox and
//!   inbox in PostgreSQL, RabbitMQ as the broker, transactional handlers
//!   (exactly once in effect).
//! - [`Service::memory`] (feature `memory`): every port in memory, for demos and
//!   tests, with backend-neutral handlers.
//!
//! `outbox run` derives its relay's sweep keys with [`keys`] too, so an embedded
//! relay and the standalone one on the same schema share one sweep.

mod error;
pub mod keys;
#[cfg(feature = "memory")]
mod memory;
#[cfg(all(feature = "postgres", feature = "rabbitmq"))]
mod postgres;
mod running;

pub use error::ServiceError;
#[cfg(feature = "memory")]
pub use memory::{Memory, MemoryServiceBuilder};
#[cfg(all(feature = "postgres", feature = "rabbitmq"))]
pub use postgres::{PgServiceBuilder, PgSource, Postgres};
pub use running::{Service, shutdown_signal};
