//! Writing messages into the outbox: [`PgOutbox`], the handle a producer enqueues
//! with inside its own transaction (commit publishes, rollback leaves no trace),
//! and the store's own enqueue on a pooled connection ([`outbox_ports::OutboxStore::enqueue`]).
//!
//! A message is a [`NewMessage`](outbox_core::NewMessage) or a typed event by
//! reference ([`IntoNewMessage`]: JSON, the event's type, routing and keys). Every
//! message is made and checked against the payload limit before anything is written;
//! one message is a plain `VALUES` insert, several are one statement over arrays
//! (`unnest`), in order. The producer's trace context is stored with the message,
//! in the same transaction.

use std::collections::BTreeMap;

use outbox_core::message::DEFAULT_MAX_PAYLOAD_BYTES;
use outbox_core::{Event, IntoNewMessage, Message, MessageId};
use outbox_ports::PortError;
use sqlx::PgConnection;
use sqlx::types::Json;

use super::PgOutboxStore;
use super::sql::{insert_many, insert_one};
use crate::PgSchema;
use crate::error::port;
use crate::rows::{bind_message_columns, column};

/// Enqueues messages inside the caller's transaction. Cheap to clone; holds no pool.
///
/// ```no_run
/// # async fn example(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// use outbox_adapters_postgres::{PgOutbox, PgSchema};
/// use outbox_core::NewMessage;
///
/// let outbox = PgOutbox::new(PgSchema::new("outbox")?);
/// let mut tx = pool.begin().await?;
/// sqlx::query("INSERT INTO orders (id) VALUES (42)").execute(&mut *tx).await?;
/// outbox
///     .enqueue(&mut *tx, NewMessage::new("orders", "order.created", br#"{"id":42}"#.to_vec()))
///     .await?;
/// tx.commit().await?; // the message is published only if this commits
/// # Ok(())
/// # }
/// ```
///
/// The exchange a typed event names is a compile-time constant; where it differs
/// per environment, the producer maps it at run time
/// ([`Self::with_exchange_prefix`], [`Self::with_exchange`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgOutbox {
    schema: PgSchema,
    insert: String,
    insert_one: String,
    max_payload_bytes: usize,
    exchange_prefix: String,
    exchanges: BTreeMap<String, String>,
}

impl PgOutbox {
    /// Enqueues into the tables of `schema`, with the default payload limit (1 MiB).
    #[must_use]
    pub fn new(schema: PgSchema) -> Self {
        Self {
            insert: insert_many(&schema),
            insert_one: insert_one(&schema),
            schema,
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
            exchange_prefix: String::new(),
            exchanges: BTreeMap::new(),
        }
    }

    /// Every message this producer enqueues goes to `prefix` + its exchange
    /// (`"staging."`: `orders` becomes `staging.orders`), unless
    /// [`Self::with_exchange`] maps its exchange. The broker's own exchanges keep
    /// their names: the default exchange (`""`, straight to a queue) and `amq.*`.
    /// The result is checked as any exchange name is, at enqueue, before anything
    /// is written.
    #[must_use]
    pub fn with_exchange_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.exchange_prefix = prefix.into();
        self
    }

    /// A message for exchange `from` goes to `to` instead (no prefix added).
    #[must_use]
    pub fn with_exchange(mut self, from: impl Into<String>, to: impl Into<String>) -> Self {
        self.exchanges.insert(from.into(), to.into());
        self
    }

    /// The exchange a message for `exchange` is stored with.
    #[must_use]
    pub fn exchange_for(&self, exchange: &str) -> String {
        match self.exchanges.get(exchange) {
            Some(to) => to.clone(),
            // The broker's exchanges exist under their own names only.
            None if exchange.is_empty() || exchange.starts_with("amq.") => exchange.to_owned(),
            None => format!("{}{exchange}", self.exchange_prefix),
        }
    }

    /// Sets the payload limit.
    #[must_use]
    pub const fn with_max_payload_bytes(mut self, max: usize) -> Self {
        self.max_payload_bytes = max;
        self
    }

    /// The schema.
    #[must_use]
    pub const fn schema(&self) -> &PgSchema {
        &self.schema
    }

    /// The payload limit messages are checked against.
    #[must_use]
    pub const fn max_payload_bytes(&self) -> usize {
        self.max_payload_bytes
    }

    /// Enqueues one message on `conn` (usually `&mut *tx` of the caller's
    /// transaction), with a new UUIDv7 id, and returns the id: a
    /// [`NewMessage`](outbox_core::NewMessage), or a typed event by reference
    /// (`&event`, any [`Event`]), which is written as JSON with the event's type,
    /// version header, exchange, routing key, ordering key and delay
    /// ([`IntoNewMessage`]). With outbox-ports' `otel`
    /// feature the current trace context (`traceparent`, `tracestate`) is added to
    /// its headers unless they carry a `traceparent` already
    /// ([`outbox_ports::trace_context::record_create`]).
    ///
    /// ```no_run
    /// # async fn example(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
    /// use outbox_adapters_postgres::{PgOutbox, PgSchema};
    /// use outbox_core::Event;
    /// use serde::{Deserialize, Serialize};
    ///
    /// #[derive(Serialize, Deserialize)]
    /// struct OrderCreated {
    ///     order_id: u64,
    /// }
    ///
    /// impl Event for OrderCreated {
    ///     const TYPE: &'static str = "order.created";
    ///     const EXCHANGE: &'static str = "shop.orders";
    /// }
    ///
    /// let outbox = PgOutbox::new(PgSchema::new("outbox")?);
    /// let mut tx = pool.begin().await?;
    /// sqlx::query("INSERT INTO orders (id) VALUES (42)").execute(&mut *tx).await?;
    /// outbox.enqueue(&mut tx, &OrderCreated { order_id: 42 }).await?;
    /// tx.commit().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`PortError::InvalidEvent`] when an event cannot be encoded or breaks a
    /// limit, [`PortError::InvalidMessage`] when a
    /// [`NewMessage`](outbox_core::NewMessage) breaks one (either way nothing is
    /// written and the transaction stays usable); a
    /// database error otherwise.
    pub async fn enqueue<M: IntoNewMessage>(
        &self,
        conn: &mut PgConnection,
        message: M,
    ) -> Result<MessageId, PortError> {
        let made = self.prepare([message])?;
        self.insert_messages(conn, &made).await?;
        Ok(made[0].id)
    }

    /// Enqueues several messages in one statement, in order:
    /// [`NewMessage`](outbox_core::NewMessage)s, or events by reference
    /// (`vec![&a, &b]`; a slice of events is [`PgOutbox::enqueue_all`]). Every one
    /// is made and checked before anything is written.
    ///
    /// # Errors
    /// As [`PgOutbox::enqueue`]; one invalid message fails the batch, and nothing
    /// of it is written.
    pub async fn enqueue_batch<M: IntoNewMessage>(
        &self,
        conn: &mut PgConnection,
        messages: Vec<M>,
    ) -> Result<Vec<MessageId>, PortError> {
        let made = self.prepare(messages)?;
        self.insert_messages(conn, &made).await?;
        Ok(made.iter().map(|m| m.id).collect())
    }

    /// Enqueues typed events in one statement, in order, and returns their ids in
    /// the same order: [`PgOutbox::enqueue_batch`] of the events by reference. One
    /// event that cannot be encoded or breaks a limit fails them all
    /// ([`PortError::InvalidEvent`]), before anything is written.
    ///
    /// # Errors
    /// As [`PgOutbox::enqueue_batch`].
    pub async fn enqueue_all<E: Event>(
        &self,
        conn: &mut PgConnection,
        events: &[E],
    ) -> Result<Vec<MessageId>, PortError> {
        let made = self.prepare(events)?;
        self.insert_messages(conn, &made).await?;
        Ok(made.iter().map(|m| m.id).collect())
    }

    /// The messages to insert: each made (an event encoded), checked, given a
    /// UUIDv7 id and the trace context. Nothing is written; the first refused one
    /// fails all.
    fn prepare<M: IntoNewMessage>(
        &self,
        messages: impl IntoIterator<Item = M>,
    ) -> Result<Vec<Message>, PortError> {
        let now = time::OffsetDateTime::now_utc();
        let messages = messages.into_iter();
        let mut made = Vec::with_capacity(messages.size_hint().0);
        for m in messages {
            let mut m = m.into_new_message(self.max_payload_bytes)?;
            if !self.exchange_prefix.is_empty() || !self.exchanges.is_empty() {
                m.exchange = self.exchange_for(&m.exchange);
            }
            m.validate(self.max_payload_bytes)?;
            let mut m = m.into_message(MessageId::from_uuid(uuid::Uuid::now_v7()), now);
            // The producer's trace context (through a `create` span), stored in this
            // same transaction (with outbox-ports' `otel` feature; nothing otherwise).
            outbox_ports::trace_context::record_create(&mut m);
            made.push(m);
        }
        Ok(made)
    }

    /// Stores complete messages (ids and times chosen by the caller) on `conn`.
    ///
    /// # Errors
    /// As [`PgOutbox::enqueue`].
    pub async fn insert_messages(
        &self,
        conn: &mut PgConnection,
        messages: &[Message],
    ) -> Result<(), PortError> {
        if messages.is_empty() {
            return Ok(());
        }
        for m in messages {
            m.validate(self.max_payload_bytes)?;
        }
        if let [m] = messages {
            bind_message_columns(sqlx::query(sqlx::AssertSqlSafe(&*self.insert_one)), m)
                .bind(m.not_before)
                .bind(&m.ordering_key)
                .execute(conn)
                .await
                .map_err(|e| port("enqueue", e))?;
            return Ok(());
        }
        // One array a column, in the order of the insert's `unnest`.
        sqlx::query(sqlx::AssertSqlSafe(&*self.insert))
            .bind(column(messages, |m| *m.id.as_uuid()))
            .bind(column(messages, |m| m.exchange.clone()))
            .bind(column(messages, |m| m.routing_key.clone()))
            .bind(column(messages, |m| m.message_type.clone()))
            .bind(column(messages, |m| Json(m.headers.clone())))
            .bind(column(messages, |m| m.payload.clone()))
            .bind(column(messages, |m| m.content_type.clone()))
            .bind(column(messages, |m| m.source.clone()))
            .bind(column(messages, |m| m.correlation_id.clone()))
            .bind(column(messages, |m| m.created_at))
            .bind(column(messages, |m| m.not_before))
            .bind(column(messages, |m| m.ordering_key.clone()))
            .execute(conn)
            .await
            .map_err(|e| port("enqueue", e))?;
        Ok(())
    }
}

impl PgOutboxStore {
    /// [`outbox_ports::OutboxStore::enqueue`]: complete messages (ids and times chosen by the
    /// caller) on a connection of the pool, each with the trace context of the
    /// current span unless it carries one.
    pub(super) async fn enqueue_messages(
        &self,
        mut messages: Vec<Message>,
    ) -> Result<(), PortError> {
        for m in &mut messages {
            outbox_ports::trace_context::record_create(m);
        }
        let mut conn = self.pool.acquire().await.map_err(|e| port("enqueue", e))?;
        self.outbox.insert_messages(&mut conn, &messages).await
    }
}

#[cfg(test)]
mod tests {
    use super::PgOutbox;
    use crate::PgSchema;

    #[test]
    fn a_prefix_renames_the_applications_exchanges_not_the_brokers() {
        let producer = PgOutbox::new(PgSchema::new("outbox").expect("schema"))
            .with_exchange_prefix("staging.")
            .with_exchange("invoices", "billing-v2");
        assert_eq!(producer.exchange_for("orders"), "staging.orders");
        assert_eq!(producer.exchange_for("invoices"), "billing-v2");
        // The default exchange routes straight to a queue; `amq.*` are the
        // broker's own: prefixed, neither would exist.
        assert_eq!(producer.exchange_for(""), "");
        assert_eq!(producer.exchange_for("amq.topic"), "amq.topic");
    }
}
