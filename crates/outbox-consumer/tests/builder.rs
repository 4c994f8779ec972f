//! `ConsumerBuilder`: the worker and its own consume-retry sweep as one unit. A
//! handler that fails every first attempt still consumes everything (only the
//! sweep retries), the sweep runs under this consumer's keys, and both tasks stop
//! when the token fires.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_adapters_memory::{
    ExchangeKind, MemoryBroker, MemoryInboxStore, MemoryLock, MemorySweepState,
};
use outbox_consumer::{
    CancellationToken, ConsumerBuilder, ConsumerConfig, ConsumerWorker, HandlerError,
    HandlerRegistry, handler_fn,
};
use outbox_core::{Message, MessageId, RetryPolicy, SweepConfig};
use outbox_ports::{InboxStore, Publisher, SystemClock};

const QUEUE: &str = "builder.test";
const NAME: &str = "builder-consumer";

#[tokio::test]
async fn the_built_consumer_retries_its_failures_in_its_own_sweep_and_stops() {
    let b = MemoryBroker::new();
    b.declare_exchange("contract", ExchangeKind::Topic);
    b.declare_queue(QUEUE);
    b.bind(QUEUE, "contract", "#");
    let clock = Arc::new(SystemClock);
    let inbox = Arc::new(MemoryInboxStore::new(clock.clone()));
    let failed_once = Arc::new(Mutex::new(HashSet::<MessageId>::new()));
    let handlers = HandlerRegistry::new().fallback(handler_fn(move |m: Message| {
        let failed_once = failed_once.clone();
        async move {
            if failed_once.lock().expect("lock").insert(m.id) {
                return Err(HandlerError::from("first attempts always fail"));
            }
            Ok(())
        }
    }));
    let config = ConsumerConfig {
        retry: RetryPolicy {
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(20),
            max_attempts: 5,
        },
        ..ConsumerConfig::new(NAME, QUEUE)
    };
    let worker = ConsumerWorker::new(
        inbox.clone(),
        Arc::new(b.clone()),
        handlers,
        clock.clone(),
        config,
    );
    let state = Arc::new(MemorySweepState::new(clock.clone()));
    let sweep = SweepConfig {
        interval: Duration::from_millis(50),
        ..SweepConfig::for_consumer(NAME)
    };
    sweep.validate("sweep").expect("valid sweep");
    let cancel = CancellationToken::new();
    let mut consumer = ConsumerBuilder::new(worker, Arc::new(MemoryLock::new()), state)
        .sweep(sweep)
        .start(&cancel);
    assert!(
        b.publish(&outbox_testkit::messages(20))
            .await
            .iter()
            .all(|o| o.is_confirmed())
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let s = inbox.stats(NAME).await.expect("stats");
        if s.consumed == 20 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not all consumed: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The last sweep's report may come a moment after its rows were marked.
    let mut retried = 0;
    while retried < 20 {
        let report = tokio::time::timeout(Duration::from_secs(5), consumer.reports.recv())
            .await
            .expect("a sweep report in time")
            .expect("reports open");
        retried += report.consume_retried;
    }
    assert!(consumer.health.failure().is_none());
    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(5), consumer.join())
        .await
        .expect("both tasks stop");
}
