//! A backlog of keyed messages costs a claim about what it takes: with 200,000
//! rows queued behind 100 ordering keys' heads (one key held back by a failing
//! head), a claim visits each key once and never the rows behind the heads; and
//! successive claims take turns over the keys. The operator's list of blocked
//! keys walks the keys the same way.

mod common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use outbox_adapters_postgres::PgOutboxStore;
use outbox_ports::Lease;
use outbox_ports::prelude::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_backlog_costs_a_claim_its_keys_not_its_rows() {
    with_db!(|pool, schema| {
        let store = PgOutboxStore::new(pool.clone(), schema.clone());
        let t = format!("{}.outbox_messages", schema.quoted());
        // 2,000 rounds of one message for each of 100 keys (interleaved, as real
        // traffic is), then 100 messages without a key.
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {t} (exchange, routing_key, payload, ordering_key) \
             SELECT 'scale', 'k', '\\x00'::bytea, 'key' || lpad((i % 100)::text, 3, '0') \
             FROM generate_series(0, 199999) i"
        )))
        .execute(&pool)
        .await
        .expect("fill keyed");
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {t} (exchange, routing_key, payload) \
             SELECT 'scale', 'k', '\\x00'::bytea FROM generate_series(1, 100)"
        )))
        .execute(&pool)
        .await
        .expect("fill unkeyed");
        // key000's head failed and waits for its retry: the key is held back.
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE {t} SET status = 'publish_failed', attempts = 1, \
             next_attempt_at = now() + interval '1 hour' \
             WHERE seq = (SELECT min(seq) FROM {t} WHERE ordering_key = 'key000')"
        )))
        .execute(&pool)
        .await
        .expect("fail a head");
        sqlx::query(sqlx::AssertSqlSafe(format!("VACUUM ANALYZE {t}")))
            .execute(&pool)
            .await
            .expect("vacuum");

        // The operator's list of blocked keys walks the keys too: one page finds
        // key000 among 100 keys without reading the 200,000 rows behind the heads
        // (its waiting count stops at the cap).
        let blocked = store.blocked_keys(None, 50).await.expect("blocked keys");
        assert_eq!(
            blocked
                .iter()
                .map(|k| (k.key.as_str(), k.waiting, k.waiting_capped))
                .collect::<Vec<_>>(),
            [("key000", outbox_ports::BLOCKED_WAITING_CAP, true)]
        );
        assert_eq!(store.stats().await.expect("stats").blocked_keys, 1);
        for (planner, p) in common::planners(&pool).await {
            let store = PgOutboxStore::new(p, schema.clone());
            let plan = store
                .explain_blocked_keys(None, 50)
                .await
                .expect("explain blocked keys");
            let visited = common::rows_visited(&plan);
            eprintln!("{planner}: blocked keys: {visited} rows visited\n{plan}");
            // A few probes for the one key with a failing row and the 1,001 entries
            // of the capped count. Walking all 100 keys (as a claim does) would read
            // about 1,500; counting key000's whole backlog, 1,999 more.
            assert!(
                visited <= 1_100,
                "{planner}: a page of blocked keys visited {visited} rows among 200,100:\n{plan}"
            );
            assert!(
                !plan.contains("Seq Scan"),
                "{planner}: the blocked keys' page scans the table:\n{plan}"
            );

            let plan = store
                .explain_analyze_claim_pending(1000)
                .await
                .expect("explain");
            eprintln!("{planner}:\n{plan}");
            let visited = common::rows_visited(&plan);
            assert!(
                visited <= 5_000,
                "{planner}: a claim visited {visited} rows for 199 claimable ones among 200,100:\n{plan}"
            );
            assert!(
                // (The pauses, a few rows read once per claim, may be read whole.)
                !plan.contains("Seq Scan on outbox_messages"),
                "{planner}: the claim scans the table:\n{plan}"
            );
        }

        let started = Instant::now();
        let lease = Lease::new("scale", Duration::from_secs(60));
        let claimed = store.claim_pending(&lease, 1000).await.expect("claim");
        let took = started.elapsed();
        let keys: HashSet<&str> = claimed
            .iter()
            .filter_map(|c| c.message.ordering_key.as_deref())
            .collect();
        assert_eq!(claimed.len(), 199, "99 heads and the 100 without a key");
        assert_eq!(keys.len(), 99, "one head per key");
        assert!(!keys.contains("key000"), "the held-back key");
        eprintln!("claim of 199 among 200,100 pending: {took:?}");

        // Turns: with the heads marked, claims of 10 walk on through the keys
        // instead of taking the first keys' next messages again.
        let ids: Vec<_> = claimed.iter().map(|c| c.message.id).collect();
        store.mark_sent(&lease, &ids).await.expect("mark");
        let mut seen = Vec::new();
        for _ in 0..3 {
            let lease = Lease::new("turns", Duration::from_secs(60));
            let batch = store.claim_pending(&lease, 10).await.expect("claim 10");
            let ids: Vec<_> = batch.iter().map(|c| c.message.id).collect();
            seen.extend(batch.iter().filter_map(|c| c.message.ordering_key.clone()));
            store.mark_sent(&lease, &ids).await.expect("mark 10");
        }
        let distinct: HashSet<&String> = seen.iter().collect();
        assert_eq!(
            (seen.len(), distinct.len()),
            (30, 30),
            "three claims of 10 take 30 different keys: {seen:?}"
        );
    });
}

/// The retry claim's key-head rule is one probe of outbox_ordered, whatever the
/// other keys hold: with 50,000 rows of one key ahead of it in seq order, a
/// failed head of another key due for its retry is claimed after a few reads, on
/// both sides of the planner's tie with a walk of the primary key (which reads
/// all 50,000 first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_claim_does_not_walk_another_keys_backlog() {
    with_db!(|pool, schema| {
        let store = PgOutboxStore::new(pool.clone(), schema.clone());
        let t = format!("{}.outbox_messages", schema.quoted());
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {t} (exchange, routing_key, payload, ordering_key) \
             SELECT 'scale', 'k', '\\x00'::bytea, 'big' FROM generate_series(1, 50000)"
        )))
        .execute(&pool)
        .await
        .expect("fill one key");
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {t} (exchange, routing_key, payload, ordering_key, status, attempts, next_attempt_at) \
             VALUES ('scale', 'k', '\\x00'::bytea, 'small', 'publish_failed', 1, now() - interval '1 second')"
        )))
        .execute(&pool)
        .await
        .expect("a failed head of another key");
        sqlx::query(sqlx::AssertSqlSafe(format!("VACUUM ANALYZE {t}")))
            .execute(&pool)
            .await
            .expect("vacuum");

        for (planner, p) in common::planners(&pool).await {
            let store = PgOutboxStore::new(p, schema.clone());
            let plan = store
                .explain_analyze_claim_retries(10)
                .await
                .expect("explain retry claim");
            eprintln!("{planner}:\n{plan}");
            let visited = common::rows_visited(&plan);
            assert!(
                visited < 100,
                "{planner}: a retry claim of one row visited {visited} rows beside 50,000 of another key:\n{plan}"
            );
        }
        let lease = Lease::new("retry", Duration::from_secs(60));
        let claimed = store
            .claim_due_retries(&lease, 10)
            .await
            .expect("claim retries");
        assert_eq!(
            claimed
                .iter()
                .map(|c| c.message.ordering_key.as_deref())
                .collect::<Vec<_>>(),
            [Some("small")]
        );
    });
}

/// With dead heads skipped (`ordering.on_dead = "skip"`), dead keyed rows stay in
/// the table until an operator acts, and a claim must not pay for them: with
/// 20,000 dead rows over 100 keys (half the keys hold only dead rows, the other
/// half one pending row behind their dead ones), a claim visits about the live
/// keys, not the dead rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skipped_dead_rows_cost_a_claim_nothing() {
    with_db!(|pool, schema| {
        let t = format!("{}.outbox_messages", schema.quoted());
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {t} (exchange, routing_key, payload, ordering_key, status, attempts) \
             SELECT 'scale', 'k', '\\x00'::bytea, 'key' || lpad((i % 100)::text, 3, '0'), 'dead', 5 \
             FROM generate_series(0, 19999) i"
        )))
        .execute(&pool)
        .await
        .expect("fill dead");
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {t} (exchange, routing_key, payload, ordering_key) \
             SELECT 'scale', 'k', '\\x00'::bytea, 'key' || lpad((i * 2)::text, 3, '0') \
             FROM generate_series(0, 49) i"
        )))
        .execute(&pool)
        .await
        .expect("fill live");
        sqlx::query(sqlx::AssertSqlSafe(format!("VACUUM ANALYZE {t}")))
            .execute(&pool)
            .await
            .expect("vacuum");

        for (planner, p) in common::planners(&pool).await {
            let store =
                PgOutboxStore::new(p, schema.clone()).with_dead_head(outbox_ports::DeadHead::Skip);
            let plan = store
                .explain_analyze_claim_pending(1000)
                .await
                .expect("explain");
            let visited = common::rows_visited(&plan);
            eprintln!("{planner}: {visited} rows visited\n{plan}");
            // Two probes for each of the 50 live keys and a few more; stepping
            // over the dead rows would visit 20,000.
            assert!(
                visited <= 1_000,
                "{planner}: a claim visited {visited} rows for 50 live keys beside 20,000 dead rows:\n{plan}"
            );
        }
        let store = PgOutboxStore::new(pool.clone(), schema.clone())
            .with_dead_head(outbox_ports::DeadHead::Skip);
        let lease = Lease::new("skip", Duration::from_secs(60));
        let claimed = store.claim_pending(&lease, 1000).await.expect("claim");
        assert_eq!(claimed.len(), 50, "each live key's one row");
        // Blocking on dead heads, the same table holds every key back.
        let blocking = PgOutboxStore::new(pool.clone(), schema.clone());
        let lease = Lease::new("block", Duration::from_secs(60));
        let ids: Vec<_> = claimed.iter().map(|c| c.message.id).collect();
        let first = Lease::new("skip", Duration::from_secs(60));
        assert_eq!(
            store.release(&first, &ids).await.expect("release"),
            50,
            "the skip claim's leases given back, so only the dead heads can hold the keys"
        );
        assert!(
            blocking
                .claim_pending(&lease, 1000)
                .await
                .expect("claim")
                .is_empty(),
            "dead heads block their keys"
        );
        assert_eq!(blocking.stats().await.expect("stats").blocked_keys, 100);
    });
}
