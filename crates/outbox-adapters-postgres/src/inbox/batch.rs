//! Several first deliveries recorded and handled in one inbox transaction, so one
//! COMMIT (and one WAL flush) covers them all, each handler under a savepoint of its
//! own so that a failure rolls back its own writes only.
//!
//! The transaction holds, for each delivery in turn: its inbox row (inserted as
//! consumed, as [`PgInboxStore::consume_in_transaction`] does) and its handler's
//! writes, between `SAVEPOINT outbox_handler` and its release. Each row is inserted
//! right before its handler runs, never ahead: a handler that commits the
//! transaction itself then commits the rows of the deliveries handled so far and
//! its own, never one whose handler has not run.
//!
//! Whenever the batch cannot end as one commit, each delivery is handled again on
//! its own by [`PgInboxStore::consume_in_transaction`], whose inbox row decides:
//! - the handler of one delivery ended the transaction itself (a `COMMIT` or
//!   `ROLLBACK` of its own): that delivery gets the single path's treatment (dead,
//!   never run again, or consumed if it committed the row); the others go singly,
//!   and those whose rows the handler committed are found there (duplicates);
//! - the database refused the COMMIT (a deferred constraint, a serialization
//!   failure): nothing of the batch stands, and singly the culprit fails alone.
//!
//! A database that cannot be reached leaves every delivery of the batch unrecorded
//! (`Err`): the caller returns them to the broker, and a redelivery finds the rows
//! if the COMMIT did happen.

use outbox_core::{Decision, HandlerFailure, Message};
use outbox_ports::{Lease, PortError};
use sqlx::{Postgres, Transaction};

use super::PgInboxStore;
use super::arrival::bind_delivery;
use super::session::{
    HANDLER_SAVEPOINT, SESSION_RESET, TxHandler, aborted_reason, end_what_the_handler_left,
    ended_by_handler, ended_reason, rollback_to_savepoint, simple_query,
};
use super::transaction::ConsumeOutcome;
use crate::error::{port, refused_by_database};
use crate::storable;

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
    /// Its handler failed; its row and writes were rolled back to its savepoint.
    Failed(HandlerFailure),
    /// Its row could not be inserted (a deadlock with another worker inserting the
    /// same message): rolled back to its savepoint, nothing recorded.
    Unrecorded(String),
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
        if unkeyed.len() == 1 {
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
                            Step::Unrecorded(error) => {
                                Err(PortError::transient("record arrival", error))
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

    /// The batch's transaction: each delivery's row and handler under the savepoint,
    /// then one COMMIT. The steps are those of the deliveries reached.
    async fn run_batch(
        &self,
        consumer: &str,
        batch: &[BatchDelivery<'_>],
        handler_for: &(dyn Fn(&Message) -> TxHandler<'static> + Send + Sync),
    ) -> (Vec<Step>, End) {
        let mut steps = Vec::with_capacity(batch.len());
        // The first savepoint with the BEGIN, in one round trip, from a clean
        // session (see SESSION_RESET).
        let begin = format!("BEGIN; {SESSION_RESET}; SAVEPOINT {HANDLER_SAVEPOINT}");
        let mut tx = match self.pool.begin_with(begin).await {
            Ok(tx) => tx,
            Err(e) => return (steps, End::Unreachable(port("begin", e).to_string())),
        };
        // At the start of each delivery the savepoint is taken and nothing has run
        // since.
        for (n, d) in batch.iter().enumerate() {
            let stored = storable::message(d.message);
            let inserted = bind_delivery(&self.sql.arrive_consumed, consumer, &stored)
                .fetch_optional(&mut *tx)
                .await;
            match inserted {
                Ok(Some(_)) => {}
                Ok(None) => {
                    steps.push(Step::Duplicate);
                    continue;
                }
                Err(e) => {
                    let Some(why) = refused_by_database(&e) else {
                        return (
                            steps,
                            End::Unreachable(port("record arrival", e).to_string()),
                        );
                    };
                    if let Err(e) = rollback_to_savepoint(&mut tx).await {
                        return (
                            steps,
                            End::Unreachable(port("rollback to savepoint", e).to_string()),
                        );
                    }
                    steps.push(Step::Unrecorded(why));
                    continue;
                }
            }
            let step = match (handler_for(d.message))(&mut tx).await {
                Ok(()) => match simple_query(&mut tx, &release_and_next()).await {
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
                            Ok(()) => {
                                Step::Failed(HandlerFailure::retryable(aborted_reason(&e, &why)))
                            }
                            // Its savepoint is gone too: it ended the transaction
                            // and began another, left aborted.
                            Err(back) if ended_by_handler(&back) => {
                                let reason = ended_reason("returned Ok", &why);
                                return self.ended(tx, steps, n, reason).await;
                            }
                            Err(e) => {
                                return (
                                    steps,
                                    End::Unreachable(port("rollback to savepoint", e).to_string()),
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
                },
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
            steps.push(step);
        }
        match tx.commit().await {
            Ok(()) => (steps, End::Committed),
            Err(e) if refused_by_database(&e).is_some() => (steps, End::Singly { ended: None }),
            Err(e) => (steps, End::Unreachable(port("commit", e).to_string())),
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
