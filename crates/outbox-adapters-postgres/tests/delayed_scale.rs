//! Delayed messages cost the relay nothing while they wait: with 1,000,000 delayed
//! rows in the table, a claim reads the immediate and the due rows only (two
//! partial indexes, the delayed ones never visited), and the relay's timer finds
//! the next due time through one index entry.

mod common;

use common::most_rows_read_by_a_scan;

use std::time::{Duration, Instant};

use outbox_adapters_postgres::PgOutboxStore;
use outbox_ports::Lease;
use outbox_ports::prelude::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_million_delayed_rows_do_not_slow_the_claim() {
    with_db!(|pool, schema| {
        let store = PgOutboxStore::new(pool.clone(), schema.clone());
        let t = format!("{}.outbox_messages", schema.quoted());
        // 1,000,000 delayed for a day, inserted first (the lowest seqs, where a
        // claim walking by seq would meet them first), then 100 overdue delayed
        // and 400 immediate ones.
        for (n, due) in [
            (1_000_000_i64, "now() + interval '1 day'"),
            (100, "now() - interval '1 minute'"),
            (400, "NULL"),
        ] {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO {t} (exchange, routing_key, payload, not_before) \
                 SELECT 'scale', 'k', '\\x00'::bytea, {due} FROM generate_series(1, $1)"
            )))
            .bind(n)
            .execute(&pool)
            .await
            .expect("fill");
        }
        sqlx::query(sqlx::AssertSqlSafe(format!("VACUUM ANALYZE {t}")))
            .execute(&pool)
            .await
            .expect("vacuum");

        let plan = store
            .explain_analyze_claim_pending(1000)
            .await
            .expect("explain");
        eprintln!("{plan}");
        assert!(
            // (The pauses, a few rows read once per claim, may be read whole.)
            !plan.contains("Seq Scan on outbox_messages"),
            "the claim scans the table:\n{plan}"
        );
        assert!(
            plan.contains("outbox_pending_unkeyed") && plan.contains("outbox_scheduled"),
            "the claim reads the two partial indexes:\n{plan}"
        );
        let most = most_rows_read_by_a_scan(&plan);
        assert!(
            most <= 1000,
            "a claim read {most} rows in one scan; only 500 are due:\n{plan}"
        );

        let started = Instant::now();
        let claimed = store
            .claim_pending(&Lease::new("scale", Duration::from_secs(60)), 1000)
            .await
            .expect("claim");
        let took = started.elapsed();
        assert_eq!(claimed.len(), 500, "the due ones, none of the delayed");
        let started = Instant::now();
        let next = store.next_due_in().await.expect("next due");
        let next_took = started.elapsed();
        assert!(next.is_some_and(|left| left > Duration::ZERO));
        eprintln!(
            "claim of the 500 due among 1,000,500 pending: {took:?}; next_due_in: {next_took:?}"
        );
        let stats = store.stats().await.expect("stats");
        assert_eq!((stats.pending, stats.scheduled), (1_000_500, 1_000_100));
        // Every scrape: the oldest message waiting at once must not be looked for
        // among the delayed rows (a filter over them would remove a million).
        let plan = store.explain_stats().await.expect("explain stats");
        let most_removed = plan
            .lines()
            .filter_map(|l| l.split("Rows Removed by Filter: ").nth(1))
            .filter_map(|n| n.trim().parse::<u64>().ok())
            .max()
            .unwrap_or(0);
        assert!(
            most_removed < 1000,
            "the stats query filtered out {most_removed} rows:\n{plan}"
        );
    });
}
