//! The bench's harness: the connections to PostgreSQL and RabbitMQ and the figures
//! so far, the exchange and queue every phase uses, the sizes of a run, and what
//! the phases share (a fresh schema, a backlog of pending rows, counts by status,
//! a purge of the queue, a publisher).

use std::sync::Arc;
use std::time::Duration;

use lapin::options::QueuePurgeOptions;
use outbox_adapters_postgres::{PgPool, PgSchema, migrate};
use outbox_adapters_rabbitmq::{RabbitPublisher, RabbitPublisherConfig};

pub(crate) const EXCHANGE: &str = "outbox-bench.x";
pub(crate) const QUEUE: &str = "outbox-bench.q";
/// The relay's batch in the relay phases, and `raw_confirm_batched`'s.
pub(crate) const RELAY_BATCH: u32 = 1000;

pub(crate) struct Sizes {
    pub(crate) backlog: i64,
    pub(crate) naive: i64,
    pub(crate) latency: Duration,
    /// Delayed messages for the lateness phase, and the time they are enqueued over.
    pub(crate) delayed: usize,
    pub(crate) delayed_over: Duration,
    pub(crate) claim_rows: i64,
    pub(crate) consume: usize,
    /// How long the consume latency phase publishes at 200/s.
    pub(crate) consume_latency: Duration,
    pub(crate) memory_backlog: i64,
    pub(crate) enqueue_for: Duration,
}

pub(crate) struct Bench {
    pub(crate) pg_url: String,
    pub(crate) amqp_url: String,
    pub(crate) pool: PgPool,
    pub(crate) amqp: lapin::Connection,
    pub(crate) results: Vec<(String, f64, &'static str)>,
}

impl Bench {
    pub(crate) async fn fresh_schema(&self, name: &str) -> anyhow::Result<PgSchema> {
        let schema = PgSchema::new(name)?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP SCHEMA IF EXISTS {} CASCADE",
            schema.quoted()
        )))
        .execute(&self.pool)
        .await?;
        migrate(&self.pool, &schema).await?;
        Ok(schema)
    }

    pub(crate) async fn purge(&self) -> anyhow::Result<()> {
        let ch = self.amqp.create_channel().await?;
        ch.queue_purge(QUEUE.into(), QueuePurgeOptions::default())
            .await?;
        Ok(())
    }

    /// `n` pending 1 KiB messages, by SQL, then VACUUM ANALYZE. With `keys`, row
    /// `i` (in `seq` order) has ordering key `key-{i % keys}`: round-robin, so each
    /// key's messages are interleaved with every other key's.
    pub(crate) async fn backlog(
        &self,
        schema: &PgSchema,
        n: i64,
        keys: Option<i64>,
    ) -> anyhow::Result<()> {
        self.backlog_for(EXCHANGE, schema, n, keys).await
    }

    /// [`Bench::backlog`] for `exchange`.
    pub(crate) async fn backlog_for(
        &self,
        exchange: &str,
        schema: &PgSchema,
        n: i64,
        keys: Option<i64>,
    ) -> anyhow::Result<()> {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {}.outbox_messages (exchange, routing_key, payload, ordering_key) \
             SELECT $1, 'k', convert_to(repeat('x', 1024), 'UTF8'), 'key-' || (g % $3) \
             FROM generate_series(0, $2 - 1) AS g ORDER BY g",
            schema.quoted()
        )))
        .bind(exchange)
        .bind(n)
        .bind(keys)
        .execute(&self.pool)
        .await?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "VACUUM ANALYZE {}.outbox_messages",
            schema.quoted()
        )))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub(crate) async fn count(&self, schema: &PgSchema, status: &str) -> anyhow::Result<i64> {
        Ok(sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM {}.outbox_messages WHERE status = $1",
            schema.quoted()
        )))
        .bind(status)
        .fetch_one(&self.pool)
        .await?)
    }

    /// Messages ready in `queue` (a passive declare).
    pub(crate) async fn depth(&self, queue: &str) -> anyhow::Result<u32> {
        Ok(self
            .amqp
            .create_channel()
            .await?
            .queue_declare(
                queue.into(),
                lapin::options::QueueDeclareOptions {
                    passive: true,
                    ..lapin::options::QueueDeclareOptions::default()
                },
                lapin::types::FieldTable::default(),
            )
            .await?
            .message_count())
    }

    pub(crate) fn publisher(&self) -> Arc<RabbitPublisher> {
        Arc::new(RabbitPublisher::new(RabbitPublisherConfig::new(
            &self.amqp_url,
        )))
    }
}

pub(crate) fn time_now() -> outbox_core::Timestamp {
    outbox_core::Timestamp::now_utc()
}
