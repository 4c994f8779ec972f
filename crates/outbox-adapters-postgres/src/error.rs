//! Errors: configuration errors of this crate, and sqlx errors mapped to port errors.

use outbox_ports::PortError;

/// A configuration value this adapter cannot use.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PgConfigError {
    /// The schema name is not a plain identifier.
    #[error("invalid schema name {name:?}: {reason}")]
    InvalidSchema {
        /// The name given.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The database URL does not parse.
    #[error("invalid PostgreSQL URL: {reason}")]
    InvalidUrl {
        /// What is wrong with it.
        reason: String,
    },
    /// No connection could be made.
    #[error("cannot connect to PostgreSQL at {url}: {reason}")]
    Unreachable {
        /// The URL, password removed.
        url: String,
        /// Why.
        reason: String,
    },
    /// Migrations failed.
    #[error("migrating schema {schema}: {reason}")]
    Migration {
        /// The schema.
        schema: String,
        /// Why.
        reason: String,
    },
    /// The schema lacks migrations this build needs (or has no tables at all).
    #[error(
        "schema {schema} is {found}, this outbox needs migration {needed}: run `outbox migrate` \
         (or set postgres.migrate_on_start = true) before starting it"
    )]
    SchemaBehind {
        /// The schema.
        schema: String,
        /// What it has: `at migration N`, or `without the outbox's tables`.
        found: String,
        /// The newest migration this build embeds.
        needed: i64,
    },
}

pub(crate) use outbox_core::config::{redact_secret_in as redact, redact_url};

/// Maps a sqlx error to a port error: connection trouble, timeouts, serialization
/// failures and deadlocks are retryable; everything else is not. A statement
/// cancelled by `statement_timeout` (57014) or refused a lock by `lock_timeout`
/// (55P03) is retryable too: it waited on something else (another session's lock,
/// a stalled server), and the same statement succeeds once that is gone.
pub(crate) fn port(operation: &'static str, e: sqlx::Error) -> PortError {
    let retryable = match &e {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Protocol(_)
        | sqlx::Error::Tls(_) => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|c| {
            c.starts_with("08")
                || c.starts_with("53")
                || c == "40001"
                || c == "40P01"
                || c == "57P01"
                || c == "57P02"
                || c == "57P03"
                || c == "55P03"
                || c == "57014"
        }),
        _ => false,
    };
    let message = e.to_string();
    if retryable {
        PortError::Transient {
            operation,
            message,
            source: Some(Box::new(e)),
        }
    } else {
        PortError::Fatal {
            operation,
            message,
            source: Some(Box::new(e)),
        }
    }
}

/// Why a handler's transaction failed, when the database refused one of its
/// statements (a constraint checked at COMMIT, a serialization failure, a transaction
/// left aborted): that is a failed attempt of the delivery, to store and retry with
/// backoff. `None` when the database could not be reached or is shutting down, or the
/// answer never came: then nothing is known to be refused, and the delivery goes back
/// to the broker instead. (Recording a failed attempt after a COMMIT that did happen
/// would be harmless anyway: the failure path only takes over rows still in progress,
/// never a consumed one.)
pub(crate) fn refused_by_database(e: &sqlx::Error) -> Option<String> {
    let sqlx::Error::Database(db) = e else {
        return None;
    };
    let code = db.code().unwrap_or_default().into_owned();
    // Connection exceptions, insufficient resources, the server shutting down or
    // refusing connections, system errors. A cancelled statement (57014, e.g. a
    // statement timeout) is the transaction's own failure: it would fail again.
    let unavailable = code.starts_with("08")
        || code.starts_with("53")
        || code.starts_with("57P")
        || code.starts_with("58");
    (!unavailable).then(|| format!("{} (SQLSTATE {code})", db.message()))
}

/// Why a first connection to `address` failed, in the words a person acts on: a
/// refused connection, an unknown host, a wrong password or role, a database
/// that does not exist; else the driver's text.
pub(crate) fn connect_failure(e: &sqlx::Error, address: &str) -> String {
    match e {
        sqlx::Error::Io(io) => match io.kind() {
            std::io::ErrorKind::ConnectionRefused => format!(
                "connection refused at {address} (no PostgreSQL listens there: is it running, and on that port?)"
            ),
            std::io::ErrorKind::TimedOut => format!("timed out connecting to {address}"),
            _ => format!("cannot reach {address}: {io}"),
        },
        sqlx::Error::Database(db) => {
            let message = db.message();
            match db.code().as_deref() {
                // invalid_password
                Some("28P01") => format!(
                    "password authentication failed at {address}: {message} (check the URL's user and password; retrying will not help)"
                ),
                // invalid_authorization_specification: no such role, or pg_hba.conf refuses
                Some("28000") => format!(
                    "authentication refused at {address}: {message} (the role or pg_hba.conf; retrying will not help)"
                ),
                // invalid_catalog_name
                Some("3D000") => format!(
                    "{message} at {address} (create it, or fix the URL's database; retrying will not help)"
                ),
                _ => format!("{address}: {message}"),
            }
        }
        sqlx::Error::Tls(tls) => format!("TLS with {address} failed: {tls}"),
        other => format!("{address}: {other}"),
    }
}

/// Why a replay's guarded mark of `id` (a `what`: message, delivery) changed
/// nothing, from its row as read now: `None` gone, else its status, whether it
/// is keyed and its replay. A row that could be replayed after all changed
/// between the mark and the read: try again.
pub(crate) fn replay_not_marked<S: outbox_core::Lifecycle>(
    what: &'static str,
    id: outbox_core::MessageId,
    now: Option<(S, bool, Option<outbox_core::MessageId>)>,
) -> PortError {
    let Some((status, keyed, replayed_as)) = now else {
        return PortError::NotFound {
            what,
            id: id.to_string(),
        };
    };
    outbox_ports::replay_refusal(what, id, status, keyed, replayed_as).unwrap_or_else(|| {
        PortError::transient(
            "replay",
            format!("{what} {id} changed meanwhile; try again"),
        )
    })
}
