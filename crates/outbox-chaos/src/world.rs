//! One scenario's world: its own schemas, exchange, queues and lock keys; the real
//! relay and consumer as child processes; a producer of orders; and the counting.
//!
//! Counting rests on three records that the processes under test cannot fake:
//! - the shop's `orders` table: an order and its message commit together, so the
//!   committed messages are exactly the committed orders;
//! - a tap queue bound to the shop's exchange with `#`: every copy the broker
//!   accepted, so duplicates at the broker are counted;
//! - the `invoices` table, created here *without* its primary key, so a message
//!   that took effect twice shows up as two rows instead of a failed insert.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use lapin::options::{BasicGetOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use outbox_adapters_postgres::{PgInboxStore, PgOutboxStore, PgPool, PgSchema};
use outbox_examples::billing::CONSUMER;
use outbox_examples::{BillingQueue, Shop, orders};
use outbox_ports::{InboxStore, OutboxStore};
use outbox_testkit::services::TestUrls as Urls;
use tokio::process::{Child, Command};

/// The programs under test.
#[derive(Debug, Clone)]
pub(crate) struct Bins {
    pub(crate) outbox: PathBuf,
    pub(crate) consumer: PathBuf,
}

/// Which store the relay's lock and sweep state use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Coordination {
    Postgres,
    Redis,
}

/// The relay's sweep settings that scenarios vary.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SweepOpts {
    pub(crate) batch_size: u32,
    pub(crate) max_batches: u32,
    pub(crate) lock_ttl: &'static str,
}

impl Default for SweepOpts {
    fn default() -> Self {
        Self {
            batch_size: 50,
            max_batches: 20,
            lock_ttl: "3s",
        }
    }
}

/// Totals read from the database at one moment.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Tally {
    pub(crate) committed: u64,
    pub(crate) consumed: u64,
    pub(crate) effects: u64,
    pub(crate) dead_outbox: u64,
    pub(crate) dead_inbox: u64,
    pub(crate) dead_letters: u64,
    /// Committed orders neither invoiced nor dead (yet).
    pub(crate) unaccounted: u64,
    pub(crate) publish_failed: u64,
}

impl Tally {
    pub(crate) fn dead(&self) -> u64 {
        self.dead_outbox + self.dead_inbox + self.dead_letters
    }
}

/// What the producer did.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Produced {
    pub(crate) attempted: u64,
    pub(crate) errors: u64,
}

/// The relays' claim lease (`dispatch.lease_ttl`) in every scenario.
pub(crate) const LEASE_TTL: Duration = Duration::from_secs(5);
/// The relays' `rabbitmq.confirm_timeout` in every scenario.
pub(crate) const CONFIRM_TIMEOUT: Duration = Duration::from_secs(3);
/// How long after quiescence a late duplicate can still arrive: a relay whose lease
/// ran out while its batch waited for confirms, and the next claimer's publish.
pub(crate) const LATE_DUPLICATES: Duration =
    Duration::from_secs(LEASE_TTL.as_secs() + CONFIRM_TIMEOUT.as_secs() + 1);

pub(crate) struct World {
    pub(crate) id: String,
    pub(crate) shop: Shop,
    pub(crate) pool: PgPool,
    /// The scenario's outbox and inbox, read through the adapter.
    pub(crate) outbox: PgOutboxStore,
    pub(crate) inbox: PgInboxStore,
    pub(crate) urls: Urls,
    /// The broker's nodes: `urls.amqp` alone, or the cluster's nodes, `urls.amqp`
    /// first (then the relays and consumers fail over between them, and the tap
    /// and billing queues are quorum queues, which outlive a node).
    pub(crate) amqp_nodes: Vec<String>,
    /// The AMQP URL the relays and consumers get when not `urls.amqp` (a fault
    /// proxy in front of the broker; see [`World::through`]).
    proc_amqp: Option<String>,
    /// The PostgreSQL URL the relays and consumers get when not `urls.pg` (see
    /// [`World::through_pg`]).
    proc_pg: Option<String>,
    pub(crate) dir: PathBuf,
    pub(crate) tap: String,
    pub(crate) lock_key: String,
    pub(crate) state_key: String,
    /// The `application_name` of the relays' and consumers' PostgreSQL
    /// connections, so that a fault can find exactly theirs.
    pub(crate) proc_app: String,
    bins: Bins,
    amqp: lapin::Connection,
    /// Metrics ports of the consumers started so far.
    consumer_ports: std::sync::Mutex<Vec<u16>>,
}

impl World {
    pub(crate) async fn new(scenario: &str, urls: &Urls, bins: &Bins) -> anyhow::Result<Self> {
        Self::new_in(scenario, urls, bins, "target/chaos/logs").await
    }

    /// As [`World::new`], with the billing queue declared as `billing_queue` says
    /// (the consumers get it through `BILLING_QUEUE_TYPE` and
    /// `BILLING_DELIVERY_LIMIT`).
    pub(crate) async fn with_queue(
        scenario: &str,
        urls: &Urls,
        bins: &Bins,
        billing_queue: BillingQueue,
    ) -> anyhow::Result<Self> {
        Self::new_full(scenario, urls, bins, "target/chaos/logs", billing_queue).await
    }

    /// As [`World::new`], with the logs and configs under `logs/<id>`.
    pub(crate) async fn new_in(
        scenario: &str,
        urls: &Urls,
        bins: &Bins,
        logs: &str,
    ) -> anyhow::Result<Self> {
        Self::new_full(scenario, urls, bins, logs, BillingQueue::default()).await
    }

    /// As [`World::new`], on the RabbitMQ cluster of `nodes` (AMQP URLs): the
    /// billing and tap queues are quorum queues declared through the first node,
    /// and the relays and consumers get every node to fail over between.
    pub(crate) async fn on_cluster(
        scenario: &str,
        urls: &Urls,
        bins: &Bins,
        nodes: &[String],
    ) -> anyhow::Result<Self> {
        let first = nodes.first().context("no cluster node given")?;
        let urls = Urls {
            amqp: first.clone(),
            ..urls.clone()
        };
        let queue = BillingQueue {
            queue_type: outbox_adapters_rabbitmq::QueueType::Quorum,
            delivery_limit: None,
        };
        let mut w = Self::new_full(scenario, &urls, bins, "target/chaos/logs", queue).await?;
        w.amqp_nodes = nodes.to_vec();
        w.shop.amqp_failover_urls = nodes[1..].to_vec();
        // The tap was declared classic (on the first node only): a quorum queue
        // instead, so that it keeps every copy through a node's death.
        let ch = w.channel().await?;
        ch.queue_delete(
            w.tap.as_str().into(),
            lapin::options::QueueDeleteOptions::default(),
        )
        .await?;
        w.bind_tap().await?;
        Ok(w)
    }

    async fn new_full(
        scenario: &str,
        urls: &Urls,
        bins: &Bins,
        logs: &str,
        billing_queue: BillingQueue,
    ) -> anyhow::Result<Self> {
        let nonce = uuid::Uuid::now_v7().simple().to_string();
        let id = format!("{scenario}_{}", &nonce[nonce.len() - 10..]);
        let pg_url = with_application_name(&urls.pg, "outbox-chaos");
        let shop = Shop {
            database_url: urls.pg.clone(),
            amqp_url: urls.amqp.clone(),
            amqp_failover_urls: Vec::new(),
            schema: PgSchema::new(&format!("chaos_shop_{id}"))?,
            outbox_schema: PgSchema::new(&format!("chaos_obx_{id}"))?,
            queue: format!("chaos.{id}.billing"),
            exchange: format!("chaos.{id}.orders"),
            billing_queue,
        };
        let pool = outbox_adapters_postgres::connect(&pg_url, 16, Duration::from_secs(10))
            .await
            .with_context(|| format!("PostgreSQL unreachable at {}", urls.pg))?;
        let s = shop.schema.quoted();
        for sql in [
            format!("CREATE SCHEMA {s}"),
            // No primary key on purpose: a double effect must be visible, not refused.
            format!(
                "CREATE TABLE {s}.invoices (order_id bigint NOT NULL, message_id uuid NOT NULL, amount_cents bigint NOT NULL, billed_at timestamptz NOT NULL DEFAULT now(), \
                 billed_seq bigint GENERATED ALWAYS AS IDENTITY)"
            ),
        ] {
            sqlx::query(sqlx::AssertSqlSafe(sql)).execute(&pool).await?;
        }
        shop.setup(&pool).await.context("shop setup")?;
        let amqp = outbox_adapters_rabbitmq::connect(&urls.amqp, Duration::from_secs(10))
            .await
            .with_context(|| {
                format!(
                    "RabbitMQ unreachable at {}",
                    outbox_core::config::redact_url(&urls.amqp)
                )
            })?;
        let tap = format!("chaos.{id}.tap");
        let w = Self {
            lock_key: format!("chaos.{id}.lock"),
            state_key: format!("chaos.{id}.state"),
            dir: PathBuf::from(logs).join(&id),
            proc_app: format!("outbox-chaos-proc-{id}"),
            id,
            outbox: PgOutboxStore::new(pool.clone(), shop.outbox_schema.clone()),
            inbox: PgInboxStore::new(pool.clone(), &shop.outbox_schema),
            shop,
            pool,
            urls: urls.clone(),
            amqp_nodes: vec![urls.amqp.clone()],
            proc_amqp: None,
            proc_pg: None,
            tap,
            bins: bins.clone(),
            amqp,
            consumer_ports: std::sync::Mutex::default(),
        };
        std::fs::create_dir_all(&w.dir)?;
        w.bind_tap().await?;
        Ok(w)
    }

    /// Declares the tap queue (a quorum queue on a cluster) and binds it to the
    /// shop's exchange.
    pub(crate) async fn bind_tap(&self) -> anyhow::Result<()> {
        let ch = self.channel().await?;
        let mut args = FieldTable::default();
        if self.amqp_nodes.len() > 1 {
            args.insert(
                "x-queue-type".into(),
                lapin::types::AMQPValue::LongString("quorum".into()),
            );
        }
        ch.queue_declare(
            self.tap.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            args,
        )
        .await?;
        ch.queue_bind(
            self.tap.as_str().into(),
            self.shop.exchange.as_str().into(),
            "#".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await?;
        Ok(())
    }

    /// A channel, on a fresh connection to any node that answers when the first
    /// one is gone (the broker may have restarted meanwhile).
    pub(crate) async fn channel(&self) -> anyhow::Result<lapin::Channel> {
        match self.amqp.create_channel().await {
            Ok(ch) => Ok(ch),
            Err(_) => {
                let conn = outbox_adapters_rabbitmq::connect_any(
                    &self.amqp_nodes,
                    &outbox_adapters_rabbitmq::RabbitTls::default(),
                    Duration::from_secs(10),
                )
                .await?;
                Ok(conn.create_channel().await?)
            }
        }
    }

    /// The relays and consumers started from now on reach the broker at `amqp_url`
    /// (a proxy in front of it), the suite's own connections still directly.
    pub(crate) fn through(&mut self, amqp_url: String) {
        self.proc_amqp = Some(amqp_url);
    }

    /// The relays and consumers started from now on reach PostgreSQL at `pg_url`
    /// (a proxy in front of it), the suite's own connections still directly.
    pub(crate) fn through_pg(&mut self, pg_url: String) {
        self.proc_pg = Some(pg_url);
    }

    /// The AMQP URL the relays and consumers get.
    fn proc_amqp_url(&self) -> &str {
        self.proc_amqp.as_deref().unwrap_or(&self.urls.amqp)
    }

    /// The PostgreSQL URL the relays and consumers get: the scenario's, named
    /// [`World::proc_app`].
    pub(crate) fn proc_pg_url(&self) -> String {
        with_application_name(
            self.proc_pg.as_deref().unwrap_or(&self.urls.pg),
            &self.proc_app,
        )
    }

    /// The `outbox run` configuration of relay `name`.
    pub(crate) fn relay_config(
        &self,
        name: &str,
        coordination: Coordination,
        http_port: Option<u16>,
        sweep: SweepOpts,
    ) -> PathBuf {
        let coord = match coordination {
            Coordination::Postgres => "postgres",
            Coordination::Redis => "redis",
        };
        let http = match http_port {
            Some(p) => format!("address = \"127.0.0.1:{p}\"\nenabled = true"),
            None => "enabled = false".to_owned(),
        };
        let text = format!(
            r#"instance = "{name}-{id}"
[adapters]
store = "postgres"
publisher = "rabbitmq"
lock = "{coord}"
sweep_state = "{coord}"
[postgres]
url = "{pg}"
schema = "{schema}"
max_connections = 4
[rabbitmq]
{amqp}
confirm_timeout = "{confirm_s}s"
[redis]
url = "{redis}"
[dispatch]
batch_size = 200
lease_ttl = "{lease_s}s"
idle_poll = "500ms"
[retry]
initial_backoff = "500ms"
max_backoff = "3s"
max_attempts = 30
[sweep]
interval = "1s"
lock_wait = "200ms"
batch_size = {batch}
max_batches_per_sweep = {batches}
lock_ttl = "{ttl}"
lock_key = "{lock}"
state_key = "{state}"
[http]
{http}
"#,
            id = self.id,
            pg = self.proc_pg_url(),
            schema = self.shop.outbox_schema,
            amqp = if self.amqp_nodes.len() > 1 {
                let quoted: Vec<String> =
                    self.amqp_nodes.iter().map(|u| format!("{u:?}")).collect();
                format!("urls = [{}]", quoted.join(", "))
            } else {
                format!("url = {:?}", self.proc_amqp_url())
            },
            redis = self.urls.redis,
            lock = self.lock_key,
            state = self.state_key,
            batch = sweep.batch_size,
            batches = sweep.max_batches,
            ttl = sweep.lock_ttl,
            confirm_s = CONFIRM_TIMEOUT.as_secs(),
            lease_s = LEASE_TTL.as_secs(),
        );
        let path = self.dir.join(format!("{name}.toml"));
        if let Err(e) = std::fs::write(&path, text) {
            eprintln!("chaos: cannot write {}: {e}", path.display());
        }
        path
    }

    /// Starts `outbox run` with `config`; its log goes to `<name>.log`.
    pub(crate) fn relay(&self, name: &str, config: &std::path::Path) -> anyhow::Result<Child> {
        let log = std::fs::File::create(self.dir.join(format!("{name}.log")))?;
        Command::new(&self.bins.outbox)
            .args(["run", "--config"])
            .arg(config)
            .env("RUST_LOG", "info,lapin=warn,sqlx=warn")
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {}", self.bins.outbox.display()))
    }

    /// Starts the billing consumer with extra environment `env`.
    pub(crate) fn consumer(&self, name: &str, env: &[(&str, &str)]) -> anyhow::Result<Child> {
        let log = std::fs::File::create(self.dir.join(format!("{name}.log")))?;
        let port = free_port()?;
        if let Ok(mut ports) = self.consumer_ports.lock() {
            ports.push(port);
        }
        let mut c = Command::new(&self.bins.consumer);
        c.env("SHOP_DATABASE_URL", self.proc_pg_url())
            .env("SHOP_AMQP_URL", self.proc_amqp_url())
            .env(
                "SHOP_AMQP_FAILOVER_URLS",
                self.shop.amqp_failover_urls.join(","),
            )
            .env("SHOP_SCHEMA", self.shop.schema.as_str())
            .env("OUTBOX_SCHEMA", self.shop.outbox_schema.as_str())
            .env("BILLING_QUEUE", &self.shop.queue)
            .env("SHOP_EXCHANGE", &self.shop.exchange)
            .env("BILLING_SWEEP_INTERVAL", "1s")
            .env("BILLING_METRICS_ADDR", format!("127.0.0.1:{port}"))
            .env("RUST_LOG", "info,lapin=warn,sqlx=warn")
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true);
        let q = self.shop.billing_queue;
        if q.queue_type == outbox_adapters_rabbitmq::QueueType::Quorum {
            c.env("BILLING_QUEUE_TYPE", "quorum");
        }
        if let Some(limit) = q.delivery_limit {
            c.env("BILLING_DELIVERY_LIMIT", limit.to_string());
        }
        for (k, v) in env {
            c.env(k, v);
        }
        c.spawn()
            .with_context(|| format!("cannot start {}", self.bins.consumer.display()))
    }

    /// Creates orders `first..first + n` at about `per_sec` a second from four tasks;
    /// every tenth is rolled back. Failed orders are skipped (the database says
    /// afterwards which committed).
    pub(crate) fn produce(&self, first: i64, n: i64, per_sec: u32) -> Producer {
        self.produce_with(first, n, per_sec, 4)
    }

    /// As [`World::produce`], from `tasks` tasks (each commits one order at a time,
    /// so a higher rate needs more of them).
    pub(crate) fn produce_with(&self, first: i64, n: i64, per_sec: u32, tasks: i64) -> Producer {
        self.produce_keyed(first, n, per_sec, tasks, None)
    }

    /// As [`World::produce_with`]; with `keys`, each order's event has the ordering
    /// key `c<order id % keys>` (`keys` a multiple of `tasks`, so one task writes
    /// each key, one order at a time: a key's producers are serialized).
    pub(crate) fn produce_keyed(
        &self,
        first: i64,
        n: i64,
        per_sec: u32,
        tasks: i64,
        keys: Option<i64>,
    ) -> Producer {
        let shop = Arc::new(self.shop.clone());
        let stats = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
        let stop = Arc::new(AtomicBool::new(false));
        let tasks_n = tasks.max(1);
        debug_assert!(keys.is_none_or(|k| k % tasks_n == 0));
        let mut tasks = Vec::new();
        let pause = Duration::from_secs_f64(tasks_n as f64 / f64::from(per_sec.max(1)));
        for t in 0..tasks_n {
            let (shop, pool) = (Arc::clone(&shop), self.pool.clone());
            let (stats, stop) = (Arc::clone(&stats), Arc::clone(&stop));
            tasks.push(tokio::spawn(async move {
                let mut tick = tokio::time::interval(pause);
                for id in (first..first + n).filter(|id| id % tasks_n == t) {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    tick.tick().await;
                    stats.0.fetch_add(1, Ordering::Relaxed);
                    let key = keys.map(|k| format!("c{}", id % k));
                    if orders::create_keyed(
                        &shop,
                        &pool,
                        id,
                        100 + id,
                        id % 10 == 0,
                        key.as_deref(),
                    )
                    .await
                    .is_err()
                    {
                        stats.1.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
        Producer { tasks, stats, stop }
    }

    async fn count(&self, sql: &str) -> anyhow::Result<u64> {
        let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .fetch_one(&self.pool)
            .await?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// Reads the totals.
    pub(crate) async fn tally(&self) -> anyhow::Result<Tally> {
        let (s, o) = (self.shop.schema.quoted(), self.shop.outbox_schema.quoted());
        let (consumed, effects): (i64, i64) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT count(DISTINCT order_id), count(*) FROM {s}.invoices"
        )))
        .fetch_one(&self.pool)
        .await?;
        let n = |v: i64| u64::try_from(v).unwrap_or(0);
        let outbox = self.outbox.stats().await?;
        let inbox = self.inbox.stats(CONSUMER).await?;
        Ok(Tally {
            committed: self.count_orders().await?,
            consumed: n(consumed),
            effects: n(effects),
            dead_outbox: outbox.dead,
            dead_inbox: inbox.dead,
            dead_letters: inbox.dead_letters,
            publish_failed: outbox.publish_failed,
            unaccounted: self
                .count(&format!(
                    "WITH msg AS (
                       SELECT id, status,
                              (convert_from(payload, 'UTF8')::jsonb ->> 'order_id')::bigint AS order_id
                       FROM {o}.outbox_messages)
                     SELECT count(*) FROM {s}.orders ord
                     WHERE NOT EXISTS (SELECT 1 FROM {s}.invoices i WHERE i.order_id = ord.id)
                       AND NOT EXISTS (SELECT 1 FROM msg WHERE msg.order_id = ord.id AND msg.status = 'dead')
                       AND NOT EXISTS (SELECT 1 FROM msg JOIN {o}.outbox_inbox b ON b.message_id = msg.id
                                       WHERE msg.order_id = ord.id AND b.status = 'dead')"
                ))
                .await?,
        })
    }

    async fn count_orders(&self) -> anyhow::Result<u64> {
        self.count(&format!(
            "SELECT count(*) FROM {}.orders",
            self.shop.schema.quoted()
        ))
        .await
    }

    /// Orders committed so far (0 while the database does not answer).
    pub(crate) async fn committed(&self) -> u64 {
        self.count_orders().await.unwrap_or(0)
    }

    /// Orders invoiced so far (0 while the database does not answer).
    pub(crate) async fn invoiced(&self) -> u64 {
        self.count(&format!(
            "SELECT count(DISTINCT order_id) FROM {}.invoices",
            self.shop.schema.quoted()
        ))
        .await
        .unwrap_or(0)
    }

    /// Messages that needed more than one publish attempt.
    pub(crate) async fn retried(&self) -> u64 {
        self.count(&format!(
            "SELECT count(*) FROM {}.outbox_messages WHERE attempts > 1",
            self.shop.outbox_schema.quoted()
        ))
        .await
        .unwrap_or(0)
    }

    /// Messages the relays have marked sent so far.
    pub(crate) async fn sent(&self) -> u64 {
        self.outbox
            .count(outbox_core::OutboxStatus::Sent)
            .await
            .unwrap_or(0)
    }

    /// Waits until `done` holds (checked every 100 ms), at most `timeout`.
    pub(crate) async fn wait_until(
        &self,
        what: &str,
        timeout: Duration,
        mut done: impl AsyncFnMut(&Self) -> bool,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        while !done(self).await {
            anyhow::ensure!(
                Instant::now() < deadline,
                "timed out after {timeout:?} waiting for {what}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    /// Waits until every committed order is invoiced or dead (errors of the
    /// database while it restarts count as "not yet"), then [`LATE_DUPLICATES`]
    /// more, so that a copy published by a relay whose lease ran out (it comes at
    /// most a lease and a confirm timeout later) is counted too. Returns the final
    /// tally; `unaccounted` > 0 when the time ran out.
    pub(crate) async fn settle(&self, timeout: Duration) -> anyhow::Result<(Tally, Instant)> {
        let deadline = Instant::now() + timeout;
        let quiet_at = loop {
            if let Ok(t) = self.tally().await {
                if t.unaccounted == 0 {
                    break Instant::now();
                }
                if Instant::now() >= deadline {
                    eprintln!(
                        "chaos: {}: {} committed orders unaccounted after {timeout:?}",
                        self.id, t.unaccounted
                    );
                    return Ok((t, Instant::now()));
                }
            } else if Instant::now() >= deadline {
                anyhow::bail!("the database did not answer within {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        tokio::time::sleep(LATE_DUPLICATES).await;
        Ok((self.tally().await?, quiet_at))
    }

    /// Deliveries the running consumers' inboxes absorbed as duplicates (from their
    /// `/metrics`; a consumer that was killed has lost its count).
    pub(crate) async fn duplicates_absorbed(&self) -> u64 {
        let ports = self
            .consumer_ports
            .lock()
            .map(|p| p.clone())
            .unwrap_or_default();
        let mut total = 0.0;
        for port in ports {
            total += metric(
                port,
                "outbox_duplicates_absorbed_total{consumer=\"billing\"}",
            )
            .await
            .unwrap_or(0.0);
        }
        total as u64
    }

    /// Messages ready in `queue`.
    pub(crate) async fn queue_depth(&self, queue: &str) -> anyhow::Result<u32> {
        let ch = self.channel().await?;
        let q = ch
            .queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await?;
        Ok(q.message_count())
    }

    /// Empties the tap queue: (copies, distinct message ids).
    pub(crate) async fn drain_tap(&self) -> anyhow::Result<(u64, u64)> {
        let ch = self.channel().await?;
        let mut seen: HashMap<String, u64> = HashMap::new();
        let mut copies = 0u64;
        while let Some(got) = ch
            .basic_get(self.tap.as_str().into(), BasicGetOptions { no_ack: true })
            .await?
        {
            copies += 1;
            let id = got
                .delivery
                .properties
                .message_id()
                .as_ref()
                .map_or_else(String::new, |s| s.as_str().to_owned());
            *seen.entry(id).or_default() += 1;
        }
        Ok((copies, seen.len() as u64))
    }

    /// Removes everything the scenario made (its logs stay when `keep_logs`).
    pub(crate) async fn cleanup(self, keep_logs: bool) {
        if let Ok(ch) = self.channel().await {
            let _ = ch
                .queue_delete(
                    self.tap.as_str().into(),
                    lapin::options::QueueDeleteOptions::default(),
                )
                .await;
        }
        self.shop.teardown(&self.pool).await;
        if !keep_logs {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The background producer of a scenario.
pub(crate) struct Producer {
    tasks: Vec<tokio::task::JoinHandle<()>>,
    stats: Arc<(AtomicU64, AtomicU64)>,
    stop: Arc<AtomicBool>,
}

impl Producer {
    /// Waits for the producer to finish.
    pub(crate) async fn finish(mut self) -> Produced {
        for t in std::mem::take(&mut self.tasks) {
            let _ = t.await;
        }
        Produced {
            attempted: self.stats.0.load(Ordering::Relaxed),
            errors: self.stats.1.load(Ordering::Relaxed),
        }
    }
}

impl Producer {
    /// Stops the producer where it is and waits for its tasks.
    pub(crate) async fn stop(self) -> Produced {
        self.stop.store(true, Ordering::Relaxed);
        self.finish().await
    }
}

impl Drop for Producer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Sends `signal` (e.g. `-TERM`, `-KILL`, `-STOP`, `-CONT`) to `child`.
pub(crate) async fn signal(child: &Child, signal: &str) {
    if let Some(pid) = child.id() {
        let _ = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .await;
    }
}

/// SIGTERM, then waits up to 30 s; true if it exited cleanly.
pub(crate) async fn terminate(mut child: Child) -> bool {
    signal(&child, "-TERM").await;
    matches!(
        tokio::time::timeout(Duration::from_secs(30), child.wait()).await,
        Ok(Ok(s)) if s.success()
    )
}

/// A free loopback port.
pub(crate) fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// `url` with `application_name=name`: `outbox-chaos` for the suite's own
/// connections, so the fault that terminates connections can spare them.
fn with_application_name(url: &str, name: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}application_name={name}")
}

/// The value of metric line `name` (with its labels) at `127.0.0.1:port/metrics`.
pub(crate) async fn metric(port: u16, name: &str) -> Option<f64> {
    let out = Command::new("curl")
        .args([
            "-s",
            "--max-time",
            "5",
            &format!("http://127.0.0.1:{port}/metrics"),
        ])
        .output()
        .await
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}
