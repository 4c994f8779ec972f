//! A claim sets only a row's lease, and PostgreSQL writes that in place (a
//! heap-only tuple: no new index entry, nothing dead left for later claims' index
//! scans to step over); migration 20261214000001 made room for it. Without an
//! index on the lease columns, clearing the leases of vanished relays reads the
//! front of the backlog, never the whole table.

mod common;

use std::time::Duration;

use outbox_adapters_postgres::PgOutboxStore;
use outbox_ports::Lease;
use outbox_ports::prelude::*;
use sqlx::postgres::PgPoolOptions;

/// Updates of the table so far, and how many of them were heap-only, as the
/// statistics collector has them after this connection's counts are flushed.
async fn updates(conn: &sqlx::PgPool, t_name: &str, schema: &str) -> (i64, i64) {
    sqlx::query("SELECT pg_stat_force_next_flush()")
        .execute(conn)
        .await
        .expect("flush");
    sqlx::query("SELECT pg_stat_clear_snapshot()")
        .execute(conn)
        .await
        .expect("clear snapshot");
    sqlx::query_as(
        "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables \
         WHERE schemaname = $1 AND relname = $2",
    )
    .bind(schema)
    .bind(t_name)
    .fetch_one(conn)
    .await
    .expect("table statistics")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_rewrite_rows_in_place() {
    with_db!(|pool, schema| {
        let t = format!("{}.outbox_messages", schema.quoted());
        // Rows of 1 KiB as producers write them: without a key, with keys (one
        // row per key, so each is its key's head), and delayed ones now due.
        for (extra_cols, extra_vals) in [
            ("", ""),
            (", ordering_key", ", 'key' || i"),
            (", not_before", ", now() - interval '1 minute'"),
        ] {
            sqlx::query(&format!(
                "INSERT INTO {t} (exchange, routing_key, payload{extra_cols}) \
                 SELECT 'x', 'k', decode(repeat('ab', 1024), 'hex'){extra_vals} \
                 FROM generate_series(1, 600) i"
            ))
            .execute(&pool)
            .await
            .expect("fill");
        }
        // One connection: the claims' statistics are this backend's, flushed on
        // demand before they are read.
        let one = PgPoolOptions::new()
            .max_connections(1)
            .connect(&common::url())
            .await
            .expect("a pool of one connection");
        let store = PgOutboxStore::new(one.clone(), schema.clone());
        let (upd_before, hot_before) = updates(&one, "outbox_messages", schema.as_str()).await;
        let lease = Lease::new("in-place", Duration::from_secs(60));
        let mut claimed = 0;
        for _ in 0..3 {
            claimed += store
                .claim_pending(&lease, 1000)
                .await
                .expect("claim")
                .len() as i64;
        }
        assert_eq!(claimed, 1800, "every row claimed");
        let (upd_after, hot_after) = updates(&one, "outbox_messages", schema.as_str()).await;
        assert_eq!(upd_after - upd_before, claimed, "one update a claimed row");
        assert_eq!(
            hot_after - hot_before,
            claimed,
            "a claim must rewrite its rows in place (heap-only): {} of {claimed} were",
            hot_after - hot_before
        );
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clearing_expired_leases_reads_the_front_of_the_backlog() {
    with_db!(|pool, schema| {
        let store = PgOutboxStore::new(pool.clone(), schema.clone());
        let t = format!("{}.outbox_messages", schema.quoted());
        sqlx::query(&format!(
            "INSERT INTO {t} (exchange, routing_key, payload, status, sent_at) \
             SELECT 'x', 'k', '\\x00'::bytea, 'sent', now() FROM generate_series(1, 100000)"
        ))
        .execute(&pool)
        .await
        .expect("fill sent");
        sqlx::query(&format!(
            "INSERT INTO {t} (exchange, routing_key, payload) \
             SELECT 'x', 'k', '\\x00'::bytea FROM generate_series(1, 20000)"
        ))
        .execute(&pool)
        .await
        .expect("fill pending");
        sqlx::query(&format!("VACUUM ANALYZE {t}"))
            .execute(&pool)
            .await
            .expect("vacuum");
        // A relay that vanished with 5 rows claimed, and one alive with 3.
        let gone = Lease::new("gone", Duration::from_millis(50));
        assert_eq!(store.claim_pending(&gone, 5).await.expect("claim").len(), 5);
        let alive = Lease::new("alive", Duration::from_secs(60));
        let held = store.claim_pending(&alive, 3).await.expect("claim");
        assert_eq!(held.len(), 3);
        tokio::time::sleep(Duration::from_millis(150)).await;

        for (planner, p) in common::planners(&pool).await {
            let plan = PgOutboxStore::new(p, schema.clone())
                .explain_analyze_recover_expired_leases()
                .await
                .expect("explain");
            let visited = common::rows_visited(&plan);
            eprintln!("{planner}: {visited} rows visited\n{plan}");
            // The window of 10,000 rows at the front of each claim order, and one
            // probe of each of them; the whole table is 120,000 rows.
            assert!(
                visited <= 30_000,
                "{planner}: clearing expired leases visited {visited} rows of a table of 120,000:\n{plan}"
            );
        }
        assert_eq!(
            store.recover_expired_leases().await.expect("recover"),
            5,
            "the vanished relay's leases are cleared, the live ones kept"
        );
        assert_eq!(store.recover_expired_leases().await.expect("recover"), 0);
        // The live lease still holds its rows: its mark records them.
        let ids: Vec<_> = held.iter().map(|c| c.message.id).collect();
        assert_eq!(store.mark_sent(&alive, &ids).await.expect("mark"), 3);
    });
}
