//! Transactional handlers on the PostgreSQL inbox: effects exactly once despite
//! redeliveries, failures (rolled back, retried by the sweep task) and panics.
#![cfg(feature = "postgres")]

use outbox_ports::InboxOperator as _;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use async_trait::async_trait;
use outbox_adapters_memory::{ExchangeKind, MemoryBroker};
use outbox_adapters_postgres::{PgConnection, PgInboxStore, PgSchema, connect, migrate};
use outbox_consumer::{
    CancellationToken, ConsumerConfig, HandlerError, PgConsumerWorker, PgHandler,
    PgHandlerRegistry, SweepTask,
};
use outbox_core::{InboxStatus, Message, RetryPolicy};
use outbox_ports::{InboxConsumerPath, InboxStore, Publisher, SystemClock};

const QUEUE: &str = "pg-consumer.test";
const NAME: &str = "billing";

async fn database() -> Option<(outbox_adapters_postgres::PgPool, PgSchema)> {
    let url = outbox_testkit::services::TestUrls::from_env().pg;
    let pool = match connect(&url, 8, Duration::from_secs(5)).await {
        Ok(p) => p,
        Err(e) if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("PostgreSQL is required in CI and unreachable: {e}")
        }
        Err(e) => {
            eprintln!("SKIPPED (not in CI): {e}");
            return None;
        }
    };
    let id = outbox_testkit::unique_key("pgc").replace(['.', '-'], "_");
    let schema = PgSchema::new(&format!("pgc_{}", &id[id.len() - 20..])).expect("schema");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS {} CASCADE",
        schema.quoted()
    )))
    .execute(&pool)
    .await
    .expect("drop");
    migrate(&pool, &schema).await.expect("migrate");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {}.effects (message_id uuid NOT NULL)",
        schema.quoted()
    )))
    .execute(&pool)
    .await
    .expect("effects");
    Some((pool, schema))
}

/// Writes one effect row, then fails the first attempt of every tenth message (after
/// writing, to prove the rollback) and panics on the first attempt of message 7.
struct Billing {
    insert: String,
    attempts: std::sync::Mutex<std::collections::HashMap<outbox_core::MessageId, u32>>,
    poison: Option<outbox_core::MessageId>,
}

#[async_trait]
impl PgHandler for Billing {
    async fn handle(&self, conn: &mut PgConnection, m: &Message) -> Result<(), HandlerError> {
        let n = {
            let mut a = self.attempts.lock().expect("lock");
            let n = a.entry(m.id).or_default();
            *n += 1;
            *n
        };
        sqlx::query(sqlx::AssertSqlSafe(&*self.insert))
            .bind(m.id.as_uuid())
            .execute(&mut *conn)
            .await?;
        if Some(m.id) == self.poison {
            return Err("always fails".into());
        }
        let seq: u32 = String::from_utf8_lossy(&m.payload)
            .trim_matches(|c: char| !c.is_ascii_digit())
            .parse()
            .unwrap_or(0);
        if n == 1 && seq == 7 {
            panic!("boom on the first attempt");
        }
        if n == 1 && seq.is_multiple_of(10) {
            return Err("downstream not ready".into());
        }
        Ok(())
    }
}

fn broker() -> MemoryBroker {
    let b = MemoryBroker::new();
    b.declare_exchange("contract", ExchangeKind::Topic);
    b.declare_queue(QUEUE);
    b.bind(QUEUE, "contract", "#");
    b
}

fn config(max_attempts: u32) -> ConsumerConfig {
    ConsumerConfig {
        concurrency: 4,
        handler_timeout: Duration::from_secs(5),
        retry: RetryPolicy {
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(20),
            max_attempts,
        },
        store_error_backoff: Duration::from_millis(50),
        ..ConsumerConfig::new(NAME, QUEUE)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn effects_happen_exactly_once_despite_redeliveries_failures_and_panics() {
    let Some((pool, schema)) = database().await else {
        return;
    };
    let inbox = PgInboxStore::new(pool.clone(), &schema);
    let msgs: Vec<Message> = (0..100)
        .map(|i| {
            let mut m = outbox_testkit::message("contract", "order.created");
            m.payload = format!("{{\"seq\":{i}}}").into_bytes();
            m
        })
        .collect();
    let poison = msgs[33].id;
    let handler = Arc::new(Billing {
        insert: format!("INSERT INTO {}.effects VALUES ($1)", schema.quoted()),
        attempts: std::sync::Mutex::default(),
        poison: Some(poison),
    });
    let b = broker();
    b.redeliver_next_acked(20);
    assert!(b.publish(&msgs).await.iter().all(|o| o.is_confirmed()));
    let worker = PgConsumerWorker::new(
        inbox.clone(),
        Arc::new(b.clone()),
        PgHandlerRegistry::new().fallback(handler),
        Arc::new(SystemClock),
        config(3),
    );
    let counters = worker.counters();
    let retries = worker.retry_task();
    let cancel = CancellationToken::new();
    let running = tokio::spawn(worker.run(cancel.clone()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        retries.run_batch(50).await.expect("retry batch");
        let s = inbox.stats(NAME).await.expect("stats");
        if s.consumed == 99 && s.dead == 1 && b.queue_depth(QUEUE) == (0, 0) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "not settled: {s:?}");
    }
    cancel.cancel();
    running.await.expect("worker");

    let rows: Vec<(sqlx::types::Uuid, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT message_id, count(*) FROM {}.effects GROUP BY 1",
        schema.quoted()
    )))
    .fetch_all(&pool)
    .await
    .expect("effects");
    assert_eq!(
        rows.len(),
        99,
        "every message but the poison one took effect"
    );
    assert!(
        rows.iter().all(|(_, n)| *n == 1),
        "an effect happened twice"
    );
    assert!(
        rows.iter().all(|(id, _)| *id != *poison.as_uuid()),
        "the poison message's writes were rolled back"
    );
    let dead = inbox
        .get_delivery(NAME, poison)
        .await
        .expect("get")
        .expect("row");
    assert_eq!(dead.status, InboxStatus::Dead);
    assert_eq!(dead.consume.attempts, 3);
    assert_eq!(dead.consume.last_error.as_deref(), Some("always fails"));
    let panicked = inbox
        .get_delivery(NAME, msgs[7].id)
        .await
        .expect("get")
        .expect("row");
    assert_eq!(panicked.status, InboxStatus::Consumed);
    assert!(
        counters.duplicates.load(Ordering::Relaxed) >= 20,
        "redeliveries were absorbed"
    );
    drop_schema(&pool, &schema).await;
}

/// What a [`DbFaults`] handler does with a message, by its payload.
const SWALLOW: &[u8] = b"swallow";
const DEFERRED: &[u8] = b"deferred";
const FAIL_FIRST: &[u8] = b"fail-first";
const RECOVERS: &[u8] = b"recovers";
const NUL_ERROR: &[u8] = b"nul-error";
const ENDS_TX: &[u8] = b"ends-tx";

/// A handler that writes one effect row, and:
/// - `swallow`: first runs a statement that fails and ignores its error, as a handler
///   meaning to skip a unique violation would; the transaction is then aborted;
/// - `deferred`: writes a row twice into a table whose unique constraint is
///   `DEFERRABLE INITIALLY DEFERRED`, so the failure comes at COMMIT;
/// - `recovers`: runs a failing statement under a savepoint of its own and rolls back
///   to it, which leaves the transaction usable: it must commit;
/// - `fail-first`: fails its first attempt with an ordinary error, then as `deferred`
///   when the message id is in `deferred_on_retry`, else succeeds.
struct DbFaults {
    schema: PgSchema,
    attempts: std::sync::Mutex<std::collections::HashMap<outbox_core::MessageId, u32>>,
    deferred_on_retry: std::collections::HashSet<outbox_core::MessageId>,
}

impl DbFaults {
    fn new(schema: &PgSchema) -> Self {
        Self {
            schema: schema.clone(),
            attempts: std::sync::Mutex::default(),
            deferred_on_retry: std::collections::HashSet::new(),
        }
    }

    async fn deferred_violation(
        &self,
        conn: &mut PgConnection,
        m: &Message,
    ) -> Result<(), HandlerError> {
        for _ in 0..2 {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO {}.deferred_unique VALUES ($1)",
                self.schema.quoted()
            )))
            .bind(m.id.as_uuid())
            .execute(&mut *conn)
            .await?;
        }
        Ok(())
    }
}

#[async_trait]
impl PgHandler for DbFaults {
    async fn handle(&self, conn: &mut PgConnection, m: &Message) -> Result<(), HandlerError> {
        let n = {
            let mut a = self.attempts.lock().expect("lock");
            let n = a.entry(m.id).or_default();
            *n += 1;
            *n
        };
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {}.effects VALUES ($1)",
            self.schema.quoted()
        )))
        .bind(m.id.as_uuid())
        .execute(&mut *conn)
        .await?;
        match m.payload.as_slice() {
            SWALLOW => {
                // The error is ignored on purpose: this is the handler bug under test.
                let _ignored = sqlx::query("SELECT 1 / 0").execute(&mut *conn).await;
            }
            DEFERRED => self.deferred_violation(conn, m).await?,
            RECOVERS => {
                // The right way to carry on after a failed statement: a savepoint of
                // the handler's own, rolled back to.
                sqlx::query("SAVEPOINT mine").execute(&mut *conn).await?;
                let _expected = sqlx::query("SELECT 1 / 0").execute(&mut *conn).await;
                sqlx::query("ROLLBACK TO SAVEPOINT mine")
                    .execute(&mut *conn)
                    .await?;
            }
            // PostgreSQL text cannot hold a NUL byte.
            NUL_ERROR => return Err("a\0b".into()),
            ENDS_TX => {
                // The handler bug under test: it ends the inbox transaction and then
                // writes, outside any transaction of the worker's.
                sqlx::query("ROLLBACK").execute(&mut *conn).await?;
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "INSERT INTO {}.effects VALUES ($1)",
                    self.schema.quoted()
                )))
                .bind(m.id.as_uuid())
                .execute(&mut *conn)
                .await?;
            }
            FAIL_FIRST if n == 1 => return Err("not yet".into()),
            FAIL_FIRST if self.deferred_on_retry.contains(&m.id) => {
                self.deferred_violation(conn, m).await?;
            }
            _ => {}
        }
        Ok(())
    }
}

async fn deferred_table(pool: &outbox_adapters_postgres::PgPool, schema: &PgSchema) {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {}.deferred_unique (message_id uuid, \
         CONSTRAINT deferred_unique_id UNIQUE (message_id) DEFERRABLE INITIALLY DEFERRED)",
        schema.quoted()
    )))
    .execute(pool)
    .await
    .expect("deferred table");
}

fn messages_with(payload: &[u8], n: usize) -> Vec<Message> {
    (0..n)
        .map(|_| {
            let mut m = outbox_testkit::message("contract", "order.created");
            m.payload = payload.to_vec();
            m
        })
        .collect()
}

async fn drop_schema(pool: &outbox_adapters_postgres::PgPool, schema: &PgSchema) {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA {} CASCADE",
        schema.quoted()
    )))
    .execute(pool)
    .await
    .expect("drop");
}

async fn effect_count(pool: &outbox_adapters_postgres::PgPool, schema: &PgSchema) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {}.effects",
        schema.quoted()
    )))
    .fetch_one(pool)
    .await
    .expect("effects")
}

/// Delivers `msgs` through a `PgConsumerWorker` with a `DbFaults` handler; waits until
/// each has an inbox row that is no longer in progress and the queue is empty, then
/// runs the consume sweep until each is `Consumed` or `Dead`. Returns the records.
async fn through_worker_then_sweep(
    pool: &outbox_adapters_postgres::PgPool,
    schema: &PgSchema,
    msgs: &[Message],
    max_attempts: u32,
) -> (
    Vec<outbox_ports::InboxRecord>,
    Vec<outbox_ports::InboxRecord>,
) {
    let inbox = PgInboxStore::new(pool.clone(), schema);
    let b = broker();
    assert!(b.publish(msgs).await.iter().all(|o| o.is_confirmed()));
    let worker = PgConsumerWorker::new(
        inbox.clone(),
        Arc::new(b.clone()),
        PgHandlerRegistry::new().fallback(Arc::new(DbFaults::new(schema))),
        Arc::new(SystemClock),
        config(max_attempts),
    );
    let retries = worker.retry_task();
    let cancel = CancellationToken::new();
    let running = tokio::spawn(worker.run(cancel.clone()));
    let records = async || {
        let mut out = Vec::new();
        for m in msgs {
            if let Some(r) = inbox.get_delivery(NAME, m.id).await.expect("get") {
                out.push(r);
            }
        }
        out
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let after_worker = loop {
        let rs = records().await;
        if rs.len() == msgs.len()
            && rs.iter().all(|r| r.status != InboxStatus::Received)
            && b.queue_depth(QUEUE) == (0, 0)
        {
            break rs;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "after 10 s, {} of {} deliveries have an inbox row, queue depth {:?}: \
             acknowledged with nothing kept, or redelivered forever",
            rs.len(),
            msgs.len(),
            b.queue_depth(QUEUE)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    cancel.cancel();
    running.await.expect("worker");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let after_sweep = loop {
        tokio::time::sleep(Duration::from_millis(30)).await;
        retries.run_batch(50).await.expect("retry batch");
        let rs = records().await;
        if rs
            .iter()
            .all(|r| matches!(r.status, InboxStatus::Consumed | InboxStatus::Dead))
        {
            break rs;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not settled by the sweep: {rs:?}"
        );
    };
    (after_worker, after_sweep)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_swallows_a_failed_statement_is_a_failed_attempt_never_a_lost_message() {
    let Some((pool, schema)) = database().await else {
        return;
    };
    let msgs = messages_with(SWALLOW, 20);
    let (after_worker, after_sweep) = through_worker_then_sweep(&pool, &schema, &msgs, 3).await;
    for r in &after_worker {
        assert_eq!(r.status, InboxStatus::ConsumeFailed, "{r:?}");
        assert_eq!(r.consume.attempts, 1, "{r:?}");
    }
    for r in &after_sweep {
        assert_eq!(r.status, InboxStatus::Dead, "{r:?}");
        assert_eq!(r.consume.attempts, 3, "{r:?}");
        let error = r.consume.last_error.as_deref().unwrap_or_default();
        assert!(
            error.contains("aborted by a statement the handler ignored"),
            "{error}"
        );
    }
    assert_eq!(
        effect_count(&pool, &schema).await,
        0,
        "the aborted attempts' writes were rolled back"
    );
    drop_schema(&pool, &schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_at_commit_is_a_failed_attempt_then_dead_not_a_redelivery_loop() {
    let Some((pool, schema)) = database().await else {
        return;
    };
    deferred_table(&pool, &schema).await;
    let msgs = messages_with(DEFERRED, 5);
    let (after_worker, after_sweep) = through_worker_then_sweep(&pool, &schema, &msgs, 3).await;
    for r in &after_worker {
        assert_eq!(r.status, InboxStatus::ConsumeFailed, "{r:?}");
        assert_eq!(r.consume.attempts, 1, "{r:?}");
    }
    for r in &after_sweep {
        assert_eq!(r.status, InboxStatus::Dead, "{r:?}");
        assert_eq!(r.consume.attempts, 3, "{r:?}");
        let error = r.consume.last_error.as_deref().unwrap_or_default();
        assert!(
            error.contains("commit") && error.contains("deferred_unique_id"),
            "{error}"
        );
    }
    assert_eq!(effect_count(&pool, &schema).await, 0);
    drop_schema(&pool, &schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_row_failing_at_commit_does_not_stop_the_sweep_for_the_others() {
    let Some((pool, schema)) = database().await else {
        return;
    };
    deferred_table(&pool, &schema).await;
    let inbox = PgInboxStore::new(pool.clone(), &schema);
    // Every first attempt fails (stored); on retry the first-recorded message fails
    // at COMMIT, so it is due first in the sweep; the good ones come after it.
    let msgs = messages_with(FAIL_FIRST, 6);
    let bad = msgs[0].id;
    let mut handler = DbFaults::new(&schema);
    handler.deferred_on_retry.insert(bad);
    let b = broker();
    let worker = PgConsumerWorker::new(
        inbox.clone(),
        Arc::new(b.clone()),
        PgHandlerRegistry::new().fallback(Arc::new(handler)),
        Arc::new(SystemClock),
        ConsumerConfig {
            concurrency: 1,
            prefetch: 1,
            // 200 to 400 ms: every row is due after the pause below, and none comes
            // due a second time within the one batch.
            retry: RetryPolicy {
                initial_backoff: Duration::from_millis(400),
                max_backoff: Duration::from_millis(400),
                max_attempts: 5,
            },
            ..config(5)
        },
    );
    let retries = worker.retry_task();
    let cancel = CancellationToken::new();
    let running = tokio::spawn(worker.run(cancel.clone()));
    for m in &msgs {
        assert!(
            b.publish(std::slice::from_ref(m)).await[0].is_confirmed(),
            "published"
        );
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while inbox.get_delivery(NAME, m.id).await.expect("get").is_none() {
            assert!(tokio::time::Instant::now() < deadline, "first attempt");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    cancel.cancel();
    running.await.expect("worker");
    assert_eq!(inbox.stats(NAME).await.expect("stats").consume_failed, 6);
    tokio::time::sleep(Duration::from_millis(500)).await; // all due
    let counts = retries
        .run_batch(50)
        .await
        .expect("one failing row does not fail the batch");
    assert_eq!(counts.consume_retried, 5, "{counts:?}");
    assert_eq!(counts.consume_failed, 1, "{counts:?}");
    for m in &msgs[1..] {
        let r = inbox
            .get_delivery(NAME, m.id)
            .await
            .expect("get")
            .expect("row");
        assert_eq!(r.status, InboxStatus::Consumed, "{r:?}");
    }
    let r = inbox
        .get_delivery(NAME, bad)
        .await
        .expect("get")
        .expect("row");
    assert_eq!(r.status, InboxStatus::ConsumeFailed, "{r:?}");
    assert_eq!(r.consume.attempts, 2, "{r:?}");
    assert!(
        r.consume
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("deferred_unique_id")),
        "{r:?}"
    );
    drop_schema(&pool, &schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_deletes_old_consumed_rows_and_keeps_the_rest() {
    let Some((pool, schema)) = database().await else {
        return;
    };
    let inbox = PgInboxStore::new(pool.clone(), &schema);
    let old = messages_with(b"ok", 6);
    let failing = messages_with(FAIL_FIRST, 1);
    let recent = messages_with(b"ok", 2);
    let b = broker();
    let start = |handler: DbFaults| {
        let worker = PgConsumerWorker::new(
            inbox.clone(),
            Arc::new(b.clone()),
            PgHandlerRegistry::new().fallback(Arc::new(handler)),
            Arc::new(SystemClock),
            config(1),
        );
        let counters = worker.counters();
        let cancel = CancellationToken::new();
        (counters, cancel.clone(), tokio::spawn(worker.run(cancel)))
    };
    let wait_rows = async |msgs: &[Message]| {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        for m in msgs {
            while inbox
                .get_delivery(NAME, m.id)
                .await
                .expect("get")
                .is_none_or(|r| r.status == InboxStatus::Received)
            {
                assert!(tokio::time::Instant::now() < deadline, "consumed");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let (_, cancel, running) = start(DbFaults::new(&schema));
    b.publish(&old).await;
    b.publish(&failing).await; // one attempt allowed: dead at once
    wait_rows(&old).await;
    wait_rows(&failing).await;
    cancel.cancel();
    running.await.expect("worker");
    // Consumed, and dead, long ago (each row's own times moved back: a row without a
    // consumed time would never be old); another consumer's old rows are not ours.
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE {}.outbox_inbox SET consumed_at = consumed_at - interval '8 days', \
         last_attempt_at = last_attempt_at - interval '8 days'",
        schema.quoted()
    )))
    .execute(&pool)
    .await
    .expect("age rows");
    let other = "another-consumer";
    let l = outbox_ports::Lease::new("other#1", Duration::from_secs(60));
    inbox
        .record_arrival(other, &old[0], &l)
        .await
        .expect("other arrival");
    assert!(
        inbox
            .mark_consumed(other, old[0].id, &l)
            .await
            .expect("other consumed")
    );
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE {}.outbox_inbox SET consumed_at = consumed_at - interval '8 days' WHERE consumer = $1",
        schema.quoted()
    )))
    .bind(other)
    .execute(&pool)
    .await
    .expect("age other");

    let (counters, cancel, running) = start(DbFaults::new(&schema));
    b.publish(&recent).await;
    wait_rows(&recent).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while inbox.stats(NAME).await.expect("stats").consumed != 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "old consumed rows not deleted: {:?}",
            inbox.stats(NAME).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cancel.cancel();
    running.await.expect("worker");
    let s = inbox.stats(NAME).await.expect("stats");
    assert_eq!(
        (s.consumed, s.dead),
        (2, 1),
        "recent and dead rows are kept"
    );
    assert_eq!(
        inbox.stats(other).await.expect("other stats").consumed,
        1,
        "another consumer's rows follow its own retention"
    );
    assert_eq!(counters.retention_deleted.load(Ordering::Relaxed), 6);
    drop_schema(&pool, &schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_rolls_back_to_its_own_savepoint_commits() {
    let Some((pool, schema)) = database().await else {
        return;
    };
    let msgs = messages_with(RECOVERS, 5);
    let (after_worker, _) = through_worker_then_sweep(&pool, &schema, &msgs, 3).await;
    for r in &after_worker {
        assert_eq!(r.status, InboxStatus::Consumed, "{r:?}");
        assert_eq!(r.consume.attempts, 1, "{r:?}");
    }
    assert_eq!(effect_count(&pool, &schema).await, 5);
    drop_schema(&pool, &schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_error_with_a_nul_byte_is_stored_and_retried_until_dead() {
    let Some((pool, schema)) = database().await else {
        return;
    };
    let msgs = messages_with(NUL_ERROR, 3);
    let (after_worker, after_sweep) = through_worker_then_sweep(&pool, &schema, &msgs, 3).await;
    for r in &after_worker {
        assert_eq!(r.status, InboxStatus::ConsumeFailed, "{r:?}");
        assert_eq!(r.consume.attempts, 1, "{r:?}");
        assert_eq!(r.consume.last_error.as_deref(), Some("a\u{FFFD}b"), "{r:?}");
    }
    for r in &after_sweep {
        assert_eq!(r.status, InboxStatus::Dead, "{r:?}");
        assert_eq!(
            r.consume.attempts, 3,
            "the sweep's attempts were recorded: {r:?}"
        );
    }
    assert_eq!(effect_count(&pool, &schema).await, 0);
    drop_schema(&pool, &schema).await;
}

/// Two foreign deliveries with NUL bytes where PostgreSQL text and jsonb refuse them:
/// one decodable (NUL in the routing key, a header name and a header value, the
/// correlation id and the type), one without a message id (a dead letter with NULs in
/// its routing key and headers).
fn foreign_with_nul_bytes() -> (Message, outbox_ports::Envelope, outbox_ports::Envelope) {
    let m = outbox_testkit::message("contract", "order.created");
    let mut decodable = outbox_ports::Envelope::of(&m);
    decodable.routing_key = "order.\0created".to_owned();
    decodable.message_type = Some("t\0".to_owned());
    decodable.correlation_id = Some("c\0".to_owned());
    decodable.source = Some("s\0".to_owned());
    decodable.content_type = Some("application/json\0".to_owned());
    decodable
        .headers
        .insert("tenant\0".to_owned(), "a\0b".to_owned());
    let mut letter = decodable.clone();
    letter.message_id = Some("not-a-uuid\0".to_owned());
    (m, decodable, letter)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_deliveries_with_nul_bytes_are_consumed_or_dead_lettered_not_redelivered_forever() {
    let Some((pool, schema)) = database().await else {
        return;
    };
    let inbox = PgInboxStore::new(pool.clone(), &schema);
    let b = broker();
    let worker = PgConsumerWorker::new(
        inbox.clone(),
        Arc::new(b.clone()),
        PgHandlerRegistry::new().fallback(Arc::new(DbFaults::new(&schema))),
        Arc::new(SystemClock),
        config(3),
    );
    let cancel = CancellationToken::new();
    let running = tokio::spawn(worker.run(cancel.clone()));
    let (m, decodable, letter) = foreign_with_nul_bytes();
    assert!(b.publish_envelope(decodable).is_confirmed());
    assert!(b.publish_envelope(letter).is_confirmed());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let s = inbox.stats(NAME).await.expect("stats");
        if s.consumed == 1 && s.dead_letters == 1 && b.queue_depth(QUEUE) == (0, 0) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not settled after 10 s (redelivered forever?): {s:?}, queue {:?}",
            b.queue_depth(QUEUE)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cancel.cancel();
    running.await.expect("worker");
    let r = inbox
        .get_delivery(NAME, m.id)
        .await
        .expect("get")
        .expect("row");
    assert_eq!(r.status, InboxStatus::Consumed);
    assert_eq!(r.message.routing_key, "order.\u{FFFD}created");
    assert_eq!(
        r.message.headers.get("tenant\u{FFFD}").map(String::as_str),
        Some("a\u{FFFD}b")
    );
    assert_eq!(effect_count(&pool, &schema).await, 1);
    drop_schema(&pool, &schema).await;
}

/// The backend-neutral worker and sweep over the PostgreSQL inbox (through
/// `InboxStore`): the same NUL bytes, in a handler's error and in a foreign delivery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_neutral_worker_on_the_postgres_inbox_stores_nul_bytes_too() {
    let Some((pool, schema)) = database().await else {
        return;
    };
    let inbox = PgInboxStore::new(pool.clone(), &schema);
    let b = broker();
    let failing = messages_with(NUL_ERROR, 1).remove(0);
    let handler = outbox_consumer::handler_fn(|m: Message| async move {
        if m.payload == NUL_ERROR {
            Err("a\0b".into())
        } else {
            Ok(())
        }
    });
    let worker = outbox_consumer::ConsumerWorker::new(
        Arc::new(inbox.clone()),
        Arc::new(b.clone()),
        outbox_consumer::HandlerRegistry::new().fallback(handler),
        Arc::new(SystemClock),
        config(3),
    );
    let retries = worker.retry_task();
    let cancel = CancellationToken::new();
    let running = tokio::spawn(worker.run(cancel.clone()));
    let (foreign, decodable, letter) = foreign_with_nul_bytes();
    assert!(b.publish(std::slice::from_ref(&failing)).await[0].is_confirmed());
    assert!(b.publish_envelope(decodable).is_confirmed());
    assert!(b.publish_envelope(letter).is_confirmed());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let s = inbox.stats(NAME).await.expect("stats");
        if s.consumed == 1
            && s.consume_failed == 1
            && s.dead_letters == 1
            && b.queue_depth(QUEUE) == (0, 0)
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not settled after 10 s: {s:?}, queue {:?}",
            b.queue_depth(QUEUE)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cancel.cancel();
    running.await.expect("worker");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        tokio::time::sleep(Duration::from_millis(30)).await;
        retries.run_batch(50).await.expect("retry batch");
        let r = inbox
            .get_delivery(NAME, failing.id)
            .await
            .expect("get")
            .expect("row");
        if r.status == InboxStatus::Dead {
            assert_eq!(r.consume.attempts, 3, "{r:?}");
            assert_eq!(r.consume.last_error.as_deref(), Some("a\u{FFFD}b"));
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "not dead: {r:?}");
    }
    let r = inbox
        .get_delivery(NAME, foreign.id)
        .await
        .expect("get")
        .expect("row");
    assert_eq!(r.status, InboxStatus::Consumed);
    drop_schema(&pool, &schema).await;
}

/// A handler that ends the inbox transaction itself is dead at once, counted as dead
/// by the worker, and its writes (made outside the transaction) happen once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_ends_the_inbox_transaction_is_counted_dead_and_runs_once() {
    let Some((pool, schema)) = database().await else {
        return;
    };
    let msgs = messages_with(ENDS_TX, 3);
    let inbox = PgInboxStore::new(pool.clone(), &schema);
    let b = broker();
    assert!(b.publish(&msgs).await.iter().all(|o| o.is_confirmed()));
    let worker = PgConsumerWorker::new(
        inbox.clone(),
        Arc::new(b.clone()),
        PgHandlerRegistry::new().fallback(Arc::new(DbFaults::new(&schema))),
        Arc::new(SystemClock),
        config(5),
    );
    let counters = worker.counters();
    let retries = worker.retry_task();
    let cancel = CancellationToken::new();
    let running = tokio::spawn(worker.run(cancel.clone()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let mut dead = 0;
        for m in &msgs {
            if let Some(r) = inbox.get_delivery(NAME, m.id).await.expect("get")
                && r.status == InboxStatus::Dead
            {
                dead += 1;
            }
        }
        if dead == msgs.len() && b.queue_depth(QUEUE) == (0, 0) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{dead} of {} dead after 10 s",
            msgs.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cancel.cancel();
    running.await.expect("worker");
    // Nothing is due again: the sweep runs none of them a second time.
    retries.run_batch(50).await.expect("retry batch");
    assert_eq!(
        counters.dead.load(std::sync::atomic::Ordering::Relaxed),
        3,
        "counted as dead"
    );
    assert_eq!(effect_count(&pool, &schema).await, 3, "each ran once");
    drop_schema(&pool, &schema).await;
}

/// Runs `msgs` through a worker with `config` and a `DbFaults` handler until the
/// worker counts every one consumed; returns how many transactions wrote their
/// inbox rows (by the rows' `received_at`, the transaction's start time).
async fn consume_all(
    pool: &outbox_adapters_postgres::PgPool,
    schema: &PgSchema,
    msgs: &[Message],
    config: ConsumerConfig,
) -> usize {
    let inbox = PgInboxStore::new(pool.clone(), schema);
    let b = broker();
    assert!(b.publish(msgs).await.iter().all(|o| o.is_confirmed()));
    let worker = PgConsumerWorker::new(
        inbox.clone(),
        Arc::new(b.clone()),
        PgHandlerRegistry::new().fallback(Arc::new(DbFaults::new(schema))),
        Arc::new(SystemClock),
        config,
    );
    let counters = worker.counters();
    let cancel = CancellationToken::new();
    let running = tokio::spawn(worker.run(cancel.clone()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while (counters.consumed.load(Ordering::Relaxed) as usize) < msgs.len() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of {} consumed after 20 s",
            counters.consumed.load(Ordering::Relaxed),
            msgs.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cancel.cancel();
    running.await.expect("worker");
    assert_eq!(b.queue_depth(QUEUE), (0, 0), "every delivery acknowledged");
    for m in msgs {
        let r = inbox
            .get_delivery(NAME, m.id)
            .await
            .expect("get")
            .expect("row");
        assert_eq!(r.status, InboxStatus::Consumed, "{r:?}");
    }
    assert_eq!(
        effect_count(pool, schema).await,
        msgs.len() as i64,
        "each once"
    );
    sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(format!(
        "SELECT count(DISTINCT received_at) FROM {}.outbox_inbox",
        schema.quoted()
    )))
    .fetch_one(pool)
    .await
    .expect("transactions") as usize
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_deliveries_share_inbox_transactions_and_each_takes_effect_once() {
    let Some((pool, schema)) = database().await else {
        return;
    };
    let msgs = messages_with(b"plain", 300);
    let config = ConsumerConfig {
        concurrency: 8,
        inbox_batch: 4,
        prefetch: 64,
        ..config(3)
    };
    let transactions = consume_all(&pool, &schema, &msgs, config).await;
    assert!(
        transactions <= msgs.len() * 3 / 4,
        "300 deliveries in {transactions} transactions: batches did not form"
    );
    drop_schema(&pool, &schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inbox_batch_of_one_is_a_transaction_per_delivery() {
    let Some((pool, schema)) = database().await else {
        return;
    };
    let msgs = messages_with(b"plain", 100);
    let config = ConsumerConfig {
        concurrency: 8,
        inbox_batch: 1,
        ..config(3)
    };
    let transactions = consume_all(&pool, &schema, &msgs, config).await;
    // Two transactions may start within one microsecond; not many.
    assert!(
        transactions >= 95,
        "100 deliveries in {transactions} transactions"
    );
    drop_schema(&pool, &schema).await;
}
