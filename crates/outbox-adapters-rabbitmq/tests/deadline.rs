//! The publisher against the real broker within a batch's budget (what is left of
//! its lease): nothing is handed over after it, the unsent rest comes back
//! `NotSent`, and no wait outlasts it. Messages AMQP cannot carry are `Rejected`
//! without a panic.

mod common;

use std::time::Duration;

use common::{Names, depth};
use outbox_adapters_rabbitmq::{QueueSpec, RabbitPublisher, RabbitPublisherConfig};
use outbox_core::{Message, NewMessage, Timestamp};
use outbox_ports::{PublishOutcome, Publisher};

fn messages(exchange: &str, n: usize, size: usize) -> Vec<Message> {
    (0..n)
        .map(|_| {
            NewMessage::new(exchange, "order.created", vec![b'x'; size]).into_message(
                outbox_core::MessageId::from_uuid(uuid::Uuid::now_v7()),
                Timestamp::now_utc(),
            )
        })
        .collect()
}

async fn settled_depth(conn: &lapin::Connection, queue: &str) -> u32 {
    // Confirms are in before publish_within returns; give the queue a moment anyway.
    tokio::time::sleep(Duration::from_millis(300)).await;
    depth(conn, queue).await
}

#[tokio::test]
async fn a_batch_whose_budget_runs_out_gives_back_the_unsent_rest_and_publishes_nothing_later() {
    with_broker!(|conn| {
        let names = Names::new("budget");
        names
            .topology(QueueSpec::durable(&names.queue))
            .declare(&conn)
            .await
            .expect("declare");
        let p = RabbitPublisher::new(RabbitPublisherConfig {
            max_in_flight: 50,
            ..RabbitPublisherConfig::new(common::url())
        });
        // Connect first, so the budget below is spent on publishing.
        p.check().await.expect("broker");
        let batch = messages(&names.exchange, 20_000, 2048);
        let budget = Duration::from_millis(150);
        let started = tokio::time::Instant::now();
        let outcomes = p.publish_within(&batch, budget).await;
        let took = started.elapsed();
        assert!(took < budget + Duration::from_millis(100), "took {took:?}");
        let count = |f: fn(&PublishOutcome) -> bool| outcomes.iter().filter(|o| f(o)).count();
        let confirmed = count(|o| o.is_confirmed());
        let unsent = count(|o| matches!(o, PublishOutcome::NotSent(_)));
        let failed = count(|o| matches!(o, PublishOutcome::Failed(_)));
        assert_eq!(
            confirmed + unsent + failed,
            batch.len(),
            "every outcome is one of these"
        );
        assert!(confirmed > 0, "some were published in time");
        assert!(unsent > 0, "the rest was given back");
        // The unsent ones come after every handed-over one: the batch stopped.
        let first_unsent = outcomes
            .iter()
            .position(|o| matches!(o, PublishOutcome::NotSent(_)))
            .expect("unsent");
        assert!(
            outcomes[first_unsent..]
                .iter()
                .all(|o| matches!(o, PublishOutcome::NotSent(_))),
            "nothing handed over after the first message given back"
        );
        // Nothing given back reached the queue, later either.
        let d = settled_depth(&conn, &names.queue).await as usize;
        assert!(
            d >= confirmed && d <= confirmed + failed,
            "queue {d}, confirmed {confirmed}, failed {failed}"
        );
        // The publisher is still usable.
        let again = p.publish_within(&batch[..5], Duration::from_secs(10)).await;
        assert!(again.iter().all(PublishOutcome::is_confirmed));
        names.delete(&conn).await;
    });
}

#[tokio::test]
async fn a_spent_budget_sends_nothing() {
    with_broker!(|conn| {
        let names = Names::new("no-budget");
        names
            .topology(QueueSpec::durable(&names.queue))
            .declare(&conn)
            .await
            .expect("declare");
        let p = RabbitPublisher::new(RabbitPublisherConfig::new(common::url()));
        let outcomes = p
            .publish_within(&messages(&names.exchange, 10, 10), Duration::ZERO)
            .await;
        assert!(
            outcomes
                .iter()
                .all(|o| matches!(o, PublishOutcome::NotSent(_))),
            "{outcomes:?}"
        );
        assert_eq!(settled_depth(&conn, &names.queue).await, 0);
        names.delete(&conn).await;
    });
}

#[tokio::test]
async fn a_reconnect_backoff_longer_than_the_budget_is_not_waited_for() {
    // Nothing listens on port 1: the first batch fails to connect and sets a backoff.
    let p = RabbitPublisher::new(RabbitPublisherConfig {
        reconnect_backoff: Duration::from_secs(20),
        connect_timeout: Duration::from_secs(2),
        ..RabbitPublisherConfig::new("amqp://guest:guest@127.0.0.1:1/%2f")
    });
    let first = p
        .publish_within(&messages("x", 1, 1), Duration::from_secs(5))
        .await;
    assert!(
        matches!(first[0], PublishOutcome::NotSent(_)),
        "{}",
        first[0]
    );
    let started = tokio::time::Instant::now();
    let second = p
        .publish_within(&messages("x", 3, 1), Duration::from_millis(200))
        .await;
    assert!(
        started.elapsed() < Duration::from_millis(300),
        "waited {:?} for a backoff the budget does not allow",
        started.elapsed()
    );
    assert!(
        second
            .iter()
            .all(|o| matches!(o, PublishOutcome::NotSent(_)))
    );
}

#[tokio::test]
async fn messages_amqp_cannot_carry_are_rejected_without_a_panic_and_the_others_are_confirmed() {
    with_broker!(|conn| {
        let names = Names::new("too-long");
        names
            .topology(QueueSpec::durable(&names.queue))
            .declare(&conn)
            .await
            .expect("declare");
        let mut batch = messages(&names.exchange, 6, 10);
        batch[1].routing_key = "k".repeat(300);
        batch[2].exchange = "x".repeat(256);
        batch[3].message_type = Some("t".repeat(256));
        batch[4].headers.insert("h".repeat(256), "v".into());
        let p = RabbitPublisher::new(RabbitPublisherConfig::new(common::url()));
        let outcomes = p.publish(&batch).await;
        for (i, field) in [
            (1, "routing_key"),
            (2, "exchange"),
            (3, "message_type"),
            (4, "headers"),
        ] {
            assert!(
                matches!(&outcomes[i], PublishOutcome::Rejected(why) if why.contains(field)),
                "{i}: {}",
                outcomes[i]
            );
        }
        assert!(outcomes[0].is_confirmed() && outcomes[5].is_confirmed());
        assert_eq!(settled_depth(&conn, &names.queue).await, 2);
        names.delete(&conn).await;
    });
}

#[tokio::test]
async fn headers_too_large_for_a_frame_are_rejected_and_their_window_mates_are_confirmed() {
    with_broker!(|conn| {
        let names = Names::new("big-headers");
        names
            .topology(QueueSpec::durable(&names.queue))
            .declare(&conn)
            .await
            .expect("declare");
        let mut batch = messages(&names.exchange, 3, 10);
        // 200 KiB of headers: more than RabbitMQ's default frame_max (128 KiB), which
        // the content header must fit in one frame.
        batch[1]
            .headers
            .insert("big".into(), "v".repeat(200 * 1024));
        let p = RabbitPublisher::new(RabbitPublisherConfig::new(common::url()));
        let outcomes = p.publish_within(&batch, Duration::from_secs(10)).await;
        assert!(outcomes[0].is_confirmed(), "{}", outcomes[0]);
        assert!(
            matches!(&outcomes[1], PublishOutcome::Rejected(why) if why.contains("headers")),
            "{}",
            outcomes[1]
        );
        assert!(outcomes[2].is_confirmed(), "{}", outcomes[2]);
        assert_eq!(settled_depth(&conn, &names.queue).await, 2);
        // The connection survived: the next batch goes out on it.
        let again = p.publish_within(&batch[..1], Duration::from_secs(10)).await;
        assert!(again[0].is_confirmed(), "{}", again[0]);
        names.delete(&conn).await;
    });
}

#[tokio::test]
async fn a_budget_too_short_to_connect_is_not_taken_for_a_broker_failure() {
    with_broker!(|conn| {
        let names = Names::new("short-budget");
        names
            .topology(QueueSpec::durable(&names.queue))
            .declare(&conn)
            .await
            .expect("declare");
        // Not connected yet: the first batch has no time at all to connect.
        let p = RabbitPublisher::new(RabbitPublisherConfig {
            reconnect_backoff: Duration::from_secs(5),
            ..RabbitPublisherConfig::new(common::url())
        });
        let batch = messages(&names.exchange, 1, 10);
        let none = p.publish_within(&batch, Duration::ZERO).await;
        assert!(matches!(none[0], PublishOutcome::NotSent(_)), "{}", none[0]);
        // The broker is fine: the next batch connects at once, no backoff to wait.
        let next = p.publish_within(&batch, Duration::from_millis(300)).await;
        assert!(next[0].is_confirmed(), "{}", next[0]);
        // A budget that ends mid-connect (well under connect_timeout) is no broker
        // failure either.
        let q = RabbitPublisher::new(RabbitPublisherConfig {
            reconnect_backoff: Duration::from_secs(5),
            ..RabbitPublisherConfig::new(common::url())
        });
        // (2 ms is usually shorter than the AMQP handshake; if this machine is
        // faster, the message is simply confirmed.)
        let cut = q.publish_within(&batch, Duration::from_millis(2)).await;
        assert!(
            matches!(cut[0], PublishOutcome::NotSent(_)) || cut[0].is_confirmed(),
            "{}",
            cut[0]
        );
        let next = q.publish_within(&batch, Duration::from_millis(300)).await;
        assert!(next[0].is_confirmed(), "{}", next[0]);
        let expected = 2 + u32::from(cut[0].is_confirmed());
        assert_eq!(settled_depth(&conn, &names.queue).await, expected);
        names.delete(&conn).await;
    });
}
