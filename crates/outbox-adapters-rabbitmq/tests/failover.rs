//! Several broker addresses: a node that refuses connections among them costs
//! nothing but the attempt, whichever node a publisher or subscriber starts at (a
//! random one). The address that refuses is a closed port on this host.

mod common;

use std::time::Duration;

use common::{Names, depth};
use outbox_adapters_rabbitmq::{
    QueueSpec, RabbitPublisher, RabbitPublisherConfig, RabbitSubscriber, connect_any,
};
use outbox_core::{Message, MessageId, NewMessage, Timestamp};
use outbox_ports::{PublishOutcome, Publisher, Subscriber};

/// A node that is down: nothing listens on port 1.
const DOWN: &str = "amqp://guest:guest@127.0.0.1:1/%2f";

fn message(exchange: &str) -> Message {
    NewMessage::new(exchange, "k", b"{}".to_vec()).into_message(
        MessageId::from_uuid(*outbox_testkit::message("k", "k").id.as_uuid()),
        Timestamp::now_utc(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_is_down_is_passed_over_by_publishers_and_subscribers() {
    with_broker!(|conn| {
        let names = Names::new("failover");
        names
            .topology(QueueSpec::durable(&names.queue))
            .declare(&conn)
            .await
            .expect("declare");
        // Each publisher starts at a random node: 8 of them start at the node that
        // is down about half the time, and every one of them must publish.
        for order in [
            (DOWN.to_owned(), common::url()),
            (common::url(), DOWN.to_owned()),
        ] {
            for _ in 0..4 {
                let publisher = RabbitPublisher::new(RabbitPublisherConfig {
                    failover_urls: vec![order.1.clone()],
                    connect_timeout: Duration::from_secs(2),
                    ..RabbitPublisherConfig::new(order.0.clone())
                });
                let outcomes = publisher.publish(&[message(&names.exchange)]).await;
                assert!(
                    outcomes.iter().all(PublishOutcome::is_confirmed),
                    "{outcomes:?}"
                );
            }
        }
        assert_eq!(depth(&conn, &names.queue).await, 8);
        for _ in 0..4 {
            let sub = RabbitSubscriber::new(DOWN).with_failover_urls(&[common::url()]);
            let mut stream = sub.subscribe(&names.queue, 1).await.expect("subscribe");
            let d = tokio::time::timeout(Duration::from_secs(10), stream.next())
                .await
                .expect("a delivery in time")
                .expect("open")
                .expect("delivery");
            d.acker.ack().await.expect("ack");
        }
        let connection = connect_any(
            &[DOWN.to_owned(), DOWN.to_owned(), common::url()],
            &outbox_adapters_rabbitmq::RabbitTls::default(),
            Duration::from_secs(2),
        )
        .await
        .expect("the one node up");
        drop(connection);
        let all_down = connect_any(
            &[
                DOWN.to_owned(),
                "amqp://guest:secret@127.0.0.1:2/%2f".to_owned(),
            ],
            &outbox_adapters_rabbitmq::RabbitTls::default(),
            Duration::from_secs(2),
        )
        .await
        .expect_err("no node up");
        let text = all_down.to_string();
        assert!(text.contains("2 of 2 nodes tried"), "{text}");
        assert!(
            text.contains("127.0.0.1:1") && text.contains("127.0.0.1:2"),
            "{text}"
        );
        assert!(!text.contains("secret"), "a password in {text}");
        names.delete(&conn).await;
    });
}
