//! Several first deliveries recorded and handled in one inbox transaction, so one
//! COMMIT (and one WAL flush) covers them all, each handler under a savepoint of its
//! own so that a failure rolls back its own writes only.
//!
//! The transaction holds: every delivery's inbox row, inserted as consumed in one
//! statement (as [`PgInboxStore::consume_in_transaction`] inserts one; the rows
//! not inserted are duplicates, recorded before); then, for each new delivery in
//! turn, its handler's writes between `SAVEPOINT outbox_handler` and its release;
//! then the seal, the rows of the deliveries whose handlers failed taken back, and
//! the COMMIT. The rows are in the transaction before their handlers ran, so no
//! COMMIT but the consumer's may end it: the batch is opened (`BATCH_OPEN`) before
//! its rows are inserted, and a deferred check on each (`inbox_batch_sealed`, see
//! its migration) refuses any COMMIT before the seal (`seal`), which itself checks
//! that the transaction is still the one the rows were inserted in. A handler
//! that commits the transaction itself so has its COMMIT refused and the batch
//! rolled back, instead of committing as consumed the rows of deliveries whose
//! handlers never ran.
//!
//! Whenever the batch cannot end as one commit, each delivery is handled again on
//! its own by [`PgInboxStore::consume_in_transaction`], whose inbox row decides:
//! - the handler of one delivery ended the transaction itself (a `COMMIT`, refused,
//!   or a `ROLLBACK` of its own): that delivery gets the single path's treatment
//!   (dead, never run again: what it wrote after may have been autocommitted); the
//!   others go singly;
//! - the database refused a statement of the consumer's own (the batch's INSERT in
//!   a deadlock with another worker inserting the same message) or the COMMIT (a
//!   deferred constraint, a serialization failure): nothing of the batch stands,
//!   and singly the culprit fails alone.
//!
//! A database that cannot be reached leaves every delivery of the batch unrecorded
//! (`Err`): the caller returns them to the broker, and a redelivery finds the rows
//! if the COMMIT did happen.

use std::borrow::Cow;
use std::collections::HashSet;

use outbox_core::{Decision, HandlerFailure, Message};
use outbox_ports::{Lease, PortError};
use sqlx::types::Json;
use sqlx::{PgConnection, Postgres, Transaction};
use uuid::Uuid;

use super::PgInboxStore;
use super::session::{
    HANDLER_SAVEPOINT, SESSION_RESET, TxHandler, aborted_reason, end_what_the_handler_left,
    ended_by_handler, ended_reason, rollback_to_savepoint, simple_query,
};
use super::transaction::ConsumeOutcome;
use crate::error::{port, refused_by_database};
use crate::rows::column;
use crate::{PgSchema, storable};

/// One delivery of a batch: its message and the lease its failure is recorded under.
#[derive(Debug, Clone, Copy)]
pub struct BatchDelivery<'a> {
    /// The delivered message.
    pub message: &'a Message,
    /// The holder its row is recorded under should its handler fail (as in
    /// [`PgInboxStore::consume_in_transaction`]).
    pub lease: &'a Lease,
}

/// What became of one delivery inside the batch's transaction.
#[derive(Debug)]
enum Step {
    /// Its row and its handler's writes are in the transaction.
    Consumed,
    /// Its row was there already: nothing ran.
    Duplicate,
    /// Its handler failed; its writes were rolled back to its savepoint and its
    /// row is taken back before the COMMIT.
    Failed(HandlerFailure),
}

/// How the batch's transaction ended.
#[derive(Debug)]
enum End {
    /// Committed: every step stands.
    Committed,
    /// Rolled back, or ended by the handler of delivery `ended` (with the reason to
    /// store): each delivery is to be handled again on its own.
    Singly { ended: Option<(usize, String)> },
    /// The database could not be reached; nothing is known of the transaction.
    Unreachable(String),
}

impl PgInboxStore {
    /// Records and handles several first deliveries in one transaction, exactly once
    /// in effect each; what [`Self::consume_in_transaction`] does for one, with one
    /// COMMIT for all. `handler_for` makes a delivery's handler (called again for a
    /// delivery handled singly after all, see the module's text); `decide` gets the
    /// attempt number of a failure. Deliveries with an ordering key are handled
    /// singly (their rows must be seen by the other workers while they run).
    ///
    /// Returns one result per delivery, in order: `Err` as for
    /// [`Self::consume_in_transaction`] (nothing is known to be recorded; return it to
    /// the broker).
    pub async fn consume_batch_in_transaction(
        &self,
        consumer: &str,
        deliveries: &[BatchDelivery<'_>],
        decide: &(dyn Fn(&Message, u32, &HandlerFailure) -> Decision + Send + Sync),
        handler_for: &(dyn Fn(&Message) -> TxHandler<'static> + Send + Sync),
    ) -> Vec<Result<ConsumeOutcome, PortError>> {
        let mut out: Vec<Option<Result<ConsumeOutcome, PortError>>> =
            deliveries.iter().map(|_| None).collect();
        let (keyed, unkeyed): (Vec<usize>, Vec<usize>) =
            (0..deliveries.len()).partition(|&i| deliveries[i].message.ordering_key.is_some());
        for i in keyed {
            out[i] = Some(
                self.singly(consumer, deliveries[i], decide, handler_for)
                    .await,
            );
        }
        if unkeyed.len() > 1 && !self.batch_guarded().await {
            for &i in &unkeyed {
                out[i] = Some(
                    self.singly(consumer, deliveries[i], decide, handler_for)
                        .await,
                );
            }
        } else if unkeyed.len() == 1 {
            out[unkeyed[0]] = Some(
                self.singly(consumer, deliveries[unkeyed[0]], decide, handler_for)
                    .await,
            );
        } else if !unkeyed.is_empty() {
            let batch: Vec<BatchDelivery<'_>> = unkeyed.iter().map(|&i| deliveries[i]).collect();
            let (steps, end) = self.run_batch(consumer, &batch, handler_for).await;
            match end {
                End::Committed => {
                    for (&i, step) in unkeyed.iter().zip(steps) {
                        let d = deliveries[i];
                        out[i] = Some(match step {
                            Step::Consumed => Ok(ConsumeOutcome::Consumed),
                            Step::Duplicate => Ok(ConsumeOutcome::Duplicate),
                            Step::Failed(error) => {
                                self.record_first_attempt_failed(
                                    consumer,
                                    d.message,
                                    d.lease,
                                    error,
                                    None,
                                    |n, f: &HandlerFailure| decide(d.message, n, f),
                                )
                                .await
                            }
                        });
                    }
                }
                End::Singly { ended } => {
                    if let Some((at, _)) = &ended {
                        tracing::warn!(consumer, message_id = %batch[*at].message.id, "a handler ended its batch's inbox transaction itself; the batch's other deliveries are handled singly");
                    } else {
                        tracing::debug!(
                            consumer,
                            "the database refused a batch's COMMIT; its deliveries are handled singly"
                        );
                    }
                    // The delivery whose handler ended the transaction is recorded
                    // first: a copy of the same message earlier in the batch then
                    // finds its row (a duplicate) instead of running a handler that
                    // wrote outside the transaction once already.
                    if let Some((at, error)) = &ended {
                        let d = batch[*at];
                        out[unkeyed[*at]] = Some(
                            self.record_first_attempt_failed(
                                consumer,
                                d.message,
                                d.lease,
                                HandlerFailure::permanent(error.clone()),
                                Some(Decision::Dead),
                                |n, f: &HandlerFailure| decide(d.message, n, f),
                            )
                            .await,
                        );
                    }
                    for &i in &unkeyed {
                        if out[i].is_none() {
                            out[i] = Some(
                                self.singly(consumer, deliveries[i], decide, handler_for)
                                    .await,
                            );
                        }
                    }
                }
                End::Unreachable(error) => {
                    for &i in &unkeyed {
                        out[i] = Some(Err(PortError::transient("consume batch", error.clone())));
                    }
                }
            }
        }
        out.into_iter()
            .map(|r| r.unwrap_or_else(|| Err(PortError::fatal("consume batch", "no outcome"))))
            .collect()
    }

    /// Whether the table has the batch's COMMIT check (`inbox_batch_sealed`); without
    /// it (a schema not migrated since) a handler's own COMMIT would record its
    /// batch-mates consumed before their handlers ran, so deliveries are handled
    /// one transaction each. Asked once; a failed question is asked again.
    async fn batch_guarded(&self) -> bool {
        let table = format!("{}.outbox_inbox", self.schema.quoted());
        let known = self
            .batch_guarded
            .get_or_try_init(|| async {
                let guarded: bool = sqlx::query_scalar(
                    "SELECT EXISTS (SELECT 1 FROM pg_trigger \
                     WHERE tgname = 'inbox_batch_sealed' AND tgrelid = to_regclass($1))",
                )
                .bind(&table)
                .fetch_one(&self.pool)
                .await?;
                if !guarded {
                    tracing::warn!(table, "the inbox has no inbox_batch_sealed check (run `outbox migrate`): deliveries are handled one transaction each");
                }
                Ok::<_, sqlx::Error>(guarded)
            })
            .await;
        known.copied().unwrap_or(false)
    }

    /// One delivery in a transaction of its own.
    async fn singly(
        &self,
        consumer: &str,
        d: BatchDelivery<'_>,
        decide: &(dyn Fn(&Message, u32, &HandlerFailure) -> Decision + Send + Sync),
        handler_for: &(dyn Fn(&Message) -> TxHandler<'static> + Send + Sync),
    ) -> Result<ConsumeOutcome, PortError> {
        self.consume_in_transaction(
            consumer,
            d.message,
            d.lease,
            |n, f: &HandlerFailure| decide(d.message, n, f),
            handler_for(d.message),
        )
        .await
    }

    /// The batch's transaction: every delivery's row in one INSERT, then each new
    /// delivery's handler under the savepoint, then the seal and one COMMIT. The
    /// steps are those of the deliveries reached.
    async fn run_batch(
        &self,
        consumer: &str,
        batch: &[BatchDelivery<'_>],
        handler_for: &(dyn Fn(&Message) -> TxHandler<'static> + Send + Sync),
    ) -> (Vec<Step>, End) {
        let mut steps = Vec::with_capacity(batch.len());
        // From a clean session (see SESSION_RESET), with the batch open: the rows
        // inserted next can only be committed once sealed (see BATCH_OPEN).
        let begin = format!("BEGIN; {SESSION_RESET}; {BATCH_OPEN}");
        let mut tx = match self.pool.begin_with(sqlx::AssertSqlSafe(begin)).await {
            Ok(tx) => tx,
            Err(e) => return (steps, End::Unreachable(port("begin", e).to_string())),
        };
        let (xid, mut recorded) = match self.record_batch(&mut tx, consumer, batch).await {
            Ok(recorded) => recorded,
            // A deadlock with another worker inserting the same messages, say:
            // nothing of the batch is recorded, and singly each insert waits.
            Err(e) if refused_by_database(&e).is_some() => {
                return self.rolled_back(tx, steps).await;
            }
            Err(e) => {
                return (
                    steps,
                    End::Unreachable(port("record arrivals", e).to_string()),
                );
            }
        };
        if let Err(e) = simple_query(
            &mut tx,
            sqlx::AssertSqlSafe(format!("SAVEPOINT {HANDLER_SAVEPOINT}")),
        )
        .await
        {
            return (steps, End::Unreachable(port("savepoint", e).to_string()));
        }
        let mut failed = Vec::new();
        // At the start of each delivery the savepoint is taken and nothing has run
        // since.
        for (n, d) in batch.iter().enumerate() {
            // The first copy of each message recorded now runs; a second copy in
            // the batch, or a message recorded before, is a duplicate.
            if !recorded.remove(d.message.id.as_uuid()) {
                steps.push(Step::Duplicate);
                continue;
            }
            let step = match (handler_for(d.message))(&mut tx).await {
                Ok(()) => {
                    match simple_query(&mut tx, sqlx::AssertSqlSafe(release_and_next())).await {
                        Ok(_) => Step::Consumed,
                        Err(e) => match refused_by_database(&e) {
                            Some(why) if ended_by_handler(&e) => {
                                return self
                                    .ended(tx, steps, n, ended_reason("returned Ok", &why))
                                    .await;
                            }
                            // Aborted by a statement the handler ignored: back to the
                            // savepoint, which the failed RELEASE left in place.
                            Some(why) => match rollback_to_savepoint(&mut tx).await {
                                Ok(()) => Step::Failed(HandlerFailure::retryable(aborted_reason(
                                    &e, &why,
                                ))),
                                // Its savepoint is gone too: it ended the transaction
                                // and began another, left aborted.
                                Err(back) if ended_by_handler(&back) => {
                                    let reason = ended_reason("returned Ok", &why);
                                    return self.ended(tx, steps, n, reason).await;
                                }
                                Err(e) => {
                                    return (
                                        steps,
                                        End::Unreachable(
                                            port("rollback to savepoint", e).to_string(),
                                        ),
                                    );
                                }
                            },
                            None => {
                                return (
                                    steps,
                                    End::Unreachable(port("release savepoint", e).to_string()),
                                );
                            }
                        },
                    }
                }
                Err(error) => match rollback_to_savepoint(&mut tx).await {
                    Ok(()) => Step::Failed(error),
                    Err(e) if ended_by_handler(&e) => {
                        let why = refused_by_database(&e).unwrap_or_else(|| e.to_string());
                        let reason = ended_reason(&format!("returned an error ({error})"), &why);
                        return self.ended(tx, steps, n, reason).await;
                    }
                    Err(e) => {
                        return (
                            steps,
                            End::Unreachable(port("rollback to savepoint", e).to_string()),
                        );
                    }
                },
            };
            if matches!(step, Step::Failed(_)) {
                failed.push(*d.message.id.as_uuid());
            }
            steps.push(step);
        }
        // Every handler ran: the batch is sealed, and the rows of those that failed
        // are taken back (their failures are recorded after the COMMIT, as a
        // single delivery's are). Sealed only in the transaction the rows were
        // inserted in: a handler that ended it (its COMMIT refused, which rolled
        // the rows back) and began another with a savepoint of the worker's name
        // would otherwise have its batch-mates acknowledged with neither rows nor
        // the writes of those before it.
        let sealed = async {
            simple_query(&mut tx, sqlx::AssertSqlSafe(seal(&self.schema, xid))).await?;
            if !failed.is_empty() {
                sqlx::query(sqlx::AssertSqlSafe(&*self.sql.forget_consumed))
                    .bind(consumer)
                    .bind(&failed)
                    .execute(&mut *tx)
                    .await?;
            }
            Ok::<_, sqlx::Error>(())
        }
        .await;
        match sealed {
            Ok(()) => {}
            Err(e) if refused_by_database(&e).is_some() => {
                return self.rolled_back(tx, steps).await;
            }
            Err(e) => return (steps, End::Unreachable(port("seal batch", e).to_string())),
        }
        match tx.commit().await {
            Ok(()) => (steps, End::Committed),
            Err(e) if refused_by_database(&e).is_some() => (steps, End::Singly { ended: None }),
            Err(e) => (steps, End::Unreachable(port("commit", e).to_string())),
        }
    }

    /// Every delivery's row in one INSERT; the transaction's id, and the ids of the
    /// messages inserted (not recorded before).
    async fn record_batch(
        &self,
        conn: &mut PgConnection,
        consumer: &str,
        batch: &[BatchDelivery<'_>],
    ) -> Result<(u64, HashSet<Uuid>), sqlx::Error> {
        let stored: Vec<Cow<'_, Message>> =
            batch.iter().map(|d| storable::message(d.message)).collect();
        let m: Vec<&Message> = stored.iter().map(|c| &**c).collect();
        let (xid, inserted): (String, Vec<Uuid>) =
            sqlx::query_as(sqlx::AssertSqlSafe(&*self.sql.arrive_consumed_many))
                .bind(consumer)
                .bind(column(m.iter().copied(), |m| *m.id.as_uuid()))
                .bind(column(m.iter().copied(), |m| m.exchange.as_str()))
                .bind(column(m.iter().copied(), |m| m.routing_key.as_str()))
                .bind(column(m.iter().copied(), |m| m.message_type.as_deref()))
                .bind(column(m.iter().copied(), |m| Json(&m.headers)))
                .bind(column(m.iter().copied(), |m| m.payload.as_slice()))
                .bind(column(m.iter().copied(), |m| m.content_type.as_str()))
                .bind(column(m.iter().copied(), |m| m.source.as_deref()))
                .bind(column(m.iter().copied(), |m| m.correlation_id.as_deref()))
                .bind(column(m.iter().copied(), |m| m.created_at))
                .fetch_one(conn)
                .await?;
        let xid = xid
            .parse()
            .map_err(|e| sqlx::Error::Decode(format!("transaction id {xid:?}: {e}").into()))?;
        Ok((xid, inserted.into_iter().collect()))
    }

    /// The batch's transaction refused a statement of the consumer's own: rolled
    /// back, nothing of it stands, and each delivery is handled singly.
    async fn rolled_back(
        &self,
        tx: Transaction<'_, Postgres>,
        steps: Vec<Step>,
    ) -> (Vec<Step>, End) {
        match tx.rollback().await {
            Ok(()) => (steps, End::Singly { ended: None }),
            Err(e) => (steps, End::Unreachable(port("rollback", e).to_string())),
        }
    }

    /// The handler of delivery `n` ended the transaction: whatever is left of it is
    /// rolled back and the session set back ([`end_what_the_handler_left`]). The
    /// delivery is never tried again, whatever the clean-up does.
    async fn ended(
        &self,
        tx: Transaction<'_, Postgres>,
        steps: Vec<Step>,
        n: usize,
        reason: String,
    ) -> (Vec<Step>, End) {
        end_what_the_handler_left(tx).await;
        (
            steps,
            End::Singly {
                ended: Some((n, reason)),
            },
        )
    }
}

/// Set for the batch's transaction before its rows are inserted: each consumed row
/// inserted while it is set queues the `inbox_batch_sealed` check (see its
/// migration), which refuses the COMMIT unless the batch is sealed ([`seal`]). A handler's
/// own `COMMIT` is refused (and the batch rolled back) instead of committing the
/// rows of deliveries whose handlers have not run. [`SESSION_RESET`] clears it,
/// which leaves the check armed: only the consumer's seal passes it.
const BATCH_OPEN: &str = "SET LOCAL outbox.inbox_batch = 'open'";

/// The seal, by the consumer right before its COMMIT once every handler of the
/// batch ran: the last handler's savepoint released, then `outbox_inbox_batch_seal`
/// (see its migration) sets `outbox.inbox_batch` to 'sealed' if the transaction is
/// still the one (`xid`, from PostgreSQL, a number) the batch's rows were inserted
/// in, and fails otherwise (SQLSTATE P0001).
fn seal(schema: &PgSchema, xid: u64) -> String {
    // SAFETY-SQL: besides the validated, quoted schema and a constant, only `xid`,
    // a u64 (digits only), is spliced.
    format!(
        "RELEASE SAVEPOINT {HANDLER_SAVEPOINT}; SELECT {}.outbox_inbox_batch_seal('{xid}'::xid8)",
        schema.quoted()
    )
}

/// What follows a handler that returned `Ok`, in one round trip (a statement does
/// not run when one before it fails): its savepoint released, which fails if the
/// handler left the transaction aborted or ended it; the session set back
/// ([`SESSION_RESET`]), since a `SET` or `SET LOCAL` survives the release and would
/// otherwise reach the next handler and decide whether the batch's COMMIT, which
/// every delivery of the batch is acknowledged after, waits for the WAL to be
/// flushed; and the next delivery's savepoint.
fn release_and_next() -> String {
    format!("RELEASE SAVEPOINT {HANDLER_SAVEPOINT}; {SESSION_RESET}; SAVEPOINT {HANDLER_SAVEPOINT}")
}
