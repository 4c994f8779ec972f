//! The PostgreSQL lock gives up its claim before its lease can run out: when
//! renewals stop getting through, `is_held` turns false while the lease row is still
//! this holder's, never after another instance could have taken it.

mod common;

use std::time::Duration;

use outbox_adapters_postgres::PgLock;
use outbox_ports::DistributedLock;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_renewal_loses_the_lock_before_its_ttl_runs_out() {
    with_db!(|pool, schema| {
        let lock = PgLock::new(pool.clone(), &schema, "test");
        let ttl = Duration::from_millis(900);
        let before_acquire = tokio::time::Instant::now();
        let guard = lock
            .acquire("sweep", ttl, Duration::from_millis(100))
            .await
            .expect("acquire")
            .expect("free");
        // Another session holds the lock row before the first renewal (due at a
        // third of the TTL): every renewal now waits on its row lock, as behind a
        // stuck connection or a long-running transaction.
        let mut blocker = pool.begin().await.expect("begin");
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT 1 FROM {}.outbox_locks WHERE key = 'sweep' FOR UPDATE",
            schema.quoted()
        )))
        .execute(&mut *blocker)
        .await
        .expect("block the row");
        assert!(
            guard.is_held(),
            "held right after acquiring ({:?} in)",
            before_acquire.elapsed()
        );
        // The lease (written by the acquire, so after `before_acquire`) lasts at
        // least until before_acquire + ttl. The guard must have let go before then,
        // with a margin for the caller's next step.
        tokio::time::sleep_until(before_acquire + ttl - Duration::from_millis(100)).await;
        assert!(
            !guard.is_held(),
            "still held {:?} after acquiring with a {ttl:?} lease and no renewal through",
            before_acquire.elapsed()
        );
        blocker.rollback().await.expect("unblock");
        // A renewal that gets through late does not bring the claim back.
        tokio::time::sleep(ttl).await;
        assert!(!guard.is_held(), "a lost lock stays lost");
        guard.release().await.expect("release");
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_that_get_through_keep_the_lock_for_many_ttls() {
    with_db!(|pool, schema| {
        let lock = PgLock::new(pool.clone(), &schema, "test");
        let ttl = Duration::from_millis(900);
        let guard = lock
            .acquire("sweep", ttl, Duration::from_millis(100))
            .await
            .expect("acquire")
            .expect("free");
        for _ in 0..8 {
            tokio::time::sleep(ttl / 2).await;
            assert!(guard.is_held(), "renewed leases stay held");
        }
        assert!(
            lock.acquire("sweep", ttl, Duration::from_millis(50))
                .await
                .expect("acquire")
                .is_none()
        );
        guard.release().await.expect("release");
    });
}

/// Waits until a renewal of the lock row waits on the row lock `blocker` holds, then
/// terminates its connection: the renewal fails with an error. Panics if none comes
/// before `deadline`. `failed` holds the backends failed before (one may still be
/// listed while it exits); this one is added.
async fn fail_the_next_renewal(
    pool: &outbox_adapters_postgres::PgPool,
    blocker: &mut sqlx::PgConnection,
    deadline: tokio::time::Instant,
    failed: &mut Vec<i32>,
) {
    let blocker_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *blocker)
        .await
        .expect("blocker pid");
    loop {
        let waiting: Option<i32> = sqlx::query_scalar(
            "SELECT pid FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid)) \
             AND query LIKE 'UPDATE %outbox_locks%' AND pid <> ALL($2) LIMIT 1",
        )
        .bind(blocker_pid)
        .bind(&*failed)
        .fetch_optional(pool)
        .await
        .expect("pg_stat_activity");
        if let Some(pid) = waiting {
            let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
                .bind(pid)
                .fetch_one(pool)
                .await
                .expect("terminate");
            assert!(killed, "terminate the renewal's connection");
            failed.push(pid);
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no renewal came in time"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_failed_renewals_in_a_row_do_not_lose_the_lock() {
    with_db!(|pool, schema| {
        let lock = PgLock::new(pool.clone(), &schema, "test");
        let ttl = Duration::from_millis(900);
        let before_acquire = tokio::time::Instant::now();
        let guard = lock
            .acquire("sweep", ttl, Duration::from_millis(100))
            .await
            .expect("acquire")
            .expect("free");
        // Renewals wait on the row, and each one that comes is failed (its
        // connection terminated): two short blips of the database.
        let mut blocker = pool.begin().await.expect("begin");
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT 1 FROM {}.outbox_locks WHERE key = 'sweep' FOR UPDATE",
            schema.quoted()
        )))
        .execute(&mut *blocker)
        .await
        .expect("block the row");
        // Both before the lease the acquisition proves is given up.
        let given_up = before_acquire + ttl - ttl / 4;
        let mut failed = Vec::new();
        fail_the_next_renewal(&pool, &mut blocker, given_up, &mut failed).await;
        fail_the_next_renewal(&pool, &mut blocker, given_up, &mut failed).await;
        blocker.rollback().await.expect("unblock");
        // The next try gets through before the lease must be given up, and
        // renewals go on as usual.
        for _ in 0..6 {
            assert!(
                guard.is_held(),
                "lost {:?} after acquiring, after two failed renewals",
                before_acquire.elapsed()
            );
            tokio::time::sleep(ttl / 4).await;
        }
        assert!(guard.is_held());
        guard.release().await.expect("release");
    });
}
