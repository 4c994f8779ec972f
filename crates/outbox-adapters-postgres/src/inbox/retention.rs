//! Retention of the inbox: one consumer's deliveries consumed more than an age ago
//! deleted in short batches (failed, dead and unfinished rows never), and the
//! table vacuumed when autovacuum is off for it (see [`crate::vacuum`]).
//!
//! A consumer's rows are what make its own redeliveries harmless, for as long as
//! its own retention says, so a statement deletes one consumer's rows only, read
//! through `inbox_retention` whatever other consumers keep. The conditions are
//! repeated outside the statement's subquery, so a row reconsumed while the delete
//! waited for its lock is left alone.

use outbox_ports::PortError;

use super::PgInboxStore;
use crate::error::port;
use crate::rows::millis;

impl PgInboxStore {
    /// Vacuums `outbox_inbox` when autovacuum is off for it and its dead rows pass
    /// autovacuum's threshold: every consumed delivery rewrites its row (see
    /// [`outbox_ports::OutboxRetention::reclaim_space`]). The table is shared by
    /// every consumer of the schema.
    ///
    /// # Errors
    /// A database error.
    pub(super) async fn reclaim_inbox_space(
        &self,
    ) -> Result<outbox_ports::SpaceReclaim, PortError> {
        crate::vacuum::reclaim(&self.pool, &self.schema, "outbox_inbox").await
    }

    /// Retention: deletes `consumer`'s deliveries consumed more than `age` ago,
    /// `batch` per statement; returns how many. Failed, dead and in-progress rows are
    /// never deleted.
    ///
    /// # Errors
    /// A database error; what was deleted before it stays deleted.
    pub async fn delete_consumed_older_than(
        &self,
        consumer: &str,
        age: std::time::Duration,
        batch: u32,
    ) -> Result<u64, PortError> {
        let mut total = 0;
        loop {
            let n = self.delete_consumed_rows(consumer, age, batch).await?;
            total += n;
            if n < u64::from(batch.max(1)) {
                return Ok(total);
            }
        }
    }

    /// One statement of [`Self::delete_consumed_older_than`] (and
    /// [`outbox_ports::InboxRetention::delete_consumed_batch`]): deletes at most
    /// `batch` rows and returns how many, so a caller can stop between batches.
    ///
    /// # Errors
    /// A database error.
    pub(super) async fn delete_consumed_rows(
        &self,
        consumer: &str,
        age: std::time::Duration,
        batch: u32,
    ) -> Result<u64, PortError> {
        Ok(sqlx::query(sqlx::AssertSqlSafe(&*self.sql.retention))
            .bind(millis(age))
            .bind(i64::from(batch.max(1)))
            .bind(consumer)
            .execute(&self.pool)
            .await
            .map_err(|e| port("retention", e))?
            .rows_affected())
    }
}
