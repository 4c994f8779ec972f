//! A relay task that panics or ends on its own is never a silent outage: the relay
//! reports itself failed (readiness fails) and `outbox run` exits non-zero.

use std::sync::Arc;
use std::time::Duration;

use outbox_adapters_memory::{MemoryLock, MemoryOutboxStore, MemorySweepState};
use outbox_ports::{ClaimedMessage, MockOutboxStore, MockPublisher, OutboxStore, SystemClock};
use outbox_relay::{CancellationToken, DispatcherConfig, RelayBuilder};

#[tokio::test]
async fn a_panicking_dispatcher_makes_the_relay_report_failure() {
    let store = Arc::new(MemoryOutboxStore::new(Arc::new(SystemClock)));
    let mut publisher = MockPublisher::new();
    publisher
        .expect_publish_within()
        .returning(|_, _| panic!("publisher bug"));
    let cancel = CancellationToken::new();
    let relay = RelayBuilder::new(
        store.clone(),
        Arc::new(publisher),
        Arc::new(MemoryLock::new()),
        Arc::new(MemorySweepState::new(Arc::new(SystemClock))),
    )
    .dispatch(DispatcherConfig {
        idle_poll: Duration::from_millis(5),
        ..DispatcherConfig::default()
    })
    .start(&cancel);
    let health = relay.health.clone();
    assert!(health.failure().is_none(), "healthy at start");
    store
        .enqueue(outbox_testkit::messages(1))
        .await
        .expect("enqueue");
    tokio::time::timeout(Duration::from_secs(10), health.failed())
        .await
        .expect("the panic is reported");
    let why = health.failure().expect("a failure");
    assert!(why.contains("dispatcher"), "{why}");
    assert!(why.contains("publisher bug"), "{why}");
    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(10), relay.join())
        .await
        .expect("the rest stops");
}

#[tokio::test]
async fn a_relay_stopped_by_its_token_is_not_a_failure() {
    let store = Arc::new(MemoryOutboxStore::new(Arc::new(SystemClock)));
    let cancel = CancellationToken::new();
    let relay = RelayBuilder::new(
        store,
        Arc::new(outbox_adapters_memory::MemoryBroker::new()),
        Arc::new(MemoryLock::new()),
        Arc::new(MemorySweepState::new(Arc::new(SystemClock))),
    )
    .start(&cancel);
    let health = relay.health.clone();
    tokio::time::sleep(Duration::from_millis(50)).await;
    cancel.cancel();
    relay.join().await;
    assert_eq!(health.failure(), None);
}

#[tokio::test]
async fn a_panic_while_marking_a_batch_makes_the_relay_report_failure() {
    let mut store = MockOutboxStore::new();
    let mut handed_out = false;
    store.expect_claim_pending().returning(move |_, _| {
        // One batch of one message, then nothing.
        let batch = if handed_out {
            Vec::new()
        } else {
            vec![ClaimedMessage {
                message: outbox_testkit::message("contract", "contract.key"),
                attempts: 0,
                requeued: false,
            }]
        };
        handed_out = true;
        Ok(batch)
    });
    store
        .expect_claim_due_retries()
        .returning(|_, _| Ok(Vec::new()));
    store.expect_recover_expired_leases().returning(|| Ok(0));
    store
        .expect_release()
        .returning(|_, ids| Ok(ids.len() as u64));
    store
        .expect_mark_sent()
        .returning(|_, _| panic!("mark bug"));
    store
        .expect_mark_publish_failed()
        .returning(|_, _| panic!("mark bug"));
    let cancel = CancellationToken::new();
    let relay = RelayBuilder::new(
        Arc::new(store),
        Arc::new(outbox_adapters_memory::MemoryBroker::new()),
        Arc::new(MemoryLock::new()),
        Arc::new(MemorySweepState::new(Arc::new(SystemClock))),
    )
    .dispatch(DispatcherConfig {
        idle_poll: Duration::from_millis(5),
        ..DispatcherConfig::default()
    })
    .start(&cancel);
    let health = relay.health.clone();
    tokio::time::timeout(Duration::from_secs(10), health.failed())
        .await
        .expect("the marking task's panic is reported");
    let why = health.failure().expect("a failure");
    assert!(why.contains("dispatcher"), "{why}");
    assert!(why.contains("mark bug"), "{why}");
    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(10), relay.join())
        .await
        .expect("the rest stops");
}
