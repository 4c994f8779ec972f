//! A small shop on `outbox`: an order service that writes an order and enqueues
//! `order.created` in one transaction, and a billing consumer that records one
//! invoice per order, exactly once, in the inbox's transaction.
//!
//! Settings come from the environment (defaults: the local services):
//! `SHOP_DATABASE_URL`, `SHOP_AMQP_URL`, `SHOP_SCHEMA` (business tables, default
//! `shop`), `OUTBOX_SCHEMA` (default `outbox`), `BILLING_QUEUE` (default
//! `billing.orders`), `SHOP_EXCHANGE` (default `shop.orders`).

use std::time::Duration;

use outbox_adapters_postgres::{PgPool, PgSchema};
use outbox_adapters_rabbitmq::{BindingSpec, ExchangeKind, ExchangeSpec, QueueSpec, Topology};

pub mod billing;
pub mod orders;

/// Settings of both programs.
#[derive(Debug, Clone)]
pub struct Shop {
    /// PostgreSQL URL.
    pub database_url: String,
    /// RabbitMQ URL.
    pub amqp_url: String,
    /// Schema of the business tables.
    pub schema: PgSchema,
    /// Schema of the outbox and inbox tables.
    pub outbox_schema: PgSchema,
    /// The billing consumer's queue.
    pub queue: String,
    /// The exchange orders are published to.
    pub exchange: String,
}

impl Shop {
    /// Reads the environment.
    ///
    /// # Errors
    /// A schema name that is not a plain identifier.
    pub fn from_env() -> anyhow::Result<Self> {
        let var = |k: &str, d: &str| std::env::var(k).unwrap_or_else(|_| d.to_owned());
        Ok(Self {
            database_url: var(
                "SHOP_DATABASE_URL",
                "postgres://postgres@127.0.0.1:5432/test",
            ),
            amqp_url: var("SHOP_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f"),
            schema: PgSchema::new(&var("SHOP_SCHEMA", "shop"))?,
            outbox_schema: PgSchema::new(&var("OUTBOX_SCHEMA", "outbox"))?,
            queue: var("BILLING_QUEUE", "billing.orders"),
            exchange: var("SHOP_EXCHANGE", "shop.orders"),
        })
    }

    /// A pool to the shop's database.
    ///
    /// # Errors
    /// An unreachable database.
    pub async fn pool(&self) -> anyhow::Result<PgPool> {
        Ok(
            outbox_adapters_postgres::connect(&self.database_url, 8, Duration::from_secs(10))
                .await?,
        )
    }

    /// Creates the business tables, the outbox tables and the broker topology
    /// (idempotent).
    ///
    /// # Errors
    /// Database or broker errors.
    pub async fn setup(&self, pool: &PgPool) -> anyhow::Result<()> {
        outbox_adapters_postgres::migrate(pool, &self.outbox_schema).await?;
        let s = self.schema.quoted();
        for sql in [
            format!("CREATE SCHEMA IF NOT EXISTS {s}"),
            format!(
                "CREATE TABLE IF NOT EXISTS {s}.orders (id bigint PRIMARY KEY, total_cents bigint NOT NULL, created_at timestamptz NOT NULL DEFAULT now())"
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {s}.invoices (order_id bigint PRIMARY KEY, message_id uuid NOT NULL, amount_cents bigint NOT NULL, billed_at timestamptz NOT NULL DEFAULT now())"
            ),
        ] {
            sqlx::query(&sql).execute(pool).await?;
        }
        let conn =
            outbox_adapters_rabbitmq::connect(&self.amqp_url, Duration::from_secs(10)).await?;
        Topology {
            exchanges: vec![ExchangeSpec {
                name: self.exchange.clone(),
                kind: ExchangeKind::Topic,
                durable: true,
            }],
            queues: vec![QueueSpec::durable(&self.queue)],
            bindings: vec![BindingSpec {
                queue: self.queue.clone(),
                exchange: self.exchange.clone(),
                routing_key: "order.*".into(),
            }],
        }
        .declare(&conn)
        .await?;
        Ok(())
    }

    /// Undoes [`Shop::setup`]: deletes the queue and the exchange and drops both
    /// schemas. For tests and demos that made a shop of their own; best effort,
    /// nothing is reported.
    pub async fn teardown(&self, pool: &PgPool) {
        if let Ok(conn) =
            outbox_adapters_rabbitmq::connect(&self.amqp_url, Duration::from_secs(5)).await
        {
            if let Ok(ch) = conn.create_channel().await {
                let _ = ch
                    .queue_delete(
                        self.queue.as_str().into(),
                        lapin::options::QueueDeleteOptions::default(),
                    )
                    .await;
                let _ = ch
                    .exchange_delete(
                        self.exchange.as_str().into(),
                        lapin::options::ExchangeDeleteOptions::default(),
                    )
                    .await;
            }
        }
        for s in [&self.schema, &self.outbox_schema] {
            let _ = sqlx::query(&format!("DROP SCHEMA IF EXISTS {} CASCADE", s.quoted()))
                .execute(pool)
                .await;
        }
    }
}

/// The log on stderr and, when `OTEL_EXPORTER_OTLP_ENDPOINT` is set, spans exported
/// over OTLP as `service` (unless `OTEL_SERVICE_NAME` says otherwise), as `outbox
/// run` does. Shut the returned handle down before exiting, so the last spans go out.
///
/// # Errors
/// The exporter could not be built.
pub fn telemetry(service: &str) -> anyhow::Result<outbox_app::logging::Telemetry> {
    outbox_app::logging::init(
        "info,lapin=warn",
        &outbox_app::config::LogConfig::default(),
        &outbox_app::config::TelemetryConfig {
            service_name: service.to_owned(),
            ..outbox_app::config::TelemetryConfig::default()
        },
    )
    .map_err(anyhow::Error::msg)
}
