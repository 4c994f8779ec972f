//! The shared port contracts, run against the PostgreSQL adapters, each case in a
//! schema of its own.

mod common;

use std::sync::Arc;

use outbox_adapters_postgres::{PgInboxStore, PgLock, PgOutboxStore, PgSweepState};
use outbox_ports::{DistributedLock, SweepStateStore};

async fn outbox() -> Arc<dyn outbox_testkit::outbox::OutboxSubject> {
    let pool = common::pool()
        .await
        .expect("contract tests need PostgreSQL: set OUTBOX_TEST_DATABASE_URL");
    let schema = common::fresh(&pool).await;
    Arc::new(PgOutboxStore::new(pool, schema))
}

async fn inbox() -> Arc<dyn outbox_testkit::inbox::InboxSubject> {
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

async fn outbox_operator() -> outbox_testkit::outbox_operator::OutboxUnderTest {
    let pool = common::pool()
        .await
        .expect("contract tests need PostgreSQL: set OUTBOX_TEST_DATABASE_URL");
    let schema = common::fresh(&pool).await;
    let store = Arc::new(PgOutboxStore::new(pool, schema));
    outbox_testkit::outbox_operator::OutboxUnderTest {
        store: store.clone(),
        operator: store,
    }
}

async fn inbox_operator() -> outbox_testkit::inbox_operator::InboxUnderTest {
    let pool = common::pool()
        .await
        .expect("contract tests need PostgreSQL: set OUTBOX_TEST_DATABASE_URL");
    let schema = common::fresh(&pool).await;
    let store = Arc::new(PgInboxStore::new(pool, &schema));
    outbox_testkit::inbox_operator::InboxUnderTest {
        store: store.clone(),
        operator: store,
    }
}

async fn audit() -> Arc<dyn outbox_ports::AuditLog> {
    let pool = common::pool()
        .await
        .expect("contract tests need PostgreSQL: set OUTBOX_TEST_DATABASE_URL");
    let schema = common::fresh(&pool).await;
    Arc::new(outbox_adapters_postgres::PgAuditLog::new(pool, &schema))
}

outbox_testkit::outbox_operator_contract!(crate::outbox_operator);
outbox_testkit::replay_contract!(crate::outbox_operator);
outbox_testkit::attempt_history_contract!(crate::outbox_operator, crate::inbox_operator);
outbox_testkit::inbox_operator_contract!(crate::inbox_operator);
outbox_testkit::inbox_replay_contract!(crate::inbox_operator);
outbox_testkit::audit_log_contract!(crate::audit);

async fn throughput() -> Arc<dyn outbox_ports::ThroughputLog> {
    let pool = common::pool()
        .await
        .expect("contract tests need PostgreSQL: set OUTBOX_TEST_DATABASE_URL");
    let schema = common::fresh(&pool).await;
    Arc::new(outbox_adapters_postgres::PgThroughputLog::new(
        pool, &schema,
    ))
}

outbox_testkit::throughput_log_contract!(crate::throughput);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_head_blocks_its_key_by_default() {
    outbox_testkit::outbox::a_dead_head_blocks_its_key_unless_skipped(outbox().await, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_head_is_skipped_when_configured() {
    let pool = common::pool()
        .await
        .expect("contract tests need PostgreSQL: set OUTBOX_TEST_DATABASE_URL");
    let schema = common::fresh(&pool).await;
    let store: Arc<dyn outbox_testkit::outbox::OutboxSubject> =
        Arc::new(PgOutboxStore::new(pool, schema).with_dead_head(outbox_ports::DeadHead::Skip));
    outbox_testkit::outbox::a_dead_head_blocks_its_key_unless_skipped(store, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocked_keys_leave_out_dead_heads_when_skipped() {
    let pool = common::pool()
        .await
        .expect("contract tests need PostgreSQL: set OUTBOX_TEST_DATABASE_URL");
    let schema = common::fresh(&pool).await;
    let store =
        Arc::new(PgOutboxStore::new(pool, schema).with_dead_head(outbox_ports::DeadHead::Skip));
    outbox_testkit::outbox_operator::blocked_keys_list_failing_and_dead_heads(
        outbox_testkit::outbox_operator::OutboxUnderTest {
            store: store.clone(),
            operator: store,
        },
        true,
    )
    .await;
}

async fn pauses() -> outbox_testkit::pauses::PausesUnderTest {
    let pool = common::pool()
        .await
        .expect("contract tests need PostgreSQL: set OUTBOX_TEST_DATABASE_URL");
    let schema = common::fresh(&pool).await;
    outbox_testkit::pauses::PausesUnderTest {
        outbox: Arc::new(PgOutboxStore::new(pool.clone(), schema.clone())),
        inbox: Arc::new(PgInboxStore::new(pool.clone(), &schema)),
        pauses: Arc::new(outbox_adapters_postgres::PgPauses::new(pool, &schema)),
    }
}

outbox_testkit::pause_contract!(crate::pauses);
