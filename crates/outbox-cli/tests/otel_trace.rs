//! One trace from the producer's transaction to the consumer's handler, through the
//! PostgreSQL outbox, the real relay (`Dispatcher`) and RabbitMQ, and the
//! PostgreSQL inbox (`PgConsumerWorker`), checked with an in-memory span exporter.
//! The relay runs under a span of another trace, as a relay does: if it did not
//! continue the stored context, its `send` span (and the consumer's `process`
//! span after it) would be in that other trace.
// `cli` is what brings the PostgreSQL paths of the relay and the consumers here.
#![cfg(all(feature = "otel", feature = "cli"))]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use opentelemetry::trace::{SpanKind, TraceContextExt as _, TraceId, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use outbox_adapters_postgres::{
    PgConnection, PgInboxStore, PgOutbox, PgOutboxStore, PgPool, PgSchema, connect, migrate,
};
use outbox_adapters_rabbitmq::{
    BindingSpec, ExchangeKind, ExchangeSpec, QueueSpec, RabbitPublisher, RabbitPublisherConfig,
    RabbitSubscriber, Topology,
};
use outbox_consumer::{
    CancellationToken, ConsumerConfig, HandlerError, PgConsumerWorker, PgHandler, PgHandlerRegistry,
};
use outbox_core::{Message, NewMessage, OutboxStatus};
use outbox_ports::SystemClock;
use outbox_ports::prelude::*;
use outbox_relay::{Dispatcher, DispatcherConfig};
use tracing::Instrument as _;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;
use tracing_subscriber::layer::SubscriberExt as _;

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

async fn services() -> Option<(PgPool, lapin::Connection, String)> {
    let db = std::env::var("OUTBOX_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let amqp = std::env::var("OUTBOX_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned());
    let pool = connect(&db, 4, Duration::from_secs(5)).await;
    let conn = outbox_adapters_rabbitmq::connect(&amqp, Duration::from_secs(5)).await;
    match (pool, conn) {
        (Ok(p), Ok(c)) => Some((p, c, amqp)),
        (p, c) if in_ci() => panic!(
            "PostgreSQL ({db}) and RabbitMQ are required in CI: {:?} / {:?}",
            p.err(),
            c.err()
        ),
        _ => {
            eprintln!("SKIPPED (not in CI): PostgreSQL or RabbitMQ unreachable");
            None
        }
    }
}

/// Records the trace each message's handler runs in; takes a while, so that the
/// deliveries behind the first ones wait and share inbox transactions.
struct Seen(Arc<Mutex<Vec<(outbox_core::MessageId, TraceId)>>>);

#[async_trait]
impl PgHandler for Seen {
    async fn handle(&self, _conn: &mut PgConnection, m: &Message) -> Result<(), HandlerError> {
        let cx = tracing::Span::current().context();
        self.0
            .lock()
            .expect("lock")
            .push((m.id, cx.span().span_context().trace_id()));
        tokio::time::sleep(Duration::from_millis(20)).await;
        Ok(())
    }
}

/// Messages enqueued besides the one followed closely, each in a trace of its own.
const OTHERS: usize = 11;

fn attr(span: &SpanData, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_from_enqueue_through_rabbitmq_to_the_handler() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    outbox_cli::otel::install_propagator();
    // The enqueue's `create` span goes to the global provider (as `outbox run` sets it).
    opentelemetry::global::set_tracer_provider(provider.clone());
    tracing::subscriber::set_global_default(
        tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("otel-test"))),
    )
    .expect("the only subscriber of this test binary");

    let Some((pool, conn, amqp)) = services().await else {
        return;
    };
    let key = outbox_testkit::unique_key("otel");
    let id = key.replace(['.', '-'], "_");
    let schema = PgSchema::new(&format!("ot_{}", &id[id.len() - 20..])).expect("schema");
    migrate(&pool, &schema).await.expect("migrate");
    let exchange = format!("outbox-test.{key}.x");
    let queue = format!("outbox-test.{key}.q");
    Topology {
        exchanges: vec![ExchangeSpec {
            name: exchange.clone(),
            kind: ExchangeKind::Topic,
            durable: false,
            shards: 1,
        }],
        queues: vec![QueueSpec::durable(&queue)],
        bindings: vec![BindingSpec {
            queue: queue.clone(),
            exchange: exchange.clone(),
            routing_key: "#".into(),
        }],
    }
    .declare(&conn)
    .await
    .expect("topology");

    // The producer's business transaction, under its own span.
    let checkout = tracing::info_span!("checkout");
    let producer_trace = checkout.context().span().span_context().trace_id();
    assert_ne!(producer_trace, TraceId::INVALID, "the layer is installed");
    let outbox = PgOutbox::new(schema.clone());
    let message_id = async {
        let mut tx = pool.begin().await.expect("begin");
        let id = outbox
            .enqueue(
                &mut tx,
                NewMessage::new(&exchange, "order.created", br#"{"id":1}"#.to_vec()),
            )
            .await
            .expect("enqueue");
        tx.commit().await.expect("commit");
        id
    }
    .instrument(checkout.clone())
    .await;
    drop(checkout);
    // Others, each under a producer span of its own: batched in the inbox, each
    // handler must still run in its own message's trace.
    let mut traces = vec![(message_id, producer_trace)];
    for n in 0..OTHERS {
        let span = tracing::info_span!("another checkout", n);
        let trace = span.context().span().span_context().trace_id();
        let id = async {
            let mut tx = pool.begin().await.expect("begin");
            let id = outbox
                .enqueue(
                    &mut tx,
                    NewMessage::new(&exchange, "order.created", br#"{"id":2}"#.to_vec()),
                )
                .await
                .expect("enqueue");
            tx.commit().await.expect("commit");
            id
        }
        .instrument(span)
        .await;
        traces.push((id, trace));
    }

    let store = Arc::new(PgOutboxStore::new(pool.clone(), schema.clone()));
    let stored = store
        .get_message(message_id)
        .await
        .expect("get")
        .expect("row");
    let traceparent = stored
        .message
        .headers
        .get("traceparent")
        .cloned()
        .expect("the trace context is stored with the message");
    assert!(
        traceparent.contains(&producer_trace.to_string()),
        "{traceparent}"
    );

    // The relay, in a trace of its own.
    let dispatcher = Dispatcher::new(
        store.clone(),
        Arc::new(RabbitPublisher::new(RabbitPublisherConfig::new(&amqp))),
        DispatcherConfig::default(),
        "otel-test",
    );
    let relay_tick = tracing::info_span!("relay tick");
    let relay_trace = relay_tick.context().span().span_context().trace_id();
    let counts = tokio::time::timeout(
        Duration::from_secs(30),
        dispatcher.run_once().instrument(relay_tick.clone()),
    )
    .await
    .expect("the batch finishes")
    .expect("recorded");
    drop(relay_tick);
    assert_eq!(counts.sent, 1 + OTHERS as u64, "{counts:?}");
    assert_eq!(
        store
            .get_message(message_id)
            .await
            .expect("get")
            .expect("row")
            .status,
        OutboxStatus::Sent
    );

    let seen = Arc::new(Mutex::new(Vec::new()));
    let inbox = PgInboxStore::new(pool.clone(), &schema);
    let worker = PgConsumerWorker::new(
        inbox.clone(),
        Arc::new(RabbitSubscriber::new(&amqp)),
        PgHandlerRegistry::new().fallback(Arc::new(Seen(Arc::clone(&seen)))),
        Arc::new(SystemClock),
        ConsumerConfig::new("billing", &queue),
    );
    let cancel = CancellationToken::new();
    let running = tokio::spawn(worker.run(cancel.clone()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while seen.lock().expect("lock").len() < traces.len() {
        assert!(tokio::time::Instant::now() < deadline, "never consumed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The span ends when the delivery is settled.
    let process_name = format!("process {queue}");
    while exporter
        .get_finished_spans()
        .expect("spans")
        .iter()
        .filter(|s| s.name == process_name)
        .count()
        < traces.len()
    {
        assert!(tokio::time::Instant::now() < deadline, "no process span");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cancel.cancel();
    running.await.expect("worker");
    provider.force_flush().expect("flush");

    let spans = exporter.get_finished_spans().expect("spans");
    // The span of that name of the message followed closely (the checkout has no id).
    let find = |name: &str| {
        let id = message_id.to_string();
        spans
            .iter()
            .find(|s| s.name == name && attr(s, "messaging.message.id").is_none_or(|a| a == id))
            .unwrap_or_else(|| {
                panic!(
                    "no span {name} among {:?}",
                    spans.iter().map(|s| &s.name).collect::<Vec<_>>()
                )
            })
            .clone()
    };
    let checkout = find("checkout");
    let create = find(&format!("create {exchange}"));
    let send = find(&format!("send {exchange}"));
    let process = find(&process_name);
    assert_ne!(relay_trace, producer_trace);
    assert_eq!(
        send.span_context.trace_id(),
        producer_trace,
        "the relay continued the stored trace"
    );
    assert_eq!(
        create.parent_span_id,
        checkout.span_context.span_id(),
        "the enqueue's create span is the producer's child"
    );
    assert_eq!(create.span_kind, SpanKind::Producer);
    assert_eq!(create.span_context.trace_id(), producer_trace);
    assert_eq!(
        attr(&create, "messaging.operation.type").as_deref(),
        Some("create")
    );
    assert_eq!(
        send.parent_span_id,
        create.span_context.span_id(),
        "the relay's send continues from the stored create span"
    );
    assert_eq!(send.span_kind, SpanKind::Client);
    assert_eq!(
        process.span_context.trace_id(),
        producer_trace,
        "the consumer continued the delivery's trace"
    );
    assert_eq!(
        process.parent_span_id,
        send.span_context.span_id(),
        "the published traceparent is the send span's"
    );
    assert_eq!(process.span_kind, SpanKind::Consumer);
    let mut seen = seen.lock().expect("lock").clone();
    seen.sort_by_key(|(id, _)| *id.as_uuid());
    traces.sort_by_key(|(id, _)| *id.as_uuid());
    assert_eq!(
        seen, traces,
        "each handler runs once, in its own message's trace"
    );
    let transactions: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(DISTINCT received_at) FROM {}.outbox_inbox",
        schema.quoted()
    )))
    .fetch_one(&pool)
    .await
    .expect("transactions");
    assert!(
        transactions < traces.len() as i64,
        "{} deliveries in {transactions} inbox transactions: no batch, nothing shown",
        traces.len()
    );
    for (span, expected) in [
        (
            &send,
            vec![
                ("messaging.system", "rabbitmq".to_owned()),
                ("messaging.destination.name", exchange.clone()),
                (
                    "messaging.rabbitmq.destination.routing_key",
                    "order.created".to_owned(),
                ),
                ("messaging.message.id", message_id.to_string()),
                ("messaging.message.body.size", "8".to_owned()),
                ("outbox.attempt", "1".to_owned()),
            ],
        ),
        (
            &process,
            vec![
                ("messaging.system", "rabbitmq".to_owned()),
                ("messaging.consumer.group.name", "billing".to_owned()),
                ("messaging.message.id", message_id.to_string()),
                ("outbox.inbox.duplicate", "false".to_owned()),
            ],
        ),
    ] {
        for (k, v) in expected {
            assert_eq!(
                attr(span, k).as_deref(),
                Some(v.as_str()),
                "{} {k}",
                span.name
            );
        }
    }
    assert_eq!(attr(&send, "error.type"), None);

    let ch = conn.create_channel().await.expect("channel");
    let _ = ch
        .queue_delete(queue.as_str().into(), Default::default())
        .await;
    let _ = ch
        .exchange_delete(exchange.as_str().into(), Default::default())
        .await;
    let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA {} CASCADE",
        schema.quoted()
    )))
    .execute(&pool)
    .await;
}
