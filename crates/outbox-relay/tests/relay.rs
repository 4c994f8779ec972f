//! The relay (dispatcher and publish-retry task) on memory adapters: every message
//! ends sent, failed-and-scheduled or dead; none is lost or marked twice.

use outbox_ports::OutboxOperator as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::time::Duration;

use outbox_adapters_memory::{ExchangeKind, MemoryBroker, MemoryOutboxStore};
use outbox_core::{Message, MessageId, OutboxStatus, RetryPolicy, Timestamp};
use outbox_ports::{
    ClaimedMessage, Lease, MockPublisher, OutboxRelayPath, OutboxStore, PortError, PublishFailure,
    SystemClock,
};
use outbox_relay::dispatcher::publish_claimed;
use outbox_relay::{CancellationToken, Dispatcher, DispatcherConfig, PublishRetryTask, SweepTask};

const QUEUE: &str = "relay.test";

fn setup() -> (Arc<MemoryOutboxStore>, MemoryBroker) {
    let store = Arc::new(MemoryOutboxStore::new(Arc::new(SystemClock)));
    let broker = MemoryBroker::new();
    broker.declare_exchange("contract", ExchangeKind::Topic);
    broker.declare_queue(QUEUE);
    broker.bind(QUEUE, "contract", "#");
    (store, broker)
}

fn fast_retry(max_attempts: u32) -> RetryPolicy {
    RetryPolicy {
        initial_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(20),
        max_attempts,
    }
}

fn dispatcher(
    store: &Arc<MemoryOutboxStore>,
    broker: &MemoryBroker,
    retry: RetryPolicy,
) -> Dispatcher {
    Dispatcher::new(
        store.clone(),
        Arc::new(broker.clone()),
        DispatcherConfig {
            batch_size: 50,
            idle_poll: Duration::from_millis(5),
            retry,
            ..DispatcherConfig::default()
        },
        "relay-test",
    )
}

/// The publish-retry task over `store` and `broker` (5 attempts, fast backoff).
fn retry_task(store: &Arc<MemoryOutboxStore>, broker: &MemoryBroker) -> PublishRetryTask {
    PublishRetryTask::new(
        store.clone(),
        Arc::new(broker.clone()),
        fast_retry(5),
        "relay-test",
        Duration::from_secs(30),
    )
}

/// Enqueues `n` messages and dispatches them once with the first five publishes
/// failing: five end `PublishFailed` (attempt 1).
async fn enqueue_with_five_failed(store: &Arc<MemoryOutboxStore>, broker: &MemoryBroker, n: usize) {
    store
        .enqueue(outbox_testkit::messages(n))
        .await
        .expect("enqueue");
    broker.fail_next_publishes(5);
    dispatcher(store, broker, fast_retry(5))
        .run_once()
        .await
        .expect("batch");
    assert_eq!(store.count(OutboxStatus::PublishFailed), 5);
}

fn total(store: &MemoryOutboxStore) -> u64 {
    [
        OutboxStatus::Pending,
        OutboxStatus::PublishFailed,
        OutboxStatus::Sent,
        OutboxStatus::Dead,
    ]
    .into_iter()
    .map(|s| store.count(s))
    .sum()
}

#[tokio::test]
async fn every_outcome_is_recorded_and_nothing_is_lost() {
    let (store, broker) = setup();
    store
        .enqueue(outbox_testkit::messages(10))
        .await
        .expect("enqueue");
    broker.fail_next_publishes(2);
    broker.nack_next_publishes(1);
    broker.return_next_publishes(1);
    let counts = dispatcher(&store, &broker, fast_retry(5))
        .run_once()
        .await
        .expect("batch");
    assert_eq!(
        (counts.claimed, counts.sent, counts.failed, counts.dead),
        (10, 6, 4, 0)
    );
    assert_eq!(store.count(OutboxStatus::Sent), 6);
    assert_eq!(store.count(OutboxStatus::PublishFailed), 4);
    assert_eq!(
        broker.queue_depth(QUEUE).0,
        6,
        "only confirmed ones reached the queue"
    );
    let failed = store
        .oldest_messages(OutboxStatus::PublishFailed, 10)
        .await
        .expect("list");
    let errors: Vec<_> = failed
        .iter()
        .filter_map(|r| r.publish.last_error.clone())
        .collect();
    assert!(errors.iter().any(|e| e.contains("nacked")), "{errors:?}");
    assert!(
        errors.iter().any(|e| e.contains("unroutable")),
        "{errors:?}"
    );
    assert!(failed.iter().all(|r| r.publish.next_attempt_at.is_some()));
}

#[tokio::test]
async fn a_message_no_queue_is_bound_for_is_a_failure_not_a_send() {
    let (store, broker) = setup();
    let mut m = outbox_testkit::message("nowhere", "k");
    m.exchange = String::new(); // default exchange, routing key names no queue
    store.enqueue(vec![m.clone()]).await.expect("enqueue");
    dispatcher(&store, &broker, fast_retry(5))
        .run_once()
        .await
        .expect("batch");
    let rec = store.get_message(m.id).await.expect("get").expect("row");
    assert_eq!(rec.status, OutboxStatus::PublishFailed);
    assert!(
        rec.publish
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("NO_ROUTE"))
    );
}

#[tokio::test]
async fn the_last_failed_attempt_makes_the_message_dead() {
    let (store, broker) = setup();
    store
        .enqueue(outbox_testkit::messages(1))
        .await
        .expect("enqueue");
    broker.nack_next_publishes(1);
    let counts = dispatcher(&store, &broker, fast_retry(1))
        .run_once()
        .await
        .expect("batch");
    assert_eq!(counts.dead, 1);
    assert_eq!(store.count(OutboxStatus::Dead), 1);
}

#[tokio::test]
async fn a_publisher_that_returns_too_few_outcomes_cannot_mark_anything_sent() {
    let (store, _) = setup();
    store
        .enqueue(outbox_testkit::messages(3))
        .await
        .expect("enqueue");
    let mut publisher = MockPublisher::new();
    publisher
        .expect_publish_within()
        .returning(|_, _| Vec::new());
    let lease = Lease::new("holder", Duration::from_secs(30));
    let claimed = store.claim_pending(&lease, 10).await.expect("claim");
    let counts = publish_claimed(&*store, &publisher, &lease, claimed, &fast_retry(5), || 0.5)
        .await
        .expect("marks");
    assert_eq!((counts.sent, counts.failed), (0, 3));
    assert_eq!(store.count(OutboxStatus::PublishFailed), 3);
}

#[tokio::test]
async fn outcomes_of_an_expired_claim_are_fenced_off() {
    let (store, broker) = setup();
    store
        .enqueue(outbox_testkit::messages(2))
        .await
        .expect("enqueue");
    let old = Lease::new("old", Duration::from_millis(50));
    let claimed = store.claim_pending(&old, 10).await.expect("claim");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let new = Lease::new("new", Duration::from_secs(30));
    assert_eq!(
        store.claim_pending(&new, 10).await.expect("reclaim").len(),
        2
    );
    let counts = publish_claimed(&*store, &broker, &old, claimed, &fast_retry(5), || 0.5)
        .await
        .expect("marks");
    assert_eq!((counts.sent, counts.fenced), (0, 2));
    assert_eq!(
        store.count(OutboxStatus::Pending),
        2,
        "still the new holder's to mark"
    );
}

#[tokio::test]
async fn the_retry_task_brings_failures_to_sent() {
    let (store, broker) = setup();
    enqueue_with_five_failed(&store, &broker, 20).await;
    let task = retry_task(&store, &broker);
    let early = task.run_batch(50).await.expect("batch");
    assert_eq!(early.claimed, 0, "not due before the backoff");
    tokio::time::sleep(Duration::from_millis(30)).await;
    task.before_sweep().await.expect("housekeeping");
    let c = task.run_batch(50).await.expect("batch");
    assert_eq!((c.claimed, c.publish_retried, c.publish_failed), (5, 5, 0));
    assert_eq!(store.count(OutboxStatus::Sent), 20);
    assert_eq!(broker.queue_depth(QUEUE).0, 20);
    let rec = store
        .oldest_messages(OutboxStatus::Sent, 50)
        .await
        .expect("list");
    assert_eq!(rec.iter().filter(|r| r.publish.attempts == 2).count(), 5);
}

#[tokio::test]
async fn the_dispatcher_loop_sends_each_message_once_and_stops_on_cancel() {
    let (store, broker) = setup();
    let msgs: Vec<Message> = outbox_testkit::messages(500);
    store.enqueue(msgs).await.expect("enqueue");
    let cancel = CancellationToken::new();
    let handle = tokio::spawn(dispatcher(&store, &broker, fast_retry(5)).run(cancel.clone()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while store.count(OutboxStatus::Sent) < 500 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(2), handle)
        .await
        .expect("stops promptly")
        .expect("task");
    assert_eq!(store.count(OutboxStatus::Sent), 500);
    assert_eq!(
        broker.queue_depth(QUEUE).0,
        500,
        "each message published exactly once"
    );
    assert_eq!(total(&store), 500);
}

#[tokio::test]
async fn a_broker_outage_spends_no_attempt_and_everything_is_sent_once_it_is_back() {
    let (store, broker) = setup();
    let msgs = outbox_testkit::messages(120);
    store.enqueue(msgs.clone()).await.expect("enqueue");
    broker.set_unreachable(true);
    // Two attempts would make every message dead if the outage counted.
    let cancel = CancellationToken::new();
    let d = Dispatcher::new(
        store.clone(),
        Arc::new(broker.clone()),
        DispatcherConfig {
            batch_size: 50,
            idle_poll: Duration::from_millis(5),
            error_backoff: Duration::from_millis(20),
            retry: fast_retry(2),
            ..DispatcherConfig::default()
        },
        "relay-test",
    );
    let counters = Arc::new(outbox_relay::RelayCounters::default());
    let running = tokio::spawn(d.with_counters(counters.clone()).run(cancel.clone()));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(store.count(OutboxStatus::Pending), 120, "all still pending");
    assert_eq!(store.count(OutboxStatus::Dead), 0);
    for m in &msgs {
        let r = store.get_message(m.id).await.expect("get").expect("row");
        assert_eq!(r.publish.attempts, 0, "an outage spends no attempt");
    }
    assert!(
        counters.deferred.load(std::sync::atomic::Ordering::Relaxed) >= 120,
        "the deferred messages are counted"
    );
    broker.set_unreachable(false);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while store.count(OutboxStatus::Sent) < 120 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not all sent after the outage"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    cancel.cancel();
    running.await.expect("dispatcher");
    assert_eq!(
        broker.queue_depth(QUEUE).0,
        120,
        "each message published once"
    );
    assert_eq!(total(&store), 120);

    // The retry sweep gives unsent messages back too, and ends its sweep.
    enqueue_with_five_failed(&store, &broker, 5).await;
    tokio::time::sleep(Duration::from_millis(30)).await;
    broker.set_unreachable(true);
    let task = retry_task(&store, &broker);
    let e = task.run_batch(50).await.expect_err("the sweep stops");
    assert!(e.to_string().contains("cannot be reached"), "{e}");
    let failed = store
        .oldest_messages(OutboxStatus::PublishFailed, 50)
        .await
        .expect("list");
    assert_eq!(failed.len(), 5);
    assert!(
        failed.iter().all(|r| r.publish.attempts == 1),
        "no attempt spent"
    );
    broker.set_unreachable(false);
    let c = task.run_batch(50).await.expect("claimable again at once");
    assert_eq!(c.publish_retried, 5, "released, not left under a lease");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_pipelines_send_each_message_exactly_once() {
    let (store, broker) = setup();
    let msgs: Vec<Message> = outbox_testkit::messages(3_000);
    store.enqueue(msgs.clone()).await.expect("enqueue");
    let cancel = CancellationToken::new();
    let relay = relay_builder(&store, &broker)
        .dispatch(DispatcherConfig {
            batch_size: 40,
            idle_poll: Duration::from_millis(5),
            pipelines: 4,
            retry: fast_retry(5),
            ..DispatcherConfig::default()
        })
        .instance("pipelined")
        .start(&cancel);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while store.count(OutboxStatus::Sent) < 3_000 {
        assert!(tokio::time::Instant::now() < deadline, "not all sent");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let counters = relay.counters.clone();
    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(5), relay.join())
        .await
        .expect("stops promptly");
    assert_eq!(broker.queue_depth(QUEUE).0, 3_000, "each published once");
    assert_eq!(
        counters
            .published
            .load(std::sync::atomic::Ordering::Relaxed),
        3_000,
        "each marked sent once"
    );
    for m in msgs.iter().step_by(97) {
        let r = store.get_message(m.id).await.expect("get").expect("row");
        assert_eq!(r.publish.attempts, 1, "{r:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_batch_outlasting_its_lease_hands_nothing_over_after_the_lease_and_spends_no_attempt() {
    let store = Arc::new(MemoryOutboxStore::new(Arc::new(
        outbox_adapters_memory::TokioClock::starting_at(
            outbox_core::Timestamp::from_unix_timestamp(1_700_000_000).expect("valid"),
        ),
    )));
    let broker = MemoryBroker::new();
    broker.declare_exchange("contract", ExchangeKind::Topic);
    broker.declare_queue(QUEUE);
    broker.bind(QUEUE, "contract", "#");
    // Each message takes 10 ms to hand over; the lease lasts 100 ms: the whole batch
    // of 10 would take the lease and more.
    broker.set_publish_delay(Duration::from_millis(10));
    store
        .enqueue(outbox_testkit::messages(10))
        .await
        .expect("enqueue");
    let d = Dispatcher::new(
        store.clone(),
        Arc::new(broker.clone()),
        DispatcherConfig {
            batch_size: 10,
            lease_ttl: Duration::from_millis(100),
            retry: fast_retry(5),
            ..DispatcherConfig::default()
        },
        "relay-test",
    );
    let started = tokio::time::Instant::now();
    let counts = d.run_once().await.expect("batch");
    assert!(
        started.elapsed() <= Duration::from_millis(100),
        "the batch ended within its lease: {:?}",
        started.elapsed()
    );
    assert_eq!(
        (counts.sent, counts.unsent, counts.failed, counts.dead),
        (8, 2, 0, 0),
        "8 handed over before the lease's margin, the rest given back: {counts:?}"
    );
    assert_eq!(broker.queue_depth(QUEUE).0, 8);
    let pending = store
        .oldest_messages(OutboxStatus::Pending, 10)
        .await
        .expect("list");
    assert_eq!(pending.len(), 2);
    assert!(
        pending.iter().all(|r| r.publish.attempts == 0),
        "no attempt spent"
    );
    // Given back: the next batch takes them at once.
    let counts = d.run_once().await.expect("batch");
    assert_eq!(counts.sent, 2);
    assert_eq!(store.count(OutboxStatus::Sent), 10);
}

#[tokio::test]
async fn a_message_amqp_cannot_carry_is_dead_at_once_and_the_others_are_sent() {
    let (store, broker) = setup();
    let mut msgs = outbox_testkit::messages(5);
    // Written around validation, as a row from before the table's constraints.
    msgs[2].routing_key = "k".repeat(300);
    let bad = msgs[2].id;
    store.insert_unchecked(msgs);
    let counts = dispatcher(&store, &broker, fast_retry(5))
        .run_once()
        .await
        .expect("batch");
    assert_eq!(
        (counts.sent, counts.dead, counts.failed),
        (4, 1, 0),
        "{counts:?}"
    );
    let r = store.get_message(bad).await.expect("get").expect("row");
    assert_eq!(r.status, OutboxStatus::Dead);
    assert!(
        r.publish
            .last_error
            .unwrap_or_default()
            .contains("routing_key"),
        "the reason names the field"
    );
}

/// A batch that outlasts its lease's budget is not a broker outage: the rest is
/// given back and the dispatcher goes on at once, instead of pausing 1 s, 2 s, 4 s...
/// as it does when the broker cannot be reached.
#[tokio::test]
async fn batches_outlasting_their_lease_do_not_pause_the_dispatcher_as_an_outage_would() {
    let (store, broker) = setup();
    // 10 ms a message, a 100 ms lease, batches of 10: every batch gives some back.
    broker.set_publish_delay(Duration::from_millis(10));
    store
        .enqueue(outbox_testkit::messages(40))
        .await
        .expect("enqueue");
    let d = Dispatcher::new(
        store.clone(),
        Arc::new(broker.clone()),
        DispatcherConfig {
            batch_size: 10,
            lease_ttl: Duration::from_millis(100),
            error_backoff: Duration::from_secs(1),
            retry: fast_retry(5),
            ..DispatcherConfig::default()
        },
        "relay-test",
    );
    let cancel = CancellationToken::new();
    let task = tokio::spawn(d.run(cancel.clone()));
    let started = std::time::Instant::now();
    while store.count(OutboxStatus::Sent) < 40 && started.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let took = started.elapsed();
    cancel.cancel();
    task.await.expect("dispatcher");
    assert_eq!(store.count(OutboxStatus::Sent), 40);
    // 40 messages at 10 ms each is 0.4 s of publishing; one outage pause alone is 1 s.
    assert!(
        took < Duration::from_millis(1_000),
        "the dispatcher paused as for an outage: {took:?}"
    );
    let pending = store
        .oldest_messages(OutboxStatus::Sent, 40)
        .await
        .expect("list");
    assert!(
        pending.iter().all(|r| r.publish.attempts == 1),
        "one attempt each"
    );
}

/// An idle relay wakes for a delayed message's due time, not only at its poll: with
/// a 30 s poll, a message due in 1.5 s is published within a second of it, and not
/// before. (Enqueueing wakes a PostgreSQL relay through NOTIFY; here the message is
/// there before the relay starts, so only the timer can wake it in time.)
#[tokio::test]
async fn a_delayed_message_is_published_at_its_due_time_by_an_idle_relay() {
    let (store, broker) = setup();
    let mut m = outbox_testkit::message("contract", "later");
    let due = outbox_core::Timestamp::now_utc() + time::Duration::milliseconds(1500);
    m.not_before = Some(due);
    store.enqueue(vec![m.clone()]).await.expect("enqueue");
    let cancel = CancellationToken::new();
    let relay = tokio::spawn(
        Dispatcher::new(
            store.clone(),
            Arc::new(broker.clone()),
            DispatcherConfig {
                idle_poll: Duration::from_secs(30),
                ..DispatcherConfig::default()
            },
            "relay-delayed",
        )
        .run(cancel.clone()),
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let published = loop {
        let record = store.get_message(m.id).await.expect("get").expect("stored");
        if record.status == OutboxStatus::Sent {
            break record.publish.completed_at.expect("sent at");
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not published within 10 s: the relay waited for its 30 s poll"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    cancel.cancel();
    relay.await.expect("relay");
    assert!(
        published >= due,
        "published at {published}, before its due time {due}"
    );
    assert!(
        published - due < time::Duration::seconds(1),
        "published {} after its due time",
        published - due
    );
    assert_eq!(broker.queue_depth(QUEUE).0, 1);
}

/// Per-key ordering through two relays at once (and the retry sweep): 20 keys of
/// 50 messages each; key k0's messages go to an exchange that does not exist yet,
/// so its first message fails and is retried. Every other key's messages all
/// arrive meanwhile, each key in order; k0 delivers nothing until its exchange
/// appears, then all of it, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_relays_keep_each_keys_order_and_a_failing_key_holds_back_only_itself() {
    let (store, broker) = setup();
    let now = outbox_core::Timestamp::now_utc();
    let mut messages = Vec::new();
    for i in 0..50 {
        for k in 0..20 {
            let exchange = if k == 0 { "late" } else { "contract" };
            messages.push(
                outbox_core::NewMessage::new(exchange, "ordered", format!("k{k}:{i}").into_bytes())
                    .with_ordering_key(format!("k{k}"))
                    .into_message(outbox_core::MessageId::from_uuid(uuid::Uuid::now_v7()), now),
            );
        }
    }
    store.enqueue(messages).await.expect("enqueue");
    let cancel = CancellationToken::new();
    let mut relays = Vec::new();
    for name in ["relay-a", "relay-b"] {
        relays.push(tokio::spawn(
            Dispatcher::new(
                store.clone(),
                Arc::new(broker.clone()),
                DispatcherConfig {
                    batch_size: 7,
                    idle_poll: Duration::from_millis(5),
                    retry: fast_retry(10_000),
                    ..DispatcherConfig::default()
                },
                name,
            )
            .run(cancel.clone()),
        ));
    }
    let retries = PublishRetryTask::new(
        store.clone(),
        Arc::new(broker.clone()),
        fast_retry(10_000),
        "relay-sweep",
        Duration::from_secs(30),
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while broker.queue_depth(QUEUE).0 < 950 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the other keys are held back"
        );
        retries.run_batch(100).await.expect("retry");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(broker.queue_depth(QUEUE).0, 950, "nothing of k0 yet");
    broker.declare_exchange("late", ExchangeKind::Topic);
    broker.bind(QUEUE, "late", "#");
    while broker.queue_depth(QUEUE).0 < 1000 {
        assert!(tokio::time::Instant::now() < deadline, "k0 did not drain");
        retries.run_batch(100).await.expect("retry");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    cancel.cancel();
    for r in relays {
        r.await.expect("relay");
    }
    assert_each_key_in_order(&broker, 20, 50).await;
}

/// One ordering key's messages follow each other without waiting for the idle
/// poll: when a batch's mark sends the key's head, the next claim takes the next
/// one at once (the claim that ran while the mark was in flight found the key held
/// back). With a 30 s poll, 20 messages of one key go out within seconds, in order.
#[tokio::test]
async fn a_keys_next_message_goes_out_as_soon_as_its_head_is_marked() {
    let (store, broker) = setup();
    let now = outbox_core::Timestamp::now_utc();
    let messages: Vec<Message> = (0..20)
        .map(|i| {
            outbox_core::NewMessage::new("contract", "ordered", format!("{i}").into_bytes())
                .with_ordering_key("one-key")
                .into_message(outbox_core::MessageId::from_uuid(uuid::Uuid::now_v7()), now)
        })
        .collect();
    store.enqueue(messages).await.expect("enqueue");
    let cancel = CancellationToken::new();
    let relay = tokio::spawn(
        Dispatcher::new(
            store.clone(),
            Arc::new(broker.clone()),
            DispatcherConfig {
                idle_poll: Duration::from_secs(30),
                ..DispatcherConfig::default()
            },
            "relay-one-key",
        )
        .run(cancel.clone()),
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while broker.queue_depth(QUEUE).0 < 20 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of 20 published: the relay waited for its poll between a key's messages",
            broker.queue_depth(QUEUE).0
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    cancel.cancel();
    relay.await.expect("relay");
}

/// The memory store, counting the dispatcher's claims: those that came back empty,
/// and those that took rows while an earlier batch was still unmarked (claimed, its
/// `mark_sent` not called yet), i.e. claims overlapped with a mark.
struct CountingStore {
    inner: Arc<MemoryOutboxStore>,
    empty_claims: AtomicU64,
    overlapped_claims: AtomicU64,
    unmarked_batches: AtomicU64,
}

impl CountingStore {
    fn new(inner: Arc<MemoryOutboxStore>) -> Self {
        Self {
            inner,
            empty_claims: 0.into(),
            overlapped_claims: 0.into(),
            unmarked_batches: 0.into(),
        }
    }

    fn empty_claims(&self) -> u64 {
        self.empty_claims.load(SeqCst)
    }

    fn overlapped_claims(&self) -> u64 {
        self.overlapped_claims.load(SeqCst)
    }
}

#[async_trait::async_trait]
impl OutboxRelayPath for CountingStore {
    async fn claim_pending(
        &self,
        lease: &Lease,
        limit: u32,
    ) -> Result<Vec<ClaimedMessage>, PortError> {
        let claimed = self.inner.claim_pending(lease, limit).await?;
        if claimed.is_empty() {
            self.empty_claims.fetch_add(1, SeqCst);
        } else if self.unmarked_batches.fetch_add(1, SeqCst) > 0 {
            self.overlapped_claims.fetch_add(1, SeqCst);
        }
        Ok(claimed)
    }

    async fn claim_due_retries(
        &self,
        lease: &Lease,
        limit: u32,
    ) -> Result<Vec<ClaimedMessage>, PortError> {
        self.inner.claim_due_retries(lease, limit).await
    }

    async fn mark_sent(&self, lease: &Lease, ids: &[MessageId]) -> Result<u64, PortError> {
        // Every claimed batch's mark starts with its `mark_sent`.
        self.unmarked_batches.fetch_sub(1, SeqCst);
        self.inner.mark_sent(lease, ids).await
    }

    async fn mark_publish_failed(
        &self,
        lease: &Lease,
        failures: &[PublishFailure],
    ) -> Result<u64, PortError> {
        self.inner.mark_publish_failed(lease, failures).await
    }

    async fn release(&self, lease: &Lease, ids: &[MessageId]) -> Result<u64, PortError> {
        self.inner.release(lease, ids).await
    }

    async fn recover_expired_leases(&self) -> Result<u64, PortError> {
        self.inner.recover_expired_leases().await
    }

    async fn next_due_in(&self) -> Result<Option<Duration>, PortError> {
        self.inner.next_due_in().await
    }
}

/// `per_key` messages of each of `keys` ordering keys, round-robin (key 0's first,
/// key 1's first, ..., key 0's second, ...).
fn keyed_backlog(keys: usize, per_key: usize) -> Vec<Message> {
    let now = Timestamp::now_utc();
    let mut messages = Vec::with_capacity(keys * per_key);
    for i in 0..per_key {
        for k in 0..keys {
            messages.push(
                outbox_core::NewMessage::new(
                    "contract",
                    "ordered",
                    format!("k{k}:{i}").into_bytes(),
                )
                .with_ordering_key(format!("k{k}"))
                .into_message(MessageId::from_uuid(uuid::Uuid::now_v7()), now),
            );
        }
    }
    messages
}

/// A dispatcher over `store` in batches of 40, polling every `idle_poll` when
/// idle, run until `cancel` fires.
fn spawn_counted_dispatcher(
    store: &Arc<CountingStore>,
    broker: &MemoryBroker,
    idle_poll: Duration,
    name: &str,
    cancel: &CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(
        Dispatcher::new(
            store.clone(),
            Arc::new(broker.clone()),
            DispatcherConfig {
                batch_size: 40,
                idle_poll,
                ..DispatcherConfig::default()
            },
            name,
        )
        .run(cancel.clone()),
    )
}

/// Waits until `n` messages of `store` are sent (10 s at most).
async fn until_sent(store: &MemoryOutboxStore, n: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while store.count(OutboxStatus::Sent) < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of {n} sent",
            store.count(OutboxStatus::Sent)
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Reads the queue back: `keys` keys of `per_key` messages (bodies `k<i>:<n>`),
/// each key's in order and each message once.
async fn assert_each_key_in_order(broker: &MemoryBroker, keys: usize, per_key: u32) {
    use outbox_ports::Subscriber as _;
    let total = keys * per_key as usize;
    let mut stream = broker
        .subscribe(QUEUE, u16::try_from(total).unwrap_or(u16::MAX))
        .await
        .expect("subscribe");
    let mut next_of: std::collections::HashMap<String, u32> = std::collections::HashMap::new();
    for _ in 0..total {
        let d = stream.next().await.expect("a delivery").expect("delivered");
        let body = String::from_utf8(d.envelope.body.clone()).expect("utf-8");
        let (key, n) = body.split_once(':').expect("key:n");
        let n: u32 = n.parse().expect("n");
        let expected = next_of.entry(key.to_owned()).or_default();
        assert_eq!(n, *expected, "{key} out of order");
        *expected += 1;
        d.acker.ack().await.expect("ack");
    }
    assert_eq!(next_of.len(), keys);
    assert!(next_of.values().all(|n| *n == per_key));
    assert_eq!(broker.queue_depth(QUEUE).0, 0, "each message once");
}

/// 40 keys of 25 messages drained by one counted dispatcher with batches of 40
/// (its idle poll is 30 s, so no idle claim after the drain is counted).
async fn drain_40_keys_of_25(name: &str) -> (Arc<CountingStore>, MemoryBroker) {
    let (memory, broker) = setup();
    memory
        .enqueue(keyed_backlog(40, 25))
        .await
        .expect("enqueue");
    let store = Arc::new(CountingStore::new(memory.clone()));
    let cancel = CancellationToken::new();
    let relay = spawn_counted_dispatcher(&store, &broker, Duration::from_secs(30), name, &cancel);
    until_sent(&memory, 1_000).await;
    cancel.cancel();
    relay.await.expect("relay");
    (store, broker)
}

/// As many ordering keys as the batch holds: every batch holds each key's head, so
/// nothing is claimable until its mark is done. A claim made while that batch is
/// in flight (claimed ahead while it is published, or while its mark runs) comes
/// back empty; the dispatcher must not pay that empty claim for every batch.
#[tokio::test]
async fn keyed_batches_do_not_each_pay_an_empty_claim_while_their_mark_is_in_flight() {
    let (store, broker) = drain_40_keys_of_25("relay-keyed").await;
    assert_eq!(broker.queue_depth(QUEUE).0, 1_000, "each message once");
    // The first empty claim (the keys hold it back), which halves the claims,
    // and the one that finds the backlog drained; not one per batch (25).
    let empty = store.empty_claims();
    assert!(
        empty <= 5,
        "{empty} empty claims for 25 batches: the claim made while a mark is in flight is paid every batch"
    );
}

/// As many ordering keys as the batch holds (40 keys of 25, batches of 40): the
/// dispatcher halves its claims so that two batches hold different keys, and
/// claims overlap marks again, each key still in order. Without the halving, every
/// claim would wait for the previous batch's mark (none overlapped and took rows).
#[tokio::test]
async fn keyed_claims_overlap_marks_again_at_half_the_batch_each_key_in_order() {
    let (store, broker) = drain_40_keys_of_25("relay-halves").await;
    // About 50 claims of 20 after the first full one; all but the first few
    // overlap the previous batch's mark.
    let overlapped = store.overlapped_claims();
    assert!(
        overlapped >= 40,
        "only {overlapped} keyed claims ran while the previous batch was marked"
    );
    assert_each_key_in_order(&broker, 40, 25).await;
}

/// After a keyed backlog that stopped the overlapping of claims and marks, unkeyed
/// messages are claimed while the previous batch is being marked again: the relay's
/// unkeyed throughput is not lost to the keyed traffic before.
#[tokio::test]
async fn unkeyed_claims_overlap_marks_again_after_a_keyed_backlog() {
    let (memory, broker) = setup();
    let store = Arc::new(CountingStore::new(memory.clone()));
    let cancel = CancellationToken::new();
    let relay = spawn_counted_dispatcher(
        &store,
        &broker,
        Duration::from_millis(5),
        "relay-mixed",
        &cancel,
    );
    // 3 keyed batches (40 keys of 3 messages).
    memory.enqueue(keyed_backlog(40, 3)).await.expect("enqueue");
    until_sent(&memory, 120).await;
    // Idle: two empty claims after the drain, the second with no mark in flight
    // (the first may still have had the last keyed mark in hand), so overlapping
    // is back as it is for any idle relay. Enqueued earlier, the unkeyed rows
    // could be taken by the claim after that mark instead, and the first 16
    // unkeyed batches would then finish their marks first.
    let idle_from = store.empty_claims();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while store.empty_claims() < idle_from + 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the drained relay made no empty claims"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let before = store.overlapped_claims();
    // 50 unkeyed batches: each but the first (nothing in flight then) can overlap.
    memory
        .enqueue(outbox_testkit::messages(2_000))
        .await
        .expect("enqueue");
    until_sent(&memory, 2_120).await;
    cancel.cancel();
    relay.await.expect("relay");
    let overlapped = store.overlapped_claims() - before;
    assert!(
        overlapped >= 45,
        "only {overlapped} of 50 unkeyed batches were claimed while the previous one was marked"
    );
}

/// The memory broker, publishing after a pause (so the dispatcher claims its next
/// batch meanwhile), and asking the relay to stop once the first batch is out.
struct SlowThenStop {
    inner: MemoryBroker,
    stop: CancellationToken,
}

#[async_trait::async_trait]
impl outbox_ports::Publisher for SlowThenStop {
    async fn publish_within(
        &self,
        messages: &[Message],
        budget: Duration,
    ) -> Vec<outbox_ports::PublishOutcome> {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let outcomes = self.inner.publish_within(messages, budget).await;
        self.stop.cancel();
        outcomes
    }

    async fn check(&self) -> Result<(), PortError> {
        self.inner.check().await
    }
}

/// The batch the dispatcher claimed while publishing the last one is given back
/// untouched when it stops: claimable at once by another relay, no attempt spent,
/// never published.
#[tokio::test]
async fn a_batch_claimed_ahead_is_given_back_untouched_at_shutdown() {
    let (store, broker) = setup();
    store
        .enqueue(outbox_testkit::messages(100))
        .await
        .expect("enqueue");
    let cancel = CancellationToken::new();
    let claims = Arc::new(CountingStore::new(store.clone()));
    let d = Dispatcher::new(
        claims.clone(),
        Arc::new(SlowThenStop {
            inner: broker.clone(),
            stop: cancel.clone(),
        }),
        DispatcherConfig {
            batch_size: 40,
            idle_poll: Duration::from_millis(5),
            ..DispatcherConfig::default()
        },
        "relay-ahead",
    );
    tokio::time::timeout(Duration::from_secs(5), d.run(cancel.clone()))
        .await
        .expect("stops promptly");
    assert_eq!(
        store.count(OutboxStatus::Sent),
        40,
        "the batch in flight is finished"
    );
    assert_eq!(broker.queue_depth(QUEUE).0, 40, "and only it was published");
    assert_eq!(
        claims.overlapped_claims(),
        1,
        "the next batch was claimed while the first was published"
    );
    let other = Lease::new("other-relay", Duration::from_secs(30));
    let rest = store.claim_pending(&other, 1_000).await.expect("claim");
    assert_eq!(
        rest.len(),
        60,
        "nothing is left under the stopped relay's lease"
    );
    assert!(rest.iter().all(|c| c.attempts == 0), "no attempt spent");
}

/// While the broker cannot be reached, the batch claimed ahead is given back at
/// once rather than held through the outage pause: another relay can take every
/// row meanwhile, and no attempt is spent.
#[tokio::test]
async fn a_batch_claimed_ahead_is_given_back_when_the_broker_is_unreachable() {
    let (store, broker) = setup();
    store
        .enqueue(outbox_testkit::messages(100))
        .await
        .expect("enqueue");
    broker.set_unreachable(true);
    let claims = Arc::new(CountingStore::new(store.clone()));
    let cancel = CancellationToken::new();
    let d = Dispatcher::new(
        claims.clone(),
        Arc::new(broker.clone()),
        DispatcherConfig {
            batch_size: 40,
            idle_poll: Duration::from_millis(5),
            // The pause after the first failed batch outlasts the test.
            error_backoff: Duration::from_secs(30),
            ..DispatcherConfig::default()
        },
        "relay-outage",
    );
    let running = tokio::spawn(d.run(cancel.clone()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while claims.overlapped_claims() < 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no batch was claimed ahead"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let other = Lease::new("other-relay", Duration::from_secs(30));
    let rows = store.claim_pending(&other, 1_000).await.expect("claim");
    assert_eq!(
        rows.len(),
        100,
        "the pausing relay holds no rows (the failed batch and the one claimed ahead are given back)"
    );
    assert!(
        rows.iter().all(|c| c.attempts == 0),
        "an outage spends no attempt"
    );
    cancel.cancel();
    running.await.expect("dispatcher");
}

/// Keyed traffic with a publish that takes time, so every claim ahead really runs
/// while a batch is out: each key's messages still arrive in order and once, with
/// two relays claiming from the same store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_ahead_keep_each_keys_order_while_publishes_take_time() {
    let (memory, broker) = setup();
    broker.set_publish_delay(Duration::from_millis(3));
    memory
        .enqueue(keyed_backlog(30, 12))
        .await
        .expect("enqueue");
    let store = Arc::new(CountingStore::new(memory.clone()));
    let cancel = CancellationToken::new();
    let a = spawn_counted_dispatcher(
        &store,
        &broker,
        Duration::from_millis(5),
        "relay-a",
        &cancel,
    );
    let b = spawn_counted_dispatcher(
        &store,
        &broker,
        Duration::from_millis(5),
        "relay-b",
        &cancel,
    );
    until_sent(&memory, 360).await;
    cancel.cancel();
    a.await.expect("relay a");
    b.await.expect("relay b");
    assert!(
        store.overlapped_claims() > 0,
        "no claim ran while a batch was in flight"
    );
    assert_each_key_in_order(&broker, 30, 12).await;
}

/// A clock `skew` away from this machine's: the store's, where the database's
/// clock differs from the relay's.
struct SkewedClock(time::Duration);

impl outbox_ports::Clock for SkewedClock {
    fn now(&self) -> Timestamp {
        Timestamp::now_utc() + self.0
    }
}

/// An idle relay waits for a delayed message by the store's clock, whichever way the
/// relay's own clock is off: it neither claims in a loop (its clock ahead: the due
/// time looks past) nor publishes late (behind: it looks further off than it is).
#[tokio::test]
async fn the_idle_wait_for_a_delayed_message_follows_the_stores_clock() {
    for skew in [time::Duration::seconds(-10), time::Duration::seconds(10)] {
        let clock = Arc::new(SkewedClock(skew));
        let store = MemoryOutboxStore::new(clock.clone());
        let mut m = outbox_testkit::message("orders", "later");
        m.not_before = Some(outbox_ports::Clock::now(&*clock) + time::Duration::seconds(1));
        store.enqueue(vec![m]).await.expect("enqueue");
        let wait = outbox_relay::dispatcher::idle_wait(&store, Duration::from_secs(30)).await;
        assert!(
            wait >= Duration::from_millis(900) && wait <= Duration::from_millis(1100),
            "the store's clock {skew} from the relay's: waited {wait:?} for a message due in 1 s"
        );
    }
}

/// A publish layer that stamps each message and counts the outcomes it is told.
#[derive(Default)]
struct Stamping {
    told: Arc<std::sync::Mutex<Vec<bool>>>,
}

impl outbox_relay::PublishLayer for Stamping {
    fn before_publish(
        &self,
        batch: &mut [outbox_relay::layer::Outgoing<'_>],
    ) -> outbox_relay::layer::AfterPublish {
        for m in batch.iter_mut() {
            m.headers.insert("x-stamped".to_owned(), "yes".to_owned());
        }
        let told = Arc::clone(&self.told);
        Box::new(move |outcomes| {
            let mut told = told
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            told.extend(
                outcomes
                    .iter()
                    .map(outbox_ports::PublishOutcome::is_confirmed),
            );
        })
    }
}

/// A publish layer that adds a header AMQP cannot carry to the messages with
/// this routing key.
struct Oversized;

impl outbox_relay::PublishLayer for Oversized {
    fn before_publish(
        &self,
        batch: &mut [outbox_relay::layer::Outgoing<'_>],
    ) -> outbox_relay::layer::AfterPublish {
        for m in batch.iter_mut().filter(|m| m.routing_key == "too.big") {
            m.headers.insert("x-huge".to_owned(), "x".repeat(70_000));
        }
        Box::new(|_| {})
    }
}

#[tokio::test]
async fn headers_a_layer_adds_that_amqp_cannot_carry_make_only_that_message_dead() {
    let (store, broker) = setup();
    let good = outbox_testkit::message("contract", "fine");
    let bad = outbox_testkit::message("contract", "too.big");
    store
        .enqueue(vec![good.clone(), bad.clone()])
        .await
        .expect("enqueue");
    let d =
        dispatcher(&store, &broker, fast_retry(5)).with_publish_layer(Some(Arc::new(Oversized)));
    let counts = d.run_once().await.expect("batch");
    assert_eq!((counts.sent, counts.dead), (1, 1));
    let dead = store.get_message(bad.id).await.expect("get").expect("row");
    assert_eq!(dead.status, OutboxStatus::Dead);
    assert!(
        dead.publish
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("publish layer")),
        "{:?}",
        dead.publish.last_error
    );
    assert_eq!(broker.queue_depth(QUEUE).0, 1, "only the good one went out");
}

#[tokio::test]
async fn a_publish_layer_changes_what_goes_out_and_is_told_each_outcome() {
    use outbox_ports::Subscriber as _;
    let (store, broker) = setup();
    store
        .enqueue(outbox_testkit::messages(3))
        .await
        .expect("enqueue");
    let layer = Stamping::default();
    let told = Arc::clone(&layer.told);
    let d = dispatcher(&store, &broker, fast_retry(5)).with_publish_layer(Some(Arc::new(layer)));
    let counts = d.run_once().await.expect("batch");
    assert_eq!(counts.sent, 3);
    assert_eq!(
        *told
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
        [true, true, true]
    );
    let mut stream = broker.subscribe(QUEUE, 10).await.expect("subscribe");
    for _ in 0..3 {
        let delivery = stream.next().await.expect("a delivery").expect("ok");
        assert_eq!(
            delivery
                .envelope
                .headers
                .get("x-stamped")
                .map(String::as_str),
            Some("yes")
        );
        // Acknowledged: a delivery dropped unacknowledged would come again.
        delivery.acker.ack().await.expect("ack");
    }
    // Without a layer, messages go out as stored.
    store
        .enqueue(outbox_testkit::messages(1))
        .await
        .expect("enqueue");
    let plain = dispatcher(&store, &broker, fast_retry(5)).with_publish_layer(None);
    assert_eq!(plain.run_once().await.expect("batch").sent, 1);
    let delivery = stream.next().await.expect("a delivery").expect("ok");
    assert!(
        !delivery.envelope.headers.contains_key("x-stamped"),
        "{:?} {:?}",
        delivery.envelope.message_id,
        delivery.envelope.headers
    );
}

/// A relay over `store` and `broker`, with a lock and a sweep state in memory.
fn relay_builder(
    store: &Arc<MemoryOutboxStore>,
    broker: &MemoryBroker,
) -> outbox_relay::RelayBuilder {
    outbox_relay::RelayBuilder::new(
        store.clone(),
        Arc::new(broker.clone()),
        Arc::new(outbox_adapters_memory::MemoryLock::new()),
        Arc::new(outbox_adapters_memory::MemorySweepState::new(Arc::new(
            SystemClock,
        ))),
    )
}

/// A relay of two pipelines over `store` and `broker` adding to a throughput log
/// in memory, and the log.
fn relay_with_a_log(
    store: &Arc<MemoryOutboxStore>,
    broker: &MemoryBroker,
    batch_size: u32,
    retry: RetryPolicy,
    cancel: &CancellationToken,
) -> (
    outbox_relay::RelayHandles,
    Arc<outbox_adapters_memory::MemoryThroughputLog>,
) {
    let log = Arc::new(outbox_adapters_memory::MemoryThroughputLog::new(Arc::new(
        SystemClock,
    )));
    let relay = relay_builder(store, broker)
        .dispatch(DispatcherConfig {
            batch_size,
            idle_poll: Duration::from_millis(5),
            pipelines: 2,
            retry,
            ..DispatcherConfig::default()
        })
        .throughput(log.clone())
        .start(cancel);
    (relay, log)
}

/// With a throughput log, each exchange's confirmed publishes and failed attempts
/// are added under its name (its own chart) besides the totals of all, the last
/// of them as the relay stops.
#[tokio::test]
async fn a_relay_records_each_exchanges_publishes_and_failed_attempts() {
    use outbox_ports::{ChartWindow, ThroughputKind, ThroughputLog};
    let (store, broker) = setup();
    broker.declare_exchange("audit", ExchangeKind::Topic);
    broker.bind(QUEUE, "audit", "#");
    let mut msgs = outbox_testkit::messages(20);
    msgs.extend((0..5).map(|i| outbox_testkit::message("audit", &format!("a{i}"))));
    // The default exchange with a routing key no queue is named for: NO_ROUTE.
    msgs.extend((0..3).map(|i| {
        let mut m = outbox_testkit::message("nowhere", &format!("n{i}"));
        m.exchange = "lost".to_owned();
        m
    }));
    broker.declare_exchange("lost", ExchangeKind::Topic);
    store.enqueue(msgs).await.expect("enqueue");
    let cancel = CancellationToken::new();
    // The first failure is the last: each failing message counts once.
    let (relay, log) = relay_with_a_log(&store, &broker, 7, fast_retry(1), &cancel);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while store.count(OutboxStatus::Sent) < 25 || store.count(OutboxStatus::Dead) < 3 {
        assert!(tokio::time::Instant::now() < deadline, "not all done");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(5), relay.join())
        .await
        .expect("stops promptly");
    let named = async |kind| {
        log.named_totals(kind, ChartWindow::Hour)
            .await
            .expect("read")
    };
    assert_eq!(
        named(ThroughputKind::Published).await,
        vec![("audit".to_owned(), 5), ("contract".to_owned(), 20)]
    );
    assert_eq!(
        named(ThroughputKind::PublishFailed).await,
        vec![("lost".to_owned(), 3)]
    );
    let total = log
        .per_minute(ThroughputKind::Published, Duration::from_secs(3600))
        .await
        .expect("read")
        .iter()
        .map(|m| m.count)
        .sum::<u64>();
    assert_eq!(total, 25, "the totals of all as before");
}

/// A relay stopped mid-stream adds what its last batches did before its recorders
/// stop: the totals and each exchange's counts in the log equal what it marked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_stopped_mid_stream_records_its_last_batches() {
    use outbox_ports::{ChartWindow, ThroughputKind, ThroughputLog};
    for round in 0..5 {
        let (store, broker) = setup();
        store
            .enqueue(outbox_testkit::messages(4_000))
            .await
            .expect("enqueue");
        let cancel = CancellationToken::new();
        let (relay, log) = relay_with_a_log(&store, &broker, 50, fast_retry(5), &cancel);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while store.count(OutboxStatus::Sent) < 200 * (round + 1) {
            assert!(tokio::time::Instant::now() < deadline, "too slow");
            tokio::task::yield_now().await;
        }
        let counters = relay.counters.clone();
        cancel.cancel();
        tokio::time::timeout(Duration::from_secs(10), relay.join())
            .await
            .expect("stops promptly");
        let marked = counters.published.load(SeqCst);
        assert!(marked < 4_000, "stopped mid-stream: {marked}");
        let total = log
            .per_minute(ThroughputKind::Published, Duration::from_secs(3600))
            .await
            .expect("read")
            .iter()
            .map(|m| m.count)
            .sum::<u64>();
        let named = log
            .named_totals(ThroughputKind::Published, ChartWindow::Hour)
            .await
            .expect("read");
        assert_eq!(total, marked, "round {round}: the totals of all");
        assert_eq!(
            named,
            vec![("contract".to_owned(), marked)],
            "round {round}: the exchange's"
        );
        assert_eq!(store.count(OutboxStatus::Sent), marked);
    }
}
