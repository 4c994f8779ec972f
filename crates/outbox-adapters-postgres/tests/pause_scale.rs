//! A paused exchange's backlog costs the relays nothing (issue 47): with 100,000
//! rows of a paused exchange in the table (half written before the pause, half
//! committed into the paused exchange, immediate, delayed and due, failed and due
//! for a retry, keyed), a claim of pending rows, a claim of retries and an idle
//! relay's work check read a bounded number of rows and buffers, never the paused
//! rows; a paused keyed head still holds its key; and a resume lets the backlog
//! flow again.

mod common;

use common::rows_visited;

use std::time::Duration;

use outbox_adapters_postgres::{PgOutboxStore, PgPauses};
use outbox_ports::prelude::*;
use outbox_ports::{Lease, PauseKind, PauseStore};

/// The most buffers (shared, hit or read) one node of an `EXPLAIN (ANALYZE,
/// BUFFERS)` text reports: the root's, which counts its children's. Planning's
/// (the catalogs, cached or not) are not the statement's.
fn buffers(plan: &str) -> u64 {
    plan.lines()
        .take_while(|l| !l.starts_with("Planning"))
        .filter_map(|l| l.split("Buffers: shared ").nth(1))
        .map(|b| {
            b.split([' ', ','])
                .filter_map(|part| part.split_once('='))
                .filter(|(what, _)| *what == "hit" || *what == "read")
                .filter_map(|(_, n)| n.parse::<u64>().ok())
                .sum::<u64>()
        })
        .max()
        .unwrap_or(0)
}

/// At most this many rows visited and buffers read by one claim or work check,
/// whatever the paused backlog (before issue 47's fix, 100,000 rows and more
/// than 3,000 buffers).
const MOST_ROWS: u64 = 1_000;
const MOST_BUFFERS: u64 = 600;

fn assert_bounded(what: &str, plan: &str) {
    let (rows, bufs) = (rows_visited(plan), buffers(plan));
    eprintln!("{what}: {rows} rows visited, {bufs} buffers");
    assert!(
        rows <= MOST_ROWS && bufs <= MOST_BUFFERS,
        "{what} read {rows} rows and {bufs} buffers with 100,000 paused rows:\n{plan}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_backlog_of_100_000_rows_is_read_by_no_claim_nor_the_work_check() {
    with_db!(|pool, schema| {
        let store = PgOutboxStore::new(pool.clone(), schema.clone());
        let pauses = PgPauses::new(pool.clone(), &schema);
        let t = format!("{}.outbox_messages", schema.quoted());
        let fill = |exchange: &'static str, n: i64, extra: &'static str| {
            let (columns, values) = extra.split_once('|').unwrap_or(("", ""));
            let sql = format!(
                "INSERT INTO {t} (exchange, routing_key, payload{columns}) \
                 SELECT '{exchange}', 'k', '\\x00'::bytea{values} FROM generate_series(1, $1) i"
            );
            let pool = pool.clone();
            async move {
                sqlx::query(&sql)
                    .bind(n)
                    .execute(&pool)
                    .await
                    .expect("fill");
            }
        };
        let lease = |n: &str| Lease::new(format!("scale-{n}"), Duration::from_secs(60));

        // Half the immediate backlog written before the pause, the rest committed
        // into the paused exchange: 100,000 paused rows in all.
        fill("paused", 45_000, "").await;
        assert!(
            pauses
                .pause(PauseKind::Exchange, "paused", "test")
                .await
                .expect("pause")
        );
        fill("paused", 45_000, "").await;
        fill("paused", 3_000, ", not_before|, now() - interval '1 minute'").await;
        fill(
            "paused",
            3_000,
            ", status, attempts, next_attempt_at|, 'publish_failed', 1, now() - interval '1 minute'",
        )
        .await;
        // Keyed: 20 keys of 200 rows each, every head in the paused exchange.
        fill("paused", 4_000, ", ordering_key|, 'key-' || (i % 20)").await;
        // A key whose head is paused and whose next row is not: it waits too.
        fill("paused", 1, ", ordering_key|, 'mixed'").await;
        fill("open", 1, ", ordering_key|, 'mixed'").await;
        sqlx::query(&format!("VACUUM ANALYZE {t}"))
            .execute(&pool)
            .await
            .expect("vacuum");

        assert_eq!(
            store.pending_claimable().await.expect("work check"),
            Some(false),
            "only paused rows and a key held by a paused head"
        );
        assert_bounded(
            "work check",
            &store.explain_analyze_claimable().await.expect("explain"),
        );
        assert_bounded(
            "claim of pending rows",
            &store
                .explain_analyze_claim_pending(500)
                .await
                .expect("explain"),
        );
        assert_bounded(
            "claim of retries",
            &store
                .explain_analyze_claim_retries(500)
                .await
                .expect("explain"),
        );
        assert!(
            store
                .claim_pending(&lease("a"), 500)
                .await
                .expect("claim")
                .is_empty()
        );
        assert!(
            store
                .claim_due_retries(&lease("a"), 500)
                .await
                .expect("claim retries")
                .is_empty()
        );

        // Another exchange's rows behind the paused backlog: taken in one claim.
        fill("open", 100, "").await;
        assert_eq!(
            store.pending_claimable().await.expect("work check"),
            Some(true)
        );
        let claimed = store.claim_pending(&lease("b"), 500).await.expect("claim");
        assert_eq!(claimed.len(), 100);
        assert!(
            claimed
                .iter()
                .all(|c| c.message.exchange == "open" && c.message.ordering_key.is_none()),
            "the open exchange's unkeyed rows only (the mixed key's row waits behind its paused head)"
        );

        // Resumed: the backlog flows again, keyed heads included.
        assert!(
            pauses
                .resume(PauseKind::Exchange, "paused")
                .await
                .expect("resume")
        );
        assert_eq!(
            store.pending_claimable().await.expect("work check"),
            Some(true)
        );
        // Every immediate and due unkeyed row, and each key's head (20 keys and
        // the mixed one): no row stayed flagged.
        let claimed = store
            .claim_pending(&lease("c"), 100_000)
            .await
            .expect("claim");
        assert_eq!(claimed.len(), 90_000 + 3_000 + 21);
        assert!(claimed.iter().all(|c| c.message.exchange == "paused"));
        let retried = store
            .claim_due_retries(&lease("e"), 5_000)
            .await
            .expect("claim retries");
        assert_eq!(retried.len(), 3_000, "the failed rows, due");
    });
}
