//! Redis stopped and restarted while a lock is held. Its own test binary (cargo runs
//! test binaries one at a time) with one test, so nothing else needs Redis meanwhile;
//! Redis is started again even when the test fails.

mod common;

use std::time::Duration;

use outbox_adapters_redis::RedisLock;
use outbox_ports::DistributedLock;
use outbox_testkit::services::{self, REDIS_ADDR};
use outbox_testkit::unique_key;

#[tokio::test]
async fn a_redis_restart_during_a_hold_loses_the_lease_and_tokens_keep_growing() {
    // The same server however its URL is written (`redis://127.0.0.1:6379` with
    // no slash, `localhost`, ...): compared by scheme, host and port.
    if !services::same_server(&common::url(), common::DEFAULT_URL) {
        // Only the local server can be stopped and started by this test.
        assert!(
            std::env::var("CI").is_err(),
            "in CI the restart test needs the local Redis at {}",
            common::DEFAULT_URL
        );
        eprintln!("SKIPPED (not in CI): the restart test needs the local Redis");
        return;
    }
    with_redis!(|client| {
        let lock = RedisLock::new(client.clone(), "restart");
        let key = unique_key("restart");
        let ttl = Duration::from_millis(900);
        let guard = lock
            .acquire(&key, ttl, Duration::from_millis(100))
            .await
            .expect("acquire")
            .expect("free");
        let before = guard.fencing_token();

        // Started again when dropped, also if the test fails.
        let stopped = services::stop_redis();
        assert!(!services::answering(REDIS_ADDR), "Redis did not stop");

        match lock.acquire(&key, ttl, Duration::from_millis(200)).await {
            Err(e) => assert!(e.is_retryable(), "{e}"),
            Ok(got) => panic!(
                "acquired (or timed out: {}) while Redis was down",
                got.is_none()
            ),
        }
        tokio::time::sleep(ttl * 2).await;
        assert!(
            !guard.is_held(),
            "the holder must learn that its lease cannot be renewed"
        );

        assert!(stopped.restore(), "Redis did not come back");
        // Every key is gone (nothing kept on disk); tokens still grow.
        let after = lock
            .acquire(&key, ttl, Duration::from_secs(5))
            .await
            .expect("acquire after restart")
            .expect("free after restart");
        assert!(
            after.fencing_token() > before,
            "{} <= {before}",
            after.fencing_token()
        );
        after.release().await.expect("release");
    });
}
