//! The outbox's reads for dashboards and operators: the counts every `/metrics`
//! scrape and `/readyz` check reads ([`OutboxStore::stats`]), exact counts by
//! status, the blocked ordering keys and a key's head.
//!
//! The stats read one partial index of an unsent status each, never the sent
//! rows (most of the table). A page of blocked keys walks only the keys whose head
//! is failing (or dead), one index probe each, and counts the rows waiting behind
//! a head up to a cap; it runs in a read-only transaction without bitmap scans,
//! which could not stop at the cap.
//!
//! [`OutboxStore::stats`]: outbox_ports::OutboxStore::stats

use outbox_core::{MessageId, OutboxStatus};
use outbox_ports::{OutboxStats, PortError};

use super::PgOutboxStore;
use crate::error::port;
use crate::rows::{count, stored_status};

impl PgOutboxStore {
    /// [`outbox_ports::OutboxStore::stats`]: the unsent counts and the oldest
    /// unsent time.
    pub(super) async fn read_stats(&self) -> Result<OutboxStats, PortError> {
        let (pending, scheduled, publish_failed, dead, blocked_keys, oldest): (
            i64,
            i64,
            i64,
            i64,
            i64,
            Option<time::OffsetDateTime>,
        ) = sqlx::query_as(sqlx::AssertSqlSafe(&*self.sql.stats))
            .fetch_one(&self.pool)
            .await
            .map_err(|e| port("stats", e))?;
        Ok(OutboxStats {
            pending: count(pending),
            scheduled: count(scheduled),
            publish_failed: count(publish_failed),
            dead: count(dead),
            blocked_keys: count(blocked_keys),
            oldest_unsent_at: oldest,
        })
    }

    /// The exact number of messages in `status`. Its cost follows the rows in that
    /// status: for `Sent`, the whole kept history. For operators and tests, never
    /// for a scrape or a health check ([`stats`](outbox_ports::OutboxStore::stats) is
    /// made for those).
    ///
    /// # Errors
    /// A database error.
    pub async fn count(&self, status: OutboxStatus) -> Result<u64, PortError> {
        let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(&*self.sql.count))
            .bind(status.as_str())
            .fetch_one(&self.pool)
            .await
            .map_err(|e| port("count", e))?;
        Ok(count(n))
    }

    /// See [`outbox_ports::OutboxOperator::head_of_key`].
    pub(crate) async fn head_of_key_id(
        &self,
        key: &str,
    ) -> Result<Option<outbox_ports::KeyHead>, PortError> {
        let head: Option<(uuid::Uuid, i64)> =
            sqlx::query_as(sqlx::AssertSqlSafe(&*self.sql.head_of_key))
                .bind(key)
                .bind(blocked_count_limit())
                .fetch_optional(&self.pool)
                .await
                .map_err(|e| port("head of key", e))?;
        Ok(head.map(|(id, behind)| {
            let (waiting, waiting_capped) = waiting(behind);
            outbox_ports::KeyHead {
                head: MessageId::from_uuid(id),
                waiting,
                waiting_capped,
            }
        }))
    }

    /// The blocked ordering keys after `after`, at most `limit` (clamped by
    /// [`outbox_ports::page_limit`]): what [`outbox_ports::OutboxOperator::blocked_keys`]
    /// returns.
    pub(crate) async fn blocked_keys_page(
        &self,
        after: Option<String>,
        limit: u32,
    ) -> Result<Vec<outbox_ports::BlockedKey>, PortError> {
        let (sql, cursor) = self.blocked_statement(after);
        let mut tx = self.blocked_keys_tx().await?;
        let mut q = sqlx::query_as::<_, BlockedRow>(sqlx::AssertSqlSafe(sql))
            .bind(i64::from(outbox_ports::page_limit(limit)))
            .bind(blocked_count_limit());
        if let Some(k) = cursor {
            q = q.bind(k);
        }
        let rows = q
            .fetch_all(&mut *tx)
            .await
            .map_err(|e| port("blocked keys", e))?;
        tx.rollback().await.map_err(|e| port("blocked keys", e))?;
        rows.into_iter().map(BlockedRow::blocked_key).collect()
    }

    pub(super) fn blocked_statement(&self, after: Option<String>) -> (&str, Option<String>) {
        match after {
            Some(k) => (&self.sql.blocked_after, Some(k)),
            None => (&self.sql.blocked_first, None),
        }
    }

    /// A read-only transaction for a page of blocked keys, without bitmap scans:
    /// a bitmap index scan cannot stop early, so counting a key's waiting rows
    /// through one would read every index entry behind the head (a key's whole
    /// backlog) before the LIMIT applies; an index scan stops at the cap.
    pub(super) async fn blocked_keys_tx(
        &self,
    ) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, PortError> {
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(|e| port("blocked keys", e))?;
        sqlx::query("SET LOCAL enable_bitmapscan = off")
            .execute(&mut *tx)
            .await
            .map_err(|e| port("blocked keys", e))?;
        Ok(tx)
    }
}

/// The LIMIT of a blocked key's waiting count: one past the cap, so a count above
/// the cap is told apart from one at it.
pub(super) fn blocked_count_limit() -> i64 {
    i64::try_from(outbox_ports::BLOCKED_WAITING_CAP + 1).unwrap_or(i64::MAX)
}

/// A waiting count read with [`blocked_count_limit`], as (count up to the cap,
/// whether it passed the cap).
fn waiting(behind: i64) -> (u64, bool) {
    let cap = outbox_ports::BLOCKED_WAITING_CAP;
    let behind = count(behind);
    (behind.min(cap), behind > cap)
}

/// A row of the blocked keys' statement.
#[derive(sqlx::FromRow)]
struct BlockedRow {
    key: String,
    id: uuid::Uuid,
    status: String,
    attempts: i32,
    last_error: Option<String>,
    next_attempt_at: Option<time::OffsetDateTime>,
    waiting: i64,
}

impl BlockedRow {
    fn blocked_key(self) -> Result<outbox_ports::BlockedKey, PortError> {
        let (waiting, waiting_capped) = waiting(self.waiting);
        Ok(outbox_ports::BlockedKey {
            key: self.key,
            head: MessageId::from_uuid(self.id),
            status: stored_status::<OutboxStatus>(&self.status)
                .map_err(|e| PortError::fatal("blocked keys", e))?,
            attempts: u32::try_from(self.attempts).unwrap_or(0),
            last_error: self.last_error,
            next_attempt_at: self.next_attempt_at,
            waiting,
            waiting_capped,
        })
    }
}
