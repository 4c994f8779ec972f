//! `relay` and `relay_2p`: the in-process relay draining a backlog of pending rows
//! with one or two dispatch loops until every row is marked sent.

use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_adapters_postgres::{PgOutboxStore, PgSchema};
use outbox_adapters_rabbitmq::{RabbitPublisher, RabbitPublisherConfig};
use outbox_relay::{CancellationToken, Dispatcher, DispatcherConfig};

use crate::bench::Bench;
use crate::cpu;

impl Bench {
    /// The in-process relay draining `n` pending rows with `pipelines` dispatch loops
    /// (as `dispatch.pipelines` runs them), batch 1,000.
    pub(crate) async fn relay(
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
    pub(crate) async fn drain(
        &self,
        schema: &PgSchema,
        n: i64,
        pipelines: usize,
    ) -> anyhow::Result<(f64, cpu::CpuPerMessage)> {
        let publisher = RabbitPublisher::new(RabbitPublisherConfig {
            connections: pipelines,
            ..RabbitPublisherConfig::new(&self.amqp_url)
        });
        self.drain_with(publisher, schema, n, pipelines).await
    }

    /// [`Bench::drain`] through `publisher` (one connection a pipeline).
    pub(crate) async fn drain_with(
        &self,
        publisher: RabbitPublisher,
        schema: &PgSchema,
        n: i64,
        pipelines: usize,
    ) -> anyhow::Result<(f64, cpu::CpuPerMessage)> {
        let store = Arc::new(PgOutboxStore::new(self.pool.clone(), schema.clone()));
        let publisher = Arc::new(publisher);
        let cancel = CancellationToken::new();
        // Progress from the relay's own counters (rows marked sent): polling the
        // table instead would scan it every few milliseconds and take CPU from the
        // relay and PostgreSQL while they are measured.
        let counters = Arc::new(outbox_relay::RelayCounters::default());
        let cpu_before = cpu::sample();
        let started = Instant::now();
        let tasks: Vec<_> = (0..pipelines)
            .map(|i| {
                let d = Dispatcher::new(
                    store.clone(),
                    publisher.clone(),
                    DispatcherConfig {
                        batch_size: crate::bench::RELAY_BATCH,
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
        let marked = |c: &outbox_relay::RelayCounters| {
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
}
