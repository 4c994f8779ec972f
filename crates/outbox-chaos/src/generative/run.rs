//! Runs one round's [`Plan`] against the real services: a world of its own (the
//! chaos suite's schemas, exchange, billing queue and tap), the relays and the
//! billing consumer as processes reaching the broker through a proxy (so that
//! their connections can be dropped), producer lanes, the timeline of faults and
//! operator actions, everything healed when production ends, then waiting until
//! the round settles and reading what [`check`](super::check) needs.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::StreamExt as _;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicGetOptions, BasicQosOptions, ExchangeDeclareOptions,
    ExchangeDeleteOptions, QueueBindOptions,
};
use lapin::types::FieldTable;
use outbox_adapters_postgres::{PgOutbox, PgPauses};
use outbox_core::MessageId;
use outbox_core::event::to_new_message;
use outbox_examples::billing::CONSUMER;
use outbox_examples::events::OrderCreated;
use outbox_ports::{OutboxOperator as _, PauseKind, PauseStore as _};
use outbox_testkit::proxy::{TcpProxy, host_port};
use tokio::process::Child;
use uuid::Uuid;

use super::check::{Committed, Observed};
use super::plan::{Action, Held, LANES, Plan, Tx, Via};
use crate::Ctx;
use crate::world::{CONFIRM_TIMEOUT, LEASE_TTL, World};

/// The padding of an oversized body: over the consumer's 1 MiB.
const OVERSIZED: i32 = (1 << 20) + 1024;

/// The binding key of the billing queue (the shop's), which the tap mirrors.
const ROUTED: &str = "order.*";
/// How long a round may go on settling without any message moving (no effect,
/// no status changed, no copy at the tap): what is still in progress then is
/// stuck.
pub(crate) const STALLED: Duration = Duration::from_secs(30);
/// How long a round may take to settle after production ends while messages
/// still move: what is in progress then is stuck too.
pub(crate) const SETTLE: Duration = Duration::from_secs(600);

/// What a round leaves for the checker, and for the reader.
pub(crate) struct Finished {
    pub(crate) observed: Observed,
    /// The round settled before it stalled or [`SETTLE`] ran out.
    pub(crate) settled_in: Option<Duration>,
    pub(crate) notes: Vec<String>,
    /// Processes that panicked during the round (a failure of the round).
    pub(crate) exited: Vec<String>,
    /// Where the round's logs and configs are (removed when it passes).
    pub(crate) world: World,
}

/// What the run's operator did.
#[derive(Default)]
struct Ops {
    deleted: HashSet<Uuid>,
    touched: HashSet<Uuid>,
    requeued: u64,
    replayed: u64,
    /// Replays drawn but not run (without `--replay`).
    replays_skipped: u64,
}

/// The processes of a round.
struct Procs {
    relays: Vec<Option<Child>>,
    consumer: Option<Child>,
    /// The name (and log `<name>.log`) of each slot's latest process: the
    /// relays', then the consumer's.
    names: Vec<String>,
    /// Successors started so far (for their names).
    started: u32,
}

struct Round {
    w: World,
    plan: Plan,
    proxy: TcpProxy,
    procs: tokio::sync::Mutex<Procs>,
    ops: Mutex<Ops>,
    tap: Arc<Mutex<HashMap<Uuid, u32>>>,
    poison: String,
    /// Run the plan's replays (`--replay`).
    replay: bool,
    /// The row version (`xmin`) of every message of the exchange paused
    /// throughout, as written: a claim rewrites a row even when the row comes
    /// back to pending later (released unsent, its lease run out).
    held_versions: Mutex<HashMap<Uuid, String>>,
}

impl Round {
    fn relay_config(&self, name: &str) -> PathBuf {
        let s = &self.plan.settings;
        let w = &self.w;
        let coord = if s.redis { "redis" } else { "postgres" };
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
url = {amqp:?}
confirm_timeout = "{confirm_s}s"
max_in_flight = {in_flight}
[redis]
url = "{redis}"
[dispatch]
batch_size = {batch}
lease_ttl = "{lease_s}s"
idle_poll = "500ms"
[retry]
initial_backoff = "500ms"
max_backoff = "2s"
max_attempts = {attempts}
[sweep]
interval = "1s"
lock_wait = "200ms"
lock_ttl = "3s"
lock_key = "{lock}"
state_key = "{state}"
[retention]
enabled = false
[ordering]
on_dead = "{on_dead}"
[http]
enabled = false
"#,
            id = w.id,
            pg = w.proc_pg_url(),
            schema = w.shop.outbox_schema,
            amqp = self.proxy.url_for(&w.urls.amqp),
            confirm_s = CONFIRM_TIMEOUT.as_secs(),
            in_flight = s.max_in_flight,
            redis = w.urls.redis,
            batch = s.batch_size,
            lease_s = LEASE_TTL.as_secs(),
            attempts = s.max_attempts,
            lock = w.lock_key,
            state = w.state_key,
            on_dead = if s.skip_dead_heads { "skip" } else { "block" },
        );
        let path = w.dir.join(format!("{name}.toml"));
        if let Err(e) = std::fs::write(&path, text) {
            eprintln!("generative: cannot write {}: {e}", path.display());
        }
        path
    }

    fn start_relay(&self, procs: &mut Procs, i: usize) -> anyhow::Result<()> {
        procs.started += 1;
        let name = format!("r{i}-{}", procs.started);
        let cfg = self.relay_config(&name);
        procs.relays[i] = Some(self.w.relay(&name, &cfg)?);
        procs.names[i] = name;
        Ok(())
    }

    fn start_consumer(&self, procs: &mut Procs) -> anyhow::Result<()> {
        procs.started += 1;
        let name = format!("c-{}", procs.started);
        if let Some(slot) = procs.names.last_mut() {
            slot.clone_from(&name);
        }
        let s = &self.plan.settings;
        let percent = s.transient_percent.to_string();
        procs.consumer = Some(self.w.consumer(
            &name,
            &[
                ("BILLING_POISON_ORDERS", self.poison.as_str()),
                ("BILLING_FAIL_FIRST_PERCENT", percent.as_str()),
                (
                    "BILLING_ORDERED_BY_KEY",
                    if s.ordered_consumer { "true" } else { "false" },
                ),
            ],
        )?);
        Ok(())
    }

    /// Declares the exchange and binds the billing queue, then the tap (in this
    /// order, so that no message reaches the tap alone: the tap's copy is the
    /// evidence that a queue had it).
    async fn bind(&self) -> anyhow::Result<()> {
        let ch = self.w.channel().await?;
        ch.exchange_declare(
            self.w.shop.exchange.as_str().into(),
            lapin::ExchangeKind::Topic,
            ExchangeDeclareOptions {
                durable: true,
                ..ExchangeDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await?;
        for q in [&self.w.shop.queue, &self.w.tap] {
            ch.queue_bind(
                q.as_str().into(),
                self.w.shop.exchange.as_str().into(),
                ROUTED.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
        }
        Ok(())
    }

    /// Removes the bindings, the tap's first.
    async fn unbind(&self) -> anyhow::Result<()> {
        let ch = self.w.channel().await?;
        for q in [&self.w.tap, &self.w.shop.queue] {
            ch.queue_unbind(
                q.as_str().into(),
                self.w.shop.exchange.as_str().into(),
                ROUTED.into(),
                FieldTable::default(),
            )
            .await?;
        }
        Ok(())
    }

    async fn delete_exchange(&self) -> anyhow::Result<()> {
        // The tap's binding first, as in `unbind`: the exchange's deletion takes
        // both, in an order of the broker's.
        let ch = self.w.channel().await?;
        ch.queue_unbind(
            self.w.tap.as_str().into(),
            self.w.shop.exchange.as_str().into(),
            ROUTED.into(),
            FieldTable::default(),
        )
        .await?;
        ch.exchange_delete(
            self.w.shop.exchange.as_str().into(),
            ExchangeDeleteOptions::default(),
        )
        .await?;
        Ok(())
    }

    async fn kill_relay(&self, i: usize, down: Duration) -> anyhow::Result<()> {
        let old = self.procs.lock().await.relays[i].take();
        if let Some(mut c) = old {
            let _ = c.start_kill();
            let _ = c.wait().await;
        }
        tokio::time::sleep(down).await;
        let mut procs = self.procs.lock().await;
        if procs.relays[i].is_none() {
            self.start_relay(&mut procs, i)?;
        }
        Ok(())
    }

    async fn kill_consumer(&self, down: Duration) -> anyhow::Result<()> {
        let old = self.procs.lock().await.consumer.take();
        if let Some(mut c) = old {
            let _ = c.start_kill();
            let _ = c.wait().await;
        }
        tokio::time::sleep(down).await;
        let mut procs = self.procs.lock().await;
        if procs.consumer.is_none() {
            self.start_consumer(&mut procs)?;
        }
        Ok(())
    }

    /// Up to `n` dead messages, oldest first.
    async fn dead(&self, n: u32) -> anyhow::Result<Vec<Uuid>> {
        Ok(sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT id FROM {}.outbox_messages WHERE status = 'dead' AND exchange = $2 \
             ORDER BY seq LIMIT $1",
            self.w.shop.outbox_schema.quoted()
        )))
        .bind(i64::from(n))
        .bind(&self.w.shop.exchange)
        .fetch_all(&self.w.pool)
        .await?)
    }

    async fn act(self: &Arc<Self>, action: Action) -> anyhow::Result<()> {
        let ms = Duration::from_millis;
        let pauses = PgPauses::new(self.w.pool.clone(), &self.w.shop.outbox_schema);
        match action {
            Action::KillRelay { relay, down_ms } => self.kill_relay(relay, ms(down_ms)).await?,
            Action::KillConsumer { down_ms } => self.kill_consumer(ms(down_ms)).await?,
            Action::DropBroker { for_ms } => {
                self.proxy.cut();
                tokio::time::sleep(ms(for_ms)).await;
                self.proxy.restore();
            }
            Action::StallBroker { for_ms } => {
                self.proxy.stall();
                tokio::time::sleep(ms(for_ms)).await;
                self.proxy.resume();
            }
            Action::SlowBroker { delay_ms, for_ms } => {
                self.proxy.delay(ms(delay_ms));
                tokio::time::sleep(ms(for_ms)).await;
                self.proxy.delay(Duration::ZERO);
            }
            Action::KillPgConnections => {
                sqlx::query(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
                )
                .bind(&self.w.proc_app)
                .execute(&self.w.pool)
                .await?;
            }
            Action::PauseExchange { for_ms } => {
                pauses
                    .pause(PauseKind::Exchange, &self.w.shop.exchange, "generative")
                    .await?;
                tokio::time::sleep(ms(for_ms)).await;
                pauses
                    .resume(PauseKind::Exchange, &self.w.shop.exchange)
                    .await?;
            }
            Action::PauseConsumer { for_ms } => {
                pauses
                    .pause(PauseKind::Consumer, CONSUMER, "generative")
                    .await?;
                tokio::time::sleep(ms(for_ms)).await;
                pauses.resume(PauseKind::Consumer, CONSUMER).await?;
            }
            Action::Unbind { for_ms } => {
                self.unbind().await?;
                tokio::time::sleep(ms(for_ms)).await;
                self.bind().await?;
            }
            Action::DeleteExchange { for_ms } => {
                self.delete_exchange().await?;
                tokio::time::sleep(ms(for_ms)).await;
                self.bind().await?;
            }
            Action::Requeue { n } => {
                for id in self.dead(n).await? {
                    if self
                        .w
                        .outbox
                        .requeue_message(MessageId::from_uuid(id))
                        .await
                        .is_ok()
                    {
                        let mut ops = self.ops.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
                        ops.touched.insert(id);
                        ops.requeued += 1;
                    }
                }
            }
            Action::Replay { n } => {
                if !self.replay {
                    self.ops
                        .lock()
                        .map_err(|_| anyhow::anyhow!("poisoned"))?
                        .replays_skipped += 1;
                    return Ok(());
                }
                let ids: Vec<Uuid> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                    "SELECT id FROM {}.outbox_messages WHERE status = 'dead' AND ordering_key IS NULL ORDER BY seq LIMIT $1",
                    self.w.shop.outbox_schema.quoted()
                )))
                .bind(i64::from(n))
                .fetch_all(&self.w.pool)
                .await?;
                for id in ids {
                    self.replay_one(id).await?;
                }
            }
            Action::Delete { n } => {
                for id in self.dead(n).await? {
                    // Recorded before the delete: a delete that answers an error
                    // may still have happened.
                    self.ops
                        .lock()
                        .map_err(|_| anyhow::anyhow!("poisoned"))?
                        .touched
                        .insert(id);
                    let done = self
                        .w
                        .outbox
                        .delete_message(MessageId::from_uuid(id), false)
                        .await;
                    let gone = done.is_ok() || !self.row_exists(id).await;
                    if gone {
                        self.ops
                            .lock()
                            .map_err(|_| anyhow::anyhow!("poisoned"))?
                            .deleted
                            .insert(id);
                    }
                }
            }
        }
        Ok(())
    }

    /// Replays dead message `id` unedited, as the admin API's edit and replay
    /// does (a new id, the same body and routing, no key, due at once), and writes
    /// the replay into the ledger once the store took it.
    async fn replay_one(&self, id: Uuid) -> anyhow::Result<()> {
        let Some(original) = self.w.outbox.get_message(MessageId::from_uuid(id)).await? else {
            return Ok(());
        };
        let mut replay = original.message.clone();
        outbox_ports::stamp_replay_of(&mut replay.headers, &original.message);
        let new_id = Uuid::now_v7();
        replay.id = MessageId::from_uuid(new_id);
        replay.not_before = None;
        replay.ordering_key = None;
        if self
            .w
            .outbox
            .replay_message(MessageId::from_uuid(id), replay)
            .await
            .is_err()
        {
            return Ok(());
        }
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {s}.gen_ledger (message_id, order_id, ordering_key, unroutable, refused, replay_of) \
             SELECT $1, order_id, NULL, unroutable, refused, message_id FROM {s}.gen_ledger WHERE message_id = $2",
            s = self.w.shop.schema.quoted()
        )))
        .bind(new_id)
        .bind(id)
        .execute(&self.w.pool)
        .await?;
        let mut ops = self.ops.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
        ops.touched.insert(id);
        ops.replayed += 1;
        Ok(())
    }

    async fn row_exists(&self, id: Uuid) -> bool {
        sqlx::query_scalar::<_, bool>(sqlx::AssertSqlSafe(format!(
            "SELECT EXISTS (SELECT 1 FROM {}.outbox_messages WHERE id = $1)",
            self.w.shop.outbox_schema.quoted()
        )))
        .bind(id)
        .fetch_one(&self.w.pool)
        .await
        .unwrap_or(true)
    }

    /// Processes that ended by themselves (not killed by the round), each
    /// restarted at once as a supervisor would. A process that refused to start
    /// under a fault (`outbox run` and the consumer exit 1 when the broker does not
    /// answer at start) is a note; one that panicked fails the round. Returns
    /// (failures, notes).
    async fn supervise(&self) -> (Vec<String>, Vec<String>) {
        let mut procs = self.procs.lock().await;
        let (mut failures, mut notes) = (Vec::new(), Vec::new());
        let slots = procs.relays.len() + 1;
        for i in 0..slots {
            let procs = &mut *procs;
            let slot = if i < procs.relays.len() {
                &mut procs.relays[i]
            } else {
                &mut procs.consumer
            };
            let Some(Ok(Some(status))) = slot.as_mut().map(Child::try_wait) else {
                continue;
            };
            *slot = None;
            let name = procs.names[i].clone();
            let log =
                std::fs::read_to_string(self.w.dir.join(format!("{name}.log"))).unwrap_or_default();
            let said = log
                .lines()
                .find(|l| l.starts_with("Error:") || l.contains("panicked"))
                .unwrap_or("")
                .chars()
                .take(300)
                .collect::<String>();
            if log.contains("panicked") {
                failures.push(format!("{name} panicked ({status}): {said}"));
            } else {
                notes.push(format!(
                    "{name} exited by itself ({status}), restarted: {said}"
                ));
            }
            let started = if i < procs.relays.len() {
                self.start_relay(procs, i)
            } else {
                self.start_consumer(procs)
            };
            if let Err(e) = started {
                failures.push(format!("{name} could not be started again: {e:#}"));
            }
        }
        (failures, notes)
    }

    /// Undoes every fault: the proxy forwards, nothing paused, the exchange and
    /// bindings there, every process running.
    async fn heal(&self) -> anyhow::Result<()> {
        self.proxy.restore();
        self.proxy.resume();
        self.proxy.delay(Duration::ZERO);
        let pauses = PgPauses::new(self.w.pool.clone(), &self.w.shop.outbox_schema);
        pauses
            .resume(PauseKind::Exchange, &self.w.shop.exchange)
            .await?;
        pauses.resume(PauseKind::Consumer, CONSUMER).await?;
        self.bind().await?;
        let mut procs = self.procs.lock().await;
        for i in 0..procs.relays.len() {
            if procs.relays[i].is_none() {
                self.start_relay(&mut procs, i)?;
            }
        }
        if procs.consumer.is_none() {
            self.start_consumer(&mut procs)?;
        }
        Ok(())
    }

    /// The exchange paused for the whole round: named after the shop's, never
    /// declared, its backlog written by plain SQL and the pause set before any
    /// relay starts (so a relay that ignored it would fail to publish them and
    /// mark them, which the checker sees).
    async fn hold_an_exchange(&self, held: Held) -> anyhow::Result<()> {
        let o = self.w.shop.outbox_schema.quoted();
        let exchange = self.held_exchange();
        PgPauses::new(self.w.pool.clone(), &self.w.shop.outbox_schema)
            .pause(PauseKind::Exchange, &exchange, "generative")
            .await?;
        for (n, key, due) in [
            (held.immediate, "NULL", "NULL"),
            (held.keyed, "'held-' || i", "NULL"),
            (held.delayed, "NULL", "now() + interval '1 second'"),
        ] {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO {o}.outbox_messages (exchange, routing_key, payload, ordering_key, not_before) \
                 SELECT $1, 'order.held', convert_to('{{}}', 'UTF8'), {key}, {due} \
                 FROM generate_series(1, $2) i"
            )))
            .bind(&exchange)
            .bind(i64::from(n))
            .execute(&self.w.pool)
            .await?;
        }
        let versions: Vec<(Uuid, String)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT id, xmin::text FROM {o}.outbox_messages WHERE exchange = $1"
        )))
        .bind(&exchange)
        .fetch_all(&self.w.pool)
        .await?;
        *self
            .held_versions
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))? = versions.into_iter().collect();
        Ok(())
    }

    /// The name of the exchange paused for the whole round.
    fn held_exchange(&self) -> String {
        format!("{}.held", self.w.shop.exchange)
    }

    /// Reads everything the checker needs; `tap` as counted so far.
    async fn observe(&self) -> anyhow::Result<Observed> {
        let (s, o) = (
            self.w.shop.schema.quoted(),
            self.w.shop.outbox_schema.quoted(),
        );
        let pool = &self.w.pool;
        let committed: Vec<LedgerRow> =
            sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "SELECT message_id, order_id, ordering_key, unroutable, refused, replay_of FROM {s}.gen_ledger"
            )))
        .fetch_all(pool)
        .await?;
        let outbox: Vec<(Uuid, String)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT id, status FROM {o}.outbox_messages"
        )))
        .fetch_all(pool)
        .await?;
        let blocked: Vec<Uuid> = if self.plan.settings.skip_dead_heads {
            Vec::new()
        } else {
            sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                "SELECT p.id FROM {o}.outbox_messages p
                 WHERE p.status IN ('pending', 'publish_failed') AND p.ordering_key IS NOT NULL
                   AND EXISTS (SELECT 1 FROM {o}.outbox_messages d
                               WHERE d.ordering_key = p.ordering_key AND d.seq < p.seq
                                 AND d.status = 'dead')"
            )))
            .fetch_all(pool)
            .await?
        };
        let inbox: Vec<(Uuid, String)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT message_id, status FROM {o}.outbox_inbox WHERE consumer = $1"
        )))
        .bind(CONSUMER)
        .fetch_all(pool)
        .await?;
        let dead_letters: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT message_id FROM {o}.outbox_dead_letters WHERE message_id IS NOT NULL"
        )))
        .fetch_all(pool)
        .await?;
        let effects: Vec<(i64, Uuid, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT order_id, message_id, billed_seq FROM {s}.invoices"
        )))
        .fetch_all(pool)
        .await?;
        let (deleted, touched) = {
            let ops = self.ops.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
            (ops.deleted.clone(), ops.touched.clone())
        };
        let held_now: Vec<(Uuid, String, String)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT id, xmin::text, status || ' after ' || attempts || ' attempts, lease ' \
               || coalesce(locked_by, 'none') FROM {o}.outbox_messages WHERE exchange = $1"
        )))
        .bind(self.held_exchange())
        .fetch_all(pool)
        .await?;
        let held_moved = {
            let written = self
                .held_versions
                .lock()
                .map_err(|_| anyhow::anyhow!("poisoned"))?;
            let mut moved: Vec<(Uuid, String)> = held_now
                .iter()
                .filter(|(id, xmin, _)| written.get(id) != Some(xmin))
                .map(|(id, _, state)| (*id, format!("rewritten since it was written ({state})")))
                .collect();
            let present: HashSet<Uuid> = held_now.iter().map(|(id, _, _)| *id).collect();
            moved.extend(
                written
                    .keys()
                    .filter(|id| !present.contains(id))
                    .map(|id| (*id, "its row is gone".to_owned())),
            );
            moved
        };
        let queued = self.w.queue_depth(&self.w.shop.queue).await.unwrap_or(1)
            + self.w.queue_depth(&self.w.tap).await.unwrap_or(1);
        Ok(Observed {
            committed: committed
                .into_iter()
                .map(
                    |(id, order_id, key, unroutable, refused, replay_of)| Committed {
                        id,
                        order_id,
                        key,
                        unroutable,
                        refused,
                        replay_of,
                    },
                )
                .collect(),
            outbox: outbox.into_iter().collect(),
            blocked: blocked.into_iter().collect(),
            held_moved,
            inbox: inbox.into_iter().collect(),
            dead_letters: dead_letters
                .iter()
                .filter_map(|s| Uuid::parse_str(s).ok())
                .collect(),
            effects,
            tap: self.tap.lock().map(|t| t.clone()).unwrap_or_default(),
            deleted,
            touched,
            drained: queued == 0,
            ordered: self.plan.settings.ordered_consumer,
        })
    }
}

/// What moves while a round settles: effects, statuses, copies at the tap.
/// A ledger row: id, order, key, unroutable, refused, replayed message.
type LedgerRow = (Uuid, i64, Option<String>, bool, bool, Option<Uuid>);

/// Effects, outbox and inbox rows by status, copies at the tap.
type Progress = (usize, Vec<(String, usize)>, Vec<(String, usize)>, u64);

fn progress(o: &Observed) -> Progress {
    let count = |m: &HashMap<Uuid, String>| {
        let mut by: HashMap<&str, usize> = HashMap::new();
        for s in m.values() {
            *by.entry(s.as_str()).or_default() += 1;
        }
        let mut v: Vec<(String, usize)> = by.into_iter().map(|(k, n)| (k.to_owned(), n)).collect();
        v.sort();
        v
    };
    (
        o.effects.len(),
        count(&o.outbox),
        count(&o.inbox),
        o.tap.values().map(|n| u64::from(*n)).sum(),
    )
}

/// Creates the round's ledger: a row per message, in the message's transaction.
async fn create_ledger(w: &World) -> anyhow::Result<()> {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {}.gen_ledger (message_id uuid PRIMARY KEY, order_id bigint NOT NULL, \
         ordering_key text, unroutable boolean NOT NULL, refused boolean NOT NULL, replay_of uuid)",
        w.shop.schema.quoted()
    )))
    .execute(&w.pool)
    .await?;
    Ok(())
}

fn routing_key(order_id: i64, unroutable: bool) -> String {
    if unroutable {
        format!("nowhere.{}", order_id % 5)
    } else {
        "order.created".to_owned()
    }
}

/// Runs one producer transaction; `Ok(false)` when it failed (nothing of it
/// committed, or the ledger says what did).
async fn produce(w: &World, tx: &Tx) -> anyhow::Result<()> {
    let (s, o) = (w.shop.schema.quoted(), w.shop.outbox_schema.quoted());
    let mut db = w.pool.begin().await?;
    let mut ids = Vec::with_capacity(tx.msgs.len());
    match tx.via {
        Via::Library => {
            let outbox = PgOutbox::new(w.shop.outbox_schema.clone());
            for m in &tx.msgs {
                let mut event = to_new_message(&OrderCreated {
                    order_id: m.order_id,
                    total_cents: 100 + m.order_id,
                })?
                .with_source("generative");
                event.exchange.clone_from(&w.shop.exchange);
                event.routing_key = routing_key(m.order_id, m.unroutable);
                if let Some(k) = m.key {
                    event = event.with_ordering_key(format!("k{k}"));
                }
                if m.delay_ms > 0 {
                    event = event.deliver_after(Duration::from_millis(u64::from(m.delay_ms)));
                }
                let id = outbox.enqueue(&mut db, event).await?;
                ids.push(*id.as_uuid());
            }
        }
        Via::Sql => {
            ids = tx.msgs.iter().map(|_| Uuid::now_v7()).collect();
            let orders: Vec<i64> = tx.msgs.iter().map(|m| m.order_id).collect();
            let keys: Vec<String> = tx
                .msgs
                .iter()
                .map(|m| routing_key(m.order_id, m.unroutable))
                .collect();
            let okeys: Vec<Option<String>> = tx
                .msgs
                .iter()
                .map(|m| m.key.map(|k| format!("k{k}")))
                .collect();
            let delays: Vec<i32> = tx
                .msgs
                .iter()
                .map(|m| i32::try_from(m.delay_ms).unwrap_or(i32::MAX))
                .collect();
            let refused: Vec<bool> = tx.msgs.iter().map(|m| m.refused).collect();
            let pad: Vec<i32> = tx
                .msgs
                .iter()
                .map(|m| if m.oversized { OVERSIZED } else { 0 })
                .collect();
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO {o}.outbox_messages (id, exchange, routing_key, message_type, payload, ordering_key, not_before)
                 SELECT t.id, $6, t.rk, 'order.created',
                        convert_to(CASE WHEN t.refused
                                        THEN json_build_object('not_an_order', t.order_id)::text
                                        WHEN t.pad > 0
                                        THEN json_build_object('order_id', t.order_id, 'total_cents', 100 + t.order_id, 'pad', repeat('x', t.pad))::text
                                        ELSE json_build_object('order_id', t.order_id, 'total_cents', 100 + t.order_id)::text
                                   END, 'UTF8'),
                        t.okey,
                        CASE WHEN t.delay_ms > 0 THEN now() + t.delay_ms * interval '1 millisecond' END
                 FROM unnest($1::uuid[], $2::bigint[], $3::text[], $4::text[], $5::int[], $7::bool[], $8::int[])
                      WITH ORDINALITY AS t(id, order_id, rk, okey, delay_ms, refused, pad, n)
                 ORDER BY t.n"
            )))
            .bind(&ids)
            .bind(&orders)
            .bind(&keys)
            .bind(&okeys)
            .bind(&delays)
            .bind(&w.shop.exchange)
            .bind(&refused)
            .bind(&pad)
            .execute(&mut *db)
            .await?;
        }
    }
    let orders: Vec<i64> = tx.msgs.iter().map(|m| m.order_id).collect();
    let okeys: Vec<Option<String>> = tx
        .msgs
        .iter()
        .map(|m| m.key.map(|k| format!("k{k}")))
        .collect();
    let unroutable: Vec<bool> = tx.msgs.iter().map(|m| m.unroutable).collect();
    let refused: Vec<bool> = tx.msgs.iter().map(|m| m.refused).collect();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {s}.gen_ledger (message_id, order_id, ordering_key, unroutable, refused) \
         SELECT * FROM unnest($1::uuid[], $2::bigint[], $3::text[], $4::bool[], $5::bool[])"
    )))
    .bind(&ids)
    .bind(&orders)
    .bind(&okeys)
    .bind(&unroutable)
    .bind(&refused)
    .execute(&mut *db)
    .await?;
    if tx.roll_back {
        db.rollback().await?;
    } else {
        db.commit().await?;
    }
    Ok(())
}

/// Consumes the tap into `seen` until the channel fails or `stop` is set.
async fn consume_tap(
    ch: lapin::Channel,
    tap: String,
    seen: Arc<Mutex<HashMap<Uuid, u32>>>,
) -> anyhow::Result<()> {
    ch.basic_qos(1000, BasicQosOptions::default()).await?;
    let mut deliveries = ch
        .basic_consume(
            tap.as_str().into(),
            "generative-tap".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    while let Some(d) = deliveries.next().await {
        let d = d?;
        record(&seen, d.properties.message_id().as_ref(), d.redelivered);
        d.ack(BasicAckOptions::default()).await?;
    }
    Ok(())
}

fn record(seen: &Mutex<HashMap<Uuid, u32>>, id: Option<&lapin::types::ShortString>, again: bool) {
    let Some(id) = id.and_then(|s| Uuid::parse_str(s.as_str()).ok()) else {
        return;
    };
    if let Ok(mut seen) = seen.lock() {
        let n = seen.entry(id).or_default();
        // A copy handed again after the tap's own channel dropped is no new copy.
        if !(again && *n > 0) {
            *n += 1;
        }
    }
}

/// Runs `plan` and reads the outcome.
pub(crate) async fn run(ctx: &Ctx, plan: Plan, replay: bool) -> anyhow::Result<Finished> {
    let mut w = World::new_in("gen", &ctx.urls, &ctx.bins, "target/chaos/logs").await?;
    let mut notes = Vec::new();
    create_ledger(&w).await?;
    // The tap as the billing queue is bound, not `#` (which would route what is
    // meant to be routed nowhere).
    {
        let ch = w.channel().await?;
        ch.queue_unbind(
            w.tap.as_str().into(),
            w.shop.exchange.as_str().into(),
            "#".into(),
            FieldTable::default(),
        )
        .await?;
        ch.queue_bind(
            w.tap.as_str().into(),
            w.shop.exchange.as_str().into(),
            ROUTED.into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await?;
    }
    let target = host_port(&ctx.urls.amqp).context("no host:port in the AMQP URL")?;
    let proxy = TcpProxy::start(target).await?;
    w.through(proxy.url_for(&ctx.urls.amqp));
    let poison: Vec<String> = plan
        .msgs()
        .filter(|m| m.poison)
        .map(|m| m.order_id.to_string())
        .collect();
    let relays = plan.settings.relays;
    let round = Arc::new(Round {
        w,
        proxy,
        procs: tokio::sync::Mutex::new(Procs {
            relays: (0..relays).map(|_| None).collect(),
            consumer: None,
            names: vec![String::new(); relays + 1],
            started: 0,
        }),
        ops: Mutex::new(Ops::default()),
        tap: Arc::new(Mutex::new(HashMap::new())),
        poison: poison.join(","),
        plan,
        replay,
        held_versions: Mutex::new(HashMap::new()),
    });

    // The tap, consumed for the whole round on a connection of its own.
    let tap_conn =
        outbox_adapters_rabbitmq::connect(&ctx.urls.amqp, Duration::from_secs(10)).await?;
    let tap_ch = tap_conn.create_channel().await?;
    let tap_task = tokio::spawn(consume_tap(
        tap_ch.clone(),
        round.w.tap.clone(),
        Arc::clone(&round.tap),
    ));

    round.heal().await?;
    if let Some(held) = round.plan.held {
        round.hold_an_exchange(held).await?;
    }
    let t0 = Instant::now();
    let mut lanes = Vec::new();
    for lane in 0..LANES {
        let r = Arc::clone(&round);
        lanes.push(tokio::spawn(async move {
            let mut failed = 0u64;
            for tx in r.plan.txs.iter().filter(|t| t.lane == lane) {
                tokio::time::sleep_until((t0 + Duration::from_millis(tx.at_ms)).into()).await;
                if produce(&r.w, tx).await.is_err() {
                    failed += 1;
                }
            }
            failed
        }));
    }
    let events = {
        let r = Arc::clone(&round);
        tokio::spawn(async move {
            let mut running = Vec::new();
            for e in r.plan.events.clone() {
                tokio::time::sleep_until((t0 + Duration::from_millis(e.at_ms)).into()).await;
                let r = Arc::clone(&r);
                running.push(tokio::spawn(async move {
                    r.act(e.action)
                        .await
                        .map_err(|err| format!("{} at {} ms: {err:#}", e.action.name(), e.at_ms))
                }));
            }
            let mut errors = Vec::new();
            for t in running {
                if let Ok(Err(e)) = t.await {
                    errors.push(e);
                }
            }
            errors
        })
    };
    // A supervisor for the production: a process that exits by itself is
    // started again within a second.
    let supervisor = {
        let r = Arc::clone(&round);
        tokio::spawn(async move {
            let (mut failures, mut notes) = (Vec::new(), Vec::new());
            while t0.elapsed() < Duration::from_millis(r.plan.production_ms) {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let (f, n) = r.supervise().await;
                failures.extend(f);
                notes.extend(n);
            }
            (failures, notes)
        })
    };
    let mut failed_txs = 0;
    for l in lanes {
        failed_txs += l.await.unwrap_or(0);
    }
    let production_end = t0 + Duration::from_millis(round.plan.production_ms);
    tokio::time::sleep_until(production_end.into()).await;
    for e in events.await.unwrap_or_default() {
        notes.push(format!("action refused or failed: {e}"));
    }
    // Healed again: a fault's undo can have failed under another fault.
    let supervising = supervisor.await.unwrap_or_default();
    let mut exited = supervising.0;
    notes.extend(supervising.1);
    round.heal().await?;
    if failed_txs > 0 {
        notes.push(format!(
            "{failed_txs} producer transactions failed (under a fault; the ledger says what committed)"
        ));
    }

    // Settled: nothing in progress, twice in a row 2 s apart.
    let healed = Instant::now();
    let mut quiet = 0;
    let mut last_move = (Instant::now(), None);
    let settled_in = loop {
        let (settled, moved) = match round.observe().await {
            Ok(o) => {
                let signature = progress(&o);
                let moved = last_move.1.as_ref() != Some(&signature);
                last_move.1 = Some(signature);
                (o.drained && super::check::check(&o, false).settled, moved)
            }
            Err(_) => (false, false),
        };
        if moved {
            last_move.0 = Instant::now();
        }
        quiet = if settled { quiet + 1 } else { 0 };
        if quiet >= 2 {
            break Some(healed.elapsed());
        }
        let (failures, restarted) = round.supervise().await;
        exited.extend(failures);
        notes.extend(restarted);
        if healed.elapsed() > SETTLE || last_move.0.elapsed() > STALLED {
            notes.push(format!(
                "not settled {:.0} s after production ended, the last move {:.0} s before",
                healed.elapsed().as_secs_f64(),
                last_move.0.elapsed().as_secs_f64()
            ));
            break None;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    };

    // The processes stop; the tap is read to its end.
    let (failures, restarted) = round.supervise().await;
    exited.extend(failures);
    notes.extend(restarted);
    let mut procs = round.procs.lock().await;
    let mut children: Vec<Child> = procs.relays.iter_mut().filter_map(Option::take).collect();
    children.extend(procs.consumer.take());
    drop(procs);
    let mut unclean = 0;
    for c in children {
        if !crate::world::terminate(c).await {
            unclean += 1;
        }
    }
    if unclean > 0 {
        notes.push(format!(
            "{unclean} process(es) did not stop cleanly on SIGTERM"
        ));
    }
    let _ = tap_ch.close(200, "done".into()).await;
    tap_task.abort();
    let ch = round.w.channel().await?;
    while let Some(got) = ch
        .basic_get(
            round.w.tap.as_str().into(),
            BasicGetOptions { no_ack: true },
        )
        .await?
    {
        record(
            &round.tap,
            got.delivery.properties.message_id().as_ref(),
            got.delivery.redelivered,
        );
    }
    let _ = tap_conn.close(200, "done".into()).await;
    let observed = round.observe().await?;
    let (requeued, replayed, skipped) = round
        .ops
        .lock()
        .map(|o| (o.requeued, o.replayed, o.replays_skipped))
        .unwrap_or_default();
    if requeued > 0 {
        notes.push(format!("the operator requeued {requeued} dead messages"));
    }
    if replayed > 0 {
        notes.push(format!("the operator replayed {replayed} dead messages"));
    }
    if skipped > 0 {
        notes.push(format!(
            "{skipped} replay actions of the plan not run (without --replay)"
        ));
    }
    let round = Arc::try_unwrap(round)
        .map_err(|_| anyhow::anyhow!("a task of the round still holds it"))?;
    Ok(Finished {
        observed,
        settled_in,
        notes,
        exited,
        world: round.w,
    })
}
