//! A sharded stream on the real broker (`OUTBOX_TEST_AMQP_URL`): the relay's
//! publisher spreads it over four shard queues by ordering key, and one consumer
//! with `shards = 4` takes all four, a worker loop each, into the PostgreSQL inbox:
//! every message takes effect once (duplicates absorbed), each key's in order.
#![cfg(feature = "postgres")]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lapin::options::{ExchangeDeleteOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use outbox_adapters_postgres::{PgConnection, PgInboxStore, PgSchema, connect, migrate};
use outbox_adapters_rabbitmq::{
    BindingSpec, ExchangeKind, ExchangeSpec, QueueSpec, QueueType, RabbitPublisher,
    RabbitPublisherConfig, RabbitSubscriber, Topology,
};
use outbox_consumer::{
    CancellationToken, ConsumerConfig, HandlerError, PgConsumerWorker, PgHandler, PgHandlerRegistry,
};
use outbox_core::shard::shard_name;
use outbox_core::{Message, NewMessage, Timestamp};
use outbox_ports::{PublishOutcome, Publisher, SystemClock};
use outbox_testkit::services::TestUrls;

const SHARDS: u16 = 4;
const KEYS: usize = 12;
const PER_KEY: usize = 40;

/// One effect row per handling, numbered in the order they commit per key (a
/// `bigserial`), after a little work so that deliveries overlap.
struct Effects(String);

#[async_trait]
impl PgHandler for Effects {
    async fn handle(&self, conn: &mut PgConnection, m: &Message) -> Result<(), HandlerError> {
        tokio::time::sleep(Duration::from_millis(2)).await;
        let seq: i32 = m.headers["seq"].parse().expect("seq");
        sqlx::query(sqlx::AssertSqlSafe(&*self.0))
            .bind(m.id.as_uuid())
            .bind(m.ordering_key.as_deref())
            .bind(seq)
            .bind(&m.exchange)
            .execute(&mut *conn)
            .await?;
        Ok(())
    }
}

async fn broker() -> Option<lapin::Connection> {
    let url = TestUrls::from_env().amqp;
    match outbox_adapters_rabbitmq::connect(&url, Duration::from_secs(5)).await {
        Ok(c) => Some(c),
        Err(e) if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("RabbitMQ is required in CI (OUTBOX_TEST_AMQP_URL): {e}")
        }
        Err(e) => {
            eprintln!("SKIPPED (not in CI): RabbitMQ unreachable: {e}");
            None
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_consumer_takes_every_shard_each_message_once_each_key_in_order() {
    let Some(conn) = broker().await else {
        return;
    };
    let urls = TestUrls::from_env();
    let pool = connect(&urls.pg, 8, Duration::from_secs(5))
        .await
        .expect("PostgreSQL at OUTBOX_TEST_DATABASE_URL");
    let id = outbox_testkit::unique_key("sh").replace(['.', '-'], "_");
    let schema = PgSchema::new(&format!("sh_{}", &id[id.len() - 20..])).expect("schema");
    migrate(&pool, &schema).await.expect("migrate");
    let effects = format!("{}.effects", schema.quoted());
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {effects} (n bigserial, message_id uuid NOT NULL, key text, seq int, exchange text)"
    )))
    .execute(&pool)
    .await
    .expect("effects");

    let key = outbox_testkit::unique_key("sharded-consumer");
    let exchange = format!("outbox-test.{key}.x");
    let queue = format!("outbox-test.{key}.q");
    let topology = Topology {
        exchanges: vec![ExchangeSpec {
            name: exchange.clone(),
            kind: ExchangeKind::Topic,
            durable: true,
            shards: SHARDS,
        }],
        queues: vec![QueueSpec {
            queue_type: QueueType::Quorum,
            shards: SHARDS,
            dead_letter_exchange: Some(format!("{exchange}.dlx")),
            dead_letter_queue: Some(format!("{queue}.dead")),
            ..QueueSpec::durable(&queue)
        }],
        bindings: vec![BindingSpec {
            queue: queue.clone(),
            exchange: exchange.clone(),
            routing_key: "#".into(),
        }],
    };
    let publisher = RabbitPublisher::new(RabbitPublisherConfig::new(urls.amqp.clone()))
        .with_topology(topology.clone());
    let mut msgs = Vec::new();
    for seq in 0..PER_KEY {
        for k in 0..KEYS {
            let m = NewMessage::new(&exchange, "order.created", b"{}".to_vec())
                .with_ordering_key(format!("customer-{k}"))
                .with_header("seq", seq.to_string());
            msgs.push(m.into_message(outbox_testkit::message("x", "k").id, Timestamp::now_utc()));
        }
    }
    // Every fifth message published twice, as a relay does after a lost confirm:
    // the copy lands on the same shard, and the inbox absorbs it.
    let mut with_copies = Vec::new();
    for (i, m) in msgs.iter().enumerate() {
        with_copies.push(m.clone());
        if i % 5 == 0 {
            with_copies.push(m.clone());
        }
    }
    let outcomes = publisher.publish(&with_copies).await;
    assert!(
        outcomes.iter().all(PublishOutcome::is_confirmed),
        "{outcomes:?}"
    );

    let insert =
        format!("INSERT INTO {effects} (message_id, key, seq, exchange) VALUES ($1, $2, $3, $4)");
    let worker = PgConsumerWorker::new(
        PgInboxStore::new(pool.clone(), &schema),
        Arc::new(RabbitSubscriber::new(urls.amqp.clone())),
        PgHandlerRegistry::new().fallback(Arc::new(Effects(insert))),
        Arc::new(SystemClock),
        ConsumerConfig {
            prefetch: 16,
            concurrency: 8,
            ordered_by_key: true,
            shards: SHARDS,
            dead_letter_queue: Some(format!("{queue}.dead")),
            ..ConsumerConfig::new("billing", &queue)
        },
    );
    let cancel = CancellationToken::new();
    let running = tokio::spawn(worker.run(cancel.clone()));
    let count = |sql: String| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql))
                .fetch_one(&pool)
                .await
                .expect("count")
        }
    };
    let n = i64::try_from(msgs.len()).expect("fits");
    let deadline = Instant::now() + Duration::from_secs(60);
    let ch = conn.create_channel().await.expect("channel");
    while count(format!("SELECT count(*) FROM {effects}")).await < n {
        assert!(Instant::now() < deadline, "all handled within 60 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Every shard's loop is subscribed while the worker runs.
    let mut consumers_seen = Vec::new();
    for i in 0..SHARDS {
        let q = ch
            .queue_declare(
                shard_name(&queue, i).as_str().into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("shard queue");
        consumers_seen.push(q.consumer_count());
    }
    // What the broker dead-letters from shard 1 lands on shard 1's dead-letter
    // queue, which shard 1's loop drains as this consumer's own given-up delivery
    // (not another queue's), under the exchange it was written for.
    let given_up = outbox_testkit::message("x", "k").id;
    dead_letter_from_shard_1(&ch, &exchange, &queue, &given_up.to_string()).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let dead = loop {
        let row: Option<(String, String, String)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT status, exchange, coalesce(last_error, '') FROM {}.outbox_inbox \
             WHERE consumer = 'billing' AND message_id = $1",
            schema.quoted()
        )))
        .bind(given_up.as_uuid())
        .fetch_optional(&pool)
        .await
        .expect("inbox row");
        if let Some(row) = row.filter(|r| r.0 == "dead") {
            break row;
        }
        assert!(
            Instant::now() < deadline,
            "the given-up delivery stored within 20 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(dead.1, exchange, "the exchange written for");
    assert!(dead.2.starts_with("the broker gave up"), "{}", dead.2);
    // Late copies would land now.
    tokio::time::sleep(Duration::from_secs(1)).await;
    cancel.cancel();
    running.await.expect("worker");
    assert_eq!(
        consumers_seen,
        vec![1; usize::from(SHARDS)],
        "a consumer on every shard"
    );
    let all = count(format!("SELECT count(*) FROM {effects}")).await;
    let once = count(format!("SELECT count(DISTINCT message_id) FROM {effects}")).await;
    assert_eq!((all, once), (n, n), "each message took effect once");
    let wrong_exchange = count(format!(
        "SELECT count(*) FROM {effects} WHERE exchange <> '{exchange}'"
    ))
    .await;
    assert_eq!(wrong_exchange, 0, "handlers see the exchange written for");
    let rows: Vec<(String, i32)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT key, seq FROM {effects} ORDER BY n"
    )))
    .fetch_all(&pool)
    .await
    .expect("rows");
    let mut last: HashMap<String, i32> = HashMap::new();
    for (key, seq) in rows {
        let prev = last.insert(key.clone(), seq);
        assert_eq!(prev.map_or(0, |p| p + 1), seq, "{key} in order");
    }
    assert_eq!(last.len(), KEYS);

    let plain = topology.expanded();
    for q in &plain.queues {
        let _ = ch
            .queue_delete(q.name.as_str().into(), QueueDeleteOptions::default())
            .await;
    }
    for q in plain
        .queues
        .iter()
        .filter_map(|q| q.dead_letter_queue.as_ref())
    {
        let _ = ch
            .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
            .await;
    }
    for x in plain
        .exchanges
        .iter()
        .map(|x| x.name.clone())
        .chain([format!("{exchange}.dlx")])
    {
        let _ = ch
            .exchange_delete(x.as_str().into(), ExchangeDeleteOptions::default())
            .await;
    }
    let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA {} CASCADE",
        schema.quoted()
    )))
    .execute(&pool)
    .await;
}

/// A delivery as RabbitMQ dead-letters it from shard 1 of `queue` (after its
/// delivery limit) into shard 1's dead-letter queue: published there directly, with
/// the `x-death` the broker writes and the relay's `x-outbox-exchange`.
async fn dead_letter_from_shard_1(ch: &lapin::Channel, exchange: &str, queue: &str, id: &str) {
    use lapin::BasicProperties;
    use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
    use lapin::types::{AMQPValue, FieldArray};
    let text = |s: &str| AMQPValue::LongString(s.into());
    let mut death = FieldTable::default();
    death.insert("reason".into(), text("delivery_limit"));
    death.insert("count".into(), AMQPValue::LongLongInt(1));
    death.insert("queue".into(), text(&shard_name(queue, 1)));
    death.insert("exchange".into(), text(&shard_name(exchange, 1)));
    death.insert(
        "routing-keys".into(),
        AMQPValue::FieldArray(FieldArray::from(vec![text("order.created")])),
    );
    let mut headers = FieldTable::default();
    headers.insert(
        "x-death".into(),
        AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::FieldTable(death)])),
    );
    headers.insert(outbox_ports::EXCHANGE_HEADER.into(), text(exchange));
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirms");
    let confirm = ch
        .basic_publish(
            "".into(),
            shard_name(&format!("{queue}.dead"), 1).as_str().into(),
            BasicPublishOptions::default(),
            b"{}",
            BasicProperties::default()
                .with_message_id(id.into())
                .with_content_type("application/json".into())
                .with_headers(headers),
        )
        .await
        .expect("publish");
    assert!(confirm.await.expect("confirm").is_ack());
}
