//! A consumer that keeps order by key (`ConsumerConfig::ordered_by_key`), on memory
//! adapters: one key's deliveries are handled one after another in arrival order
//! while other keys run concurrently, and a failing delivery holds back its own
//! key only, through the inbox and the consume sweep.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_adapters_memory::{ExchangeKind, MemoryBroker, MemoryInboxStore};
use outbox_consumer::{
    CancellationToken, ConsumerConfig, ConsumerWorker, HandlerError, HandlerRegistry, SweepTask,
    handler_fn,
};
use outbox_core::{Message, RetryPolicy};
use outbox_ports::{InboxStore, Publisher, SystemClock};

const QUEUE: &str = "lanes.test";
const NAME: &str = "lanes-consumer";

fn broker() -> MemoryBroker {
    let b = MemoryBroker::new();
    b.declare_exchange("lanes", ExchangeKind::Topic);
    b.declare_queue(QUEUE);
    b.bind(QUEUE, "lanes", "#");
    b
}

fn config(ordered: bool) -> ConsumerConfig {
    ConsumerConfig {
        concurrency: 16,
        prefetch: 64,
        ordered_by_key: ordered,
        handler_timeout: Duration::from_secs(5),
        retry: RetryPolicy {
            initial_backoff: Duration::from_millis(20),
            max_backoff: Duration::from_millis(40),
            max_attempts: 10,
        },
        store_error_backoff: Duration::from_millis(50),
        ..ConsumerConfig::new(NAME, QUEUE)
    }
}

/// `per_key` messages for each of `keys` keys, interleaved (key 0 #0, key 1 #0, ...,
/// key 0 #1, ...) as real traffic is; the body is `key/number`.
fn keyed_messages(keys: usize, per_key: usize) -> Vec<Message> {
    let mut out = Vec::with_capacity(keys * per_key);
    for n in 0..per_key {
        for k in 0..keys {
            let mut m = outbox_testkit::message("lanes", "order.event");
            m.payload = format!("k{k}/{n}").into_bytes();
            m.ordering_key = Some(format!("k{k}"));
            out.push(m);
        }
    }
    out
}

fn key_and_number(m: &Message) -> (String, usize) {
    let text = String::from_utf8(m.payload.clone()).expect("utf-8 body");
    let (k, n) = text.split_once('/').expect("key/number");
    (k.to_owned(), n.parse().expect("number"))
}

/// Per key, the numbers in the order their handler succeeded.
type Seen = Arc<Mutex<HashMap<String, Vec<usize>>>>;

/// A handler that takes a little time (varying by message, so concurrent handlings
/// overtake each other), records successes per key, and fails a message's first
/// `fails(key, number)` attempts.
fn recording(seen: Seen, fails: fn(&str, usize) -> u32) -> HandlerRegistry {
    let attempts = Arc::new(Mutex::new(HashMap::<(String, usize), u32>::new()));
    HandlerRegistry::new().fallback(handler_fn(move |m: Message| {
        let seen = Arc::clone(&seen);
        let attempts = Arc::clone(&attempts);
        async move {
            let (k, n) = key_and_number(&m);
            let attempt = {
                let mut a = attempts.lock().expect("lock");
                let a = a.entry((k.clone(), n)).or_default();
                *a += 1;
                *a
            };
            // 0 to 3 ms, differing between neighbours.
            tokio::time::sleep(Duration::from_micros(
                ((n * 7 + k.len() * 13) % 4) as u64 * 1000,
            ))
            .await;
            if attempt <= fails(&k, n) {
                return Err(HandlerError::from(format!(
                    "{k}/{n} fails attempt {attempt}"
                )));
            }
            seen.lock().expect("lock").entry(k).or_default().push(n);
            Ok(())
        }
    }))
}

async fn wait_for(what: &str, secs: u64, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn out_of_order(seen: &HashMap<String, Vec<usize>>) -> Vec<String> {
    seen.iter()
        .filter(|(_, ns)| ns.windows(2).any(|w| w[0] >= w[1]))
        .map(|(k, ns)| format!("{k}: {ns:?}"))
        .collect()
}

/// Fewer keys than the consumer's concurrency: several deliveries of each key are
/// in flight at once, so without lanes they overtake each other (with 20 keys
/// interleaved, a window of 16 rarely held two of one key, and the control below
/// passed or failed by scheduling).
const RUN_KEYS: usize = 4;
const RUN_PER_KEY: usize = 150;

async fn consume_all(ordered: bool) -> HashMap<String, Vec<usize>> {
    let b = broker();
    let inbox = Arc::new(MemoryInboxStore::new(Arc::new(SystemClock)));
    let seen = Seen::default();
    let worker = ConsumerWorker::new(
        inbox,
        Arc::new(b.clone()),
        recording(Arc::clone(&seen), |_, _| 0),
        Arc::new(SystemClock),
        config(ordered),
    );
    let msgs = keyed_messages(RUN_KEYS, RUN_PER_KEY);
    for out in b.publish(&msgs).await {
        assert!(out.is_confirmed());
    }
    let cancel = CancellationToken::new();
    let running = tokio::spawn(worker.run(cancel.clone()));
    let total = msgs.len();
    wait_for("every message handled", 20, || {
        seen.lock()
            .expect("lock")
            .values()
            .map(Vec::len)
            .sum::<usize>()
            == total
    })
    .await;
    cancel.cancel();
    running.await.expect("worker");
    let seen = seen.lock().expect("lock");
    seen.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lanes_keep_each_keys_order_at_full_concurrency() {
    let seen = consume_all(true).await;
    assert_eq!(seen.len(), RUN_KEYS);
    assert!(seen.values().all(|ns| ns.len() == RUN_PER_KEY));
    let broken = out_of_order(&seen);
    assert!(broken.is_empty(), "order broken with lanes: {broken:?}");
}

/// The instrument can fail: without lanes, the same run reorders keys (handlers
/// of one key overtake each other at concurrency 16).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_lanes_the_same_run_reorders() {
    let seen = consume_all(false).await;
    assert!(
        !out_of_order(&seen).is_empty(),
        "expected some key out of order without lanes"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failing_delivery_holds_back_its_own_key_only() {
    let b = broker();
    let inbox = Arc::new(MemoryInboxStore::new(Arc::new(SystemClock)));
    let seen = Seen::default();
    // k0's first message fails three times; every other one succeeds at once.
    let worker = ConsumerWorker::new(
        inbox.clone(),
        Arc::new(b.clone()),
        recording(
            Arc::clone(&seen),
            |k, n| if k == "k0" && n == 0 { 3 } else { 0 },
        ),
        Arc::new(SystemClock),
        config(true),
    );
    let counters = worker.counters();
    let retry = worker.retry_task();
    let msgs = keyed_messages(10, 20);
    for out in b.publish(&msgs).await {
        assert!(out.is_confirmed());
    }
    let cancel = CancellationToken::new();
    let running = tokio::spawn(worker.run(cancel.clone()));
    // Without a sweep, every other key completes; k0 has nothing handled.
    wait_for("the other keys", 20, || {
        let s = seen.lock().expect("lock");
        (1..10).all(|k| s.get(&format!("k{k}")).is_some_and(|ns| ns.len() == 20))
    })
    .await;
    assert!(
        !seen.lock().expect("lock").contains_key("k0"),
        "k0's later messages must wait for its failing first one"
    );
    let held = counters
        .held_behind_key
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(held, 19, "k0's 19 later deliveries are held in the inbox");
    assert_eq!(inbox.stats(NAME).await.expect("stats").consume_failed, 1);
    // The sweep retries the head until it succeeds, then the held ones in order.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while seen.lock().expect("lock").get("k0").map_or(0, Vec::len) < 20 {
        assert!(tokio::time::Instant::now() < deadline, "k0 did not drain");
        retry.run_batch(50).await.expect("sweep");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    cancel.cancel();
    running.await.expect("worker");
    let seen = seen.lock().expect("lock").clone();
    assert_eq!(
        seen["k0"],
        (0..20).collect::<Vec<_>>(),
        "k0 drained in order"
    );
    let broken = out_of_order(&seen);
    assert!(broken.is_empty(), "order broken: {broken:?}");
    let stats = inbox.stats(NAME).await.expect("stats");
    assert_eq!(stats.consumed, 200);
    assert_eq!(stats.received + stats.consume_failed + stats.dead, 0);
}

/// Deliveries without a key are not held back by lanes, and a key's lane does not
/// keep other keys waiting: with one slow key, the rest finish first.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_slow_key_does_not_hold_the_others() {
    let b = broker();
    let inbox = Arc::new(MemoryInboxStore::new(Arc::new(SystemClock)));
    let done = Arc::new(Mutex::new(Vec::<String>::new()));
    let d = Arc::clone(&done);
    let handlers = HandlerRegistry::new().fallback(handler_fn(move |m: Message| {
        let done = Arc::clone(&d);
        async move {
            let key = m.ordering_key.clone().unwrap_or_else(|| "none".to_owned());
            if key == "slow" {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            done.lock().expect("lock").push(key);
            Ok::<(), HandlerError>(())
        }
    }));
    let worker = ConsumerWorker::new(
        inbox,
        Arc::new(b.clone()),
        handlers,
        Arc::new(SystemClock),
        config(true),
    );
    let mut msgs = Vec::new();
    for i in 0..30 {
        let mut m = outbox_testkit::message("lanes", "order.event");
        m.ordering_key = match i % 3 {
            0 => Some("slow".to_owned()),
            1 => Some(format!("fast{i}")),
            _ => None,
        };
        msgs.push(m);
    }
    for out in b.publish(&msgs).await {
        assert!(out.is_confirmed());
    }
    let cancel = CancellationToken::new();
    let running = tokio::spawn(worker.run(cancel.clone()));
    wait_for("all 30", 20, || done.lock().expect("lock").len() == 30).await;
    cancel.cancel();
    running.await.expect("worker");
    let done = done.lock().expect("lock").clone();
    let second_slow_done = done
        .iter()
        .enumerate()
        .filter(|(_, k)| *k == "slow")
        .nth(1)
        .map(|(i, _)| i)
        .expect("slow ran");
    assert_eq!(
        done[..second_slow_done]
            .iter()
            .filter(|k| *k != "slow")
            .count(),
        20,
        "the other keys finish while the slow key's lane runs: {done:?}"
    );
}

/// An inbox whose first `fail` arrivals of one message fail as unreachable.
struct Flaky {
    inner: Arc<MemoryInboxStore>,
    victim: outbox_core::MessageId,
    fail: std::sync::atomic::AtomicU32,
}

#[async_trait::async_trait]
impl outbox_ports::InboxConsumerPath for Flaky {
    async fn record_arrival(
        &self,
        consumer: &str,
        message: &Message,
        lease: &outbox_ports::Lease,
    ) -> Result<outbox_ports::Arrival, outbox_ports::PortError> {
        if message.id == self.victim
            && self
                .fail
                .fetch_update(
                    std::sync::atomic::Ordering::SeqCst,
                    std::sync::atomic::Ordering::SeqCst,
                    |n| n.checked_sub(1),
                )
                .is_ok()
        {
            return Err(outbox_ports::PortError::transient(
                "record arrival",
                "injected: inbox unreachable",
            ));
        }
        self.inner.record_arrival(consumer, message, lease).await
    }
    async fn hold_behind_key(
        &self,
        consumer: &str,
        message: &Message,
    ) -> Result<bool, outbox_ports::PortError> {
        self.inner.hold_behind_key(consumer, message).await
    }
    async fn record_given_up(
        &self,
        consumer: &str,
        message: &Message,
        reason: &str,
    ) -> Result<bool, outbox_ports::PortError> {
        self.inner.record_given_up(consumer, message, reason).await
    }
    async fn mark_consumed(
        &self,
        consumer: &str,
        id: outbox_core::MessageId,
        lease: &outbox_ports::Lease,
    ) -> Result<bool, outbox_ports::PortError> {
        self.inner.mark_consumed(consumer, id, lease).await
    }
    async fn mark_consume_failed(
        &self,
        consumer: &str,
        id: outbox_core::MessageId,
        lease: &outbox_ports::Lease,
        error: &str,
        decision: outbox_core::Decision,
    ) -> Result<bool, outbox_ports::PortError> {
        self.inner
            .mark_consume_failed(consumer, id, lease, error, decision)
            .await
    }
    async fn claim_due(
        &self,
        consumer: &str,
        lease: &outbox_ports::Lease,
        limit: u32,
    ) -> Result<Vec<outbox_ports::ClaimedDelivery>, outbox_ports::PortError> {
        self.inner.claim_due(consumer, lease, limit).await
    }
    async fn record_dead_letter(
        &self,
        consumer: &str,
        letter: outbox_ports::DeadLetter,
    ) -> Result<(), outbox_ports::PortError> {
        self.inner.record_dead_letter(consumer, letter).await
    }
}

/// An inbox that cannot be reached for a key's first delivery must not let the
/// key's next deliveries (already delivered, waiting in the lane) overtake it: it
/// is tried again in place instead of going back to the broker.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unreachable_inbox_does_not_let_a_keys_next_delivery_overtake() {
    let b = broker();
    let memory = Arc::new(MemoryInboxStore::new(Arc::new(SystemClock)));
    let msgs = keyed_messages(3, 10);
    let inbox = Arc::new(Flaky {
        inner: Arc::clone(&memory),
        victim: msgs[0].id,
        fail: std::sync::atomic::AtomicU32::new(3),
    });
    let seen = Seen::default();
    let worker = ConsumerWorker::new(
        inbox,
        Arc::new(b.clone()),
        recording(Arc::clone(&seen), |_, _| 0),
        Arc::new(SystemClock),
        config(true),
    );
    for out in b.publish(&msgs).await {
        assert!(out.is_confirmed());
    }
    let cancel = CancellationToken::new();
    let running = tokio::spawn(worker.run(cancel.clone()));
    wait_for("every message handled", 20, || {
        seen.lock()
            .expect("lock")
            .values()
            .map(Vec::len)
            .sum::<usize>()
            == 30
    })
    .await;
    cancel.cancel();
    running.await.expect("worker");
    let seen = seen.lock().expect("lock").clone();
    let broken = out_of_order(&seen);
    assert!(broken.is_empty(), "order broken: {broken:?}");
}
