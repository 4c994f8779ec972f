//! Test harness: a client for `OUTBOX_TEST_REDIS_URL` (default: the local server).

#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use outbox_adapters_redis::RedisClient;
use outbox_core::config::redact_url;

pub const DEFAULT_URL: &str = "redis://127.0.0.1:6379/";

pub fn url() -> String {
    outbox_testkit::services::TestUrls::from_env().redis
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// A client whose server answers PING, or `None` outside CI (the test says it is
/// skipped). In CI an unreachable server fails the test, naming the URL tried.
pub async fn client() -> Option<RedisClient> {
    let url = url();
    let client = RedisClient::new(&url, 4, Duration::from_secs(2)).expect("valid test URL");
    match ping(&client).await {
        Ok(()) => Some(client),
        Err(e) if in_ci() => panic!(
            "Redis is required in CI and unreachable at {} (set OUTBOX_TEST_REDIS_URL): {e}",
            redact_url(&url)
        ),
        Err(e) => {
            eprintln!(
                "SKIPPED (not in CI): Redis unreachable at {} (set OUTBOX_TEST_REDIS_URL): {e}",
                redact_url(&url)
            );
            None
        }
    }
}

pub async fn ping(client: &RedisClient) -> Result<(), String> {
    use outbox_ports::SweepStateStore;
    outbox_adapters_redis::RedisSweepState::new(client.clone())
        .get("outbox-test:ping")
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Runs `$body` with a client, or reports the skip.
#[macro_export]
macro_rules! with_redis {
    (|$client:ident| $body:block) => {{
        let Some($client) = common::client().await else {
            return;
        };
        $body
    }};
}

/// Runs `cmd` on a connection of its own (outside the client under test).
pub async fn raw(url: &str, cmd: &mut deadpool_redis::redis::Cmd) -> deadpool_redis::redis::Value {
    let client = deadpool_redis::redis::Client::open(url).expect("url");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    cmd.query_async(&mut conn).await.expect("command")
}
