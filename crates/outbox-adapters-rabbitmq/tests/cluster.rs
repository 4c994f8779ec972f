//! On the local 3-node cluster (`OUTBOX_TEST_CLUSTER_URLS`, `cargo xtask cluster
//! up`): a quorum queue replicated on the three nodes, and the node holding the
//! publisher's connection stopped mid-stream. The publisher goes on through another
//! node; every message is in the queue at the end (duplicates allowed, none lost).

mod common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::Names;
use outbox_adapters_rabbitmq::{
    BindingSpec, ExchangeKind, ExchangeSpec, QueueSpec, QueueType, RabbitPublisher,
    RabbitPublisherConfig, RabbitSubscriber, RabbitTls, Topology, connect_any,
};
use outbox_core::{Message, MessageId, NewMessage, Timestamp};
use outbox_ports::{Publisher, Subscriber};
use outbox_testkit::cluster::{cluster_urls, connection_ports, node_of_port, stop_node, wait_for};

/// One test at a time: each stops a node, and the failover test counts the
/// cluster's connections.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn messages(exchange: &str, n: usize) -> Vec<Message> {
    (0..n)
        .map(|_| {
            NewMessage::new(exchange, "k", b"{}".to_vec()).into_message(
                MessageId::from_uuid(*outbox_testkit::message("k", "k").id.as_uuid()),
                Timestamp::now_utc(),
            )
        })
        .collect()
}

/// Publishes `batch` until every message is confirmed, or panics after `limit`.
async fn publish_all(publisher: &RabbitPublisher, batch: &[Message], limit: Duration) {
    let deadline = Instant::now() + limit;
    let mut left: Vec<Message> = batch.to_vec();
    while !left.is_empty() {
        assert!(
            Instant::now() < deadline,
            "{} of {} still unconfirmed after {limit:?}",
            left.len(),
            batch.len()
        );
        let outcomes = publisher.publish(&left).await;
        left = left
            .into_iter()
            .zip(outcomes)
            .filter(|(_, o)| !o.is_confirmed())
            .map(|(m, _)| m)
            .collect();
        if !left.is_empty() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publisher_whose_node_stops_goes_on_through_another_and_loses_nothing() {
    let Some(urls) = cluster_urls("the cluster failover test") else {
        return;
    };
    let _serial = SERIAL.lock().await;
    let names = Names::new("cluster");
    let setup = connect_any(&urls, &RabbitTls::default(), Duration::from_secs(10))
        .await
        .expect("the cluster answers");
    names
        .topology(QueueSpec {
            queue_type: QueueType::Quorum,
            ..QueueSpec::durable(&names.queue)
        })
        .declare(&setup)
        .await
        .expect("declare");
    let _ = setup.close(200, "declared".into()).await;
    let any = node_of_port(5681);
    assert!(
        wait_for(Duration::from_secs(10), || connection_ports(&any)
            .is_empty()),
        "another client is connected to the cluster: {:?}",
        connection_ports(&any)
    );

    let publisher = RabbitPublisher::new(RabbitPublisherConfig {
        failover_urls: urls[1..].to_vec(),
        confirm_timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(3),
        reconnect_backoff: Duration::from_millis(200),
        ..RabbitPublisherConfig::new(urls[0].clone())
    });
    let before = messages(&names.exchange, 100);
    publish_all(&publisher, &before, Duration::from_secs(30)).await;
    let ports = connection_ports(&any);
    assert_eq!(ports.len(), 1, "the publisher's one connection: {ports:?}");
    let held = node_of_port(ports[0]);
    let other = (5681..=5683)
        .map(node_of_port)
        .find(|n| *n != held)
        .expect("another node");

    let stopped = stop_node(&held).expect("stop the publisher's node");
    let after = messages(&names.exchange, 100);
    publish_all(&publisher, &after, Duration::from_secs(60)).await;
    let now = connection_ports(&other);
    assert!(
        now.len() == 1 && now[0] != ports[0],
        "the publisher moved to another node: {now:?}, was {}",
        ports[0]
    );
    assert!(stopped.restore(), "{held} came back");

    // Every message is in the queue, read through any node.
    let sub = RabbitSubscriber::new(urls[0].clone()).with_failover_urls(&urls[1..]);
    let mut stream = sub.subscribe(&names.queue, 50).await.expect("subscribe");
    let wanted: HashSet<MessageId> = before.iter().chain(&after).map(|m| m.id).collect();
    let mut seen = HashSet::new();
    while seen.len() < wanted.len() {
        let d = tokio::time::timeout(Duration::from_secs(20), stream.next())
            .await
            .unwrap_or_else(|_| panic!("{} of {} messages read", seen.len(), wanted.len()))
            .expect("open")
            .expect("delivery");
        let m = d
            .envelope
            .to_message(Timestamp::now_utc())
            .expect("decodes");
        seen.insert(m.id);
        d.acker.ack().await.expect("ack");
    }
    assert_eq!(seen, wanted);
    drop(stream);
    let cleanup = connect_any(&urls, &RabbitTls::default(), Duration::from_secs(10))
        .await
        .expect("the cluster answers");
    names.delete(&cleanup).await;
}

/// Found in review: a quorum queue's dead-letter queue is a classic queue, which
/// lives on the node it was declared through; while that node is down RabbitMQ
/// refuses its declaration, and a relay declaring its topology on every reconnect
/// could not reconnect to the other nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topology_declares_on_another_node_while_its_dead_letter_queues_node_is_down() {
    let Some(urls) = cluster_urls("the dead-letter queue's node test") else {
        return;
    };
    let _serial = SERIAL.lock().await;
    let names = Names::new("cluster-dlq");
    let (dlx, dlq) = (
        format!("{}.dlx", names.exchange),
        format!("{}.dead", names.queue),
    );
    let topology = Topology {
        exchanges: vec![ExchangeSpec {
            name: names.exchange.clone(),
            kind: ExchangeKind::Topic,
            durable: true,
            shards: 1,
        }],
        queues: vec![QueueSpec::quorum_with_limit(&names.queue, 5, &dlx, &dlq)],
        bindings: vec![BindingSpec {
            queue: names.queue.clone(),
            exchange: names.exchange.clone(),
            routing_key: "#".into(),
        }],
    };
    let tls = RabbitTls::default();
    // Through node 1 only: the classic dead-letter queue lives there.
    let first = connect_any(&urls[..1], &tls, Duration::from_secs(10))
        .await
        .expect("node 1");
    topology
        .declare(&first)
        .await
        .expect("declare through node 1");
    let _ = first.close(200, "declared".into()).await;
    let stopped = stop_node(&node_of_port(5681)).expect("stop node 1");
    let other = connect_any(&urls[1..], &tls, Duration::from_secs(10))
        .await
        .expect("another node");
    let again = topology.declare(&other).await;
    let _ = other.close(200, "declared".into()).await;
    assert!(stopped.restore(), "node 1 came back");
    again.expect("the topology declares with the dead-letter queue's node down");
    let cleanup = connect_any(&urls, &tls, Duration::from_secs(10))
        .await
        .expect("the cluster answers");
    names.delete(&cleanup).await;
    if let Ok(ch) = cleanup.create_channel().await {
        let _ = ch
            .queue_delete(
                dlq.as_str().into(),
                lapin::options::QueueDeleteOptions::default(),
            )
            .await;
        let _ = ch
            .exchange_delete(
                dlx.as_str().into(),
                lapin::options::ExchangeDeleteOptions::default(),
            )
            .await;
    }
}

/// Found in review: a classic queue of the topology homed on a node that is down
/// fails `queue.declare` (`404 ... home node ... is down or inaccessible`), which
/// failed every connection the publisher opened, so nothing was published to any
/// exchange until that node returned. Only that queue's routes may wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_classic_queue_on_a_down_node_stops_only_its_own_routes() {
    let Some(urls) = cluster_urls("the classic queue's home node test") else {
        return;
    };
    let _serial = SERIAL.lock().await;
    let (classic, quorum) = (Names::new("home-down"), Names::new("home-up"));
    let exchange = |name: &str| ExchangeSpec {
        name: name.to_owned(),
        kind: ExchangeKind::Topic,
        durable: true,
        shards: 1,
    };
    let bind = |queue: &str, exchange: &str| BindingSpec {
        queue: queue.to_owned(),
        exchange: exchange.to_owned(),
        routing_key: "#".into(),
    };
    let topology = Topology {
        exchanges: vec![exchange(&classic.exchange), exchange(&quorum.exchange)],
        queues: vec![
            QueueSpec::durable(&classic.queue),
            QueueSpec {
                queue_type: QueueType::Quorum,
                ..QueueSpec::durable(&quorum.queue)
            },
        ],
        bindings: vec![
            bind(&classic.queue, &classic.exchange),
            bind(&quorum.queue, &quorum.exchange),
        ],
    };
    let tls = RabbitTls::default();
    // Through node 2 only: the classic queue lives there.
    let second = connect_any(&urls[1..2], &tls, Duration::from_secs(10))
        .await
        .expect("node 2");
    topology
        .declare(&second)
        .await
        .expect("declare through node 2");
    let _ = second.close(200, "declared".into()).await;
    let node2 = stop_node(&node_of_port(5682)).expect("stop node 2");

    let others = vec![urls[0].clone(), urls[2].clone()];
    let declared = {
        let c = connect_any(&others, &tls, Duration::from_secs(10))
            .await
            .expect("node 1 or 3");
        let d = topology.declare(&c).await;
        let _ = c.close(200, "declared".into()).await;
        d
    };
    let publisher = RabbitPublisher::new(RabbitPublisherConfig {
        failover_urls: others[1..].to_vec(),
        confirm_timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(3),
        reconnect_backoff: Duration::from_millis(200),
        ..RabbitPublisherConfig::new(others[0].clone())
    })
    .with_topology(topology.clone())
    .with_redeclare_every(Duration::from_millis(500));
    let first = messages(&quorum.exchange, 20);
    publish_all(&publisher, &first, Duration::from_secs(30)).await;
    let degraded = publisher.degraded();

    // The publisher's own node restarted (node 2 still down): it reconnects,
    // passes over the classic queue again, and publishes.
    let any = node_of_port(5681);
    let ports = connection_ports(&any);
    let held = ports.first().map(|p| node_of_port(*p));
    let later = messages(&quorum.exchange, 20);
    if let Some(held) = &held {
        let own = stop_node(held).expect("stop the publisher's node");
        assert!(own.restore(), "{held} came back");
    }
    publish_all(&publisher, &later, Duration::from_secs(90)).await;
    // A message routed only to the queue on the down node is never confirmed
    // (RabbitMQ nacks it): a failed attempt, retried, never marked sent.
    let to_down = publisher.publish(&messages(&classic.exchange, 3)).await;
    assert!(node2.restore(), "node 2 came back");
    // Node 2 back: a batch on the same connection declares the queue again, and
    // nothing is reported degraded any more.
    tokio::time::sleep(Duration::from_millis(600)).await;
    publish_all(
        &publisher,
        &messages(&quorum.exchange, 5),
        Duration::from_secs(30),
    )
    .await;
    let after = publisher.degraded();

    let declared = declared.expect("the topology declares with the classic queue's node down");
    assert_eq!(declared.unavailable_queues, vec![classic.queue.clone()]);
    assert_eq!(degraded.len(), 1, "{degraded:?}");
    assert!(degraded[0].contains(&classic.queue), "{degraded:?}");
    assert!(held.is_some(), "the publisher's connection was seen");
    assert!(
        to_down.iter().all(|o| !o.is_confirmed()),
        "a message for the down queue only was confirmed: {to_down:?}"
    );
    assert!(
        after.is_empty(),
        "still reported after node 2 came back: {after:?}"
    );
    let cleanup = connect_any(&urls, &tls, Duration::from_secs(10))
        .await
        .expect("the cluster answers");
    classic.delete(&cleanup).await;
    quorum.delete(&cleanup).await;
}
