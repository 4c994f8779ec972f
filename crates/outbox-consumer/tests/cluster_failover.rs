//! On the local 3-node cluster (`OUTBOX_TEST_CLUSTER_URLS`, `cargo xtask cluster
//! up`): a quorum queue consumed into the PostgreSQL inbox, and the node holding the
//! consumer's connection stopped mid-stream. The consumer resubscribes through
//! another node; every message takes effect exactly once (the deliveries in hand on
//! the lost channel come again, and their inbox rows absorb what was handled).
#![cfg(feature = "postgres")]

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use outbox_adapters_postgres::{PgConnection, PgInboxStore, PgSchema, connect, migrate};
use outbox_adapters_rabbitmq::{
    BindingSpec, ExchangeKind, ExchangeSpec, QueueSpec, QueueType, RabbitPublisher,
    RabbitPublisherConfig, RabbitSubscriber, RabbitTls, Topology, connect_any,
};
use outbox_consumer::{
    CancellationToken, ConsumerConfig, HandlerError, PgConsumerWorker, PgHandler, PgHandlerRegistry,
};
use outbox_core::Message;
use outbox_ports::{PublishOutcome, Publisher, SystemClock};
use outbox_testkit::cluster::{cluster_urls, connection_ports, node_of_port, stop_node, wait_for};
use outbox_testkit::services::TestUrls;

/// One effect row per handled message, in the inbox transaction (no key: a double
/// effect shows as two rows), after 20 ms of work, so that the stream is still
/// running when the node stops.
struct Effects(String);

#[async_trait]
impl PgHandler for Effects {
    async fn handle(&self, conn: &mut PgConnection, m: &Message) -> Result<(), HandlerError> {
        tokio::time::sleep(Duration::from_millis(20)).await;
        sqlx::query(sqlx::AssertSqlSafe(&*self.0))
            .bind(m.id.as_uuid())
            .execute(&mut *conn)
            .await?;
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_whose_node_stops_resubscribes_through_another_and_applies_each_message_once() {
    let Some(urls) = cluster_urls("the consumer's cluster failover test") else {
        return;
    };
    let pool = connect(&TestUrls::from_env().pg, 8, Duration::from_secs(5))
        .await
        .expect("PostgreSQL at OUTBOX_TEST_DATABASE_URL");
    let id = outbox_testkit::unique_key("cf").replace(['.', '-'], "_");
    let schema = PgSchema::new(&format!("cf_{}", &id[id.len() - 20..])).expect("schema");
    migrate(&pool, &schema).await.expect("migrate");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {}.effects (message_id uuid NOT NULL)",
        schema.quoted()
    )))
    .execute(&pool)
    .await
    .expect("effects");
    let key = outbox_testkit::unique_key("cluster-consume");
    let (exchange, queue) = (format!("cf.{key}.x"), format!("cf.{key}.q"));
    let setup = connect_any(&urls, &RabbitTls::default(), Duration::from_secs(10))
        .await
        .expect("the cluster answers");
    let topology = Topology {
        exchanges: vec![ExchangeSpec {
            name: exchange.clone(),
            kind: ExchangeKind::Topic,
            durable: true,
            shards: 1,
        }],
        queues: vec![QueueSpec {
            queue_type: QueueType::Quorum,
            ..QueueSpec::durable(&queue)
        }],
        bindings: vec![BindingSpec {
            queue: queue.clone(),
            exchange: exchange.clone(),
            routing_key: "#".into(),
        }],
    };
    topology.declare(&setup).await.expect("declare");
    let _ = setup.close(200, "declared".into()).await;

    let n = 1000;
    let msgs: Vec<Message> = (0..n)
        .map(|_| outbox_testkit::message(&exchange, "order.created"))
        .collect();
    {
        let publisher = RabbitPublisher::new(RabbitPublisherConfig {
            failover_urls: urls[1..].to_vec(),
            ..RabbitPublisherConfig::new(urls[0].clone())
        });
        let outcomes = publisher.publish(&msgs).await;
        assert!(
            outcomes
                .iter()
                .all(|o| matches!(o, PublishOutcome::Confirmed)),
            "every message confirmed"
        );
    }
    let any = node_of_port(5681);
    assert!(
        wait_for(Duration::from_secs(10), || connection_ports(&any)
            .is_empty()),
        "another client is connected to the cluster: {:?}",
        connection_ports(&any)
    );

    let effects_sql = format!("INSERT INTO {}.effects VALUES ($1)", schema.quoted());
    let worker = PgConsumerWorker::new(
        PgInboxStore::new(pool.clone(), &schema),
        Arc::new(RabbitSubscriber::new(urls[0].clone()).with_failover_urls(&urls[1..])),
        PgHandlerRegistry::new().fallback(Arc::new(Effects(effects_sql))),
        Arc::new(SystemClock),
        ConsumerConfig {
            prefetch: 20,
            concurrency: 8,
            inbox_batch: 4,
            ..ConsumerConfig::new("billing", &queue)
        },
    );
    let cancel = CancellationToken::new();
    let running = tokio::spawn(worker.run(cancel.clone()));
    let count = |sql: &'static str| {
        let (pool, schema) = (pool.clone(), schema.clone());
        async move {
            sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(
                &*sql.replace("{t}", &format!("{}.effects", schema.quoted())),
            ))
            .fetch_one(&pool)
            .await
            .expect("count")
        }
    };
    let rows = "SELECT count(*) FROM {t}";
    let distinct = "SELECT count(DISTINCT message_id) FROM {t}";
    let deadline = Instant::now() + Duration::from_secs(30);
    while count(rows).await < 150 {
        assert!(
            Instant::now() < deadline,
            "the consumer took 150 within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ports = connection_ports(&any);
    assert_eq!(ports.len(), 1, "the consumer's one connection: {ports:?}");
    let held = node_of_port(ports[0]);
    let stopped = stop_node(&held).expect("stop the consumer's node");
    let at_stop = count(distinct).await;
    assert!(
        at_stop < n,
        "the node stopped mid-stream ({at_stop} of {n} handled)"
    );
    let deadline = Instant::now() + Duration::from_secs(90);
    while count(distinct).await < n {
        assert!(
            Instant::now() < deadline,
            "{} of {n} took effect within 90 s of the stop",
            count(distinct).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let other = (5681..=5683)
        .map(node_of_port)
        .find(|node| *node != held)
        .expect("another node");
    // The consumer is connected to another node (it may be between a cancel and its
    // resubscription at any one moment: the queue's leader moved).
    let moved = wait_for(Duration::from_secs(15), || {
        let now = connection_ports(&other);
        now.len() == 1 && now[0] != ports[0]
    });
    let now = connection_ports(&other);
    assert!(stopped.restore(), "{held} came back");
    // Late redeliveries would land now: the rows are counted after a pause.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (all, once) = (count(rows).await, count(distinct).await);
    cancel.cancel();
    running.await.expect("worker");
    assert!(
        moved,
        "the consumer moved to another node: {now:?}, was {}",
        ports[0]
    );
    assert_eq!(
        (all, once),
        (n, n),
        "every message took effect exactly once"
    );
    let cleanup = connect_any(&urls, &RabbitTls::default(), Duration::from_secs(10))
        .await
        .expect("the cluster answers");
    if let Ok(ch) = cleanup.create_channel().await {
        let _ = ch
            .queue_delete(
                queue.as_str().into(),
                lapin::options::QueueDeleteOptions::default(),
            )
            .await;
        let _ = ch
            .exchange_delete(
                exchange.as_str().into(),
                lapin::options::ExchangeDeleteOptions::default(),
            )
            .await;
    }
    let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA {} CASCADE",
        schema.quoted()
    )))
    .execute(&pool)
    .await;
}
