//! The billing consumer: one invoice per `order.created`, written in the inbox's
//! transaction, so a redelivered or retried message never bills twice.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use outbox::consumer::{ConsumerBuilder, ConsumerRetention, PgConsumerWorker};
use outbox::event::decode;
use outbox::ports::SystemClock;
use outbox::postgres::{PgConnection, PgDatabase, PgSchema, sqlx};
use outbox::rabbitmq::RabbitSubscriber;
use outbox::{
    CancellationToken, ConsumerConfig, Context, HandlerError, Message, PgEventHandler,
    PgHandlerRegistry, RetryPolicy, SweepConfig, async_trait,
};

use crate::Shop;
use crate::events::OrderCreated;

/// The consumer's name in the inbox.
pub const CONSUMER: &str = "billing";

/// Failure injection for demos and tests.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// Orders whose first billing attempt fails (by `order_id % 100 < percent`).
    pub fail_first_percent: u64,
    /// Orders that never bill (they end dead).
    pub poison: HashSet<i64>,
    /// Orders whose handler runs a statement that fails, ignores the error and
    /// returns `Ok`, as a handler meaning to skip a unique violation would: the
    /// transaction is aborted, so each attempt fails and the order ends dead.
    pub swallow_error: HashSet<i64>,
    /// Orders whose handler writes a row twice under a unique constraint checked at
    /// COMMIT (`DEFERRABLE INITIALLY DEFERRED`): the COMMIT fails on every attempt,
    /// so the order ends dead.
    pub fail_at_commit: HashSet<i64>,
}

/// Attempts the billing consumer makes before a delivery is dead.
pub const MAX_ATTEMPTS: u32 = 5;

/// The order id in an `order.created` message, if it decodes as one.
#[must_use]
pub fn order_id_of(m: &Message) -> Option<i64> {
    decode::<OrderCreated>(m).ok().map(|o| o.order_id)
}

struct Billing {
    schema: PgSchema,
    faults: Faults,
}

/// One invoice per order, in the inbox's transaction. A body that is not an
/// `OrderCreated` never gets here: it is dead after one attempt, its reason naming
/// the type and what did not decode.
#[async_trait]
impl PgEventHandler<OrderCreated> for Billing {
    async fn handle(
        &self,
        conn: &mut PgConnection,
        order: OrderCreated,
        cx: Context,
    ) -> Result<(), HandlerError> {
        let OrderCreated {
            order_id,
            total_cents: total,
        } = order;
        if self.faults.poison.contains(&order_id) {
            return Err(format!("order {order_id} cannot be billed").into());
        }
        let unlucky = u64::try_from(order_id).unwrap_or(0) % 100 < self.faults.fail_first_percent;
        // Injected fault: the first attempt of an unlucky order fails (remembered in
        // this process, since the failed transaction rolls back).
        if unlucky
            && failed_once()
                .lock()
                .map_err(|_| "poisoned lock")?
                .insert(order_id)
        {
            return Err(format!("billing backend busy for order {order_id}").into());
        }
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {}.invoices (order_id, message_id, amount_cents) VALUES ($1, $2, $3)",
            self.schema.quoted()
        )))
        .bind(order_id)
        .bind(cx.message_id.as_uuid())
        .bind(total)
        .execute(&mut *conn)
        .await?;
        if self.faults.swallow_error.contains(&order_id) {
            // Injected fault: the error is dropped on purpose, leaving the
            // transaction aborted behind an `Ok`.
            let _ignored = sqlx::query("SELECT 1 / 0").execute(&mut *conn).await;
        }
        if self.faults.fail_at_commit.contains(&order_id) {
            // Injected fault: a temporary table (gone at the end of the transaction)
            // whose unique constraint is checked at COMMIT, written twice.
            sqlx::query(
                "CREATE TEMPORARY TABLE billing_commit_check (order_id bigint, \
                 CONSTRAINT billing_commit_check_once UNIQUE (order_id) DEFERRABLE INITIALLY DEFERRED) \
                 ON COMMIT DROP",
            )
            .execute(&mut *conn)
            .await?;
            for _ in 0..2 {
                sqlx::query("INSERT INTO billing_commit_check VALUES ($1)")
                    .bind(order_id)
                    .execute(&mut *conn)
                    .await?;
            }
        }
        Ok(())
    }
}

/// Order ids from a comma-separated list; what does not parse is skipped.
fn order_ids(list: Option<String>) -> HashSet<i64> {
    list.unwrap_or_default()
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect()
}

fn failed_once() -> &'static std::sync::Mutex<HashSet<i64>> {
    static SET: std::sync::OnceLock<std::sync::Mutex<HashSet<i64>>> = std::sync::OnceLock::new();
    SET.get_or_init(Default::default)
}

/// Runs the billing consumer until `cancel` fires: the worker on the queue (with
/// `retention` of its consumed inbox rows) and the consume-retry sweep (lock and
/// state in PostgreSQL, keys of this consumer).
///
/// # Errors
/// Setup errors (database, broker).
pub async fn run(
    shop: &Shop,
    faults: Faults,
    sweep_interval: Duration,
    retention: ConsumerRetention,
    ordered_by_key: bool,
    cancel: CancellationToken,
) -> anyhow::Result<()> {
    let pool = shop.pool().await?;
    shop.setup(&pool).await?;
    let pg = PgDatabase::new(pool.clone(), shop.outbox_schema.clone());
    let handlers = PgHandlerRegistry::new().on::<OrderCreated>(Billing {
        schema: shop.schema.clone(),
        faults,
    });
    let config = ConsumerConfig {
        prefetch: 64,
        concurrency: 8,
        retry: RetryPolicy {
            initial_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(5),
            max_attempts: MAX_ATTEMPTS,
        },
        retention,
        ordered_by_key,
        // What the broker gives up on (the queue's delivery limit) becomes a dead
        // inbox row of this consumer.
        dead_letter_queue: shop.dead_letter_queue(),
        ..ConsumerConfig::new(CONSUMER, &shop.queue)
    };
    let worker = PgConsumerWorker::new(
        pg.inbox(),
        Arc::new(
            RabbitSubscriber::new(&shop.amqp_url).with_failover_urls(&shop.amqp_failover_urls),
        ),
        handlers,
        Arc::new(SystemClock),
        config,
    )
    // What it consumed, added to the per-minute totals the admin API's charts read.
    .with_throughput(Arc::new(pg.throughput()));
    // The lock's holder: unique per process on a host.
    let instance = format!("billing-{}", std::process::id());
    let sweep = SweepConfig {
        interval: sweep_interval,
        ..SweepConfig::for_consumer(CONSUMER)
    };
    // The worker and its consume-retry sweep.
    let consumer = ConsumerBuilder::new(
        worker,
        Arc::new(pg.lock(&instance)),
        Arc::new(pg.sweep_state()),
    )
    .sweep(sweep)
    .start(&cancel);
    let metrics = std::env::var("BILLING_METRICS_ADDR")
        .ok()
        .and_then(|a| a.parse().ok())
        .map(|addr| {
            tokio::spawn(outbox::telemetry::http::serve_consumer_ready(
                addr,
                CONSUMER.to_owned(),
                Arc::clone(&consumer.counters),
                Arc::clone(&consumer.progress),
                cancel.clone(),
            ))
        });
    consumer.join().await;
    if let Some(m) = metrics {
        let _ = m.await;
    }
    Ok(())
}

/// The billing consumer process: settings from the environment (see the crate docs;
/// `BILLING_FAIL_FIRST_PERCENT`, `BILLING_POISON_ORDERS`,
/// `BILLING_SWALLOW_ERROR_ORDERS`, `BILLING_FAIL_AT_COMMIT_ORDERS` (comma-separated
/// order ids), `BILLING_SWEEP_INTERVAL`, `BILLING_RETENTION_CONSUMED_AFTER` (the age
/// after which consumed inbox rows are deleted; default 7 days, at least one hour),
/// `BILLING_ORDERED_BY_KEY` (`true`: one customer's events one after another, see
/// `ConsumerConfig::ordered_by_key`), `BILLING_METRICS_ADDR`), logs to stderr, runs until SIGINT or SIGTERM.
///
/// # Errors
/// Bad settings, setup errors.
pub async fn main_from_env() -> anyhow::Result<()> {
    let telemetry = crate::telemetry("billing-consumer")?;
    let shop = Shop::from_env()?;
    let var = |k: &str| std::env::var(k).ok();
    let faults = Faults {
        fail_first_percent: var("BILLING_FAIL_FIRST_PERCENT")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
        poison: order_ids(var("BILLING_POISON_ORDERS")),
        swallow_error: order_ids(var("BILLING_SWALLOW_ERROR_ORDERS")),
        fail_at_commit: order_ids(var("BILLING_FAIL_AT_COMMIT_ORDERS")),
    };
    let interval = var("BILLING_SWEEP_INTERVAL")
        .map(|v| outbox::duration::parse(&v))
        .transpose()
        .map_err(anyhow::Error::msg)?
        .unwrap_or(Duration::from_secs(60));
    let retention = match var("BILLING_RETENTION_CONSUMED_AFTER") {
        Some(v) => ConsumerRetention::default()
            .with_consumed_after(outbox::duration::parse(&v).map_err(anyhow::Error::msg)?)?,
        None => ConsumerRetention::default(),
    };
    let cancel = CancellationToken::new();
    let stop = cancel.clone();
    tokio::spawn(async move {
        crate::shutdown_signal().await;
        tracing::info!("shutting down");
        stop.cancel();
    });
    let ordered_by_key = match var("BILLING_ORDERED_BY_KEY").as_deref() {
        None | Some("" | "false" | "0") => false,
        Some("true" | "1") => true,
        Some(other) => anyhow::bail!("BILLING_ORDERED_BY_KEY must be true or false, not {other:?}"),
    };
    let result = run(&shop, faults, interval, retention, ordered_by_key, cancel).await;
    telemetry.shutdown().await;
    result
}
