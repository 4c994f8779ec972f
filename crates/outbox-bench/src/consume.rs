//! `consume_*`: a raw RabbitMQ consumer acknowledging each delivery, then the
//! transactional inbox worker over the same messages: batched with a no-op handler,
//! batched with a handler that inserts a row of its own, and with a transaction a
//! delivery.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::StreamExt as _;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use outbox_adapters_postgres::{PgConnection, PgInboxStore, PgSchema};
use outbox_adapters_rabbitmq::RabbitSubscriber;
use outbox_consumer::{
    CancellationToken, ConsumerConfig, HandlerError, PgConsumerWorker, PgHandler, PgHandlerRegistry,
};
use outbox_core::{Message, NewMessage};
use outbox_ports::SystemClock;
use outbox_ports::prelude::*;

use crate::bench::{Bench, EXCHANGE, QUEUE, time_now};
use crate::cpu;

impl Bench {
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
    pub(crate) async fn consume_side_by_side(&mut self, n: usize) -> anyhow::Result<()> {
        let (raw, raw_cpu) = self.consume_raw(n).await?;
        self.record("consume_raw", raw, "msg/s");
        self.record_cpu("consume_raw", raw_cpu);
        let defaults = Shape::default();
        let (inbox, inbox_cpu) = self.consume_inbox(n, defaults, Effect::None).await?;
        self.record("consume_inbox", inbox, "msg/s");
        self.record_cpu("consume_inbox", inbox_cpu);
        self.record("consume_inbox/consume_raw", inbox / raw, "ratio");
        // What most handlers do: one row of their own, in the inbox's transaction.
        let (write, write_cpu) = self.consume_inbox(n, defaults, Effect::InsertRow).await?;
        self.record("consume_inbox_write", write, "msg/s");
        self.record_cpu("consume_inbox_write", write_cpu);
        self.record("consume_inbox_write/consume_raw", write / raw, "ratio");
        // The defaults before 2026-12-05 (16 in hand, batches of up to 4): what
        // batches that follow the load buy.
        let before = Shape {
            concurrency: Some(16),
            inbox_batch: Some(4),
        };
        let (small, small_cpu) = self.consume_inbox(n, before, Effect::None).await?;
        self.record("consume_inbox_16x4", small, "msg/s");
        self.record_cpu("consume_inbox_16x4", small_cpu);
        self.record("consume_inbox/consume_inbox_16x4", inbox / small, "ratio");
        // The same worker with a transaction per delivery, what batching buys.
        let single = Shape {
            inbox_batch: Some(1),
            ..defaults
        };
        let (single, single_cpu) = self.consume_inbox(n, single, Effect::None).await?;
        self.record("consume_inbox_unbatched", single, "msg/s");
        self.record_cpu("consume_inbox_unbatched", single_cpu);
        self.record(
            "consume_inbox/consume_inbox_unbatched",
            inbox / single,
            "ratio",
        );
        // The raw consumer again: whether the machine's speed moved meanwhile (the
        // ratios above are against the first).
        let (raw_after, _) = self.consume_raw(n).await?;
        self.record("consume_raw_after", raw_after, "msg/s");
        Ok(())
    }

    async fn consume_inbox(
        &mut self,
        n: usize,
        shape: Shape,
        effect: Effect,
    ) -> anyhow::Result<(f64, cpu::CpuPerMessage)> {
        let schema = self.fresh_schema("bench_consume").await?;
        self.publish_raw(n).await?;
        let (worker, inbox) = self.bench_worker(&schema, shape, effect).await?;
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

    /// The inbox worker on `schema` over the bench's queue, in `shape`, its handler
    /// doing `effect`.
    pub(crate) async fn bench_worker(
        &self,
        schema: &PgSchema,
        shape: Shape,
        effect: Effect,
    ) -> anyhow::Result<(PgConsumerWorker, PgInboxStore)> {
        let handler: Arc<dyn PgHandler> = match effect {
            Effect::None => Arc::new(Noop),
            Effect::InsertRow => {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "CREATE TABLE IF NOT EXISTS {}.bench_effects (message_id uuid PRIMARY KEY, routing_key text NOT NULL, \
                     bytes integer NOT NULL, at timestamptz NOT NULL DEFAULT now())",
                    schema.quoted()
                )))
                .execute(&self.pool)
                .await?;
                Arc::new(InsertRow {
                    sql: format!(
                        "INSERT INTO {}.bench_effects (message_id, routing_key, bytes) VALUES ($1, $2, $3)",
                        schema.quoted()
                    ),
                })
            }
        };
        let inbox = PgInboxStore::new(self.pool.clone(), schema);
        let defaults = ConsumerConfig::new("bench", QUEUE);
        let worker = PgConsumerWorker::new(
            inbox.clone(),
            Arc::new(RabbitSubscriber::new(&self.amqp_url)),
            PgHandlerRegistry::new().fallback(handler),
            Arc::new(SystemClock),
            ConsumerConfig {
                prefetch: 200,
                inbox_batch: shape.inbox_batch.unwrap_or(defaults.inbox_batch),
                concurrency: shape.concurrency.unwrap_or(defaults.concurrency),
                ..defaults
            },
        );
        Ok((worker, inbox))
    }
}

/// The worker's deliveries in hand and batch size; `None`: the default.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Shape {
    pub(crate) concurrency: Option<usize>,
    pub(crate) inbox_batch: Option<usize>,
}

/// What the measured handler writes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Effect {
    /// Nothing: the inbox's own cost.
    None,
    /// One row of its own a message ([`InsertRow`]).
    InsertRow,
}

struct Noop;

#[async_trait::async_trait]
impl PgHandler for Noop {
    async fn handle(&self, _conn: &mut PgConnection, _m: &Message) -> Result<(), HandlerError> {
        Ok(())
    }
}

/// A handler's typical effect: one row a message in a table of its own, in the
/// inbox's transaction.
struct InsertRow {
    sql: String,
}

#[async_trait::async_trait]
impl PgHandler for InsertRow {
    async fn handle(&self, conn: &mut PgConnection, m: &Message) -> Result<(), HandlerError> {
        sqlx::query(sqlx::AssertSqlSafe(&*self.sql))
            .bind(m.id.as_uuid())
            .bind(&m.routing_key)
            .bind(i32::try_from(m.payload.len()).unwrap_or(i32::MAX))
            .execute(conn)
            .await?;
        Ok(())
    }
}
