//! MemoryBroker: routing, confirms and returns, manual ack, prefetch, redelivery.

use std::time::Duration;

use outbox_adapters_memory::{ExchangeKind, MemoryBroker};
use outbox_ports::{PortError, PublishOutcome, Publisher, Subscriber};

fn broker() -> MemoryBroker {
    let b = MemoryBroker::new();
    b.declare_exchange("orders", ExchangeKind::Topic);
    b.declare_exchange("audit", ExchangeKind::Fanout);
    b.declare_queue("billing");
    b.declare_queue("shipping");
    b.bind("billing", "orders", "order.*");
    b.bind("shipping", "orders", "order.paid");
    b.bind("billing", "audit", "");
    b
}

#[tokio::test]
async fn routes_by_exchange_kind_and_returns_what_no_queue_takes() {
    let b = broker();
    let created = outbox_testkit::message("orders", "order.created");
    let paid = outbox_testkit::message("orders", "order.paid");
    let nowhere = outbox_testkit::message("orders", "invoice.sent");
    let missing = outbox_testkit::message("no-such-exchange", "k");
    let direct = outbox_testkit::message("", "shipping");
    let out = b.publish(&[created, paid, nowhere, missing, direct]).await;
    assert!(out[0].is_confirmed() && out[1].is_confirmed() && out[4].is_confirmed());
    assert!(
        matches!(out[2], PublishOutcome::Unroutable(_)),
        "{}",
        out[2]
    );
    assert!(
        matches!(out[3], PublishOutcome::Failed(PortError::NotFound { .. })),
        "{}",
        out[3]
    );
    assert_eq!(b.queue_depth("billing"), (2, 0));
    assert_eq!(b.queue_depth("shipping"), (2, 0));
    assert_eq!(b.confirmed(), 3);
}

#[tokio::test]
async fn injected_faults_hit_exactly_the_next_n() {
    let b = broker();
    b.fail_next_publishes(1);
    b.nack_next_publishes(1);
    b.return_next_publishes(1);
    let msgs: Vec<_> = (0..4)
        .map(|_| outbox_testkit::message("orders", "order.created"))
        .collect();
    let out = b.publish(&msgs).await;
    assert!(matches!(out[0], PublishOutcome::Failed(_)));
    assert!(matches!(out[1], PublishOutcome::Nacked(_)));
    assert!(matches!(out[2], PublishOutcome::Unroutable(_)));
    assert!(out[3].is_confirmed());
    assert_eq!(b.queue_depth("billing"), (1, 0));
}

#[tokio::test]
async fn prefetch_bounds_unacked_and_nack_or_drop_requeues() {
    let b = broker();
    let msgs: Vec<_> = (0..3)
        .map(|_| outbox_testkit::message("orders", "order.created"))
        .collect();
    b.publish(&msgs).await;
    let mut stream = b.subscribe("billing", 2).await.expect("subscribe");
    let first = stream.next().await.expect("open").expect("delivery");
    let second = stream.next().await.expect("open").expect("delivery");
    assert!(
        tokio::time::timeout(Duration::from_millis(50), stream.next())
            .await
            .is_err(),
        "a third delivery exceeded the prefetch of 2"
    );
    assert_eq!(b.queue_depth("billing"), (1, 2));
    first.acker.nack(true).await.expect("nack");
    let again = stream.next().await.expect("open").expect("delivery");
    assert!(again.redelivered);
    assert_eq!(again.envelope.message_id, first.envelope.message_id);
    drop(second); // as a closed channel: back to the queue
    again.acker.ack().await.expect("ack");
    assert_eq!(b.queue_depth("billing"), (2, 0));
    assert!(b.subscribe("nope", 1).await.is_err());
    b.close();
    assert!(
        stream.next().await.is_none(),
        "closing ends the subscription"
    );
}

#[tokio::test]
async fn a_lost_ack_means_one_redelivery() {
    let b = broker();
    b.redeliver_next_acked(1);
    b.publish(&[outbox_testkit::message("orders", "order.created")])
        .await;
    let mut stream = b.subscribe("billing", 10).await.expect("subscribe");
    let d = stream.next().await.expect("open").expect("delivery");
    d.acker.ack().await.expect("ack");
    let again = stream.next().await.expect("open").expect("delivery");
    assert!(again.redelivered);
    again.acker.ack().await.expect("ack");
    assert_eq!(b.queue_depth("billing"), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_slow_batch_hands_nothing_over_after_its_budget_and_gives_the_rest_back() {
    let b = broker();
    b.set_publish_delay(Duration::from_millis(10));
    let batch: Vec<_> = (0..10)
        .map(|_| outbox_testkit::message("orders", "order.created"))
        .collect();
    let started = tokio::time::Instant::now();
    let out = b.publish_within(&batch, Duration::from_millis(55)).await;
    assert!(
        started.elapsed() <= Duration::from_millis(55),
        "{:?}",
        started.elapsed()
    );
    let kinds: Vec<&str> = out
        .iter()
        .map(|o| match o {
            PublishOutcome::Confirmed => "ok",
            PublishOutcome::NotSent(_) => "unsent",
            _ => "other",
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "ok", "ok", "ok", "ok", "ok", "unsent", "unsent", "unsent", "unsent", "unsent"
        ]
    );
    assert_eq!(
        b.queue_depth("billing").0,
        5,
        "only the five sent in time arrived"
    );
}

#[tokio::test]
async fn a_message_amqp_cannot_carry_is_rejected_and_the_others_flow() {
    let b = broker();
    let mut bad = outbox_testkit::message("orders", "order.created");
    bad.routing_key = "k".repeat(300);
    let good = outbox_testkit::message("orders", "order.created");
    let out = b.publish(&[bad, good]).await;
    assert!(
        matches!(&out[0], PublishOutcome::Rejected(why) if why.contains("routing_key")),
        "{}",
        out[0]
    );
    assert!(out[1].is_confirmed());
}
