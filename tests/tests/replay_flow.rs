//! Edit and replay never runs a handler twice: a message the relay gave up on may
//! have reached its queue all the same (a confirm that timed out after the frame
//! was written), and its replay, a new message, must be absorbed by an inbox that
//! recorded the original (issue 47, defect 2).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use outbox_adapters_memory::{
    ExchangeKind, MemoryAuditLog, MemoryBroker, MemoryInboxStore, MemoryOutboxStore,
};
use outbox_admin::{AdminPorts, AdminService};
use outbox_consumer::{ConsumerConfig, ConsumerWorker, HandlerRegistry, handler_fn};
use outbox_core::{Message, OutboxStatus, RetryPolicy};
use outbox_ports::{
    Clock, InboxStore, OutboxStore, PortError, PublishOutcome, Publisher, SystemClock,
};
use outbox_relay::{CancellationToken, Dispatcher, DispatcherConfig, LeaseFactory};

const CONSUMER: &str = "replayed";
const QUEUE: &str = "replayed.orders";

/// Hands every message to the broker, then reports the publish failed: as when the
/// confirm timed out after the frame was written.
struct DeliversThenFails(MemoryBroker);

#[async_trait]
impl Publisher for DeliversThenFails {
    async fn publish_within(&self, messages: &[Message], budget: Duration) -> Vec<PublishOutcome> {
        self.0
            .publish_within(messages, budget)
            .await
            .into_iter()
            .map(|o| match o {
                PublishOutcome::Confirmed => {
                    PublishOutcome::Failed(PortError::transient("confirm", "no confirm within 30s"))
                }
                other => other,
            })
            .collect()
    }

    async fn check(&self) -> Result<(), PortError> {
        self.0.check().await
    }
}

async fn until(what: &str, mut done: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !done().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_of_a_message_that_reached_its_consumer_takes_effect_once() {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let outbox = Arc::new(MemoryOutboxStore::new(Arc::clone(&clock)));
    let inbox = Arc::new(MemoryInboxStore::new(Arc::clone(&clock)));
    let broker = MemoryBroker::new();
    broker.declare_exchange("orders", ExchangeKind::Topic);
    broker.declare_queue(QUEUE);
    broker.bind(QUEUE, "orders", "#");
    let original = outbox_testkit::message("orders", "order.created");
    outbox
        .enqueue(vec![original.clone()])
        .await
        .expect("enqueue");

    let effects = Arc::new(AtomicU32::new(0));
    let fx = Arc::clone(&effects);
    let handlers = HandlerRegistry::new().on_type(
        "test.message",
        handler_fn(move |_m| {
            let fx = Arc::clone(&fx);
            async move {
                fx.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
        }),
    );
    let worker = ConsumerWorker::new(
        inbox.clone(),
        Arc::new(broker.clone()),
        handlers,
        clock.clone(),
        ConsumerConfig::new(CONSUMER, QUEUE),
    );
    let cancel = CancellationToken::new();
    let consumer = tokio::spawn(worker.run(cancel.clone()));
    let one_attempt = DispatcherConfig {
        idle_poll: Duration::from_millis(5),
        retry: RetryPolicy {
            max_attempts: 1,
            ..RetryPolicy::default()
        },
        ..DispatcherConfig::default()
    };

    // The relay delivers the message, hears of a failure, and gives up on it.
    let first = CancellationToken::new();
    let relay = tokio::spawn(
        Dispatcher::new(
            outbox.clone(),
            Arc::new(DeliversThenFails(broker.clone())),
            one_attempt.clone(),
            &LeaseFactory::instance_id("first"),
        )
        .run(first.clone()),
    );
    until("the original dead", async || {
        outbox.count(OutboxStatus::Dead) == 1
    })
    .await;
    until("the original consumed", async || {
        inbox.stats(CONSUMER).await.expect("stats").consumed == 1
    })
    .await;
    first.cancel();
    relay.await.expect("relay stops");
    assert_eq!(effects.load(Ordering::SeqCst), 1);

    // The operator replays it, unedited; a relay publishes the replay.
    let admin = AdminService::new(AdminPorts {
        outbox: outbox.clone(),
        inbox: inbox.clone(),
        audit: Arc::new(MemoryAuditLog::new(clock.clone())),
        outbox_store: outbox.clone(),
        pauses: Arc::new(outbox.pauses()),
    })
    .with_edit(true);
    let replay = admin
        .replay_message("operator", original.id, Default::default())
        .await
        .expect("replay");
    let second = CancellationToken::new();
    let relay = tokio::spawn(
        Dispatcher::new(
            outbox.clone(),
            Arc::new(broker.clone()),
            one_attempt,
            &LeaseFactory::instance_id("second"),
        )
        .run(second.clone()),
    );
    until("the replay sent", async || {
        outbox.count(OutboxStatus::Sent) == 1
    })
    .await;
    until("the replay delivered and acknowledged", async || {
        broker.queue_depth(QUEUE) == (0, 0)
    })
    .await;
    // Time for a handler that would run a second time.
    tokio::time::sleep(Duration::from_millis(300)).await;
    second.cancel();
    cancel.cancel();
    relay.await.expect("relay stops");
    consumer.await.expect("consumer stops");
    assert_eq!(
        effects.load(Ordering::SeqCst),
        1,
        "the replay {} of {} ran its handler again",
        replay.id,
        original.id
    );
}
