//! The record-level calls of the [`InboxOperator`] port: one delivery, the oldest
//! in a status, and a single reconsume (lists and bulk actions go through
//! [`crate::listing`]).
//!
//! Reconsume carries its status guard in the statement and takes only a row no one
//! holds (no live lease, no transaction's row lock: `SKIP LOCKED`), so a retry
//! whose handler is running is never run twice; when nothing changed, the answer
//! says why from the row as it is now.
//!
//! [`InboxOperator`]: outbox_ports::InboxOperator

use outbox_core::{InboxStatus, MessageId, TransitionError};
use outbox_ports::{InboxRecord, PortError};

use super::PgInboxStore;
use crate::error::port;
use crate::rows::{MessageRow, names};

impl PgInboxStore {
    /// [`outbox_ports::InboxOperator::get_delivery`].
    pub(crate) async fn record(
        &self,
        consumer: &str,
        id: MessageId,
    ) -> Result<Option<InboxRecord>, PortError> {
        sqlx::query_as::<_, MessageRow>(sqlx::AssertSqlSafe(&*self.sql.get))
            .bind(consumer)
            .bind(id.as_uuid())
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| port("get delivery", e))?
            .map(|r| r.inbox_record(consumer))
            .transpose()
    }

    /// [`outbox_ports::InboxOperator::oldest_deliveries`].
    pub(crate) async fn records(
        &self,
        consumer: &str,
        status: InboxStatus,
        limit: u32,
    ) -> Result<Vec<InboxRecord>, PortError> {
        sqlx::query_as::<_, MessageRow>(sqlx::AssertSqlSafe(&*self.sql.list))
            .bind(consumer)
            .bind(status.as_str())
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await
            .map_err(|e| port("list deliveries", e))?
            .iter()
            .map(|r| r.inbox_record(consumer))
            .collect()
    }

    /// [`outbox_ports::InboxOperator::reconsume_delivery`].
    pub(crate) async fn reconsume_record(
        &self,
        consumer: &str,
        id: MessageId,
        again: bool,
    ) -> Result<(), PortError> {
        let sources = outbox_ports::reconsumable_from(again);
        let n = sqlx::query(sqlx::AssertSqlSafe(&*self.sql.reconsume))
            .bind(consumer)
            .bind(id.as_uuid())
            .bind(names(&sources))
            .execute(&self.pool)
            .await
            .map_err(|e| port("reconsume", e))?
            .rows_affected();
        if n == 1 {
            return Ok(());
        }
        // Nothing changed: say why, from the row as it is now. A replayed one is
        // refused for good; in a status the reconsume takes, only a holder (a
        // lease, a transaction's row lock) can have kept it out; a holder that
        // finished meanwhile shows as its outcome.
        if let Some(replay) = self.record(consumer, id).await?.and_then(|r| r.replayed_as) {
            return Err(outbox_ports::replayed_refusal("delivery", id, replay));
        }
        match self.status_of(consumer, id).await? {
            None => Err(PortError::NotFound {
                what: "delivery",
                id: id.to_string(),
            }),
            Some(from) if sources.contains(&from) => Err(PortError::Busy {
                what: "delivery",
                id: id.to_string(),
                holder: "a worker or a consume retry is handling it",
            }),
            Some(from) => Err(TransitionError::Inbox {
                from,
                to: InboxStatus::Received,
            }
            .into()),
        }
    }

    /// [`outbox_ports::InboxOperator::replay_delivery`]: the mark and the insert in
    /// one transaction, the mark's guard in its statement.
    pub(crate) async fn replay_record(
        &self,
        consumer: &str,
        original: MessageId,
        replay: outbox_core::Message,
    ) -> Result<(), PortError> {
        replay.validate(outbox_core::message::DEFAULT_MAX_PAYLOAD_BYTES)?;
        let mut tx = self.pool.begin().await.map_err(|e| port("replay", e))?;
        let marked = sqlx::query(sqlx::AssertSqlSafe(&*self.sql.replay_mark))
            .bind(consumer)
            .bind(original.as_uuid())
            .bind(replay.id.as_uuid())
            .execute(&mut *tx)
            .await
            .map_err(|e| port("replay", e))?
            .rows_affected();
        if marked != 1 {
            drop(tx);
            let now = self.record(consumer, original).await?;
            let refusal = crate::error::replay_not_marked(
                "delivery",
                original,
                now.map(|r| (r.status, r.message.ordering_key.is_some(), r.replayed_as)),
            );
            return Err(refusal);
        }
        crate::rows::bind_message_columns(
            sqlx::query(sqlx::AssertSqlSafe(&*self.sql.replay_insert)).bind(consumer),
            &replay,
        )
        .bind(original.as_uuid())
        .execute(&mut *tx)
        .await
        .map_err(|e| port("replay", e))?;
        tx.commit().await.map_err(|e| port("replay", e))
    }
}
