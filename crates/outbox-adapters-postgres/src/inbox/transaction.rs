//! Exactly once in effect: a delivery's inbox row and its handler's writes in one
//! transaction, for a first delivery ([`PgInboxStore::consume_in_transaction`]) and
//! for a retry the consume sweep claimed ([`PgInboxStore::retry_in_transaction`]).
//! Both commit, or neither does; a failed attempt is rolled back and recorded under
//! the attempt's lease, and a handler that ended the transaction itself makes the
//! delivery dead at once (how a run ended is told in [`super::session`]).
//!
//! A keyed first delivery is recorded (and committed) under its lease before its
//! handler runs, then handled as a retry is: its row must hold the key back, seen
//! by the other workers, while the handler runs. After a keyed row finishes, its
//! key's next held row is made due, after the commit, never inside it.

use outbox_core::{Decision, HandlerFailure, InboxStatus, Message, MessageId};
use outbox_ports::{Arrival, Lease, PortError};

use super::PgInboxStore;
use super::arrival::bind_delivery;
use super::session::{Attempt, TxHandler, run_and_commit};
use crate::error::port;
use crate::rows::sources_of;
use crate::storable;

/// What [`PgInboxStore::consume_in_transaction`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConsumeOutcome {
    /// The handler ran and its writes committed together with the inbox row.
    Consumed,
    /// The message was recorded before (by this or another worker): nothing ran.
    Duplicate,
    /// The handler failed: its writes were rolled back and the failure stored for a
    /// retry.
    Failed(String),
    /// The handler failed and the delivery is stored as dead: the caller's `decide`
    /// said so (the retry budget is spent), or the handler ended the inbox
    /// transaction itself (a `COMMIT` or `ROLLBACK` of its own) before the row was
    /// committed, which makes it dead at once whatever the policy says, since what
    /// it wrote outside the transaction would be written again by a retry. (When the
    /// handler committed the row itself before failing, the row is consumed and the
    /// outcome is `Consumed`, with an error in the log.)
    Dead(String),
}

/// What a stored failure with `decision` is.
fn failure_outcome(error: String, decision: Decision) -> ConsumeOutcome {
    if decision == Decision::Dead {
        ConsumeOutcome::Dead(error)
    } else {
        ConsumeOutcome::Failed(error)
    }
}

impl PgInboxStore {
    /// Exactly once in effect: in one transaction, records `message` for `consumer`
    /// as consumed and runs `handler` with that transaction's connection. Both commit
    /// together, or neither does. A message recorded before is a
    /// [`ConsumeOutcome::Duplicate`] and the handler does not run. A failed attempt
    /// (the handler's error, a statement it ignored that left the transaction
    /// aborted, a refusal at COMMIT) rolls its writes back and stores the failure
    /// (attempt 1) for the consume sweep, under `lease`: a holder unique to this
    /// attempt, so no other worker's marks can land on the row. A handler that ended
    /// the transaction itself makes the row dead at once (see
    /// [`ConsumeOutcome::Failed`]).
    ///
    /// # Errors
    /// The database could not be reached (or the COMMIT's answer never came); then
    /// nothing is known to be recorded and the delivery should be returned to the
    /// broker (or tried again): a redelivery finds the row if the COMMIT did happen.
    /// A keyed message's row may be recorded, still unhandled: its lease is given
    /// up when the database answers, so the next try takes it over at once (else
    /// the consume sweep does once the lease runs out).
    pub async fn consume_in_transaction(
        &self,
        consumer: &str,
        message: &Message,
        lease: &Lease,
        decide: impl FnOnce(u32, &HandlerFailure) -> Decision + Send,
        handler: TxHandler<'_>,
    ) -> Result<ConsumeOutcome, PortError> {
        if message.ordering_key.is_some() {
            // A keyed delivery must hold its key back while its handler runs, seen
            // by the other workers of this consumer (an arrival of the key's next
            // delivery is then held behind it). A row written inside the handler's
            // transaction would be invisible to them until it commits: so the row
            // is recorded under `lease` first, committed, and the handler runs as
            // a retry does, marking it consumed in its transaction.
            return match self.arrive(consumer, message, lease).await? {
                Arrival::New => {
                    let outcome = self
                        .retry_in_transaction(consumer, lease, message, 0, decide, handler)
                        .await;
                    if outcome.is_err() {
                        self.give_up_lease(consumer, message.id, lease).await;
                    }
                    outcome
                }
                Arrival::Duplicate(_) => Ok(ConsumeOutcome::Duplicate),
            };
        }
        let mut tx = self.pool.begin().await.map_err(|e| port("begin", e))?;
        let stored = storable::message(message);
        let inserted = bind_delivery(&self.sql.arrive_consumed, consumer, &stored)
            .fetch_optional(&mut *tx)
            .await
            .map_err(|e| port("record arrival", e))?;
        if inserted.is_none() {
            tx.rollback().await.map_err(|e| port("rollback", e))?;
            return Ok(ConsumeOutcome::Duplicate);
        }
        let (failure, decision) = match run_and_commit(tx, handler).await? {
            Attempt::Committed => return Ok(ConsumeOutcome::Consumed),
            Attempt::Failed(failure) => (failure, None),
            Attempt::Ended(error) => (HandlerFailure::permanent(error), Some(Decision::Dead)),
        };
        self.record_first_attempt_failed(consumer, message, lease, failure, decision, decide)
            .await
    }

    /// After a first attempt whose transaction rolled back (or that the handler
    /// ended itself, `decision` then being `Some(Dead)`): the failure recorded under
    /// `lease`, unless the row is there already (a redelivery recorded meanwhile, or
    /// a handler that committed the row itself).
    pub(super) async fn record_first_attempt_failed(
        &self,
        consumer: &str,
        message: &Message,
        lease: &Lease,
        failure: HandlerFailure,
        decision: Option<Decision>,
        decide: impl FnOnce(u32, &HandlerFailure) -> Decision + Send,
    ) -> Result<ConsumeOutcome, PortError> {
        let ended = decision.is_some();
        let error = failure.reason.clone();
        match self.arrive(consumer, message, lease).await? {
            Arrival::New => {
                let decision = decision.unwrap_or_else(|| decide(1, &failure));
                self.mark_failed_row(consumer, message.id, lease, &error, decision)
                    .await?;
                if ended {
                    tracing::error!(consumer, message_id = %message.id, reason = %error, "handler ended the inbox transaction itself; the delivery is dead");
                }
                Ok(failure_outcome(error, decision))
            }
            Arrival::Duplicate(status) if ended => {
                Ok(self.ended_after_commit(consumer, message.id, status, &error))
            }
            Arrival::Duplicate(_) => Ok(ConsumeOutcome::Duplicate),
        }
    }

    /// A handler ended the inbox transaction and the row was found already recorded
    /// (as `status`): the handler committed it, with its writes, before failing, or
    /// (rarely) another worker recorded it meanwhile. A consumed row cannot become
    /// dead, so the outcome is reported as it stands, with an error in the log.
    fn ended_after_commit(
        &self,
        consumer: &str,
        id: MessageId,
        status: InboxStatus,
        reason: &str,
    ) -> ConsumeOutcome {
        let name = status.as_str();
        tracing::error!(consumer, message_id = %id, status = name, %reason, "handler ended the inbox transaction itself; the delivery stays as recorded, its writes may have taken effect");
        if status == InboxStatus::Consumed {
            ConsumeOutcome::Consumed
        } else {
            ConsumeOutcome::Duplicate
        }
    }

    /// Exactly once in effect for a consume retry: `message` was claimed by the sweep
    /// under `lease` (see [`outbox_ports::InboxConsumerPath::claim_due`]). In one transaction the row is
    /// marked consumed (only if `lease` still holds it) and `handler` runs with that
    /// transaction's connection; both commit or neither. A failed attempt (as in
    /// [`Self::consume_in_transaction`]) rolls back and records the failure (`decide`
    /// gets the attempt number) under the lease; a handler that ended the
    /// transaction itself makes the row dead at once.
    ///
    /// # Errors
    /// The database could not be reached; the row stays claimed until the lease runs
    /// out.
    pub async fn retry_in_transaction(
        &self,
        consumer: &str,
        lease: &Lease,
        message: &Message,
        attempts_before: u32,
        decide: impl FnOnce(u32, &HandlerFailure) -> Decision + Send,
        handler: TxHandler<'_>,
    ) -> Result<ConsumeOutcome, PortError> {
        let mut tx = self.pool.begin().await.map_err(|e| port("begin", e))?;
        let marked: Option<(i64, Option<String>)> =
            sqlx::query_as(sqlx::AssertSqlSafe(&*self.sql.mark_consumed))
                .bind(consumer)
                .bind(message.id.as_uuid())
                .bind(&lease.holder)
                .bind(sources_of(InboxStatus::Consumed))
                .fetch_optional(&mut *tx)
                .await
                .map_err(|e| port("mark consumed", e))?;
        let Some((seq, key)) = marked else {
            tx.rollback().await.map_err(|e| port("rollback", e))?;
            return Ok(ConsumeOutcome::Duplicate);
        };
        // After the commit, not inside it: an arrival of the key that waits on
        // this row's lock sees the row consumed once it commits, and one that was
        // held before is visible to a statement that starts after it.
        let promote = |status: InboxStatus| async move {
            if let (Some(key), InboxStatus::Consumed) = (key.as_deref(), status) {
                self.promote_next(consumer, key, seq).await;
            }
        };
        let (error, decision) = match run_and_commit(tx, handler).await? {
            Attempt::Committed => {
                promote(InboxStatus::Consumed).await;
                return Ok(ConsumeOutcome::Consumed);
            }
            Attempt::Failed(failure) => {
                let decision = decide(attempts_before.saturating_add(1), &failure);
                (failure.reason, decision)
            }
            Attempt::Ended(error) => {
                let marked = self
                    .mark_failed_row(consumer, message.id, lease, &error, Decision::Dead)
                    .await?;
                if marked {
                    tracing::error!(consumer, message_id = %message.id, reason = %error, "handler ended the inbox transaction itself; the delivery is dead");
                    return Ok(ConsumeOutcome::Dead(error));
                }
                // Not under our lease in a state that may die: the handler committed
                // the row as consumed (or the lease was lost meanwhile).
                let status = self
                    .status_of(consumer, message.id)
                    .await?
                    .unwrap_or(InboxStatus::Received);
                promote(status).await;
                return Ok(self.ended_after_commit(consumer, message.id, status, &error));
            }
        };
        self.mark_failed_row(consumer, message.id, lease, &error, decision)
            .await?;
        Ok(failure_outcome(error, decision))
    }
}
