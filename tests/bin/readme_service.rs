//! An order service: orders billed and shipped, exactly once in effect.

use outbox::prelude::*;
use serde::{Deserialize, Serialize};

/// Version 2 added the currency; version 1 is still sent by an older service.
#[derive(Serialize, Deserialize, outbox::Event)]
#[event(type = "order.created", exchange = "orders", version = 2)]
struct OrderCreated {
    order_id: i64,
    total_cents: i64,
    currency: String,
}

#[derive(Serialize, Deserialize, outbox::Event)]
#[event(type = "order.created", exchange = "orders")]
struct OrderCreatedV1 {
    order_id: i64,
    total_cents: i64,
}

#[derive(Serialize, Deserialize, outbox::Event)]
#[event(type = "invoice.issued", exchange = "invoices")]
struct InvoiceIssued {
    order_id: i64,
}

/// The invoice and its follow-up event commit with the inbox row, or nothing does.
async fn bill(conn: &mut PgConnection, order: OrderCreated, cx: Context) -> HandlerResult {
    if order.total_cents < 0 {
        return Err(HandlerError::permanent("negative total")); // dead at once
    }
    sqlx::query("INSERT INTO invoices (order_id, total_cents, currency) VALUES ($1, $2, $3)")
        .bind(order.order_id)
        .bind(order.total_cents)
        .bind(&order.currency)
        .execute(&mut *conn)
        .await?;
    let invoice = InvoiceIssued {
        order_id: order.order_id,
    };
    cx.publish(conn, &invoice).await?;
    Ok(())
}

impl From<OrderCreatedV1> for OrderCreated {
    fn from(v1: OrderCreatedV1) -> Self {
        let (order_id, total_cents) = (v1.order_id, v1.total_cents);
        let currency = "EUR".to_owned();
        Self {
            order_id,
            total_cents,
            currency,
        }
    }
}

async fn bill_v1(conn: &mut PgConnection, v1: OrderCreatedV1, cx: Context) -> HandlerResult {
    bill(conn, v1.into(), cx).await
}

/// A transient error (any but `permanent`) is retried at the backoff: 1 s, 2 s, ...
async fn ship(conn: &mut PgConnection, invoice: InvoiceIssued, cx: Context) -> HandlerResult {
    if cx.attempt == 1 {
        return Err("carrier busy".into());
    }
    sqlx::query("INSERT INTO shipments (order_id) VALUES ($1)")
        .bind(invoice.order_id)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

const TABLES: &str = "CREATE TABLE IF NOT EXISTS invoices (order_id int8 PRIMARY KEY, \
    total_cents int8, currency text); CREATE TABLE IF NOT EXISTS shipments (order_id int8 PRIMARY KEY);";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let env = |name, default: &str| std::env::var(name).unwrap_or(default.to_owned());
    let url = env("DATABASE_URL", "postgres://postgres@127.0.0.1/postgres");
    let pool = PgPool::connect(&url).await?;
    sqlx::raw_sql(TABLES).execute(&pool).await?;
    let usd = |order_id, total_cents| OrderCreated {
        order_id,
        total_cents,
        currency: "USD".into(),
    };
    let orders = [usd(1, 1999), usd(3, -1)]; // order 3 is refused for good
    let old = OrderCreatedV1 {
        order_id: 2,
        total_cents: 500,
    };

    // The outbox: topology, relay, two consumers with their retries.
    let topology = Topology::new()
        .exchange("orders", ExchangeKind::Topic)
        .exchange("invoices", ExchangeKind::Topic)
        .queue("billing")
        .bind("billing", "orders", "order.*")
        .queue("shipping")
        .bind("shipping", "invoices", "invoice.*");
    let service = Service::postgres(&pool)
        .rabbitmq(env("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f"))
        .topology(topology)
        .relay()
        .consumer("billing", |h| h.on_fn(bill).on_fn(bill_v1))
        .consumer("shipping", |h| h.on_fn(ship))
        .build()
        .await?;
    // Events enqueued in your own transaction: published only if it commits.
    let mut tx = service.pool().begin().await?;
    let producer = service.producer();
    producer.enqueue_all(&mut tx, &orders).await?;
    producer.enqueue(&mut tx, &old).await?;
    tx.commit().await?;
    service.run().await?; // until Ctrl-C; then finishes what it holds and stops
    Ok(())
}
