//! The consumer worker and the consume-retry task on memory adapters: dedup by the
//! inbox, failures stored and retried, panics and timeouts contained, undecodable
//! deliveries kept as dead letters, graceful stop.

use outbox_ports::InboxOperator as _;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_adapters_memory::{ExchangeKind, MemoryBroker, MemoryInboxStore};
use outbox_consumer::{
    CancellationToken, ConsumerConfig, ConsumerWorker, HandlerError, HandlerRegistry, SweepTask,
    handler_fn,
};
use outbox_core::{InboxStatus, Message, MessageId, RetryPolicy};
use outbox_ports::{
    Envelope, InboxConsumerPath, InboxStore, MockInboxStore, PortError, Publisher, SystemClock,
};

const QUEUE: &str = "consumer.test";
const NAME: &str = "test-consumer";

fn broker() -> MemoryBroker {
    let b = MemoryBroker::new();
    b.declare_exchange("contract", ExchangeKind::Topic);
    b.declare_queue(QUEUE);
    b.bind(QUEUE, "contract", "#");
    b
}

fn config(max_attempts: u32) -> ConsumerConfig {
    ConsumerConfig {
        concurrency: 4,
        prefetch: 8,
        handler_timeout: Duration::from_millis(500),
        retry: RetryPolicy {
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(20),
            max_attempts,
        },
        store_error_backoff: Duration::from_millis(50),
        ..ConsumerConfig::new(NAME, QUEUE)
    }
}

type Effects = Arc<Mutex<HashMap<MessageId, u32>>>;

/// A handler that counts effects per message, and fails as `fail` says.
fn counting(effects: Effects, fail: fn(&Message, u32) -> Option<&'static str>) -> HandlerRegistry {
    let calls = Arc::new(Mutex::new(HashMap::<MessageId, u32>::new()));
    HandlerRegistry::new().fallback(handler_fn(move |m: Message| {
        let effects = Arc::clone(&effects);
        let calls = Arc::clone(&calls);
        async move {
            let n = {
                let mut c = calls.lock().expect("lock");
                let n = c.entry(m.id).or_default();
                *n += 1;
                *n
            };
            if let Some(why) = fail(&m, n) {
                if why == "panic" {
                    panic!("boom");
                }
                if why == "hang" {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                }
                return Err(HandlerError::from(why));
            }
            *effects.lock().expect("lock").entry(m.id).or_default() += 1;
            Ok(())
        }
    }))
}

/// A worker on `b` with a fresh memory inbox and a handler that counts effects and
/// never fails.
fn counting_worker(
    b: &MemoryBroker,
    config: ConsumerConfig,
) -> (ConsumerWorker, Arc<MemoryInboxStore>, Effects) {
    let inbox = Arc::new(MemoryInboxStore::new(Arc::new(SystemClock)));
    let effects = Effects::default();
    let worker = ConsumerWorker::new(
        inbox.clone(),
        Arc::new(b.clone()),
        counting(Arc::clone(&effects), |_, _| None),
        Arc::new(SystemClock),
        config,
    );
    (worker, inbox, effects)
}

async fn wait_for(what: &str, mut done: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !done().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

struct Running {
    cancel: CancellationToken,
    handle: tokio::task::JoinHandle<()>,
}

impl Running {
    async fn stop(self) {
        self.cancel.cancel();
        tokio::time::timeout(Duration::from_secs(5), self.handle)
            .await
            .expect("worker stops")
            .expect("worker task");
    }
}

fn run(worker: ConsumerWorker) -> Running {
    let cancel = CancellationToken::new();
    let handle = tokio::spawn(worker.run(cancel.clone()));
    Running { cancel, handle }
}

#[tokio::test]
async fn each_message_takes_effect_once_despite_redeliveries() {
    let b = broker();
    let inbox = Arc::new(MemoryInboxStore::new(Arc::new(SystemClock)));
    let effects = Effects::default();
    let worker = ConsumerWorker::new(
        inbox.clone(),
        Arc::new(b.clone()),
        counting(effects.clone(), |_, _| None),
        Arc::new(SystemClock),
        config(5),
    );
    let counters = worker.counters();
    b.redeliver_next_acked(30);
    let msgs = outbox_testkit::messages(200);
    assert!(b.publish(&msgs).await.iter().all(|o| o.is_confirmed()));
    let r = run(worker);
    wait_for("consumption", async || {
        inbox.stats(NAME).await.expect("stats").consumed == 200 && b.queue_depth(QUEUE) == (0, 0)
    })
    .await;
    r.stop().await;
    let fx = effects.lock().expect("lock");
    assert_eq!(fx.len(), 200);
    assert!(fx.values().all(|n| *n == 1), "an effect happened twice");
    assert_eq!(counters.duplicates.load(Ordering::Relaxed), 30);
}

#[tokio::test]
async fn a_failed_handler_is_stored_and_retried_until_consumed() {
    let b = broker();
    let inbox = Arc::new(MemoryInboxStore::new(Arc::new(SystemClock)));
    let effects = Effects::default();
    let worker = ConsumerWorker::new(
        inbox.clone(),
        Arc::new(b.clone()),
        counting(effects.clone(), |_, n| (n < 3).then_some("not yet")),
        Arc::new(SystemClock),
        config(5),
    );
    let task = worker.retry_task();
    let m = outbox_testkit::message("contract", "k");
    b.publish(std::slice::from_ref(&m)).await;
    let r = run(worker);
    wait_for("failure", async || {
        inbox.stats(NAME).await.expect("stats").consume_failed == 1
    })
    .await;
    let rec = inbox
        .get_delivery(NAME, m.id)
        .await
        .expect("get")
        .expect("row");
    assert_eq!(rec.status, InboxStatus::ConsumeFailed);
    assert_eq!(rec.consume.last_error.as_deref(), Some("not yet"));
    assert_eq!(
        b.queue_depth(QUEUE),
        (0, 0),
        "the failed delivery was acked: the inbox owns it now"
    );
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_millis(30)).await;
        task.run_batch(10).await.expect("retry");
    }
    r.stop().await;
    let rec = inbox
        .get_delivery(NAME, m.id)
        .await
        .expect("get")
        .expect("row");
    assert_eq!(rec.status, InboxStatus::Consumed);
    assert_eq!(rec.consume.attempts, 3);
    assert_eq!(effects.lock().expect("lock").get(&m.id), Some(&1));
}

#[tokio::test]
async fn a_consume_retry_batch_stops_claiming_once_the_sweep_lock_is_lost() {
    let b = broker();
    let inbox = Arc::new(MemoryInboxStore::new(Arc::new(SystemClock)));
    let effects = Effects::default();
    // Every first attempt fails, every retry succeeds.
    let worker = ConsumerWorker::new(
        inbox.clone(),
        Arc::new(b.clone()),
        counting(effects.clone(), |_, n| (n < 2).then_some("first attempt")),
        Arc::new(SystemClock),
        config(5),
    );
    let task = worker.retry_task();
    let msgs = outbox_testkit::messages(5);
    b.publish(&msgs).await;
    let r = run(worker);
    wait_for("failures", async || {
        inbox.stats(NAME).await.expect("stats").consume_failed == 5
    })
    .await;
    r.stop().await;
    tokio::time::sleep(Duration::from_millis(30)).await;
    // The lock holds for the first claim only (each handler may take up to its
    // timeout; another instance may sweep once the lease is gone).
    let checks = AtomicU32::new(0);
    let held = || checks.fetch_add(1, Ordering::SeqCst) == 0;
    let counts = task.run_batch_while_held(10, &held).await.expect("batch");
    assert_eq!(counts.claimed, 1, "no claim after the lock was lost");
    assert_eq!(inbox.stats(NAME).await.expect("stats").consume_failed, 4);
    // With the lock, the rest is retried.
    let counts = task.run_batch(10).await.expect("batch");
    assert_eq!(counts.claimed, 4);
}

#[tokio::test]
async fn a_poison_message_ends_dead_while_the_rest_flows() {
    let b = broker();
    let inbox = Arc::new(MemoryInboxStore::new(Arc::new(SystemClock)));
    let effects = Effects::default();
    let msgs = outbox_testkit::messages(20);
    let poison = msgs[3].id;
    let registry = {
        let effects = effects.clone();
        let calls = Arc::new(AtomicU32::new(0));
        HandlerRegistry::new().fallback(handler_fn(move |m: Message| {
            let effects = effects.clone();
            let calls = Arc::clone(&calls);
            async move {
                if m.id == poison {
                    calls.fetch_add(1, Ordering::SeqCst);
                    return Err(HandlerError::from("always fails"));
                }
                *effects.lock().expect("lock").entry(m.id).or_default() += 1;
                Ok(())
            }
        }))
    };
    let worker = ConsumerWorker::new(
        inbox.clone(),
        Arc::new(b.clone()),
        registry,
        Arc::new(SystemClock),
        config(3),
    );
    let task = worker.retry_task();
    b.publish(&msgs).await;
    let r = run(worker);
    wait_for("the others", async || {
        inbox.stats(NAME).await.expect("stats").consumed == 19
    })
    .await;
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(30)).await;
        task.run_batch(10).await.expect("retry");
    }
    r.stop().await;
    let rec = inbox
        .get_delivery(NAME, poison)
        .await
        .expect("get")
        .expect("row");
    assert_eq!(rec.status, InboxStatus::Dead);
    assert_eq!(rec.consume.attempts, 3);
    assert_eq!(rec.consume.last_error.as_deref(), Some("always fails"));
    inbox
        .reconsume_delivery(NAME, poison, false)
        .await
        .expect("reconsume");
    assert_eq!(
        inbox
            .get_delivery(NAME, poison)
            .await
            .expect("get")
            .expect("row")
            .status,
        InboxStatus::Received
    );
}

#[tokio::test]
async fn panics_and_timeouts_are_failures_not_dead_workers() {
    let b = broker();
    let inbox = Arc::new(MemoryInboxStore::new(Arc::new(SystemClock)));
    let effects = Effects::default();
    let msgs = outbox_testkit::messages(10);
    let handlers = counting(effects.clone(), |m, _| match m.payload.last() {
        Some(_) if m.routing_key == "panic" => Some("panic"),
        Some(_) if m.routing_key == "hang" => Some("hang"),
        _ => None,
    });
    let mut special = msgs.clone();
    special[0].routing_key = "panic".into();
    special[1].routing_key = "hang".into();
    let worker = ConsumerWorker::new(
        inbox.clone(),
        Arc::new(b.clone()),
        handlers,
        Arc::new(SystemClock),
        config(5),
    );
    b.publish(&special).await;
    let r = run(worker);
    wait_for("all outcomes", async || {
        let s = inbox.stats(NAME).await.expect("stats");
        s.consumed == 8 && s.consume_failed == 2
    })
    .await;
    r.stop().await;
    let panicked = inbox
        .get_delivery(NAME, special[0].id)
        .await
        .expect("get")
        .expect("row");
    assert!(
        panicked
            .consume
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("panicked: boom")),
        "{panicked:?}"
    );
    let hung = inbox
        .get_delivery(NAME, special[1].id)
        .await
        .expect("get")
        .expect("row");
    assert!(
        hung.consume
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("timed out")),
        "{hung:?}"
    );
}

#[tokio::test]
async fn undecodable_deliveries_become_dead_letters_and_unhandled_types_fail() {
    let b = broker();
    let inbox = Arc::new(MemoryInboxStore::new(Arc::new(SystemClock)));
    let handlers = HandlerRegistry::new().on_type("known", handler_fn(|_| async { Ok(()) }));
    let worker = ConsumerWorker::new(
        inbox.clone(),
        Arc::new(b.clone()),
        handlers,
        Arc::new(SystemClock),
        config(5),
    );
    let counters = worker.counters();
    // A foreign publisher's deliveries: no message id, and an id that is no UUID.
    let foreign = outbox_testkit::message("contract", "k");
    let mut no_id = Envelope::of(&foreign);
    no_id.message_id = None;
    no_id.body = b"\xff\xfe raw".to_vec();
    let mut bad_id = Envelope::of(&foreign);
    bad_id.message_id = Some("order-42".into());
    assert!(b.publish_envelope(no_id).is_confirmed());
    assert!(b.publish_envelope(bad_id).is_confirmed());
    let unknown_type = outbox_testkit::message("contract", "k");
    b.publish(std::slice::from_ref(&unknown_type)).await;
    let r = run(worker);
    wait_for("outcomes", async || {
        let s = inbox.stats(NAME).await.expect("stats");
        s.consume_failed == 1 && s.dead_letters == 2
    })
    .await;
    r.stop().await;
    assert_eq!(b.queue_depth(QUEUE), (0, 0), "dead letters are acked");
    let letters = inbox.dead_letters(NAME);
    assert_eq!(letters[0].reason, "delivery has no message id");
    assert_eq!(letters[0].body, b"\xff\xfe raw");
    assert!(letters[1].reason.contains("order-42"));
    assert_eq!(letters[1].message_id.as_deref(), Some("order-42"));
    let rec = inbox
        .get_delivery(NAME, unknown_type.id)
        .await
        .expect("get")
        .expect("row");
    assert!(
        rec.consume
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("no handler")),
        "{rec:?}"
    );
    assert_eq!(counters.dead_letters.load(Ordering::Relaxed), 2);
}

#[tokio::test]
async fn an_unreachable_inbox_holds_the_deliveries_in_hand_and_takes_no_more() {
    let b = broker();
    let mut inbox = MockInboxStore::new();
    let tries = Arc::new(AtomicU32::new(0));
    let tried = Arc::new(Mutex::new(std::collections::HashSet::new()));
    let (t, seen) = (Arc::clone(&tries), Arc::clone(&tried));
    inbox.expect_record_arrival().returning(move |_, m, _| {
        t.fetch_add(1, Ordering::SeqCst);
        seen.lock().expect("lock").insert(m.id);
        Err(PortError::transient("record arrival", "db down"))
    });
    let effects = Effects::default();
    let worker = ConsumerWorker::new(
        Arc::new(inbox),
        Arc::new(b.clone()),
        counting(effects.clone(), |_, _| None),
        Arc::new(SystemClock),
        config(5),
    );
    b.publish(&outbox_testkit::messages(20)).await;
    let r = run(worker);
    tokio::time::sleep(Duration::from_millis(400)).await;
    // Returning a delivery would hand the next one over (and, on a quorum queue,
    // count against its delivery limit): the deliveries tried are only those the
    // first tries found in hand, at most `concurrency` of them.
    let distinct = tried.lock().expect("lock").len();
    assert!(
        (1..=4).contains(&distinct),
        "{distinct} messages tried: deliveries were returned and others taken"
    );
    // 400 ms with pauses doubling from 50 ms: a few tries each, not a storm.
    let n = tries.load(Ordering::SeqCst);
    assert!(n <= 4 * 5, "{n} tries");
    r.stop().await;
    assert!(
        effects.lock().expect("lock").is_empty(),
        "no handler ran without an inbox row"
    );
    let (ready, unacked) = b.queue_depth(QUEUE);
    assert_eq!(ready + unacked, 20, "nothing acked, nothing lost");
}

#[tokio::test]
async fn stopping_finishes_the_deliveries_in_hand() {
    let b = broker();
    let inbox = Arc::new(MemoryInboxStore::new(Arc::new(SystemClock)));
    let effects = Effects::default();
    let slow = {
        let effects = effects.clone();
        HandlerRegistry::new().fallback(handler_fn(move |m: Message| {
            let effects = effects.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(200)).await;
                *effects.lock().expect("lock").entry(m.id).or_default() += 1;
                Ok(())
            }
        }))
    };
    let worker = ConsumerWorker::new(
        inbox.clone(),
        Arc::new(b.clone()),
        slow,
        Arc::new(SystemClock),
        config(5),
    );
    b.publish(&outbox_testkit::messages(2)).await;
    let r = run(worker);
    tokio::time::sleep(Duration::from_millis(50)).await; // both handlers running
    r.stop().await;
    assert_eq!(inbox.stats(NAME).await.expect("stats").consumed, 2);
    assert_eq!(b.queue_depth(QUEUE), (0, 0));
    assert_eq!(effects.lock().expect("lock").len(), 2);
}

#[tokio::test]
async fn an_oversized_delivery_is_a_dead_letter_with_its_id_and_never_reaches_the_handler() {
    let b = broker();
    let (worker, inbox, effects) = counting_worker(
        &b,
        ConsumerConfig {
            max_payload_bytes: 1024,
            ..config(5)
        },
    );
    let mut big = outbox_testkit::message("contract", "k");
    big.payload = vec![b'x'; 1025];
    let fits = outbox_testkit::message("contract", "k");
    let mut at_limit = outbox_testkit::message("contract", "k");
    at_limit.payload = vec![b'y'; 1024];
    b.publish(&[big.clone(), fits.clone(), at_limit.clone()])
        .await;
    let r = run(worker);
    wait_for("outcomes", async || {
        let s = inbox.stats(NAME).await.expect("stats");
        s.consumed == 2 && s.dead_letters == 1
    })
    .await;
    r.stop().await;
    let letters = inbox.dead_letters(NAME);
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].message_id, Some(big.id.to_string()));
    assert!(
        letters[0].reason.contains("1025 bytes") && letters[0].reason.contains("1024"),
        "{}",
        letters[0].reason
    );
    assert_eq!(letters[0].body.len(), 1025, "the raw body is kept");
    let effects = effects.lock().expect("lock");
    assert_eq!(effects.get(&fits.id), Some(&1));
    assert_eq!(effects.get(&at_limit.id), Some(&1));
    assert!(!effects.contains_key(&big.id), "the handler never saw it");
}

#[tokio::test]
async fn an_ack_the_broker_never_answers_does_not_hold_the_consumer_or_its_shutdown() {
    let b = broker();
    let (worker, inbox, effects) = counting_worker(
        &b,
        ConsumerConfig {
            concurrency: 1,
            settle_timeout: Duration::from_millis(100),
            ..config(5)
        },
    );
    // The first ack hangs, as when the connection dies under it; with one slot, an
    // unbounded wait would stop the consumer for good.
    b.hang_next_acks(1);
    let sent = outbox_testkit::messages(3);
    b.publish(&sent).await;
    let r = run(worker);
    wait_for("all consumed", async || {
        inbox.stats(NAME).await.expect("stats").consumed == 3
    })
    .await;
    wait_for(
        "the unanswered delivery redelivered and acked",
        async || b.queue_depth(QUEUE) == (0, 0),
    )
    .await;
    r.stop().await;
    let effects = effects.lock().expect("lock");
    for m in &sent {
        assert_eq!(effects.get(&m.id), Some(&1), "exactly one effect each");
    }
}

/// Runs per message: how many started, and the most at the same time.
#[derive(Default)]
struct RunLog {
    running: HashMap<MessageId, u32>,
    started: HashMap<MessageId, u32>,
    most_at_once: u32,
}

#[tokio::test(start_paused = true)]
async fn a_slow_retry_batch_never_lets_another_sweep_run_the_same_row_at_the_same_time() {
    use outbox_adapters_memory::TokioClock;
    use outbox_ports::Lease;

    let clock = Arc::new(TokioClock::starting_at(time::OffsetDateTime::now_utc()));
    let inbox = Arc::new(MemoryInboxStore::new(clock.clone()));
    // Four deliveries whose workers vanished: received, leases already run out.
    let msgs = outbox_testkit::messages(4);
    for m in &msgs {
        let gone = Lease::new("vanished-worker", Duration::from_millis(1));
        inbox.record_arrival(NAME, m, &gone).await.expect("arrival");
    }
    tokio::time::sleep(Duration::from_millis(10)).await;
    let log = Arc::new(Mutex::new(RunLog::default()));
    // Each handling takes 20 s of a 30 s timeout: the lease (timeout + 10 s) covers
    // one row, not four in a row.
    let slow = {
        let log = Arc::clone(&log);
        HandlerRegistry::new().fallback(handler_fn(move |m: Message| {
            let log = Arc::clone(&log);
            async move {
                {
                    let mut l = log.lock().expect("lock");
                    *l.started.entry(m.id).or_default() += 1;
                    let now = {
                        let r = l.running.entry(m.id).or_default();
                        *r += 1;
                        *r
                    };
                    l.most_at_once = l.most_at_once.max(now);
                }
                tokio::time::sleep(Duration::from_secs(20)).await;
                *log.lock().expect("lock").running.entry(m.id).or_default() -= 1;
                Ok(())
            }
        }))
    };
    let config = ConsumerConfig {
        handler_timeout: Duration::from_secs(30),
        ..config(5)
    };
    let b = broker();
    let sweep = |handlers: HandlerRegistry| {
        ConsumerWorker::new(
            inbox.clone(),
            Arc::new(b.clone()),
            handlers,
            clock.clone(),
            config.clone(),
        )
        .retry_task()
    };
    let (first, second) = (sweep(slow.clone()), sweep(slow));
    // Two instances' sweeps: the first starts a batch; the second keeps trying.
    let first = tokio::spawn(async move { first.run_batch(10).await });
    let second = tokio::spawn(async move {
        for _ in 0..120 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            second.run_batch(10).await.expect("second sweep");
        }
    });
    first.await.expect("task").expect("first sweep");
    second.await.expect("task");
    {
        let l = log.lock().expect("lock");
        assert_eq!(
            l.most_at_once, 1,
            "a row was handled by two sweeps at the same time"
        );
        for m in &msgs {
            assert_eq!(l.started.get(&m.id), Some(&1), "handled once each");
        }
    }
    assert_eq!(inbox.stats(NAME).await.expect("stats").consumed, 4);
}

#[tokio::test]
async fn a_row_whose_outcome_cannot_be_recorded_does_not_end_the_sweep() {
    use outbox_ports::ClaimedDelivery;

    let msgs = outbox_testkit::messages(3);
    let due = Arc::new(Mutex::new(msgs.clone()));
    let mut inbox = MockInboxStore::new();
    inbox.expect_claim_due().returning(move |_, _, limit| {
        let mut due = due.lock().expect("lock");
        let n = due.len().min(limit as usize);
        Ok(due
            .drain(..n)
            .map(|message| ClaimedDelivery {
                message,
                attempts: 1,
            })
            .collect())
    });
    let first = msgs[0].id;
    let marked = Arc::new(Mutex::new(Vec::new()));
    let m = Arc::clone(&marked);
    inbox.expect_mark_consumed().returning(move |_, id, _| {
        if id == first {
            return Err(PortError::fatal("mark consumed", "row refused"));
        }
        m.lock().expect("lock").push(id);
        Ok(true)
    });
    let effects = Effects::default();
    let worker = ConsumerWorker::new(
        Arc::new(inbox),
        Arc::new(broker()),
        counting(effects.clone(), |_, _| None),
        Arc::new(SystemClock),
        config(5),
    );
    let counts = worker
        .retry_task()
        .run_batch(10)
        .await
        .expect("one row's error does not fail the batch");
    assert_eq!(counts.claimed, 3, "{counts:?}");
    assert_eq!(counts.consume_retried, 2, "{counts:?}");
    assert_eq!(
        *marked.lock().expect("lock"),
        vec![msgs[1].id, msgs[2].id],
        "the rows after the failing one were handled and marked"
    );
}

/// A handling as a layer saw it: message, attempt, whether a retry, and whether
/// the handling it awaited consumed the message.
type Seen = (MessageId, u32, bool, bool);

/// A handling layer that writes down each handling it wraps.
#[derive(Default)]
struct Recording {
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl outbox_consumer::HandlingLayer for Recording {
    fn layer<'a>(
        &self,
        of: outbox_consumer::layer::HandlingOf<'_>,
        handling: outbox_consumer::layer::Handling<'a>,
    ) -> outbox_consumer::layer::Handling<'a> {
        let seen = Arc::clone(&self.seen);
        let (id, attempt, retry) = (of.message.id, of.attempt, of.retry);
        Box::pin(async move {
            let result = handling.await;
            let consumed = matches!(result, Ok(outbox_consumer::Handled::Consumed { .. }));
            seen.lock()
                .expect("lock")
                .push((id, attempt, retry, consumed));
            result
        })
    }
}

#[tokio::test]
async fn a_handling_layer_wraps_each_delivery_and_each_retry() {
    let b = broker();
    let inbox = Arc::new(MemoryInboxStore::new(Arc::new(SystemClock)));
    let layer = Recording::default();
    let seen = Arc::clone(&layer.seen);
    let worker = ConsumerWorker::new(
        inbox.clone(),
        Arc::new(b.clone()),
        counting(Effects::default(), |_, n| (n < 2).then_some("not yet")),
        Arc::new(SystemClock),
        config(5),
    );
    // Taken before the layer is set: it shares the worker's layer all the same.
    let task = worker.retry_task();
    let worker = worker.with_handling_layer(Some(Arc::new(layer)));
    let m = outbox_testkit::message("contract", "k");
    b.publish(std::slice::from_ref(&m)).await;
    let r = run(worker);
    wait_for("failure", async || {
        inbox.stats(NAME).await.expect("stats").consume_failed == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(30)).await;
    task.run_batch(10).await.expect("retry");
    r.stop().await;
    assert_eq!(
        *seen.lock().expect("lock"),
        [(m.id, 1, false, false), (m.id, 2, true, true)]
    );
}

/// With a throughput log, the worker adds its consumed deliveries and failed
/// handler attempts to it (the dashboard's chart), the last of them as it stops.
#[tokio::test]
async fn a_worker_records_its_consumed_and_failed_totals_per_minute() {
    use outbox_ports::{ThroughputKind, ThroughputLog};
    let b = broker();
    let inbox = Arc::new(MemoryInboxStore::new(Arc::new(SystemClock)));
    let log = Arc::new(outbox_adapters_memory::MemoryThroughputLog::new(Arc::new(
        SystemClock,
    )));
    let effects = Effects::default();
    let worker = ConsumerWorker::new(
        inbox.clone(),
        Arc::new(b.clone()),
        counting(effects.clone(), |m, _| {
            (m.routing_key == "fails").then_some("cannot bill")
        }),
        Arc::new(SystemClock),
        config(5),
    )
    .with_throughput(log.clone());
    let mut msgs = outbox_testkit::messages(5);
    msgs.push(outbox_testkit::message("contract", "fails"));
    b.publish(&msgs).await;
    let r = run(worker);
    wait_for("consumption and the failure", async || {
        let s = inbox.stats(NAME).await.expect("stats");
        s.consumed == 5 && s.consume_failed == 1
    })
    .await;
    r.stop().await;
    let total = async |kind| {
        log.per_minute(kind, Duration::from_secs(3600))
            .await
            .expect("read")
            .iter()
            .map(|m| m.count)
            .sum::<u64>()
    };
    assert_eq!(total(ThroughputKind::Consumed).await, 5);
    assert_eq!(total(ThroughputKind::ConsumeFailed).await, 1);
    // And under its own name, for its own chart.
    let named = async |kind| {
        log.named_totals(kind, outbox_ports::ChartWindow::Hour)
            .await
            .expect("read")
    };
    assert_eq!(
        named(ThroughputKind::Consumed).await,
        vec![(NAME.to_owned(), 5)]
    );
    assert_eq!(
        named(ThroughputKind::ConsumeFailed).await,
        vec![(NAME.to_owned(), 1)]
    );
}
