//! The shared lock and sweep-state contracts, run against Redis (each case on keys of
//! its own).

mod common;

use std::sync::Arc;

use outbox_adapters_redis::{RedisLock, RedisSweepState};
use outbox_ports::{DistributedLock, SweepStateStore};

async fn lock() -> Arc<dyn DistributedLock> {
    let client = common::client()
        .await
        .expect("contract tests need Redis: set OUTBOX_TEST_REDIS_URL");
    Arc::new(RedisLock::new(client, "contract"))
}

async fn state() -> Arc<dyn SweepStateStore> {
    let client = common::client()
        .await
        .expect("contract tests need Redis: set OUTBOX_TEST_REDIS_URL");
    Arc::new(RedisSweepState::new(client))
}

outbox_testkit::lock_contract!(crate::lock);
outbox_testkit::sweep_state_contract!(crate::state);
