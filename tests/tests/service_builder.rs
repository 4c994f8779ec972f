//! `outbox::Service`: what the builder refuses, and what it wires (issue 48).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use outbox::memory::{ExchangeKind, MemoryBroker};
use outbox::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, outbox::Event)]
#[event(type = "order.created", exchange = "orders")]
struct OrderCreated {
    order_id: u64,
}

async fn ok(_order: OrderCreated, _cx: Context) -> HandlerResult {
    Ok(())
}

fn broker() -> MemoryBroker {
    let broker = MemoryBroker::new();
    broker.declare_exchange("orders", ExchangeKind::Topic);
    broker.declare_queue("billing");
    broker.bind("billing", "orders", "order.*");
    broker
}

#[tokio::test]
async fn a_handler_registered_twice_is_refused_naming_it() {
    let Err(e) = Service::memory()
        .consumer("billing", |h| h.on(ok).on(ok))
        .build()
        .await
    else {
        panic!("two handlers for order.created v1 were accepted");
    };
    let text = e.to_string();
    assert!(
        text.contains("billing") && text.contains("order.created") && text.contains("twice"),
        "{text}"
    );
}

#[tokio::test]
async fn two_consumers_of_one_name_and_a_consumer_without_handlers_are_refused() {
    let Err(e) = Service::memory()
        .consumer("billing", |h| h.on(ok))
        .consumer("billing", |h| h.on(ok))
        .build()
        .await
    else {
        panic!("two consumers named billing were accepted");
    };
    assert!(e.to_string().contains("two consumers"), "{e}");
    let Err(e) = Service::memory().consumer("billing", |h| h).build().await else {
        panic!("a consumer without handlers was accepted");
    };
    assert!(e.to_string().contains("no handler"), "{e}");
}

#[tokio::test]
async fn a_consumer_name_no_sweep_key_can_hold_is_refused() {
    let Err(e) = Service::memory()
        .consumer("has space", |h| h.on(ok))
        .build()
        .await
    else {
        panic!("a consumer name with a space was accepted");
    };
    assert!(e.to_string().contains("has space"), "{e}");
}

#[tokio::test]
async fn a_service_dropped_without_stop_cancels_its_tasks() {
    let service = Service::memory()
        .broker(broker())
        .relay()
        .consumer("billing", |h| h.on(ok))
        .build()
        .await
        .expect("built");
    let token = service.cancel_token();
    assert!(!token.is_cancelled());
    drop(service);
    assert!(token.is_cancelled(), "nothing runs on unowned");
}

#[tokio::test]
async fn a_postgres_service_without_a_broker_or_with_a_bad_schema_is_refused_before_connecting() {
    // Nothing listens on port 1: a refusal that came after connecting would say so.
    let Err(e) = Service::postgres("postgres://nobody@127.0.0.1:1/none")
        .relay()
        .build()
        .await
    else {
        panic!("a service without a broker was accepted");
    };
    assert!(e.to_string().contains(".rabbitmq("), "{e}");
    let Err(e) = Service::postgres("postgres://nobody@127.0.0.1:1/none")
        .schema("Bad Schema")
        .rabbitmq("amqp://guest:guest@127.0.0.1:1/%2f")
        .build()
        .await
    else {
        panic!("an invalid schema was accepted");
    };
    assert!(e.to_string().contains("Bad Schema"), "{e}");
}

/// A shared handler: `Arc<H>` is a handler.
struct Counting(AtomicU32);

#[async_trait]
impl EventHandler<OrderCreated> for Counting {
    async fn handle(&self, _order: OrderCreated, _cx: Context) -> HandlerResult {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_service_relays_consumes_retries_on_time_and_stops() {
    let counting = Arc::new(Counting(AtomicU32::new(0)));
    let failures = Arc::new(AtomicU32::new(0));
    let shared = Arc::clone(&counting);
    let f = Arc::clone(&failures);
    let service = Service::memory()
        .broker(broker())
        .relay()
        .consumer("billing", move |h| {
            h.on(move |order: OrderCreated, cx: Context| {
                let (shared, f) = (Arc::clone(&shared), Arc::clone(&f));
                async move {
                    // The first attempt fails: retried at the policy's first backoff
                    // (1 s), not at the default sweep interval (a minute).
                    if cx.attempt == 1 {
                        f.fetch_add(1, Ordering::SeqCst);
                        return Err("busy".into());
                    }
                    shared.handle(order, cx).await
                }
            })
        })
        .build()
        .await
        .expect("built");
    let started = std::time::Instant::now();
    service
        .producer()
        .enqueue_event(&OrderCreated { order_id: 1 })
        .await
        .expect("enqueued");
    while counting.0.load(Ordering::SeqCst) < 1 {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "not retried within 15 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(failures.load(Ordering::SeqCst), 1);
    let stats = service.inbox().stats("billing").await.expect("stats");
    assert_eq!(stats.consumed, 1);
    let stopping = std::time::Instant::now();
    service.stop().await;
    assert!(
        stopping.elapsed() < Duration::from_secs(5),
        "stopped in {:?}",
        stopping.elapsed()
    );
}

#[tokio::test]
async fn run_until_returns_when_its_future_does() {
    let service = Service::memory()
        .broker(broker())
        .relay()
        .consumer("billing", |h| h.on(ok))
        .build()
        .await
        .expect("built");
    tokio::time::timeout(
        Duration::from_secs(10),
        service.run_until(tokio::time::sleep(Duration::from_millis(100))),
    )
    .await
    .expect("stopped")
    .expect("no task failed");
}

#[tokio::test]
async fn the_producer_maps_exchanges_at_run_time() {
    let urls = outbox_testkit::services::TestUrls::from_env();
    let Ok(pool) = outbox::postgres::connect(&urls.pg, 2, Duration::from_secs(5)).await else {
        assert!(
            std::env::var("CI").is_err(),
            "PostgreSQL is required in CI at {}",
            outbox::postgres::redact_url(&urls.pg)
        );
        eprintln!("SKIPPED (not in CI): PostgreSQL unreachable");
        return;
    };
    let schema = format!("svc_prefix_{}", std::process::id());
    let service = Service::postgres(&pool)
        .schema(&schema)
        .rabbitmq(urls.amqp.clone())
        .exchange_prefix("staging.")
        .map_exchange("invoices", "billing-v2")
        .build()
        .await
        .expect("built");
    let mut tx = pool.begin().await.expect("tx");
    service
        .producer()
        .enqueue(&mut tx, &OrderCreated { order_id: 7 })
        .await
        .expect("enqueued");
    service
        .producer()
        .enqueue(
            &mut tx,
            NewMessage::new("invoices", "invoice.issued", b"{}".to_vec()),
        )
        .await
        .expect("enqueued");
    tx.commit().await.expect("commit");
    // SAFETY-SQL: `schema` is `svc_prefix_` and digits (the process id), made above.
    let exchanges: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT exchange FROM {schema}.outbox_messages ORDER BY exchange"
    )))
    .fetch_all(&pool)
    .await
    .expect("read back");
    assert_eq!(exchanges, ["billing-v2", "staging.orders"]);
    service.stop().await;
    let _ = sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
        .execute(&pool)
        .await;
}
