//! Writing messages into the outbox: [`PgOutbox`], the handle a producer enqueues
//! with inside its own transaction (commit publishes, rollback leaves no trace),
//! and the store's own enqueue on a pooled connection ([`outbox_ports::OutboxStore::enqueue`]).
//!
//! Every message is checked against the payload limit before anything is written;
//! one message is a plain `VALUES` insert, several are one statement over arrays
//! (`unnest`), in order. The producer's trace context is stored with the message,
//! in the same transaction.

use outbox_core::message::DEFAULT_MAX_PAYLOAD_BYTES;
use outbox_core::{Message, MessageId, NewMessage};
use outbox_ports::PortError;
use sqlx::PgConnection;
use sqlx::types::Json;

use super::PgOutboxStore;
use super::sql::{insert_many, insert_one};
use crate::PgSchema;
use crate::error::port;
use crate::rows::bind_message_columns;

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
#[derive(Debug, Clone)]
pub struct PgOutbox {
    schema: PgSchema,
    insert: String,
    insert_one: String,
    max_payload_bytes: usize,
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

    /// Enqueues one message on `conn` (usually `&mut *tx` of the caller's
    /// transaction), with a new UUIDv7 id, and returns the id. With outbox-ports'
    /// `otel` feature the current trace context (`traceparent`, `tracestate`) is added
    /// to its headers unless they carry a `traceparent` already
    /// ([`outbox_ports::trace_context::record_create`]).
    ///
    /// # Errors
    /// [`PortError::InvalidMessage`] when it breaks a limit (nothing is written);
    /// a database error otherwise.
    pub async fn enqueue(
        &self,
        conn: &mut PgConnection,
        message: NewMessage,
    ) -> Result<MessageId, PortError> {
        Ok(self.enqueue_batch(conn, vec![message]).await?[0])
    }

    /// Enqueues several messages in one statement, in order.
    ///
    /// # Errors
    /// As [`PgOutbox::enqueue`]; one invalid message fails the batch.
    pub async fn enqueue_batch(
        &self,
        conn: &mut PgConnection,
        messages: Vec<NewMessage>,
    ) -> Result<Vec<MessageId>, PortError> {
        let now = time::OffsetDateTime::now_utc();
        let mut made = Vec::with_capacity(messages.len());
        for m in messages {
            m.validate(self.max_payload_bytes)?;
            let mut m = m.into_message(MessageId::from_uuid(uuid::Uuid::now_v7()), now);
            // The producer's trace context (through a `create` span), stored in this
            // same transaction (with outbox-ports' `otel` feature; nothing otherwise).
            outbox_ports::trace_context::record_create(&mut m);
            made.push(m);
        }
        self.insert_messages(conn, &made).await?;
        Ok(made.iter().map(|m| m.id).collect())
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
            bind_message_columns(sqlx::query(&self.insert_one), m)
                .bind(m.not_before)
                .bind(&m.ordering_key)
                .execute(conn)
                .await
                .map_err(|e| port("enqueue", e))?;
            return Ok(());
        }
        // One array a column, in the order of the insert's `unnest`.
        sqlx::query(&self.insert)
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

/// One column of `messages`, as the array the batch insert binds.
fn column<T>(messages: &[Message], value: impl Fn(&Message) -> T) -> Vec<T> {
    messages.iter().map(value).collect()
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
