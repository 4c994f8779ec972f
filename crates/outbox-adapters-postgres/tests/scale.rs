//! Claims cost O(batch), not O(table): with 1,000,000 sent rows left by a mass update
//! and statistics not yet refreshed, the claim still reads the pending partial index.

mod common;

use std::time::{Duration, Instant};

use outbox_adapters_postgres::PgOutboxStore;
use outbox_ports::{Lease, OutboxStore};

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
async fn claims_stay_on_the_partial_index_with_a_million_sent_rows() {
    with_db!(|pool, schema| {
        let store = PgOutboxStore::new(pool.clone(), schema.clone());
        let t = format!("{}.outbox_messages", schema.quoted());
        let fill = |n: i64, status: &'static str| {
            let sql = format!(
                "INSERT INTO {t} (exchange, routing_key, payload, status, sent_at) \
                 SELECT 'scale', 'k', '\\x00'::bytea, $2, CASE WHEN $2 = 'sent' THEN now() END \
                 FROM generate_series(1, $1)"
            );
            let pool = pool.clone();
            async move {
                sqlx::query(&sql)
                    .bind(n)
                    .bind(status)
                    .execute(&pool)
                    .await
                    .expect("fill");
            }
        };
        fill(1_000, "sent").await;
        fill(1_000, "pending").await;
        sqlx::query(&format!("ANALYZE {t}"))
            .execute(&pool)
            .await
            .expect("analyze");
        let (_, small) = claim_times(&store, 500).await;

        // The situation that hurts: a million rows went from pending to sent in one mass
        // update, and neither VACUUM nor ANALYZE has run since.
        sqlx::query(&format!("ALTER TABLE {t} SET (autovacuum_enabled = false)"))
            .execute(&pool)
            .await
            .expect("no autovacuum");
        fill(1_000_000, "pending").await;
        sqlx::query(&format!("UPDATE {t} SET status = 'sent', sent_at = now() WHERE status = 'pending' AND seq > 2000"))
            .execute(&pool)
            .await
            .expect("mass update");
        let plan = store.explain_claim_pending(500).await.expect("explain");
        let (first, large) = claim_times(&store, 500).await;
        sqlx::query(&format!("ALTER TABLE {t} RESET (autovacuum_enabled)"))
            .execute(&pool)
            .await
            .expect("reset");

        eprintln!(
            "claim of 500, median of 7: {small:?} with 1,000 sent rows; {large:?} with 1,001,000 sent rows \
             and stale statistics (ratio {:.2}); first claim after the mass update: {first:?}",
            large.as_secs_f64() / small.as_secs_f64()
        );
        eprintln!("{plan}");
        assert!(
            plan.contains("outbox_pending"),
            "the claim does not use the pending partial index:\n{plan}"
        );
        assert!(
            !plan.contains("Seq Scan"),
            "the claim scans the table:\n{plan}"
        );
    });
}
