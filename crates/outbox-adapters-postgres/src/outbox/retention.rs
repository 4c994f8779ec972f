//! Retention of the outbox: sent messages older than an age deleted in short
//! batches ([`OutboxRetention`]), and the table vacuumed when autovacuum is off
//! for it (see [`crate::vacuum`]).
//!
//! Each statement deletes at most one batch, picked by the oldest `sent_at`, and
//! re-checks `status = 'sent'` on the row it deletes: a row changed since the
//! subquery picked it is left alone, and no statement holds many locks or a long
//! transaction.

use std::time::Duration;

use async_trait::async_trait;
use outbox_ports::{OutboxRetention, PortError, SpaceReclaim};

use super::PgOutboxStore;
use crate::error::port;
use crate::rows::{delete_in_batches, millis};

impl PgOutboxStore {
    /// Retention: deletes sent messages older than `age`, `batch` rows per statement,
    /// until none is left; returns how many. Each statement is short, so it never
    /// holds many locks or a long transaction.
    ///
    /// # Errors
    /// A database error; what was deleted before it stays deleted.
    pub async fn delete_sent_older_than(
        &self,
        age: Duration,
        batch: u32,
    ) -> Result<u64, PortError> {
        delete_in_batches(&self.pool, &self.sql.retention, age, batch).await
    }
}

#[async_trait]
impl OutboxRetention for PgOutboxStore {
    async fn delete_sent_batch(&self, age: Duration, limit: u32) -> Result<u64, PortError> {
        // The statement's own guard: `status = 'sent'` (and an age), nothing else.
        Ok(sqlx::query(sqlx::AssertSqlSafe(&*self.sql.retention))
            .bind(millis(age))
            .bind(i64::from(limit.max(1)))
            .execute(&self.pool)
            .await
            .map_err(|e| port("retention", e))?
            .rows_affected())
    }

    /// Vacuums `outbox_messages` when autovacuum is off for it (see the `vacuum`
    /// module) and its dead rows pass autovacuum's threshold.
    async fn reclaim_space(&self) -> Result<SpaceReclaim, PortError> {
        crate::vacuum::reclaim(&self.pool, self.outbox.schema(), "outbox_messages").await
    }
}
