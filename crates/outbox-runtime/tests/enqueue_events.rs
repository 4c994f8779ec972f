//! Typed enqueue on an `OutboxStore` ([`EnqueueEvents`]), through the memory
//! store: what is stored is what the event says, and a value that cannot become a
//! message stores nothing.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use outbox_adapters_memory::MemoryOutboxStore;
use outbox_core::event::{self, VERSION_HEADER};
use outbox_core::message::CAUSATION_HEADER;
use outbox_core::{
    Event, EventError, IntoNewMessage, Message, MessageError, MessageId, NewMessage, OutboxStatus,
};
use outbox_ports::prelude::*;
use outbox_ports::{Lease, OutboxStore, PortError, SystemClock};
use outbox_runtime::EnqueueEvents;
use proptest::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Line {
    sku: String,
    quantity: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct OrderPlaced {
    order_id: u64,
    customer: String,
    total_cents: i64,
    lines: Vec<Line>,
    note: Option<String>,
    delay_secs: u32,
}

impl Event for OrderPlaced {
    const TYPE: &'static str = "order.placed";
    const VERSION: u32 = 3;
    const EXCHANGE: &'static str = "shop.orders";

    fn routing_key(&self) -> Cow<'_, str> {
        Cow::Owned(format!("order.placed.{}", self.order_id % 4))
    }

    fn ordering_key(&self) -> Option<String> {
        Some(format!("customer:{}", self.customer))
    }

    fn delay(&self) -> Option<Duration> {
        (self.delay_secs > 0).then(|| Duration::from_secs(u64::from(self.delay_secs)))
    }
}

/// Cannot be written as JSON: map keys must be strings.
#[derive(Debug, Serialize, Deserialize)]
struct TupleKeys {
    map: BTreeMap<(u8, u8), u8>,
}

impl Event for TupleKeys {
    const TYPE: &'static str = "tuple.keys";
    const EXCHANGE: &'static str = "x";
}

fn order(order_id: u64, delay_secs: u32) -> OrderPlaced {
    OrderPlaced {
        order_id,
        customer: format!("c{}", order_id % 3),
        total_cents: 1999,
        lines: vec![Line {
            sku: "book".into(),
            quantity: 2,
        }],
        note: Some("gift \u{1F381}".into()),
        delay_secs,
    }
}

fn store() -> Arc<MemoryOutboxStore> {
    Arc::new(MemoryOutboxStore::new(Arc::new(SystemClock)))
}

fn lease() -> Lease {
    Lease::new("typed-test", Duration::from_secs(60))
}

async fn stored(store: &MemoryOutboxStore, id: MessageId) -> Message {
    let record = store.get_message(id).await.expect("get").expect("stored");
    assert_eq!(record.status, OutboxStatus::Pending);
    record.message
}

/// What the event says, on the stored message.
fn assert_carries(m: &Message, order: &OrderPlaced) {
    assert_eq!(m.message_type.as_deref(), Some("order.placed"));
    assert_eq!(m.content_type, "application/json");
    assert_eq!(m.headers.get(VERSION_HEADER).map(String::as_str), Some("3"));
    assert_eq!(m.exchange, "shop.orders");
    assert_eq!(
        m.routing_key,
        format!("order.placed.{}", order.order_id % 4)
    );
    assert_eq!(m.ordering_key, order.ordering_key());
    let due = order
        .delay()
        .map(|d| m.created_at + time::Duration::try_from(d).expect("short"));
    assert_eq!(m.not_before, due);
    assert_eq!(event::decode::<OrderPlaced>(m).expect("decodes"), *order);
}

#[tokio::test]
async fn a_typed_event_is_stored_as_the_event_says_and_decodes_back() {
    let store = store();
    for (n, delay_secs) in [(1, 0), (2, 90)] {
        let order = order(n, delay_secs);
        let id = store.enqueue_event(&order).await.expect("enqueue");
        assert_eq!(id.as_uuid().get_version_num(), 7);
        let m = stored(&store, id).await;
        assert_carries(&m, &order);
        let body: serde_json::Value = serde_json::from_slice(&m.payload).expect("JSON");
        assert_eq!(body["order_id"], n);
    }
    // The one due at once goes to the relay; the delayed one waits.
    let claimed = store.claim_pending(&lease(), 10).await.expect("claim");
    assert_eq!(claimed.len(), 1);
    assert_carries(&claimed[0].message, &order(1, 0));
}

#[tokio::test]
async fn any_outbox_store_behind_dyn_enqueues_events() {
    let memory = store();
    let dynamic: Arc<dyn OutboxStore> = memory.clone();
    let id = dynamic.enqueue_event(&order(5, 0)).await.expect("enqueue");
    let ids = dynamic
        .enqueue_events(&[order(6, 0), order(7, 0)])
        .await
        .expect("enqueue");
    assert_eq!(ids.len(), 2);
    // The futures are Send: a spawned task enqueues as well.
    let spawned = {
        let dynamic = dynamic.clone();
        tokio::spawn(async move { dynamic.enqueue_event(&order(8, 0)).await })
    };
    spawned.await.expect("joined").expect("enqueue");
    assert_eq!(memory.count(OutboxStatus::Pending), 4);
    assert_carries(&stored(&memory, id).await, &order(5, 0));
    // A plain NewMessage goes the same way.
    let plain = dynamic
        .enqueue_event(NewMessage::new("e", "k", b"{}".to_vec()))
        .await
        .expect("plain");
    assert_eq!(stored(&memory, plain).await.routing_key, "k");
    assert!(
        dynamic
            .enqueue_events::<OrderPlaced>(&[])
            .await
            .expect("none")
            .is_empty()
    );
}

#[tokio::test]
async fn an_event_over_the_stores_payload_limit_is_refused_naming_it_and_nothing_is_stored() {
    let limit = 200;
    let store =
        Arc::new(MemoryOutboxStore::new(Arc::new(SystemClock)).with_max_payload_bytes(limit));
    assert_eq!(store.max_payload_bytes(), limit);
    let mut big = order(1, 0);
    big.note = Some("x".repeat(limit));
    let err = store.enqueue_event(&big).await.expect_err("too large");
    match &err {
        PortError::InvalidEvent(EventError::Invalid {
            message_type,
            rust_type,
            error: MessageError::PayloadTooLarge { max, .. },
        }) => {
            assert_eq!((*message_type, *max), ("order.placed", limit));
            assert!(rust_type.ends_with("OrderPlaced"), "{rust_type}");
        }
        other => panic!("expected InvalidEvent(Invalid(PayloadTooLarge)), got {other:?}"),
    }
    assert!(!err.is_retryable());
    // One too large among several: none is stored.
    let err = store
        .enqueue_events(&[order(2, 0), big, order(3, 0)])
        .await
        .expect_err("one too large");
    assert!(matches!(err, PortError::InvalidEvent(_)), "{err:?}");
    assert_eq!(store.stats().await.expect("stats").pending, 0);
    assert!(
        store
            .claim_pending(&lease(), 10)
            .await
            .expect("claim")
            .is_empty()
    );
}

#[tokio::test]
async fn an_event_that_cannot_be_serialized_is_refused_and_nothing_is_stored() {
    let store = store();
    let bad = TupleKeys {
        map: [((1, 2), 3)].into(),
    };
    let err = store.enqueue_event(&bad).await.expect_err("tuple keys");
    assert!(
        matches!(err, PortError::InvalidEvent(EventError::Encode { .. })),
        "{err:?}"
    );
    assert!(err.to_string().contains("key must be a string"), "{err}");
    let err = store
        .enqueue_events(std::slice::from_ref(&bad))
        .await
        .expect_err("tuple keys");
    assert!(matches!(err, PortError::InvalidEvent(_)), "{err:?}");
    assert_eq!(store.stats().await.expect("stats").pending, 0);
}

#[tokio::test]
async fn enqueue_events_stores_all_in_order_or_none() {
    let store = store();
    let orders: Vec<_> = (0..20).map(|n| order(n, 0)).collect();
    let ids = store.enqueue_events(&orders).await.expect("enqueue");
    assert_eq!(ids.len(), 20);
    let stored = store
        .oldest_messages(OutboxStatus::Pending, 100)
        .await
        .expect("list");
    let stored_ids: Vec<_> = stored.iter().map(|r| r.message.id).collect();
    assert_eq!(stored_ids, ids, "stored in the order given");
    for (r, o) in stored.iter().zip(&orders) {
        assert_carries(&r.message, o);
    }
    // The relay takes each key's head first, in that order.
    let claimed = store.claim_pending(&lease(), 100).await.expect("claim");
    let claimed_ids: Vec<_> = claimed.iter().map(|c| c.message.id).collect();
    assert_eq!(claimed_ids, ids[..3]);

    // A routing key longer than AMQP allows in the middle: none of them.
    let store = self::store();
    let mut orders: Vec<_> = (0..5).map(|n| order(n, 0)).collect();
    orders[2].customer = "c".repeat(300);
    let err = store
        .enqueue_events(&orders)
        .await
        .expect_err("one invalid");
    assert!(
        matches!(
            err,
            PortError::InvalidEvent(EventError::Invalid {
                error: MessageError::TooLong {
                    field: "ordering_key",
                    ..
                },
                ..
            })
        ),
        "{err:?}"
    );
    assert_eq!(store.stats().await.expect("stats").pending, 0);
}

#[tokio::test]
async fn an_event_caused_by_another_message_keeps_its_correlation_and_names_its_cause() {
    let store = store();
    let first = store.enqueue_event(&order(1, 0)).await.expect("first");
    let incoming = stored(&store, first).await;
    let second = store
        .enqueue_event(order(2, 0).caused_by(&incoming))
        .await
        .expect("second");
    let m = stored(&store, second).await;
    assert_carries(&m, &order(2, 0));
    assert_eq!(m.causation_id(), Some(first.to_string().as_str()));
    assert_eq!(m.correlation_id, Some(first.to_string()));
    let third = store
        .enqueue_event((&order(3, 0)).caused_by(&m))
        .await
        .expect("third");
    let m3 = stored(&store, third).await;
    assert_eq!(m3.correlation_id, Some(first.to_string()), "kept");
    assert_eq!(m3.headers.get(CAUSATION_HEADER), Some(&second.to_string()));
}

fn any_order() -> impl Strategy<Value = OrderPlaced> {
    (
        any::<u64>(),
        "\\PC{0,40}",
        any::<i64>(),
        proptest::collection::vec(("\\PC{0,12}", any::<u32>()), 0..4),
        proptest::option::of("\\PC{0,30}"),
        0u32..100_000,
    )
        .prop_map(
            |(order_id, customer, total_cents, lines, note, delay_secs)| OrderPlaced {
                order_id,
                customer,
                total_cents,
                lines: lines
                    .into_iter()
                    .map(|(sku, quantity)| Line { sku, quantity })
                    .collect(),
                note,
                delay_secs,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Any value goes in through the typed enqueue and comes out of the store
    /// (as the relay reads it) the same, with what its event says.
    #[test]
    fn values_round_trip_through_the_memory_store(orders in proptest::collection::vec(any_order(), 1..6)) {
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        rt.block_on(async {
            let store = store();
            let ids = store.enqueue_events(&orders).await.expect("enqueue");
            for (id, order) in ids.iter().zip(&orders) {
                let m = stored(&store, *id).await;
                assert_carries(&m, order);
            }
            let one = store.enqueue_event(&orders[0]).await.expect("enqueue one");
            assert_eq!(
                event::decode::<OrderPlaced>(&stored(&store, one).await).expect("decodes"),
                orders[0]
            );
        });
    }
}
