//! `claim_*` and `delayed_claim*`: one claim of 500 rows with few sent rows, behind
//! a million that went through the relay's marks, and beside delayed rows
//! (`crate::delayed`); then the admin service's reads over that table
//! (`crate::admin`).

use std::time::{Duration, Instant};

use outbox_adapters_postgres::PgOutboxStore;
use outbox_ports::Lease;
use outbox_ports::prelude::*;
use outbox_testkit::through::send_all_pending;

use crate::admin::AdminTimes;
use crate::bench::Bench;

/// Claim times in ms: median with few sent rows; first and median after a million
/// went through the relay's marks.
struct ClaimScale {
    small: f64,
    first: f64,
    large: f64,
    admin: AdminTimes,
}

impl Bench {
    /// (first, median) of seven claims of 500 rows, in ms.
    pub(crate) async fn claim_times(&self, store: &PgOutboxStore) -> anyhow::Result<(f64, f64)> {
        let mut times = Vec::new();
        for i in 0..7 {
            let lease = Lease::new(format!("claim#{i}"), Duration::from_secs(60));
            let t = Instant::now();
            let claimed = store.claim_pending(&lease, 500).await?;
            times.push(t.elapsed().as_secs_f64() * 1000.0);
            let ids: Vec<_> = claimed.iter().map(|c| c.message.id).collect();
            store.release(&lease, &ids).await?;
        }
        let first = times[0];
        times.sort_by(f64::total_cmp);
        Ok((first, times[times.len() / 2]))
    }

    /// Claim time with 1,000 pending rows behind 2,000 sent ones (vacuumed), then
    /// behind `rows` more that went through the relay's own path (pending, claimed,
    /// marked sent) with autovacuum off: the pending index keeps their dead entries
    /// in front of the live rows, as after a burst on a busy table.
    async fn claim_scale(&mut self, rows: i64) -> anyhow::Result<ClaimScale> {
        let schema = self.fresh_schema("bench_claim").await?;
        let t = format!("{}.outbox_messages", schema.quoted());
        let fill = |n: i64| {
            format!(
                "INSERT INTO {t} (exchange, routing_key, payload) \
                 SELECT 'x', 'k', '\\x00'::bytea FROM generate_series(1, {n})"
            )
        };
        let store = PgOutboxStore::new(self.pool.clone(), schema.clone());
        sqlx::query(sqlx::AssertSqlSafe(&*fill(2_000)))
            .execute(&self.pool)
            .await?;
        send_all_pending(&store, 1_000).await?;
        sqlx::query(sqlx::AssertSqlSafe(&*fill(1_000)))
            .execute(&self.pool)
            .await?;
        sqlx::query(sqlx::AssertSqlSafe(format!("VACUUM ANALYZE {t}")))
            .execute(&self.pool)
            .await?;
        let (_, small) = self.claim_times(&store).await?;
        send_all_pending(&store, 1_000).await?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "ALTER TABLE {t} SET (autovacuum_enabled = false)"
        )))
        .execute(&self.pool)
        .await?;
        sqlx::query(sqlx::AssertSqlSafe(&*fill(rows)))
            .execute(&self.pool)
            .await?;
        send_all_pending(&store, 10_000).await?;
        sqlx::query(sqlx::AssertSqlSafe(&*fill(1_000)))
            .execute(&self.pool)
            .await?;
        let (first, large) = self.claim_times(&store).await?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "ALTER TABLE {t} RESET (autovacuum_enabled)"
        )))
        .execute(&self.pool)
        .await?;
        // The admin figures are for the table as the migration keeps it (autovacuum
        // on): vacuumed once the burst is over. Before that, the partial indexes
        // still hold the burst's dead entries, and every count over them pays it
        // (as the first claim does).
        sqlx::query(sqlx::AssertSqlSafe(format!("VACUUM ANALYZE {t}")))
            .execute(&self.pool)
            .await?;
        let admin = self.admin_times(&schema, rows).await?;
        Ok(ClaimScale {
            small,
            first,
            large,
            admin,
        })
    }
}

/// Claim times with few and many sent rows and beside many delayed ones, then the
/// admin service's reads on the million-row table.
pub(crate) async fn record_claim_scale(b: &mut Bench, rows: i64) -> anyhow::Result<()> {
    let c = b.claim_scale(rows).await?;
    b.record("claim_1k_ms", c.small, "ms");
    b.record("claim_1m_first_ms", c.first, "ms");
    b.record("claim_1m_ms", c.large, "ms");
    b.record("claim_1m/claim_1k", c.large / c.small, "ratio");
    let delayed = b.delayed_claim(rows).await?;
    b.record("delayed_claim_ms", delayed, "ms");
    b.record("delayed_claim/claim_1k", delayed / c.small, "ratio");
    b.record("admin_list_first_ms", c.admin.list_first, "ms");
    b.record("admin_list_deep_ms", c.admin.list_deep, "ms");
    b.record("admin_list_sent_ms", c.admin.list_sent, "ms");
    b.record("admin_stats_ms", c.admin.stats, "ms");
    b.record("admin_stats_exact_charts_ms", c.admin.stats_exact, "ms");
    b.record("ui_overview_ms", c.admin.ui_overview, "ms");
    b.record("ui_messages_ms", c.admin.ui_messages, "ms");
    Ok(())
}
