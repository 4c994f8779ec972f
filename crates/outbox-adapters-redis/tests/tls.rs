//! TLS to Redis (`rediss://`, a CA file), against the local server with a TLS port
//! opened at run time by the test itself ([`RedisTlsSetup`]: `CONFIG SET tls-*`,
//! then `tls-port`, beside the plain port, which keeps working). The port is closed
//! and the settings restored when each test ends, also when it fails, and at the
//! start of the next run if a run crashed. The tests share that port, so they run
//! one at a time.
//!
//! The server certificate names `IP:127.0.0.1` only; `localhost` is the wrong host
//! name.

use std::time::Duration;

use outbox_adapters_redis::{RedisClient, RedisLock, RedisTls};
use outbox_ports::{DistributedLock, SweepStateStore};
use outbox_testkit::services::{REDIS_ADDR, TestUrls, is_local};
use outbox_testkit::tls::{REDIS_TLS_PORT, RedisTlsSetup, TestPki, in_ci};
use outbox_testkit::unique_key;

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The PKI and the open TLS port, or `None` outside CI when it cannot be made (the
/// test says why). In CI it must be made.
fn tls() -> Option<(TestPki, RedisTlsSetup)> {
    let url = TestUrls::from_env().redis;
    let made = (|| {
        if !is_local(&url, REDIS_ADDR) {
            return Err(format!(
                "the test server is not the local one ({REDIS_ADDR}): its configuration cannot be changed"
            ));
        }
        let pki = TestPki::generate("redis")?;
        let (host, port) = REDIS_ADDR.split_once(':').unwrap_or(("127.0.0.1", "6379"));
        let setup = RedisTlsSetup::enable(host, port.parse().unwrap_or(6379), &pki)?;
        Ok((pki, setup))
    })();
    match made {
        Ok(made) => Some(made),
        Err(e) if in_ci() => panic!("Redis TLS setup failed: {e}"),
        Err(e) => {
            eprintln!("SKIPPED (not in CI): Redis TLS setup failed: {e}");
            None
        }
    }
}

fn client(host: &str, ca: &std::path::Path) -> RedisClient {
    let tls = RedisTls::from_ca_file(ca).expect("CA file");
    RedisClient::with_tls(
        &format!("rediss://{host}:{REDIS_TLS_PORT}/"),
        &tls,
        2,
        Duration::from_secs(5),
    )
    .expect("client")
}

/// One round trip through the adapter: the sweep state's read.
async fn read(client: &RedisClient) -> Result<(), String> {
    outbox_adapters_redis::RedisSweepState::new(client.clone())
        .get(&unique_key("tls"))
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

#[tokio::test]
async fn tls_redis_rediss_with_the_ca_works() {
    let _serial = SERIAL.lock().await;
    let Some((pki, _setup)) = tls() else { return };
    let client = client("127.0.0.1", &pki.ca);
    read(&client).await.expect("verified TLS connection");
    // The lock works over it too.
    let lock = RedisLock::new(client.clone(), "tls");
    let key = unique_key("tls-lock");
    let guard = lock
        .acquire(&key, Duration::from_secs(5), Duration::ZERO)
        .await
        .expect("acquire")
        .expect("free key");
    assert!(lock.is_locked(&key).await.expect("is_locked"));
    guard.release().await.expect("release");
}

#[tokio::test]
async fn tls_redis_wrong_ca_fails_naming_redis() {
    let _serial = SERIAL.lock().await;
    let Some((pki, _setup)) = tls() else { return };
    let e = read(&client("127.0.0.1", &pki.other_ca))
        .await
        .expect_err("a server certificate from another CA must be refused");
    eprintln!("wrong CA: {e}");
    assert!(e.contains("Redis at rediss://127.0.0.1"), "{e}");
    assert!(e.contains("UnknownIssuer"), "{e}");
    // No CA file: the system's roots do not know the test CA either.
    let plain = RedisClient::new(
        &format!("rediss://127.0.0.1:{REDIS_TLS_PORT}/"),
        1,
        Duration::from_secs(5),
    )
    .expect("client");
    let e = read(&plain).await.expect_err("system roots");
    assert!(e.contains("UnknownIssuer"), "{e}");
}

#[tokio::test]
async fn tls_redis_wrong_host_name_fails_naming_redis() {
    let _serial = SERIAL.lock().await;
    let Some((pki, _setup)) = tls() else { return };
    let e = read(&client("localhost", &pki.ca))
        .await
        .expect_err("a certificate for 127.0.0.1 must not pass for localhost");
    eprintln!("wrong host: {e}");
    assert!(e.contains("Redis at rediss://localhost"), "{e}");
    assert!(e.contains("not valid for name"), "{e}");
}

#[tokio::test]
async fn tls_redis_ca_file_checked_before_use() {
    let pki = match TestPki::generate("redis-files") {
        Ok(pki) => pki,
        Err(e) if in_ci() => panic!("{e}"),
        Err(e) => {
            eprintln!("SKIPPED (not in CI): {e}");
            return;
        }
    };
    let e = RedisTls::from_ca_file(&pki.server_key).expect_err("a key is no certificate");
    assert!(e.to_string().contains("holds no PEM certificate"), "{e}");
    let e = RedisTls::from_ca_file(std::path::Path::new("/nonexistent/ca.pem"))
        .expect_err("missing file");
    assert!(e.to_string().contains("/nonexistent/ca.pem"), "{e}");
    let tls = RedisTls::from_ca_file(&pki.ca).expect("CA");
    assert_eq!(format!("{tls:?}"), "RedisTls { ca: true }");
    let e = RedisClient::with_tls("redis://127.0.0.1:6379/", &tls, 1, Duration::from_secs(1))
        .expect_err("a CA with a plain URL");
    assert!(e.to_string().contains("not rediss://"), "{e}");
}
