//! PostgreSQL adapter of `outbox`: the outbox and inbox stores, the cluster lock and
//! the sweep state, on sqlx with runtime queries (building needs no database).
//!
//! - [`PgOutbox`] enqueues inside the caller's own transaction:
//!   `outbox.enqueue(&mut *tx, message)`; commit publishes, rollback leaves no trace.
//! - [`PgOutboxStore`] claims with `FOR UPDATE SKIP LOCKED` under a lease whose times
//!   come from the database's `now()`, marks a batch in one statement, and serves
//!   claims from partial indexes, so their cost follows the unsent rows, not the table.
//! - [`PgInboxStore`] deduplicates by (consumer, message id) and can run a handler in
//!   the inbox row's own transaction ([`PgInboxStore::consume_in_transaction`]), which
//!   makes its effect exactly once.
//! - [`PgLock`] is a lease row with a fencing token from a sequence; [`PgSweepState`]
//!   keeps the last sweep report with an expiry and refuses writes of older tokens.
//! - [`PgWakeup`] lets an idle relay be woken by commits within milliseconds without
//!   taxing producers: producers notify only while a relay has declared itself idle.
//!
//! Everything lives in one schema chosen by configuration ([`PgSchema`], validated as
//! a plain identifier); [`migrate`] creates it and its tables.

mod audit;
mod error;
mod inbox;
mod inbox_operator;
mod listing;
mod lock;
mod outbox;
mod outbox_operator;
mod rows;
mod schema;
mod state;
mod storable;
mod throughput;
mod vacuum;
mod wakeup;

pub use audit::PgAuditLog;
pub use error::PgConfigError;
pub use inbox::{BatchDelivery, ConsumeOutcome, HELD_CHECK_EVERY, PgInboxStore, TxHandler};
pub use lock::PgLock;
pub use outbox::{PgOutbox, PgOutboxStore};
pub use outbox_core::config::redact_url;
pub use schema::{MAX_SCHEMA_LEN, PgSchema, migrate};
pub use state::PgSweepState;
pub use throughput::PgThroughputLog;
pub use wakeup::{PgWakeup, Wake};

/// Re-export of the sqlx items callers need to hold transactions for enqueue.
pub use sqlx::{PgConnection, PgPool, Postgres, Transaction};

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

/// Opens a pool to `url`. TLS comes from the URL, on rustls with ring:
/// `sslmode=require` (encrypted, certificate unchecked), `verify-ca` or
/// `verify-full` (checked against `sslrootcert=<PEM file>`, else the system's
/// roots); the default, `prefer`, uses TLS unchecked when the server offers it.
///
/// # Errors
/// [`PgConfigError::InvalidUrl`] when the URL does not parse (the message never
/// repeats the URL, which may hold a password); [`PgConfigError::Unreachable`] when no
/// connection can be made within `connect_timeout`.
pub async fn connect(
    url: &str,
    max_connections: u32,
    connect_timeout: Duration,
) -> Result<PgPool, PgConfigError> {
    let options = PgConnectOptions::from_str(url).map_err(|e| PgConfigError::InvalidUrl {
        reason: error::redact(&e.to_string(), url),
    })?;
    PgPoolOptions::new()
        .max_connections(max_connections.max(1))
        .acquire_timeout(connect_timeout)
        .connect_with(options)
        .await
        .map_err(|e| PgConfigError::Unreachable {
            url: error::redact_url(url),
            reason: error::redact(&e.to_string(), url),
        })
}
