//! A panic in a worker's inbox retention loop does not go unnoticed and does not
//! stop it for good: it is logged at error level and the loop starts again after
//! the retention interval, while the consumer goes on consuming.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use outbox_adapters_memory::{ExchangeKind, MemoryBroker, MemoryInboxStore};
use outbox_consumer::{
    CancellationToken, ConsumerConfig, ConsumerRetention, HandlerRegistry, InboxWorker,
    NeutralInbox, handler_fn,
};
use outbox_ports::{InboxRetention, InboxStore, PortError, Publisher, SystemClock};

const QUEUE: &str = "retention.supervision";
const NAME: &str = "retention-supervision";

/// Inbox retention whose first delete panics and whose later ones find nothing.
struct PanickyRetention {
    runs: Arc<AtomicU32>,
}

#[async_trait]
impl InboxRetention for PanickyRetention {
    async fn delete_consumed_batch(
        &self,
        _consumer: &str,
        _age: Duration,
        _limit: u32,
    ) -> Result<u64, PortError> {
        if self.runs.fetch_add(1, Ordering::SeqCst) == 0 {
            panic!("retention bug");
        }
        Ok(0)
    }
}

async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn a_panicking_retention_loop_is_restarted_and_the_consumer_goes_on() {
    let b = MemoryBroker::new();
    b.declare_exchange("contract", ExchangeKind::Topic);
    b.declare_queue(QUEUE);
    b.bind(QUEUE, "contract", "#");
    let inbox = Arc::new(MemoryInboxStore::new(Arc::new(SystemClock)));
    let runs = Arc::new(AtomicU32::new(0));
    let path = NeutralInbox::new(
        inbox.clone(),
        HandlerRegistry::new().fallback(handler_fn(|_| async { Ok(()) })),
    )
    .with_retention(Arc::new(PanickyRetention {
        runs: Arc::clone(&runs),
    }));
    let config = ConsumerConfig {
        retention: ConsumerRetention::default()
            .with_interval(Duration::from_millis(50))
            .expect("interval"),
        ..ConsumerConfig::new(NAME, QUEUE)
    };
    let worker = InboxWorker::with_path(path, Arc::new(b.clone()), Arc::new(SystemClock), config);
    let cancel = CancellationToken::new();
    let running = tokio::spawn(worker.run(cancel.clone()));

    wait_for("the retention loop to start again after its panic", || {
        runs.load(Ordering::SeqCst) >= 2
    })
    .await;
    assert!(
        !running.is_finished(),
        "the worker ended with its retention"
    );

    // Consumption is unaffected.
    let msgs = outbox_testkit::messages(10);
    assert!(b.publish(&msgs).await.iter().all(|o| o.is_confirmed()));
    let mut consumed = 0;
    for _ in 0..2000 {
        consumed = inbox.stats(NAME).await.expect("stats").consumed;
        if consumed == 10 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(consumed, 10);

    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(5), running)
        .await
        .expect("worker stops")
        .expect("worker task");
    // One restart per panic: the second run ended by cancellation, not restarted.
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}
