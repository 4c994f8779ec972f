//! A quorum queue with a delivery limit, consumed into the PostgreSQL inbox while
//! the inbox is unreachable: the consumer must hold what it has and take no more,
//! not return deliveries in a loop (each return counts against the limit, and the
//! broker gives up on a message past it).
#![cfg(feature = "postgres")]

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lapin::options::{BasicGetOptions, BasicNackOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use outbox_adapters_postgres::{PgConnection, PgInboxStore, PgPool, PgSchema, connect, migrate};
use outbox_adapters_rabbitmq::{
    BindingSpec, ExchangeKind, ExchangeSpec, QueueSpec, RabbitPublisher, RabbitPublisherConfig,
    RabbitSubscriber, Topology,
};
use outbox_consumer::{
    CancellationToken, ConsumerConfig, HandlerError, PgConsumerWorker, PgHandler, PgHandlerRegistry,
};
use outbox_core::{InboxStatus, Message};
use outbox_ports::{InboxOperator as _, PublishOutcome, Publisher, SystemClock};
use outbox_testkit::proxy::TcpProxy;
use outbox_testkit::services::TestUrls;

const NAME: &str = "billing";
const LIMIT: u32 = 3;

/// One effect row per handled message, in the inbox transaction.
struct Effects(String);

#[async_trait]
impl PgHandler for Effects {
    async fn handle(&self, conn: &mut PgConnection, m: &Message) -> Result<(), HandlerError> {
        sqlx::query(sqlx::AssertSqlSafe(&*self.0))
            .bind(m.id.as_uuid())
            .execute(&mut *conn)
            .await?;
        Ok(())
    }
}

struct World {
    pool: PgPool,
    schema: PgSchema,
    exchange: String,
    queue: String,
    dlx: String,
    dlq: String,
    amqp: lapin::Connection,
}

/// A schema with an `effects` table (no key, so a double effect shows), an exchange
/// and a quorum queue with `x-delivery-limit = 3`. The services are required: a
/// missing one fails the test.
async fn world(test: &str) -> World {
    let urls = TestUrls::from_env();
    let pool = connect(&urls.pg, 8, Duration::from_secs(5))
        .await
        .expect("PostgreSQL at OUTBOX_TEST_DATABASE_URL");
    let id = outbox_testkit::unique_key(test).replace(['.', '-'], "_");
    let schema = PgSchema::new(&format!("qo_{}", &id[id.len() - 20..])).expect("schema");
    migrate(&pool, &schema).await.expect("migrate");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {}.effects (message_id uuid NOT NULL)",
        schema.quoted()
    )))
    .execute(&pool)
    .await
    .expect("effects");
    let amqp = outbox_adapters_rabbitmq::connect(&urls.amqp, Duration::from_secs(5))
        .await
        .expect("RabbitMQ at OUTBOX_TEST_AMQP_URL");
    let key = outbox_testkit::unique_key(test);
    let (exchange, queue) = (format!("qo.{key}.x"), format!("qo.{key}.q"));
    let (dlx, dlq) = (format!("qo.{key}.dlx"), format!("qo.{key}.dead"));
    Topology {
        exchanges: vec![ExchangeSpec {
            name: exchange.clone(),
            kind: ExchangeKind::Topic,
            durable: true,
            shards: 1,
        }],
        queues: vec![QueueSpec::quorum_with_limit(&queue, LIMIT, &dlx, &dlq)],
        bindings: vec![BindingSpec {
            queue: queue.clone(),
            exchange: exchange.clone(),
            routing_key: "#".into(),
        }],
    }
    .declare(&amqp)
    .await
    .expect("a quorum queue with a delivery limit and its dead letters");
    World {
        pool,
        schema,
        exchange,
        queue,
        dlx,
        dlq,
        amqp,
    }
}

impl World {
    async fn publish(&self, n: usize) -> Vec<Message> {
        let msgs: Vec<Message> = (0..n)
            .map(|_| outbox_testkit::message(&self.exchange, "order.created"))
            .collect();
        let publisher = RabbitPublisher::new(RabbitPublisherConfig::new(TestUrls::from_env().amqp));
        let outcomes = publisher.publish(&msgs).await;
        assert!(
            outcomes
                .iter()
                .all(|o| matches!(o, PublishOutcome::Confirmed)),
            "every message confirmed: {outcomes:?}"
        );
        msgs
    }

    fn config(&self) -> ConsumerConfig {
        ConsumerConfig {
            prefetch: 64,
            concurrency: 16,
            handler_timeout: Duration::from_secs(5),
            store_error_backoff: Duration::from_millis(200),
            dead_letter_queue: Some(self.dlq.clone()),
            ..ConsumerConfig::new(NAME, &self.queue)
        }
    }

    fn handlers(&self) -> PgHandlerRegistry {
        PgHandlerRegistry::new().fallback(Arc::new(Effects(format!(
            "INSERT INTO {}.effects (message_id) VALUES ($1)",
            self.schema.quoted()
        ))))
    }

    /// (effect rows, distinct messages with an effect).
    async fn effects(&self) -> (i64, i64) {
        sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT count(*), count(DISTINCT message_id) FROM {}.effects",
            self.schema.quoted()
        )))
        .fetch_one(&self.pool)
        .await
        .expect("count effects")
    }

    async fn inbox_dead(&self) -> Vec<(uuid::Uuid, Option<String>)> {
        sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT message_id, last_error FROM {}.outbox_inbox WHERE consumer = $1 AND status = 'dead'",
            self.schema.quoted()
        )))
        .bind(NAME)
        .fetch_all(&self.pool)
        .await
        .expect("dead rows")
    }

    async fn messages_in_queue(&self) -> u32 {
        self.messages_in(&self.queue).await
    }

    async fn messages_in(&self, queue: &str) -> u32 {
        let ch = self.amqp.create_channel().await.expect("channel");
        ch.queue_declare(
            queue.into(),
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("queue")
        .message_count()
    }

    async fn cleanup(self) {
        if let Ok(ch) = self.amqp.create_channel().await {
            for q in [&self.queue, &self.dlq] {
                let _ = ch
                    .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
                    .await;
            }
            for x in [&self.exchange, &self.dlx] {
                let _ = ch
                    .exchange_delete(x.as_str().into(), Default::default())
                    .await;
            }
        }
        let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP SCHEMA {} CASCADE",
            self.schema.quoted()
        )))
        .execute(&self.pool)
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inbox_outage_of_30_s_loses_nothing_from_a_quorum_queue_with_a_delivery_limit() {
    let w = world("quorum-outage").await;
    let msgs = w.publish(500).await;
    // The consumer reaches PostgreSQL through a proxy that the test cuts: the
    // database stays up for the test's own counting.
    let urls = TestUrls::from_env();
    let target = outbox_testkit::proxy::host_port(&urls.pg).expect("host:port in the URL");
    let proxy = TcpProxy::start(target).await.expect("proxy");
    let consumer_pool = connect(&proxy.url_for(&urls.pg), 8, Duration::from_secs(1))
        .await
        .expect("PostgreSQL through the proxy");
    proxy.cut();
    let worker = PgConsumerWorker::new(
        PgInboxStore::new(consumer_pool, &w.schema),
        Arc::new(RabbitSubscriber::new(&urls.amqp)),
        w.handlers(),
        Arc::new(SystemClock),
        w.config(),
    );
    let cancel = CancellationToken::new();
    let running = tokio::spawn(worker.run(cancel.clone()));
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(
        w.effects().await,
        (0, 0),
        "nothing took effect during the outage"
    );
    proxy.restore();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (rows, distinct) = w.effects().await;
        if distinct == 500 || Instant::now() > deadline {
            break;
        }
        // Once the queue is empty and nothing more comes in a while, what is
        // missing is gone.
        if w.messages_in_queue().await == 0 && rows > 0 {
            tokio::time::sleep(Duration::from_secs(5)).await;
            if w.effects().await.1 == distinct {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (rows, distinct) = w.effects().await;
    cancel.cancel();
    running.await.expect("worker");
    let dead = w.inbox_dead().await;
    let dead_lettered = w.messages_in(&w.dlq).await;
    w.cleanup().await;
    assert!(dead.is_empty(), "no delivery reached its limit: {dead:?}");
    assert_eq!(dead_lettered, 0, "nothing left in the dead-letter queue");
    assert_eq!(
        (rows, distinct),
        (500, 500),
        "all {} messages took effect exactly once",
        msgs.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_returned_past_the_limit_ends_as_a_dead_inbox_row_that_can_be_reconsumed() {
    let w = world("quorum-limit").await;
    let msg = w.publish(1).await.remove(0);
    // Another consumer returns it again and again: past the limit, the broker
    // dead-letters it.
    let ch = w.amqp.create_channel().await.expect("channel");
    let mut returns = 0;
    while let Some(got) = ch
        .basic_get(w.queue.as_str().into(), BasicGetOptions { no_ack: false })
        .await
        .expect("get")
    {
        got.delivery
            .acker
            .nack(BasicNackOptions {
                requeue: true,
                multiple: false,
            })
            .await
            .expect("return");
        returns += 1;
        assert!(returns <= 10, "still delivered after {returns} returns");
    }
    assert!(returns > LIMIT, "returned {returns} times");
    let deadline = Instant::now() + Duration::from_secs(10);
    while w.messages_in(&w.dlq).await == 0 {
        assert!(Instant::now() < deadline, "dead-lettered into {}", w.dlq);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let inbox = PgInboxStore::new(w.pool.clone(), &w.schema);
    let worker = PgConsumerWorker::new(
        inbox.clone(),
        Arc::new(RabbitSubscriber::new(TestUrls::from_env().amqp)),
        w.handlers(),
        Arc::new(SystemClock),
        w.config(),
    );
    let retry = worker.retry_task();
    let cancel = CancellationToken::new();
    let running = tokio::spawn(worker.run(cancel.clone()));
    let deadline = Instant::now() + Duration::from_secs(15);
    let dead = loop {
        let dead = w.inbox_dead().await;
        if !dead.is_empty() || Instant::now() > deadline {
            break dead;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let left_in_dlq = w.messages_in(&w.dlq).await;
    let record = inbox.get_delivery(NAME, msg.id).await.expect("get");
    // An operator's reconsume, then the consume sweep: it takes effect once.
    let reconsumed = inbox.reconsume_delivery(NAME, msg.id, false).await;
    let swept = outbox_consumer::SweepTask::run_batch(&retry, 10).await;
    let effects = w.effects().await;
    cancel.cancel();
    running.await.expect("worker");
    let exchange = w.exchange.clone();
    w.cleanup().await;
    assert_eq!(dead.len(), 1, "one dead inbox row: {dead:?}");
    assert_eq!(dead[0].0, *msg.id.as_uuid());
    let error = dead[0].1.clone().unwrap_or_default();
    assert!(
        error.contains("delivery_limit") && error.contains("count"),
        "the broker's x-death reason and count: {error}"
    );
    assert_eq!(left_in_dlq, 0, "the dead-letter queue was drained");
    let record = record.expect("the row");
    assert_eq!(record.status, InboxStatus::Dead);
    assert_eq!(
        (
            record.message.exchange.as_str(),
            record.message.routing_key.as_str()
        ),
        (exchange.as_str(), "order.created"),
        "kept as published, not as dead-lettered"
    );
    reconsumed.expect("a dead delivery can be reconsumed");
    swept.expect("sweep");
    assert_eq!(effects, (1, 1), "reconsumed, it took effect once");
}

/// The loss the review of 4b9d3c5 found: a dead-letter queue shared with another
/// service's queue brings this consumer that queue's given-up copy of a message
/// it has handled itself. Stored as an inbox row it met the consumed row, was
/// taken for a duplicate and acknowledged: gone from both services. It is kept as
/// a dead letter of this consumer now, its reason naming both queues, and no
/// handler runs for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_another_queue_dead_lettered_is_kept_as_a_dead_letter() {
    use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
    use lapin::types::{AMQPValue, FieldArray};

    let w = world("quorum-foreign").await;
    let msg = w.publish(1).await.remove(0);
    let inbox = PgInboxStore::new(w.pool.clone(), &w.schema);
    let worker = PgConsumerWorker::new(
        inbox.clone(),
        Arc::new(RabbitSubscriber::new(TestUrls::from_env().amqp)),
        w.handlers(),
        Arc::new(SystemClock),
        w.config(),
    );
    let cancel = CancellationToken::new();
    let running = tokio::spawn(worker.run(cancel.clone()));
    let deadline = Instant::now() + Duration::from_secs(15);
    while w.effects().await != (1, 1) {
        assert!(Instant::now() < deadline, "the message is handled first");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Its copy, as the broker dead-letters it from another service's queue.
    let other = format!("{}.shipping", w.queue);
    let mut entry = FieldTable::default();
    entry.insert("queue".into(), AMQPValue::LongString(other.as_str().into()));
    entry.insert(
        "reason".into(),
        AMQPValue::LongString("delivery_limit".into()),
    );
    entry.insert("count".into(), AMQPValue::LongLongInt(1));
    entry.insert(
        "exchange".into(),
        AMQPValue::LongString(w.exchange.as_str().into()),
    );
    entry.insert(
        "routing-keys".into(),
        AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::LongString(
            "order.created".into(),
        )])),
    );
    let mut headers = FieldTable::default();
    headers.insert(
        "x-death".into(),
        AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::FieldTable(entry)])),
    );
    let ch = w.amqp.create_channel().await.expect("channel");
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirms");
    let confirm = ch
        .basic_publish(
            "".into(),
            w.dlq.as_str().into(),
            BasicPublishOptions::default(),
            &msg.payload,
            lapin::BasicProperties::default()
                .with_message_id(msg.id.to_string().as_str().into())
                .with_headers(headers)
                .with_delivery_mode(2),
        )
        .await
        .expect("publish")
        .await
        .expect("confirm");
    assert!(confirm.is_ack());

    let letters = format!(
        "SELECT message_id, reason FROM {}.outbox_dead_letters WHERE consumer = $1",
        w.schema.quoted()
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    let kept: Vec<(Option<String>, String)> = loop {
        let kept = sqlx::query_as(sqlx::AssertSqlSafe(&*letters))
            .bind(NAME)
            .fetch_all(&w.pool)
            .await
            .expect("dead letters");
        if !kept.is_empty() || Instant::now() > deadline {
            break kept;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let left_in_dlq = w.messages_in(&w.dlq).await;
    let record = inbox.get_delivery(NAME, msg.id).await.expect("get");
    let effects = w.effects().await;
    cancel.cancel();
    running.await.expect("worker");
    let queue = w.queue.clone();
    w.cleanup().await;
    assert_eq!(kept.len(), 1, "kept as one dead letter: {kept:?}");
    assert_eq!(kept[0].0.as_deref(), Some(msg.id.to_string().as_str()));
    assert!(
        kept[0].1.contains(&other) && kept[0].1.contains(&queue),
        "the reason names both queues: {}",
        kept[0].1
    );
    assert_eq!(left_in_dlq, 0, "drained from the dead-letter queue");
    assert_eq!(
        record.map(|r| r.status),
        Some(InboxStatus::Consumed),
        "this consumer's own row is left as it is"
    );
    assert_eq!(effects, (1, 1), "no handler ran for the other queue's copy");
}
