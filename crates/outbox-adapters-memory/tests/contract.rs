//! The shared port contracts, run against the memory adapters.

use std::sync::Arc;

use outbox_adapters_memory::{MemoryInboxStore, MemoryLock, MemoryOutboxStore, MemorySweepState};
use outbox_ports::{DistributedLock, InboxStore, OutboxStore, SweepStateStore, SystemClock};

async fn outbox() -> Arc<dyn OutboxStore> {
    Arc::new(MemoryOutboxStore::new(Arc::new(SystemClock)))
}

async fn inbox() -> Arc<dyn InboxStore> {
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
