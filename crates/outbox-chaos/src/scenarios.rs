//! The scenarios of the fault suite. Each makes its own [`World`], injects
//! its fault while orders stream in, and hands over to [`conclude`] for counting.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use lapin::BasicProperties;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use tokio::process::Command;

use crate::world::{Coordination, SweepOpts, World, free_port, metric, signal};
use crate::{Ctx, Report, conclude};
use outbox_adapters_rabbitmq::QueueType;
use outbox_core::Status;
use outbox_examples::BillingQueue;
use outbox_examples::billing::CONSUMER;
use outbox_ports::{InboxStore, OutboxStore};
use outbox_testkit::proxy::TcpProxy;
use outbox_testkit::services;

fn report(name: &'static str) -> Report {
    Report {
        name,
        ..Report::default()
    }
}

/// Fails unless `url` is the local server at `addr`: only those may be stopped.
fn require_local(url: &str, addr: &str, what: &str) -> anyhow::Result<()> {
    anyhow::ensure!(
        services::is_local(url, addr),
        "this scenario stops {what} and needs the local server at {addr}, not {}",
        outbox_core::config::redact_url(url)
    );
    Ok(())
}

/// One relay (lock in PostgreSQL) and one consumer.
fn relay_and_consumer(w: &World) -> anyhow::Result<(tokio::process::Child, tokio::process::Child)> {
    let cfg = w.relay_config("r1", Coordination::Postgres, None, SweepOpts::default());
    Ok((w.relay("r1", &cfg)?, w.consumer("c1", &[])?))
}

async fn wait_committed(w: &World, at_least: u64) -> anyhow::Result<()> {
    w.wait_until(
        &format!("{at_least} committed orders"),
        Duration::from_secs(60),
        async |w| w.committed().await >= at_least,
    )
    .await
}

/// Scenario 1: `rabbitmqctl stop_app` mid-stream for three seconds, then `start_app`.
pub(crate) async fn broker_restart(ctx: &Ctx) -> anyhow::Result<Report> {
    require_local(&ctx.urls.amqp, services::AMQP_ADDR, "RabbitMQ")?;
    let w = World::new("broker", &ctx.urls, &ctx.bins).await?;
    let (relay, consumer) = relay_and_consumer(&w)?;
    let n = ctx.orders();
    let producer = w.produce(1, n, Ctx::RATE);
    wait_committed(&w, n as u64 / 3).await?;
    let stopped = services::stop_rabbitmq();
    tokio::time::sleep(Duration::from_secs(3)).await;
    anyhow::ensure!(stopped.restore(), "RabbitMQ did not come back");
    let fault_end = Instant::now();
    let produced = producer.finish().await;
    let r = conclude(
        ctx,
        &w,
        report("broker_restart"),
        produced,
        fault_end,
        vec![relay, consumer],
    )
    .await;
    w.cleanup(r.as_ref().map_or(true, |r| !r.passed())).await;
    r
}

/// Scenario 2: The relay is killed with SIGKILL mid-stream; a new one takes over.
pub(crate) async fn relay_kill(ctx: &Ctx) -> anyhow::Result<Report> {
    let w = World::new("kill", &ctx.urls, &ctx.bins).await?;
    let (mut victim, consumer) = relay_and_consumer(&w)?;
    let n = ctx.orders();
    let producer = w.produce(1, n, Ctx::RATE);
    w.wait_until("a third sent", Duration::from_secs(60), async |w| {
        w.sent().await >= n as u64 / 3
    })
    .await?;
    victim.start_kill()?;
    let _ = victim.wait().await;
    let mut r = report("relay_kill");
    r.notes.push(format!(
        "relay killed with {} messages sent",
        w.sent().await
    ));
    let cfg = w.relay_config("r2", Coordination::Postgres, None, SweepOpts::default());
    let successor = w.relay("r2", &cfg)?;
    let fault_end = Instant::now();
    let produced = producer.finish().await;
    let r = conclude(ctx, &w, r, produced, fault_end, vec![successor, consumer]).await;
    w.cleanup(r.as_ref().map_or(true, |r| !r.passed())).await;
    r
}

/// Scenario 3: Every connection of the relay and the consumer is terminated
/// (`pg_terminate_backend`), later PostgreSQL restarts.
pub(crate) async fn postgres_faults(ctx: &Ctx) -> anyhow::Result<Report> {
    require_local(&ctx.urls.pg, services::PG_ADDR, "PostgreSQL")?;
    let w = World::new("pg", &ctx.urls, &ctx.bins).await?;
    let (relay, consumer) = relay_and_consumer(&w)?;
    let n = ctx.orders();
    let producer = w.produce(1, n, Ctx::RATE);
    wait_committed(&w, n as u64 / 4).await?;
    // Exactly the relay's and the consumer's (their application_name), not those of
    // anyone else using the same database.
    let terminated: i64 = sqlx::query_scalar(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
         WHERE application_name = $1",
    )
    .bind(&w.proc_app)
    .fetch_one(&w.pool)
    .await?;
    let mut r = report("postgres_faults");
    if terminated == 0 {
        r.failures
            .push("no connection of the relay or the consumer was found to terminate".into());
    }
    r.notes.push(format!("{terminated} connections terminated"));
    wait_committed(&w, n as u64 / 2).await?;
    anyhow::ensure!(
        services::restart_postgres(),
        "PostgreSQL did not come back after its restart"
    );
    let fault_end = Instant::now();
    let produced = producer.finish().await;
    let r = conclude(ctx, &w, r, produced, fault_end, vec![relay, consumer]).await;
    w.cleanup(r.as_ref().map_or(true, |r| !r.passed())).await;
    r
}

/// Makes the broker refuse every message for the scenario's queues (a policy of
/// `max-length` 0 with `reject-publish`: publishes are nacked), so every publish
/// fails while the topology stays as it is. Dropping the guard lifts the policy.
struct Refusing {
    name: String,
    lifted: bool,
}

impl Refusing {
    async fn start(w: &World) -> anyhow::Result<Self> {
        let name = format!("chaos-{}", w.id);
        let pattern = format!("^chaos\\.{}\\.(billing|tap)$", w.id);
        let ok = Command::new("rabbitmqctl")
            .args([
                "set_policy",
                "--apply-to",
                "queues",
                "--priority",
                "100",
                &name,
                &pattern,
                r#"{"max-length":0,"overflow":"reject-publish"}"#,
            ])
            .output()
            .await?;
        anyhow::ensure!(
            ok.status.success(),
            "rabbitmqctl set_policy failed: {}",
            String::from_utf8_lossy(&ok.stderr)
        );
        Ok(Self {
            name,
            lifted: false,
        })
    }

    fn clear(name: &str) -> bool {
        std::process::Command::new("rabbitmqctl")
            .args(["clear_policy", name])
            .output()
            .is_ok_and(|o| o.status.success())
    }

    fn lift(mut self) -> anyhow::Result<()> {
        self.lifted = true;
        anyhow::ensure!(Self::clear(&self.name), "rabbitmqctl clear_policy failed");
        Ok(())
    }
}

impl Drop for Refusing {
    fn drop(&mut self) {
        if !self.lifted {
            Self::clear(&self.name);
        }
    }
}

/// Produces `n` orders quickly while the broker refuses them, waits until all have
/// failed their first publish, and lifts the refusal.
async fn produce_failing(w: &World, n: i64) -> anyhow::Result<crate::Produced> {
    let refusing = Refusing::start(w).await?;
    let produced = w.produce(1, n, 2_000).finish().await;
    w.wait_until(
        "every message to fail its first publish",
        Duration::from_secs(60),
        async |w| {
            w.tally()
                .await
                .is_ok_and(|t| t.publish_failed + t.dead_outbox == t.committed)
        },
    )
    .await?;
    refusing.lift()?;
    Ok(produced)
}

async fn publish_failed(w: &World) -> u64 {
    w.tally().await.map_or(u64::MAX, |t| t.publish_failed)
}

/// Scenario 4: Redis (lock and sweep state) stops while the sweep retries failed publishes;
/// without it no sweep may run; after it is back the sweep finishes the work.
pub(crate) async fn redis_outage(ctx: &Ctx) -> anyhow::Result<Report> {
    require_local(&ctx.urls.redis, services::REDIS_ADDR, "Redis")?;
    let w = World::new("redis", &ctx.urls, &ctx.bins).await?;
    let port = free_port()?;
    let sweep = SweepOpts {
        batch_size: 20,
        max_batches: 5,
        lock_ttl: "3s",
    };
    let cfg = w.relay_config("r1", Coordination::Redis, Some(port), sweep);
    let relay = w.relay("r1", &cfg)?;
    let consumer = w.consumer("c1", &[])?;
    let produced = produce_failing(&w, if ctx.quick { 1_000 } else { 2_500 }).await?;
    let before = publish_failed(&w).await;
    w.wait_until(
        "the sweep to retry a batch",
        Duration::from_secs(30),
        async |w| publish_failed(w).await + 20 <= before,
    )
    .await?;
    let stopped = services::stop_redis();
    // The holder's lease runs out (3 s) and its batch in hand ends; from then on
    // nothing may be swept.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (held_rows, held_sweeps) = (
        publish_failed(&w).await,
        metric(port, "outbox_sweeps_total").await,
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (later_rows, later_sweeps) = (
        publish_failed(&w).await,
        metric(port, "outbox_sweeps_total").await,
    );
    let mut r = report("redis_outage");
    if later_rows != held_rows {
        r.failures.push(format!(
            "{} failed messages were retried while Redis (the lock) was down",
            held_rows.saturating_sub(later_rows)
        ));
    }
    if held_sweeps.is_none() || later_sweeps != held_sweeps {
        r.failures.push(format!(
            "outbox_sweeps_total moved while Redis was down: {held_sweeps:?} -> {later_sweeps:?}"
        ));
    }
    r.notes.push(format!(
        "without Redis for 5 s: publish_failed stayed at {later_rows}, sweeps at {}",
        later_sweeps.unwrap_or(-1.0)
    ));
    anyhow::ensure!(stopped.restore(), "Redis did not come back");
    let fault_end = Instant::now();
    let r = conclude(ctx, &w, r, produced, fault_end, vec![relay, consumer]).await;
    w.cleanup(r.as_ref().map_or(true, |r| !r.passed())).await;
    r
}

async fn redis_get(url: &str, key: &str) -> Option<String> {
    let out = Command::new("redis-cli")
        .args(["-u", url, "--raw", "GET", key])
        .output()
        .await
        .ok()?;
    let v = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    (!v.is_empty()).then_some(v)
}

/// `fencing_token=N` (a tracing field) or `"fencing_token":N` (JSON) in `text`.
fn fencing_token(text: &str) -> Option<u64> {
    let at = text.find("fencing_token")? + "fencing_token".len();
    text[at..]
        .trim_start_matches(['=', '"', ':'])
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .ok()
}

/// Scenario 5: The relay sweeping under the lock is paused (SIGSTOP) past its lease; the
/// other relay takes over; the first, resumed, stops and records nothing.
pub(crate) async fn lease_lost(ctx: &Ctx) -> anyhow::Result<Report> {
    let w = World::new("lease", &ctx.urls, &ctx.bins).await?;
    let sweep = SweepOpts {
        batch_size: 5,
        max_batches: 100_000,
        lock_ttl: "2s",
    };
    let names = ["ra", "rb"];
    let mut relays = Vec::new();
    for name in names {
        let cfg = w.relay_config(name, Coordination::Redis, None, sweep);
        relays.push(w.relay(name, &cfg)?);
    }
    let consumer = w.consumer("c1", &[])?;
    let produced = produce_failing(&w, if ctx.quick { 2_000 } else { 4_000 }).await?;
    // Catch the holder in the middle of its sweep.
    let deadline = Instant::now() + Duration::from_secs(30);
    let holder = loop {
        if let Some(v) = redis_get(&w.urls.redis, &w.lock_key).await {
            if let Some(i) = names.iter().position(|n| v.starts_with(&format!("{n}-"))) {
                break i;
            }
        }
        anyhow::ensure!(Instant::now() < deadline, "no relay took the sweep lock");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    signal(&relays[holder], "-STOP").await;
    let at_pause = publish_failed(&w).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after_pause = publish_failed(&w).await;
    let taken_over = redis_get(&w.urls.redis, &w.lock_key).await;
    signal(&relays[holder], "-CONT").await;
    let fault_end = Instant::now();
    let mut r = report("lease_lost");
    if after_pause >= at_pause {
        r.failures.push(format!(
            "the other relay did not sweep while {} was paused ({at_pause} -> {after_pause} failed)",
            names[holder]
        ));
    }
    r.notes.push(format!(
        "{} paused 5 s mid-sweep (lease 2 s); meanwhile the other relay retried {} messages; lock then {}",
        names[holder],
        at_pause.saturating_sub(after_pause),
        taken_over.as_deref().map_or("free", |v| v.split('/').next().unwrap_or(v))
    ));
    let mut r = conclude(
        ctx,
        &w,
        r,
        produced,
        fault_end,
        relays.into_iter().chain([consumer]).collect(),
    )
    .await?;
    let log =
        std::fs::read_to_string(w.dir.join(format!("{}.log", names[holder]))).unwrap_or_default();
    let lost_line = log
        .lines()
        .find(|l| l.contains("retry lock lost during the sweep"));
    match lost_line.and_then(fencing_token) {
        None => r.failures.push(format!(
            "{} did not stop its sweep on losing the lock (no 'retry lock lost' in its log)",
            names[holder]
        )),
        Some(lost) => {
            let stored = redis_get(&w.urls.redis, &w.state_key)
                .await
                .as_deref()
                .and_then(fencing_token);
            match stored {
                Some(s) if s > lost => r.notes.push(format!(
                    "sweep state carries token {s}, newer than the lost lease's {lost}"
                )),
                other => r.failures.push(format!(
                    "sweep state token {other:?} is not newer than the lost lease's {lost}"
                )),
            }
        }
    }
    let fenced = log.lines().filter(|l| l.contains("fenced")).count();
    r.notes.push(format!(
        "{fenced} log lines of the paused relay report fenced (refused) marks"
    ));
    let passed = r.passed();
    w.cleanup(!passed).await;
    Ok(r)
}

/// Scenario 6: Two relays and two consumers (5 % of first attempts failing) on one set of
/// tables.
pub(crate) async fn racing(ctx: &Ctx) -> anyhow::Result<Report> {
    let w = World::new("race", &ctx.urls, &ctx.bins).await?;
    let mut children = Vec::new();
    for name in ["r1", "r2"] {
        let cfg = w.relay_config(name, Coordination::Postgres, None, SweepOpts::default());
        children.push(w.relay(name, &cfg)?);
    }
    for name in ["c1", "c2"] {
        children.push(w.consumer(name, &[("BILLING_FAIL_FIRST_PERCENT", "5")])?);
    }
    let produced = w.produce(1, ctx.orders() * 2, Ctx::RATE * 4).finish().await;
    let fault_end = Instant::now();
    let r = conclude(ctx, &w, report("racing"), produced, fault_end, children).await;
    w.cleanup(r.as_ref().map_or(true, |r| !r.passed())).await;
    r
}

/// Scenario 7: Poison orders (the handler always fails) and a foreign publisher's
/// deliveries: no message id, an undecodable payload, an oversized body.
pub(crate) async fn poison(ctx: &Ctx) -> anyhow::Result<Report> {
    let w = World::new("poison", &ctx.urls, &ctx.bins).await?;
    let poison = [7i64, 77, 177, 377, 777];
    let list = poison.map(|p| p.to_string()).join(",");
    let cfg = w.relay_config("r1", Coordination::Postgres, None, SweepOpts::default());
    let relay = w.relay("r1", &cfg)?;
    let consumer = w.consumer("c1", &[("BILLING_POISON_ORDERS", list.as_str())])?;
    let producer = w.produce(1, 1_000, Ctx::RATE);

    let ch = w.channel().await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    let undecodable = uuid::Uuid::now_v7().to_string();
    let oversized = uuid::Uuid::now_v7().to_string();
    let typed = || BasicProperties::default().with_type("order.created".into());
    let foreign: [(BasicProperties, Vec<u8>); 3] = [
        (
            typed(),
            b"{\"order_id\": 1, \"note\": \"no message id\"}".to_vec(),
        ),
        (
            typed().with_message_id(undecodable.as_str().into()),
            b"\xff\xfe not json at all".to_vec(),
        ),
        (
            typed().with_message_id(oversized.as_str().into()),
            vec![b' '; 2 * 1024 * 1024],
        ),
    ];
    let (no_id_len, oversized_len) = (foreign[0].1.len(), foreign[2].1.len());
    for (props, body) in foreign {
        let confirm = ch
            .basic_publish(
                "".into(),
                w.shop.queue.as_str().into(),
                BasicPublishOptions::default(),
                &body,
                props.with_delivery_mode(2),
            )
            .await?
            .await?;
        anyhow::ensure!(confirm.is_ack(), "the broker refused a foreign message");
    }
    let produced = producer.finish().await;
    let fault_end = Instant::now();
    // Foreign deliveries are counted by hand: they are not orders.
    let mut r = report("poison");
    r.enqueued = 3;
    r.committed = 3;
    // Orders whose id ends in 0 are rolled back by the producer (see World::produce).
    let poison_committed = poison.iter().filter(|p| *p % 10 != 0).count() as u64;
    r.expected_dead = poison_committed + 3;
    let mut r = conclude(ctx, &w, r, produced, fault_end, vec![relay, consumer]).await?;
    let o = w.shop.outbox_schema.quoted();
    let letters: Vec<(Option<String>, String, i32)> = sqlx::query_as(&format!(
        "SELECT message_id, reason, octet_length(body) FROM {o}.outbox_dead_letters ORDER BY seq"
    ))
    .fetch_all(&w.pool)
    .await?;
    let mut foreign_found = 0;
    let body_is = |len: &i32, want: usize| usize::try_from(*len).is_ok_and(|l| l == want);
    if letters.iter().any(|(id, reason, len)| {
        id.is_none() && reason.contains("no message id") && body_is(len, no_id_len)
    }) {
        foreign_found += 1;
    } else {
        r.failures.push(format!(
            "no dead letter for the delivery without an id: {letters:?}"
        ));
    }
    if letters.iter().any(|(id, reason, len)| {
        id.as_deref() == Some(oversized.as_str())
            && reason.contains("limit")
            && body_is(len, oversized_len)
    }) {
        foreign_found += 1;
    } else {
        r.failures.push(format!(
            "no dead letter for the oversized delivery: {letters:?}"
        ));
    }
    let undecodable_row = w
        .inbox
        .get(CONSUMER, undecodable.parse()?)
        .await?
        .map(|rec| (rec.status, rec.consume.last_error));
    match &undecodable_row {
        Some((Status::Dead, Some(err))) => {
            foreign_found += 1;
            r.notes.push(format!("undecodable payload dead: {err}"));
        }
        other => r.failures.push(format!(
            "the undecodable delivery is not dead with a reason: {other:?}"
        )),
    }
    r.lost += 3 - foreign_found;
    let poisoned = w
        .inbox
        .list(CONSUMER, Status::Dead, 1_000)
        .await?
        .iter()
        .filter(|rec| {
            rec.consume
                .last_error
                .as_deref()
                .is_some_and(|e| e.contains("cannot be billed"))
        })
        .count() as u64;
    if poisoned != poison_committed {
        r.failures.push(format!(
            "{poisoned} poison orders dead with their reason, expected {poison_committed}"
        ));
    }
    r.notes.push(format!(
        "{poisoned} poison orders and 3 foreign deliveries dead with their reasons; the rest billed"
    ));
    let passed = r.passed();
    w.cleanup(!passed).await;
    Ok(r)
}

/// A row written through the documented SQL contract before the table's AMQP
/// constraints existed.
struct BadRow {
    label: &'static str,
    /// SQL expressions for the columns (`$1` is the shop's exchange).
    exchange: &'static str,
    routing_key: &'static str,
    message_type: &'static str,
    headers: &'static str,
    created_at: &'static str,
    /// What its dead reason must name.
    column: &'static str,
}

const fn bad_row(
    label: &'static str,
    [exchange, routing_key, message_type, headers, created_at]: [&'static str; 5],
    column: &'static str,
) -> BadRow {
    BadRow {
        label,
        exchange,
        routing_key,
        message_type,
        headers,
        created_at,
        column,
    }
}

const KEY: &str = "'order.created'";

const BAD_ROWS: &[BadRow] = &[
    bad_row(
        "nested header value",
        ["$1", KEY, "NULL", r#"'{"a": {"b": 1}}'"#, "now()"],
        "headers",
    ),
    bad_row(
        "headers an array",
        ["$1", KEY, "NULL", "'[1, 2]'", "now()"],
        "headers",
    ),
    bad_row(
        "routing key of 300 bytes",
        ["$1", "repeat('k', 300)", "NULL", "'{}'", "now()"],
        "routing_key",
    ),
    bad_row(
        "exchange of 300 bytes",
        ["repeat('e', 300)", KEY, "NULL", "'{}'", "now()"],
        "exchange",
    ),
    bad_row(
        "message type of 300 bytes",
        ["$1", KEY, "repeat('t', 300)", "'{}'", "now()"],
        "message_type",
    ),
    bad_row(
        "header name of 300 bytes",
        [
            "$1",
            KEY,
            "NULL",
            "jsonb_build_object(repeat('h', 300), 'v')",
            "now()",
        ],
        "headers",
    ),
    bad_row(
        "headers of 70 KB (more than an AMQP frame takes)",
        [
            "$1",
            KEY,
            "NULL",
            "jsonb_build_object('big', repeat('v', 70000))",
            "now()",
        ],
        "headers",
    ),
    bad_row(
        "created_at of infinity",
        ["$1", KEY, "NULL", "'{}'", "'infinity'"],
        "created_at",
    ),
];

/// Scenario 8: Bad rows among good orders, written by plain SQL into a table without
/// the AMQP constraints (as rows written before the constraints existed): each is
/// dead at once with a reason naming its column, every order flows, and the relay
/// stays ready and publishing.
pub(crate) async fn bad_rows(ctx: &Ctx) -> anyhow::Result<Report> {
    let w = World::new("badrows", &ctx.urls, &ctx.bins).await?;
    let o = w.shop.outbox_schema.quoted();
    let constraints: Vec<String> = sqlx::query_scalar(&format!(
        "SELECT conname::text FROM pg_constraint WHERE conrelid = '{o}.outbox_messages'::regclass \
         AND conname LIKE 'outbox\\_messages\\_%\\_amqp'"
    ))
    .fetch_all(&w.pool)
    .await?;
    for c in &constraints {
        sqlx::query(&format!(
            "ALTER TABLE {o}.outbox_messages DROP CONSTRAINT \"{}\"",
            c.replace('"', "")
        ))
        .execute(&w.pool)
        .await?;
    }
    let port = free_port()?;
    let cfg = w.relay_config(
        "r1",
        Coordination::Postgres,
        Some(port),
        SweepOpts::default(),
    );
    let relay = w.relay("r1", &cfg)?;
    let consumer = w.consumer("c1", &[])?;
    let producer = w.produce(1, ctx.orders(), Ctx::RATE);
    wait_committed(&w, 100).await?;
    let mut ids = Vec::new();
    for row in BAD_ROWS {
        let id: uuid::Uuid = sqlx::query_scalar(&format!(
            "INSERT INTO {o}.outbox_messages (exchange, routing_key, message_type, headers, created_at, payload) \
             VALUES ({}, {}, {}, {}::jsonb, {}, convert_to('{{\"bad_row\": true}}', 'UTF8')) \
             RETURNING id",
            row.exchange, row.routing_key, row.message_type, row.headers, row.created_at
        ))
        .bind(&w.shop.exchange)
        .fetch_one(&w.pool)
        .await
        .with_context(|| format!("insert the bad row {:?}", row.label))?;
        ids.push(id);
    }
    let produced = producer.finish().await;
    let fault_end = Instant::now();
    let mut r = report("bad_rows");
    r.enqueued = BAD_ROWS.len() as u64;
    r.committed = BAD_ROWS.len() as u64;
    r.expected_dead = BAD_ROWS.len() as u64;
    // While the relay still runs: every order through, every bad row dead; then it
    // must still say it is ready and count what it published.
    let bad = BAD_ROWS.len() as u64;
    let through = w
        .wait_until(
            "every order consumed and the bad rows dead",
            ctx.settle_timeout(),
            async |w| {
                w.tally()
                    .await
                    .is_ok_and(|t| t.unaccounted == 0 && t.dead_outbox >= bad)
            },
        )
        .await;
    let orders = w.committed().await;
    let ready = readyz(port).await;
    let published = metric(port, "outbox_published_total").await.unwrap_or(0.0) as u64;
    let mut r = conclude(ctx, &w, r, produced, fault_end, vec![relay, consumer]).await?;
    if let Err(e) = through {
        r.failures.push(format!("{e:#}"));
    }
    // The migration's constraints existed (so the rows are as old rows would be).
    for column in [
        "exchange",
        "routing_key",
        "message_type",
        "headers",
        "created_at",
    ] {
        let name = format!("outbox_messages_{column}_amqp");
        if !constraints.contains(&name) {
            r.failures.push(format!(
                "the migration's constraint {name} was not there to drop: {constraints:?}"
            ));
        }
    }
    let mut dead_as_expected = 0;
    for (BadRow { label, column, .. }, id) in BAD_ROWS.iter().zip(&ids) {
        let rec = w.outbox.get(outbox_core::MessageId::from_uuid(*id)).await?;
        match rec
            .as_ref()
            .map(|r| (r.status, r.publish.last_error.as_deref()))
        {
            Some((Status::Dead, Some(e))) if e.contains(column) => {
                dead_as_expected += 1;
                r.notes.push(format!("{label}: dead, {e}"));
            }
            other => r.failures.push(format!(
                "{label}: expected dead naming {column}, found {other:?}"
            )),
        }
    }
    // A bad row not dead is unaccounted for: the rows are not orders, so the tally
    // cannot see them.
    r.lost += BAD_ROWS.len() as u64 - dead_as_expected;
    if ready != Some(200) {
        r.failures.push(format!(
            "/readyz answered {ready:?} after the bad rows, not 200"
        ));
    }
    if published < orders {
        r.failures.push(format!(
            "outbox_published_total {published} < the {orders} committed orders"
        ));
    }
    let passed = r.passed();
    w.cleanup(!passed).await;
    Ok(r)
}

/// The HTTP status of `127.0.0.1:port/readyz`.
async fn readyz(port: u16) -> Option<u16> {
    let out = Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "5",
            &format!("http://127.0.0.1:{port}/readyz"),
        ])
        .output()
        .await
        .ok()?;
    String::from_utf8_lossy(&out.stdout).trim().parse().ok()
}

/// Orders of [`handler_db_faults`] whose handler swallows a failed statement.
const SWALLOW_ERROR_ORDERS: [i64; 4] = [13, 113, 213, 413];
/// Orders of [`handler_db_faults`] whose COMMIT fails on a deferred constraint.
const FAIL_AT_COMMIT_ORDERS: [i64; 4] = [27, 127, 327, 527];

/// The orders among `ids` the producer commits: it rolls back every tenth order
/// (see [`World::produce`]), and those never reach the consumer.
fn committed_among(ids: &[i64]) -> Vec<i64> {
    ids.iter().copied().filter(|id| id % 10 != 0).collect()
}

/// What a dead delivery must say for each kind of injected handler fault.
const SWALLOWED_REASON: &str = "aborted by a statement the handler ignored";
const COMMIT_REASON: &str = "billing_commit_check_once";

/// Scenario 9: database faults inside the transactional handler. For some orders
/// the billing handler runs a statement that fails and swallows its error (the
/// transaction is aborted behind an `Ok`); for others it writes under a deferred
/// unique constraint that fails at COMMIT. Each such order must end dead after
/// the consumer's retries (failed attempts, never acknowledged with nothing kept,
/// never redelivered forever), with its reason; every other order is billed.
pub(crate) async fn handler_db_faults(ctx: &Ctx) -> anyhow::Result<Report> {
    let w = World::new("dbfaults", &ctx.urls, &ctx.bins).await?;
    let ids = |list: &[i64]| {
        list.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",")
    };
    let (swallow, at_commit) = (ids(&SWALLOW_ERROR_ORDERS), ids(&FAIL_AT_COMMIT_ORDERS));
    let cfg = w.relay_config("r1", Coordination::Postgres, None, SweepOpts::default());
    let relay = w.relay("r1", &cfg)?;
    // The billing consumer's own retry policy is short (MAX_ATTEMPTS attempts,
    // 200 ms doubling to 5 s) and the chaos consumer sweeps every second, so a
    // faulty order is dead within about ten seconds of its first delivery.
    let consumer = w.consumer(
        "c1",
        &[
            ("BILLING_SWALLOW_ERROR_ORDERS", swallow.as_str()),
            ("BILLING_FAIL_AT_COMMIT_ORDERS", at_commit.as_str()),
        ],
    )?;
    let produced = w.produce(1, 1_000, Ctx::RATE).finish().await;
    let fault_end = Instant::now();
    let swallow_committed = committed_among(&SWALLOW_ERROR_ORDERS);
    let commit_committed = committed_among(&FAIL_AT_COMMIT_ORDERS);
    let mut r = report("handler_db_faults");
    // The dead this scenario provokes: every faulty order that committed, nothing
    // else.
    r.expected_dead = (swallow_committed.len() + commit_committed.len()) as u64;
    let expected_dead = r.expected_dead;
    let mut r = conclude(ctx, &w, r, produced, fault_end, vec![relay, consumer]).await?;
    let dead: std::collections::HashMap<i64, (u32, String)> = w
        .inbox
        .list(CONSUMER, Status::Dead, 10_000)
        .await?
        .into_iter()
        .filter_map(|rec| {
            let order = outbox_examples::billing::order_id_of(&rec.message)?;
            Some((
                order,
                (
                    rec.consume.attempts,
                    rec.consume.last_error.unwrap_or_default(),
                ),
            ))
        })
        .collect();
    let mut dead_as_expected = 0u64;
    for (orders, reason) in [
        (&swallow_committed, SWALLOWED_REASON),
        (&commit_committed, COMMIT_REASON),
    ] {
        for order in orders {
            match dead.get(order) {
                Some((attempts, error))
                    if *attempts == outbox_examples::billing::MAX_ATTEMPTS
                        && error.contains(reason) =>
                {
                    dead_as_expected += 1;
                }
                other => r.failures.push(format!(
                    "order {order} is not dead after {} attempts with {reason:?}: {other:?}",
                    outbox_examples::billing::MAX_ATTEMPTS
                )),
            }
        }
    }
    let unexpected: Vec<&i64> = dead
        .keys()
        .filter(|o| !swallow_committed.contains(o) && !commit_committed.contains(o))
        .collect();
    if !unexpected.is_empty() {
        r.failures.push(format!(
            "orders dead without an injected fault: {unexpected:?}"
        ));
    }
    if let Some((_, error)) = swallow_committed.first().and_then(|o| dead.get(o)) {
        r.notes.push(format!("swallowed statement: {error}"));
    }
    if let Some((_, error)) = commit_committed.first().and_then(|o| dead.get(o)) {
        r.notes.push(format!("failed commit: {error}"));
    }
    r.notes.push(format!(
        "{dead_as_expected} of {expected_dead} faulty orders dead with their reasons; the rest billed"
    ));
    let passed = r.passed();
    w.cleanup(!passed).await;
    Ok(r)
}

/// One bad input at the edge: what is run, and what its refusal must say.
struct BadInput {
    label: &'static str,
    args: Vec<String>,
    config: Option<String>,
    env: Vec<(&'static str, &'static str)>,
    expect: &'static str,
    secret: Option<&'static str>,
}

/// Scenario 10: Bad configuration and bad input: each must be refused with a clear message
/// and a non-zero exit, with nothing written and no secret shown.
pub(crate) async fn bad_config(ctx: &Ctx) -> anyhow::Result<Report> {
    let w = World::new("badcfg", &ctx.urls, &ctx.bins).await?;
    let dir = w.dir.clone();
    let u = &ctx.urls;
    let schema = format!("{}_cfg", w.shop.outbox_schema.as_str());
    let base = |pg: &str, amqp: &str, redis: &str, extra: &str| {
        format!(
            "[adapters]\nstore = \"postgres\"\npublisher = \"rabbitmq\"\nlock = \"redis\"\nsweep_state = \"redis\"\n\
             [postgres]\nurl = \"{pg}\"\nschema = \"{schema}\"\nmigrate_on_start = true\n\
             [rabbitmq]\nurl = \"{amqp}\"\n[redis]\nurl = \"{redis}\"\n{extra}\n[http]\nenabled = false\n"
        )
    };
    let good = base(&u.pg, &u.amqp, &u.redis, "");
    let amqp_wrong = u.amqp.replacen("guest:guest@", "guest:chaos-secret-1@", 1);
    let redis_wrong = u.redis.replacen("redis://", "redis://:chaos-secret-2@", 1);
    let unreachable_pg = u.pg.replacen(":5432/", ":1/", 1);
    let unknown_db = match u.pg.rfind('/') {
        Some(i) => format!("{}/chaos_no_such_db", &u.pg[..i]),
        None => u.pg.clone(),
    };
    let s = |v: &[&str]| v.iter().map(|a| (*a).to_owned()).collect::<Vec<_>>();
    let cases = vec![
        BadInput {
            label: "unknown field",
            args: s(&["migrate"]),
            config: Some(base(&u.pg, &u.amqp, &u.redis, "[dispatch]\nbatchsize = 5")),
            env: vec![],
            expect: "unknown field",
            secret: None,
        },
        BadInput {
            label: "invalid schema identifier",
            args: s(&["migrate"]),
            config: Some(good.replace(
                &format!("schema = \"{schema}\""),
                "schema = \"x; DROP TABLE orders\"",
            )),
            env: vec![],
            expect: "schema",
            secret: None,
        },
        BadInput {
            label: "unreachable PostgreSQL",
            args: s(&["run"]),
            config: Some(base(&unreachable_pg, &u.amqp, &u.redis, "")),
            env: vec![],
            expect: "127.0.0.1:1",
            secret: None,
        },
        BadInput {
            label: "unknown database",
            args: s(&["run"]),
            config: Some(base(&unknown_db, &u.amqp, &u.redis, "")),
            env: vec![],
            expect: "chaos_no_such_db",
            secret: None,
        },
        BadInput {
            label: "wrong RabbitMQ password",
            args: s(&["run"]),
            config: Some(base(&u.pg, &amqp_wrong, &u.redis, "")),
            env: vec![],
            expect: "ACCESS_REFUSED",
            secret: Some("chaos-secret-1"),
        },
        BadInput {
            label: "unreachable RabbitMQ",
            args: s(&["run"]),
            config: Some(base(
                &u.pg,
                &u.amqp.replacen(":5672/", ":1/", 1),
                &u.redis,
                "",
            )),
            env: vec![],
            expect: "broker",
            secret: None,
        },
        BadInput {
            label: "wrong Redis password",
            args: s(&["run"]),
            config: Some(base(&u.pg, &u.amqp, &redis_wrong, "")),
            env: vec![],
            expect: "lock",
            secret: Some("chaos-secret-2"),
        },
        BadInput {
            label: "zero batch size from the environment",
            args: s(&["run"]),
            config: Some(good.clone()),
            env: vec![("OUTBOX__DISPATCH__BATCH_SIZE", "0")],
            expect: "batch_size",
            secret: None,
        },
        BadInput {
            label: "unparsable duration",
            args: s(&["run"]),
            config: Some(base(
                &u.pg,
                &u.amqp,
                &u.redis,
                "[sweep]\ninterval = \"soon\"",
            )),
            env: vec![],
            expect: "soon",
            secret: None,
        },
        BadInput {
            label: "HTTP off loopback without a token",
            args: s(&["run"]),
            config: Some(good.replace(
                "[http]\nenabled = false",
                "[http]\naddress = \"0.0.0.0:19999\"",
            )),
            env: vec![],
            expect: "token",
            secret: None,
        },
        BadInput {
            label: "missing config file",
            args: s(&["run", "--config", "/nonexistent/outbox.toml"]),
            config: None,
            env: vec![],
            expect: "/nonexistent/outbox.toml",
            secret: None,
        },
    ];
    let mut r = report("bad_config");
    let namespaces = "SELECT count(*) FROM pg_namespace";
    for (i, case) in cases.iter().enumerate() {
        r.bad_inputs += 1;
        let before: i64 = sqlx::query_scalar(namespaces).fetch_one(&w.pool).await?;
        let mut cmd = Command::new(&ctx.bins.outbox);
        cmd.args(&case.args);
        if let Some(text) = &case.config {
            let path = dir.join(format!("case{i}.toml"));
            std::fs::write(&path, text)?;
            cmd.arg("--config").arg(&path);
        }
        for (k, v) in &case.env {
            cmd.env(k, v);
        }
        cmd.env("RUST_LOG", "warn").kill_on_drop(true);
        let out = tokio::time::timeout(Duration::from_secs(40), cmd.output())
            .await
            .with_context(|| format!("{}: still running after 40 s", case.label))??;
        let after: i64 = sqlx::query_scalar(namespaces).fetch_one(&w.pool).await?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        let last = stderr
            .lines()
            .rev()
            .find(|l| l.contains("error"))
            .unwrap_or("")
            .to_owned();
        let mut wrong = Vec::new();
        if out.status.success() {
            wrong.push("exit code 0".to_owned());
        }
        if !stderr.contains(case.expect) {
            wrong.push(format!("message lacks {:?}", case.expect));
        }
        if case
            .secret
            .is_some_and(|s| stderr.contains(s) || String::from_utf8_lossy(&out.stdout).contains(s))
        {
            wrong.push("the password was shown".to_owned());
        }
        if after != before {
            wrong.push(format!("{} schema(s) created", after - before));
        }
        if wrong.is_empty() {
            r.refused_clearly += 1;
        } else {
            r.failures
                .push(format!("{}: {} ({last})", case.label, wrong.join(", ")));
        }
        r.notes.push(format!(
            "{} -> exit {}: {}",
            case.label,
            out.status.code().unwrap_or(-1),
            last.chars().take(160).collect::<String>()
        ));
    }
    // Bad input to the dead-message commands of a working deployment.
    let cfg = dir.join("good.toml");
    std::fs::write(&cfg, &good)?;
    let migrate = Command::new(&ctx.bins.outbox)
        .args(["migrate", "--config"])
        .arg(&cfg)
        .output()
        .await?;
    anyhow::ensure!(
        migrate.status.success(),
        "migrate of the good config failed: {}",
        String::from_utf8_lossy(&migrate.stderr)
    );
    for (label, args, expect) in [
        (
            "requeue of a malformed id",
            vec!["dead", "requeue", "not-a-uuid"],
            "not-a-uuid",
        ),
        (
            "delete of an unknown id",
            vec!["dead", "delete", "0190b1a2-0000-7000-8000-000000000000"],
            "no message with id",
        ),
    ] {
        r.bad_inputs += 1;
        let out = Command::new(&ctx.bins.outbox)
            .args(&args)
            .arg("--config")
            .arg(&cfg)
            .output()
            .await?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() && stderr.contains(expect) {
            r.refused_clearly += 1;
        } else {
            r.failures
                .push(format!("{label}: exit {:?}, {stderr}", out.status.code()));
        }
        r.notes.push(format!(
            "{label} -> exit {}: {}",
            out.status.code().unwrap_or(-1),
            stderr.trim().lines().last().unwrap_or("")
        ));
    }
    let _ = sqlx::query(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
        .execute(&w.pool)
        .await;
    let passed = r.passed();
    w.cleanup(!passed).await;
    Ok(r)
}

/// Consecutive effects of one ordering key (`c<order id % keys>`) in the wrong
/// order: invoices of a key by the order they were written (`billed_seq`), each
/// compared with the one before it.
async fn effects_out_of_order(w: &World, keys: i64) -> anyhow::Result<u64> {
    let s = w.shop.schema.quoted();
    let n: i64 = sqlx::query_scalar(&format!(
        "SELECT count(*) FROM (SELECT order_id, lag(order_id) OVER \
           (PARTITION BY order_id % $1 ORDER BY billed_seq) AS before FROM {s}.invoices) x \
         WHERE before >= order_id"
    ))
    .bind(keys)
    .fetch_one(&w.pool)
    .await?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// Scenario: per-key order through the faults. Orders of 40 customers (the
/// ordering key), two relays racing, one consumer keeping order by key; one relay
/// is killed with SIGKILL and the broker restarts mid-stream. Beside nothing lost
/// and nothing twice, every customer's invoices must be written in the order of
/// their orders.
pub(crate) async fn ordered(ctx: &Ctx) -> anyhow::Result<Report> {
    const KEYS: i64 = 40;
    require_local(&ctx.urls.amqp, services::AMQP_ADDR, "RabbitMQ")?;
    let w = World::new("ordered", &ctx.urls, &ctx.bins).await?;
    let cfg1 = w.relay_config("r1", Coordination::Postgres, None, SweepOpts::default());
    let cfg2 = w.relay_config("r2", Coordination::Postgres, None, SweepOpts::default());
    let mut victim = w.relay("r1", &cfg1)?;
    let other = w.relay("r2", &cfg2)?;
    let consumer = w.consumer("c1", &[("BILLING_ORDERED_BY_KEY", "true")])?;
    let n = ctx.orders();
    let producer = w.produce_keyed(1, n, Ctx::RATE, 4, Some(KEYS));
    w.wait_until("a quarter sent", Duration::from_secs(60), async |w| {
        w.sent().await >= n as u64 / 4
    })
    .await?;
    victim.start_kill()?;
    let _ = victim.wait().await;
    let cfg3 = w.relay_config("r3", Coordination::Postgres, None, SweepOpts::default());
    let successor = w.relay("r3", &cfg3)?;
    wait_committed(&w, n as u64 / 2).await?;
    let stopped = services::stop_rabbitmq();
    tokio::time::sleep(Duration::from_secs(3)).await;
    anyhow::ensure!(stopped.restore(), "RabbitMQ did not come back");
    let fault_end = Instant::now();
    let produced = producer.finish().await;
    let r = conclude(
        ctx,
        &w,
        report("ordered"),
        produced,
        fault_end,
        vec![other, successor, consumer],
    )
    .await;
    let r = match r {
        Ok(mut r) => {
            let wrong = effects_out_of_order(&w, KEYS).await?;
            if wrong > 0 {
                r.failures.push(format!(
                    "{wrong} invoices were written before an earlier order of their customer"
                ));
            } else {
                r.notes.push(format!(
                    "every one of the {KEYS} customers' invoices in the order of their orders"
                ));
            }
            Ok(r)
        }
        Err(e) => Err(e),
    };
    w.cleanup(r.as_ref().map_or(true, |r| !r.passed())).await;
    r
}

/// Scenario: the shop's exchange is deleted mid-stream (as a broker restart does to
/// a non-durable one, or an operator by mistake). The relay declares its configured
/// topology on every connection it opens: the window that found the exchange gone
/// spends one attempt on its messages, the relay reconnects, the exchange and its
/// bindings are back, and nothing goes dead or is lost.
pub(crate) async fn exchange_lost(ctx: &Ctx) -> anyhow::Result<Report> {
    let w = World::new("xlost", &ctx.urls, &ctx.bins).await?;
    let cfg = w.relay_config("r1", Coordination::Postgres, None, SweepOpts::default());
    // The shop's exchange and the bindings of the billing queue and the tap, as the
    // shop's setup and the suite declare them.
    let topology = format!(
        r##"
[[topology.exchanges]]
name = "{x}"
kind = "topic"

[[topology.bindings]]
queue = "{q}"
exchange = "{x}"
routing_key = "order.*"

[[topology.bindings]]
queue = "{tap}"
exchange = "{x}"
routing_key = "#"
"##,
        x = w.shop.exchange,
        q = w.shop.queue,
        tap = w.tap,
    );
    let mut text = std::fs::read_to_string(&cfg)?;
    text.push_str(&topology);
    std::fs::write(&cfg, text)?;
    let relay = w.relay("r1", &cfg)?;
    let consumer = w.consumer("c1", &[])?;
    let n = ctx.orders();
    let producer = w.produce(1, n, Ctx::RATE);
    wait_committed(&w, n as u64 / 3).await?;
    let sent_before = w.sent().await;
    let ch = w.channel().await?;
    ch.exchange_delete(
        w.shop.exchange.as_str().into(),
        lapin::options::ExchangeDeleteOptions::default(),
    )
    .await
    .context("delete the shop's exchange")?;
    let fault_end = Instant::now();
    let mut r = report("exchange_lost");
    r.notes
        .push(format!("exchange deleted with {sent_before} messages sent"));
    let produced = producer.finish().await;
    let r = conclude(ctx, &w, r, produced, fault_end, vec![relay, consumer]).await;
    w.cleanup(r.as_ref().map_or(true, |r| !r.passed())).await;
    r
}

/// Scenario: the billing consumer on a quorum queue with a delivery limit of 3
/// (`BILLING_QUEUE_TYPE=quorum`, `BILLING_DELIVERY_LIMIT=3`) loses PostgreSQL for
/// 30 s: it reaches the database through a TCP proxy the suite cuts (its
/// connections closed, new ones refused) while the server stays up for the relay
/// and the counting. A consumer that returned its deliveries while the inbox is
/// unreachable would spend their limit in seconds and the broker would give up on
/// them; held, none reaches it.
pub(crate) async fn inbox_outage_quorum(ctx: &Ctx) -> anyhow::Result<Report> {
    const LIMIT: u32 = 3;
    const OUTAGE: Duration = Duration::from_secs(30);
    let queue = BillingQueue {
        queue_type: QueueType::Quorum,
        delivery_limit: Some(LIMIT),
    };
    let w = World::with_queue("inboxq", &ctx.urls, &ctx.bins, queue).await?;
    let target = outbox_testkit::proxy::host_port(&w.urls.pg)
        .context("no host:port in the PostgreSQL URL")?
        .to_owned();
    let proxy = TcpProxy::start(&target).await?;
    let cfg = w.relay_config("r1", Coordination::Postgres, None, SweepOpts::default());
    let relay = w.relay("r1", &cfg)?;
    let consumer_pg = proxy.url_for(&w.proc_pg_url());
    let consumer = w.consumer("c1", &[("SHOP_DATABASE_URL", consumer_pg.as_str())])?;
    let n = ctx.orders();
    let producer = w.produce(1, n, Ctx::RATE);
    // Once the consumer is consuming: the cut then meets deliveries in hand.
    w.wait_until("first invoices", Duration::from_secs(60), async |w| {
        w.tally().await.is_ok_and(|t| t.consumed > 0)
    })
    .await?;
    let before = w.tally().await?;
    proxy.cut();
    tokio::time::sleep(OUTAGE).await;
    proxy.restore();
    let fault_end = Instant::now();
    let mut r = report("inbox_outage_quorum");
    r.notes.push(format!(
        "PostgreSQL unreachable for the consumer for {}s from {} committed and {} consumed; queue limit {LIMIT}; {} in the queue when it came back",
        OUTAGE.as_secs(),
        before.committed,
        before.consumed,
        w.queue_depth(&w.shop.queue).await.unwrap_or(0)
    ));
    let produced = producer.finish().await;
    let r = conclude(ctx, &w, r, produced, fault_end, vec![relay, consumer]).await;
    let r = match r {
        Ok(mut r) => {
            let log = std::fs::read_to_string(w.dir.join("c1.log")).unwrap_or_default();
            if !log.contains("holding the deliveries in hand") {
                r.failures
                    .push("the consumer never reported the inbox unreachable".into());
            }
            let dlq = w.shop.dead_letter_queue().unwrap_or_default();
            match w.queue_depth(&dlq).await {
                Ok(0) => {}
                Ok(left) => r.failures.push(format!(
                    "{left} deliveries left in the dead-letter queue {dlq}"
                )),
                Err(e) => r.failures.push(format!("cannot read {dlq}: {e}")),
            }
            Ok(r)
        }
        Err(e) => Err(e),
    };
    w.cleanup(r.as_ref().map_or(true, |r| !r.passed())).await;
    r
}

/// `127.0.0.1:port/readyz`: its HTTP status and body.
async fn readyz_body(port: u16) -> Option<(u16, String)> {
    let out = Command::new("curl")
        .args([
            "-s",
            "-w",
            "\n%{http_code}",
            "--max-time",
            "5",
            &format!("http://127.0.0.1:{port}/readyz"),
        ])
        .output()
        .await
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n')?;
    Some((code.trim().parse().ok()?, body.to_owned()))
}

/// Scenario 13: another session (an operator's forgotten `SELECT ... FOR UPDATE`)
/// holds the row locks of a batch the relay has claimed and is about to mark, for
/// 10 s. The relay's statements wait at most `lock_timeout` and are tried again;
/// its readiness must fail (503 naming the stall, `outbox_relay_stalled` 1) within
/// `stall_after` plus a few seconds, and clear by itself once the lock is gone.
pub(crate) async fn pg_lock_stall(ctx: &Ctx) -> anyhow::Result<Report> {
    const STALL_AFTER: Duration = Duration::from_secs(3);
    const HOLD: Duration = Duration::from_secs(10);
    // The watchdog's tick, the last claim completing after the lock was taken, one
    // lock wait: what readiness may take beyond `stall_after` to turn red.
    const SLACK: Duration = Duration::from_secs(3);
    let w = World::new("pglock", &ctx.urls, &ctx.bins).await?;
    let port = free_port()?;
    let cfg = w.relay_config(
        "r1",
        Coordination::Postgres,
        Some(port),
        SweepOpts::default(),
    );
    // Bounds a careful operator could choose for this small test; the claims' lease
    // outlasts the hold (as the default 60 s does), so the rows stay the relay's and
    // its mark lands once the lock is gone, instead of the rows being published again.
    let text = std::fs::read_to_string(&cfg)
        .with_context(|| format!("read {}", cfg.display()))?
        .replace(
            "max_connections = 4\n",
            "max_connections = 4\nstatement_timeout = \"5s\"\nlock_timeout = \"500ms\"\n",
        )
        .replace(
            &format!("lease_ttl = \"{}s\"", crate::world::LEASE_TTL.as_secs()),
            "lease_ttl = \"30s\"",
        )
        + &format!("[health]\nstall_after = \"{}s\"\n", STALL_AFTER.as_secs());
    std::fs::write(&cfg, text).with_context(|| format!("write {}", cfg.display()))?;
    let relay = w.relay("r1", &cfg)?;
    let consumer = w.consumer("c1", &[])?;
    let n = ctx.orders();
    let producer = w.produce(1, n, Ctx::RATE);
    wait_committed(&w, n as u64 / 3).await?;
    let mut r = report("pg_lock_stall");
    let before = readyz(port).await;
    if before != Some(200) {
        r.failures.push(format!(
            "/readyz answered {before:?} before the lock, not 200"
        ));
    }
    // A batch caught between its claim and its mark: pending rows under a live
    // lease. FOR UPDATE waits for a claim in progress and re-checks the row, so
    // what it returns is claimed, unmarked, and now locked by this session.
    let o = w.shop.outbox_schema.quoted();
    let catch = format!(
        "SELECT id FROM {o}.outbox_messages WHERE status = 'pending' \
         AND locked_until > now() FOR UPDATE"
    );
    let looking = Instant::now();
    let (holder, locked) = loop {
        let mut tx = w.pool.begin().await?;
        let ids: Vec<uuid::Uuid> = sqlx::query_scalar(&catch).fetch_all(&mut *tx).await?;
        if !ids.is_empty() {
            break (tx, ids.len());
        }
        tx.rollback().await?;
        anyhow::ensure!(
            looking.elapsed() < Duration::from_secs(30),
            "no batch was caught between its claim and its mark in 30 s"
        );
    };
    let locked_at = Instant::now();
    let mut red_after = None;
    let mut gauge_red = None;
    while locked_at.elapsed() < HOLD {
        if red_after.is_none() {
            if let Some((503, body)) = readyz_body(port).await {
                if body.contains("stalled") {
                    red_after = Some(locked_at.elapsed());
                    gauge_red = metric(port, "outbox_relay_stalled").await;
                    r.notes.push(format!(
                        "/readyz while locked: {}",
                        body.trim().replace('\n', "; ")
                    ));
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let sent_while_locked = w.sent().await;
    holder.rollback().await?;
    let fault_end = Instant::now();
    let mut green_after = None;
    while fault_end.elapsed() < Duration::from_secs(30) {
        if readyz(port).await == Some(200) {
            green_after = Some(fault_end.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let gauge_green = metric(port, "outbox_relay_stalled").await;
    r.notes.push(format!(
        "{locked} claimed rows locked for {}s ({sent_while_locked} sent by its end); readiness red after {:.1}s, green {:.1}s after the release",
        HOLD.as_secs(),
        red_after.map_or(f64::NAN, |d| d.as_secs_f64()),
        green_after.map_or(f64::NAN, |d| d.as_secs_f64()),
    ));
    match red_after {
        Some(d) if d <= STALL_AFTER + SLACK => {}
        Some(d) => r.failures.push(format!(
            "readiness turned red only after {d:?}, beyond stall_after {STALL_AFTER:?} + {SLACK:?}"
        )),
        None => r.failures.push(format!(
            "readiness never failed naming the stall in the {HOLD:?} the lock was held"
        )),
    }
    if red_after.is_some() && gauge_red != Some(1.0) {
        r.failures.push(format!(
            "outbox_relay_stalled was {gauge_red:?} while red, not 1"
        ));
    }
    match green_after {
        Some(d) if d <= Duration::from_secs(10) => {}
        other => r.failures.push(format!(
            "readiness did not clear within 10 s of the release ({other:?})"
        )),
    }
    if gauge_green != Some(0.0) {
        r.failures.push(format!(
            "outbox_relay_stalled was {gauge_green:?} after the release, not 0"
        ));
    }
    let produced = producer.finish().await;
    let r = conclude(ctx, &w, r, produced, fault_end, vec![relay, consumer]).await?;
    let passed = r.passed();
    w.cleanup(!passed).await;
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::{FAIL_AT_COMMIT_ORDERS, SWALLOW_ERROR_ORDERS, committed_among, fencing_token};

    #[test]
    fn only_the_faulty_orders_the_producer_commits_are_expected_dead() {
        assert_eq!(committed_among(&[13, 20, 113, 1000, 7]), vec![13, 113, 7]);
        assert_eq!(committed_among(&SWALLOW_ERROR_ORDERS).len(), 4);
        assert_eq!(committed_among(&FAIL_AT_COMMIT_ORDERS).len(), 4);
        assert!(
            SWALLOW_ERROR_ORDERS
                .iter()
                .chain(&FAIL_AT_COMMIT_ORDERS)
                .all(|o| (1..=1_000).contains(o)),
            "every faulty order is among the orders the scenario creates"
        );
    }

    #[test]
    fn fencing_tokens_are_read_from_log_lines_and_json() {
        assert_eq!(
            fencing_token(
                "WARN outbox_runtime::sweeper: retry lock lost task=\"publish-retry\" fencing_token=1796044583355966 ..."
            ),
            Some(1_796_044_583_355_966)
        );
        assert_eq!(
            fencing_token(r#"{"completed_at":"x","fencing_token":42,"publish_retried":1}"#),
            Some(42)
        );
        assert_eq!(fencing_token("no token here"), None);
        assert_eq!(fencing_token("fencing_token=abc"), None);
    }
}
