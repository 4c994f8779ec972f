//! The distributed lock contract.

use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_ports::DistributedLock;

use crate::{LONG_TTL, unique_key};

const WAIT: Duration = Duration::from_millis(200);

/// While one guard holds a key, another acquisition waits and then gives up.
pub async fn one_holder_at_a_time(lock: Arc<dyn DistributedLock>) {
    let key = unique_key("lock");
    let first = lock
        .acquire(&key, LONG_TTL, WAIT)
        .await
        .expect("acquire")
        .expect("free");
    assert!(first.is_held());
    let started = Instant::now();
    let second = lock.acquire(&key, LONG_TTL, WAIT).await.expect("acquire");
    assert!(second.is_none(), "two holders at once");
    assert!(
        started.elapsed() >= WAIT - Duration::from_millis(20),
        "gave up before the wait"
    );
    let other = lock
        .acquire(&unique_key("lock"), LONG_TTL, WAIT)
        .await
        .expect("acquire");
    assert!(other.is_some(), "keys are independent");
    first.release().await.expect("release");
}

/// A released key is free at once, and a waiter gets it within its wait.
pub async fn release_lets_the_next_holder_in(lock: Arc<dyn DistributedLock>) {
    let key = unique_key("lock");
    let first = lock
        .acquire(&key, LONG_TTL, WAIT)
        .await
        .expect("acquire")
        .expect("free");
    let waiter = {
        let lock = Arc::clone(&lock);
        let key = key.clone();
        tokio::spawn(async move { lock.acquire(&key, LONG_TTL, Duration::from_secs(5)).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    first.release().await.expect("release");
    assert!(!first.is_held());
    first.release().await.expect("release is idempotent");
    let second = waiter
        .await
        .expect("task")
        .expect("acquire")
        .expect("got it after release");
    assert!(second.is_held());
    second.release().await.expect("release");
}

/// Every acquisition gets a larger fencing token.
pub async fn fencing_tokens_grow(lock: Arc<dyn DistributedLock>) {
    let key = unique_key("lock");
    let mut last = 0;
    for _ in 0..3 {
        let g = lock
            .acquire(&key, LONG_TTL, WAIT)
            .await
            .expect("acquire")
            .expect("free");
        assert!(g.fencing_token() > last, "token did not grow");
        last = g.fencing_token();
        g.release().await.expect("release");
    }
}

/// An operator can see whether a key is held: not before, while a guard holds it,
/// not after its release; other keys are not.
pub async fn whether_a_key_is_held_can_be_read(lock: Arc<dyn DistributedLock>) {
    let key = unique_key("lock");
    assert!(!lock.is_locked(&key).await.expect("read"), "free at first");
    let guard = lock
        .acquire(&key, LONG_TTL, WAIT)
        .await
        .expect("acquire")
        .expect("free");
    assert!(lock.is_locked(&key).await.expect("read"), "held");
    assert!(
        !lock.is_locked(&unique_key("lock")).await.expect("read"),
        "another key"
    );
    guard.release().await.expect("release");
    assert!(!lock.is_locked(&key).await.expect("read"), "released");
}
