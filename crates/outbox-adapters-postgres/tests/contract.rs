//! The shared port contracts, run against the PostgreSQL adapters, each case in a
//! schema of its own.

mod common;

use std::sync::Arc;

use outbox_adapters_postgres::{PgInboxStore, PgLock, PgOutboxStore, PgSweepState};
use outbox_ports::{DistributedLock, InboxStore, OutboxStore, SweepStateStore};

async fn outbox() -> Arc<dyn OutboxStore> {
    let pool = common::pool()
        .await
        .expect("contract tests need PostgreSQL: set OUTBOX_TEST_DATABASE_URL");
    let schema = common::fresh(&pool).await;
    Arc::new(PgOutboxStore::new(pool, schema))
}

async fn inbox() -> Arc<dyn InboxStore> {
    let pool = common::pool()
        .await
        .expect("contract tests need PostgreSQL: set OUTBOX_TEST_DATABASE_URL");
    let schema = common::fresh(&pool).await;
    Arc::new(PgInboxStore::new(pool, &schema))
}

async fn lock() -> Arc<dyn DistributedLock> {
    let pool = common::pool()
        .await
        .expect("contract tests need PostgreSQL: set OUTBOX_TEST_DATABASE_URL");
    let schema = common::fresh(&pool).await;
    Arc::new(PgLock::new(pool, &schema, "contract"))
}

async fn state() -> Arc<dyn SweepStateStore> {
    let pool = common::pool()
        .await
        .expect("contract tests need PostgreSQL: set OUTBOX_TEST_DATABASE_URL");
    let schema = common::fresh(&pool).await;
    Arc::new(PgSweepState::new(pool, &schema))
}

outbox_testkit::outbox_store_contract!(crate::outbox);
outbox_testkit::inbox_store_contract!(crate::inbox);
outbox_testkit::lock_contract!(crate::lock);
outbox_testkit::sweep_state_contract!(crate::state);
