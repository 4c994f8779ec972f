//! One handle on a schema of a PostgreSQL database: every store, the lock and the
//! sweep state of that schema from one pool, so an application says the schema
//! once (the stores' own constructors stay for those who need one piece).

use crate::{
    PgAuditLog, PgConfigError, PgInboxStore, PgLock, PgOutbox, PgOutboxStore, PgPauses, PgPool,
    PgSchema, PgSweepState, PgThroughputLog, migrate,
};

/// A pool and the schema that holds the outbox's tables in it.
///
/// ```no_run
/// # async fn f(pool: outbox_adapters_postgres::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// use outbox_adapters_postgres::{PgDatabase, PgSchema};
///
/// let pg = PgDatabase::new(pool, PgSchema::new("outbox")?);
/// pg.migrate().await?;
/// let producer = pg.producer(); // enqueue in your own transactions
/// let (store, inbox) = (pg.relay_store(), pg.inbox());
/// let (lock, state) = (pg.lock("relay-1"), pg.sweep_state());
/// # let _ = (store, inbox, lock, state);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct PgDatabase {
    pool: PgPool,
    schema: PgSchema,
}

impl PgDatabase {
    /// The tables of `schema` reached through `pool`.
    #[must_use]
    pub const fn new(pool: PgPool, schema: PgSchema) -> Self {
        Self { pool, schema }
    }

    /// Creates or updates the schema's tables ([`migrate`]).
    ///
    /// # Errors
    /// [`PgConfigError::Migration`] naming the schema and what failed.
    pub async fn migrate(&self) -> Result<(), PgConfigError> {
        migrate(&self.pool, &self.schema).await
    }

    /// The producer: what an application enqueues with, inside its own
    /// transactions (`producer.enqueue(&mut *tx, &event)`).
    #[must_use]
    pub fn producer(&self) -> PgOutbox {
        PgOutbox::new(self.schema.clone())
    }

    /// The relay's store: claims, marks, retention, the operator's reads. Not for
    /// producing: its own `enqueue` commits on a pooled connection, outside any
    /// transaction of yours ([`Self::producer`] is the producer).
    #[must_use]
    pub fn relay_store(&self) -> PgOutboxStore {
        PgOutboxStore::new(self.pool.clone(), self.schema.clone())
    }

    /// The relay's store, under its old name.
    #[deprecated(note = "the relay's store is `relay_store()`; the producer is `producer()`")]
    #[must_use]
    pub fn outbox(&self) -> PgOutboxStore {
        self.relay_store()
    }

    /// The consumers' inbox.
    #[must_use]
    pub fn inbox(&self) -> PgInboxStore {
        PgInboxStore::new(self.pool.clone(), &self.schema)
    }

    /// The cluster lock, held as `instance`.
    #[must_use]
    pub fn lock(&self, instance: &str) -> PgLock {
        PgLock::new(self.pool.clone(), &self.schema, instance)
    }

    /// The sweep state shared by a schema's instances.
    #[must_use]
    pub fn sweep_state(&self) -> PgSweepState {
        PgSweepState::new(self.pool.clone(), &self.schema)
    }

    /// The operator's audit log.
    #[must_use]
    pub fn audit_log(&self) -> PgAuditLog {
        PgAuditLog::new(self.pool.clone(), &self.schema)
    }

    /// The pauses operators set, which every claim and consumer of the schema
    /// obeys.
    #[must_use]
    pub fn pauses(&self) -> PgPauses {
        PgPauses::new(self.pool.clone(), &self.schema)
    }

    /// Per-minute throughput shared by every instance.
    #[must_use]
    pub fn throughput(&self) -> PgThroughputLog {
        PgThroughputLog::new(self.pool.clone(), &self.schema)
    }

    /// The pool.
    #[must_use]
    pub const fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The schema.
    #[must_use]
    pub const fn schema(&self) -> &PgSchema {
        &self.schema
    }
}
