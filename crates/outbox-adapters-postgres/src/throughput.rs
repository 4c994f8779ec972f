//! Per-minute totals on PostgreSQL: all exchanges' and consumers' together in
//! `outbox_throughput`, each one's in `outbox_throughput_named`.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::Timestamp;
use outbox_ports::{
    BucketCount, ChartWindow, MinuteCount, PortError, ThroughputKind, ThroughputLog,
    check_names_per_add,
};
use sqlx::PgPool;

use crate::PgSchema;
use crate::error::port;
use crate::rows::millis;

/// How long per-minute totals are kept.
const KEPT: &str = "1 day";
/// How long per-name minute rows are kept: the day chart and its first bucket.
/// (In minutes and hours, not days: a day in a zone with daylight saving time
/// is not always 24 hours.)
const NAMED_MINUTES_KEPT: &str = "1455 minutes";
/// How long per-name hour rows are kept: the week chart and its first bucket.
const NAMED_HOURS_KEPT: &str = "169 hours";

/// [`ThroughputLog`] on PostgreSQL: one row per kind and minute of the database's
/// clock, added to with an upsert.
#[derive(Debug, Clone)]
pub struct PgThroughputLog {
    pool: PgPool,
    add: String,
    forget: String,
    read: String,
    add_named: String,
    forget_named: String,
    read_named: String,
    totals_named: String,
    /// When this log last deleted old per-name rows (Unix seconds of its own clock):
    /// once a minute is enough, they age by the minute.
    named_forgotten_at: Arc<AtomicI64>,
}

/// The row length a window's buckets are summed from: minutes for the hour and
/// the day, hours for the week (a minute row is kept a day only).
const fn row_width(window: ChartWindow) -> i32 {
    match window {
        ChartWindow::Week => 3600,
        _ => 60,
    }
}

impl PgThroughputLog {
    /// A log on `pool` in the tables of `schema` (run [`crate::migrate`] first).
    #[must_use]
    pub fn new(pool: PgPool, schema: &PgSchema) -> Self {
        let t = format!("{}.outbox_throughput", schema.quoted());
        let named = format!("{}.outbox_throughput_named", schema.quoted());
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
            // Both rows of every name in one statement; names summed first (an
            // upsert cannot touch one row twice) and in one order, so concurrent
            // writers lock rows in the same order.
            add_named: format!(
                "INSERT INTO {n} (kind, name, width, start, count) \
                 SELECT $1, u.name, w.width, \
                        to_timestamp(floor(extract(epoch FROM now()) / w.width) * w.width), u.count \
                 FROM (SELECT name, sum(count)::bigint AS count \
                       FROM unnest($2::text[], $3::bigint[]) AS x(name, count) \
                       WHERE count > 0 GROUP BY name) u \
                 CROSS JOIN (VALUES (60), (3600)) AS w(width) \
                 ORDER BY u.name, w.width \
                 ON CONFLICT (kind, name, width, start) DO UPDATE SET count = {n}.count + EXCLUDED.count",
                n = named
            ),
            forget_named: format!(
                "DELETE FROM {named} WHERE (width = 60 AND start < now() - interval '{NAMED_MINUTES_KEPT}') \
                 OR (width = 3600 AND start < now() - interval '{NAMED_HOURS_KEPT}')"
            ),
            // Every bucket of the window by the database's clock, empty ones 0.
            read_named: format!(
                "WITH b AS (SELECT generate_series( \
                     to_timestamp(floor(extract(epoch FROM now()) / $3) * $3) - ($4 - 1) * $3 * interval '1 second', \
                     to_timestamp(floor(extract(epoch FROM now()) / $3) * $3), \
                     $3 * interval '1 second') AS start) \
                 SELECT b.start, COALESCE(sum(t.count), 0)::bigint FROM b \
                 LEFT JOIN {named} t ON t.kind = $1 AND t.name = $2 AND t.width = $5 \
                     AND t.start >= b.start AND t.start < b.start + $3 * interval '1 second' \
                 GROUP BY b.start ORDER BY b.start"
            ),
            // From hour rows where whole hours of the window have them, minute rows
            // before that (the day's first 45 minutes at most; the hour's window
            // has minutes only): a day reads about 24 + 45 rows a name, not 1,440.
            totals_named: format!(
                "WITH w AS (SELECT to_timestamp(floor(extract(epoch FROM now()) / $2) * $2) \
                     - ($3 - 1) * $2 * interval '1 second' AS since), \
                 h AS (SELECT since, CASE WHEN $4 THEN 'infinity'::timestamptz \
                     ELSE to_timestamp(ceil(extract(epoch FROM since) / 3600) * 3600) END AS hours_from FROM w) \
                 SELECT t.name, sum(t.count)::bigint FROM {named} t, h WHERE t.kind = $1 \
                 AND ((t.width = 3600 AND t.start >= h.hours_from) \
                   OR (t.width = 60 AND t.start >= h.since AND t.start < h.hours_from)) \
                 GROUP BY t.name HAVING sum(t.count) > 0 ORDER BY t.name"
            ),
            named_forgotten_at: Arc::new(AtomicI64::new(i64::MIN)),
        }
    }
}

#[async_trait]
impl ThroughputLog for PgThroughputLog {
    async fn add(&self, kind: ThroughputKind, count: u64) -> Result<(), PortError> {
        if count == 0 {
            return Ok(());
        }
        sqlx::query(sqlx::AssertSqlSafe(&*self.add))
            .bind(kind.as_str())
            .bind(i64::try_from(count).unwrap_or(i64::MAX))
            .execute(&self.pool)
            .await
            .map_err(|e| port("record throughput", e))?;
        // A few old rows at most (one a minute): the writers keep the table small.
        // Not this add's failure: the count is recorded (an error here would have
        // the caller add it again); old rows go next time.
        if let Err(e) = sqlx::query(sqlx::AssertSqlSafe(&*self.forget))
            .bind(kind.as_str())
            .execute(&self.pool)
            .await
        {
            tracing::warn!(error = %e, "old per-minute totals not deleted; trying again later");
        }
        Ok(())
    }

    async fn per_minute(
        &self,
        kind: ThroughputKind,
        window: Duration,
    ) -> Result<Vec<MinuteCount>, PortError> {
        let rows: Vec<(Timestamp, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(&*self.read))
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

    async fn add_named(
        &self,
        kind: ThroughputKind,
        counts: &[(String, u64)],
    ) -> Result<(), PortError> {
        check_names_per_add(counts.len())?;
        let (names, values): (Vec<&str>, Vec<i64>) = counts
            .iter()
            .filter(|(_, c)| *c > 0)
            .map(|(n, c)| (n.as_str(), i64::try_from(*c).unwrap_or(i64::MAX)))
            .unzip();
        if names.is_empty() {
            return Ok(());
        }
        sqlx::query(sqlx::AssertSqlSafe(&*self.add_named))
            .bind(kind.as_str())
            .bind(&names)
            .bind(&values)
            .execute(&self.pool)
            .await
            .map_err(|e| port("record throughput per name", e))?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        let last = self.named_forgotten_at.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= 60
            && self
                .named_forgotten_at
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            // Not this add's failure: the rows are recorded; old ones go next time.
            if let Err(e) = sqlx::query(sqlx::AssertSqlSafe(&*self.forget_named))
                .execute(&self.pool)
                .await
            {
                self.named_forgotten_at.store(last, Ordering::Relaxed);
                tracing::warn!(error = %e, "old per-name throughput not deleted; trying again later");
            }
        }
        Ok(())
    }

    async fn named_series(
        &self,
        kind: ThroughputKind,
        name: &str,
        window: ChartWindow,
    ) -> Result<Vec<BucketCount>, PortError> {
        let rows: Vec<(Timestamp, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(&*self.read_named))
            .bind(kind.as_str())
            .bind(name)
            .bind(window.bucket_seconds() as f64)
            .bind(window.buckets() as i32)
            .bind(row_width(window))
            .fetch_all(&self.pool)
            .await
            .map_err(|e| port("read throughput per name", e))?;
        Ok(rows
            .into_iter()
            .map(|(start, count)| BucketCount {
                start,
                count: u64::try_from(count).unwrap_or(0),
            })
            .collect())
    }

    async fn named_totals(
        &self,
        kind: ThroughputKind,
        window: ChartWindow,
    ) -> Result<Vec<(String, u64)>, PortError> {
        let rows: Vec<(String, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(&*self.totals_named))
            .bind(kind.as_str())
            .bind(window.bucket_seconds() as f64)
            .bind(window.buckets() as i32)
            .bind(window == ChartWindow::Hour)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| port("read throughput per name", e))?;
        Ok(rows
            .into_iter()
            .map(|(name, count)| (name, u64::try_from(count).unwrap_or(0)))
            .collect())
    }
}
