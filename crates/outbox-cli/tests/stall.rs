//! A relay blocked inside PostgreSQL: another session holds the row locks of a
//! batch the relay is marking. Each statement waits a bounded time and is tried
//! again; readiness fails (503, the reason in the body, `outbox_relay_stalled 1`)
//! within the bound, and clears by itself once the lock is gone; every message
//! ends sent, published once.
#![cfg(feature = "http")]

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use outbox_adapters_memory::{
    ExchangeKind, MemoryBroker, MemoryLock, MemorySweepState, MemoryThroughputLog,
};
use outbox_adapters_postgres::{
    PgOutboxStore, PgPool, PgSchema, SessionBounds, connect, connect_bounded, migrate,
};
use outbox_cli::http;
use outbox_core::{Message, OutboxStatus};
use outbox_ports::{
    OutboxOperator as _, OutboxStore, PortError, PublishOutcome, Publisher, SystemClock,
};
use outbox_relay::{CancellationToken, DispatcherConfig, RelayBuilder};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::Notify;

const QUEUE: &str = "stall.test";
const MESSAGES: usize = 20;

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

async fn database() -> Option<(PgPool, PgSchema, String)> {
    let url = outbox_testkit::services::TestUrls::from_env().pg;
    let pool = match connect(&url, 4, Duration::from_secs(5)).await {
        Ok(p) => p,
        Err(e) if in_ci() => panic!("PostgreSQL is required in CI: {e}"),
        Err(e) => {
            eprintln!("SKIPPED (not in CI): PostgreSQL unreachable: {e}");
            return None;
        }
    };
    let id = outbox_testkit::unique_key("stall").replace(['.', '-'], "_");
    let schema = PgSchema::new(&format!("st_{}", &id[id.len() - 20..])).expect("schema");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS {} CASCADE",
        schema.quoted()
    )))
    .execute(&pool)
    .await
    .expect("drop");
    migrate(&pool, &schema).await.expect("migrate");
    Some((pool, schema, url))
}

/// A store on a pool bounded as `outbox run` bounds it (statements 2 s, locks
/// 300 ms), and a memory broker with the test's queue bound.
async fn bounded_store_and_broker(
    url: &str,
    schema: &PgSchema,
) -> (Arc<PgOutboxStore>, MemoryBroker) {
    let bounded = connect_bounded(
        url,
        4,
        Duration::from_secs(5),
        &SessionBounds {
            statement_timeout: Some(Duration::from_secs(2)),
            lock_timeout: Some(Duration::from_millis(300)),
            ..SessionBounds::NONE
        },
    )
    .await
    .expect("bounded pool");
    let broker = MemoryBroker::new();
    broker.declare_exchange("contract", ExchangeKind::Topic);
    broker.declare_queue(QUEUE);
    broker.bind(QUEUE, "contract", "#");
    (
        Arc::new(PgOutboxStore::new(bounded, schema.clone())),
        broker,
    )
}

/// A relay on `store` with the stall watchdog at `stall_after`, and its HTTP
/// endpoints on a free port: (relay, server, port).
fn relay_with_readyz(
    store: Arc<dyn OutboxStore>,
    publisher: Arc<dyn Publisher>,
    stall_after: Duration,
    cancel: &CancellationToken,
) -> (
    outbox_relay::RelayHandles,
    tokio::task::JoinHandle<std::io::Result<()>>,
    u16,
) {
    let lock = Arc::new(MemoryLock::new());
    let relay = RelayBuilder::new(
        store.clone(),
        publisher.clone(),
        lock.clone(),
        Arc::new(MemorySweepState::new(Arc::new(SystemClock))),
    )
    .dispatch(DispatcherConfig {
        batch_size: 100,
        // Longer than any lock a test holds: no other claim may take the rows.
        lease_ttl: Duration::from_secs(30),
        idle_poll: Duration::from_millis(20),
        error_backoff: Duration::from_millis(100),
        ..DispatcherConfig::default()
    })
    .throughput(Arc::new(MemoryThroughputLog::new(Arc::new(SystemClock))))
    .stall_after(stall_after)
    .start(cancel);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let address = listener.local_addr().expect("address");
    drop(listener);
    let state = http::HttpState {
        store,
        publisher,
        lock,
        lock_probe_key: outbox_testkit::unique_key("stall.readyz"),
        counters: relay.counters.clone(),
        token: None,
        health: relay.health.clone(),
        progress: Some(relay.progress.clone()),
        pauses: None,
        exchanges: None,
    };
    let server = tokio::spawn(http::serve(address, state, cancel.clone()));
    (relay, server, address.port())
}

/// The memory broker, holding the first batch until `open` is notified, so that
/// the test can lock the rows of a batch claimed and not yet marked.
struct Gated {
    broker: MemoryBroker,
    claimed: Notify,
    open: Notify,
    first: std::sync::atomic::AtomicBool,
}

#[async_trait]
impl Publisher for Gated {
    async fn publish_within(&self, messages: &[Message], budget: Duration) -> Vec<PublishOutcome> {
        if !self.first.swap(true, std::sync::atomic::Ordering::SeqCst) {
            self.claimed.notify_one();
            self.open.notified().await;
        }
        self.broker.publish_within(messages, budget).await
    }

    async fn check(&self) -> Result<(), PortError> {
        self.broker.check().await
    }
}

/// `GET path` on 127.0.0.1:`port`: the status and the body.
async fn get(port: u16, path: &str) -> (u16, String) {
    // The server may not listen yet: status 0 then, as for no answer.
    let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return (0, "not listening".to_owned());
    };
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .expect("request");
    let mut text = String::new();
    s.read_to_string(&mut text).await.expect("response");
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_owned();
    (status, body)
}

/// Polls `/readyz` until its status is `want`, for at most `within`; the body.
async fn readyz_until(port: u16, want: u16, within: Duration) -> Result<String, String> {
    let started = Instant::now();
    loop {
        let (status, body) = get(port, "/readyz").await;
        if status == want {
            return Ok(body);
        }
        if started.elapsed() > within {
            return Err(format!("/readyz still {status} after {within:?}: {body}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn gauge(metrics: &str) -> Option<f64> {
    metrics
        .lines()
        .find(|l| l.starts_with("outbox_relay_stalled"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mark_behind_another_sessions_row_lock_fails_readiness_then_recovers_and_nothing_is_lost_or_doubled()
 {
    let Some((pool, schema, url)) = database().await else {
        return;
    };
    let (store, broker) = bounded_store_and_broker(&url, &schema).await;
    let messages = outbox_testkit::messages(MESSAGES);
    store.enqueue(messages.clone()).await.expect("enqueue");
    let gated = Arc::new(Gated {
        broker: broker.clone(),
        claimed: Notify::new(),
        open: Notify::new(),
        first: false.into(),
    });
    let publisher: Arc<dyn Publisher> = gated.clone();
    let cancel = CancellationToken::new();
    let stall_after = Duration::from_secs(1);
    let (relay, server, port) = relay_with_readyz(store.clone(), publisher, stall_after, &cancel);
    readyz_until(port, 200, Duration::from_secs(5))
        .await
        .expect("ready at start");

    // The batch is claimed and being published: another session locks its rows,
    // as an operator's `SELECT ... FOR UPDATE` in a forgotten transaction would.
    tokio::time::timeout(Duration::from_secs(10), gated.claimed.notified())
        .await
        .expect("the relay claims the batch");
    let mut holder = pool.begin().await.expect("begin");
    let locked: Vec<sqlx::types::Uuid> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT id FROM {}.outbox_messages ORDER BY seq FOR UPDATE",
        schema.quoted()
    )))
    .fetch_all(&mut *holder)
    .await
    .expect("row locks");
    assert_eq!(locked.len(), MESSAGES);
    let held_at = Instant::now();
    gated.open.notify_one();

    // Readiness fails within the bound: stall_after after the last completed
    // claim, plus the watchdog's tick and a margin for this loaded machine.
    let body = readyz_until(port, 503, stall_after + Duration::from_secs(4))
        .await
        .expect("readiness fails while the mark waits");
    assert!(
        body.contains("progress: stalled"),
        "the reason is in the body: {body}"
    );
    assert!(
        body.contains("store: ok"),
        "the store still answers: {body}"
    );
    let (_, metrics) = get(port, "/metrics").await;
    assert_eq!(gauge(&metrics), Some(1.0), "{metrics}");
    // Held a while longer: still red, and nothing marked meanwhile.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(get(port, "/readyz").await.0, 503);
    assert_eq!(
        store.stats().await.expect("stats").pending,
        MESSAGES as u64,
        "nothing is marked while the lock is held"
    );
    eprintln!("red after {:?} of the lock", held_at.elapsed());

    holder.rollback().await.expect("release the locks");
    readyz_until(port, 200, Duration::from_secs(10))
        .await
        .expect("readiness clears by itself once the mark goes through");
    let (_, metrics) = get(port, "/metrics").await;
    assert_eq!(gauge(&metrics), Some(0.0), "{metrics}");

    // Nothing lost: every message sent, no attempt spent beyond the one publish.
    let deadline = Instant::now() + Duration::from_secs(10);
    for m in &messages {
        loop {
            let r = store.get_message(m.id).await.expect("get").expect("row");
            if r.status == OutboxStatus::Sent {
                assert_eq!(r.publish.attempts, 1, "{}", m.id);
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{} is {:?}, not sent",
                m.id,
                r.status
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    cancel.cancel();
    relay.join().await;
    let _ = server.await;
    // Nothing doubled: each message reached the broker once.
    assert_eq!(broker.confirmed(), MESSAGES as u64);
    assert_eq!(broker.queue_depth(QUEUE).0, MESSAGES);
}

/// Rows that are due but locked by another session before any relay claims them:
/// the relay's claims skip them and come back empty, quickly and without error.
/// An empty claim is no progress while the store says work is due, so readiness
/// fails within the bound (it stayed green before: every empty claim counted as
/// progress), clears once the lock is gone, and every message is then sent once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn due_rows_another_session_keeps_locked_fail_readiness_though_every_claim_answers() {
    let Some((pool, schema, url)) = database().await else {
        return;
    };
    let (store, broker) = bounded_store_and_broker(&url, &schema).await;
    let messages = outbox_testkit::messages(MESSAGES);
    store.enqueue(messages.clone()).await.expect("enqueue");
    let mut holder = pool.begin().await.expect("begin");
    let locked: Vec<sqlx::types::Uuid> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT id FROM {}.outbox_messages ORDER BY seq FOR UPDATE",
        schema.quoted()
    )))
    .fetch_all(&mut *holder)
    .await
    .expect("row locks");
    assert_eq!(locked.len(), MESSAGES);

    let publisher: Arc<dyn Publisher> = Arc::new(broker.clone());
    let cancel = CancellationToken::new();
    let stall_after = Duration::from_secs(1);
    let (relay, server, port) = relay_with_readyz(store.clone(), publisher, stall_after, &cancel);

    let body = readyz_until(port, 503, stall_after + Duration::from_secs(4))
        .await
        .expect("readiness fails while every due row is locked elsewhere");
    assert!(
        body.contains("progress: stalled"),
        "the reason is in the body: {body}"
    );
    assert_eq!(broker.confirmed(), 0, "nothing could be claimed meanwhile");

    holder.rollback().await.expect("release the locks");
    readyz_until(port, 200, Duration::from_secs(10))
        .await
        .expect("readiness clears once the rows can be claimed");
    let deadline = Instant::now() + Duration::from_secs(10);
    while broker.confirmed() < MESSAGES as u64 {
        assert!(
            Instant::now() < deadline,
            "{} of {MESSAGES} sent",
            broker.confirmed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for m in &messages {
        let r = store.get_message(m.id).await.expect("get").expect("row");
        assert_eq!(r.status, OutboxStatus::Sent, "{}", m.id);
        assert_eq!(r.publish.attempts, 1, "{}", m.id);
    }
    cancel.cancel();
    relay.join().await;
    let _ = server.await;
    assert_eq!(broker.confirmed(), MESSAGES as u64, "nothing doubled");
    assert_eq!(broker.queue_depth(QUEUE).0, MESSAGES);
}
