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
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO {t} (exchange, routing_key, payload{extra_cols}) \
                 SELECT 'x', 'k', decode(repeat('ab', 1024), 'hex'){extra_vals} \
                 FROM generate_series(1, 600) i"
            )))
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
        for fill in [
            // History, most of the table.
            "SELECT 'x', 'k', '\\x00'::bytea, 'sent', now(), NULL, NULL FROM generate_series(1, 100000)",
            // Pending without a key or due time.
            "SELECT 'x', 'k', '\\x00'::bytea, 'pending', NULL, NULL, NULL FROM generate_series(1, 20000)",
            // Delayed ones now due, keyed ones (50 keys of 4), failed ones.
            "SELECT 'x', 'k', '\\x00'::bytea, 'pending', NULL, now() - interval '1 minute', NULL \
             FROM generate_series(1, 10)",
            "SELECT 'x', 'k', '\\x00'::bytea, 'pending', NULL, NULL, 'key' || lpad((i % 50)::text, 2, '0') \
             FROM generate_series(0, 199) i",
            "SELECT 'x', 'k', '\\x00'::bytea, 'publish_failed', NULL, NULL, NULL FROM generate_series(1, 5)",
        ] {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO {t} (exchange, routing_key, payload, status, sent_at, not_before, ordering_key) {fill}"
            )))
            .execute(&pool)
            .await
            .expect("fill");
        }
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE {t} SET next_attempt_at = now() + interval '1 hour' WHERE status = 'publish_failed'"
        )))
        .execute(&pool)
        .await
        .expect("failed rows wait");
        // A live relay holding 5,000 rows, then one that vanished with 5 more.
        let alive = Lease::new("alive", Duration::from_secs(60));
        let held = store.claim_pending(&alive, 5000).await.expect("claim");
        assert_eq!(held.len(), 5000);
        let gone = Lease::new("gone", Duration::from_millis(50));
        assert_eq!(store.claim_pending(&gone, 5).await.expect("claim").len(), 5);
        // The vanished relay also held one row of each other pick: a due delayed
        // row, a key's head, a failed row being retried.
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE {t} SET locked_by = 'gone-too', locked_until = now() - interval '1 second' \
             WHERE seq IN ((SELECT min(seq) FROM {t} WHERE not_before IS NOT NULL), \
               (SELECT min(seq) FROM {t} WHERE ordering_key = 'key07'), \
               (SELECT min(seq) FROM {t} WHERE status = 'publish_failed'))"
        )))
        .execute(&pool)
        .await
        .expect("stale leases");
        // Statistics taken while thousands of rows are leased: the plan must not
        // turn to scanning the table for them.
        sqlx::query(sqlx::AssertSqlSafe(format!("VACUUM ANALYZE {t}")))
            .execute(&pool)
            .await
            .expect("vacuum");
        tokio::time::sleep(Duration::from_millis(150)).await;

        for (planner, p) in common::planners(&pool).await {
            let plan = PgOutboxStore::new(p, schema.clone())
                .explain_analyze_recover_expired_leases()
                .await
                .expect("explain");
            let visited = common::rows_visited(&plan);
            eprintln!("{planner}: {visited} rows visited\n{plan}");
            // The window of 10,000 rows at the front of each pick (counted twice
            // here: read, then filtered), and a probe of each of the few expired
            // ones; the whole table is 120,215 rows.
            assert!(
                visited <= 30_000,
                "{planner}: clearing expired leases visited {visited} rows of a table of 120,215:\n{plan}"
            );
        }
        assert_eq!(
            store.recover_expired_leases().await.expect("recover"),
            8,
            "the vanished relay's leases are cleared in every pick, the live ones kept"
        );
        assert_eq!(store.recover_expired_leases().await.expect("recover"), 0);
        // The live lease still holds its rows: its mark records them.
        let ids: Vec<_> = held.iter().map(|c| c.message.id).collect();
        assert_eq!(store.mark_sent(&alive, &ids).await.expect("mark"), 5000);
    });
}

/// A row whose lease ran out and that another relay claims while the clearing
/// runs keeps the new lease: the clearing re-tests the lease on the row's newest
/// version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clearing_expired_leases_keeps_a_lease_taken_meanwhile() {
    with_db!(|pool, schema| {
        let store = PgOutboxStore::new(pool.clone(), schema.clone());
        let t = format!("{}.outbox_messages", schema.quoted());
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {t} (exchange, routing_key, payload, locked_by, locked_until) \
             VALUES ('x', 'k', '\\x00'::bytea, 'gone', now() - interval '1 second')"
        )))
        .execute(&pool)
        .await
        .expect("a row with a lease that ran out");
        // Another relay's claim of it, not yet committed.
        let mut claim = pool.begin().await.expect("begin");
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE {t} SET locked_by = 'new', locked_until = now() + interval '1 hour'"
        )))
        .execute(&mut *claim)
        .await
        .expect("claim");
        let recovering = tokio::spawn({
            let store = store.clone();
            async move { store.recover_expired_leases().await }
        });
        // The clearing saw the old version and waits for the claim's row lock.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(
            !recovering.is_finished(),
            "the clearing waits for the claim"
        );
        claim.commit().await.expect("commit");
        let cleared = recovering.await.expect("join").expect("recover");
        assert_eq!(cleared, 0, "a lease taken meanwhile is not cleared");
        let holder: Option<String> =
            sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT locked_by FROM {t}")))
                .fetch_one(&pool)
                .await
                .expect("holder");
        assert_eq!(holder.as_deref(), Some("new"));
    });
}
