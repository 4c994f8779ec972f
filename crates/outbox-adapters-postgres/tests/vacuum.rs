//! With autovacuum off for a table, the stores vacuum it themselves once its dead
//! rows pass autovacuum's threshold, and say when they may not.
//!
//! Each test switches autovacuum off for its own schema's table
//! (`autovacuum_enabled = false`), so the server's setting does not matter and
//! nothing outside the test's schema changes, but for one role made and dropped
//! again by `a_role_that_does_not_own_the_table_is_told_so`.

mod common;

use outbox_ports::InboxRetention as _;
use std::future::Future;
use std::str::FromStr;
use std::time::{Duration, Instant};

use outbox_adapters_postgres::{PgInboxStore, PgOutboxStore, PgPool, PgSchema};
use outbox_ports::{OutboxRetention, PortError, SpaceReclaim};

async fn exec(pool: &PgPool, sql: &str) {
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .execute(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

async fn vacuum_count(pool: &PgPool, schema: &PgSchema, table: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT coalesce(vacuum_count, 0) FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = $2",
    )
    .bind(schema.as_str())
    .bind(table)
    .fetch_one(pool)
    .await
    .expect("vacuum count")
}

/// Calls `reclaim` until it vacuums (the dead rows are counted by the server up to
/// about a second after the transaction that made them), at most 20 s.
async fn reclaim_until_vacuumed<F, Fut>(reclaim: F) -> (u64, u64)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<SpaceReclaim, PortError>>,
{
    let start = Instant::now();
    loop {
        match reclaim().await.expect("reclaim") {
            SpaceReclaim::Reclaimed { dead, left } => return (dead, left),
            SpaceReclaim::NotYet { .. } if start.elapsed() < Duration::from_secs(20) => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            other => panic!("not vacuumed after {:?}: {other:?}", start.elapsed()),
        }
    }
}

/// Below the threshold nothing happens; past it the table is vacuumed (the
/// server's own count of vacuums goes up, its dead rows go to zero) and the next
/// check finds nothing to do.
async fn vacuumed_past_the_threshold<F, Fut>(
    pool: &PgPool,
    schema: &PgSchema,
    table: &str,
    fill: &str,
    reclaim: F,
) where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<SpaceReclaim, PortError>>,
{
    let t = format!("{}.{table}", schema.quoted());
    exec(
        pool,
        &format!("ALTER TABLE {t} SET (autovacuum_enabled = false)"),
    )
    .await;
    exec(pool, fill).await;
    let before = reclaim().await.expect("reclaim");
    assert!(
        matches!(before, SpaceReclaim::NotYet { dead: 0, .. }),
        "only inserted, nothing dead: {before:?}"
    );
    assert_eq!(vacuum_count(pool, schema, table).await, 0);
    // 2,000 dead row versions, over the threshold: 50 + the migration's 1 % of
    // the live rows (none counted yet: the table was never analyzed).
    exec(pool, &format!("UPDATE {t} SET created_at = created_at")).await;
    let (dead, left) = reclaim_until_vacuumed(&reclaim).await;
    assert!(dead >= 2000, "counted {dead} dead rows of 2,000");
    // Nothing in this binary keeps a snapshot open; a long transaction elsewhere
    // on the server would hold the rows back and fail this, as it makes a real
    // vacuum futile (which the relay then reports).
    assert!(
        left < dead / 2,
        "the vacuum left {left} of {dead} dead rows"
    );
    let start = Instant::now();
    while vacuum_count(pool, schema, table).await == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the server counts no vacuum of {t}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let after = reclaim().await.expect("reclaim");
    assert!(
        matches!(after, SpaceReclaim::NotYet { .. }),
        "dead rows over the threshold after the vacuum: {after:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outbox_table_is_vacuumed_when_autovacuum_is_off_for_it() {
    with_db!(|pool, schema| {
        let store = PgOutboxStore::new(pool.clone(), schema.clone());
        let fill = format!(
            "INSERT INTO {}.outbox_messages (id, exchange, routing_key, payload) \
             SELECT gen_random_uuid(), 'x', 'k', '\\x00'::bytea FROM generate_series(1, 2000)",
            schema.quoted()
        );
        vacuumed_past_the_threshold(&pool, &schema, "outbox_messages", &fill, || {
            store.reclaim_space()
        })
        .await;
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inbox_table_is_vacuumed_when_autovacuum_is_off_for_it() {
    with_db!(|pool, schema| {
        let inbox = PgInboxStore::new(pool.clone(), &schema);
        let fill = format!(
            "INSERT INTO {}.outbox_inbox (consumer, message_id, exchange, routing_key, payload, \
             created_at, status, consumed_at) \
             SELECT 'billing', gen_random_uuid(), 'x', 'k', '\\x00'::bytea, now(), 'consumed', now() \
             FROM generate_series(1, 2000)",
            schema.quoted()
        );
        vacuumed_past_the_threshold(&pool, &schema, "outbox_inbox", &fill, || {
            inbox.reclaim_space()
        })
        .await;
    });
}

/// With autovacuum on for the table, it is the server's: never vacuumed by us,
/// however much is dead. (Whether autovacuum is on for the server is its
/// configuration, read here, not changed.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_the_server_vacuums_is_left_to_it() {
    with_db!(|pool, schema| {
        let store = PgOutboxStore::new(pool.clone(), schema.clone());
        let t = format!("{}.outbox_messages", schema.quoted());
        exec(
            &pool,
            &format!("ALTER TABLE {t} SET (autovacuum_enabled = true)"),
        )
        .await;
        let server_on: bool = sqlx::query_scalar("SELECT current_setting('autovacuum')::bool")
            .fetch_one(&pool)
            .await
            .expect("setting");
        let r = store.reclaim_space().await.expect("reclaim");
        if server_on {
            assert_eq!(r, SpaceReclaim::ByTheStore);
        } else {
            // The table's own `true` cannot switch on what the server has off.
            assert!(matches!(r, SpaceReclaim::NotYet { .. }), "{r:?}");
        }
    });
}

/// A role that does not own the table may not vacuum it: the store says so instead
/// of pretending (PostgreSQL would only warn and skip it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_that_does_not_own_the_table_is_told_so() {
    with_db!(|pool, schema| {
        let role = "outbox_test_not_owner";
        exec(
            &pool,
            &format!(
                "DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{role}') \
                 THEN CREATE ROLE {role} LOGIN; END IF; END $$"
            ),
        )
        .await;
        exec(
            &pool,
            &format!("GRANT USAGE ON SCHEMA {} TO {role}", schema.quoted()),
        )
        .await;
        let t = format!("{}.outbox_messages", schema.quoted());
        exec(
            &pool,
            &format!("ALTER TABLE {t} SET (autovacuum_enabled = false)"),
        )
        .await;
        // In a task of its own, so the role is dropped again whatever happens.
        let checked = tokio::spawn({
            let (pool, schema) = (pool.clone(), schema.clone());
            async move {
                let options = sqlx::postgres::PgConnectOptions::from_str(&common::url())
                    .expect("url")
                    .username(role);
                let as_role = sqlx::postgres::PgPoolOptions::new()
                    .max_connections(1)
                    .connect_with(options)
                    .await
                    .expect("connect as the role");
                let store = PgOutboxStore::new(as_role.clone(), schema.clone());
                let r = store.reclaim_space().await.expect("reclaim");
                as_role.close().await;
                assert_eq!(r, SpaceReclaim::NotPermitted);
                assert_eq!(vacuum_count(&pool, &schema, "outbox_messages").await, 0);
            }
        })
        .await;
        // The role's grant goes with it; another run of this test at the same time
        // may still use it, so a failed drop is not this test's failure.
        let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
            "REVOKE USAGE ON SCHEMA {} FROM {role}",
            schema.quoted()
        )))
        .execute(&pool)
        .await;
        let _ = sqlx::query(sqlx::AssertSqlSafe(format!("DROP ROLE IF EXISTS {role}")))
            .execute(&pool)
            .await;
        if let Err(e) = checked {
            std::panic::resume_unwind(e.into_panic());
        }
    });
}

/// Gives table `t` its own vacuum threshold and scale factor, autovacuum off.
async fn own_vacuum_threshold(pool: &PgPool, t: &str, threshold: &str, scale_factor: &str) {
    exec(
        pool,
        &format!(
            "ALTER TABLE {t} SET (autovacuum_enabled = false, \
             autovacuum_vacuum_threshold = {threshold}, \
             autovacuum_vacuum_scale_factor = {scale_factor})"
        ),
    )
    .await;
}

/// The table's own threshold wins over the server's, as it does for autovacuum.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tables_own_threshold_wins() {
    with_db!(|pool, schema| {
        let store = PgOutboxStore::new(pool.clone(), schema.clone());
        let t = format!("{}.outbox_messages", schema.quoted());
        own_vacuum_threshold(&pool, &t, "123456", "0").await;
        let r = store.reclaim_space().await.expect("reclaim");
        assert_eq!(
            r,
            SpaceReclaim::NotYet {
                dead: 0,
                threshold: 123_456
            }
        );
    });
}

/// The table's own scale factor counts its live rows (as `reltuples` has them
/// after an `ANALYZE`), as it does for autovacuum: with 1,000 live rows and a
/// scale factor of 0.5, the threshold is 500, not the server's 0.2 of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tables_own_scale_factor_counts_its_live_rows() {
    with_db!(|pool, schema| {
        let store = PgOutboxStore::new(pool.clone(), schema.clone());
        let t = format!("{}.outbox_messages", schema.quoted());
        own_vacuum_threshold(&pool, &t, "0", "0.5").await;
        exec(
            &pool,
            &format!(
                "INSERT INTO {t} (exchange, routing_key, payload) \
                 SELECT 'x', 'k', '\\x00'::bytea FROM generate_series(1, 1000)"
            ),
        )
        .await;
        exec(&pool, &format!("ANALYZE {t}")).await;
        let r = store.reclaim_space().await.expect("reclaim");
        assert!(
            matches!(r, SpaceReclaim::NotYet { threshold: 500, .. }),
            "{r:?}"
        );
    });
}

/// A store on a pool whose statements are bounded far below what a vacuum takes
/// (`SessionBounds`, as `outbox run` builds its pools): the vacuum still runs to
/// its end. Before, `statement_timeout` cancelled it on every round and the table
/// was never vacuumed. And the pool's connections keep their bound afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_timeout_on_the_pool_does_not_cancel_the_vacuum() {
    with_db!(|pool, schema| {
        let bounded = outbox_adapters_postgres::connect_bounded(
            &common::url(),
            2,
            Duration::from_secs(5),
            &outbox_adapters_postgres::SessionBounds {
                statement_timeout: Some(Duration::from_millis(1)),
                ..outbox_adapters_postgres::SessionBounds::NONE
            },
        )
        .await
        .expect("bounded pool");
        let store = PgOutboxStore::new(bounded.clone(), schema.clone());
        let fill = format!(
            "INSERT INTO {}.outbox_messages (id, exchange, routing_key, payload) \
             SELECT gen_random_uuid(), 'x', 'k', '\\x00'::bytea FROM generate_series(1, 2000)",
            schema.quoted()
        );
        vacuumed_past_the_threshold(&pool, &schema, "outbox_messages", &fill, || {
            store.reclaim_space()
        })
        .await;
        let bound: String = sqlx::query_scalar("SELECT current_setting('statement_timeout')")
            .fetch_one(&bounded)
            .await
            .expect("a pooled connection's bound");
        assert_eq!(bound, "1ms", "the pool's connections keep their bound");
    });
}
