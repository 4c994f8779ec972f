//! A Redis that stops answering while a lease is held: the guard must give the lease
//! up before its TTL can run out on the server, even though the renewal never comes
//! back. Its own test binary, because `CLIENT PAUSE` stalls every client of the
//! server (the pause ends by itself after `PAUSE`, also if this test fails).

mod common;

use common::raw;

use std::time::Duration;

use deadpool_redis::redis;
use outbox_adapters_redis::RedisLock;
use outbox_ports::DistributedLock;
use outbox_testkit::unique_key;

const TTL: Duration = Duration::from_millis(1500);
const PAUSE: Duration = Duration::from_secs(4);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_that_never_answers_gives_the_lease_up_within_its_ttl() {
    with_redis!(|client| {
        let key = unique_key("paused");
        let lock = RedisLock::new(client.clone(), "paused");
        let acquired = tokio::time::Instant::now();
        let guard = lock
            .acquire(&key, TTL, Duration::ZERO)
            .await
            .expect("acquire")
            .expect("free");
        // Writes (and scripts, so the renewal) now wait until the pause ends.
        let millis = PAUSE.as_millis().to_string();
        raw(
            &common::url(),
            redis::cmd("CLIENT").arg("PAUSE").arg(&millis).arg("WRITE"),
        )
        .await;
        let mut held_until = acquired;
        while guard.is_held() && acquired.elapsed() < PAUSE {
            held_until = tokio::time::Instant::now();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        raw(&common::url(), redis::cmd("CLIENT").arg("UNPAUSE")).await;
        let held_for = held_until - acquired;
        assert!(
            held_for < TTL,
            "the guard said held for {held_for:?} with no renewal answered; the key could \
             have expired on the server after {TTL:?} and been taken by another instance"
        );
        assert!(
            held_for >= TTL / 3,
            "the lease was held until the first renewal was due ({held_for:?})"
        );
    });
}
