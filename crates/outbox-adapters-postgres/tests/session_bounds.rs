//! Every statement of a bounded pool waits a bounded time (`SessionBounds`): a mark
//! that waits on another session's row lock fails as a retryable error, whether
//! the statement timeout or the lock timeout ends it; migrations are exempt.

mod common;

use std::time::Duration;

use outbox_adapters_postgres::{PgOutboxStore, PgPool, SessionBounds, connect_bounded, migrate};
use outbox_ports::prelude::*;
use outbox_ports::{Lease, OutboxStore};

async fn bounded(bounds: SessionBounds) -> PgPool {
    connect_bounded(&common::url(), 2, Duration::from_secs(5), &bounds)
        .await
        .expect("a bounded pool")
}

#[tokio::test]
async fn a_bounded_session_starts_with_its_timeouts_and_keepalives() {
    with_db!(|_pool, _schema| {
        let pool = bounded(SessionBounds {
            statement_timeout: Some(Duration::from_millis(1500)),
            lock_timeout: Some(Duration::from_micros(10)),
            keepalive_idle: Some(Duration::from_secs(30)),
            keepalive_interval: Some(Duration::from_millis(2500)),
            keepalive_count: Some(4),
        })
        .await;
        let shown: (String, String, String, String, String) = sqlx::query_as(
            "SELECT current_setting('statement_timeout'), current_setting('lock_timeout'), \
             current_setting('tcp_keepalives_idle'), current_setting('tcp_keepalives_interval'), \
             current_setting('tcp_keepalives_count')",
        )
        .fetch_one(&pool)
        .await
        .expect("settings");
        // A sub-millisecond bound is rounded up, never to 0 (which is "off"); the
        // keepalives are whole seconds, rounded up. Over TCP the server shows what
        // it applies; the keepalives of a Unix socket would show 0.
        assert_eq!(
            shown,
            (
                "1500ms".to_owned(),
                "1ms".to_owned(),
                "30".to_owned(),
                "3".to_owned(),
                "4".to_owned()
            )
        );
    });
}

/// Claims one message, then holds its row lock from another session, as an
/// operator's `SELECT ... FOR UPDATE` would, and marks it sent on `bounded`.
async fn mark_behind_a_row_lock(
    pool: &PgPool,
    schema: &outbox_adapters_postgres::PgSchema,
    bounded: PgPool,
) -> Result<u64, outbox_ports::PortError> {
    let store = PgOutboxStore::new(pool.clone(), schema.clone());
    let message = outbox_testkit::message("orders", "order.created");
    let id = message.id;
    store.enqueue(vec![message]).await.expect("enqueue");
    let lease = Lease::new(
        outbox_testkit::unique_key("bounded"),
        Duration::from_secs(60),
    );
    let claimed = store.claim_pending(&lease, 10).await.expect("claim");
    assert_eq!(claimed.len(), 1);
    let mut holder = pool.begin().await.expect("begin");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT 1 FROM {}.outbox_messages WHERE id = $1 FOR UPDATE",
        schema.quoted()
    )))
    .bind(id.as_uuid())
    .execute(&mut *holder)
    .await
    .expect("row lock");
    let started = std::time::Instant::now();
    let marked = PgOutboxStore::new(bounded, schema.clone())
        .mark_sent(&lease, &[id])
        .await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the mark waited {:?}",
        started.elapsed()
    );
    holder.rollback().await.expect("rollback");
    // Once the lock is gone the same mark goes through: nothing was spent on it.
    let again = store.mark_sent(&lease, &[id]).await.expect("mark again");
    assert_eq!(again, 1, "the row is still claimed, unmarked");
    marked
}

#[tokio::test]
async fn a_statement_cancelled_by_its_statement_timeout_is_retryable() {
    with_db!(|pool, schema| {
        let b = bounded(SessionBounds {
            statement_timeout: Some(Duration::from_millis(300)),
            ..SessionBounds::NONE
        })
        .await;
        let e = mark_behind_a_row_lock(&pool, &schema, b)
            .await
            .expect_err("the mark must time out");
        assert!(e.is_retryable(), "not retryable: {e}");
        assert!(e.to_string().contains("statement timeout"), "{e}");
    });
}

#[tokio::test]
async fn a_statement_refused_a_lock_by_its_lock_timeout_is_retryable() {
    with_db!(|pool, schema| {
        let b = bounded(SessionBounds {
            statement_timeout: Some(Duration::from_secs(10)),
            lock_timeout: Some(Duration::from_millis(200)),
            ..SessionBounds::NONE
        })
        .await;
        let e = mark_behind_a_row_lock(&pool, &schema, b)
            .await
            .expect_err("the mark must time out");
        assert!(e.is_retryable(), "not retryable: {e}");
        assert!(e.to_string().contains("lock timeout"), "{e}");
    });
}

#[tokio::test]
async fn migrations_are_exempt_from_the_bounds_and_leave_them_in_place() {
    with_db!(|pool, schema| {
        let b = bounded(SessionBounds {
            statement_timeout: Some(Duration::from_millis(200)),
            lock_timeout: Some(Duration::from_millis(100)),
            ..SessionBounds::NONE
        })
        .await;
        // Another session holds the migrations' table for longer than either bound.
        let mut holder = pool.begin().await.expect("begin");
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "LOCK TABLE {}._sqlx_migrations IN ACCESS EXCLUSIVE MODE",
            schema.quoted()
        )))
        .execute(&mut *holder)
        .await
        .expect("lock");
        let release = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(800)).await;
            holder.rollback().await.expect("rollback");
        });
        migrate(&b, &schema)
            .await
            .expect("a migration waits as long as it must");
        release.await.expect("released");
        // The pooled sessions keep their bounds afterwards.
        for _ in 0..2 {
            let t: String = sqlx::query_scalar("SELECT current_setting('statement_timeout')")
                .fetch_one(&b)
                .await
                .expect("setting");
            assert_eq!(t, "200ms");
        }
    });
}
