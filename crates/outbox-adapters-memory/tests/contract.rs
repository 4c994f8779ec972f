//! The shared port contracts, run against the memory adapters.

use std::sync::Arc;

use outbox_adapters_memory::{MemoryInboxStore, MemoryLock, MemoryOutboxStore, MemorySweepState};
use outbox_ports::{DistributedLock, SweepStateStore, SystemClock};

async fn outbox() -> Arc<dyn outbox_testkit::outbox::OutboxSubject> {
    Arc::new(MemoryOutboxStore::new(Arc::new(SystemClock)))
}

async fn inbox() -> Arc<dyn outbox_testkit::inbox::InboxSubject> {
    Arc::new(MemoryInboxStore::new(Arc::new(SystemClock)))
}

async fn lock() -> Arc<dyn DistributedLock> {
    Arc::new(MemoryLock::new())
}

async fn state() -> Arc<dyn SweepStateStore> {
    Arc::new(MemorySweepState::new(Arc::new(SystemClock)))
}

outbox_testkit::outbox_store_contract!(crate::outbox);
outbox_testkit::inbox_store_contract!(crate::inbox);
outbox_testkit::lock_contract!(crate::lock);
outbox_testkit::sweep_state_contract!(crate::state);

async fn outbox_operator() -> outbox_testkit::outbox_operator::OutboxUnderTest {
    let store = Arc::new(MemoryOutboxStore::new(Arc::new(SystemClock)));
    outbox_testkit::outbox_operator::OutboxUnderTest {
        store: store.clone(),
        operator: store,
    }
}

async fn inbox_operator() -> outbox_testkit::inbox_operator::InboxUnderTest {
    let store = Arc::new(MemoryInboxStore::new(Arc::new(SystemClock)));
    outbox_testkit::inbox_operator::InboxUnderTest {
        store: store.clone(),
        operator: store,
    }
}

async fn audit() -> Arc<dyn outbox_ports::AuditLog> {
    Arc::new(outbox_adapters_memory::MemoryAuditLog::new(Arc::new(
        SystemClock,
    )))
}

outbox_testkit::outbox_operator_contract!(crate::outbox_operator);
outbox_testkit::replay_contract!(crate::outbox_operator);
outbox_testkit::attempt_history_contract!(crate::outbox_operator, crate::inbox_operator);
outbox_testkit::inbox_operator_contract!(crate::inbox_operator);
outbox_testkit::inbox_replay_contract!(crate::inbox_operator);
outbox_testkit::audit_log_contract!(crate::audit);

async fn throughput() -> Arc<dyn outbox_ports::ThroughputLog> {
    Arc::new(outbox_adapters_memory::MemoryThroughputLog::new(Arc::new(
        SystemClock,
    )))
}

outbox_testkit::throughput_log_contract!(crate::throughput);

#[tokio::test]
async fn a_dead_head_blocks_its_key_by_default() {
    outbox_testkit::outbox::a_dead_head_blocks_its_key_unless_skipped(outbox().await, false).await;
}

#[tokio::test]
async fn a_dead_head_is_skipped_when_configured() {
    let store: Arc<dyn outbox_testkit::outbox::OutboxSubject> = Arc::new(
        MemoryOutboxStore::new(Arc::new(SystemClock)).with_dead_head(outbox_ports::DeadHead::Skip),
    );
    outbox_testkit::outbox::a_dead_head_blocks_its_key_unless_skipped(store, true).await;
}

/// Many more interleavings than the contract case runs (cheap in memory; a fresh
/// store for each, since a memory claim walks every row it holds).
#[tokio::test]
async fn keyed_order_holds_under_500_interleavings() {
    for seed in 0..500 {
        outbox_testkit::outbox::keyed_order_holds_under_interleaved_relays(
            outbox().await,
            seed..seed + 1,
        )
        .await;
    }
}

#[tokio::test]
async fn blocked_keys_leave_out_dead_heads_when_skipped() {
    let store = Arc::new(
        MemoryOutboxStore::new(Arc::new(SystemClock)).with_dead_head(outbox_ports::DeadHead::Skip),
    );
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
    let outbox = MemoryOutboxStore::new(Arc::new(SystemClock));
    let pauses = outbox.pauses();
    outbox_testkit::pauses::PausesUnderTest {
        inbox: Arc::new(MemoryInboxStore::new(Arc::new(SystemClock)).with_pauses(&pauses)),
        outbox: Arc::new(outbox),
        pauses: Arc::new(pauses),
    }
}

outbox_testkit::pause_contract!(crate::pauses);
