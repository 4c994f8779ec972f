//! The whole flow on shared memory adapters, with two of everything racing: two
//! dispatchers, two publish sweepers, two consumer workers on one queue and two
//! consume sweepers. Faults on every side; every message must take effect once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_adapters_memory::{
    ExchangeKind, MemoryBroker, MemoryInboxStore, MemoryLock, MemoryOutboxStore, MemorySweepState,
};
use outbox_consumer::{ConsumerConfig, ConsumerWorker, HandlerError, HandlerRegistry, handler_fn};
use outbox_core::{MessageId, OutboxStatus, RetryPolicy, SweepConfig};
use outbox_ports::{Clock, InboxStore, OutboxStore, SystemClock};
use outbox_relay::{
    CancellationToken, Dispatcher, DispatcherConfig, LeaseFactory, PublishRetryTask, RetrySweeper,
};

const N: usize = 2000;
const CONSUMER: &str = "e2e";
const QUEUE: &str = "e2e.orders";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_of_everything_deliver_each_message_once_in_effect() {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let outbox = Arc::new(MemoryOutboxStore::new(Arc::clone(&clock)));
    let inbox = Arc::new(MemoryInboxStore::new(Arc::clone(&clock)));
    let broker = MemoryBroker::new();
    broker.declare_exchange("orders", ExchangeKind::Topic);
    broker.declare_queue(QUEUE);
    broker.bind(QUEUE, "orders", "order.*");
    let lock = Arc::new(MemoryLock::new());
    let state = Arc::new(MemorySweepState::new(Arc::clone(&clock)));

    let msgs: Vec<_> = (0..N)
        .map(|_| outbox_testkit::message("orders", "order.created"))
        .collect();
    for chunk in msgs.chunks(250) {
        outbox.enqueue(chunk.to_vec()).await.expect("enqueue");
    }
    broker.fail_next_publishes(100);
    broker.nack_next_publishes(30);
    broker.return_next_publishes(20);
    broker.redeliver_next_acked(50);

    let retry = RetryPolicy {
        initial_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(100),
        max_attempts: 20,
    };
    let sweep = |base: SweepConfig| SweepConfig {
        interval: Duration::from_millis(50),
        lock_wait: Duration::from_millis(20),
        batch_size: 25,
        ..base
    };
    let effects: Arc<Mutex<HashMap<MessageId, u32>>> = Arc::default();
    let attempts: Arc<Mutex<HashMap<MessageId, u32>>> = Arc::default();
    let cancel = CancellationToken::new();
    let mut tasks = Vec::new();
    for i in 0..2 {
        let instance = LeaseFactory::instance_id(&format!("relay{i}"));
        let dispatcher = Dispatcher::new(
            outbox.clone(),
            Arc::new(broker.clone()),
            DispatcherConfig {
                batch_size: 40,
                idle_poll: Duration::from_millis(5),
                retry,
                ..DispatcherConfig::default()
            },
            &instance,
        );
        let publish_retry = PublishRetryTask::new(
            outbox.clone(),
            Arc::new(broker.clone()),
            retry,
            &instance,
            Duration::from_secs(30),
        );
        let relay_sweeper = RetrySweeper::new(
            sweep(SweepConfig::default()),
            lock.clone(),
            state.clone(),
            clock.clone(),
            Arc::new(publish_retry),
        );

        let (fx, tries) = (Arc::clone(&effects), Arc::clone(&attempts));
        let handlers = HandlerRegistry::new().on_type(
            "test.message",
            handler_fn(move |m| {
                let (fx, tries) = (Arc::clone(&fx), Arc::clone(&tries));
                async move {
                    let n = {
                        let mut t = tries.lock().expect("lock");
                        let n = t.entry(m.id).or_default();
                        *n += 1;
                        *n
                    };
                    // One message in twenty fails its first attempt.
                    if n == 1 && m.id.as_uuid().as_bytes()[15] % 20 == 0 {
                        return Err(HandlerError::from("transient handler failure"));
                    }
                    *fx.lock().expect("lock").entry(m.id).or_default() += 1;
                    Ok(())
                }
            }),
        );
        let worker = ConsumerWorker::new(
            inbox.clone(),
            Arc::new(broker.clone()),
            handlers,
            clock.clone(),
            ConsumerConfig {
                concurrency: 4,
                prefetch: 16,
                retry,
                ..ConsumerConfig::new(CONSUMER, QUEUE)
            },
        );
        let consume_sweeper = RetrySweeper::new(
            sweep(SweepConfig::for_consumer(CONSUMER)),
            lock.clone(),
            state.clone(),
            clock.clone(),
            Arc::new(worker.retry_task()),
        );
        tasks.push(tokio::spawn(dispatcher.run(cancel.clone())));
        tasks.push(tokio::spawn(relay_sweeper.run(cancel.clone())));
        tasks.push(tokio::spawn(worker.run(cancel.clone())));
        tasks.push(tokio::spawn(consume_sweeper.run(cancel.clone())));
    }

    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let s = inbox.stats(CONSUMER).await.expect("stats");
        if s.consumed as usize == N || tokio::time::Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cancel.cancel();
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(10), t)
            .await
            .expect("service stops")
            .expect("task");
    }

    let stats = inbox.stats(CONSUMER).await.expect("stats");
    assert_eq!(stats.consumed as usize, N, "lost messages: {stats:?}");
    assert_eq!(outbox.count(OutboxStatus::Sent) as usize, N);
    assert_eq!(outbox.count(OutboxStatus::Dead) + stats.dead, 0);
    let fx = effects.lock().expect("lock");
    assert_eq!(fx.len(), N, "every message took effect");
    let doubled: Vec<_> = fx.iter().filter(|(_, n)| **n > 1).collect();
    assert!(doubled.is_empty(), "effects happened twice: {doubled:?}");
    assert_eq!(broker.queue_depth(QUEUE), (0, 0));
    for m in &msgs {
        assert!(fx.contains_key(&m.id), "message {} never took effect", m.id);
    }
}
