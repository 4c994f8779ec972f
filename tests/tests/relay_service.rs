//! The relay as deployed: the real binary (`outbox-e2e-relay`, the `outbox` CLI)
//! against the local PostgreSQL, RabbitMQ and Redis. Each test has its own schema,
//! exchange, queue and lock/state keys.

use std::collections::HashSet;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use futures::StreamExt as _;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use outbox_adapters_postgres::{PgOutbox, PgPool, PgSchema, connect, migrate};
use outbox_adapters_rabbitmq::{BindingSpec, ExchangeKind, ExchangeSpec, QueueSpec, Topology};
use outbox_core::NewMessage;
use outbox_testkit::services::TestUrls as Urls;
use tokio::process::{Child, Command};

const BIN: &str = env!("CARGO_BIN_EXE_outbox-e2e-relay");

fn urls() -> Urls {
    Urls::from_env()
}

/// One test's world: schema, exchange, queue, keys, and a config file.
struct World {
    urls: Urls,
    pool: PgPool,
    schema: PgSchema,
    amqp: lapin::Connection,
    exchange: String,
    queue: String,
    id: String,
    dir: PathBuf,
}

impl World {
    async fn new(test: &str) -> Option<Self> {
        let urls = urls();
        let in_ci = std::env::var("CI").is_ok_and(|v| v == "true");
        let pool = match connect(&urls.pg, 8, Duration::from_secs(5)).await {
            Ok(p) => p,
            Err(e) if in_ci => panic!("PostgreSQL unreachable in CI: {e}"),
            Err(e) => {
                eprintln!("SKIPPED (not in CI): {e}");
                return None;
            }
        };
        let amqp = match outbox_adapters_rabbitmq::connect(&urls.amqp, Duration::from_secs(5)).await
        {
            Ok(c) => c,
            Err(e) if in_ci => panic!("RabbitMQ unreachable in CI: {e}"),
            Err(e) => {
                eprintln!("SKIPPED (not in CI): {e}");
                return None;
            }
        };
        let id = outbox_testkit::unique_key(test).replace(['.', '-'], "_");
        let schema = PgSchema::new(&format!("e2e_{}", &id[id.len() - 20..])).expect("schema");
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP SCHEMA IF EXISTS {} CASCADE",
            schema.quoted()
        )))
        .execute(&pool)
        .await
        .expect("drop");
        migrate(&pool, &schema).await.expect("migrate");
        let dir = std::env::temp_dir().join(format!("outbox-e2e-{id}"));
        std::fs::create_dir_all(&dir).expect("dir");
        let w = Self {
            exchange: format!("e2e.{id}.x"),
            queue: format!("e2e.{id}.q"),
            urls,
            pool,
            schema,
            amqp,
            id,
            dir,
        };
        w.declare(&w.exchange).await;
        Some(w)
    }

    async fn declare(&self, exchange: &str) {
        Topology {
            exchanges: vec![ExchangeSpec {
                name: exchange.to_owned(),
                kind: ExchangeKind::Topic,
                durable: true,
                shards: 1,
            }],
            queues: vec![QueueSpec::durable(&self.queue)],
            bindings: vec![BindingSpec {
                queue: self.queue.clone(),
                exchange: exchange.to_owned(),
                routing_key: "#".into(),
            }],
        }
        .declare(&self.amqp)
        .await
        .expect("declare");
    }

    /// A config file; `extra` is appended (TOML sections).
    fn config(&self, name: &str, extra: &str) -> PathBuf {
        let text = format!(
            r#"
instance = "{name}-{id}"
[adapters]
store = "postgres"
publisher = "rabbitmq"
lock = "redis"
sweep_state = "redis"
[postgres]
url = "{pg}"
schema = "{schema}"
[rabbitmq]
url = "{amqp}"
confirm_timeout = "10s"
[redis]
url = "{redis}"
[dispatch]
idle_poll = "500ms"
[sweep]
lock_key = "e2e.{id}.lock"
state_key = "e2e.{id}.state"
{extra}
"#,
            id = self.id,
            pg = self.urls.pg,
            schema = self.schema,
            amqp = self.urls.amqp,
            redis = self.urls.redis,
        );
        let path = self.dir.join(format!("{name}.toml"));
        std::fs::write(&path, text).expect("write config");
        path
    }

    fn relay(&self, config: &PathBuf) -> Relay {
        let log = std::fs::File::create(config.with_extension("log")).expect("log");
        let child = Command::new(BIN)
            .args(["run", "--config"])
            .arg(config)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("start relay");
        Relay { child }
    }

    async fn count(&self, status: &str) -> i64 {
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM {}.outbox_messages WHERE status = $1",
            self.schema.quoted()
        )))
        .bind(status)
        .fetch_one(&self.pool)
        .await
        .expect("count")
    }

    async fn wait_until(&self, what: &str, secs: u64, mut done: impl AsyncFnMut() -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
        while !done().await {
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Message ids in the queue, read by a plain consumer until `want` are seen or
    /// the queue stays quiet; returns (distinct ids, deliveries).
    async fn drain(&self, want: usize, quiet: Duration) -> (HashSet<String>, usize) {
        let ch = self.amqp.create_channel().await.expect("channel");
        ch.basic_qos(500, BasicQosOptions::default())
            .await
            .expect("qos");
        let mut consumer = ch
            .basic_consume(
                self.queue.as_str().into(),
                format!("drain-{}", self.id).as_str().into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("consume");
        let (mut ids, mut deliveries) = (HashSet::new(), 0);
        while ids.len() < want {
            match tokio::time::timeout(quiet, consumer.next()).await {
                Ok(Some(Ok(d))) => {
                    deliveries += 1;
                    if let Some(id) = d.properties.message_id() {
                        ids.insert(id.as_str().to_owned());
                    }
                    d.acker.ack(BasicAckOptions::default()).await.expect("ack");
                }
                _ => break,
            }
        }
        (ids, deliveries)
    }
}

impl World {
    /// Removes the test's exchanges, queue and schema (left behind only when a test
    /// fails, for inspection).
    async fn cleanup(self) {
        if let Ok(ch) = self.amqp.create_channel().await {
            let _ = ch
                .queue_delete(
                    self.queue.as_str().into(),
                    lapin::options::QueueDeleteOptions::default(),
                )
                .await;
            for x in [self.exchange.clone(), format!("{}.late", self.exchange)] {
                let _ = ch
                    .exchange_delete(
                        x.as_str().into(),
                        lapin::options::ExchangeDeleteOptions::default(),
                    )
                    .await;
            }
        }
        let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP SCHEMA IF EXISTS {} CASCADE",
            self.schema.quoted()
        )))
        .execute(&self.pool)
        .await;
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

struct Relay {
    child: Child,
}

impl Relay {
    /// SIGTERM, then the exit status (bounded).
    async fn terminate(mut self) -> ExitStatus {
        if let Some(pid) = self.child.id() {
            let _ = Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status()
                .await;
        }
        tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("relay stops within 30 s of SIGTERM")
            .expect("wait")
    }
}

async fn metric(port: u16, name: &str) -> f64 {
    let out = Command::new("curl")
        .args(["-s", &format!("http://127.0.0.1:{port}/metrics")])
        .output()
        .await
        .expect("curl");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0.0)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_relays_deliver_every_committed_message_and_no_rolled_back_one() {
    let Some(w) = World::new("two").await else {
        return;
    };
    let (a, b) = (
        w.config("a", "[http]\nenabled = false"),
        w.config("b", "[http]\nenabled = false"),
    );
    let (ra, rb) = (w.relay(&a), w.relay(&b));
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {}.orders (id bigint PRIMARY KEY)",
        w.schema.quoted()
    )))
    .execute(&w.pool)
    .await
    .expect("orders");
    let outbox = PgOutbox::new(w.schema.clone());
    let mut tasks = Vec::new();
    for t in 0..16_i64 {
        let (pool, outbox, schema, exchange) = (
            w.pool.clone(),
            outbox.clone(),
            w.schema.clone(),
            w.exchange.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let (mut committed, mut rolled_back) = (Vec::new(), Vec::new());
            for i in 0..625_i64 {
                let order = t * 1000 + i;
                let mut tx = pool.begin().await.expect("begin");
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "INSERT INTO {}.orders VALUES ($1)",
                    schema.quoted()
                )))
                .bind(order)
                .execute(&mut *tx)
                .await
                .expect("order");
                let id = outbox
                    .enqueue(
                        &mut tx,
                        NewMessage::new(
                            &exchange,
                            "order.created",
                            format!("{{\"order\":{order}}}").into_bytes(),
                        ),
                    )
                    .await
                    .expect("enqueue");
                if order % 10 == 0 {
                    tx.rollback().await.expect("rollback");
                    rolled_back.push(id.to_string());
                } else {
                    tx.commit().await.expect("commit");
                    committed.push(id.to_string());
                }
            }
            (committed, rolled_back)
        }));
    }
    let (mut committed, mut rolled_back) = (HashSet::new(), HashSet::new());
    for t in tasks {
        let (c, r) = t.await.expect("producer");
        committed.extend(c);
        rolled_back.extend(r);
    }
    assert_eq!(committed.len() + rolled_back.len(), 10_000);
    let (seen, deliveries) = w.drain(committed.len(), Duration::from_secs(30)).await;
    assert!(
        ra.terminate().await.success(),
        "relay a did not exit cleanly on SIGTERM"
    );
    assert!(
        rb.terminate().await.success(),
        "relay b did not exit cleanly on SIGTERM"
    );
    eprintln!(
        "committed {}, rolled back {}, delivered {} ({} distinct)",
        committed.len(),
        rolled_back.len(),
        deliveries,
        seen.len()
    );
    let missing = committed.difference(&seen).count();
    assert_eq!(
        missing, 0,
        "{missing} committed messages never reached the broker"
    );
    assert!(
        seen.is_disjoint(&rolled_back),
        "a rolled-back message was published"
    );
    assert_eq!(w.count("sent").await as usize, committed.len());
    w.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_failures_are_retried_by_the_sweep_until_sent() {
    let Some(w) = World::new("retry").await else {
        return;
    };
    let port = free_port();
    let late = format!("{}.late", w.exchange);
    let cfg = w.config(
        "r",
        &format!("[http]\naddress = \"127.0.0.1:{port}\"\n[retry]\ninitial_backoff = \"100ms\"\nmax_backoff = \"200ms\"\nmax_attempts = 100\n"),
    );
    // The sweep interval is 1 s here: it is the floor under the 100 ms backoff.
    std::fs::write(
        &cfg,
        std::fs::read_to_string(&cfg).expect("read").replace(
            "[sweep]\n",
            "[sweep]\ninterval = \"1s\"\nlock_wait = \"200ms\"\n",
        ),
    )
    .expect("write");
    let relay = w.relay(&cfg);
    let outbox = PgOutbox::new(w.schema.clone());
    let mut conn = w.pool.acquire().await.expect("conn");
    let batch = (0..20)
        .map(|i| NewMessage::new(&late, "k", format!("{i}").into_bytes()))
        .collect();
    outbox
        .enqueue_batch(&mut conn, batch)
        .await
        .expect("enqueue");
    w.wait_until("first failures", 20, async || {
        w.count("publish_failed").await == 20
    })
    .await;
    // /metrics counts them per exchange.
    let per_exchange = format!("outbox_exchange_publish_failed{{exchange=\"{late}\"}}");
    assert_eq!(metric(port, &per_exchange).await, 20.0);
    w.declare(&late).await; // the exchange appears: the next sweep gets them through
    w.wait_until("retries to succeed", 30, async || {
        w.count("sent").await == 20
    })
    .await;
    let retried = metric(port, "outbox_sweep_publish_retried_total").await;
    let failures = metric(port, "outbox_publish_failures_total").await;
    let sweep_failed = metric(port, "outbox_sweep_publish_failed_total").await;
    assert!(relay.terminate().await.success());
    assert_eq!(
        retried, 20.0,
        "the sweep reports count exactly the retried messages"
    );
    assert_eq!(
        failures,
        20.0 + sweep_failed,
        "first failures plus failed retries"
    );
    let (seen, _) = w.drain(20, Duration::from_secs(5)).await;
    assert_eq!(seen.len(), 20);
    // The exchange's own chart has them, added by the time the relay stopped: the
    // sends, and every failed attempt of the dispatcher and the sweep.
    for window in ["1h", "24h", "7d"] {
        let (code, out, err) = operator(
            &cfg,
            &[
                "throughput",
                "exchange",
                &late,
                "--window",
                window,
                "--json",
            ],
        );
        assert_eq!(code, Some(0), "{err}");
        let chart = parse_json(&out);
        assert_eq!(chart["published"], 20, "{window}: {chart}");
        assert_eq!(
            chart["failed"].as_f64(),
            Some(failures),
            "{window}: {chart}"
        );
    }
    let (code, out, err) = operator(&cfg, &["throughput", "--json"]);
    assert_eq!(code, Some(0), "{err}");
    let all = parse_json(&out);
    assert!(
        all["exchanges"]
            .as_array()
            .expect("exchanges")
            .iter()
            .any(|e| e["exchange"] == late.as_str() && e["published"] == 20),
        "{all}"
    );
    let (code, _, err) = operator(&cfg, &["throughput", "--window", "2h"]);
    assert_eq!(code, Some(2), "a bad window is a usage error: {err}");
    w.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_end_dead_and_the_dead_commands_handle_them() {
    let Some(w) = World::new("dead").await else {
        return;
    };
    let cfg = w.config("d", "[http]\nenabled = false\n[retry]\ninitial_backoff = \"50ms\"\nmax_backoff = \"50ms\"\nmax_attempts = 2\n");
    std::fs::write(
        &cfg,
        std::fs::read_to_string(&cfg).expect("read").replace(
            "[sweep]\n",
            "[sweep]\ninterval = \"500ms\"\nlock_wait = \"200ms\"\n",
        ),
    )
    .expect("write");
    let relay = w.relay(&cfg);
    let outbox = PgOutbox::new(w.schema.clone());
    let mut conn = w.pool.acquire().await.expect("conn");
    let nowhere = format!("{}.never", w.exchange);
    let ids = outbox
        .enqueue_batch(
            &mut conn,
            (0..5)
                .map(|i| NewMessage::new(&nowhere, "k", vec![i]))
                .collect(),
        )
        .await
        .expect("enqueue");
    w.wait_until("dead", 30, async || w.count("dead").await == 5)
        .await;
    assert!(relay.terminate().await.success());
    // Every failed attempt (5 messages, 2 attempts each) is in the per-minute
    // totals the overview's failures series reads, added by the time it stopped.
    let failed: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT coalesce(sum(count), 0)::bigint FROM {}.outbox_throughput WHERE kind = 'publish_failed'",
        w.schema.quoted()
    )))
    .fetch_one(&w.pool)
    .await
    .expect("throughput");
    assert_eq!(failed, 10);

    let cli = |args: &[&str]| {
        let mut c = std::process::Command::new(BIN);
        c.arg("dead").args(args).arg("--config").arg(&cfg);
        c.output().expect("dead command")
    };
    let out = cli(&["list"]);
    assert!(out.status.success());
    let listed = String::from_utf8_lossy(&out.stdout);
    assert_eq!(listed.lines().count(), 5, "{listed}");
    assert!(
        listed.contains("not found") || listed.contains("exchange"),
        "the error is shown: {listed}"
    );
    // Times in RFC 3339, as everywhere else (not Rust's Display of a time).
    assert!(
        listed.lines().all(|l| {
            let at = l.split('\t').nth(1).unwrap_or_default();
            at.contains('T') && at.ends_with('Z') && !at.contains(' ')
        }),
        "{listed}"
    );
    // Each failed publish is in the message's attempt history, numbered.
    let out = std::process::Command::new(BIN)
        .args(["messages", "show", &ids[2].to_string(), "--config"])
        .arg(&cfg)
        .output()
        .expect("messages show");
    assert!(out.status.success());
    let shown = String::from_utf8_lossy(&out.stdout);
    let history: Vec<(&str, &str)> = shown
        .lines()
        .filter_map(|l| l.strip_prefix("failed_attempt\t"))
        .filter_map(|l| {
            let mut f = l.split('\t');
            Some((f.next()?, f.nth(1)?))
        })
        .collect();
    assert_eq!(history.len(), 2, "{shown}");
    assert_eq!(
        history.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
        ["1", "2"]
    );
    assert!(
        history.iter().all(|(_, e)| e.contains("not found")),
        "{shown}"
    );
    let out = cli(&["delete", &ids[0].to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = cli(&["delete", "0190b1a2-0000-7000-8000-000000000000"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no message with id"));
    let out = cli(&["requeue", "--all"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("requeued 4"));
    assert_eq!(w.count("pending").await, 4);
    assert_eq!(w.count("dead").await, 0);
    // Requeued, a message is pending again: delete refuses it and keeps it.
    let out = cli(&["delete", &ids[1].to_string()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is pending, not dead"));
    assert_eq!(w.count("pending").await, 4);
    // Every write of `outbox dead` is in the audit log, as the OS user's.
    let audit: Vec<(String, String, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT actor, action, count FROM {}.outbox_audit ORDER BY seq",
        w.schema.quoted()
    )))
    .fetch_all(&w.pool)
    .await
    .expect("audit");
    let actions: Vec<(&str, i64)> = audit.iter().map(|(_, a, n)| (a.as_str(), *n)).collect();
    assert_eq!(
        actions,
        [("delete", 1), ("requeue_matching", 4)],
        "the refused deletes change nothing and are not recorded: {audit:?}"
    );
    assert!(
        audit.iter().all(|(actor, _, _)| actor.starts_with("cli:")),
        "{audit:?}"
    );
    w.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_mid_stream_loses_nothing_and_sql_producers_are_relayed() {
    let Some(w) = World::new("sigterm").await else {
        return;
    };
    // Producers in other languages: the smallest plain SQL insert.
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {}.outbox_messages (exchange, routing_key, payload) \
         SELECT $1, 'order.created', convert_to('{{\"n\":' || n || '}}', 'UTF8') FROM generate_series(1, 20000) n",
        w.schema.quoted()
    )))
    .bind(&w.exchange)
    .execute(&w.pool)
    .await
    .expect("plain SQL inserts");
    let cfg = w.config("s", "[http]\nenabled = false\n");
    std::fs::write(
        &cfg,
        std::fs::read_to_string(&cfg)
            .expect("read")
            .replace("[dispatch]\n", "[dispatch]\nbatch_size = 200\n"),
    )
    .expect("write");
    let first = w.relay(&cfg);
    w.wait_until("some progress", 30, async || w.count("sent").await >= 2000)
        .await;
    assert!(first.terminate().await.success(), "SIGTERM must exit 0");
    let sent_at_stop = w.count("sent").await;
    eprintln!("sent when the first relay stopped: {sent_at_stop} of 20000");
    let second = w.relay(&cfg);
    w.wait_until("the rest", 60, async || w.count("sent").await == 20000)
        .await;
    assert!(second.terminate().await.success());
    let (seen, deliveries) = w.drain(20000, Duration::from_secs(10)).await;
    eprintln!("delivered {deliveries}, distinct {}", seen.len());
    assert_eq!(seen.len(), 20000, "every row reached the broker");
    w.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_one_sweep_per_interval() {
    let Some(w) = World::new("cadence").await else {
        return;
    };
    let (pa, pb) = (free_port(), free_port());
    let cfg = |name: &str, port: u16| {
        let p = w.config(name, &format!("[http]\naddress = \"127.0.0.1:{port}\"\n"));
        std::fs::write(
            &p,
            std::fs::read_to_string(&p).expect("read").replace(
                "[sweep]\n",
                "[sweep]\ninterval = \"2s\"\nlock_wait = \"300ms\"\n",
            ),
        )
        .expect("write");
        p
    };
    let (ca, cb) = (cfg("a", pa), cfg("b", pb));
    let (ra, rb) = (w.relay(&ca), w.relay(&cb));
    tokio::time::sleep(Duration::from_secs(9)).await;
    let sweeps = metric(pa, "outbox_sweeps_total").await + metric(pb, "outbox_sweeps_total").await;
    assert!(ra.terminate().await.success());
    assert!(rb.terminate().await.success());
    eprintln!("sweeps by two instances in 9 s with a 2 s interval: {sweeps}");
    // One cluster-wide sweep per interval: at most ceil(9 / 2) = 5 (plus start-up
    // skew), never the ~10 that two independent sweepers would make.
    assert!((2.0..=6.0).contains(&sweeps), "{sweeps} sweeps");
    w.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_deletes_old_sent_rows_only_and_counts_them() {
    let Some(w) = World::new("retention").await else {
        return;
    };
    let t = format!("{}.outbox_messages", w.schema.quoted());
    // Rows as a long-running relay leaves them: sent long ago, sent recently, and
    // unsent ones of every kind that are as old (retention must never touch them).
    let rows = |n: i64, status: &str, age: &str| {
        format!(
            "INSERT INTO {t} (exchange, routing_key, payload, status, created_at, sent_at, next_attempt_at) \
             SELECT '{x}', 'k', '\\x00'::bytea, '{status}', now() - interval '{age}', \
               CASE WHEN '{status}' = 'sent' THEN now() - interval '{age}' END, \
               CASE WHEN '{status}' = 'publish_failed' THEN now() + interval '1 day' END \
             FROM generate_series(1, {n})",
            x = w.exchange
        )
    };
    for sql in [
        rows(23, "sent", "3 hours"),
        rows(4, "sent", "10 minutes"),
        rows(3, "publish_failed", "3 hours"),
        rows(2, "dead", "3 hours"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&w.pool)
            .await
            .expect("fill");
    }
    // A dead row that carries an old sent_at (sent, then requeued and dead again
    // would clear it; this one is written by hand) is still not retention's.
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE {t} SET sent_at = now() - interval '3 hours' WHERE status = 'dead'"
    )))
    .execute(&w.pool)
    .await
    .expect("dead with sent_at");
    let port = free_port();
    let cfg = w.config(
        "r",
        &format!(
            "[http]\naddress = \"127.0.0.1:{port}\"\n[retention]\nsent_after = \"1h\"\ninterval = \"200ms\"\nbatch_size = 5\n"
        ),
    );
    let relay = w.relay(&cfg);
    // A pending message the relay sends meanwhile is recent: kept.
    sqlx::query(sqlx::AssertSqlSafe(&*rows(1, "pending", "3 hours")))
        .execute(&w.pool)
        .await
        .expect("pending");
    w.wait_until("old sent rows deleted", 30, async || {
        w.count("sent").await == 5
    })
    .await;
    w.wait_until("the counter", 10, async || {
        metric(port, "outbox_retention_deleted_total").await >= 23.0
    })
    .await;
    // Another few rounds: nothing else goes.
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        (
            w.count("sent").await,
            w.count("publish_failed").await,
            w.count("dead").await,
            w.count("pending").await
        ),
        (5, 3, 2, 0)
    );
    assert_eq!(metric(port, "outbox_retention_deleted_total").await, 23.0);
    assert!(relay.terminate().await.success());
    w.cleanup().await;
}

const READ_SECRET: &str = "e2e-read-secret-0123456789";
const WRITE_SECRET: &str = "e2e-write-secret-0123456789";

/// `method path` on the relay's HTTP address with `secret` as bearer token: the
/// status and the body as JSON (null when it is not JSON).
async fn api(
    port: u16,
    method: &str,
    path: &str,
    secret: Option<&str>,
) -> (u16, serde_json::Value) {
    let mut c = Command::new("curl");
    c.args(["-s", "-o", "-", "-w", "\n%{http_code}", "-X", method]);
    if let Some(s) = secret {
        c.args(["-H", &format!("Authorization: Bearer {s}")]);
    }
    let out = c
        .arg(format!("http://127.0.0.1:{port}{path}"))
        .output()
        .await
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').expect("status line");
    let code = code.trim().parse().unwrap_or(0);
    (code, serde_json::from_str(body).unwrap_or_default())
}

/// Inserts one dead message as a relay leaves it, returning its id.
async fn insert_dead(w: &World, routing_key: &str) -> String {
    sqlx::query_scalar::<_, uuid::Uuid>(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {}.outbox_messages (exchange, routing_key, message_type, payload, status, attempts, last_error) \
         VALUES ($1, $2, 'order.created', convert_to('{{\"n\":1}}', 'UTF8'), 'dead', 5, 'exchange not found') RETURNING id",
        w.schema.quoted()
    )))
    .bind(&w.exchange)
    .bind(routing_key)
    .fetch_one(&w.pool)
    .await
    .expect("dead row")
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_run_serves_the_admin_api_closed_until_tokens_are_configured() {
    let Some(w) = World::new("adminapi").await else {
        return;
    };
    let dead = insert_dead(&w, "order.created").await;
    // Without tokens: closed, even on loopback, naming the setting.
    let port = free_port();
    let cfg = w.config(
        "closed",
        &format!("[http]\naddress = \"127.0.0.1:{port}\"\n"),
    );
    let relay = w.relay(&cfg);
    w.wait_until("HTTP up", 20, async || {
        api(port, "GET", "/healthz", None).await.0 == 200
    })
    .await;
    for secret in [None, Some(WRITE_SECRET)] {
        let (status, body) = api(port, "GET", "/api/v1/messages?status=dead", secret).await;
        assert_eq!(status, 403, "{body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("[[admin.tokens]]")),
            "{body}"
        );
    }
    assert!(relay.terminate().await.success());

    // With a read and a write token (and an http.token for /metrics, which must
    // not apply to /api/v1).
    let port = free_port();
    let cfg = w.config(
        "open",
        &format!(
            "[http]\naddress = \"127.0.0.1:{port}\"\ntoken = \"metrics-token-0123456789\"\n\
             [admin]\nredact_headers = [\"authorization\"]\n\
             [[admin.tokens]]\nname = \"dashboard\"\nsecret = \"{READ_SECRET}\"\nrole = \"read\"\n\
             [[admin.tokens]]\nname = \"ops-alice\"\nsecret = \"{WRITE_SECRET}\"\nrole = \"write\"\n"
        ),
    );
    std::fs::write(
        &cfg,
        std::fs::read_to_string(&cfg).expect("read").replace(
            "[sweep]\n",
            "[sweep]\ninterval = \"1s\"\nlock_wait = \"200ms\"\n",
        ),
    )
    .expect("write");
    let relay = w.relay(&cfg);
    w.wait_until("HTTP up", 20, async || {
        api(port, "GET", "/healthz", None).await.0 == 200
    })
    .await;
    assert_eq!(
        api(port, "GET", "/metrics", Some(READ_SECRET)).await.0,
        401,
        "an admin token is not the metrics token"
    );
    let (status, page) = api(
        port,
        "GET",
        "/api/v1/messages?status=dead",
        Some(READ_SECRET),
    )
    .await;
    assert_eq!(status, 200, "{page}");
    let items = page["items"].as_array().expect("items");
    assert_eq!(items.len(), 1, "{page}");
    assert_eq!(items[0]["id"], dead.as_str());
    assert_eq!(items[0]["status"], "dead");
    assert_eq!(items[0]["last_error"], "exchange not found");
    let unknown = api(
        port,
        "GET",
        "/api/v1/messages?status=dead",
        Some("wrong-secret-0123456789"),
    )
    .await;
    assert_eq!(unknown.0, 401, "{}", unknown.1);

    let requeue = format!("/api/v1/messages/{dead}/requeue");
    let (status, body) = api(port, "POST", &requeue, Some(READ_SECRET)).await;
    assert_eq!(status, 403, "a read token cannot write: {body}");
    assert_eq!(w.count("dead").await, 1, "nothing changed");
    let (status, body) = api(port, "POST", &requeue, Some(WRITE_SECRET)).await;
    assert!((200..300).contains(&status), "{status} {body}");
    w.wait_until("the requeued message sent", 20, async || {
        w.count("sent").await == 1
    })
    .await;
    let (status, body) = api(port, "POST", &requeue, Some(WRITE_SECRET)).await;
    assert_eq!(status, 409, "a sent message is not requeued twice: {body}");

    let (status, audit) = api(port, "GET", "/api/v1/audit", Some(READ_SECRET)).await;
    assert_eq!(status, 200, "{audit}");
    let entries = audit["items"].as_array().expect("items");
    assert_eq!(entries.len(), 1, "one write, one record: {audit}");
    assert_eq!(entries[0]["actor"], "token:ops-alice");
    assert_eq!(entries[0]["action"], "requeue");
    assert_eq!(entries[0]["target"], dead.as_str());
    assert_eq!(entries[0]["count"], 1);

    // Any entry of the list: its order is not part of the answer's contract.
    w.wait_until("a sweep report in /stats", 40, async || {
        let (_, stats) = api(port, "GET", "/api/v1/stats", Some(READ_SECRET)).await;
        stats["sweeps"].as_array().is_some_and(|sweeps| {
            sweeps
                .iter()
                .any(|s| s["key"] == format!("e2e.{}.state", w.id) && s["completed_at"].is_string())
        })
    })
    .await;
    assert!(relay.terminate().await.success());
    let log = std::fs::read_to_string(cfg.with_extension("log")).expect("log");
    assert!(log.contains("ops-alice"), "the config is logged: {log}");
    for secret in [READ_SECRET, WRITE_SECRET, "metrics-token-0123456789"] {
        assert!(!log.contains(secret), "a secret in the relay's log");
    }
    w.cleanup().await;
}

/// Runs `outbox <args> --config <cfg>` as the operator `e2e-operator`: exit code,
/// stdout, stderr.
fn operator(cfg: &PathBuf, args: &[&str]) -> (Option<i32>, String, String) {
    let out = std::process::Command::new(BIN)
        .args(args)
        .arg("--config")
        .arg(cfg)
        .env("USER", "e2e-operator")
        .output()
        .expect("operator command");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn parse_json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_commands_filter_requeue_delete_and_are_audited() {
    let Some(w) = World::new("opcli").await else {
        return;
    };
    let cfg = w.config("cli", "[http]\nenabled = false\n");
    let mut dead_a = Vec::new();
    for _ in 0..3 {
        dead_a.push(insert_dead(&w, "k.a").await);
    }
    for _ in 0..2 {
        insert_dead(&w, "k.b").await;
    }
    let pending: Vec<String> = sqlx::query_scalar::<_, uuid::Uuid>(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {}.outbox_messages (exchange, routing_key, payload) \
         SELECT $1, 'k.a', '\\x00'::bytea FROM generate_series(1, 2) RETURNING id",
        w.schema.quoted()
    )))
    .bind(&w.exchange)
    .fetch_all(&w.pool)
    .await
    .expect("pending rows")
    .into_iter()
    .map(|id| id.to_string())
    .collect();

    // Lists: filters, JSON, pages.
    let (code, stdout, stderr) = operator(
        &cfg,
        &[
            "messages",
            "list",
            "--status",
            "dead",
            "--routing-key",
            "k.a",
            "--json",
        ],
    );
    assert_eq!(code, Some(0), "{stderr}");
    let page = parse_json(&stdout);
    let mut listed: Vec<String> = page["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|m| {
            assert_eq!(
                (m["status"].as_str(), m["routing_key"].as_str()),
                (Some("dead"), Some("k.a"))
            );
            m["id"].as_str().expect("id").to_owned()
        })
        .collect();
    listed.sort();
    let mut want = dead_a.clone();
    want.sort();
    assert_eq!(listed, want);
    let (code, stdout, _) = operator(&cfg, &["messages", "list", "--status", "dead"]);
    assert_eq!(code, Some(0));
    assert_eq!(stdout.lines().count(), 5, "{stdout}");
    assert!(
        stdout
            .lines()
            .all(|l| l.contains("\tdead\t") && l.contains("exchange not found")),
        "{stdout}"
    );
    let (_, first, _) = operator(&cfg, &["messages", "list", "--limit", "4", "--json"]);
    let first = parse_json(&first);
    let cursor = first["next_cursor"].as_str().expect("a next page");
    let (_, rest, _) = operator(
        &cfg,
        &[
            "messages", "list", "--limit", "4", "--cursor", cursor, "--json",
        ],
    );
    let rest = parse_json(&rest);
    assert_eq!(
        rest["items"].as_array().map(Vec::len),
        Some(3),
        "7 messages in pages of 4"
    );
    assert!(rest["next_cursor"].is_null());
    // Oldest first: the same seven, the other way round.
    let ids = |page: &serde_json::Value| -> Vec<String> {
        page["items"]
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .filter_map(|m| m["id"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let (_, newest, _) = operator(&cfg, &["messages", "list", "--json"]);
    let (code, oldest, stderr) = operator(&cfg, &["messages", "list", "--oldest-first", "--json"]);
    assert_eq!(code, Some(0), "{stderr}");
    let mut reversed = ids(&parse_json(&newest));
    reversed.reverse();
    assert_eq!(ids(&parse_json(&oldest)), reversed);
    assert_eq!(reversed.len(), 7);
    let (code, stdout, _) = operator(&cfg, &["messages", "list", "--q", &dead_a[0], "--json"]);
    assert_eq!(code, Some(0));
    assert_eq!(parse_json(&stdout)["items"][0]["id"], dead_a[0].as_str());
    let (code, stdout, _) = operator(&cfg, &["messages", "show", &dead_a[0], "--json"]);
    assert_eq!(code, Some(0));
    let shown = parse_json(&stdout);
    assert_eq!(
        (shown["id"].as_str(), shown["payload"].as_str()),
        (Some(dead_a[0].as_str()), Some("{\"n\":1}"))
    );
    for (bad, named) in [
        (vec!["messages", "list", "--status", "consumed"], "consumed"),
        (
            vec!["messages", "list", "--created-after", "yesterday"],
            "created_after",
        ),
        (vec!["messages", "list", "--limit", "1001"], "limit"),
        (vec!["messages", "list", "--cursor", "!!"], "cursor"),
        (vec!["messages", "show", "not-a-uuid"], "not-a-uuid"),
        (vec!["messages", "requeue", "--filter", "--max", "0"], "max"),
        (
            vec!["messages", "requeue", &dead_a[0], "--status", "dead"],
            "--filter",
        ),
    ] {
        let (code, _, stderr) = operator(&cfg, &bad);
        assert_ne!(code, Some(0), "{bad:?}");
        assert!(stderr.contains(named), "{bad:?}: {stderr}");
    }

    // Requeue by filter: a dry run counts and changes nothing, then for real.
    let requeue_a = [
        "messages",
        "requeue",
        "--filter",
        "--status",
        "dead",
        "--routing-key",
        "k.a",
    ];
    let (code, stdout, stderr) = operator(&cfg, &[&requeue_a[..], &["--dry-run"]].concat());
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("3 message(s) match"), "{stdout}");
    assert_eq!((w.count("dead").await, w.count("pending").await), (5, 2));
    let (code, stdout, stderr) = operator(&cfg, &[&requeue_a[..], &["--json"]].concat());
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(
        parse_json(&stdout),
        serde_json::json!({"matched": 3, "changed": 3})
    );
    assert_eq!((w.count("dead").await, w.count("pending").await), (2, 5));

    // Delete is guarded: pending stays without --force.
    let (code, _, stderr) = operator(&cfg, &["messages", "delete", &pending[0]]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("pending"), "{stderr}");
    let (code, stdout, stderr) = operator(
        &cfg,
        &["messages", "delete", "--filter", "--status", "pending"],
    );
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("0 of 5"), "{stdout}");
    assert!(stderr.contains("--force"), "{stderr}");
    assert_eq!(w.count("pending").await, 5);
    let (code, _, stderr) = operator(&cfg, &["messages", "delete", &pending[0], "--force"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(w.count("pending").await, 4);
    let (code, stdout, _) = operator(
        &cfg,
        &[
            "messages", "delete", "--filter", "--status", "dead", "--json",
        ],
    );
    assert_eq!(code, Some(0));
    assert_eq!(
        parse_json(&stdout),
        serde_json::json!({"matched": 2, "changed": 2})
    );
    assert_eq!(w.count("dead").await, 0);

    // Dead letters: a delivery without a message id, kept for consumer billing.
    let letter: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {}.outbox_dead_letters (consumer, routing_key, body, reason) \
         VALUES ('billing', 'order.created', convert_to('{{\"order\":7}}', 'UTF8'), 'delivery without a message id') RETURNING seq",
        w.schema.quoted()
    )))
    .fetch_one(&w.pool)
    .await
    .expect("dead letter");
    let (code, stdout, stderr) = operator(&cfg, &["dead-letters", "list", "--consumer", "billing"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    assert!(
        stdout.starts_with(&format!("{letter}\tbilling\t"))
            && stdout.contains("without a message id"),
        "{stdout}"
    );
    let (_, stdout, _) = operator(
        &cfg,
        &["dead-letters", "list", "--consumer", "shipping", "--json"],
    );
    assert_eq!(
        parse_json(&stdout)["items"],
        serde_json::json!([]),
        "another consumer's are not shown"
    );
    let (code, stdout, _) = operator(
        &cfg,
        &["dead-letters", "show", &letter.to_string(), "--json"],
    );
    assert_eq!(code, Some(0));
    assert_eq!(parse_json(&stdout)["body"], "{\"order\":7}");
    let (code, stdout, stderr) = operator(&cfg, &["dead", "list", "--consumer", "billing"]);
    assert_eq!(code, Some(0), "{stderr}");
    let marked: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("dead-letter\t"))
        .collect();
    assert_eq!(marked.len(), 1, "{stdout}");
    assert!(marked[0].contains("without a message id"), "{stdout}");
    let (code, stdout, _) = operator(&cfg, &["consumers", "list", "--json"]);
    assert_eq!(code, Some(0));
    let billing = &parse_json(&stdout)["items"][0];
    assert_eq!(
        (billing["name"].as_str(), billing["dead_letters"].as_u64()),
        (Some("billing"), Some(1))
    );
    // Failures grouped: two dead deliveries of a consumer of their own (billing's
    // are counted further on) whose errors differ in a number are one group of two.
    for row in [7, 9] {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {}.outbox_inbox (consumer, message_id, exchange, routing_key, payload, created_at, status, last_error) \
             VALUES ('zz-grouped', $1, 'orders', 'order.created', '\\x7b7d', now(), 'dead', $2)",
            w.schema.quoted()
        )))
        .bind(uuid::Uuid::now_v7())
        .bind(format!("row {row} of invoices is locked"))
        .execute(&w.pool)
        .await
        .expect("a dead delivery");
    }
    let (code, stdout, stderr) = operator(&cfg, &["failures", "--json"]);
    assert_eq!(code, Some(0), "{stderr}");
    let groups = parse_json(&stdout)["groups"]
        .as_array()
        .expect("groups")
        .clone();
    let grouped: Vec<_> = groups
        .iter()
        .filter(|g| g["consumer"] == "zz-grouped")
        .collect();
    assert_eq!(grouped.len(), 1, "{stdout}");
    assert_eq!(grouped[0]["count"], 2, "{stdout}");
    assert_eq!(grouped[0]["error"], "row <n> of invoices is locked");
    let (code, stdout, stderr) = operator(&cfg, &["failures"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(
        stdout.lines().count(),
        groups.len(),
        "one line a group: {stdout}"
    );
    assert!(
        stdout.contains("2\tconsumer=zz-grouped\t")
            && stdout.contains("row <n> of invoices is locked"),
        "{stdout}"
    );
    // The group as a whole: a dry run counts it, then it is reconsumed.
    let group = [
        "failures",
        "reconsume",
        "--consumer",
        "zz-grouped",
        "--error",
        "row <n> of invoices is locked",
    ];
    let (code, stdout, stderr) = operator(&cfg, &[&group[..], &["--dry-run", "--json"]].concat());
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(
        parse_json(&stdout),
        serde_json::json!({"matched": 2, "changed": 0})
    );
    let (code, stdout, stderr) = operator(&cfg, &[&group[..], &["--json"]].concat());
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(
        parse_json(&stdout),
        serde_json::json!({"matched": 2, "changed": 2})
    );
    let (code, _, stderr) = operator(&cfg, &group);
    assert_ne!(code, Some(0), "nothing left in the group");
    assert!(stderr.contains("not found"), "{stderr}");
    // Pauses: written, listed, in the stats, lifted; every write audited.
    let (code, _, stderr) = operator(&cfg, &["pause", "consumer", "zz-grouped"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("paused consumer zz-grouped"), "{stderr}");
    let (code, _, stderr) = operator(&cfg, &["pause", "exchange", "orders"]);
    assert_eq!(code, Some(0), "{stderr}");
    let (code, stdout, stderr) = operator(&cfg, &["pauses"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(stdout.lines().count(), 2, "{stdout}");
    assert!(
        stdout.starts_with("exchange\torders\t"),
        "exchanges first: {stdout}"
    );
    let (code, stdout, _) = operator(&cfg, &["pauses", "--json"]);
    assert_eq!(code, Some(0));
    assert_eq!(parse_json(&stdout)["items"][1]["name"], "zz-grouped");
    for kind in ["consumer", "exchange"] {
        let name = if kind == "consumer" {
            "zz-grouped"
        } else {
            "orders"
        };
        let (code, _, stderr) = operator(&cfg, &["resume", kind, name]);
        assert_eq!(code, Some(0), "{stderr}");
        assert!(
            stderr.contains(&format!("resumed {kind} {name}")),
            "{stderr}"
        );
    }
    let (code, _, stderr) = operator(&cfg, &["resume", "exchange", "orders"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("was not paused"), "{stderr}");
    let (code, _, stderr) = operator(&cfg, &["pause", "queue", "orders"]);
    assert_eq!(
        code,
        Some(2),
        "a kind that is not one is a usage error: {stderr}"
    );
    let (code, stdout, _) = operator(&cfg, &["pauses"]);
    assert_eq!(
        (code, stdout.as_str()),
        (Some(0), ""),
        "nothing paused any more"
    );
    let (code, stdout, _) = operator(&cfg, &["stats", "--json"]);
    assert_eq!(code, Some(0));
    let stats = parse_json(&stdout);
    assert_eq!(
        (
            stats["outbox"]["pending"].as_u64(),
            stats["outbox"]["dead"].as_u64()
        ),
        (Some(4), Some(0))
    );
    // Per-minute totals from the throughput log `outbox run` records, as its
    // dashboard reads them (not recounted from the table).
    assert_eq!(stats["precision"]["per_minute"], "recorded", "{stats}");
    let (code, stdout, _) = operator(&cfg, &["stats"]);
    assert_eq!(code, Some(0));
    assert!(stdout.contains("pending=4"), "{stdout}");
    let (code, _, stderr) = operator(&cfg, &["dead-letters", "delete", &letter.to_string()]);
    assert_eq!(code, Some(0), "{stderr}");
    let (code, _, _) = operator(&cfg, &["dead-letters", "delete", &letter.to_string()]);
    assert_eq!(code, Some(1), "already gone");

    // Every write that ran, audited as the OS user; dry runs and refusals not.
    let audit: Vec<(String, String, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT actor, action, count FROM {}.outbox_audit ORDER BY seq",
        w.schema.quoted()
    )))
    .fetch_all(&w.pool)
    .await
    .expect("audit");
    let actions: Vec<(&str, i64)> = audit.iter().map(|(_, a, c)| (a.as_str(), *c)).collect();
    assert_eq!(
        actions,
        [
            ("requeue_matching", 3),
            ("delete_matching", 0),
            ("delete_forced", 1),
            ("delete_matching", 2),
            ("reconsume_matching", 2),
            ("pause", 1),
            ("pause", 1),
            ("resume", 1),
            ("resume", 1),
            ("resume", 0),
            ("delete_dead_letter", 1),
        ]
    );
    assert!(
        audit
            .iter()
            .all(|(actor, _, _)| actor == "cli:e2e-operator"),
        "{audit:?}"
    );

    // Reconsume by filter: billing's dead deliveries, inbox status names; not a
    // terminal here, so no progress bar is drawn.
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {0}.outbox_inbox (consumer, message_id, exchange, routing_key, payload, created_at, status, attempts) \
         SELECT 'billing', id, exchange, routing_key, payload, created_at, 'dead', 3 FROM {0}.outbox_messages",
        w.schema.quoted()
    )))
    .execute(&w.pool)
    .await
    .expect("dead deliveries");
    let (code, stdout, stderr) = operator(
        &cfg,
        &[
            "consumers",
            "deliveries",
            "billing",
            "--status",
            "dead",
            "--json",
        ],
    );
    assert_eq!(code, Some(0), "{stderr}");
    let items = parse_json(&stdout)["items"].clone();
    assert_eq!(items.as_array().map(Vec::len), Some(4), "{stdout}");
    assert!(
        items
            .as_array()
            .into_iter()
            .flatten()
            .all(|i| i["status"] == "dead"),
        "{stdout}"
    );
    let reconsume = ["consumers", "reconsume", "billing", "--filter", "--status"];
    let (code, _, stderr) = operator(&cfg, &[&reconsume[..], &["pending"]].concat());
    assert_ne!(code, Some(0));
    assert!(stderr.contains("received"), "{stderr}");
    let (code, stdout, stderr) = operator(&cfg, &[&reconsume[..], &["dead", "--json"]].concat());
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(
        parse_json(&stdout),
        serde_json::json!({"matched": 4, "changed": 4})
    );
    assert!(
        !stderr.contains('\u{2588}') && !stderr.contains("reconsumed ("),
        "{stderr}"
    );
    let received: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {}.outbox_inbox WHERE status = 'received' AND consumer = 'billing'",
        w.schema.quoted()
    )))
    .fetch_one(&w.pool)
    .await
    .expect("count");
    assert_eq!(received, 4);
    w.cleanup().await;
}

/// Passive declare: how many messages `queue` holds, or `None` when it does not
/// exist (a failed passive declare closes its channel, so each gets its own).
async fn queue_depth(w: &World, queue: &str) -> Option<u32> {
    let ch = w.amqp.create_channel().await.expect("channel");
    let declared = ch
        .queue_declare(
            queue.into(),
            lapin::options::QueueDeclareOptions {
                passive: true,
                ..lapin::options::QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await;
    declared.ok().map(|q| q.message_count())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_run_declares_its_topology_from_config_and_refuses_a_conflicting_one() {
    let Some(w) = World::new("topology").await else {
        return;
    };
    let (exchange, queue) = (format!("{}.cfg", w.exchange), format!("{}.cfg", w.queue));
    assert_eq!(queue_depth(&w, &queue).await, None, "not there before");
    let port = free_port();
    let cfg = w.config(
        "topo",
        &format!(
            "[http]\naddress = \"127.0.0.1:{port}\"\n\
             [[admin.tokens]]\nname = \"dashboard\"\nsecret = \"{READ_SECRET}\"\nrole = \"read\"\n\
             [[topology.exchanges]]\nname = \"{exchange}\"\nkind = \"topic\"\n\
             [[topology.queues]]\nname = \"{queue}\"\nmax_length = 1000\noverflow = \"reject-publish\"\n\
             [[topology.bindings]]\nqueue = \"{queue}\"\nexchange = \"{exchange}\"\nrouting_key = \"order.*\"\n"
        ),
    );
    let relay = w.relay(&cfg);
    w.wait_until("HTTP up", 30, async || {
        api(port, "GET", "/healthz", None).await.0 == 200
    })
    .await;
    let outbox = PgOutbox::new(w.schema.clone());
    let mut conn = w.pool.acquire().await.expect("conn");
    let batch = (0..5)
        .map(|i| NewMessage::new(&exchange, "order.created", format!("{i}").into_bytes()))
        .collect();
    outbox
        .enqueue_batch(&mut conn, batch)
        .await
        .expect("enqueue");
    w.wait_until("sent through the declared binding", 30, async || {
        queue_depth(&w, &queue).await == Some(5)
    })
    .await;
    // The dashboard's numbers read the topology's queue from the broker.
    let (status, stats) = api(port, "GET", "/api/v1/stats", Some(READ_SECRET)).await;
    assert_eq!(status, 200, "{stats}");
    assert_eq!(stats["precision"]["queues"], "broker", "{stats}");
    assert_eq!(stats["queues"][0]["name"], queue.as_str(), "{stats}");
    assert_eq!(stats["queues"][0]["messages"], 5, "{stats}");
    assert!(relay.terminate().await.success());

    // The same queue declared as a quorum queue: the broker refuses (it exists as a
    // classic one), and start-up stops naming it instead of running half-declared.
    let conflict = w.config(
        "conflict",
        &format!(
            "[http]\nenabled = false\n[[topology.queues]]\nname = \"{queue}\"\ntype = \"quorum\"\n"
        ),
    );
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        Command::new(BIN)
            .args(["run", "--config"])
            .arg(&conflict)
            .env("RUST_LOG", "warn")
            .output(),
    )
    .await
    .expect("outbox run stops by itself")
    .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a conflicting topology must stop start-up: {stderr}"
    );
    assert!(
        stderr.contains("topology") && stderr.contains(&queue),
        "the error names the topology and the queue: {stderr}"
    );
    assert_eq!(
        queue_depth(&w, &queue).await,
        Some(5),
        "the existing queue is untouched"
    );

    if let Ok(ch) = w.amqp.create_channel().await {
        let _ = ch
            .queue_delete(
                queue.as_str().into(),
                lapin::options::QueueDeleteOptions::default(),
            )
            .await;
        let _ = ch
            .exchange_delete(
                exchange.as_str().into(),
                lapin::options::ExchangeDeleteOptions::default(),
            )
            .await;
    }
    w.cleanup().await;
}

/// A delayed message written through the SQL contract (`not_before`) to a relay
/// that sleeps on NOTIFY with a 30 s poll: the insert wakes it, it finds nothing
/// due, and its timer (not the poll) publishes the message within a second of its
/// due time, never before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_run_publishes_a_delayed_message_at_its_due_time() {
    let Some(w) = World::new("delayed").await else {
        return;
    };
    let cfg = w.config("d", "[http]\nenabled = false\n");
    std::fs::write(
        &cfg,
        std::fs::read_to_string(&cfg)
            .expect("read")
            .replace("idle_poll = \"500ms\"", "idle_poll = \"30s\""),
    )
    .expect("write");
    let relay = w.relay(&cfg);
    let t = format!("{}.outbox_messages", w.schema.quoted());
    let idle = format!("{}.outbox_relay_idle", w.schema.quoted());
    w.wait_until("the relay idles on NOTIFY", 30, async || {
        sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {idle}")))
            .fetch_one(&w.pool)
            .await
            .unwrap_or(0)
            > 0
    })
    .await;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {t} (exchange, routing_key, payload, not_before) \
         VALUES ($1, 'order.delayed', convert_to('{{}}', 'UTF8'), now() + interval '2 seconds')"
    )))
    .bind(&w.exchange)
    .execute(&w.pool)
    .await
    .expect("insert");
    w.wait_until("the delayed message is sent", 10, async || {
        w.count("sent").await == 1
    })
    .await;
    let (late_ms,): (f64,) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT (extract(epoch FROM sent_at - not_before) * 1000)::float8 FROM {t}"
    )))
    .fetch_one(&w.pool)
    .await
    .expect("times");
    assert!(relay.terminate().await.success());
    assert!(
        (0.0..1000.0).contains(&late_ms),
        "sent {late_ms} ms after its due time (before it, or not within a second)"
    );
    w.cleanup().await;
}

/// Per-key order through two real relays and RabbitMQ, read by an independent
/// (plain AMQP) consumer: 20,000 messages over 200 keys. Key k0's first message
/// goes to an exchange that is missing for 30 s (or until the rest are through, if
/// that takes longer): every other key's messages arrive
/// meanwhile, each key in order, and none of k0's; once the exchange exists, k0
/// drains in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_relays_keep_each_keys_order_and_a_blocked_key_holds_back_only_itself() {
    const KEYS: usize = 200;
    const PER_KEY: usize = 100;
    const BLOCKED_FOR: Duration = Duration::from_secs(30);
    let Some(w) = World::new("ordered").await else {
        return;
    };
    let late = format!("{}.late", w.exchange);
    let retry = "[http]\nenabled = false\n[retry]\ninitial_backoff = \"100ms\"\nmax_backoff = \"200ms\"\nmax_attempts = 1000\n";
    let configs: Vec<PathBuf> = ["o1", "o2"]
        .iter()
        .map(|name| {
            let cfg = w.config(name, retry);
            let text = std::fs::read_to_string(&cfg).expect("read").replace(
                "[sweep]\n",
                "[sweep]\ninterval = \"1s\"\nlock_wait = \"200ms\"\n",
            );
            std::fs::write(&cfg, text).expect("write");
            cfg
        })
        .collect();
    // The independent consumer: (key, number, arrived after the exchange appeared).
    let arrivals = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(usize, usize, bool)>::new()));
    let created = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let ch = w.amqp.create_channel().await.expect("channel");
    ch.basic_qos(1000, BasicQosOptions::default())
        .await
        .expect("qos");
    let mut deliveries = ch
        .basic_consume(
            w.queue.as_str().into(),
            format!("ordered-{}", w.id).as_str().into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("consume");
    let reader = {
        let arrivals = std::sync::Arc::clone(&arrivals);
        let created = std::sync::Arc::clone(&created);
        tokio::spawn(async move {
            while let Some(Ok(d)) = deliveries.next().await {
                let body = String::from_utf8_lossy(&d.data).into_owned();
                let (k, n) = body.split_once('/').expect("key/number body");
                let after = created.load(std::sync::atomic::Ordering::SeqCst);
                arrivals.lock().expect("lock").push((
                    k.parse().expect("key"),
                    n.parse().expect("number"),
                    after,
                ));
                d.acker.ack(BasicAckOptions::default()).await.expect("ack");
            }
        })
    };
    let outbox = PgOutbox::new(w.schema.clone());
    let mut conn = w.pool.acquire().await.expect("conn");
    for n in 0..PER_KEY {
        let batch = (0..KEYS)
            .map(|k| {
                let exchange = if k == 0 && n == 0 { &late } else { &w.exchange };
                NewMessage::new(exchange, "order.event", format!("{k}/{n}").into_bytes())
                    .with_ordering_key(format!("k{k}"))
            })
            .collect();
        outbox
            .enqueue_batch(&mut conn, batch)
            .await
            .expect("enqueue");
    }
    drop(conn);
    let started = tokio::time::Instant::now();
    let relays: Vec<Relay> = configs.iter().map(|c| w.relay(c)).collect();
    let others = (KEYS - 1) * PER_KEY;
    // They must all arrive while k0's exchange is missing: it stays missing for
    // at least BLOCKED_FOR, and longer if they need longer (a loaded machine).
    w.wait_until("every other key's messages", 120, async || {
        arrivals.lock().expect("lock").len() >= others
    })
    .await;
    let others_took = started.elapsed();
    tokio::time::sleep(BLOCKED_FOR.saturating_sub(others_took)).await;
    assert_eq!(
        arrivals.lock().expect("lock").len(),
        others,
        "nothing of k0 arrives while its first message cannot be published"
    );
    assert!(w.count("publish_failed").await >= 1, "k0's head is failing");
    created.store(true, std::sync::atomic::Ordering::SeqCst);
    w.declare(&late).await;
    w.wait_until("k0 drains once its exchange exists", 30, async || {
        arrivals.lock().expect("lock").len() >= KEYS * PER_KEY
    })
    .await;
    for relay in relays {
        assert!(relay.terminate().await.success());
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    reader.abort();
    let arrivals = arrivals.lock().expect("lock").clone();
    assert_eq!(arrivals.len(), KEYS * PER_KEY, "each message arrives once");
    let mut per_key: Vec<Vec<usize>> = vec![Vec::new(); KEYS];
    for (k, n, after) in &arrivals {
        assert_eq!(
            *after,
            *k == 0,
            "key {k} #{n}: only k0 waits for the exchange"
        );
        per_key[*k].push(*n);
    }
    let in_order: Vec<usize> = (0..PER_KEY).collect();
    for (k, ns) in per_key.iter().enumerate() {
        assert_eq!(ns, &in_order, "key k{k} arrived out of order");
    }
    eprintln!(
        "199 keys x {PER_KEY} arrived in {:.1} s while k0 was blocked; k0 drained after",
        others_took.as_secs_f64()
    );
    w.cleanup().await;
}

/// `outbox ordering blocked` lists the keys held back by a dead head, with the
/// head and the count waiting behind it, as the admin API does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ordering_command_lists_blocked_keys() {
    let Some(w) = World::new("opblk").await else {
        return;
    };
    let cfg = w.config("cli", "[http]\nenabled = false\n");
    let head: uuid::Uuid = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "WITH rows AS (INSERT INTO {}.outbox_messages \
           (exchange, routing_key, payload, ordering_key, status, attempts, last_error) \
         VALUES ($1, 'k.o', '\\x00'::bytea, 'cli-key', 'dead', 2, 'nope'), \
                ($1, 'k.o', '\\x00'::bytea, 'cli-key', 'pending', 0, NULL) \
         RETURNING id, seq) SELECT id FROM rows ORDER BY seq LIMIT 1",
        w.schema.quoted()
    )))
    .bind(&w.exchange)
    .fetch_one(&w.pool)
    .await
    .expect("keyed rows");
    let (code, stdout, stderr) = operator(&cfg, &["ordering", "blocked", "--json"]);
    assert_eq!(code, Some(0), "{stderr}");
    let page = parse_json(&stdout);
    assert_eq!(page["items"][0]["key"], "cli-key", "{page}");
    assert_eq!(page["items"][0]["head_id"], head.to_string());
    assert_eq!(page["items"][0]["head_status"], "dead");
    assert_eq!(page["items"][0]["waiting"], 1);
    let (code, stdout, _) = operator(&cfg, &["ordering", "blocked"]);
    assert_eq!(code, Some(0));
    assert!(
        stdout.starts_with(&format!("cli-key\t{head}\tdead\t2\t1\t")),
        "{stdout}"
    );
    let (code, _, stderr) = operator(&cfg, &["ordering", "blocked", "--limit", "0"]);
    assert_ne!(code, Some(0));
    assert!(stderr.contains("limit"), "{stderr}");
}

/// `outbox messages replay`: refused while `[admin] allow_edit` is off (saying
/// so); with it on, the payload from a file and a header set, the new message
/// named on stdout and showing its original, the original kept dead and never
/// requeued beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pausing_an_exchange_no_unsent_message_carries_warns_on_stderr_and_holds() {
    let Some(w) = World::new("pausewarn").await else {
        return;
    };
    let cfg = w.config("cli", "[http]\nenabled = false\n");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {}.outbox_messages (exchange, routing_key, payload) VALUES ($1, 'k', '\\x00'::bytea)",
        w.schema.quoted()
    )))
    .bind(&w.exchange)
    .execute(&w.pool)
    .await
    .expect("a pending row");

    // The exchange messages carry: no warning.
    let (code, stdout, stderr) = operator(&cfg, &["pause", "exchange", &w.exchange]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("paused exchange"), "{stderr}");
    assert!(!stderr.contains("warning"), "{stderr}");
    assert_eq!(stdout, "", "nothing on stdout");
    // One of its shards' names, which no message carries: paused, with a warning
    // on stderr naming the exchange to pause instead.
    let shard = format!("{}.shard-1", w.exchange);
    let (code, stdout, stderr) = operator(&cfg, &["pause", "exchange", &shard]);
    assert_eq!(code, Some(0), "a warning is no failure: {stderr}");
    assert_eq!(stdout, "", "nothing on stdout");
    let warning = stderr
        .lines()
        .find(|l| l.starts_with("warning: "))
        .unwrap_or_else(|| panic!("no warning on stderr: {stderr}"));
    assert!(
        warning.contains(&format!(
            "no unsent message carries the exchange name {shard:?}"
        )) && warning.contains(&format!("pause {:?}", w.exchange)),
        "{warning}"
    );
    let (code, stdout, stderr) = operator(&cfg, &["pauses"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with(&format!("exchange\t{shard}\t"))),
        "the pause is in force all the same: {stdout}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_replay_command_edits_a_dead_message_only_when_editing_is_on() {
    let Some(w) = World::new("replaycli").await else {
        return;
    };
    let dead = insert_dead(&w, "order.created").await;
    let off = w.config("replay-off", "[http]\nenabled = false\n");
    let (code, _, stderr) = operator(&off, &["messages", "replay", &dead]);
    assert_ne!(code, Some(0));
    assert!(stderr.contains("allow_edit"), "{stderr}");

    let on = w.config(
        "replay-on",
        "[http]\nenabled = false\n[admin]\nallow_edit = true\n",
    );
    let payload = w.dir.join("fixed.json");
    std::fs::write(&payload, r#"{"n":2}"#).expect("payload file");
    let (code, stdout, stderr) = operator(
        &on,
        &[
            "messages",
            "replay",
            &dead,
            "--payload-file",
            payload.to_str().expect("utf-8 path"),
            "--header",
            "x-fixed=yes",
            "--json",
        ],
    );
    assert_eq!(code, Some(0), "{stderr}");
    let made = parse_json(&stdout);
    assert_eq!(made["replayed_from"], dead);
    let new = made["id"].as_str().expect("new id").to_owned();
    let (code, stdout, _) = operator(&on, &["messages", "show", &new, "--json"]);
    assert_eq!(code, Some(0));
    let shown = parse_json(&stdout);
    assert_eq!(shown["status"], "pending");
    assert_eq!(shown["payload"], r#"{"n":2}"#);
    assert_eq!(shown["headers"]["x-fixed"], "yes");
    assert_eq!(shown["replayed_from"], dead);
    let (code, _, stderr) = operator(&on, &["messages", "requeue", &dead]);
    assert_ne!(code, Some(0), "a replayed message is not requeued");
    assert!(stderr.contains("replayed as"), "{stderr}");
    let (code, _, stderr) = operator(&on, &["messages", "replay", &dead]);
    assert_ne!(code, Some(0), "nor replayed twice");
    assert!(stderr.contains("replayed already"), "{stderr}");

    // A dead delivery: replayed as a new one of the same consumer.
    let delivery = uuid::Uuid::now_v7();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {}.outbox_inbox (consumer, message_id, exchange, routing_key, payload, headers, created_at, status, last_error) \
         VALUES ('billing', $1, 'orders', 'order.created', '\\x7b7d', '{{\"x-bad\":\"1\"}}', now(), 'dead', 'handler said no')",
        w.schema.quoted()
    )))
    .bind(delivery)
    .execute(&w.pool)
    .await
    .expect("a dead delivery");
    let (code, stdout, stderr) = operator(
        &on,
        &[
            "consumers",
            "replay",
            "billing",
            &delivery.to_string(),
            "--drop-header",
            "x-bad",
            "--json",
        ],
    );
    assert_eq!(code, Some(0), "{stderr}");
    let new = parse_json(&stdout)["id"].as_str().expect("id").to_owned();
    let (code, stdout, stderr) = operator(
        &on,
        &[
            "consumers",
            "deliveries",
            "billing",
            "--status",
            "received",
            "--json",
        ],
    );
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.contains(&new),
        "the replay waits for its sweep: {stdout}"
    );
    let (code, _, stderr) = operator(
        &on,
        &["consumers", "reconsume", "billing", &delivery.to_string()],
    );
    assert_ne!(code, Some(0), "a replayed delivery is not reconsumed");
    assert!(stderr.contains("replayed as"), "{stderr}");
}

/// curl with the cookie jar `jar`: (status, body).
async fn browse(jar: &std::path::Path, url: &str, form: Option<&str>) -> (u16, String) {
    let mut c = Command::new("curl");
    c.args(["-s", "-o", "-", "-w", "\n%{http_code}", "-c"])
        .arg(jar)
        .arg("-b")
        .arg(jar);
    if let Some(form) = form {
        c.args(["--data", form]);
    }
    let out = c.arg(url).output().await.expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_owned())
}

/// A dashboard session is kept in the outbox's schema: after `outbox run` is
/// stopped and started again, the browser's cookie still opens the dashboard;
/// the table holds a hash of the cookie's secret, never the secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dashboard_session_survives_a_restart_of_outbox_run() {
    let Some(w) = World::new("uisession").await else {
        return;
    };
    let port = free_port();
    let cfg = w.config(
        "sessions",
        &format!(
            "[http]\naddress = \"127.0.0.1:{port}\"\n\
             [[admin.tokens]]\nname = \"ops-alice\"\nsecret = \"{WRITE_SECRET}\"\nrole = \"write\"\n"
        ),
    );
    let base = format!("http://127.0.0.1:{port}");
    let jar = std::env::temp_dir().join(format!("outbox-jar-{}", w.schema));
    let _ = std::fs::remove_file(&jar);
    let up = async || {
        w.wait_until("HTTP up", 20, async || {
            api(port, "GET", "/healthz", None).await.0 == 200
        })
        .await;
    };
    let relay = w.relay(&cfg);
    up().await;
    let (status, form) = browse(&jar, &format!("{base}/ui/login"), None).await;
    assert_eq!(status, 200);
    let nonce = form
        .split("name=\"login_csrf\" value=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .expect("the login form's nonce");
    let (status, _) = browse(
        &jar,
        &format!("{base}/ui/login"),
        Some(&format!("token={WRITE_SECRET}&login_csrf={nonce}")),
    )
    .await;
    assert_eq!(status, 303, "logged in");
    let jar_text = std::fs::read_to_string(&jar).expect("the cookie jar");
    let cookie = jar_text
        .lines()
        .find_map(|l| {
            // Named after the port (two dashboards on one host keep theirs).
            l.split_once(&format!("outbox_session_{port}\t"))
                .map(|(_, v)| v.trim().to_owned())
        })
        .expect("a session cookie");
    let stored: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT id FROM {}.outbox_ui_sessions",
        w.schema.quoted()
    )))
    .fetch_all(&w.pool)
    .await
    .expect("sessions table");
    assert_eq!(stored.len(), 1);
    assert!(
        !stored[0].contains(&cookie) && !cookie.contains(&stored[0]),
        "stored under a hash of the cookie"
    );
    assert!(relay.terminate().await.success());

    let relay = w.relay(&cfg);
    up().await;
    let (status, page) = browse(&jar, &format!("{base}/ui"), None).await;
    assert_eq!(status, 200, "still signed in after the restart: {page}");
    assert!(
        page.contains(r#"<strong id="actor">ops-alice</strong>"#),
        "{page}"
    );
    // An open overview's live stream does not hold the shutdown up: the relay
    // stops as promptly with one open as without.
    let stream = Command::new("curl")
        .args(["-s", "-N", "-o", "/dev/null", "-b"])
        .arg(&jar)
        .arg(format!("{base}/ui/overview/stream"))
        .kill_on_drop(true)
        .spawn()
        .expect("curl");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let stopping = std::time::Instant::now();
    assert!(relay.terminate().await.success());
    assert!(
        stopping.elapsed() < Duration::from_secs(10),
        "stopped in {:?} with a live stream open",
        stopping.elapsed()
    );
    drop(stream);
    let _ = std::fs::remove_file(&jar);
}
