//! The order service: an order row and its `order.created` message, one transaction.

use outbox::postgres::{PgOutbox, PgPool, sqlx};
use outbox::{Event as _, MessageId, NewMessage};

use crate::Shop;
use crate::events::OrderCreated;

/// Creates order `id` for `total_cents` and enqueues `order.created`; with
/// `roll_back` the transaction is rolled back instead (nothing happens at all).
/// Returns the message id.
///
/// # Errors
/// Database errors (the order and the message are both absent then).
pub async fn create(
    shop: &Shop,
    pool: &PgPool,
    id: i64,
    total_cents: i64,
    roll_back: bool,
) -> anyhow::Result<MessageId> {
    create_keyed(shop, pool, id, total_cents, roll_back, None).await
}

/// [`create`], the event with `ordering_key` (for example the customer's id): the
/// events of one key are published, and with an ordered consumer handled, in the
/// order their transactions inserted them. Serialize a key's producers.
///
/// # Errors
/// As [`create`].
pub async fn create_keyed(
    shop: &Shop,
    pool: &PgPool,
    id: i64,
    total_cents: i64,
    roll_back: bool,
    ordering_key: Option<&str>,
) -> anyhow::Result<MessageId> {
    // The shop's exchange is a setting (SHOP_EXCHANGE), not the type's default:
    // the producer maps it.
    let outbox = PgOutbox::new(shop.outbox_schema.clone())
        .with_exchange(OrderCreated::EXCHANGE, &shop.exchange);
    let mut tx = pool.begin().await?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {}.orders (id, total_cents) VALUES ($1, $2)",
        shop.schema.quoted()
    )))
    .bind(id)
    .bind(total_cents)
    .execute(&mut *tx)
    .await?;
    let mut event: NewMessage = outbox::event::to_new_message(&OrderCreated {
        order_id: id,
        total_cents,
    })?
    .with_source("order-service");
    if let Some(key) = ordering_key {
        event = event.with_ordering_key(key);
    }
    let message_id = outbox.enqueue(&mut tx, event).await?;
    if roll_back {
        tx.rollback().await?;
    } else {
        tx.commit().await?;
    }
    Ok(message_id)
}
