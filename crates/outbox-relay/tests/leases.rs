//! Lease holders are unique per claim, also across relays configured with the same
//! `instance` name, so a stale mark never lands on someone else's claim.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use outbox_adapters_memory::{
    ExchangeKind, MemoryBroker, MemoryLock, MemoryOutboxStore, MemorySweepState,
};
use outbox_core::{Decision, Message, MessageId, OutboxStatus, RetryPolicy, SweepConfig};
use outbox_ports::{
    ClaimedMessage, Lease, OutboxRelayPath, OutboxRetention, OutboxStats, OutboxStore, PortError,
    PublishFailure, SystemClock,
};
use outbox_relay::{CancellationToken, DispatcherConfig, LeaseFactory, RelayBuilder};

/// An outbox store that remembers the holder of every claim it served.
struct RecordingStore {
    inner: MemoryOutboxStore,
    holders: Mutex<Vec<String>>,
}

#[async_trait]
impl OutboxRelayPath for RecordingStore {
    async fn claim_pending(&self, l: &Lease, n: u32) -> Result<Vec<ClaimedMessage>, PortError> {
        self.holders.lock().expect("lock").push(l.holder.clone());
        self.inner.claim_pending(l, n).await
    }

    async fn claim_due_retries(&self, l: &Lease, n: u32) -> Result<Vec<ClaimedMessage>, PortError> {
        self.holders.lock().expect("lock").push(l.holder.clone());
        self.inner.claim_due_retries(l, n).await
    }

    async fn mark_sent(&self, l: &Lease, ids: &[MessageId]) -> Result<u64, PortError> {
        self.inner.mark_sent(l, ids).await
    }

    async fn mark_publish_failed(&self, l: &Lease, f: &[PublishFailure]) -> Result<u64, PortError> {
        self.inner.mark_publish_failed(l, f).await
    }

    async fn release(&self, l: &Lease, ids: &[MessageId]) -> Result<u64, PortError> {
        self.inner.release(l, ids).await
    }

    async fn recover_expired_leases(&self) -> Result<u64, PortError> {
        self.inner.recover_expired_leases().await
    }
}

#[async_trait]
impl OutboxRetention for RecordingStore {
    async fn delete_sent_batch(&self, age: Duration, n: u32) -> Result<u64, PortError> {
        self.inner.delete_sent_batch(age, n).await
    }
}

#[async_trait]
impl OutboxStore for RecordingStore {
    async fn enqueue(&self, m: Vec<Message>) -> Result<(), PortError> {
        self.inner.enqueue(m).await
    }

    async fn stats(&self) -> Result<OutboxStats, PortError> {
        self.inner.stats().await
    }
}

#[tokio::test]
async fn two_relays_with_the_same_instance_name_never_share_a_lease_holder() {
    let store = Arc::new(RecordingStore {
        inner: MemoryOutboxStore::new(Arc::new(SystemClock)),
        holders: Mutex::default(),
    });
    let broker = MemoryBroker::new();
    broker.declare_exchange("contract", ExchangeKind::Topic);
    broker.declare_queue("q");
    broker.bind("q", "contract", "#");
    let lock = Arc::new(MemoryLock::new());
    let state = Arc::new(MemorySweepState::new(Arc::new(SystemClock)));
    let cancel = CancellationToken::new();
    let sweep = SweepConfig {
        interval: Duration::from_millis(20),
        lock_wait: Duration::from_millis(10),
        ..SweepConfig::default()
    };
    let relays: Vec<_> = (0..2)
        .map(|_| {
            RelayBuilder::new(
                store.clone(),
                Arc::new(broker.clone()),
                lock.clone(),
                state.clone(),
            )
            .dispatch(DispatcherConfig {
                batch_size: 5,
                idle_poll: Duration::from_millis(5),
                pipelines: 2,
                retry: RetryPolicy {
                    initial_backoff: Duration::from_millis(5),
                    max_backoff: Duration::from_millis(10),
                    max_attempts: 100,
                },
                ..DispatcherConfig::default()
            })
            .sweep(sweep.clone())
            .instance("same")
            .start(&cancel)
        })
        .collect();
    broker.fail_next_publishes(20);
    store
        .enqueue(outbox_testkit::messages(200))
        .await
        .expect("enqueue");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while store.inner.count(OutboxStatus::Sent) < 200 {
        assert!(tokio::time::Instant::now() < deadline, "all sent in time");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cancel.cancel();
    for r in relays {
        r.join().await;
    }
    let holders = store.holders.lock().expect("lock").clone();
    let unique: HashSet<&String> = holders.iter().collect();
    assert!(holders.len() > 10, "claims were made: {}", holders.len());
    assert_eq!(
        unique.len(),
        holders.len(),
        "a holder was used twice: {holders:?}"
    );
}

#[tokio::test]
async fn a_stale_mark_of_one_relay_cannot_touch_the_claim_of_another_with_the_same_name() {
    let store = MemoryOutboxStore::new(Arc::new(SystemClock));
    let m = outbox_testkit::messages(1);
    let id = m[0].id;
    store.enqueue(m).await.expect("enqueue");
    // Two replicas configured with the same instance name, each with its own factory.
    let a = LeaseFactory::new("same", Duration::from_millis(30));
    let b = LeaseFactory::new("same", Duration::from_secs(30));
    let stale = a.next();
    assert_eq!(
        store.claim_pending(&stale, 10).await.expect("claim").len(),
        1
    );
    tokio::time::sleep(Duration::from_millis(60)).await;
    let fresh = b.next();
    assert_ne!(stale.holder, fresh.holder);
    assert_eq!(
        store
            .claim_pending(&fresh, 10)
            .await
            .expect("reclaim")
            .len(),
        1
    );
    // The first relay's late outcome: dead. It must not land on the new claim.
    let late = store
        .mark_publish_failed(
            &stale,
            &[PublishFailure {
                id,
                error: "late".into(),
                decision: Decision::Dead,
            }],
        )
        .await
        .expect("mark");
    assert_eq!(late, 0, "the stale mark touched the other relay's claim");
    assert_eq!(store.mark_sent(&fresh, &[id]).await.expect("mark sent"), 1);
    assert_eq!(store.count(OutboxStatus::Sent), 1);
}

#[test]
fn holders_of_factories_with_one_name_differ_also_in_the_same_process() {
    let a = LeaseFactory::new("relay", Duration::from_secs(1));
    let b = LeaseFactory::new("relay", Duration::from_secs(1));
    let mut seen = HashSet::new();
    for _ in 0..100 {
        assert!(seen.insert(a.next().holder));
        assert!(seen.insert(b.next().holder));
    }
    assert!(seen.iter().all(|h| h.starts_with("relay")));
}
