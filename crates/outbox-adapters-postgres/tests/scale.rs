//! Claims cost O(batch), not O(table): a million rows went through the relay's own
//! path (pending, claimed, marked sent by the relay's marks) with autovacuum off, so
//! the pending partial index still holds a million dead entries in front of the live
//! pending rows and the statistics are stale. The claim must still read that index.

mod common;

use std::time::{Duration, Instant};

use outbox_adapters_postgres::PgOutboxStore;
use outbox_ports::Lease;
use outbox_ports::prelude::*;

/// (first claim, median of seven claims) of `batch` rows.
async fn claim_times(store: &PgOutboxStore, batch: u32) -> (Duration, Duration) {
    let mut times = Vec::new();
    for i in 0..7 {
        let lease = Lease::new(format!("bench{i}"), Duration::from_secs(60));
        let started = Instant::now();
        let claimed = store.claim_pending(&lease, batch).await.expect("claim");
        times.push(started.elapsed());
        assert_eq!(claimed.len(), batch as usize);
        let ids: Vec<_> = claimed.iter().map(|c| c.message.id).collect();
        store.release(&lease, &ids).await.expect("release");
    }
    let first = times[0];
    times.sort();
    (first, times[times.len() / 2])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_stay_on_the_partial_index_after_a_million_rows_went_through_the_relay() {
    with_db!(|pool, schema| {
        let store = PgOutboxStore::new(pool.clone(), schema.clone());
        let t = format!("{}.outbox_messages", schema.quoted());
        let fill_pending = |n: i64| {
            let sql = format!(
                "INSERT INTO {t} (exchange, routing_key, payload) \
                 SELECT 'scale', 'k', '\\x00'::bytea FROM generate_series(1, $1)"
            );
            let pool = pool.clone();
            async move {
                sqlx::query(sqlx::AssertSqlSafe(sql))
                    .bind(n)
                    .execute(&pool)
                    .await
                    .expect("fill");
            }
        };
        let count = |status: &'static str| {
            let sql = format!("SELECT count(*) FROM {t} WHERE status = $1");
            let pool = pool.clone();
            async move {
                sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql))
                    .bind(status)
                    .fetch_one(&pool)
                    .await
                    .expect("count")
            }
        };

        // Baseline: 1,000 rows sent through the relay's marks, 1,000 pending behind them.
        fill_pending(1_000).await;
        outbox_testkit::through::send_all_pending(&store, 1_000)
            .await
            .expect("send the first 1,000");
        fill_pending(1_000).await;
        sqlx::query(sqlx::AssertSqlSafe(format!("VACUUM ANALYZE {t}")))
            .execute(&pool)
            .await
            .expect("vacuum");
        let (_, small) = claim_times(&store, 500).await;
        let _ = outbox_testkit::through::send_all_pending(&store, 1_000)
            .await
            .expect("send the baseline's pending rows");

        // The situation that hurts: a million rows claimed and marked sent since the
        // last VACUUM and ANALYZE, then new pending rows behind them.
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "ALTER TABLE {t} SET (autovacuum_enabled = false)"
        )))
        .execute(&pool)
        .await
        .expect("no autovacuum");
        fill_pending(1_000_000).await;
        let started = Instant::now();
        let marked = outbox_testkit::through::send_all_pending(&store, 10_000)
            .await
            .expect("send a million through the relay's marks");
        let through = started.elapsed();
        fill_pending(1_000).await;
        let plan = store.explain_claim_pending(500).await.expect("explain");
        let (first, large) = claim_times(&store, 500).await;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "ALTER TABLE {t} RESET (autovacuum_enabled)"
        )))
        .execute(&pool)
        .await
        .expect("reset");

        assert_eq!(marked, 1_000_000, "every row went through the marks");
        assert_eq!(count("sent").await, 1_002_000);
        assert_eq!(count("pending").await, 1_000);
        eprintln!(
            "1,000,000 rows claimed and marked sent in {through:?}; claim of 500 with 1,000 pending rows: \
             median of 7 {small:?} with 2,000 sent rows (vacuumed); after a million more went through the \
             relay's marks with autovacuum off: first claim {first:?}, median of 7 {large:?} (ratio {:.2})",
            large.as_secs_f64() / small.as_secs_f64()
        );
        eprintln!("{plan}");
        assert!(
            plan.contains("outbox_pending_unkeyed"),
            "the claim does not use the pending partial index:\n{plan}"
        );
        assert!(
            // (The pauses, a few rows read once per claim, may be read whole.)
            !plan.contains("Seq Scan on outbox_messages"),
            "the claim scans the table:\n{plan}"
        );
    });
}
