//! `/readyz` behind a network that forwards nothing and closes nothing: the
//! relay's store check never hears back from PostgreSQL (the operating system gives
//! up on such a connection only after minutes), yet readiness answers within its
//! bound, naming the store, and the other checks still report.
#![cfg(feature = "http")]

use std::time::{Duration, Instant};

use outbox_adapters_memory::{MemoryBroker, MemoryLock};
use outbox_adapters_postgres::{PgOutboxStore, PgSchema, connect, migrate};
use outbox_cli::http::{self, READINESS_CHECK_TIMEOUT};
use outbox_testkit::proxy::{TcpProxy, host_port};

#[tokio::test]
async fn readiness_answers_in_time_when_the_store_never_does() {
    let url = outbox_testkit::services::TestUrls::from_env().pg;
    let direct = match connect(&url, 2, Duration::from_secs(5)).await {
        Ok(p) => p,
        Err(e) if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("PostgreSQL is required in CI: {e}")
        }
        Err(e) => {
            eprintln!("SKIPPED (not in CI): PostgreSQL unreachable: {e}");
            return;
        }
    };
    let id = outbox_testkit::unique_key("ready").replace(['.', '-'], "_");
    let schema = PgSchema::new(&format!("rd_{}", &id[id.len() - 20..])).expect("schema");
    migrate(&direct, &schema).await.expect("migrate");
    let proxy = TcpProxy::start(host_port(&url).expect("host:port"))
        .await
        .expect("proxy");
    // A pool that waits a minute for a connection (its ping, before a connection is
    // handed out, hangs too): without its own bound the check would wait as long.
    let pool = connect(&proxy.url_for(&url), 1, Duration::from_secs(60))
        .await
        .expect("through the proxy");
    let store = PgOutboxStore::new(pool, schema.clone());
    let broker = MemoryBroker::new();
    let lock = MemoryLock::new();
    let before = http::readiness(&store, &broker, &lock, "readiness.test").await;
    assert!(before.iter().all(|(_, r)| r.is_ok()), "{before:?}");

    proxy.stall();
    let started = Instant::now();
    let checks = tokio::time::timeout(
        READINESS_CHECK_TIMEOUT * 4,
        http::readiness(&store, &broker, &lock, "readiness.test"),
    )
    .await
    .expect("readiness answered");
    let took = started.elapsed();
    proxy.resume();
    assert!(
        took < READINESS_CHECK_TIMEOUT + Duration::from_secs(2),
        "answered after {took:?}"
    );
    let result = |name: &str| {
        checks
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, r)| r.clone())
            .expect("checked")
    };
    let store_error = result("store").expect_err("the store does not answer");
    assert!(store_error.contains("no answer within"), "{store_error}");
    assert!(
        result("broker").is_ok() && result("lock").is_ok(),
        "{checks:?}"
    );
    let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA {} CASCADE",
        schema.quoted()
    )))
    .execute(&direct)
    .await;
}
