//! Typed events on PostgreSQL: `PgOutbox::enqueue(&mut tx, &event)` and
//! `enqueue_all` in the caller's transaction, and `EnqueueEvents` on the store.
//! What is stored is what the event says; a value that cannot become a message
//! is refused before anything is written, and the transaction goes on.

mod common;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::time::Duration;

use outbox_adapters_postgres::{PgOutbox, PgOutboxStore, PgPool, PgSchema};
use outbox_core::event::{self, VERSION_HEADER};
use outbox_core::{
    Event, EventError, IntoNewMessage, Message, MessageError, MessageId, NewMessage, OutboxStatus,
};
use outbox_ports::prelude::*;
use outbox_ports::{Lease, PortError};
use outbox_runtime::EnqueueEvents;
use proptest::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct OrderPlaced {
    order_id: u64,
    customer: String,
    total_cents: i64,
    note: Option<String>,
    delay_secs: u32,
}

impl Event for OrderPlaced {
    const TYPE: &'static str = "order.placed";
    const VERSION: u32 = 2;
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
        note: Some("gift \u{1F381} \"wrapped\"".into()),
        delay_secs,
    }
}

fn lease() -> Lease {
    Lease::new(outbox_testkit::unique_key("typed"), Duration::from_secs(60))
}

/// What the event says, on the message read back from the table.
fn assert_carries(m: &Message, order: &OrderPlaced) {
    assert_eq!(m.message_type.as_deref(), Some("order.placed"));
    assert_eq!(m.content_type, "application/json");
    assert_eq!(m.headers.get(VERSION_HEADER).map(String::as_str), Some("2"));
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

async fn read(store: &PgOutboxStore, id: MessageId) -> Message {
    let record = store.get_message(id).await.expect("get").expect("stored");
    assert_eq!(record.status, OutboxStatus::Pending);
    record.message
}

async fn rows(pool: &PgPool, schema: &PgSchema) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {}.outbox_messages",
        schema.quoted()
    )))
    .fetch_one(pool)
    .await
    .expect("count")
}

/// The ids in the table, in insert (claim) order.
async fn ids_in_order(pool: &PgPool, schema: &PgSchema) -> Vec<MessageId> {
    sqlx::query_scalar::<_, uuid::Uuid>(sqlx::AssertSqlSafe(format!(
        "SELECT id FROM {}.outbox_messages ORDER BY seq",
        schema.quoted()
    )))
    .fetch_all(pool)
    .await
    .expect("ids")
    .into_iter()
    .map(MessageId::from_uuid)
    .collect()
}

/// A statement-level trigger counting the `INSERT` statements on the outbox
/// table (not the rows): `statements(..)` reads the count.
async fn count_insert_statements(pool: &PgPool, schema: &PgSchema) {
    let s = schema.quoted();
    for sql in [
        format!("CREATE TABLE {s}.insert_statements (n int NOT NULL)"),
        format!("INSERT INTO {s}.insert_statements VALUES (0)"),
        format!(
            "CREATE FUNCTION {s}.count_insert() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN UPDATE {s}.insert_statements SET n = n + 1; RETURN NULL; END $$"
        ),
        format!(
            "CREATE TRIGGER count_insert AFTER INSERT ON {s}.outbox_messages \
             FOR EACH STATEMENT EXECUTE FUNCTION {s}.count_insert()"
        ),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(&*sql))
            .execute(pool)
            .await
            .expect(&sql);
    }
}

async fn statements(pool: &PgPool, schema: &PgSchema) -> i32 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT n FROM {}.insert_statements",
        schema.quoted()
    )))
    .fetch_one(pool)
    .await
    .expect("statements")
}

async fn orders_table(pool: &PgPool, schema: &PgSchema) {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {}.orders (id bigint PRIMARY KEY)",
        schema.quoted()
    )))
    .execute(pool)
    .await
    .expect("orders table");
}

async fn insert_order(tx: &mut sqlx::PgConnection, schema: &PgSchema, id: i64) {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {}.orders VALUES ($1)",
        schema.quoted()
    )))
    .bind(id)
    .execute(tx)
    .await
    .expect("order");
}

#[tokio::test]
async fn a_typed_event_enqueued_in_the_callers_transaction_is_stored_as_the_event_says() {
    with_db!(|pool, schema| {
        orders_table(&pool, &schema).await;
        let outbox = PgOutbox::new(schema.clone());
        let store = PgOutboxStore::new(pool.clone(), schema.clone());

        let mut tx = pool.begin().await.expect("begin");
        insert_order(&mut tx, &schema, 1).await;
        let at_once = outbox.enqueue(&mut tx, &order(1, 0)).await.expect("typed");
        let delayed = outbox.enqueue(&mut tx, &order(2, 90)).await.expect("typed");
        // A NewMessage goes through the same call, as before.
        let plain = outbox
            .enqueue(
                &mut tx,
                NewMessage::new("orders", "order.created", b"{}".to_vec()),
            )
            .await
            .expect("plain");
        tx.commit().await.expect("commit");

        assert_carries(&read(&store, at_once).await, &order(1, 0));
        assert_carries(&read(&store, delayed).await, &order(2, 90));
        let m = read(&store, plain).await;
        assert_eq!(
            (m.message_type, m.content_type.as_str()),
            (None, "application/json")
        );

        // The relay path: the one due at once (and the plain one), not the delayed one.
        let claimed = store.claim_pending(&lease(), 10).await.expect("claim");
        let ids: Vec<_> = claimed.iter().map(|c| c.message.id).collect();
        assert_eq!(ids, [at_once, plain]);
        assert_carries(&claimed[0].message, &order(1, 0));
        let body: serde_json::Value =
            serde_json::from_slice(&claimed[0].message.payload).expect("JSON");
        assert_eq!(body["note"], "gift \u{1F381} \"wrapped\"");

        // Rolled back: neither the order nor its event.
        let mut tx = pool.begin().await.expect("begin");
        insert_order(&mut tx, &schema, 3).await;
        let gone = outbox.enqueue(&mut tx, &order(3, 0)).await.expect("typed");
        tx.rollback().await.expect("rollback");
        assert!(store.get_message(gone).await.expect("get").is_none());
        assert_eq!(rows(&pool, &schema).await, 3);
    });
}

#[tokio::test]
async fn an_event_over_the_payload_limit_is_refused_and_the_transaction_goes_on() {
    with_db!(|pool, schema| {
        orders_table(&pool, &schema).await;
        let limit = 200;
        let outbox = PgOutbox::new(schema.clone()).with_max_payload_bytes(limit);
        let mut big = order(1, 0);
        big.note = Some("x".repeat(limit));

        let mut tx = pool.begin().await.expect("begin");
        insert_order(&mut tx, &schema, 1).await;
        let err = outbox.enqueue(&mut tx, &big).await.expect_err("too large");
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
        // Refused before any SQL: the transaction is not aborted and commits.
        let kept = outbox.enqueue(&mut tx, &order(2, 0)).await.expect("fits");
        tx.commit().await.expect("commit");
        assert_eq!(ids_in_order(&pool, &schema).await, [kept]);
        let orders: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM {}.orders",
            schema.quoted()
        )))
        .fetch_one(&pool)
        .await
        .expect("orders");
        assert_eq!(orders, 1);
    });
}

#[tokio::test]
async fn an_event_that_cannot_be_serialized_is_refused_and_nothing_is_written() {
    with_db!(|pool, schema| {
        let outbox = PgOutbox::new(schema.clone());
        let bad = TupleKeys {
            map: [((1, 2), 3)].into(),
        };
        let mut tx = pool.begin().await.expect("begin");
        let err = outbox.enqueue(&mut tx, &bad).await.expect_err("tuple keys");
        assert!(
            matches!(err, PortError::InvalidEvent(EventError::Encode { .. })),
            "{err:?}"
        );
        assert!(err.to_string().contains("key must be a string"), "{err}");
        let err = outbox
            .enqueue_all(&mut tx, std::slice::from_ref(&bad))
            .await
            .expect_err("tuple keys");
        assert!(matches!(err, PortError::InvalidEvent(_)), "{err:?}");
        tx.commit().await.expect("the transaction is still usable");
        assert_eq!(rows(&pool, &schema).await, 0);
    });
}

#[tokio::test]
async fn enqueue_all_writes_every_event_in_one_statement_in_order_or_none() {
    with_db!(|pool, schema| {
        count_insert_statements(&pool, &schema).await;
        let outbox = PgOutbox::new(schema.clone());
        let store = PgOutboxStore::new(pool.clone(), schema.clone());
        let orders: Vec<_> = (0..25).map(|n| order(n, 0)).collect();

        let mut tx = pool.begin().await.expect("begin");
        let ids = outbox.enqueue_all(&mut tx, &orders).await.expect("all");
        tx.commit().await.expect("commit");
        assert_eq!(statements(&pool, &schema).await, 1, "one INSERT statement");
        assert_eq!(
            ids_in_order(&pool, &schema).await,
            ids,
            "in the order given"
        );
        for (id, o) in ids.iter().zip(&orders) {
            assert_carries(&read(&store, *id).await, o);
        }

        // Events by reference in enqueue_batch, as NewMessages were.
        let mut conn = pool.acquire().await.expect("conn");
        let more = outbox
            .enqueue_batch(&mut conn, vec![&order(30, 0), &order(31, 5)])
            .await
            .expect("batch");
        assert_eq!(statements(&pool, &schema).await, 2);
        assert_carries(&read(&store, more[1]).await, &order(31, 5));

        // One invalid event in the middle: none of them, and no statement ran.
        let mut orders: Vec<_> = (40..45).map(|n| order(n, 0)).collect();
        orders[2].customer = "c".repeat(300);
        let err = outbox
            .enqueue_all(&mut conn, &orders)
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
        assert_eq!(statements(&pool, &schema).await, 2);
        assert_eq!(rows(&pool, &schema).await, 27);
        // Nothing at all: no statement either.
        let none = outbox
            .enqueue_all::<OrderPlaced>(&mut conn, &[])
            .await
            .expect("none");
        assert!(none.is_empty());
        assert_eq!(statements(&pool, &schema).await, 2);
    });
}

#[tokio::test]
async fn an_event_caused_by_a_received_message_carries_its_correlation_and_cause() {
    with_db!(|pool, schema| {
        let outbox = PgOutbox::new(schema.clone());
        let store = PgOutboxStore::new(pool.clone(), schema.clone());
        let mut conn = pool.acquire().await.expect("conn");
        let first = outbox
            .enqueue(&mut conn, &order(1, 0))
            .await
            .expect("first");
        let incoming = read(&store, first).await;
        let second = outbox
            .enqueue(&mut conn, order(2, 0).caused_by(&incoming))
            .await
            .expect("second");
        let m = read(&store, second).await;
        assert_carries(&m, &order(2, 0));
        assert_eq!(m.correlation_id, Some(first.to_string()));
        assert_eq!(m.causation_id(), Some(first.to_string().as_str()));
    });
}

#[tokio::test]
async fn the_store_enqueues_events_without_a_transaction_of_the_callers() {
    with_db!(|pool, schema| {
        count_insert_statements(&pool, &schema).await;
        let limit = 300;
        let store = PgOutboxStore::new(pool.clone(), schema.clone()).with_max_payload_bytes(limit);
        assert_eq!(store.max_payload_bytes(), limit);
        let dynamic: std::sync::Arc<dyn outbox_ports::OutboxStore> =
            std::sync::Arc::new(store.clone());

        let one = dynamic.enqueue_event(&order(1, 60)).await.expect("one");
        assert_carries(&read(&store, one).await, &order(1, 60));
        let orders: Vec<_> = (2..12).map(|n| order(n, 0)).collect();
        let ids = dynamic.enqueue_events(&orders).await.expect("all");
        assert_eq!(statements(&pool, &schema).await, 2);
        assert_eq!(ids_in_order(&pool, &schema).await[1..], ids);
        for (id, o) in ids.iter().zip(&orders) {
            assert_carries(&read(&store, *id).await, o);
        }

        // Over the store's limit, alone or among others: refused, naming the
        // event, and nothing is written.
        let mut big = order(20, 0);
        big.note = Some("x".repeat(limit));
        let err = dynamic.enqueue_event(&big).await.expect_err("too large");
        assert!(
            matches!(
                err,
                PortError::InvalidEvent(EventError::Invalid {
                    error: MessageError::PayloadTooLarge { max: 300, .. },
                    ..
                })
            ),
            "{err:?}"
        );
        let err = dynamic
            .enqueue_events(&[order(21, 0), big])
            .await
            .expect_err("one too large");
        assert!(matches!(err, PortError::InvalidEvent(_)), "{err:?}");
        let bad = TupleKeys {
            map: [((1, 2), 3)].into(),
        };
        let err = dynamic.enqueue_event(&bad).await.expect_err("tuple keys");
        assert!(
            matches!(err, PortError::InvalidEvent(EventError::Encode { .. })),
            "{err:?}"
        );
        assert_eq!(rows(&pool, &schema).await, 11);
        assert_eq!(statements(&pool, &schema).await, 2);
    });
}

fn any_order() -> impl Strategy<Value = OrderPlaced> {
    (
        any::<u64>(),
        "\\PC{0,40}",
        any::<i64>(),
        proptest::option::of("\\PC{0,60}"),
        0u32..100_000,
    )
        .prop_map(
            |(order_id, customer, total_cents, note, delay_secs)| OrderPlaced {
                order_id,
                customer,
                total_cents,
                note,
                delay_secs,
            },
        )
}

/// Any value goes in through the typed enqueue and comes back out of the table
/// the same, with what its event says (a few cases: each is a round trip to the
/// database).
#[test]
fn values_round_trip_through_the_table() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let Some(pool) = rt.block_on(common::pool()) else {
        return;
    };
    let schema = rt.block_on(common::fresh(&pool));
    let outbox = PgOutbox::new(schema.clone());
    let store = PgOutboxStore::new(pool.clone(), schema.clone());
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(24));
    runner
        .run(&proptest::collection::vec(any_order(), 1..4), |orders| {
            rt.block_on(async {
                let mut tx = pool.begin().await.expect("begin");
                let ids = outbox.enqueue_all(&mut tx, &orders).await.expect("all");
                let one = outbox.enqueue(&mut tx, &orders[0]).await.expect("one");
                tx.commit().await.expect("commit");
                for (id, order) in ids.iter().zip(&orders) {
                    assert_carries(&read(&store, *id).await, order);
                }
                let m = read(&store, one).await;
                prop_assert_eq!(
                    event::decode::<OrderPlaced>(&m).expect("decodes"),
                    orders[0].clone()
                );
                // The body the pure conversion makes.
                let made = (&orders[0]).into_new_message(1 << 20).expect("valid");
                prop_assert_eq!(&m.payload, &made.payload);
                Ok(())
            })
        })
        .expect("round trips");
}

/// The event of `docs/typed-messages.md`'s SQL example.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct OrderCreated {
    order_id: u64,
    total_cents: u64,
    customer: String,
}

impl Event for OrderCreated {
    const TYPE: &'static str = "order.created";
    const EXCHANGE: &'static str = "shop.orders";
}

#[tokio::test]
async fn a_row_written_in_plain_sql_by_the_documented_contract_decodes_as_the_event() {
    with_db!(|pool, schema| {
        let s = schema.quoted();
        let body = r#"{"order_id": 42, "total_cents": 1999, "customer": "ada"}"#;
        // As docs/typed-messages.md writes it, with and without the version header
        // and the content type (the column's default).
        for sql in [
            format!(
                "INSERT INTO {s}.outbox_messages (exchange, routing_key, message_type, headers, payload) \
                 VALUES ('shop.orders', 'order.created', 'order.created', '{{\"outbox-version\": \"1\"}}', \
                 convert_to('{body}', 'UTF8'))"
            ),
            format!(
                "INSERT INTO {s}.outbox_messages (exchange, routing_key, message_type, content_type, payload) \
                 VALUES ('shop.orders', 'order.created', 'order.created', 'application/json; charset=utf-8', \
                 convert_to('{body}', 'UTF8'))"
            ),
        ] {
            sqlx::query(sqlx::AssertSqlSafe(&*sql))
                .execute(&pool)
                .await
                .expect(&sql);
        }
        let store = PgOutboxStore::new(pool.clone(), schema.clone());
        let claimed = store.claim_pending(&lease(), 10).await.expect("claim");
        assert_eq!(claimed.len(), 2);
        let expected = OrderCreated {
            order_id: 42,
            total_cents: 1999,
            customer: "ada".into(),
        };
        for c in &claimed {
            assert_eq!(
                event::decode::<OrderCreated>(&c.message).expect("decodes"),
                expected
            );
        }
        // The same row without the header is version 1: a version-2 type refuses it.
        #[derive(Debug, Serialize, Deserialize)]
        struct OrderCreatedV2 {
            order_id: u64,
        }
        impl Event for OrderCreatedV2 {
            const TYPE: &'static str = "order.created";
            const VERSION: u32 = 2;
            const EXCHANGE: &'static str = "shop.orders";
        }
        let err = event::decode::<OrderCreatedV2>(&claimed[1].message).expect_err("version 1");
        assert!(err.is_permanent(), "{err}");
    });
}
