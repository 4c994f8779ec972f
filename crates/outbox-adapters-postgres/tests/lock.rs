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
        sqlx::query(&format!(
            "SELECT 1 FROM {}.outbox_locks WHERE key = 'sweep' FOR UPDATE",
            schema.quoted()
        ))
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
