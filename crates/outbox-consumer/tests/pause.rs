//! A consumer paused by an operator, on RabbitMQ with a quorum queue and a
//! delivery limit: it handles what the broker had sent it (the prefetch), acks
//! it, cancels its subscription and holds nothing; it never hands a delivery back
//! (each return would count against the limit). Resumed, it takes the rest; every
//! message takes effect once, none delivered twice. Its retry sweep runs no
//! handler while it is paused (on memory adapters).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lapin::options::{QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use outbox_adapters_memory::{MemoryInboxStore, MemoryOutboxStore};
use outbox_adapters_rabbitmq::{
    BindingSpec, ExchangeKind, ExchangeSpec, QueueSpec, RabbitPublisher, RabbitPublisherConfig,
    RabbitSubscriber, Topology,
};
use outbox_consumer::{
    CancellationToken, ConsumerConfig, ConsumerWorker, HandlerError, HandlerRegistry, SweepTask,
    handler_fn,
};
use outbox_core::{Message, MessageId, RetryPolicy};
use outbox_ports::{PauseKind, PauseStore, PublishOutcome, Publisher, SystemClock};
use outbox_testkit::services::TestUrls;

const NAME: &str = "billing";

/// How many messages were handled (each id once per effect).
type Effects = Arc<Mutex<HashMap<MessageId, u32>>>;

async fn ready_and_consumers(amqp: &lapin::Connection, queue: &str) -> (u32, u32) {
    let ch = amqp.create_channel().await.expect("channel");
    let q = ch
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("the queue");
    (q.message_count(), q.consumer_count())
}

async fn wait_for(what: &str, secs: u64, mut done: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    while !done().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_consumer_finishes_what_it_holds_and_takes_nothing_until_resumed() {
    let urls = TestUrls::from_env();
    let amqp = outbox_adapters_rabbitmq::connect(&urls.amqp, Duration::from_secs(5))
        .await
        .expect("RabbitMQ at OUTBOX_TEST_AMQP_URL");
    let key = outbox_testkit::unique_key("pause");
    let (exchange, queue) = (format!("pause.{key}.x"), format!("pause.{key}.q"));
    let (dlx, dlq) = (format!("pause.{key}.dlx"), format!("pause.{key}.dead"));
    Topology {
        exchanges: vec![ExchangeSpec {
            name: exchange.clone(),
            kind: ExchangeKind::Topic,
            durable: true,
            shards: 1,
        }],
        // A delivery limit of 1: any delivery handed back is dead-lettered at once.
        queues: vec![QueueSpec::quorum_with_limit(&queue, 1, &dlx, &dlq)],
        bindings: vec![BindingSpec {
            queue: queue.clone(),
            exchange: exchange.clone(),
            routing_key: "#".into(),
        }],
    }
    .declare(&amqp)
    .await
    .expect("a quorum queue");
    let msgs: Vec<Message> = (0..60)
        .map(|_| outbox_testkit::message(&exchange, "order.created"))
        .collect();
    let publisher = RabbitPublisher::new(RabbitPublisherConfig::new(urls.amqp.clone()));
    assert!(
        publisher
            .publish(&msgs)
            .await
            .iter()
            .all(|o| matches!(o, PublishOutcome::Confirmed))
    );

    let clock = Arc::new(SystemClock);
    let pauses = MemoryOutboxStore::new(clock.clone()).pauses();
    let inbox = Arc::new(MemoryInboxStore::new(clock.clone()).with_pauses(&pauses));
    let effects = Effects::default();
    let handlers = {
        let effects = Arc::clone(&effects);
        HandlerRegistry::new().fallback(handler_fn(move |m: Message| {
            let effects = Arc::clone(&effects);
            async move {
                tokio::time::sleep(Duration::from_millis(100)).await;
                *effects.lock().expect("lock").entry(m.id).or_default() += 1;
                Ok::<(), HandlerError>(())
            }
        }))
    };
    let config = ConsumerConfig {
        prefetch: 10,
        concurrency: 2,
        handler_timeout: Duration::from_secs(5),
        retry: RetryPolicy {
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(20),
            max_attempts: 5,
        },
        ..ConsumerConfig::new(NAME, &queue)
    };
    let worker = ConsumerWorker::new(
        inbox.clone(),
        Arc::new(RabbitSubscriber::new(urls.amqp.clone())),
        handlers,
        clock.clone(),
        config,
    );
    let counters = worker.counters();
    let cancel = CancellationToken::new();
    let running = tokio::spawn(worker.run(cancel.clone()));
    let handled = |e: &Effects| e.lock().expect("lock").len();

    wait_for("the first effects", 10, async || handled(&effects) >= 3).await;
    pauses
        .pause(PauseKind::Consumer, NAME, "ana")
        .await
        .expect("pause");
    // Within the pause check's second and the deliveries in hand, the consumer
    // has cancelled its subscription and holds nothing.
    wait_for("the consumer to cancel its subscription", 10, async || {
        ready_and_consumers(&amqp, &queue).await.1 == 0
    })
    .await;
    let at_pause = handled(&effects);
    let (ready, _) = ready_and_consumers(&amqp, &queue).await;
    assert_eq!(
        at_pause + ready as usize,
        msgs.len(),
        "every message is either handled or back in the queue unhandled: none is held"
    );
    assert!(ready > 0, "the pause left messages in the queue");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        handled(&effects),
        at_pause,
        "a paused consumer handled a delivery"
    );
    assert_eq!(ready_and_consumers(&amqp, &queue).await, (ready, 0));

    pauses
        .resume(PauseKind::Consumer, NAME)
        .await
        .expect("resume");
    wait_for("every message handled after the resume", 20, async || {
        handled(&effects) == msgs.len()
    })
    .await;
    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("the worker stops")
        .expect("worker task");
    let twice = effects
        .lock()
        .expect("lock")
        .values()
        .filter(|n| **n != 1)
        .count();
    assert_eq!(twice, 0, "a message took effect twice");
    assert_eq!(
        counters.duplicates.load(Ordering::SeqCst),
        0,
        "a delivery came twice"
    );
    let (dead, _) = ready_and_consumers(&amqp, &dlq).await;
    assert_eq!(dead, 0, "a delivery was handed back and dead-lettered");
    for q in [&queue, &dlq] {
        let ch = amqp.create_channel().await.expect("channel");
        let _ = ch
            .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
            .await;
    }
}

#[tokio::test]
async fn a_paused_consumers_retry_sweep_runs_no_handler() {
    use outbox_adapters_memory::MemoryBroker;
    use outbox_core::Decision;
    use outbox_ports::{InboxConsumerPath, Lease};

    let clock = Arc::new(SystemClock);
    let pauses = MemoryOutboxStore::new(clock.clone()).pauses();
    let inbox = Arc::new(MemoryInboxStore::new(clock.clone()).with_pauses(&pauses));
    let m = outbox_testkit::message("orders", "order.created");
    let lease = Lease::new("worker-1", Duration::from_secs(60));
    inbox
        .record_arrival(NAME, &m, &lease)
        .await
        .expect("arrival");
    inbox
        .mark_consume_failed(
            NAME,
            m.id,
            &lease,
            "boom",
            Decision::RetryAfter(Duration::ZERO),
        )
        .await
        .expect("failed");
    let effects = Effects::default();
    let handlers = {
        let effects = Arc::clone(&effects);
        HandlerRegistry::new().fallback(handler_fn(move |m: Message| {
            let effects = Arc::clone(&effects);
            async move {
                *effects.lock().expect("lock").entry(m.id).or_default() += 1;
                Ok::<(), HandlerError>(())
            }
        }))
    };
    let worker = ConsumerWorker::new(
        inbox,
        Arc::new(MemoryBroker::new()),
        handlers,
        clock,
        ConsumerConfig::new(NAME, "nowhere"),
    );
    let sweep = worker.retry_task();
    pauses
        .pause(PauseKind::Consumer, NAME, "ana")
        .await
        .expect("pause");
    assert_eq!(sweep.run_batch(10).await.expect("sweep").claimed, 0);
    assert!(
        effects.lock().expect("lock").is_empty(),
        "a paused consumer's handler ran"
    );
    pauses
        .resume(PauseKind::Consumer, NAME)
        .await
        .expect("resume");
    assert_eq!(sweep.run_batch(10).await.expect("sweep").claimed, 1);
    assert_eq!(effects.lock().expect("lock").get(&m.id), Some(&1));
}
