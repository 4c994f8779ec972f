//! The Redis lock and state beyond the shared contract: races, expiry and takeover,
//! owner-only release, lost leases, bad stored values, secrets.

mod common;

use common::raw;

use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::redis;
use outbox_adapters_redis::{RedisClient, RedisLock, RedisSweepState};
use outbox_core::{SweepReport, Timestamp};
use outbox_ports::{DistributedLock, StateWrite, SweepStateStore};
use outbox_testkit::unique_key;

// Renewal runs every TTL/3: 1.5 s leaves a loaded CI machine room before a live
// holder could miss its renewal.
const TTL: Duration = Duration::from_millis(1500);
const WAIT: Duration = Duration::from_millis(100);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_contenders_only_one_holds() {
    with_redis!(|client| {
        let key = unique_key("race");
        let (a, b) = (
            RedisLock::new(client.clone(), "a"),
            RedisLock::new(client.clone(), "b"),
        );
        let (ka, kb) = (key.clone(), key.clone());
        let ta = tokio::spawn(async move { a.acquire(&ka, TTL, Duration::ZERO).await });
        let tb = tokio::spawn(async move { b.acquire(&kb, TTL, Duration::ZERO).await });
        let ga = ta.await.expect("task").expect("acquire");
        let gb = tb.await.expect("task").expect("acquire");
        assert_eq!(
            ga.is_some() as u8 + gb.is_some() as u8,
            1,
            "exactly one holder"
        );
    });
}

#[tokio::test]
async fn a_holder_that_stops_renewing_is_taken_over_with_a_larger_token() {
    with_redis!(|client| {
        let key = unique_key("takeover");
        let lock = RedisLock::new(client.clone(), "test");
        let first = lock
            .acquire(&key, TTL, WAIT)
            .await
            .expect("acquire")
            .expect("free");
        let first_token = first.fencing_token();
        tokio::time::sleep(TTL * 2).await;
        assert!(
            first.is_held(),
            "renewal keeps a live holder's lease past its TTL"
        );
        assert!(
            lock.acquire(&key, TTL, WAIT)
                .await
                .expect("acquire")
                .is_none()
        );
        drop(first); // a holder that stops renewing (crashed, frozen)
        let second = lock
            .acquire(&key, TTL, TTL * 3)
            .await
            .expect("acquire")
            .expect("taken over after the lease ran out");
        assert!(second.fencing_token() > first_token);
        second.release().await.expect("release");
    });
}

#[tokio::test]
async fn release_by_a_non_owner_deletes_nothing_and_the_loser_is_told() {
    with_redis!(|client| {
        let url = common::url();
        let key = unique_key("owner");
        let lock = RedisLock::new(client.clone(), "test");
        let old = lock
            .acquire(&key, TTL, WAIT)
            .await
            .expect("acquire")
            .expect("free");
        // The old holder pauses past its lease: the key expires and a new holder comes.
        raw(&url, redis::cmd("DEL").arg(&key)).await;
        let new = lock
            .acquire(&key, TTL, WAIT)
            .await
            .expect("acquire")
            .expect("free again");
        assert!(new.fencing_token() > old.fencing_token());
        tokio::time::sleep(TTL).await;
        assert!(!old.is_held(), "the old holder learns it lost the lease");
        assert!(new.is_held());
        old.release().await.expect("release");
        let exists = raw(&url, redis::cmd("EXISTS").arg(&key)).await;
        assert_eq!(
            exists,
            redis::Value::Int(1),
            "the old holder's release deleted the new holder's key"
        );
        new.release().await.expect("release");
        assert_eq!(
            raw(&url, redis::cmd("EXISTS").arg(&key)).await,
            redis::Value::Int(0)
        );
    });
}

fn report(retried: u64) -> SweepReport {
    let at = Timestamp::from_unix_timestamp(1_700_000_000).expect("valid");
    SweepReport {
        started_at: at,
        completed_at: at,
        publish_retried: retried,
        publish_failed: 0,
        consume_retried: 0,
        consume_failed: 0,
    }
}

#[tokio::test]
async fn the_state_is_json_with_the_seeds_ttl_and_bad_values_read_as_absent() {
    with_redis!(|client| {
        let url = common::url();
        let state = RedisSweepState::new(client.clone());
        let key = unique_key("state");
        let seven_days = Duration::from_secs(7 * 86_400);
        assert_eq!(
            state
                .set(&key, &report(4), seven_days, 3)
                .await
                .expect("set"),
            StateWrite::Written
        );
        let redis::Value::BulkString(bytes) = raw(&url, redis::cmd("GET").arg(&key)).await else {
            panic!("not a string")
        };
        let json: serde_json::Value = serde_json::from_slice(&bytes).expect("stored as JSON");
        assert_eq!(json["publish_retried"], 4);
        assert_eq!(json["fencing_token"], 3);
        let redis::Value::Int(ttl_ms) = raw(&url, redis::cmd("PTTL").arg(&key)).await else {
            panic!("pttl")
        };
        assert!(
            ttl_ms > 6 * 86_400_000 && ttl_ms <= 7 * 86_400_000,
            "{ttl_ms}"
        );

        raw(&url, redis::cmd("SET").arg(&key).arg("{not json")).await;
        assert_eq!(
            state.get(&key).await.expect("get"),
            None,
            "undecodable is absent"
        );
        raw(&url, redis::cmd("DEL").arg(&key)).await;
        raw(&url, redis::cmd("HSET").arg(&key).arg("f").arg("v")).await;
        assert_eq!(
            state.get(&key).await.expect("get"),
            None,
            "a wrong type is absent"
        );
        raw(&url, redis::cmd("DEL").arg(&key)).await;
    });
}

#[tokio::test]
async fn a_password_never_shows_in_debug_or_errors() {
    let secret = "hunter2-not-the-real-one";
    let url = format!("redis://:{secret}@127.0.0.1:6379/");
    let client = RedisClient::new(&url, 1, Duration::from_secs(1)).expect("parses");
    let lock = RedisLock::new(client.clone(), "test");
    for shown in [
        format!("{client:?}"),
        format!("{lock:?}"),
        format!("{:?}", RedisSweepState::new(client.clone())),
    ] {
        assert!(!shown.contains(secret), "{shown}");
    }
    assert!(format!("{client:?}").contains("***"));
    // The local server has no password, so AUTH fails: the error says the
    // credentials were refused (not that Redis is unreachable), is not retryable,
    // and does not repeat the password.
    match lock.acquire(&unique_key("secret"), TTL, WAIT).await {
        Err(e) => {
            assert!(!e.to_string().contains(secret), "{e}");
            assert!(!format!("{e:?}").contains(secret), "{e:?}");
            assert!(e.to_string().contains("refused the credentials"), "{e}");
            assert!(!e.to_string().contains("unreachable"), "{e}");
            assert!(!e.is_retryable(), "{e}");
        }
        Ok(_) => panic!("a password the server does not have was accepted"),
    }
    let bad = format!("redis://:{secret}@[::1");
    let e = RedisClient::new(&bad, 1, Duration::from_secs(1)).expect_err("bad url");
    assert!(!e.to_string().contains(secret), "{e}");
}

#[tokio::test]
async fn an_unreachable_redis_is_an_error_not_a_lock() {
    let client =
        RedisClient::new("redis://127.0.0.1:1/", 1, Duration::from_millis(500)).expect("parses");
    let lock: Arc<dyn DistributedLock> = Arc::new(RedisLock::new(client, "test"));
    match lock.acquire("k", TTL, WAIT).await {
        Err(e) => {
            assert!(e.is_retryable(), "{e}");
            assert!(e.to_string().contains("127.0.0.1:1"), "{e}");
        }
        Ok(got) => panic!(
            "an unreachable Redis gave a lock (or a timeout: {})",
            got.is_none()
        ),
    }
}
