//! The whole flow across processes: relays (the real `outbox` CLI) and the example
//! billing consumer (`outbox-e2e-billing`) against the local PostgreSQL and RabbitMQ.

use std::collections::HashSet;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use outbox_adapters_postgres::{PgPool, PgSchema};
use outbox_adapters_rabbitmq::{RabbitPublisher, RabbitPublisherConfig};
use outbox_examples::{Shop, orders};
use outbox_ports::Publisher;
use tokio::process::{Child, Command};

const RELAY: &str = env!("CARGO_BIN_EXE_outbox-e2e-relay");
const BILLING: &str = env!("CARGO_BIN_EXE_outbox-e2e-billing");

struct Flow {
    shop: Shop,
    pool: PgPool,
    dir: PathBuf,
    id: String,
}

impl Flow {
    async fn new(test: &str) -> Option<Self> {
        let id = outbox_testkit::unique_key(test).replace(['.', '-'], "_");
        let tail = &id[id.len() - 16..];
        let shop = Shop {
            database_url: outbox_testkit::services::TestUrls::from_env().pg,
            amqp_url: outbox_testkit::services::TestUrls::from_env().amqp,
            amqp_failover_urls: Vec::new(),
            schema: PgSchema::new(&format!("shop_{tail}")).expect("schema"),
            outbox_schema: PgSchema::new(&format!("obx_{tail}")).expect("schema"),
            queue: format!("e2e.{id}.billing"),
            exchange: format!("e2e.{id}.orders"),
            billing_queue: outbox_examples::BillingQueue::default(),
        };
        let pool = match shop.pool().await {
            Ok(p) => p,
            Err(e) if std::env::var("CI").is_ok_and(|v| v == "true") => {
                panic!("PostgreSQL unreachable in CI: {e}")
            }
            Err(e) => {
                eprintln!("SKIPPED (not in CI): {e}");
                return None;
            }
        };
        shop.setup(&pool).await.expect("setup");
        let dir = std::env::temp_dir().join(format!("outbox-flow-{id}"));
        std::fs::create_dir_all(&dir).expect("dir");
        Some(Self {
            shop,
            pool,
            dir,
            id,
        })
    }

    fn relay(&self, name: &str) -> Child {
        let cfg = self.dir.join(format!("{name}.toml"));
        std::fs::write(
            &cfg,
            format!(
                "instance = \"{name}-{id}\"\n[adapters]\nstore = \"postgres\"\npublisher = \"rabbitmq\"\nlock = \"postgres\"\nsweep_state = \"postgres\"\n\
                 [postgres]\nurl = \"{pg}\"\nschema = \"{schema}\"\n[rabbitmq]\nurl = \"{amqp}\"\n[dispatch]\nidle_poll = \"500ms\"\n\
                 [sweep]\ninterval = \"2s\"\nlock_wait = \"300ms\"\n[http]\nenabled = false\n",
                id = self.id,
                pg = self.shop.database_url,
                schema = self.shop.outbox_schema,
                amqp = self.shop.amqp_url,
            ),
        )
        .expect("config");
        Command::new(RELAY)
            .args(["run", "--config"])
            .arg(&cfg)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(cfg.with_extension("log")).expect("log"))
            .kill_on_drop(true)
            .spawn()
            .expect("relay")
    }

    fn consumer(&self, name: &str, env: &[(&str, &str)]) -> Child {
        let mut c = Command::new(BILLING);
        c.env("SHOP_DATABASE_URL", &self.shop.database_url)
            .env("SHOP_AMQP_URL", &self.shop.amqp_url)
            .env("SHOP_SCHEMA", self.shop.schema.as_str())
            .env("OUTBOX_SCHEMA", self.shop.outbox_schema.as_str())
            .env("BILLING_QUEUE", &self.shop.queue)
            .env("SHOP_EXCHANGE", &self.shop.exchange)
            .env("BILLING_SWEEP_INTERVAL", "1s")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.dir.join(format!("{name}.log"))).expect("log"))
            .kill_on_drop(true);
        for (k, v) in env {
            c.env(k, v);
        }
        c.spawn().expect("consumer")
    }

    async fn scalar(&self, sql: &str) -> i64 {
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .fetch_one(&self.pool)
            .await
            .expect("query")
    }

    async fn invoices(&self) -> i64 {
        self.scalar(&format!(
            "SELECT count(*) FROM {}.invoices",
            self.shop.schema.quoted()
        ))
        .await
    }

    async fn inbox(&self, status: &str) -> i64 {
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM {}.outbox_inbox WHERE status = $1",
            self.shop.outbox_schema.quoted()
        )))
        .bind(status)
        .fetch_one(&self.pool)
        .await
        .expect("inbox")
    }

    async fn wait_for(&self, what: &str, secs: u64, mut done: impl AsyncFnMut() -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
        while !done().await {
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Creates orders `first..first+n` from 16 tasks; every tenth is rolled back.
    /// Returns (committed order ids, rolled-back order ids).
    async fn create_orders(&self, first: i64, n: i64) -> (HashSet<i64>, HashSet<i64>) {
        let shop = Arc::new(self.shop.clone());
        let mut tasks = Vec::new();
        for t in 0..16 {
            let (shop, pool) = (Arc::clone(&shop), self.pool.clone());
            tasks.push(tokio::spawn(async move {
                let (mut ok, mut back) = (Vec::new(), Vec::new());
                for id in (first..first + n).filter(|id| id % 16 == t) {
                    let roll_back = id % 10 == 0;
                    orders::create(&shop, &pool, id, 100 + id, roll_back)
                        .await
                        .expect("order");
                    if roll_back {
                        back.push(id)
                    } else {
                        ok.push(id)
                    }
                }
                (ok, back)
            }));
        }
        let (mut ok, mut back) = (HashSet::new(), HashSet::new());
        for t in tasks {
            let (o, b) = t.await.expect("producer");
            ok.extend(o);
            back.extend(b);
        }
        (ok, back)
    }

    async fn cleanup(self) {
        self.shop.teardown(&self.pool).await;
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn terminate(mut child: Child) -> bool {
    if let Some(pid) = child.id() {
        let _ = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .await;
    }
    tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("stops within 30 s")
        .expect("wait")
        .success()
}

async fn assert_exactly_once(f: &Flow, committed: &HashSet<i64>, rolled_back: &HashSet<i64>) {
    let billed: Vec<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT order_id FROM {}.invoices",
        f.shop.schema.quoted()
    )))
    .fetch_all(&f.pool)
    .await
    .expect("invoices");
    let billed_set: HashSet<i64> = billed.iter().copied().collect();
    assert_eq!(billed.len(), billed_set.len(), "an order was billed twice");
    assert_eq!(
        &billed_set, committed,
        "billed orders differ from committed ones"
    );
    assert!(
        billed_set.is_disjoint(rolled_back),
        "a rolled-back order was billed"
    );
    assert_eq!(f.inbox("consumed").await as usize, committed.len());
    assert_eq!(
        f.inbox("dead").await + f.inbox("consume_failed").await,
        0,
        "no delivery failed for good"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_relays_and_two_consumers_bill_every_committed_order_exactly_once() {
    let Some(f) = Flow::new("flow").await else {
        return;
    };
    let (r1, r2) = (f.relay("r1"), f.relay("r2"));
    let faults = [("BILLING_FAIL_FIRST_PERCENT", "5")];
    let (c1, c2) = (f.consumer("c1", &faults), f.consumer("c2", &faults));
    let (committed, rolled_back) = f.create_orders(1, 10_000).await;
    f.wait_for("every order billed", 180, async || {
        f.invoices().await as usize == committed.len()
    })
    .await;
    // Duplicates at the broker: publish 300 already consumed messages again.
    let again: Vec<outbox_core::Message> = {
        let store = outbox_adapters_postgres::PgOutboxStore::new(
            f.pool.clone(),
            f.shop.outbox_schema.clone(),
        );
        outbox_ports::OutboxOperator::oldest_messages(&store, outbox_core::OutboxStatus::Sent, 300)
            .await
            .expect("sent")
            .into_iter()
            .map(|r| r.message)
            .collect()
    };
    let publisher = RabbitPublisher::new(RabbitPublisherConfig::new(&f.shop.amqp_url));
    assert!(
        publisher
            .publish(&again)
            .await
            .iter()
            .all(|o| o.is_confirmed())
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    for child in [r1, r2, c1, c2] {
        assert!(
            terminate(child).await,
            "a process did not exit cleanly on SIGTERM"
        );
    }
    eprintln!(
        "committed {}, rolled back {}, billed {}",
        committed.len(),
        rolled_back.len(),
        f.invoices().await
    );
    assert_exactly_once(&f, &committed, &rolled_back).await;
    f.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_killed_mid_stream_is_replaced_without_loss_or_double_billing() {
    let Some(f) = Flow::new("kill").await else {
        return;
    };
    let relay = f.relay("r");
    let mut victim = f.consumer("victim", &[]);
    let (committed, rolled_back) = f.create_orders(1, 4_000).await;
    f.wait_for("some billing", 60, async || f.invoices().await >= 500)
        .await;
    victim.start_kill().expect("SIGKILL");
    let _ = victim.wait().await;
    let at_kill = f.invoices().await;
    eprintln!(
        "billed when the consumer was killed: {at_kill} of {}",
        committed.len()
    );
    let successor = f.consumer("successor", &[]);
    f.wait_for("the rest billed", 180, async || {
        f.invoices().await as usize == committed.len()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(terminate(successor).await);
    assert!(terminate(relay).await);
    assert_exactly_once(&f, &committed, &rolled_back).await;
    f.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_message_ends_dead_while_the_rest_flows_and_reconsume_brings_it_back() {
    let Some(f) = Flow::new("poison").await else {
        return;
    };
    let relay = f.relay("r");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let addr = format!("127.0.0.1:{port}");
    let consumer = f.consumer(
        "c",
        &[
            ("BILLING_POISON_ORDERS", "7"),
            ("BILLING_METRICS_ADDR", addr.as_str()),
        ],
    );
    let (committed, _) = f.create_orders(1, 50).await;
    f.wait_for("the poison message to die", 90, async || {
        f.inbox("dead").await == 1
    })
    .await;
    f.wait_for("the rest billed", 60, async || {
        f.invoices().await as usize == committed.len() - 1
    })
    .await;
    let metrics = Command::new("curl")
        .args(["-s", &format!("http://{addr}/metrics")])
        .output()
        .await
        .expect("curl");
    let text = String::from_utf8_lossy(&metrics.stdout);
    assert!(
        text.contains("outbox_consume_dead_total{consumer=\"billing\"} 1"),
        "{text}"
    );

    let cfg = f.dir.join("r.toml");
    let cli = |args: &[&str]| {
        std::process::Command::new(RELAY)
            .arg("dead")
            .args(args)
            .arg("--config")
            .arg(&cfg)
            .output()
            .expect("cli")
    };
    let out = cli(&["list", "--consumer", "billing"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(listed.lines().count(), 1, "{listed}");
    assert!(listed.contains("order 7 cannot be billed"), "{listed}");
    let id = listed.split('\t').next().expect("id").to_owned();
    let out = cli(&["reconsume", &id, "--consumer", "billing"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status: String = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT status FROM {}.outbox_inbox WHERE message_id = $1::uuid",
        f.shop.outbox_schema.quoted()
    )))
    .bind(&id)
    .fetch_one(&f.pool)
    .await
    .expect("status");
    assert_ne!(status, "dead", "reconsume brought it back");
    let out = cli(&[
        "reconsume",
        "0190b1a2-0000-7000-8000-000000000000",
        "--consumer",
        "billing",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("has no delivery with id"));
    assert!(terminate(consumer).await);
    assert!(terminate(relay).await);
    f.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handler_database_faults_end_dead_with_their_reason_while_the_rest_flows() {
    let Some(f) = Flow::new("dbfaults").await else {
        return;
    };
    let relay = f.relay("r");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let addr = format!("127.0.0.1:{port}");
    // Order 3's handler swallows a failed statement; order 5's COMMIT fails on a
    // deferred constraint.
    let consumer = f.consumer(
        "c",
        &[
            ("BILLING_SWALLOW_ERROR_ORDERS", "3"),
            ("BILLING_FAIL_AT_COMMIT_ORDERS", "5"),
            ("BILLING_METRICS_ADDR", addr.as_str()),
        ],
    );
    let (committed, _) = f.create_orders(1, 20).await;
    f.wait_for("both faulty orders to die", 90, async || {
        f.inbox("dead").await == 2
    })
    .await;
    f.wait_for("the rest billed", 60, async || {
        f.invoices().await as usize == committed.len() - 2
    })
    .await;
    let errors: Vec<(i32, String)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT attempts, last_error FROM {}.outbox_inbox WHERE status = 'dead' ORDER BY seq",
        f.shop.outbox_schema.quoted()
    )))
    .fetch_all(&f.pool)
    .await
    .expect("dead rows");
    let max = i32::try_from(outbox_examples::billing::MAX_ATTEMPTS).expect("attempts");
    assert!(
        errors.iter().all(|(attempts, _)| *attempts == max),
        "{errors:?}"
    );
    assert!(
        errors
            .iter()
            .any(|(_, e)| e.contains("aborted by a statement the handler ignored")),
        "{errors:?}"
    );
    assert!(
        errors
            .iter()
            .any(|(_, e)| e.contains("refused the commit")
                && e.contains("billing_commit_check_once")),
        "{errors:?}"
    );
    let metrics = Command::new("curl")
        .args(["-s", &format!("http://{addr}/metrics")])
        .output()
        .await
        .expect("curl");
    let text = String::from_utf8_lossy(&metrics.stdout);
    assert!(
        text.contains("outbox_consume_dead_total{consumer=\"billing\"} 2"),
        "{text}"
    );
    assert!(
        text.contains("outbox_retention_deleted_total{consumer=\"billing\"} 0"),
        "the example exposes the retention counter: {text}"
    );
    assert!(terminate(consumer).await);
    assert!(terminate(relay).await);
    f.cleanup().await;
}

/// A producer in another language writes rows through the SQL contract: one whose
/// body is an `OrderCreated` (no version header: version 1) is billed; one whose
/// `order_id` is no integer is dead after exactly one attempt, its reason naming
/// the Rust type and the serde error, its raw body kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_is_not_an_order_is_dead_after_one_attempt_naming_the_type() {
    let Some(f) = Flow::new("typed").await else {
        return;
    };
    let relay = f.relay("r");
    let consumer = f.consumer("c", &[]);
    let o = f.shop.outbox_schema.quoted();
    let sql = format!(
        "INSERT INTO {o}.outbox_messages (exchange, routing_key, message_type, payload) \
         VALUES ($1, 'order.created', 'order.created', convert_to($2, 'UTF8')) RETURNING id"
    );
    let insert = |body: &'static str| {
        sqlx::query_scalar::<_, sqlx::types::Uuid>(sqlx::AssertSqlSafe(&*sql))
            .bind(&f.shop.exchange)
            .bind(body)
            .fetch_one(&f.pool)
    };
    let good = insert(r#"{"order_id": 5, "total_cents": 1200}"#)
        .await
        .expect("good row");
    let bad = insert(r#"{"order_id": "x"}"#).await.expect("bad row");
    f.wait_for("the good order billed", 60, async || {
        f.invoices().await == 1
    })
    .await;
    f.wait_for("the bad one dead", 60, async || f.inbox("dead").await == 1)
        .await;
    let (status, attempts, last_error, body): (String, i32, String, String) = sqlx::query_as(
        sqlx::AssertSqlSafe(format!(
            "SELECT status, attempts, last_error, convert_from(payload, 'UTF8') FROM {o}.outbox_inbox \
             WHERE message_id = $1"
        )),
    )
    .bind(bad)
    .fetch_one(&f.pool)
    .await
    .expect("bad inbox row");
    assert_eq!((status.as_str(), attempts), ("dead", 1), "{last_error}");
    assert!(
        last_error.contains("events::OrderCreated") && last_error.contains("invalid type: string"),
        "{last_error}"
    );
    assert_eq!(body, r#"{"order_id": "x"}"#);
    let billed: sqlx::types::Uuid = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT message_id FROM {}.invoices WHERE order_id = 5",
        f.shop.schema.quoted()
    )))
    .fetch_one(&f.pool)
    .await
    .expect("invoice");
    assert_eq!(billed, good);
    assert!(terminate(consumer).await && terminate(relay).await);
    f.cleanup().await;
}

/// `curl` a JSON body to `url`; the status and the body.
async fn post_json(url: &str, body: &str) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-s", "-X", "POST", "-H", "content-type: application/json"])
        .args(["-d", body, "-w", "\n%{http_code}", url])
        .output()
        .await
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').expect("status line");
    (code.trim().parse().expect("status"), body.to_owned())
}

/// The axum example: `POST /orders` writes the order and its `OrderCreated` in one
/// transaction and answers 201; the relay publishes it and billing bills it once.
/// A second POST of the same order is 409 and publishes nothing; a malformed body
/// is 400 and a negative total 422, neither writing anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_posted_over_http_is_billed_once_through_the_relay() {
    let Some(f) = Flow::new("web").await else {
        return;
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/orders", listener.local_addr().expect("addr"));
    let app = outbox_examples::web::router(f.shop.clone(), f.pool.clone());
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let relay = f.relay("r");
    let consumer = f.consumer("c", &[]);

    let (status, body) = post_json(&url, r#"{"order_id": 42, "total_cents": 1250}"#).await;
    assert_eq!(status, 201, "{body}");
    let created: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(created["order_id"], 42);
    let message_id = created["message_id"]
        .as_str()
        .expect("message id")
        .to_owned();
    let (status, body) = post_json(&url, r#"{"order_id": 42, "total_cents": 1}"#).await;
    assert_eq!(status, 409, "{body}");
    let (status, body) = post_json(&url, r#"{"order_id": "x"}"#).await;
    assert_eq!(status, 400, "{body}");
    let (status, body) = post_json(&url, r#"{"order_id": 43, "total_cents": -5}"#).await;
    assert_eq!(status, 422, "{body}");

    f.wait_for("the order billed", 60, async || f.invoices().await == 1)
        .await;
    let (billed, amount): (sqlx::types::Uuid, i64) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT message_id, amount_cents FROM {}.invoices WHERE order_id = 42",
        f.shop.schema.quoted()
    )))
    .fetch_one(&f.pool)
    .await
    .expect("invoice");
    assert_eq!((billed.to_string(), amount), (message_id, 1250));
    let messages = f
        .scalar(&format!(
            "SELECT count(*) FROM {}.outbox_messages",
            f.shop.outbox_schema.quoted()
        ))
        .await;
    let orders = f
        .scalar(&format!(
            "SELECT count(*) FROM {}.orders",
            f.shop.schema.quoted()
        ))
        .await;
    assert_eq!(
        (messages, orders),
        (1, 1),
        "the refused requests wrote nothing"
    );
    server.abort();
    assert!(terminate(consumer).await && terminate(relay).await);
    f.cleanup().await;
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct InvoiceIssued {
    order_id: i64,
}

impl outbox_core::Event for InvoiceIssued {
    const TYPE: &'static str = "invoice.issued";
    const EXCHANGE: &'static str = "set-per-test";
}

/// Bills an order and publishes `InvoiceIssued` through the inbox's own
/// transaction; order 3's first attempt fails after both writes.
struct BillAndAnnounce {
    invoices: String,
    outbox: outbox_adapters_postgres::PgOutbox,
    exchange: String,
    failed_once: std::sync::Mutex<bool>,
}

#[async_trait::async_trait]
impl outbox_consumer::PgEventHandler<outbox_examples::events::OrderCreated> for BillAndAnnounce {
    async fn handle(
        &self,
        conn: &mut outbox_adapters_postgres::PgConnection,
        order: outbox_examples::events::OrderCreated,
        cx: outbox_consumer::Context,
    ) -> Result<(), outbox_consumer::HandlerError> {
        sqlx::query(sqlx::AssertSqlSafe(&*self.invoices))
            .bind(order.order_id)
            .bind(cx.message_id.as_uuid())
            .bind(order.total_cents)
            .execute(&mut *conn)
            .await?;
        let mut next = cx.follow_up(&InvoiceIssued {
            order_id: order.order_id,
        })?;
        next.exchange.clone_from(&self.exchange);
        self.outbox
            .enqueue(&mut *conn, next)
            .await
            .map_err(outbox_consumer::HandlerError::from_port)?;
        if order.order_id == 3 {
            let mut failed = self.failed_once.lock().expect("lock");
            if !*failed {
                *failed = true;
                return Err("the ledger is busy".into());
            }
        }
        Ok(())
    }
}

/// "Consume one event, publish the next", exactly once in effect end to end: the
/// billing handler writes its invoice and enqueues `InvoiceIssued` in the inbox's
/// transaction; the real relay publishes it through RabbitMQ; a second consumer
/// receives one per order, with the order's id as its cause and correlation, and
/// none from the attempt that failed and rolled back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_published_while_handling_another_goes_out_once_through_the_relay() {
    use outbox_adapters_rabbitmq::{
        BindingSpec, ExchangeKind, ExchangeSpec, QueueSpec, RabbitSubscriber, Topology,
    };
    use outbox_consumer::{
        CancellationToken, ConsumerConfig, PgConsumerWorker, PgHandlerRegistry, SweepTask,
    };
    use outbox_ports::Subscriber as _;

    let Some(f) = Flow::new("followup").await else {
        return;
    };
    let exchange = format!("{}.billing", f.shop.exchange);
    let queue = format!("{}.invoices", f.shop.queue);
    let conn = outbox_adapters_rabbitmq::connect(&f.shop.amqp_url, Duration::from_secs(5))
        .await
        .expect("broker");
    Topology {
        exchanges: vec![ExchangeSpec {
            name: exchange.clone(),
            kind: ExchangeKind::Topic,
            durable: true,
            shards: 1,
        }],
        queues: vec![QueueSpec::durable(&queue)],
        bindings: vec![BindingSpec {
            queue: queue.clone(),
            exchange: exchange.clone(),
            routing_key: "invoice.*".into(),
        }],
    }
    .declare(&conn)
    .await
    .expect("declare");
    let relay = f.relay("r");
    let handler = BillAndAnnounce {
        invoices: format!(
            "INSERT INTO {}.invoices (order_id, message_id, amount_cents) VALUES ($1, $2, $3)",
            f.shop.schema.quoted()
        ),
        outbox: outbox_adapters_postgres::PgOutbox::new(f.shop.outbox_schema.clone()),
        exchange: exchange.clone(),
        failed_once: std::sync::Mutex::new(false),
    };
    let inbox = outbox_adapters_postgres::PgInboxStore::new(f.pool.clone(), &f.shop.outbox_schema);
    let worker = PgConsumerWorker::new(
        inbox,
        Arc::new(RabbitSubscriber::new(&f.shop.amqp_url)),
        PgHandlerRegistry::new().on::<outbox_examples::events::OrderCreated>(handler),
        Arc::new(outbox_ports::SystemClock),
        ConsumerConfig {
            retry: outbox_core::RetryPolicy {
                initial_backoff: Duration::from_millis(10),
                max_backoff: Duration::from_millis(20),
                max_attempts: 5,
            },
            ..ConsumerConfig::new("billing", &f.shop.queue)
        },
    );
    let retries = worker.retry_task();
    let cancel = CancellationToken::new();
    let running = tokio::spawn(worker.run(cancel.clone()));
    let mut causes = std::collections::HashMap::new();
    for id in 1..=5 {
        let message_id = orders::create(&f.shop, &f.pool, id, 100 * id, false)
            .await
            .expect("order");
        causes.insert(id, message_id);
    }
    let sub = RabbitSubscriber::new(&f.shop.amqp_url);
    let mut stream = sub.subscribe(&queue, 10).await.expect("subscribe");
    let mut got = std::collections::HashMap::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while got.len() < 5 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "follow-ups: {got:?}"
        );
        retries.run_batch(10).await.expect("retry batch");
        let Ok(next) = tokio::time::timeout(Duration::from_millis(200), stream.next()).await else {
            continue;
        };
        let d = next.expect("open").expect("delivery");
        let m = d
            .envelope
            .to_message(outbox_core::Timestamp::now_utc())
            .expect("a message");
        let invoice: InvoiceIssued = outbox_core::event::decode(&m).expect("decodes");
        let seen = (
            m.causation_id().map(str::to_owned),
            m.correlation_id.clone(),
        );
        assert!(
            got.insert(invoice.order_id, seen).is_none(),
            "twice: {invoice:?}"
        );
        d.acker.ack().await.expect("ack");
    }
    // Nothing more arrives: the failed attempt's follow-up was rolled back.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        tokio::time::timeout(Duration::from_millis(300), stream.next())
            .await
            .is_err(),
        "a sixth invoice message"
    );
    for (order_id, (cause, correlation)) in &got {
        let order_message = causes[order_id].to_string();
        assert_eq!(cause.as_deref(), Some(order_message.as_str()));
        assert_eq!(correlation.as_deref(), Some(order_message.as_str()));
    }
    assert_eq!(f.invoices().await, 5, "each order billed once");
    cancel.cancel();
    running.await.expect("worker");
    drop(stream);
    if let Ok(ch) = conn.create_channel().await {
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
    assert!(terminate(relay).await);
    f.cleanup().await;
}
