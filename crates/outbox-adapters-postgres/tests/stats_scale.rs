//! Health and metrics cost O(unsent rows), not O(table): with 1,000,000 sent rows,
//! the stats query that every `/metrics` scrape and `/readyz` check runs reads only
//! the partial indexes of the unsent statuses.

mod common;

use common::most_rows_read_by_a_scan;

use std::time::{Duration, Instant};

use outbox_adapters_postgres::PgOutboxStore;
use outbox_ports::OutboxStore;

/// (first call, median of seven calls) of `stats()`.
async fn stats_times(store: &PgOutboxStore) -> (Duration, Duration) {
    let mut times = Vec::new();
    for _ in 0..7 {
        let started = Instant::now();
        let s = store.stats().await.expect("stats");
        times.push(started.elapsed());
        assert_eq!((s.pending, s.publish_failed, s.dead), (100, 10, 5));
    }
    let first = times[0];
    times.sort();
    (first, times[times.len() / 2])
}

#[test]
fn the_plan_reader_finds_the_largest_scan() {
    let plan = "Aggregate  (cost=1..2 rows=1 width=8) (actual rows=1 loops=1)\n  ->  Bitmap Heap Scan on t  (cost=1..2 rows=1526 width=0) (actual rows=1000000 loops=1)\n        ->  Bitmap Index Scan on i  (cost=0..1 rows=1526 width=0) (actual rows=12 loops=1)";
    assert_eq!(most_rows_read_by_a_scan(plan), 1_000_000);
    assert_eq!(
        most_rows_read_by_a_scan("Result (actual rows=1 loops=1)"),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_read_only_unsent_rows_with_a_million_sent_rows() {
    with_db!(|pool, schema| {
        let store = PgOutboxStore::new(pool.clone(), schema.clone());
        let t = format!("{}.outbox_messages", schema.quoted());
        // Autovacuum as configured by the migration: what a live table sees.
        for (n, status) in [
            (1_000_000_i64, "sent"),
            (100, "pending"),
            (10, "publish_failed"),
            (5, "dead"),
        ] {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO {t} (exchange, routing_key, payload, status, sent_at, next_attempt_at) \
                 SELECT 'scale', 'k', '\\x00'::bytea, $2, \
                   CASE WHEN $2 = 'sent' THEN now() END, \
                   CASE WHEN $2 = 'publish_failed' THEN now() + interval '1 hour' END \
                 FROM generate_series(1, $1)"
            )))
            .bind(n)
            .bind(status)
            .execute(&pool)
            .await
            .expect("fill");
        }
        let (first, median) = stats_times(&store).await;
        let plan = store.explain_stats().await.expect("explain");
        eprintln!(
            "stats() with 1,000,000 sent and 115 unsent rows: first {first:?}, median of 7 {median:?}\n{plan}"
        );
        assert!(
            !plan.contains("Seq Scan"),
            "the stats query scans the table:\n{plan}"
        );
        let most = most_rows_read_by_a_scan(&plan);
        assert!(
            most <= 115,
            "the stats query reads {most} rows in one scan, more than the 115 unsent ones:\n{plan}"
        );
    });
}
