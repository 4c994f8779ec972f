//! The inbox on PostgreSQL: [`PgInboxStore`] deduplicates deliveries by (consumer,
//! message id), holds keyed ones behind an unfinished earlier one of their key, and
//! can run a handler in the inbox row's own transaction, which makes its effect
//! exactly once.
//!
//! One concern a module:
//! - [`arrival`]: a delivery recorded and taken under a lease, or held behind its
//!   key;
//! - [`transaction`]: a handler's writes and the inbox row in one transaction, for
//!   a first delivery or a retry; [`session`]: how a handler runs in it (savepoint,
//!   session reset) and how that run ended; [`batch`]: several first deliveries
//!   under one COMMIT;
//! - [`marks`]: consumed, failed or dead, and the key's next row made due;
//! - [`claim`]: the consume sweep's claim of due rows and the held-row safety net;
//! - [`given_up`]: what the broker gave up on, as a dead row or a dead letter;
//! - [`reads`]: a consumer's stats, a delivery's status; [`records`]: one delivery,
//!   a list, reconsume (the port's record calls, kept together);
//! - [`retention`]: consumed rows deleted in batches, space reclaimed;
//! - [`explain`]: `EXPLAIN` of the store's statements, through
//!   [`crate::diagnostics`];
//! - [`sql`]: every statement's text, built once per store.
//!
//! The port traits' impls here only delegate, each to the module of its concern.

mod arrival;
mod batch;
mod claim;
mod explain;
mod given_up;
mod marks;
mod reads;
mod records;
mod retention;
mod session;
mod sql;
mod transaction;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use outbox_core::{Decision, Message, MessageId};
use outbox_ports::{
    Arrival, ClaimedDelivery, DeadLetter, InboxConsumerPath, InboxRetention, InboxStats,
    InboxStore, Lease, PortError,
};
use sqlx::PgPool;

pub use batch::BatchDelivery;
pub use session::TxHandler;
pub use transaction::ConsumeOutcome;

use crate::PgSchema;
use sql::Sql;

/// [`InboxStore`] on PostgreSQL.
#[derive(Debug, Clone)]
pub struct PgInboxStore {
    pub(crate) pool: PgPool,
    /// The schema, for the operator's queries (built per call from the filter).
    pub(crate) schema: PgSchema,
    sql: Arc<Sql>,
    /// When each consumer's held rows were last checked by `release_held`; shared
    /// by the store's clones.
    held_checked: Arc<Mutex<HashMap<String, Instant>>>,
    held_check_every: Duration,
    /// Whether the table has the batch's COMMIT check (`inbox_batch_sealed`), once
    /// known; shared by the store's clones.
    batch_guarded: Arc<tokio::sync::OnceCell<bool>>,
}

/// How often a consumer's claims run the held-row safety net (see
/// [`PgInboxStore::with_held_check_every`]).
pub const HELD_CHECK_EVERY: Duration = Duration::from_secs(5);

impl PgInboxStore {
    /// The schema of the inbox's tables.
    #[must_use]
    pub const fn schema(&self) -> &PgSchema {
        &self.schema
    }

    /// A store on `pool` over the tables of `schema` (run [`crate::migrate`] first).
    #[must_use]
    pub fn new(pool: PgPool, schema: &PgSchema) -> Self {
        Self {
            pool,
            schema: schema.clone(),
            sql: Arc::new(Sql::new(schema)),
            held_checked: Arc::default(),
            held_check_every: HELD_CHECK_EVERY,
            batch_guarded: Arc::default(),
        }
    }

    /// How often a consumer's due claims also look for held rows (deliveries that
    /// wait behind an earlier one of their ordering key) whose predecessor has
    /// finished without making them due, which happens only when the process died
    /// between finishing a row and making its successor due. Default
    /// [`HELD_CHECK_EVERY`]; the check costs one index probe per key with
    /// unfinished deliveries.
    #[must_use]
    pub fn with_held_check_every(mut self, every: Duration) -> Self {
        self.held_check_every = every;
        self
    }
}

#[async_trait]
impl InboxConsumerPath for PgInboxStore {
    async fn record_arrival(
        &self,
        consumer: &str,
        message: &Message,
        lease: &Lease,
    ) -> Result<Arrival, PortError> {
        self.arrive(consumer, message, lease).await
    }

    async fn record_given_up(
        &self,
        consumer: &str,
        message: &Message,
        reason: &str,
    ) -> Result<bool, PortError> {
        self.record_broker_gave_up(consumer, message, reason).await
    }

    async fn hold_behind_key(&self, consumer: &str, message: &Message) -> Result<bool, PortError> {
        self.hold(consumer, message).await
    }

    async fn mark_consumed(
        &self,
        consumer: &str,
        id: MessageId,
        lease: &Lease,
    ) -> Result<bool, PortError> {
        self.mark_consumed_row(consumer, id, lease).await
    }

    async fn mark_consume_failed(
        &self,
        consumer: &str,
        id: MessageId,
        lease: &Lease,
        error: &str,
        decision: Decision,
    ) -> Result<bool, PortError> {
        self.mark_failed_row(consumer, id, lease, error, decision)
            .await
    }

    async fn claim_due(
        &self,
        consumer: &str,
        lease: &Lease,
        limit: u32,
    ) -> Result<Vec<ClaimedDelivery>, PortError> {
        self.claim_due_rows(consumer, lease, limit).await
    }

    async fn record_dead_letter(
        &self,
        consumer: &str,
        letter: DeadLetter,
    ) -> Result<(), PortError> {
        self.store_dead_letter(consumer, letter).await
    }

    async fn consumer_paused(&self, consumer: &str) -> Result<bool, PortError> {
        crate::PgPauses::new(self.pool.clone(), &self.schema)
            .is_paused(outbox_ports::PauseKind::Consumer, consumer)
            .await
    }
}

#[async_trait]
impl InboxStore for PgInboxStore {
    async fn stats(&self, consumer: &str) -> Result<InboxStats, PortError> {
        self.read_stats(consumer).await
    }
}

#[async_trait]
impl InboxRetention for PgInboxStore {
    async fn delete_consumed_batch(
        &self,
        consumer: &str,
        age: std::time::Duration,
        limit: u32,
    ) -> Result<u64, PortError> {
        self.delete_consumed_rows(consumer, age, limit).await
    }

    async fn reclaim_space(&self) -> Result<outbox_ports::SpaceReclaim, PortError> {
        self.reclaim_inbox_space().await
    }
}
