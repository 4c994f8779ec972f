//! The publisher and subscriber against the real broker.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::{Names, depth};
use lapin::options::{BasicAckOptions, BasicGetOptions};
use outbox_adapters_rabbitmq::{
    ExchangeKind, Overflow, QueueSpec, RabbitPublisher, RabbitPublisherConfig, RabbitSubscriber,
    Topology,
};
use outbox_core::{Message, MessageId, NewMessage, Timestamp};
use outbox_ports::{PortError, PublishOutcome, Publisher, Subscriber};

fn messages(exchange: &str, n: usize, size: usize) -> Vec<Message> {
    (0..n)
        .map(|i| {
            let now = Timestamp::now_utc();
            NewMessage::new(exchange, "order.created", vec![b'x'; size])
                .with_type("order.created")
                .with_header("seq", i.to_string())
                .into_message(
                    MessageId::from_uuid(outbox_testkit::message("k", "k").id.as_uuid().to_owned()),
                    now,
                )
        })
        .collect()
}

fn publisher() -> RabbitPublisher {
    RabbitPublisher::new(RabbitPublisherConfig::new(common::url()))
}

async fn settle_depth(conn: &lapin::Connection, queue: &str, want: u32) -> u32 {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let d = depth(conn, queue).await;
        if d >= want || tokio::time::Instant::now() > deadline {
            return d;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn ten_thousand_messages_are_each_confirmed_once() {
    with_broker!(|conn| {
        let names = Names::new("10k");
        names
            .topology(QueueSpec::durable(&names.queue))
            .declare(&conn)
            .await
            .expect("declare");
        let p = publisher();
        let msgs = messages(&names.exchange, 10_000, 1024);
        let mut confirmed = 0;
        for batch in msgs.chunks(1000) {
            let outcomes = p.publish(batch).await;
            assert_eq!(outcomes.len(), batch.len());
            for o in &outcomes {
                assert!(o.is_confirmed(), "{o}");
            }
            confirmed += outcomes.len();
        }
        assert_eq!(confirmed, 10_000);
        assert_eq!(
            settle_depth(&conn, &names.queue, 10_000).await,
            10_000,
            "each confirmed message is in the queue once"
        );
        names.delete(&conn).await;
    });
}

#[tokio::test]
async fn an_unroutable_message_is_a_failure() {
    with_broker!(|conn| {
        let names = Names::new("unroutable");
        let mut t = names.topology(QueueSpec::durable(&names.queue));
        t.bindings.clear();
        t.declare(&conn).await.expect("declare");
        let outcomes = publisher().publish(&messages(&names.exchange, 2, 10)).await;
        for o in &outcomes {
            assert!(
                matches!(o, PublishOutcome::Unroutable(why) if why.contains("NO_ROUTE")),
                "{o}"
            );
        }
        names.delete(&conn).await;
    });
}

/// RabbitMQ sends a `basic.return` before the ack of its message and coalesces
/// acks (`multiple`) below the oldest unconfirmed tag; lapin hands a waiting return
/// to whichever confirm completes next, so a return can ride on another message's
/// confirm (captured here: 833's return taken by a message at or below 790, 833
/// itself acked bare). Each outcome must follow the returned message's own id.
#[tokio::test]
async fn each_return_is_matched_to_its_own_message_in_a_pipelined_window() {
    with_broker!(|conn| {
        let names = Names::new("returns");
        let mut t = names.topology(QueueSpec::durable(&names.queue));
        t.bindings[0].routing_key = "routed.#".into();
        t.declare(&conn).await.expect("declare");
        let mut config = RabbitPublisherConfig::new(common::url());
        config.max_in_flight = 3_000;
        let p = RabbitPublisher::new(config);
        let mut routed_total = 0u32;
        for round in 0..5 {
            let msgs: Vec<Message> = messages(&names.exchange, 3_000, 64)
                .into_iter()
                .enumerate()
                .map(|(i, mut m)| {
                    m.routing_key = if i % 7 == 6 {
                        "nowhere.bound".into()
                    } else {
                        "routed.order".into()
                    };
                    m
                })
                .collect();
            let outcomes = p.publish_within(&msgs, Duration::from_secs(60)).await;
            assert_eq!(outcomes.len(), msgs.len());
            let mut wrong = Vec::new();
            for (i, (m, o)) in msgs.iter().zip(&outcomes).enumerate() {
                let unroutable = m.routing_key == "nowhere.bound";
                let right = if unroutable {
                    matches!(o, PublishOutcome::Unroutable(_))
                } else {
                    o.is_confirmed()
                };
                if !right {
                    wrong.push(format!("#{i} ({}): {o}", m.routing_key));
                }
            }
            assert!(
                wrong.is_empty(),
                "round {round}: {} outcomes do not match their own message: {:?}",
                wrong.len(),
                &wrong[..wrong.len().min(10)]
            );
            routed_total += msgs
                .iter()
                .filter(|m| m.routing_key != "nowhere.bound")
                .count() as u32;
            assert_eq!(
                settle_depth(&conn, &names.queue, routed_total).await,
                routed_total,
                "round {round}: the queue holds exactly the routable messages"
            );
        }
        names.delete(&conn).await;
    });
}

#[tokio::test]
async fn a_nack_fails_exactly_the_rejected_messages() {
    with_broker!(|conn| {
        let names = Names::new("nack");
        let queue = QueueSpec {
            max_length: Some(5),
            overflow: Some(Overflow::RejectPublish),
            ..QueueSpec::durable(&names.queue)
        };
        names.topology(queue).declare(&conn).await.expect("declare");
        let outcomes = publisher().publish(&messages(&names.exchange, 8, 10)).await;
        let kinds: Vec<&str> = outcomes
            .iter()
            .map(|o| match o {
                PublishOutcome::Confirmed => "ok",
                PublishOutcome::Nacked(_) => "nack",
                _ => "other",
            })
            .collect();
        assert_eq!(
            kinds,
            ["ok", "ok", "ok", "ok", "ok", "nack", "nack", "nack"]
        );
        assert_eq!(depth(&conn, &names.queue).await, 5);
        names.delete(&conn).await;
    });
}

#[tokio::test]
async fn a_capped_queue_without_an_overflow_mode_is_refused() {
    with_broker!(|conn| {
        let names = Names::new("capped");
        // RabbitMQ's default for a full queue is drop-head: it would silently drop
        // the oldest messages, each already confirmed to the relay.
        let queue = QueueSpec {
            max_length: Some(5),
            ..QueueSpec::durable(&names.queue)
        };
        let err = names
            .topology(queue)
            .declare(&conn)
            .await
            .expect_err("a max_length without an overflow mode");
        let text = err.to_string();
        assert!(
            text.contains(&names.queue) && text.contains("overflow"),
            "the error names the queue and the field: {text}"
        );
        assert!(!err.is_retryable(), "{text}");
        let ch = conn.create_channel().await.expect("channel");
        let declared = ch
            .queue_declare(
                names.queue.as_str().into(),
                lapin::options::QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                lapin::types::FieldTable::default(),
            )
            .await;
        assert!(declared.is_err(), "nothing was declared");
        names.delete(&conn).await;
    });
}

#[tokio::test]
async fn a_missing_exchange_fails_only_its_messages() {
    with_broker!(|conn| {
        let names = Names::new("missing");
        names
            .topology(QueueSpec::durable(&names.queue))
            .declare(&conn)
            .await
            .expect("declare");
        let p = publisher();
        let mut batch = messages(&names.exchange, 4, 10);
        batch[1].exchange = format!("{}-does-not-exist", names.exchange);
        batch[3].exchange = batch[1].exchange.clone();
        let outcomes = p.publish(&batch).await;
        assert!(
            outcomes[0].is_confirmed() && outcomes[2].is_confirmed(),
            "{outcomes:?}"
        );
        for i in [1, 3] {
            assert!(
                matches!(
                    &outcomes[i],
                    PublishOutcome::Failed(PortError::NotFound {
                        what: "exchange",
                        ..
                    })
                ),
                "{}",
                outcomes[i]
            );
        }
        // The publishing channel survived: the next batch goes through.
        assert!(
            p.publish(&messages(&names.exchange, 3, 10))
                .await
                .iter()
                .all(PublishOutcome::is_confirmed)
        );
        assert_eq!(settle_depth(&conn, &names.queue, 5).await, 5);
        names.delete(&conn).await;
    });
}

/// An exchange deleted while the publisher knows it (its channel then closed by
/// the broker mid-window): only the messages for that exchange spend an attempt;
/// those for the other exchange in the same window are confirmed or not sent
/// (given back, sent again), never failed. The next batch fails only the deleted
/// exchange's messages, before handing them over.
#[tokio::test]
async fn an_exchange_deleted_mid_stream_spends_attempts_only_on_its_own_messages() {
    with_broker!(|conn| {
        let (gone, kept) = (Names::new("deleted"), Names::new("kept"));
        for n in [&gone, &kept] {
            n.topology(QueueSpec::durable(&n.queue))
                .declare(&conn)
                .await
                .expect("declare");
        }
        let p = publisher();
        // The publisher has seen both exchanges: no passive check for them again.
        let warm: Vec<Message> = [
            messages(&gone.exchange, 1, 10),
            messages(&kept.exchange, 1, 10),
        ]
        .concat();
        assert!(
            p.publish(&warm)
                .await
                .iter()
                .all(PublishOutcome::is_confirmed)
        );
        let ch = conn.create_channel().await.expect("channel");
        ch.exchange_delete(
            gone.exchange.as_str().into(),
            lapin::options::ExchangeDeleteOptions::default(),
        )
        .await
        .expect("delete the exchange");
        // Interleaved: each of the deleted exchange's messages among the kept one's.
        let mut batch = Vec::new();
        for (a, b) in
            messages(&gone.exchange, 50, 10)
                .into_iter()
                .zip(messages(&kept.exchange, 50, 10))
        {
            batch.push(a);
            batch.push(b);
        }
        let outcomes = p.publish(&batch).await;
        let mut again = Vec::new();
        for (m, o) in batch.iter().zip(&outcomes) {
            if m.exchange == kept.exchange {
                match o {
                    PublishOutcome::Confirmed => {}
                    PublishOutcome::NotSent(_) => again.push(m.clone()),
                    other => panic!("a message for the kept exchange spent an attempt: {other}"),
                }
            } else {
                assert!(
                    matches!(
                        o,
                        PublishOutcome::Failed(PortError::NotFound {
                            what: "exchange",
                            ..
                        }) | PublishOutcome::NotSent(_)
                    ),
                    "for the deleted exchange: {o}"
                );
            }
        }
        assert!(
            outcomes
                .iter()
                .any(|o| matches!(o, PublishOutcome::Failed(_))),
            "the deleted exchange's first message is refused: {outcomes:?}"
        );
        // The next batch: the kept exchange's given-back messages go through, the
        // deleted one's fail before they are handed over.
        let retry: Vec<Message> = [again, messages(&gone.exchange, 2, 10)].concat();
        let outcomes = p.publish(&retry).await;
        for (m, o) in retry.iter().zip(&outcomes) {
            if m.exchange == kept.exchange {
                assert!(o.is_confirmed(), "given back, then sent: {o}");
            } else {
                assert!(
                    matches!(
                        o,
                        PublishOutcome::Failed(PortError::NotFound {
                            what: "exchange",
                            ..
                        })
                    ),
                    "{o}"
                );
            }
        }
        gone.delete(&conn).await;
        kept.delete(&conn).await;
    });
}

/// A publisher given its topology declares it on every connection it opens: an
/// exchange that went missing (as a non-durable one does in a broker restart) is
/// there again once the publisher reconnects, and nothing for it fails.
#[tokio::test]
async fn the_topology_is_declared_again_when_the_publisher_reconnects() {
    with_broker!(|conn| {
        let names = Names::new("redeclare");
        let mut topology = names.topology(QueueSpec::durable(&names.queue));
        topology.exchanges[0].durable = false;
        let p = publisher().with_topology(topology);
        assert!(
            p.publish(&messages(&names.exchange, 3, 10))
                .await
                .iter()
                .all(PublishOutcome::is_confirmed),
            "declared on the first connection"
        );
        // Lost, as in a restart; the publisher's channel is closed by its next publish
        // to it, and the publisher reconnects for the batch after.
        let ch = conn.create_channel().await.expect("channel");
        ch.exchange_delete(
            names.exchange.as_str().into(),
            lapin::options::ExchangeDeleteOptions::default(),
        )
        .await
        .expect("delete the exchange");
        let mut confirmed = 0;
        let mut failed = 0;
        for _ in 0..3 {
            for o in p.publish(&messages(&names.exchange, 5, 10)).await {
                match o {
                    PublishOutcome::Confirmed => confirmed += 1,
                    PublishOutcome::NotSent(_) => {}
                    _ => failed += 1,
                }
            }
        }
        assert!(
            failed <= 5,
            "only the window that found it gone fails: {failed}"
        );
        assert_eq!(
            confirmed, 10,
            "redeclared on the reconnect: the next batches go through"
        );
        names.delete(&conn).await;
    });
}

#[tokio::test]
async fn properties_and_headers_read_back_by_a_plain_consumer() {
    with_broker!(|conn| {
        let names = Names::new("props");
        names
            .topology(QueueSpec::durable(&names.queue))
            .declare(&conn)
            .await
            .expect("declare");
        let m = NewMessage::new(&names.exchange, "order.created", br#"{"id":1}"#.to_vec())
            .with_type("order.created")
            .with_correlation_id("corr-7")
            .with_source("shop")
            .with_header(
                "traceparent",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            )
            .into_message(
                MessageId::from_uuid(*outbox_testkit::message("k", "k").id.as_uuid()),
                Timestamp::now_utc(),
            );
        assert!(publisher().publish(std::slice::from_ref(&m)).await[0].is_confirmed());
        settle_depth(&conn, &names.queue, 1).await;
        let ch = conn.create_channel().await.expect("channel");
        let got = ch
            .basic_get(names.queue.as_str().into(), BasicGetOptions::default())
            .await
            .expect("get")
            .expect("a message");
        let p = &got.delivery.properties;
        assert_eq!(*p.delivery_mode(), Some(2), "persistent");
        assert_eq!(
            p.message_id().as_ref().map(|s| s.as_str().to_owned()),
            Some(m.id.to_string())
        );
        assert_eq!(p.kind().as_ref().map(|s| s.as_str()), Some("order.created"));
        assert_eq!(
            p.content_type().as_ref().map(|s| s.as_str()),
            Some("application/json")
        );
        assert_eq!(
            p.correlation_id().as_ref().map(|s| s.as_str()),
            Some("corr-7")
        );
        assert_eq!(p.app_id().as_ref().map(|s| s.as_str()), Some("shop"));
        assert_eq!(
            *p.timestamp(),
            Some(u64::try_from(m.created_at.unix_timestamp()).expect("positive"))
        );
        let headers = p.headers().as_ref().expect("headers");
        let tp = headers.inner().get("traceparent").expect("traceparent");
        assert!(
            matches!(tp, lapin::types::AMQPValue::LongString(s) if s.as_bytes() == m.headers["traceparent"].as_bytes())
        );
        assert_eq!(got.delivery.data, m.payload);
        got.delivery
            .acker
            .ack(BasicAckOptions::default())
            .await
            .expect("ack");
        names.delete(&conn).await;
    });
}

#[tokio::test]
async fn the_subscriber_delivers_with_manual_ack_prefetch_and_redelivery() {
    with_broker!(|conn| {
        let names = Names::new("subscribe");
        names
            .topology(QueueSpec::durable(&names.queue))
            .declare(&conn)
            .await
            .expect("declare");
        let sent = messages(&names.exchange, 20, 10);
        assert!(
            publisher()
                .publish(&sent)
                .await
                .iter()
                .all(PublishOutcome::is_confirmed)
        );
        let sub = RabbitSubscriber::new(common::url());
        let mut stream = sub.subscribe(&names.queue, 5).await.expect("subscribe");
        let first = stream.next().await.expect("open").expect("delivery");
        assert!(!first.redelivered);
        first.acker.nack(true).await.expect("nack");
        let mut seen = HashSet::new();
        let mut redelivered = 0;
        while seen.len() < 20 {
            let d = tokio::time::timeout(Duration::from_secs(10), stream.next())
                .await
                .expect("a delivery in time")
                .expect("open")
                .expect("delivery");
            let m = d
                .envelope
                .to_message(Timestamp::now_utc())
                .expect("decodes");
            redelivered += u32::from(d.redelivered);
            assert_eq!(m.message_type.as_deref(), Some("order.created"));
            seen.insert(m.id);
            d.acker.ack().await.expect("ack");
        }
        assert_eq!(seen, sent.iter().map(|m| m.id).collect::<HashSet<_>>());
        assert_eq!(
            redelivered, 1,
            "the nacked delivery came back marked redelivered"
        );
        drop(stream);
        assert_eq!(depth(&conn, &names.queue).await, 0);
        let err = sub
            .subscribe(&format!("{}-missing", names.queue), 5)
            .await
            .err()
            .expect("missing queue");
        assert!(
            matches!(err, PortError::NotFound { what: "queue", .. }),
            "{err}"
        );
        names.delete(&conn).await;
    });
}

#[tokio::test]
async fn a_password_never_shows_in_debug_or_errors() {
    let secret = "hunter2-not-the-real-one";
    let url = format!("amqp://guest:{secret}@127.0.0.1:5672/%2f");
    let config = RabbitPublisherConfig::new(&url);
    assert!(!format!("{config:?}").contains(secret));
    let p = RabbitPublisher::new(config);
    assert!(!format!("{p:?}").contains(secret));
    assert!(!format!("{:?}", RabbitSubscriber::new(&url)).contains(secret));
    let outcomes = p.publish(&messages("x", 1, 1)).await;
    match &outcomes[0] {
        PublishOutcome::NotSent(e) => {
            assert!(!e.to_string().contains(secret), "{e}");
            assert!(e.is_retryable(), "{e}");
            assert!(
                e.to_string().contains("refused the login"),
                "said first: {e}"
            );
        }
        other => panic!("a wrong password published: {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_published_at_once_use_their_own_connections_and_all_arrive_once() {
    with_broker!(|conn| {
        let names = Names::new("pipelines");
        names
            .topology(QueueSpec::durable(&names.queue))
            .declare(&conn)
            .await
            .expect("declare");
        let p = std::sync::Arc::new(RabbitPublisher::new(RabbitPublisherConfig {
            connections: 3,
            ..RabbitPublisherConfig::new(common::url())
        }));
        let batches: Vec<Vec<Message>> = (0..6)
            .map(|_| messages(&names.exchange, 300, 100))
            .collect();
        let tasks: Vec<_> = batches
            .iter()
            .cloned()
            .map(|b| {
                let p = std::sync::Arc::clone(&p);
                tokio::spawn(async move { p.publish(&b).await })
            })
            .collect();
        for t in tasks {
            let outcomes = t.await.expect("task");
            assert!(
                outcomes.iter().all(PublishOutcome::is_confirmed),
                "{outcomes:?}"
            );
        }
        assert_eq!(settle_depth(&conn, &names.queue, 1_800).await, 1_800);
        let ch = conn.create_channel().await.expect("channel");
        let mut seen = std::collections::HashSet::new();
        while let Some(got) = ch
            .basic_get(
                names.queue.as_str().into(),
                BasicGetOptions { no_ack: true },
            )
            .await
            .expect("get")
        {
            let id = got.delivery.properties.message_id().clone().expect("id");
            assert!(seen.insert(id.to_string()), "published twice: {id}");
        }
        let sent: std::collections::HashSet<String> =
            batches.iter().flatten().map(|m| m.id.to_string()).collect();
        assert_eq!(seen, sent);
        names.delete(&conn).await;
    });
}

#[tokio::test]
async fn a_topology_deletes_what_it_declared_and_passes_over_what_is_gone() {
    with_broker!(|conn| {
        let names = Names::new("teardown");
        let dead = format!("{}.dead", names.queue);
        let dlx = format!("{}.dlx", names.queue);
        let topology = Topology::new()
            .exchange(&names.exchange, ExchangeKind::Topic)
            .queue_spec(QueueSpec::quorum_with_limit(&names.queue, 3, &dlx, &dead))
            .bind(&names.queue, &names.exchange, "#");
        topology.declare(&conn).await.expect("declared");
        let exists = |kind: &'static str, name: String| {
            let conn = &conn;
            async move {
                let ch = conn.create_channel().await.expect("channel");
                let passive = lapin::options::ExchangeDeclareOptions {
                    passive: true,
                    ..Default::default()
                };
                match kind {
                    "exchange" => ch
                        .exchange_declare(
                            name.as_str().into(),
                            lapin::ExchangeKind::Topic,
                            passive,
                            lapin::types::FieldTable::default(),
                        )
                        .await
                        .is_ok(),
                    _ => ch
                        .queue_declare(
                            name.as_str().into(),
                            lapin::options::QueueDeclareOptions {
                                passive: true,
                                ..Default::default()
                            },
                            lapin::types::FieldTable::default(),
                        )
                        .await
                        .is_ok(),
                }
            }
        };
        assert!(exists("queue", names.queue.clone()).await);
        assert!(exists("queue", dead.clone()).await);
        topology.delete(&conn).await.expect("deleted");
        assert!(
            !exists("queue", names.queue.clone()).await,
            "the queue is gone"
        );
        assert!(
            !exists("queue", dead.clone()).await,
            "its dead-letter queue too"
        );
        assert!(
            !exists("exchange", names.exchange.clone()).await,
            "the exchange too"
        );
        assert!(
            !exists("exchange", dlx.clone()).await,
            "the dead-letter exchange too"
        );
        // Deleting again finds nothing to delete, and that is not an error.
        topology.delete(&conn).await.expect("deleting what is gone");
    });
}
