//! The record-level calls of the [`OutboxOperator`] port: one message by id, the
//! oldest in a status, requeue and delete.
//!
//! Requeue and delete
//! carry their status guard in the statement (`status = ANY($n)` from the core's
//! rules), never a read and then a write, and never touch a row under a relay's
//! live lease; when nothing changed, the answer says why from the row as it is
//! now.
//!
//! [`OutboxOperator`]: outbox_ports::OutboxOperator

use outbox_core::{MessageId, OutboxStatus, TransitionError};
use outbox_ports::{OutboxRecord, PortError};

use super::PgOutboxStore;
use crate::error::port;
use crate::rows::{MessageRow, sources_of, stored_status};

impl PgOutboxStore {
    /// [`outbox_ports::OutboxOperator::get_message`].
    pub(crate) async fn record(&self, id: MessageId) -> Result<Option<OutboxRecord>, PortError> {
        sqlx::query_as::<_, MessageRow>(sqlx::AssertSqlSafe(&*self.sql.get))
            .bind(id.as_uuid())
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| port("get", e))?
            .map(|r| r.outbox_record())
            .transpose()
    }

    /// [`outbox_ports::OutboxOperator::oldest_messages`].
    pub(crate) async fn records(
        &self,
        status: OutboxStatus,
        limit: u32,
    ) -> Result<Vec<OutboxRecord>, PortError> {
        sqlx::query_as::<_, MessageRow>(sqlx::AssertSqlSafe(&*self.sql.list))
            .bind(status.as_str())
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await
            .map_err(|e| port("list", e))?
            .iter()
            .map(MessageRow::outbox_record)
            .collect()
    }

    /// [`outbox_ports::OutboxOperator::requeue_message`].
    pub(crate) async fn requeue_record(&self, id: MessageId) -> Result<(), PortError> {
        let n = sqlx::query(sqlx::AssertSqlSafe(&*self.sql.requeue))
            .bind(id.as_uuid())
            .bind(sources_of(OutboxStatus::Pending))
            .execute(&self.pool)
            .await
            .map_err(|e| port("requeue", e))?
            .rows_affected();
        if n == 1 {
            Ok(())
        } else {
            Err(self.revive_error(id, OutboxStatus::Pending).await)
        }
    }

    /// [`outbox_ports::OutboxOperator::replay_message`]: the mark and the insert in
    /// one transaction, the mark's guard in its statement.
    pub(crate) async fn replay_record(
        &self,
        original: MessageId,
        replay: outbox_core::Message,
    ) -> Result<(), PortError> {
        let mut tx = self.pool.begin().await.map_err(|e| port("replay", e))?;
        let marked = sqlx::query(sqlx::AssertSqlSafe(&*self.sql.replay_mark))
            .bind(original.as_uuid())
            .bind(replay.id.as_uuid())
            .execute(&mut *tx)
            .await
            .map_err(|e| port("replay", e))?
            .rows_affected();
        if marked != 1 {
            drop(tx);
            return Err(self.replay_error(original).await);
        }
        self.outbox
            .insert_messages(&mut tx, std::slice::from_ref(&replay))
            .await?;
        sqlx::query(sqlx::AssertSqlSafe(&*self.sql.replay_link))
            .bind(original.as_uuid())
            .bind(replay.id.as_uuid())
            .execute(&mut *tx)
            .await
            .map_err(|e| port("replay", e))?;
        tx.commit().await.map_err(|e| port("replay", e))
    }

    /// Why a replay of `original` marked nothing, from the row as it is now.
    async fn replay_error(&self, original: MessageId) -> PortError {
        match self.record(original).await {
            Ok(now) => crate::error::replay_not_marked(
                "message",
                original,
                now.map(|r| (r.status, r.message.ordering_key.is_some(), r.replayed_as)),
            ),
            Err(e) => e,
        }
    }

    /// [`outbox_ports::OutboxOperator::delete_message`] without `force`.
    pub(crate) async fn delete_record(&self, id: MessageId) -> Result<(), PortError> {
        // The status guard is in the statement: reading the status first and then
        // deleting by id would delete a message requeued in between.
        let n = sqlx::query(sqlx::AssertSqlSafe(&*self.sql.delete))
            .bind(id.as_uuid())
            .bind(deletable_statuses())
            .execute(&self.pool)
            .await
            .map_err(|e| port("delete", e))?
            .rows_affected();
        if n == 1 {
            return Ok(());
        }
        // Nothing deleted: say why (the row may have changed since; the answer then
        // describes its status now, and nothing was deleted either way).
        match sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(&*self.sql.status_of))
            .bind(id.as_uuid())
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| port("delete", e))?
        {
            None => Err(PortError::NotFound {
                what: "message",
                id: id.to_string(),
            }),
            Some(s) => {
                let status =
                    stored_status::<OutboxStatus>(&s).map_err(|e| PortError::fatal("delete", e))?;
                match status.check_delete() {
                    Err(refused) => Err(refused.into()),
                    // It became dead after the delete looked: not deleted, try again.
                    Ok(()) => Err(PortError::transient(
                        "delete",
                        format!("message {id} changed status meanwhile; try again"),
                    )),
                }
            }
        }
    }

    /// Why a requeue of `id` to `target` changed nothing, from the row as it is
    /// now: gone, held by a relay's lease, or in a status that cannot become
    /// `target`.
    async fn revive_error(&self, id: MessageId, target: OutboxStatus) -> PortError {
        match sqlx::query_as::<_, (String, Option<uuid::Uuid>)>(sqlx::AssertSqlSafe(
            &*self.sql.status_and_replay,
        ))
        .bind(id.as_uuid())
        .fetch_optional(&self.pool)
        .await
        {
            Ok(None) => PortError::NotFound {
                what: "message",
                id: id.to_string(),
            },
            Ok(Some((_, Some(replay)))) => {
                outbox_ports::replayed_refusal("message", id, MessageId::from_uuid(replay))
            }
            Ok(Some((s, None))) => match stored_status::<OutboxStatus>(&s) {
                // In a status the requeue takes, only a relay's lease kept it out.
                Ok(from) if from.can_become(target) => PortError::Busy {
                    what: "message",
                    id: id.to_string(),
                    holder: "a relay is publishing it",
                },
                Ok(from) => TransitionError::Outbox { from, to: target }.into(),
                Err(e) => PortError::fatal("requeue", e),
            },
            Err(e) => port("requeue", e),
        }
    }
}

/// The statuses an operator may delete, from the core's rule: the `status = ANY($2)`
/// of the delete statement.
fn deletable_statuses() -> Vec<String> {
    OutboxStatus::deletable()
        .map(|s| s.as_str().to_owned())
        .collect()
}
