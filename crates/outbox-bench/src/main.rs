//! `cargo xtask bench`: measures the relay, the consumer and the producer side by side
//! with what RabbitMQ and PostgreSQL do on their own, in one run, and writes
//! `target/bench/summary.json`. Benchmarks are reports, not tests: nothing here
//! asserts a time.
//!
//! `outbox-bench [--quick] [--relay-only | --consume-only | --claim-only | --delayed-only] [--out PATH] [--relay-bin PATH]`
//! (`--help` prints the usage; an unknown argument is refused with it, exit 2)
//! (`--relay-only`: raw, relay, relay with 1,000 ordering keys, relay with two
//! pipelines, raw again;
//! `--consume-only`: raw consumer, then the inbox worker; `--claim-only`: claim times
//! and the admin service's reads over a million rows sent through the relay's marks;
//! `--delayed-only`: the publish lateness of delayed messages, then the claim times); URLs from
//! `OUTBOX_TEST_DATABASE_URL` and `OUTBOX_TEST_AMQP_URL`, else the local servers.

#![allow(clippy::print_stdout)] // the table is the program's output

mod cpu;
mod delayed;
mod ordered;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::StreamExt as _;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueuePurgeOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Confirmation};
use outbox_adapters_postgres::{
    PgConnection, PgInboxStore, PgOutbox, PgOutboxStore, PgPool, PgSchema, migrate,
};
use outbox_adapters_rabbitmq::{
    BindingSpec, ExchangeKind, ExchangeSpec, QueueSpec, RabbitPublisher, RabbitPublisherConfig,
    RabbitSubscriber, Topology,
};
use outbox_app::wiring::PgWakeupSource;
use outbox_app::{
    CancellationToken, ConsumerConfig, Dispatcher, DispatcherConfig, HandlerError,
    PgConsumerWorker, PgHandler, PgHandlerRegistry,
};
use outbox_core::{Message, NewMessage};
use outbox_ports::prelude::*;
use outbox_ports::{Lease, SystemClock};
use outbox_testkit::through::send_all_pending;

const EXCHANGE: &str = "outbox-bench.x";
const QUEUE: &str = "outbox-bench.q";
/// Ordering keys of the `relay_ordered` backlog.
const ORDERING_KEYS: i64 = 1_000;

struct Sizes {
    backlog: i64,
    naive: i64,
    latency: Duration,
    /// Delayed messages for the lateness phase, and the time they are enqueued over.
    delayed: usize,
    delayed_over: Duration,
    claim_rows: i64,
    consume: usize,
    memory_backlog: i64,
    enqueue_for: Duration,
}

struct Bench {
    pg_url: String,
    amqp_url: String,
    pool: PgPool,
    amqp: lapin::Connection,
    results: Vec<(String, f64, &'static str)>,
}

impl Bench {
    fn record(&mut self, name: &str, value: f64, unit: &'static str) {
        println!("{name:<28} {value:>12.2} {unit}");
        self.results.push((name.to_owned(), value, unit));
    }

    /// `<phase>_cpu_us` (the whole machine's busy CPU per message) and the parties'
    /// shares: `_self` (this process), `_postgres`, `_rabbitmq`.
    fn record_cpu(&mut self, phase: &str, cpu: cpu::CpuPerMessage) {
        self.record(&format!("{phase}_cpu_us"), cpu.machine, "us/msg");
        self.record(&format!("{phase}_cpu_us_self"), cpu.this_process, "us/msg");
        self.record(&format!("{phase}_cpu_us_postgres"), cpu.postgres, "us/msg");
        self.record(&format!("{phase}_cpu_us_rabbitmq"), cpu.rabbitmq, "us/msg");
    }

    async fn fresh_schema(&self, name: &str) -> anyhow::Result<PgSchema> {
        let schema = PgSchema::new(name)?;
        sqlx::query(&format!(
            "DROP SCHEMA IF EXISTS {} CASCADE",
            schema.quoted()
        ))
        .execute(&self.pool)
        .await?;
        migrate(&self.pool, &schema).await?;
        Ok(schema)
    }

    async fn purge(&self) -> anyhow::Result<()> {
        let ch = self.amqp.create_channel().await?;
        ch.queue_purge(QUEUE.into(), QueuePurgeOptions::default())
            .await?;
        Ok(())
    }

    /// `n` pending 1 KiB messages, by SQL, then VACUUM ANALYZE. With `keys`, row
    /// `i` (in `seq` order) has ordering key `key-{i % keys}`: round-robin, so each
    /// key's messages are interleaved with every other key's.
    async fn backlog(&self, schema: &PgSchema, n: i64, keys: Option<i64>) -> anyhow::Result<()> {
        sqlx::query(&format!(
            "INSERT INTO {}.outbox_messages (exchange, routing_key, payload, ordering_key) \
             SELECT $1, 'k', convert_to(repeat('x', 1024), 'UTF8'), 'key-' || (g % $3) \
             FROM generate_series(0, $2 - 1) AS g ORDER BY g",
            schema.quoted()
        ))
        .bind(EXCHANGE)
        .bind(n)
        .bind(keys)
        .execute(&self.pool)
        .await?;
        sqlx::query(&format!(
            "VACUUM ANALYZE {}.outbox_messages",
            schema.quoted()
        ))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn count(&self, schema: &PgSchema, status: &str) -> anyhow::Result<i64> {
        Ok(sqlx::query_scalar(&format!(
            "SELECT count(*) FROM {}.outbox_messages WHERE status = $1",
            schema.quoted()
        ))
        .bind(status)
        .fetch_one(&self.pool)
        .await?)
    }

    /// Publishes `n` messages with confirms through a sliding window of 1,024
    /// unconfirmed publishes (a new publish for each confirm), the most the broker
    /// does on its own; returns the rate and the CPU per message.
    async fn raw_confirm(&mut self, n: usize) -> anyhow::Result<(f64, cpu::CpuPerMessage)> {
        const WINDOW: usize = 1024;
        let ch = self.amqp.create_channel().await?;
        ch.confirm_select(ConfirmSelectOptions::default()).await?;
        let body = vec![b'x'; 1024];
        let cpu_before = cpu::sample();
        let started = Instant::now();
        let mut in_flight = std::collections::VecDeque::with_capacity(WINDOW);
        let (mut sent, mut confirmed) = (0, 0);
        while confirmed < n {
            while sent < n && in_flight.len() < WINDOW {
                in_flight.push_back(
                    ch.basic_publish(
                        EXCHANGE.into(),
                        "k".into(),
                        BasicPublishOptions {
                            mandatory: true,
                            ..BasicPublishOptions::default()
                        },
                        &body,
                        BasicProperties::default().with_delivery_mode(2),
                    )
                    .await?,
                );
                sent += 1;
            }
            let oldest = in_flight.pop_front().context("a publish in flight")?;
            anyhow::ensure!(
                matches!(oldest.await?, Confirmation::Ack(None)),
                "raw publish not confirmed"
            );
            confirmed += 1;
        }
        let rate = n as f64 / started.elapsed().as_secs_f64();
        let cpu = cpu::per_message(cpu_before, cpu::sample(), n as u64);
        self.purge().await?;
        Ok((rate, cpu))
    }

    fn publisher(&self) -> Arc<RabbitPublisher> {
        Arc::new(RabbitPublisher::new(RabbitPublisherConfig::new(
            &self.amqp_url,
        )))
    }

    /// The in-process relay draining `n` pending rows with `pipelines` dispatch loops
    /// (as `dispatch.pipelines` runs them), batch 1,000.
    async fn relay(
        &mut self,
        n: i64,
        pipelines: usize,
    ) -> anyhow::Result<(f64, cpu::CpuPerMessage)> {
        let schema = self.fresh_schema("bench_relay").await?;
        self.backlog(&schema, n, None).await?;
        let measured = self.drain(&schema, n, pipelines).await?;
        self.purge().await?;
        Ok(measured)
    }

    /// The timed part of [`Bench::relay`]: `pipelines` dispatchers draining the `n`
    /// pending rows of `schema` until all are marked sent (the queue is left full).
    async fn drain(
        &self,
        schema: &PgSchema,
        n: i64,
        pipelines: usize,
    ) -> anyhow::Result<(f64, cpu::CpuPerMessage)> {
        let store = Arc::new(PgOutboxStore::new(self.pool.clone(), schema.clone()));
        let publisher = Arc::new(RabbitPublisher::new(RabbitPublisherConfig {
            connections: pipelines,
            ..RabbitPublisherConfig::new(&self.amqp_url)
        }));
        let cancel = CancellationToken::new();
        // Progress from the relay's own counters (rows marked sent): polling the
        // table instead would scan it every few milliseconds and take CPU from the
        // relay and PostgreSQL while they are measured.
        let counters = Arc::new(outbox_app::RelayCounters::default());
        let cpu_before = cpu::sample();
        let started = Instant::now();
        let tasks: Vec<_> = (0..pipelines)
            .map(|i| {
                let d = Dispatcher::new(
                    store.clone(),
                    publisher.clone(),
                    DispatcherConfig {
                        batch_size: 1000,
                        // As measured before the two dispatcher configurations
                        // became one (whose defaults are the binary's).
                        lease_ttl: Duration::from_secs(30),
                        idle_poll: Duration::from_millis(100),
                        ..DispatcherConfig::default()
                    },
                    &format!("bench-relay-{i}"),
                )
                .with_counters(counters.clone());
                tokio::spawn(d.run(cancel.clone()))
            })
            .collect();
        let marked = |c: &outbox_app::RelayCounters| {
            i64::try_from(c.published.load(std::sync::atomic::Ordering::Relaxed)).unwrap_or(0)
        };
        while marked(&counters) < n {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let rate = n as f64 / started.elapsed().as_secs_f64();
        let cpu = cpu::per_message(cpu_before, cpu::sample(), n.unsigned_abs());
        cancel.cancel();
        for t in tasks {
            t.await?;
        }
        anyhow::ensure!(
            self.count(schema, "sent").await? == n,
            "the relay's count and the table disagree"
        );
        Ok((rate, cpu))
    }

    async fn naive(&mut self, n: i64) -> anyhow::Result<f64> {
        let schema = self.fresh_schema("bench_naive").await?;
        self.backlog(&schema, n, None).await?;
        let store = PgOutboxStore::new(self.pool.clone(), schema);
        let publisher = self.publisher();
        let started = Instant::now();
        for i in 0.. {
            let lease = Lease::new(format!("naive#{i}"), Duration::from_secs(60));
            let claimed = store.claim_pending(&lease, 1).await?;
            let Some(c) = claimed.into_iter().next() else {
                break;
            };
            let outcome = publisher.publish(std::slice::from_ref(&c.message)).await;
            anyhow::ensure!(
                outcome.iter().all(|o| o.is_confirmed()),
                "naive publish failed"
            );
            store.mark_sent(&lease, &[c.message.id]).await?;
        }
        let rate = n as f64 / started.elapsed().as_secs_f64();
        self.purge().await?;
        Ok(rate)
    }

    /// Commit -> marked sent after the broker's confirm, aiming at a steady 500 msg/s
    /// (one insert every 2 ms). Returns p50, p99, max and the rate the producer
    /// actually achieved (a loaded machine falls short of 500, and the latency figures
    /// mean little without it).
    async fn latency(&mut self, for_how_long: Duration) -> anyhow::Result<Latency> {
        let schema = self.fresh_schema("bench_latency").await?;
        let store = Arc::new(PgOutboxStore::new(self.pool.clone(), schema.clone()));
        let dispatcher = Dispatcher::new(
            store,
            self.publisher(),
            DispatcherConfig {
                idle_poll: Duration::from_millis(500),
                // As measured before the two dispatcher configurations became one.
                batch_size: 100,
                lease_ttl: Duration::from_secs(30),
                ..DispatcherConfig::default()
            },
            "bench-latency",
        )
        .with_wakeup(Box::new(PgWakeupSource::new(
            self.pool.clone(),
            schema.clone(),
            "bench-latency",
        )));
        let cancel = CancellationToken::new();
        let task = tokio::spawn(dispatcher.run(cancel.clone()));
        tokio::time::sleep(Duration::from_millis(500)).await;
        let insert = format!(
            "INSERT INTO {}.outbox_messages (exchange, routing_key, payload) VALUES ($1, 'k', convert_to(repeat('x', 1024), 'UTF8'))",
            schema.quoted()
        );
        let mut tick = tokio::time::interval(Duration::from_millis(2));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let started = Instant::now();
        let until = started + for_how_long;
        let mut sent = 0_i64;
        while Instant::now() < until {
            tick.tick().await;
            sqlx::query(&insert)
                .bind(EXCHANGE)
                .execute(&self.pool)
                .await?;
            sent += 1;
        }
        let achieved_rate = sent as f64 / started.elapsed().as_secs_f64();
        while self.count(&schema, "sent").await? < sent {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        cancel.cancel();
        task.await?;
        let (p50, p99, max): (f64, f64, f64) = sqlx::query_as(&format!(
            "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY ms), percentile_cont(0.99) WITHIN GROUP (ORDER BY ms), max(ms) \
             FROM (SELECT extract(epoch FROM sent_at - created_at)::float8 * 1000 AS ms FROM {}.outbox_messages) t",
            schema.quoted()
        ))
        .fetch_one(&self.pool)
        .await?;
        self.purge().await?;
        Ok(Latency {
            p50,
            p99,
            max,
            achieved_rate,
        })
    }

    /// (first, median) of seven claims of 500 rows, in ms.
    async fn claim_times(&self, store: &PgOutboxStore) -> anyhow::Result<(f64, f64)> {
        let mut times = Vec::new();
        for i in 0..7 {
            let lease = Lease::new(format!("claim#{i}"), Duration::from_secs(60));
            let t = Instant::now();
            let claimed = store.claim_pending(&lease, 500).await?;
            times.push(t.elapsed().as_secs_f64() * 1000.0);
            let ids: Vec<_> = claimed.iter().map(|c| c.message.id).collect();
            store.release(&lease, &ids).await?;
        }
        let first = times[0];
        times.sort_by(f64::total_cmp);
        Ok((first, times[times.len() / 2]))
    }

    /// Claim time with 1,000 pending rows behind 2,000 sent ones (vacuumed), then
    /// behind `rows` more that went through the relay's own path (pending, claimed,
    /// marked sent) with autovacuum off: the pending index keeps their dead entries
    /// in front of the live rows, as after a burst on a busy table.
    async fn claim_scale(&mut self, rows: i64) -> anyhow::Result<ClaimScale> {
        let schema = self.fresh_schema("bench_claim").await?;
        let t = format!("{}.outbox_messages", schema.quoted());
        let fill = |n: i64| {
            format!(
                "INSERT INTO {t} (exchange, routing_key, payload) \
                 SELECT 'x', 'k', '\\x00'::bytea FROM generate_series(1, {n})"
            )
        };
        let store = PgOutboxStore::new(self.pool.clone(), schema.clone());
        sqlx::query(&fill(2_000)).execute(&self.pool).await?;
        send_all_pending(&store, 1_000).await?;
        sqlx::query(&fill(1_000)).execute(&self.pool).await?;
        sqlx::query(&format!("VACUUM ANALYZE {t}"))
            .execute(&self.pool)
            .await?;
        let (_, small) = self.claim_times(&store).await?;
        send_all_pending(&store, 1_000).await?;
        sqlx::query(&format!("ALTER TABLE {t} SET (autovacuum_enabled = false)"))
            .execute(&self.pool)
            .await?;
        sqlx::query(&fill(rows)).execute(&self.pool).await?;
        send_all_pending(&store, 10_000).await?;
        sqlx::query(&fill(1_000)).execute(&self.pool).await?;
        let (first, large) = self.claim_times(&store).await?;
        sqlx::query(&format!("ALTER TABLE {t} RESET (autovacuum_enabled)"))
            .execute(&self.pool)
            .await?;
        // The admin figures are for the table as the migration keeps it (autovacuum
        // on): vacuumed once the burst is over. Before that, the partial indexes
        // still hold the burst's dead entries, and every count over them pays it
        // (as the first claim does).
        sqlx::query(&format!("VACUUM ANALYZE {t}"))
            .execute(&self.pool)
            .await?;
        let admin = self.admin_times(&schema, rows).await?;
        Ok(ClaimScale {
            small,
            first,
            large,
            admin,
        })
    }

    /// The admin API's service over the table `claim_scale` left (`rows` sent
    /// through the relay's marks in the last minutes, 1,000 pending; vacuumed):
    /// median of 7 of
    /// the first page of messages (50, no filter), a page far down by cursor (the
    /// oldest end), the first page of `status = sent`, and `stats` (counts, per-minute
    /// charts over the last hour: here every sent row is in that hour).
    async fn admin_times(&self, schema: &PgSchema, rows: i64) -> anyhow::Result<AdminTimes> {
        use outbox_ports::{MessageFilter, PageCursor};
        let outbox = Arc::new(PgOutboxStore::new(self.pool.clone(), schema.clone()));
        let inbox = Arc::new(PgInboxStore::new(self.pool.clone(), schema));
        let exact = outbox_admin::AdminService::new(outbox_admin::AdminPorts {
            outbox: outbox.clone(),
            inbox: inbox.clone(),
            audit: Arc::new(outbox_adapters_postgres::PgAuditLog::new(
                self.pool.clone(),
                schema,
            )),
            outbox_store: outbox,
            inbox_store: inbox,
        });
        // As `outbox run` serves it: charts from the per-minute totals the relays and
        // consumers record (here a minute's worth, as a relay would have added).
        let log = Arc::new(outbox_adapters_postgres::PgThroughputLog::new(
            self.pool.clone(),
            schema,
        ));
        outbox_ports::ThroughputLog::add(&*log, outbox_ports::ThroughputKind::Published, 1_000)
            .await?;
        let service = exact.clone().with_throughput(log);
        let all = MessageFilter::default();
        let sent = MessageFilter {
            status: Some(outbox_core::Status::Sent),
            ..MessageFilter::default()
        };
        let deep = Some(PageCursor(u64::try_from(rows / 100).unwrap_or(1_000)));
        let mut first = Vec::new();
        let mut far = Vec::new();
        let mut by_status = Vec::new();
        let mut stats = Vec::new();
        let mut stats_exact = Vec::new();
        for _ in 0..7 {
            let t = Instant::now();
            let page = service.list_messages(&all, None, 50).await?;
            first.push(t.elapsed().as_secs_f64() * 1000.0);
            anyhow::ensure!(page.items.len() == 50, "a first page of 50");
            let t = Instant::now();
            let page = service.list_messages(&all, deep, 50).await?;
            far.push(t.elapsed().as_secs_f64() * 1000.0);
            anyhow::ensure!(page.items.len() == 50, "a deep page of 50");
            let t = Instant::now();
            let page = service.list_messages(&sent, None, 50).await?;
            by_status.push(t.elapsed().as_secs_f64() * 1000.0);
            anyhow::ensure!(page.items.len() == 50, "a page of sent messages");
            let t = Instant::now();
            service.stats().await?;
            stats.push(t.elapsed().as_secs_f64() * 1000.0);
            let t = Instant::now();
            exact.stats().await?;
            stats_exact.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (ui_overview, ui_messages) = ui_times(service).await?;
        Ok(AdminTimes {
            list_first: median(first),
            list_deep: median(far),
            list_sent: median(by_status),
            stats: median(stats),
            stats_exact: median(stats_exact),
            ui_overview,
            ui_messages,
        })
    }

    async fn publish_raw(&self, n: usize) -> anyhow::Result<Vec<Message>> {
        let msgs: Vec<Message> = (0..n)
            .map(|_| {
                NewMessage::new(EXCHANGE, "k", vec![b'x'; 1024])
                    .with_type("bench")
                    .into_message(
                        outbox_core::MessageId::from_uuid(uuid::Uuid::now_v7()),
                        time_now(),
                    )
            })
            .collect();
        let p = self.publisher();
        for chunk in msgs.chunks(1000) {
            anyhow::ensure!(
                p.publish(chunk).await.iter().all(|o| o.is_confirmed()),
                "setup publish failed"
            );
        }
        Ok(msgs)
    }

    async fn consume_raw(&mut self, n: usize) -> anyhow::Result<(f64, cpu::CpuPerMessage)> {
        self.publish_raw(n).await?;
        let ch = self.amqp.create_channel().await?;
        ch.basic_qos(200, BasicQosOptions::default()).await?;
        let mut consumer = ch
            .basic_consume(
                QUEUE.into(),
                "bench-raw".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        let cpu_before = cpu::sample();
        let started = Instant::now();
        let mut got = 0;
        while got < n {
            let d = consumer.next().await.context("consumer ended")??;
            d.acker.ack(BasicAckOptions::default()).await?;
            got += 1;
        }
        let rate = n as f64 / started.elapsed().as_secs_f64();
        let cpu = cpu::per_message(cpu_before, cpu::sample(), n as u64);
        ch.close(200, "done".into()).await?;
        Ok((rate, cpu))
    }

    /// The raw consumer, then the inbox worker, and their ratio.
    async fn consume_side_by_side(&mut self, n: usize) -> anyhow::Result<()> {
        let (raw, raw_cpu) = self.consume_raw(n).await?;
        self.record("consume_raw", raw, "msg/s");
        self.record_cpu("consume_raw", raw_cpu);
        let defaults = ConsumerConfig::new("bench", QUEUE).inbox_batch;
        let (inbox, inbox_cpu) = self.consume_inbox(n, defaults).await?;
        self.record("consume_inbox", inbox, "msg/s");
        self.record_cpu("consume_inbox", inbox_cpu);
        self.record("consume_inbox/consume_raw", inbox / raw, "ratio");
        // The same worker with a transaction per delivery, what batching buys.
        let (single, single_cpu) = self.consume_inbox(n, 1).await?;
        self.record("consume_inbox_unbatched", single, "msg/s");
        self.record_cpu("consume_inbox_unbatched", single_cpu);
        self.record(
            "consume_inbox/consume_inbox_unbatched",
            inbox / single,
            "ratio",
        );
        Ok(())
    }

    async fn consume_inbox(
        &mut self,
        n: usize,
        inbox_batch: usize,
    ) -> anyhow::Result<(f64, cpu::CpuPerMessage)> {
        let schema = self.fresh_schema("bench_consume").await?;
        self.publish_raw(n).await?;
        let inbox = PgInboxStore::new(self.pool.clone(), &schema);
        let worker = PgConsumerWorker::new(
            inbox.clone(),
            Arc::new(RabbitSubscriber::new(&self.amqp_url)),
            PgHandlerRegistry::new().fallback(Arc::new(Noop)),
            Arc::new(SystemClock),
            ConsumerConfig {
                prefetch: 200,
                concurrency: 16,
                inbox_batch,
                ..ConsumerConfig::new("bench", QUEUE)
            },
        );
        let cancel = CancellationToken::new();
        // Progress from the worker's own counter: polling the inbox's totals would
        // scan the growing table every few milliseconds while it is measured.
        let counters = worker.counters();
        let cpu_before = cpu::sample();
        let started = Instant::now();
        let task = tokio::spawn(worker.run(cancel.clone()));
        while (counters.consumed.load(std::sync::atomic::Ordering::Relaxed) as usize) < n {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let rate = n as f64 / started.elapsed().as_secs_f64();
        let cpu = cpu::per_message(cpu_before, cpu::sample(), n as u64);
        cancel.cancel();
        task.await?;
        anyhow::ensure!(
            inbox.stats("bench").await?.consumed as usize == n,
            "the worker's count and the inbox disagree"
        );
        Ok((rate, cpu))
    }

    /// Peak RSS of the real relay binary draining a backlog.
    async fn relay_rss(&mut self, relay_bin: &str, n: i64) -> anyhow::Result<f64> {
        let schema = self.fresh_schema("bench_memory").await?;
        self.backlog(&schema, n, None).await?;
        let dir = std::env::temp_dir().join("outbox-bench");
        std::fs::create_dir_all(&dir)?;
        let cfg = dir.join("relay.toml");
        std::fs::write(
            &cfg,
            format!(
                "[adapters]\nstore = \"postgres\"\npublisher = \"rabbitmq\"\nlock = \"memory\"\nsweep_state = \"memory\"\n\
                 [postgres]\nurl = \"{}\"\nschema = \"{}\"\n[rabbitmq]\nurl = \"{}\"\n[dispatch]\nbatch_size = 1000\n[http]\nenabled = false\n",
                self.pg_url, schema, self.amqp_url
            ),
        )?;
        let mut child = tokio::process::Command::new(relay_bin)
            .args(["run", "--config"])
            .arg(&cfg)
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| {
                format!("starting {relay_bin} (build it with cargo build --release -p outbox-cli)")
            })?;
        let pid = child.id().context("relay pid")?;
        let mut peak_kib = 0_u64;
        while self.count(&schema, "sent").await? < n {
            if let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
                if let Some(kib) = status
                    .lines()
                    .find_map(|l| l.strip_prefix("VmHWM:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                {
                    peak_kib = peak_kib.max(kib);
                }
            }
            // Drain the queue meanwhile, so the broker's own memory does not decide.
            self.purge().await?;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let _ = tokio::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .await;
        let _ = child.wait().await;
        self.purge().await?;
        Ok(peak_kib as f64 / 1024.0)
    }

    /// Rows/s of 16 tasks committing a business row plus a message per transaction.
    async fn enqueue_rate(
        &self,
        schema: &PgSchema,
        plain: bool,
        for_how_long: Duration,
    ) -> anyhow::Result<f64> {
        let outbox = PgOutbox::new(schema.clone());
        let business = format!(
            "INSERT INTO {}.business (note) VALUES ('order')",
            schema.quoted()
        );
        let plain_insert = format!(
            "INSERT INTO {}.plain_messages (id, exchange, routing_key, message_type, headers, payload, content_type, source, correlation_id, created_at) \
             VALUES ($1, $2, $3, $4, '{{}}'::jsonb, $5, $6, NULL, NULL, $7)",
            schema.quoted()
        );
        let until = Instant::now() + for_how_long;
        let mut tasks = Vec::new();
        for _ in 0..16 {
            let (pool, outbox, business, plain_insert) = (
                self.pool.clone(),
                outbox.clone(),
                business.clone(),
                plain_insert.clone(),
            );
            tasks.push(tokio::spawn(async move {
                let mut n = 0_u64;
                while Instant::now() < until {
                    let mut tx = pool.begin().await?;
                    sqlx::query(&business).execute(&mut *tx).await?;
                    let m = NewMessage::new(EXCHANGE, "order.created", vec![b'x'; 1024])
                        .with_type("order.created");
                    if plain {
                        let m = m.into_message(
                            outbox_core::MessageId::from_uuid(uuid::Uuid::now_v7()),
                            time_now(),
                        );
                        sqlx::query(&plain_insert)
                            .bind(m.id.as_uuid())
                            .bind(&m.exchange)
                            .bind(&m.routing_key)
                            .bind(&m.message_type)
                            .bind(&m.payload)
                            .bind(&m.content_type)
                            .bind(m.created_at)
                            .execute(&mut *tx)
                            .await?;
                    } else {
                        outbox.enqueue(&mut tx, m).await?;
                    }
                    tx.commit().await?;
                    n += 1;
                }
                anyhow::Ok(n)
            }));
        }
        let mut total = 0;
        for t in tasks {
            total += t.await??;
        }
        Ok(total as f64 / for_how_long.as_secs_f64())
    }

    async fn enqueue(&mut self, for_how_long: Duration) -> anyhow::Result<(f64, f64)> {
        let schema = self.fresh_schema("bench_enqueue").await?;
        let s = schema.quoted();
        sqlx::query(&format!("CREATE TABLE {s}.business (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, note text)"))
            .execute(&self.pool)
            .await?;
        // The same message columns, without our trigger, partial indexes or defaults.
        sqlx::query(&format!(
            "CREATE TABLE {s}.plain_messages (seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, id uuid NOT NULL UNIQUE, \
             exchange text NOT NULL, routing_key text NOT NULL, message_type text, headers jsonb NOT NULL, payload bytea NOT NULL, \
             content_type text NOT NULL, source text, correlation_id text, created_at timestamptz NOT NULL)"
        ))
        .execute(&self.pool)
        .await?;
        let (mut plain, mut ours) = (Vec::new(), Vec::new());
        for _ in 0..2 {
            plain.push(self.enqueue_rate(&schema, true, for_how_long).await?);
            ours.push(self.enqueue_rate(&schema, false, for_how_long).await?);
        }
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        Ok((mean(&plain), mean(&ours)))
    }
}

struct Noop;

#[async_trait::async_trait]
impl PgHandler for Noop {
    async fn handle(&self, _conn: &mut PgConnection, _m: &Message) -> Result<(), HandlerError> {
        Ok(())
    }
}

/// Commit-to-sent latency and the producer rate it was measured at.
struct Latency {
    p50: f64,
    p99: f64,
    max: f64,
    achieved_rate: f64,
}

/// Claim times in ms: median with few sent rows; first and median after a million
/// went through the relay's marks.
struct ClaimScale {
    small: f64,
    first: f64,
    large: f64,
    admin: AdminTimes,
}

/// Medians in ms of the admin service's reads over a million-row table.
struct AdminTimes {
    list_first: f64,
    list_deep: f64,
    list_sent: f64,
    stats: f64,
    /// `stats` counting the per-minute charts from the table's rows instead.
    stats_exact: f64,
    /// The dashboard's overview page, over HTTP on loopback.
    ui_overview: f64,
    /// The dashboard's messages page filtered by `status=sent`, over HTTP.
    ui_messages: f64,
}

/// One HTTP/1.1 GET on a fresh loopback connection: (status, head, body).
fn http_get(
    address: std::net::SocketAddr,
    path: &str,
    cookie: Option<&str>,
) -> anyhow::Result<(u16, String, String)> {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(address)?;
    let cookie = cookie.map_or(String::new(), |c| format!("Cookie: {c}\r\n"));
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\n{cookie}Connection: close\r\n\r\n"
    )?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Ok((status, head.to_owned(), body.to_owned()))
}

/// The dashboard over `service`, served on loopback as `outbox run` serves it:
/// median of 7 of the overview and of the messages page filtered to `sent`, each
/// a whole HTTP request (session check, service calls, rendering).
async fn ui_times(service: outbox_admin::AdminService) -> anyhow::Result<(f64, f64)> {
    let secret = outbox_admin::random_secret(16)?;
    let options = outbox_admin::UiOptions {
        one_time_login: Some(outbox_admin::OneTimeLogin {
            secret: outbox_admin::Secret::new(secret.clone()),
            name: "bench".into(),
            role: outbox_admin::Role::Read,
        }),
        ..outbox_admin::UiOptions::default()
    };
    let app = axum::Router::new().nest(
        "/ui",
        outbox_admin::ui_router(service, outbox_admin::AdminAuth::default(), options),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let times = tokio::task::spawn_blocking(move || -> anyhow::Result<(f64, f64)> {
        let (status, head, _) = http_get(address, &format!("/ui/login?token={secret}"), None)?;
        anyhow::ensure!(status == 303, "dashboard login: {head}");
        let cookie = head
            .lines()
            .find_map(|l| l.strip_prefix("set-cookie: outbox_session="))
            .and_then(|v| v.split(';').next())
            .context("no session cookie")?;
        let cookie = format!("outbox_session={cookie}");
        let time = |path: &str, expect: &str| -> anyhow::Result<f64> {
            let mut ms = Vec::new();
            for _ in 0..7 {
                let t = Instant::now();
                let (status, _, body) = http_get(address, path, Some(&cookie))?;
                ms.push(t.elapsed().as_secs_f64() * 1000.0);
                anyhow::ensure!(status == 200 && body.contains(expect), "{path}: {status}");
            }
            ms.sort_by(f64::total_cmp);
            Ok(ms[ms.len() / 2])
        };
        Ok((
            time("/ui", "id=\"count-pending\"")?,
            time("/ui/messages?status=sent", "data-status=\"sent\"")?,
        ))
    })
    .await??;
    server.abort();
    Ok(times)
}

fn time_now() -> outbox_core::Timestamp {
    outbox_core::Timestamp::now_utc()
}

const USAGE: &str = "usage: outbox-bench [--quick] [--relay-only | --consume-only | --claim-only | --delayed-only | --enqueue-only] [--out PATH] [--relay-bin PATH]

  --quick         smaller sizes (CI smoke); the default is the full bench
  --relay-only    raw confirms, the relay (1 and 2 pipelines, and with ordering keys), raw confirms again
  --consume-only  a raw consumer, then the transactional inbox worker
  --claim-only    claim times (also beside 1,000,000 delayed rows) and the admin service's reads over 1,000,000 rows
  --delayed-only  how late delayed messages are published, then what --claim-only runs
  --enqueue-only  producer commits through PgOutbox::enqueue against plain INSERTs
  --out PATH      where summary.json goes (default target/bench/summary.json)
  --relay-bin PATH  the outbox binary for the RSS phase (default target/release/outbox)
  -h, --help      this text

URLs from OUTBOX_TEST_DATABASE_URL and OUTBOX_TEST_AMQP_URL, else the local servers.";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Only {
    Relay,
    Consume,
    Claim,
    Delayed,
    Enqueue,
}

#[derive(Debug, PartialEq, Eq)]
struct Args {
    quick: bool,
    only: Option<Only>,
    out: String,
    relay_bin: String,
}

impl Args {
    /// The command line; `Ok(None)` for `--help`. Unknown arguments, a flag without
    /// its value and two phase selections are refused.
    fn parse(args: impl IntoIterator<Item = String>) -> Result<Option<Self>, String> {
        let mut parsed = Self {
            quick: false,
            only: None,
            out: "target/bench/summary.json".to_owned(),
            relay_bin: "target/release/outbox".to_owned(),
        };
        let mut args = args.into_iter();
        while let Some(a) = args.next() {
            let only = match a.as_str() {
                "-h" | "--help" => return Ok(None),
                "--quick" => {
                    parsed.quick = true;
                    continue;
                }
                "--out" | "--relay-bin" => {
                    let value = args.next().ok_or_else(|| format!("{a} needs a value"))?;
                    if a == "--out" {
                        parsed.out = value;
                    } else {
                        parsed.relay_bin = value;
                    }
                    continue;
                }
                "--relay-only" => Only::Relay,
                "--consume-only" => Only::Consume,
                "--claim-only" => Only::Claim,
                "--delayed-only" => Only::Delayed,
                "--enqueue-only" => Only::Enqueue,
                other => return Err(format!("unknown argument {other:?}")),
            };
            if parsed.only.replace(only).is_some() {
                return Err(
                    "choose at most one of --relay-only, --consume-only, --claim-only, --delayed-only, --enqueue-only".to_owned(),
                );
            }
        }
        Ok(Some(parsed))
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args = match Args::parse(std::env::args().skip(1)) {
        Ok(Some(args)) => args,
        Ok(None) => {
            println!("{USAGE}");
            return Ok(());
        }
        Err(e) => {
            eprintln!("outbox-bench: {e}\n\n{USAGE}");
            std::process::exit(2);
        }
    };
    let Args {
        quick,
        only,
        out,
        relay_bin,
    } = args;
    let sizes = if quick {
        Sizes {
            backlog: 20_000,
            naive: 500,
            latency: Duration::from_secs(10),
            delayed: 2_000,
            delayed_over: Duration::from_secs(10),
            claim_rows: 200_000,
            consume: 5_000,
            memory_backlog: 200_000,
            enqueue_for: Duration::from_secs(3),
        }
    } else {
        Sizes {
            backlog: 100_000,
            naive: 2_000,
            latency: Duration::from_secs(30),
            delayed: 2_000,
            delayed_over: Duration::from_secs(20),
            claim_rows: 1_000_000,
            consume: 20_000,
            memory_backlog: 1_000_000,
            enqueue_for: Duration::from_secs(10),
        }
    };
    let var = |k: &str, d: &str| std::env::var(k).unwrap_or_else(|_| d.to_owned());
    let pg_url = var(
        "OUTBOX_TEST_DATABASE_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    );
    let amqp_url = var(
        "OUTBOX_TEST_AMQP_URL",
        "amqp://guest:guest@127.0.0.1:5672/%2f",
    );
    let pool = outbox_adapters_postgres::connect(&pg_url, 20, Duration::from_secs(10)).await?;
    let amqp = outbox_adapters_rabbitmq::connect(&amqp_url, Duration::from_secs(10)).await?;
    Topology {
        exchanges: vec![ExchangeSpec {
            name: EXCHANGE.into(),
            kind: ExchangeKind::Direct,
            durable: true,
        }],
        queues: vec![QueueSpec::durable(QUEUE)],
        bindings: vec![BindingSpec {
            queue: QUEUE.into(),
            exchange: EXCHANGE.into(),
            routing_key: "k".into(),
        }],
    }
    .declare(&amqp)
    .await?;
    let mut b = Bench {
        pg_url,
        amqp_url,
        pool,
        amqp,
        results: Vec::new(),
    };
    b.purge().await?;
    println!(
        "outbox bench ({}), 1 KiB persistent messages with confirms",
        if quick { "quick" } else { "full" }
    );

    if only == Some(Only::Consume) {
        b.consume_side_by_side(sizes.consume).await?;
        return write_summary(&b, quick, &out);
    }
    if only == Some(Only::Enqueue) {
        record_enqueue(&mut b, &sizes).await?;
        let _ = sqlx::query("DROP SCHEMA IF EXISTS bench_enqueue CASCADE")
            .execute(&b.pool)
            .await;
        return write_summary(&b, quick, &out);
    }
    if only == Some(Only::Delayed) {
        record_delayed_lateness(&mut b, &sizes).await?;
    }
    if matches!(only, Some(Only::Claim | Only::Delayed)) {
        record_claim_scale(&mut b, sizes.claim_rows).await?;
        for s in ["bench_claim", "bench_delayed_claim"] {
            let _ = sqlx::query(&format!("DROP SCHEMA IF EXISTS {s} CASCADE"))
                .execute(&b.pool)
                .await;
        }
        return write_summary(&b, quick, &out);
    }
    let (raw, raw_cpu) = b.raw_confirm(usize::try_from(sizes.backlog)?).await?;
    b.record("raw_confirm", raw, "msg/s");
    b.record_cpu("raw_confirm", raw_cpu);
    let (relay, relay_cpu) = b.relay(sizes.backlog, 1).await?;
    b.record("relay", relay, "msg/s");
    b.record_cpu("relay", relay_cpu);
    b.record("relay/raw_confirm", relay / raw, "ratio");
    let (ordered, ordered_cpu) = b.relay_ordered(sizes.backlog, ORDERING_KEYS).await?;
    b.record("relay_ordered", ordered, "msg/s");
    b.record_cpu("relay_ordered", ordered_cpu);
    b.record("relay_ordered/relay", ordered / relay, "ratio");
    let (relay_2p, _) = b.relay(sizes.backlog, 2).await?;
    b.record("relay_2p", relay_2p, "msg/s");
    b.record("relay_2p/raw_confirm", relay_2p / raw, "ratio");
    if only == Some(Only::Relay) {
        let (raw_after, _) = b.raw_confirm(usize::try_from(sizes.backlog)?).await?;
        b.record("raw_confirm_after", raw_after, "msg/s");
        return write_summary(&b, quick, &out);
    }
    let naive = b.naive(sizes.naive).await?;
    b.record("naive", naive, "msg/s");
    b.record("relay/naive", relay / naive, "ratio");
    let l = b.latency(sizes.latency).await?;
    b.record("latency_rate_achieved", l.achieved_rate, "msg/s");
    b.record("latency_p50_ms", l.p50, "ms");
    b.record("latency_p99_ms", l.p99, "ms");
    b.record("latency_max_ms", l.max, "ms");
    record_delayed_lateness(&mut b, &sizes).await?;
    record_claim_scale(&mut b, sizes.claim_rows).await?;
    b.consume_side_by_side(sizes.consume).await?;
    let rss = b.relay_rss(&relay_bin, sizes.memory_backlog).await?;
    b.record("relay_rss_peak_mib", rss, "MiB");
    record_enqueue(&mut b, &sizes).await?;

    for s in [
        "bench_relay",
        "bench_ordered",
        "bench_naive",
        "bench_latency",
        "bench_delayed_lateness",
        "bench_claim",
        "bench_delayed_claim",
        "bench_consume",
        "bench_memory",
        "bench_enqueue",
    ] {
        let _ = sqlx::query(&format!("DROP SCHEMA IF EXISTS {s} CASCADE"))
            .execute(&b.pool)
            .await;
    }
    write_summary(&b, quick, &out)
}

/// Producer commits through `PgOutbox::enqueue` against plain INSERTs, alternating.
async fn record_enqueue(b: &mut Bench, sizes: &Sizes) -> anyhow::Result<()> {
    let (plain, ours) = b.enqueue(sizes.enqueue_for).await?;
    b.record("enqueue_plain", plain, "rows/s");
    b.record("enqueue", ours, "rows/s");
    b.record("enqueue/enqueue_plain", ours / plain, "ratio");
    Ok(())
}

/// How late delayed messages are published after their due time.
async fn record_delayed_lateness(b: &mut Bench, sizes: &Sizes) -> anyhow::Result<()> {
    let d = b
        .delayed_lateness(sizes.delayed, sizes.delayed_over)
        .await?;
    b.record("delayed_lateness_p50_ms", d.p50, "ms");
    b.record("delayed_lateness_p99_ms", d.p99, "ms");
    b.record("delayed_lateness_max_ms", d.max, "ms");
    let _ = sqlx::query("DROP SCHEMA IF EXISTS bench_delayed_lateness CASCADE")
        .execute(&b.pool)
        .await;
    Ok(())
}

/// Claim times with few and many sent rows and beside many delayed ones, then the
/// admin service's reads on the million-row table.
async fn record_claim_scale(b: &mut Bench, rows: i64) -> anyhow::Result<()> {
    let c = b.claim_scale(rows).await?;
    b.record("claim_1k_ms", c.small, "ms");
    b.record("claim_1m_first_ms", c.first, "ms");
    b.record("claim_1m_ms", c.large, "ms");
    b.record("claim_1m/claim_1k", c.large / c.small, "ratio");
    let delayed = b.delayed_claim(rows).await?;
    b.record("delayed_claim_ms", delayed, "ms");
    b.record("delayed_claim/claim_1k", delayed / c.small, "ratio");
    b.record("admin_list_first_ms", c.admin.list_first, "ms");
    b.record("admin_list_deep_ms", c.admin.list_deep, "ms");
    b.record("admin_list_sent_ms", c.admin.list_sent, "ms");
    b.record("admin_stats_ms", c.admin.stats, "ms");
    b.record("admin_stats_exact_charts_ms", c.admin.stats_exact, "ms");
    b.record("ui_overview_ms", c.admin.ui_overview, "ms");
    b.record("ui_messages_ms", c.admin.ui_messages, "ms");
    Ok(())
}

fn write_summary(b: &Bench, quick: bool, out: &str) -> anyhow::Result<()> {
    let cores = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    let summary = serde_json::json!({
        "cores": cores,
        "quick": quick,
        "results": b.results.iter().map(|(n, v, u)| serde_json::json!({"name": n, "value": v, "unit": u})).collect::<Vec<_>>(),
    });
    if let Some(dir) = std::path::Path::new(out).parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(out, serde_json::to_string_pretty(&summary)?)?;
    println!("written {out}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(a: &[&str]) -> Result<Option<Args>, String> {
        Args::parse(a.iter().map(|s| (*s).to_owned()))
    }

    #[test]
    fn help_and_unknown_arguments_never_start_a_run() {
        assert_eq!(parse(&["--help"]), Ok(None));
        assert_eq!(parse(&["--quick", "-h"]), Ok(None));
        assert!(parse(&["--bogus"]).is_err());
        assert!(parse(&["quick"]).is_err());
        assert!(parse(&["--out"]).is_err());
        assert!(parse(&["--relay-only", "--claim-only"]).is_err());
        assert!(parse(&["--delayed-only", "--claim-only"]).is_err());
        assert!(parse(&["--enqueue-only", "--relay-only"]).is_err());
        assert_eq!(
            parse(&["--enqueue-only"]).map(|a| a.map(|a| a.only)),
            Ok(Some(Some(Only::Enqueue)))
        );
    }

    #[test]
    fn flags_are_read() {
        let a = parse(&["--quick", "--claim-only", "--out", "x.json"])
            .expect("valid")
            .expect("a run");
        assert!(a.quick);
        assert_eq!(a.only, Some(Only::Claim));
        assert_eq!(a.out, "x.json");
        assert_eq!(a.relay_bin, "target/release/outbox");
        assert_eq!(parse(&[]).expect("valid").expect("a run").only, None);
        assert_eq!(
            parse(&["--delayed-only"])
                .expect("valid")
                .expect("a run")
                .only,
            Some(Only::Delayed)
        );
    }
}
