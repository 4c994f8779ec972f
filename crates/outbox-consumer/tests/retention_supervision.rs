//! A panic in a worker's inbox retention loop does not go unnoticed and does not
//! stop it for good: it is logged at error level and the loop starts again after
//! the retention interval, while the consumer goes on consuming.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use futures::FutureExt as _;
use outbox_adapters_memory::{ExchangeKind, MemoryBroker, MemoryInboxStore, TokioClock};
use outbox_consumer::{
    CancellationToken, ConsumerConfig, ConsumerRetention, HandlerRegistry, InboxWorker,
    NeutralInbox, handler_fn,
};
use outbox_core::Timestamp;
use outbox_ports::{InboxRetention, InboxStore, PortError, Publisher, SystemClock};

const QUEUE: &str = "retention.supervision";
const NAME: &str = "retention-supervision";

/// Inbox retention whose first two deletes panic and whose later ones find
/// nothing; it notes when each was asked for.
struct PanickyRetention {
    runs: Arc<AtomicU32>,
    asked: Arc<std::sync::Mutex<Vec<std::time::Instant>>>,
}

#[async_trait]
impl InboxRetention for PanickyRetention {
    async fn delete_consumed_batch(
        &self,
        _consumer: &str,
        _age: Duration,
        _limit: u32,
    ) -> Result<u64, PortError> {
        self.asked
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(std::time::Instant::now());
        if self.runs.fetch_add(1, Ordering::SeqCst) < 2 {
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
    let asked = Arc::new(std::sync::Mutex::new(Vec::new()));
    let path = NeutralInbox::new(
        inbox.clone(),
        HandlerRegistry::new().fallback(handler_fn(|_| async { Ok(()) })),
    )
    .with_retention(Arc::new(PanickyRetention {
        runs: Arc::clone(&runs),
        asked: Arc::clone(&asked),
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

    wait_for("the retention loop to start again after each panic", || {
        runs.load(Ordering::SeqCst) >= 3
    })
    .await;
    // Each restart waited one interval (50 ms) after its panic: never a hot loop.
    let asked = asked
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    for pair in asked[..3].windows(2) {
        assert!(
            pair[1] - pair[0] >= Duration::from_millis(50),
            "restarted after {:?}",
            pair[1] - pair[0]
        );
    }
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
    // The restarted loop went on with its rounds (every 50 ms) until the stop.
    assert!(runs.load(Ordering::SeqCst) >= 3);
}

/// The backend-neutral worker runs its inbox's retention: once the consumed
/// deliveries are older than `consumed_after`, a round deletes them (and counts
/// them); a failed delivery stays. Time is tokio's, paused, and the inbox's clock
/// follows it.
#[tokio::test(start_paused = true)]
async fn the_neutral_workers_retention_deletes_old_consumed_deliveries_only() {
    let b = MemoryBroker::new();
    b.declare_exchange("contract", ExchangeKind::Topic);
    b.declare_queue(QUEUE);
    b.bind(QUEUE, "contract", "#");
    let clock = Arc::new(TokioClock::starting_at(Timestamp::now_utc()));
    let inbox = Arc::new(MemoryInboxStore::new(clock.clone()));
    let failing = outbox_testkit::message("contract", "fails");
    let failing_id = failing.id;
    let path = NeutralInbox::retained(
        inbox.clone(),
        HandlerRegistry::new().fallback(handler_fn(move |m: outbox_core::Message| async move {
            if m.id == failing_id {
                Err(outbox_consumer::HandlerError::from("no"))
            } else {
                Ok(())
            }
        })),
    );
    let config = ConsumerConfig {
        retention: ConsumerRetention::default()
            .with_consumed_after(Duration::from_secs(3600))
            .expect("age")
            .with_interval(Duration::from_secs(60))
            .expect("interval"),
        ..ConsumerConfig::new(NAME, QUEUE)
    };
    let worker = InboxWorker::with_path(path, Arc::new(b.clone()), clock, config);
    let counters = worker.counters();
    let cancel = CancellationToken::new();
    let running = tokio::spawn(worker.run(cancel.clone()));
    let mut msgs = outbox_testkit::messages(3);
    msgs.push(failing);
    assert!(b.publish(&msgs).await.iter().all(|o| o.is_confirmed()));
    wait_for("the deliveries to be handled", || {
        inbox
            .stats(NAME)
            .now_or_never()
            .and_then(Result::ok)
            .is_some_and(|s| s.consumed == 3 && s.consume_failed == 1)
    })
    .await;
    // Younger than an hour: rounds leave them.
    tokio::time::sleep(Duration::from_secs(1800)).await;
    assert_eq!(inbox.stats(NAME).await.expect("stats").consumed, 3);
    // Older: the next round deletes the consumed ones, not the failed one.
    tokio::time::sleep(Duration::from_secs(1900)).await;
    let stats = inbox.stats(NAME).await.expect("stats");
    assert_eq!((stats.consumed, stats.consume_failed), (0, 1));
    assert_eq!(counters.retention_deleted.load(Ordering::Relaxed), 3);
    cancel.cancel();
    running.await.expect("worker task");
}
