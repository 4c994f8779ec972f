//! A small shop on `outbox`: an order service that writes an order and enqueues
//! `order.created` in one transaction, and a billing consumer that records one
//! invoice per order, exactly once, in the inbox's transaction.
//!
//! Settings come from the environment (defaults: the local services):
//! `SHOP_DATABASE_URL`, `SHOP_AMQP_URL`, `SHOP_AMQP_FAILOVER_URLS` (more nodes of
//! the same RabbitMQ cluster, comma-separated: the setup and the billing consumer
//! fail over to them), `SHOP_SCHEMA` (business tables, default
//! `shop`), `OUTBOX_SCHEMA` (default `outbox`), `BILLING_QUEUE` (default
//! `billing.orders`), `SHOP_EXCHANGE` (default `shop.orders`), and how the
//! billing queue is declared: `BILLING_QUEUE_TYPE` (`classic`, the default, or
//! `quorum`) and `BILLING_DELIVERY_LIMIT` (quorum only: the queue argument
//! `x-delivery-limit`; with it, the broker dead-letters a delivery returned more
//! often through `<queue>.dlx` into `<queue>.dead`, which the billing consumer
//! drains into its dead inbox rows). `order-service setup` and `billing-consumer`
//! both read them, so they declare the same queue.

use std::time::Duration;

use outbox::postgres::{PgPool, PgSchema, sqlx};
use outbox::rabbitmq::{ExchangeKind, QueueSpec, QueueType, Topology, lapin};

pub mod billing;
pub mod events;
pub mod orders;
pub mod web;

/// Settings of both programs.
#[derive(Clone)]
pub struct Shop {
    /// PostgreSQL URL.
    pub database_url: String,
    /// RabbitMQ URL.
    pub amqp_url: String,
    /// More nodes of the same RabbitMQ cluster, which the billing consumer fails
    /// over to (empty: only `amqp_url`).
    pub amqp_failover_urls: Vec<String>,
    /// Schema of the business tables.
    pub schema: PgSchema,
    /// Schema of the outbox and inbox tables.
    pub outbox_schema: PgSchema,
    /// The billing consumer's queue.
    pub queue: String,
    /// The exchange orders are published to.
    pub exchange: String,
    /// How the billing queue is declared.
    pub billing_queue: BillingQueue,
}

// The URLs' passwords hidden.
impl std::fmt::Debug for Shop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let redact = outbox::postgres::redact_url;
        f.debug_struct("Shop")
            .field("database_url", &redact(&self.database_url))
            .field("amqp_url", &redact(&self.amqp_url))
            .field(
                "amqp_failover_urls",
                &self
                    .amqp_failover_urls
                    .iter()
                    .map(|u| redact(u))
                    .collect::<Vec<_>>(),
            )
            .field("schema", &self.schema)
            .field("outbox_schema", &self.outbox_schema)
            .field("queue", &self.queue)
            .field("exchange", &self.exchange)
            .field("billing_queue", &self.billing_queue)
            .finish()
    }
}

/// How the billing queue is declared (`BILLING_QUEUE_TYPE`,
/// `BILLING_DELIVERY_LIMIT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BillingQueue {
    /// Classic or quorum.
    pub queue_type: QueueType,
    /// `x-delivery-limit` (quorum only).
    pub delivery_limit: Option<u32>,
}

impl Default for BillingQueue {
    fn default() -> Self {
        Self {
            queue_type: QueueType::Classic,
            delivery_limit: None,
        }
    }
}

impl BillingQueue {
    /// From the values of `BILLING_QUEUE_TYPE` and `BILLING_DELIVERY_LIMIT`.
    ///
    /// # Errors
    /// An unknown type, a limit that is not a positive number, or a limit on a
    /// classic queue, each naming its variable.
    pub fn parse(queue_type: Option<&str>, delivery_limit: Option<&str>) -> anyhow::Result<Self> {
        let queue_type = match queue_type.map(str::trim) {
            None | Some("" | "classic") => QueueType::Classic,
            Some("quorum") => QueueType::Quorum,
            Some(other) => {
                anyhow::bail!("BILLING_QUEUE_TYPE must be classic or quorum, not {other:?}")
            }
        };
        let delivery_limit = match delivery_limit.map(str::trim) {
            None | Some("") => None,
            Some(v) => match v.parse::<u32>() {
                Ok(n) if n > 0 => Some(n),
                _ => anyhow::bail!("BILLING_DELIVERY_LIMIT must be a positive number, not {v:?}"),
            },
        };
        if delivery_limit.is_some() && queue_type != QueueType::Quorum {
            anyhow::bail!(
                "BILLING_DELIVERY_LIMIT is for a quorum queue only: set BILLING_QUEUE_TYPE=quorum"
            );
        }
        Ok(Self {
            queue_type,
            delivery_limit,
        })
    }
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
            amqp_failover_urls: var("SHOP_AMQP_FAILOVER_URLS", "")
                .split(',')
                .map(str::trim)
                .filter(|u| !u.is_empty())
                .map(str::to_owned)
                .collect(),
            schema: PgSchema::new(&var("SHOP_SCHEMA", "shop"))?,
            outbox_schema: PgSchema::new(&var("OUTBOX_SCHEMA", "outbox"))?,
            queue: var("BILLING_QUEUE", "billing.orders"),
            exchange: var("SHOP_EXCHANGE", "shop.orders"),
            billing_queue: BillingQueue::parse(
                std::env::var("BILLING_QUEUE_TYPE").ok().as_deref(),
                std::env::var("BILLING_DELIVERY_LIMIT").ok().as_deref(),
            )?,
        })
    }

    /// The exchange the billing queue dead-letters through, with a delivery limit.
    #[must_use]
    pub fn dead_letter_exchange(&self) -> Option<String> {
        self.billing_queue
            .delivery_limit
            .map(|_| format!("{}.dlx", self.queue))
    }

    /// The queue the broker dead-letters billing deliveries into at their delivery
    /// limit, drained by the billing consumer.
    #[must_use]
    pub fn dead_letter_queue(&self) -> Option<String> {
        self.billing_queue
            .delivery_limit
            .map(|_| format!("{}.dead", self.queue))
    }

    /// The billing queue as declared.
    #[must_use]
    pub fn queue_spec(&self) -> QueueSpec {
        QueueSpec {
            queue_type: self.billing_queue.queue_type,
            delivery_limit: self.billing_queue.delivery_limit,
            dead_letter_exchange: self.dead_letter_exchange(),
            dead_letter_queue: self.dead_letter_queue(),
            ..QueueSpec::durable(&self.queue)
        }
    }

    /// The exchange, the billing queue (with its dead-letter queue, if any) and
    /// their binding.
    fn topology(&self) -> Topology {
        Topology::new()
            .exchange(&self.exchange, ExchangeKind::Topic)
            .queue_spec(self.queue_spec())
            .bind(&self.queue, &self.exchange, "order.*")
    }

    /// A connection to the broker: `amqp_url`, else one of the failover URLs.
    async fn amqp(&self, timeout: Duration) -> Result<lapin::Connection, outbox::ports::PortError> {
        match outbox::rabbitmq::connect(&self.amqp_url, timeout).await {
            Err(_) if !self.amqp_failover_urls.is_empty() => {
                outbox::rabbitmq::connect_any(
                    &self.amqp_failover_urls,
                    &outbox::rabbitmq::RabbitTls::default(),
                    timeout,
                )
                .await
            }
            other => other,
        }
    }

    /// A pool to the shop's database.
    ///
    /// # Errors
    /// An unreachable database.
    pub async fn pool(&self) -> anyhow::Result<PgPool> {
        Ok(outbox::postgres::connect(&self.database_url, 8, Duration::from_secs(10)).await?)
    }

    /// Creates the business tables, the outbox tables and the broker topology
    /// (idempotent).
    ///
    /// # Errors
    /// Database or broker errors.
    pub async fn setup(&self, pool: &PgPool) -> anyhow::Result<()> {
        outbox::postgres::migrate(pool, &self.outbox_schema).await?;
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
            sqlx::query(sqlx::AssertSqlSafe(sql)).execute(pool).await?;
        }
        let conn = self.amqp(Duration::from_secs(10)).await?;
        self.topology().declare(&conn).await?;
        let _ = conn.close(200, "declared".into()).await;
        Ok(())
    }

    /// Undoes [`Shop::setup`]: deletes the queue and the exchange and drops both
    /// schemas. For tests and demos that made a shop of their own; best effort,
    /// nothing is reported.
    pub async fn teardown(&self, pool: &PgPool) {
        if let Ok(conn) = self.amqp(Duration::from_secs(5)).await {
            let _ = self.topology().delete(&conn).await;
        }
        for s in [&self.schema, &self.outbox_schema] {
            let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                "DROP SCHEMA IF EXISTS {} CASCADE",
                s.quoted()
            )))
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
pub fn telemetry(service: &str) -> anyhow::Result<outbox::telemetry::Telemetry> {
    outbox::telemetry::init(
        "info,lapin=warn",
        &outbox::telemetry::LogConfig::default(),
        &outbox::telemetry::TelemetryConfig {
            service_name: service.to_owned(),
            ..outbox::telemetry::TelemetryConfig::default()
        },
    )
    .map_err(anyhow::Error::msg)
}

/// Resolves at SIGINT or SIGTERM: when the shop's programs begin their graceful
/// shutdown.
pub async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    let terminated = async {
        match term.as_mut() {
            Some(t) => {
                t.recv().await;
            }
            None => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminated => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_billing_queue_comes_from_the_environment_values() {
        assert_eq!(
            BillingQueue::parse(None, None).expect("default"),
            BillingQueue::default()
        );
        assert_eq!(
            BillingQueue::parse(Some("quorum"), Some("3")).expect("quorum"),
            BillingQueue {
                queue_type: QueueType::Quorum,
                delivery_limit: Some(3),
            }
        );
        for (t, l, var) in [
            (Some("stream"), None, "BILLING_QUEUE_TYPE"),
            (Some("quorum"), Some("0"), "BILLING_DELIVERY_LIMIT"),
            (Some("quorum"), Some("many"), "BILLING_DELIVERY_LIMIT"),
            (None, Some("3"), "BILLING_DELIVERY_LIMIT"),
        ] {
            let err = BillingQueue::parse(t, l).expect_err(var).to_string();
            assert!(err.contains(var), "{err}");
        }
    }
}
