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
//! a plain identifier); [`migrate`] creates it and its tables. [`PgDatabase`] is one
//! handle on a pool and a schema that hands out every store, the lock and the sweep
//! state of it.

mod audit;
mod database;
mod diagnostics;
mod error;
mod inbox;
mod inbox_operator;
mod listing;
mod lock;
mod outbox;
mod outbox_operator;
mod pauses;
mod rows;
mod schema;
mod state;
mod storable;
mod throughput;
#[cfg(feature = "ui-sessions")]
mod ui_sessions;
mod vacuum;
mod wakeup;

pub use audit::PgAuditLog;
pub use database::PgDatabase;
pub use error::PgConfigError;
pub use inbox::{BatchDelivery, ConsumeOutcome, HELD_CHECK_EVERY, PgInboxStore, TxHandler};
pub use lock::PgLock;
pub use outbox::{PgOutbox, PgOutboxStore};
pub use outbox_core::config::redact_url;
pub use pauses::PgPauses;
pub use schema::{MAX_SCHEMA_LEN, PgSchema, check_current, migrate};
pub use state::PgSweepState;
pub use throughput::PgThroughputLog;
#[cfg(feature = "ui-sessions")]
pub use ui_sessions::{
    PgUiSessionStore, UI_SESSIONS_TABLE, delete_expired_ui_sessions, ui_sessions,
};
pub use wakeup::{PgWakeup, Wake};

/// The sqlx this adapter is built on (0.9): a transaction passed to the producer
/// must be of this sqlx. Use it as `outbox::postgres::sqlx` rather than a
/// dependency of your own, or depend on the same version.
pub use sqlx;
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
    connect_bounded(url, max_connections, connect_timeout, &SessionBounds::NONE).await
}

/// How long a session's statements may wait, set on every connection of a pool at
/// its start (the startup packet's `options`, as `-c name=value`), so no statement
/// of the pool, whichever connection runs it, waits without a bound. `None` leaves
/// the server's setting.
///
/// The keepalives are the server's (`tcp_keepalives_*`): they let the server notice
/// a client that vanished and end its session, releasing its locks. sqlx 0.9 sets
/// no TCP keepalive on its own sockets; on the client's side a server that answers
/// nothing is bounded by the statement timeout only while the server runs it, else
/// by the operating system's TCP retransmission timeout (and readiness goes red
/// meanwhile, see the relay's progress watchdog). On a Unix-domain socket the
/// server ignores them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SessionBounds {
    /// `statement_timeout`: a statement running longer is cancelled (SQLSTATE 57014).
    pub statement_timeout: Option<Duration>,
    /// `lock_timeout`: a statement waiting longer for a lock fails (SQLSTATE 55P03).
    pub lock_timeout: Option<Duration>,
    /// `tcp_keepalives_idle`: silence before the server's first keepalive probe.
    pub keepalive_idle: Option<Duration>,
    /// `tcp_keepalives_interval`: between unanswered probes.
    pub keepalive_interval: Option<Duration>,
    /// `tcp_keepalives_count`: unanswered probes before the server drops the session.
    pub keepalive_count: Option<u32>,
}

impl SessionBounds {
    /// No bound set: the server's settings.
    pub const NONE: Self = Self {
        statement_timeout: None,
        lock_timeout: None,
        keepalive_idle: None,
        keepalive_interval: None,
        keepalive_count: None,
    };

    /// The settings as `(GUC, value)` pairs; times in the units PostgreSQL reads
    /// without a suffix (milliseconds for the timeouts, seconds for the keepalives),
    /// rounded up so that a short bound never becomes 0, which would turn it off.
    #[must_use]
    pub fn options(&self) -> Vec<(&'static str, String)> {
        let ms = |d: Duration| d.as_millis().max(1).min(i32::MAX as u128).to_string();
        let secs = |d: Duration| {
            d.as_millis()
                .div_ceil(1000)
                .max(1)
                .min(i32::MAX as u128)
                .to_string()
        };
        let mut o = Vec::new();
        if let Some(d) = self.statement_timeout {
            o.push(("statement_timeout", ms(d)));
        }
        if let Some(d) = self.lock_timeout {
            o.push(("lock_timeout", ms(d)));
        }
        if let Some(d) = self.keepalive_idle {
            o.push(("tcp_keepalives_idle", secs(d)));
        }
        if let Some(d) = self.keepalive_interval {
            o.push(("tcp_keepalives_interval", secs(d)));
        }
        if let Some(n) = self.keepalive_count {
            o.push(("tcp_keepalives_count", n.min(i32::MAX as u32).to_string()));
        }
        o
    }
}

/// As [`connect`], every session started with `bounds` (see [`SessionBounds`]).
///
/// # Errors
/// As [`connect`].
pub async fn connect_bounded(
    url: &str,
    max_connections: u32,
    connect_timeout: Duration,
    bounds: &SessionBounds,
) -> Result<PgPool, PgConfigError> {
    let options = PgConnectOptions::from_str(url)
        .map_err(|e| PgConfigError::InvalidUrl {
            reason: error::redact(&e.to_string(), url),
        })?
        .options(bounds.options());
    let unreachable = |reason: String| PgConfigError::Unreachable {
        url: error::redact_url(url),
        reason: error::redact(&reason, url),
    };
    // One connection first, on its own: the pool's first connect reports only
    // that it timed out waiting (whatever went wrong, after the whole timeout),
    // where a person needs "connection refused" or "password authentication
    // failed" at once.
    let address = format!("{}:{}", options.get_host(), options.get_port());
    match tokio::time::timeout(connect_timeout, sqlx::ConnectOptions::connect(&options)).await {
        Ok(Ok(first)) => {
            let _ = sqlx::Connection::close(first).await;
        }
        Ok(Err(e)) => return Err(unreachable(error::connect_failure(&e, &address))),
        Err(_) => {
            return Err(unreachable(format!(
                "timed out connecting to {address} after {connect_timeout:?} (nothing answered: a firewall, a wrong host, or a server too busy to accept)"
            )));
        }
    }
    PgPoolOptions::new()
        .max_connections(max_connections.max(1))
        .acquire_timeout(connect_timeout)
        .connect_with(options)
        .await
        .map_err(|e| unreachable(e.to_string()))
}
