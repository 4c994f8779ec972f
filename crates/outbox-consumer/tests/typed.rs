//! Typed handlers on memory adapters: the value and its context reach the handler;
//! a body that does not decode, a body that is no JSON and a version no handler
//! accepts are dead after exactly one attempt, naming what failed; a handler's
//! failure class (permanent, retry after, retryable, panic) and a type's own retry
//! policy decide what happens next.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_adapters_memory::{ExchangeKind, MemoryBroker, MemoryInboxStore};
use outbox_consumer::{
    CAUSATION_HEADER, CancellationToken, ConsumerConfig, ConsumerWorker, Context, HandlerError,
    HandlerRegistry, SweepTask,
};
use outbox_core::event::{VERSION_HEADER, to_new_message};
use outbox_core::{Event, InboxStatus, Message, MessageId, RetryPolicy};
use outbox_ports::{InboxOperator as _, InboxRecord, Publisher, SystemClock};
use serde::{Deserialize, Serialize};

const QUEUE: &str = "typed.test";
const NAME: &str = "typed-consumer";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct OrderCreated {
    order_id: u64,
    total_cents: u64,
}

impl Event for OrderCreated {
    const TYPE: &'static str = "order.created";
    const VERSION: u32 = 2;
    const EXCHANGE: &'static str = "contract";
}

/// The first shape of the same type: no total yet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct OrderCreatedV1 {
    order_id: u64,
}

impl Event for OrderCreatedV1 {
    const TYPE: &'static str = "order.created";
    const EXCHANGE: &'static str = "contract";
}

impl From<OrderCreatedV1> for OrderCreated {
    fn from(v1: OrderCreatedV1) -> Self {
        Self {
            order_id: v1.order_id,
            total_cents: 0,
        }
    }
}

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

fn message_of<E: Event>(event: &E) -> Message {
    to_new_message(event).expect("encodes").into_message(
        outbox_testkit::message("x", "y").id,
        time::OffsetDateTime::now_utc(),
    )
}

/// A message of type `order.created` with this raw body and headers.
fn raw(body: &[u8], content_type: &str, version: Option<&str>) -> Message {
    let mut m = message_of(&OrderCreated {
        order_id: 0,
        total_cents: 0,
    });
    m.payload = body.to_vec();
    m.content_type = content_type.to_owned();
    match version {
        Some(v) => m.headers.insert(VERSION_HEADER.to_owned(), v.to_owned()),
        None => m.headers.remove(VERSION_HEADER),
    };
    m
}

type Seen = Arc<Mutex<Vec<(OrderCreated, Context)>>>;

/// What each order id makes the handler do.
async fn behave(order_id: u64) -> Result<(), HandlerError> {
    match order_id {
        1 => Err(HandlerError::permanent("order 1 can never be billed")),
        2 => Err(HandlerError::retry_after(
            Duration::from_secs(3600),
            "billing closed for the night",
        )),
        3 => Err("downstream not ready".into()),
        4 => panic!("a bug on order 4"),
        _ => Ok(()),
    }
}

fn registry(seen: &Seen) -> HandlerRegistry {
    let (v2, v1) = (seen.clone(), seen.clone());
    HandlerRegistry::new()
        .on::<OrderCreated>(move |order: OrderCreated, cx: Context| {
            let seen = v2.clone();
            async move {
                seen.lock().expect("lock").push((order.clone(), cx));
                behave(order.order_id).await
            }
        })
        .on::<OrderCreatedV1>(move |old: OrderCreatedV1, cx: Context| {
            let seen = v1.clone();
            async move {
                let order = OrderCreated::from(old);
                seen.lock().expect("lock").push((order.clone(), cx));
                behave(order.order_id).await
            }
        })
}

struct Run {
    inbox: Arc<MemoryInboxStore>,
    records: HashMap<MessageId, InboxRecord>,
}

/// Publishes `messages`, consumes them, runs the consume sweep a few times, and
/// returns every delivery's row.
async fn consume(messages: &[Message], handlers: HandlerRegistry, max_attempts: u32) -> Run {
    let b = broker();
    let inbox = Arc::new(MemoryInboxStore::new(Arc::new(SystemClock)));
    let worker = ConsumerWorker::new(
        inbox.clone(),
        Arc::new(b.clone()),
        handlers,
        Arc::new(SystemClock),
        config(max_attempts),
    );
    let task = worker.retry_task();
    assert!(b.publish(messages).await.iter().all(|o| o.is_confirmed()));
    let cancel = CancellationToken::new();
    let handle = tokio::spawn(worker.run(cancel.clone()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while b.queue_depth(QUEUE) != (0, 0) {
        assert!(tokio::time::Instant::now() < deadline, "consumption");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(30)).await;
        task.run_batch(10).await.expect("retry");
    }
    cancel.cancel();
    handle.await.expect("worker");
    let mut records = HashMap::new();
    for m in messages {
        let r = inbox
            .get_delivery(NAME, m.id)
            .await
            .expect("get")
            .expect("recorded");
        records.insert(m.id, r);
    }
    Run { inbox, records }
}

#[tokio::test]
async fn a_typed_handler_gets_the_value_its_context_and_can_follow_up() {
    let seen = Seen::default();
    let order = OrderCreated {
        order_id: 42,
        total_cents: 1_250,
    };
    let mut m = message_of(&order);
    m.correlation_id = Some("checkout-7".into());
    let run = consume(std::slice::from_ref(&m), registry(&seen), 5).await;
    assert_eq!(run.records[&m.id].status, InboxStatus::Consumed);
    let seen = seen.lock().expect("lock");
    let [(got, cx)] = seen.as_slice() else {
        panic!("one call: {seen:?}")
    };
    assert_eq!(*got, order);
    assert_eq!(cx.message_id, m.id);
    assert_eq!(
        (cx.message_type.as_str(), cx.version, cx.attempt),
        ("order.created", 2, 1)
    );
    assert_eq!(cx.correlation_id.as_deref(), Some("checkout-7"));
    assert_eq!(cx.causation_id, None);
    let next = cx
        .follow_up(&OrderCreatedV1 { order_id: 43 })
        .expect("follow-up");
    assert_eq!(next.correlation_id.as_deref(), Some("checkout-7"), "kept");
    assert_eq!(
        next.headers.get(CAUSATION_HEADER),
        Some(&m.id.to_string()),
        "caused by the handled message"
    );
    drop(run.inbox);
}

#[tokio::test]
async fn bodies_that_do_not_decode_and_unknown_versions_are_dead_after_one_attempt() {
    let seen = Seen::default();
    let wrong_field = raw(
        br#"{"order_id": "x", "total_cents": 5}"#,
        "application/json",
        Some("2"),
    );
    let not_json = raw(b"order 5, 12 EUR", "application/json", Some("2"));
    let not_json_type = raw(
        br#"{"order_id": 5, "total_cents": 5}"#,
        "text/plain",
        Some("2"),
    );
    let unknown_version = raw(br#"{"order_id": 5}"#, "application/json", Some("3"));
    let good_v1 = raw(br#"{"order_id": 9}"#, "application/json", None);
    let messages = [
        wrong_field,
        not_json,
        not_json_type,
        unknown_version,
        good_v1,
    ];
    let run = consume(&messages, registry(&seen), 5).await;
    let reason = |m: &Message| {
        let r = &run.records[&m.id];
        assert_eq!(r.status, InboxStatus::Dead, "{:?}", r.consume.last_error);
        assert_eq!(r.consume.attempts, 1, "exactly one attempt");
        assert_eq!(r.message.payload, m.payload, "the raw body stays");
        r.consume.last_error.clone().expect("a reason")
    };
    let why = reason(&messages[0]);
    assert!(
        why.contains("OrderCreated") && why.contains("invalid type: string \"x\""),
        "{why}"
    );
    let why = reason(&messages[1]);
    assert!(
        why.contains("OrderCreated") && why.contains("expected"),
        "{why}"
    );
    let why = reason(&messages[2]);
    assert!(why.contains("text/plain"), "{why}");
    let why = reason(&messages[3]);
    assert!(
        why.contains("version") && why.contains("order.created") && why.contains("1, 2"),
        "{why}"
    );
    assert_eq!(run.records[&messages[4].id].status, InboxStatus::Consumed);
    let seen = seen.lock().expect("lock");
    assert_eq!(
        seen.len(),
        1,
        "only the good one reached a handler: {seen:?}"
    );
    assert_eq!(
        seen[0].0,
        OrderCreated {
            order_id: 9,
            total_cents: 0
        },
        "v1 converted"
    );
    assert_eq!(seen[0].1.version, 1);
}

#[tokio::test]
async fn a_handlers_failure_class_decides_what_follows() {
    let seen = Seen::default();
    let order = |order_id| {
        message_of(&OrderCreated {
            order_id,
            total_cents: 1,
        })
    };
    let messages = [order(1), order(2), order(3), order(4)];
    let before = time::OffsetDateTime::now_utc();
    let run = consume(&messages, registry(&seen), 3).await;
    let r = |i: usize| &run.records[&messages[i].id];

    assert_eq!(
        (r(0).status, r(0).consume.attempts),
        (InboxStatus::Dead, 1),
        "permanent"
    );
    assert_eq!(
        r(0).consume.last_error.as_deref(),
        Some("order 1 can never be billed")
    );

    assert_eq!(
        r(1).status,
        InboxStatus::ConsumeFailed,
        "retry after its own delay"
    );
    assert_eq!(r(1).consume.attempts, 1);
    let due = r(1).consume.next_attempt_at.expect("due");
    assert!(
        due >= before + Duration::from_secs(3590),
        "{due} is the handler's delay"
    );

    assert_eq!(
        (r(2).status, r(2).consume.attempts),
        (InboxStatus::Dead, 3),
        "retried to the budget"
    );
    assert_eq!(
        (r(3).status, r(3).consume.attempts),
        (InboxStatus::Dead, 3),
        "a panic is retryable"
    );
    assert!(
        r(3).consume
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("panicked"))
    );
    let attempts: Vec<u32> = seen
        .lock()
        .expect("lock")
        .iter()
        .filter(|(o, _)| o.order_id == 3)
        .map(|(_, cx)| cx.attempt)
        .collect();
    assert_eq!(attempts, [1, 2, 3], "the context counts the attempts");
}

#[tokio::test]
async fn a_types_own_retry_policy_overrides_the_consumers() {
    let seen = Seen::default();
    let m = message_of(&OrderCreated {
        order_id: 3,
        total_cents: 1,
    });
    let once = RetryPolicy {
        max_attempts: 1,
        ..RetryPolicy::default()
    };
    let handlers = registry(&seen)
        .retry_policy(OrderCreated::TYPE, once)
        .expect("a valid policy");
    let run = consume(std::slice::from_ref(&m), handlers, 5).await;
    let r = &run.records[&m.id];
    assert_eq!((r.status, r.consume.attempts), (InboxStatus::Dead, 1));
    let none = RetryPolicy {
        max_attempts: 0,
        ..RetryPolicy::default()
    };
    let refused = HandlerRegistry::new()
        .retry_policy(OrderCreated::TYPE, none)
        .err()
        .expect("no attempt at all is refused");
    assert!(refused.to_string().contains("order.created"), "{refused}");
}

/// Arbitrary values of a type with strings (any Unicode), numbers at their limits,
/// options, lists and maps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Anything {
    id: u64,
    amount: i64,
    name: String,
    note: Option<String>,
    tags: Vec<String>,
    flags: std::collections::BTreeMap<String, bool>,
}

impl Event for Anything {
    const TYPE: &'static str = "anything.happened";
    const EXCHANGE: &'static str = "contract";
}

fn anything() -> impl proptest::strategy::Strategy<Value = Anything> {
    use proptest::prelude::*;
    (
        any::<u64>(),
        any::<i64>(),
        ".{0,40}",
        proptest::option::of(".{0,20}"),
        proptest::collection::vec(".{0,10}", 0..5),
        proptest::collection::btree_map(".{0,8}", any::<bool>(), 0..4),
    )
        .prop_map(|(id, amount, name, note, tags, flags)| Anything {
            id,
            amount,
            name,
            note,
            tags,
            flags,
        })
}

#[tokio::test]
async fn arbitrary_values_reach_the_typed_handler_as_they_were_published() {
    use proptest::strategy::{Strategy as _, ValueTree as _};
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let sent: Vec<Anything> = (0..200)
        .map(|_| anything().new_tree(&mut runner).expect("value").current())
        .collect();
    let messages: Vec<Message> = sent.iter().map(message_of).collect();
    let got = Arc::new(Mutex::new(HashMap::<MessageId, Anything>::new()));
    let handlers = {
        let got = got.clone();
        HandlerRegistry::new().on::<Anything>(move |value: Anything, cx: Context| {
            let got = got.clone();
            async move {
                got.lock().expect("lock").insert(cx.message_id, value);
                Ok(())
            }
        })
    };
    let run = consume(&messages, handlers, 3).await;
    assert!(
        run.records
            .values()
            .all(|r| r.status == InboxStatus::Consumed)
    );
    let got = got.lock().expect("lock");
    for (m, value) in messages.iter().zip(&sent) {
        assert_eq!(got.get(&m.id), Some(value));
    }
}
