//! Per-minute totals on PostgreSQL (`outbox_throughput`).

use std::time::Duration;

use async_trait::async_trait;
use outbox_core::Timestamp;
use outbox_ports::{MinuteCount, PortError, ThroughputKind, ThroughputLog};
use sqlx::PgPool;

use crate::PgSchema;
use crate::error::port;
use crate::rows::millis;

/// How long per-minute totals are kept.
const KEPT: &str = "1 day";

/// [`ThroughputLog`] on PostgreSQL: one row per kind and minute of the database's
/// clock, added to with an upsert.
#[derive(Debug, Clone)]
pub struct PgThroughputLog {
    pool: PgPool,
    add: String,
    forget: String,
    read: String,
}

impl PgThroughputLog {
    /// A log on `pool` in the tables of `schema` (run [`crate::migrate`] first).
    #[must_use]
    pub fn new(pool: PgPool, schema: &PgSchema) -> Self {
        let t = format!("{}.outbox_throughput", schema.quoted());
        Self {
            pool,
            add: format!(
                "INSERT INTO {t} (kind, minute, count) VALUES ($1, date_trunc('minute', now()), $2) \
                 ON CONFLICT (kind, minute) DO UPDATE SET count = {t}.count + EXCLUDED.count"
            ),
            forget: format!(
                "DELETE FROM {t} WHERE kind = $1 AND minute < now() - interval '{KEPT}'"
            ),
            read: format!(
                "SELECT minute, count FROM {t} WHERE kind = $1 \
                 AND minute >= date_trunc('minute', now() - $2 * interval '1 millisecond') \
                 ORDER BY minute"
            ),
        }
    }
}

#[async_trait]
impl ThroughputLog for PgThroughputLog {
    async fn add(&self, kind: ThroughputKind, count: u64) -> Result<(), PortError> {
        if count == 0 {
            return Ok(());
        }
        sqlx::query(&self.add)
            .bind(kind.as_str())
            .bind(i64::try_from(count).unwrap_or(i64::MAX))
            .execute(&self.pool)
            .await
            .map_err(|e| port("record throughput", e))?;
        // A few old rows at most (one a minute): the writers keep the table small.
        sqlx::query(&self.forget)
            .bind(kind.as_str())
            .execute(&self.pool)
            .await
            .map_err(|e| port("forget old throughput", e))?;
        Ok(())
    }

    async fn per_minute(
        &self,
        kind: ThroughputKind,
        window: Duration,
    ) -> Result<Vec<MinuteCount>, PortError> {
        let rows: Vec<(Timestamp, i64)> = sqlx::query_as(&self.read)
            .bind(kind.as_str())
            .bind(millis(window))
            .fetch_all(&self.pool)
            .await
            .map_err(|e| port("read throughput", e))?;
        Ok(rows
            .into_iter()
            .map(|(minute, count)| MinuteCount {
                minute,
                count: u64::try_from(count).unwrap_or(0),
            })
            .collect())
    }
}
