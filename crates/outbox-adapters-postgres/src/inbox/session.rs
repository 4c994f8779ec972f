//! How a handler runs inside an inbox transaction, and how that run ended: the
//! mechanism under [`super::PgInboxStore::consume_in_transaction`], the retries and
//! the batches ([`super::batch`]).
//!
//! A handler runs under a savepoint ([`HANDLER_SAVEPOINT`]) after a `RESET ALL`
//! ([`SESSION_RESET`]), and another `RESET ALL` follows its `Ok` before anything
//! commits: no setting of a handler (a session-wide `synchronous_commit = off`)
//! reaches a COMMIT or the next delivery on the pooled connection. Releasing the
//! savepoint is how a statement the handler ignored is caught (PostgreSQL answers
//! the COMMIT of an aborted transaction with a ROLLBACK and no error); a savepoint
//! that is gone is how a handler that ended the transaction itself (a `COMMIT` or
//! `ROLLBACK` of its own) is caught: that run is never retried, since what it
//! wrote outside the transaction would be written again.

use std::future::Future;
use std::pin::Pin;

use outbox_core::HandlerFailure;
use outbox_ports::PortError;
use sqlx::{PgConnection, Postgres, Transaction};

use crate::error::{port, refused_by_database};

/// A handler that writes through the inbox's transaction; its failure carries
/// what it says about retrying (see [`HandlerFailure`]).
pub type TxHandler<'h> = Box<
    dyn for<'c> FnOnce(
            &'c mut PgConnection,
        )
            -> Pin<Box<dyn Future<Output = Result<(), HandlerFailure>> + Send + 'c>>
        + Send
        + 'h,
>;

/// The savepoint a handler runs under. Releasing it fails when the transaction was
/// aborted, which is how a failed statement the handler ignored is caught: PostgreSQL
/// answers the COMMIT of an aborted transaction with a ROLLBACK and no error.
pub(super) const HANDLER_SAVEPOINT: &str = "outbox_handler";

/// What a handler may have changed in its session, set back, in the inbox
/// transaction: before a handler runs (a connection is clean whatever used it
/// before), and after it returned `Ok`, before the COMMIT. A handler's `SET
/// synchronous_commit = off` (session-wide, not `SET LOCAL`) would otherwise make
/// this COMMIT, and every later one on the pooled connection, return before its WAL
/// is flushed: a delivery would be acknowledged to the broker on a commit a
/// PostgreSQL crash can still lose. `RESET ALL` sets every parameter back to the
/// session's default (the server's, database's, role's, or the connection URL's
/// `options`), so each COMMIT is made with the durability configured for the
/// connection. It rides in the round trip of the savepoint command it follows or
/// precedes (simple query protocol), so it costs no round trip. What it does not
/// set back: `SET ROLE` and `SET SESSION AUTHORIZATION` (PostgreSQL leaves them out
/// of `RESET ALL`), prepared statements, temporary tables, advisory locks. What it
/// does set back: settings a pool's `after_connect` hook `SET` on the connection;
/// give those in the URL (`options=-c search_path=app`), or with `ALTER ROLE` /
/// `ALTER DATABASE ... SET`, which are the session's defaults and kept.
pub(super) const SESSION_RESET: &str = "RESET ALL";

/// How one run of a handler in the inbox transaction ended.
#[derive(Debug)]
pub(super) enum Attempt {
    /// The handler returned `Ok` and the transaction committed.
    Committed,
    /// A failed attempt, rolled back: the handler's error, a transaction the handler
    /// left aborted, or a COMMIT the database refused (a deferred constraint, a
    /// serialization failure). Safe to retry.
    Failed(HandlerFailure),
    /// The handler ended the inbox transaction itself (a raw `COMMIT` or `ROLLBACK`,
    /// or released or rolled back past its savepoint): what it wrote after that was
    /// autocommitted, or its writes and the inbox row were committed before it
    /// returned. Never to retry: a retry would repeat those writes.
    Ended(String),
}

/// SQLSTATEs of `RELEASE` / `ROLLBACK TO SAVEPOINT` when the handler's savepoint is
/// gone: no transaction in progress (the handler sent `COMMIT` or `ROLLBACK`), or no
/// such savepoint (it released it, or ended the transaction and began another).
pub(super) fn ended_by_handler(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db)
        if matches!(db.code().as_deref(), Some("25P01" | "3B001")))
}

/// The reason stored when the handler ended the inbox transaction itself.
pub(super) fn ended_reason(returned: &str, why: &str) -> String {
    format!(
        "the handler ended the inbox transaction itself (a COMMIT or ROLLBACK of its own, \
         or its savepoint released or rolled back) and {returned}; what it wrote may have \
         taken effect outside the transaction, so it is not retried: {why}"
    )
}

/// Back to the handler's savepoint, which stays in place (for the next delivery of
/// a batch). Fails with 25P01/3B001 when the handler ended the transaction
/// ([`ended_by_handler`]).
pub(super) async fn rollback_to_savepoint(conn: &mut PgConnection) -> Result<(), sqlx::Error> {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "ROLLBACK TO SAVEPOINT {HANDLER_SAVEPOINT}"
    )))
    .execute(conn)
    .await
    .map(|_| ())
}

/// Runs `handler` in `tx` and commits; see [`Attempt`]. `Err` is a database that
/// could not be reached, where the outcome of a COMMIT is unknown.
pub(super) async fn run_and_commit(
    mut tx: Transaction<'_, Postgres>,
    handler: TxHandler<'_>,
) -> Result<Attempt, PortError> {
    simple_query(
        &mut tx,
        sqlx::AssertSqlSafe(format!("{SESSION_RESET}; SAVEPOINT {HANDLER_SAVEPOINT}")),
    )
    .await
    .map_err(|e| port("savepoint", e))?;
    let failure = match handler(&mut tx).await {
        Err(error) => {
            // Back to the savepoint first: only this tells a transaction the handler
            // ended (it could have committed the inbox row with its writes) from one
            // it merely left aborted.
            let back = rollback_to_savepoint(&mut tx).await;
            match back {
                Ok(_) => Attempt::Failed(error),
                Err(e) if ended_by_handler(&e) => {
                    let why = refused_by_database(&e).unwrap_or_else(|| e.to_string());
                    Attempt::Ended(ended_reason(&format!("returned an error ({error})"), &why))
                }
                Err(e) => return Err(port("rollback to savepoint", e)),
            }
        }
        Ok(()) => {
            // The reset runs only if the release succeeded (a statement after a
            // failed one does not run), so the errors are the release's.
            let released = simple_query(
                &mut tx,
                sqlx::AssertSqlSafe(format!(
                    "RELEASE SAVEPOINT {HANDLER_SAVEPOINT}; {SESSION_RESET}"
                )),
            )
            .await;
            match released {
                Ok(_) => {
                    return match tx.commit().await {
                        Ok(()) => Ok(Attempt::Committed),
                        Err(e) => match refused_by_database(&e) {
                            Some(why) => Ok(Attempt::Failed(HandlerFailure::retryable(format!(
                                "the database refused the commit of the handler's transaction: {why}"
                            )))),
                            None => Err(port("commit", e)),
                        },
                    };
                }
                Err(e) => match refused_by_database(&e) {
                    Some(why) if ended_by_handler(&e) => {
                        Attempt::Ended(ended_reason("returned Ok", &why))
                    }
                    Some(why) => {
                        // Aborted: back to the savepoint, which is gone if the handler
                        // ended the transaction and began another, left aborted (then
                        // what it wrote between the two took effect).
                        let back = rollback_to_savepoint(&mut tx).await;
                        match back {
                            Err(back) if ended_by_handler(&back) => {
                                Attempt::Ended(ended_reason("returned Ok", &why))
                            }
                            _ => {
                                Attempt::Failed(HandlerFailure::retryable(aborted_reason(&e, &why)))
                            }
                        }
                    }
                    None => return Err(port("release savepoint", e)),
                },
            }
        }
    };
    if matches!(failure, Attempt::Ended(_)) {
        // Ended stays Ended whatever the clean-up does: an error here would be
        // taken for a store that could not be reached, and the delivery tried
        // again, repeating what the handler wrote outside the transaction.
        end_what_the_handler_left(tx).await;
        return Ok(failure);
    }
    tx.rollback().await.map_err(|e| port("rollback", e))?;
    Ok(failure)
}

/// After a handler ended the inbox transaction itself: ends whatever transaction
/// it left open (outside one, PostgreSQL answers `ROLLBACK` with a warning only),
/// then sets the session back ([`SESSION_RESET`]) outside any transaction. What
/// the handler `SET` after its own `COMMIT` was not undone by any rollback and
/// would otherwise go back into the pool with the connection, and the consumer's
/// own marks on it would be committed under the handler's `synchronous_commit`.
/// Neither statement fails on a working connection; on a broken one the pool
/// discards the connection, so a failure is logged and nothing else.
pub(super) async fn end_what_the_handler_left(mut tx: Transaction<'_, Postgres>) {
    let cleaned = async {
        simple_query(&mut tx, "ROLLBACK").await?;
        simple_query(&mut tx, SESSION_RESET).await
    }
    .await;
    if let Err(e) = cleaned {
        tracing::warn!(error = %e, "could not set the session back after a handler ended the inbox transaction");
    }
    // sqlx's own bookkeeping of the transaction: its ROLLBACK now only warns.
    if let Err(e) = tx.rollback().await {
        tracing::warn!(error = %e, "rollback after a handler ended the inbox transaction");
    }
}

/// The failure text when the handler returned `Ok` but its savepoint could not be
/// released, the transaction still being ours.
pub(super) fn aborted_reason(e: &sqlx::Error, why: &str) -> String {
    let code = match e {
        sqlx::Error::Database(db) => db.code().map(std::borrow::Cow::into_owned),
        _ => None,
    };
    if code.as_deref() == Some("25P02") {
        format!(
            "the transaction was aborted by a statement the handler ignored \
             (the handler returned Ok after a statement failed): {why}"
        )
    } else {
        format!("the handler returned Ok but its savepoint could not be released: {why}")
    }
}

/// `sql` (statements without parameters, `;`-separated) in one round trip, by the
/// simple query protocol. A dynamic `sql` comes as `sqlx::AssertSqlSafe`.
pub(super) async fn simple_query(
    conn: &mut PgConnection,
    sql: impl sqlx::SqlSafeStr + Send,
) -> Result<(), sqlx::Error> {
    sqlx::Executor::execute(conn, sql).await.map(|_| ())
}
