//! The outbox on PostgreSQL: [`PgOutbox`] enqueues in the caller's transaction,
//! [`PgOutboxStore`] is what the relay, the retention sweep and the operator use.
//!
//! One concern a module:
//! - [`enqueue`]: [`PgOutbox`] and the store's own enqueue;
//! - [`claim`]: the relay's claims under a lease, what an idle relay asks, and the
//!   clearing of leases a vanished relay left;
//! - [`marks`]: sent, failed or dead, released: one fenced statement per batch;
//! - [`reads`]: the stats, exact counts, blocked keys and a key's head;
//! - [`records`]: one message, a list, requeue and delete (the port's record
//!   calls, kept together);
//! - [`retention`]: sent rows deleted in batches, space reclaimed;
//! - [`explain`]: `EXPLAIN` of the store's statements, through
//!   [`crate::diagnostics`];
//! - [`sql`]: every statement's text, built once per store; [`keys`]: the SQL
//!   fragments of the ordering-key rule they share; [`paused`]: the picks' form
//!   for while an exchange is paused.
//!
//! The port traits' impls here only delegate, each to the module of its concern.

mod claim;
mod enqueue;
mod explain;
mod keys;
mod marks;
mod paused;
mod reads;
mod records;
mod retention;
mod sql;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::{Message, MessageId};
use outbox_ports::{
    ClaimedMessage, DeadHead, Lease, OutboxRelayPath, OutboxStats, OutboxStore, PortError,
    PublishFailure,
};
use sqlx::PgPool;

pub use enqueue::PgOutbox;
pub(crate) use keys::claimable_pending_exists;

use crate::PgSchema;
use sql::Sql;

/// [`OutboxStore`] on PostgreSQL.
#[derive(Debug, Clone)]
pub struct PgOutboxStore {
    pool: PgPool,
    outbox: PgOutbox,
    sql: Arc<Sql>,
    /// The ordering key after which this store's next claim starts walking the
    /// keys (see [`keys::keyed_heads`]); shared by its clones.
    key_cursor: Arc<Mutex<String>>,
    /// While an exchange is paused, a key cursor per exchange instead (see
    /// [`keys::keyed_heads_by_exchange`]); shared by its clones.
    exchange_key_cursors: Arc<Mutex<HashMap<String, String>>>,
}

impl PgOutboxStore {
    /// A store on `pool` over the tables of `schema` (run [`crate::migrate`] first).
    #[must_use]
    pub fn new(pool: PgPool, schema: PgSchema) -> Self {
        Self {
            pool,
            sql: Arc::new(Sql::new(&schema, DeadHead::default())),
            outbox: PgOutbox::new(schema),
            key_cursor: Arc::default(),
            exchange_key_cursors: Arc::default(),
        }
    }

    /// Sets the payload limit (default 1 MiB).
    #[must_use]
    pub fn with_max_payload_bytes(mut self, max: usize) -> Self {
        self.outbox = self.outbox.with_max_payload_bytes(max);
        self
    }

    /// What a dead message does to the later messages of its ordering key (default
    /// [`DeadHead::Block`]).
    #[must_use]
    pub fn with_dead_head(mut self, dead_head: DeadHead) -> Self {
        self.sql = Arc::new(Sql::new(self.outbox.schema(), dead_head));
        self
    }

    /// The transactional enqueue handle of the same schema.
    #[must_use]
    pub const fn outbox(&self) -> &PgOutbox {
        &self.outbox
    }

    /// The pool.
    #[must_use]
    pub const fn pool(&self) -> &PgPool {
        &self.pool
    }
}

#[async_trait]
impl OutboxRelayPath for PgOutboxStore {
    async fn claim_pending(
        &self,
        lease: &Lease,
        limit: u32,
    ) -> Result<Vec<ClaimedMessage>, PortError> {
        self.claim_pending_rows(lease, limit).await
    }

    async fn claim_due_retries(
        &self,
        lease: &Lease,
        limit: u32,
    ) -> Result<Vec<ClaimedMessage>, PortError> {
        self.claim_retry_rows(lease, limit).await
    }

    async fn mark_sent(&self, lease: &Lease, ids: &[MessageId]) -> Result<u64, PortError> {
        self.mark_sent_rows(lease, ids).await
    }

    async fn mark_publish_failed(
        &self,
        lease: &Lease,
        failures: &[PublishFailure],
    ) -> Result<u64, PortError> {
        self.mark_failures(lease, failures).await
    }

    async fn release(&self, lease: &Lease, ids: &[MessageId]) -> Result<u64, PortError> {
        self.release_rows(lease, ids).await
    }

    async fn next_due_in(&self) -> Result<Option<Duration>, PortError> {
        self.next_due().await
    }

    async fn pending_claimable(&self) -> Result<Option<bool>, PortError> {
        self.claimable().await
    }

    async fn recover_expired_leases(&self) -> Result<u64, PortError> {
        self.recover_leases().await
    }
}

#[async_trait]
impl OutboxStore for PgOutboxStore {
    async fn enqueue(&self, messages: Vec<Message>) -> Result<(), PortError> {
        self.enqueue_messages(messages).await
    }

    async fn stats(&self) -> Result<OutboxStats, PortError> {
        self.read_stats().await
    }

    fn max_payload_bytes(&self) -> usize {
        self.outbox.max_payload_bytes()
    }
}
