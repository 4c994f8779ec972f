//! Tests that disturb the broker: a restart in the middle of a stream
//! (`rabbitmqctl stop_app` / `start_app`) and a memory alarm. Their own test binary,
//! one test at a time (a lock), so nothing else needs the broker meanwhile; the broker
//! is restored even when a test fails.

mod common;

use std::collections::HashSet;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use common::Names;
use lapin::options::{BasicAckOptions, BasicGetOptions};
use outbox_adapters_rabbitmq::{
    QueueSpec, RabbitPublisher, RabbitPublisherConfig, RabbitSubscriber,
};
use outbox_core::{MessageId, NewMessage, Timestamp};
use outbox_ports::{PublishOutcome, Publisher, Subscriber};
use outbox_testkit::services;

/// One disturbing test at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Whether the broker under test is the local one, which these tests may stop; in
/// CI it must be (the `what` test fails otherwise), elsewhere the test is skipped,
/// saying so.
fn local_broker(what: &str) -> bool {
    if services::same_server(&common::url(), common::DEFAULT_URL) {
        return true;
    }
    assert!(
        std::env::var("CI").is_err(),
        "in CI the {what} test needs the local broker at {}",
        common::DEFAULT_URL
    );
    eprintln!("SKIPPED (not in CI): the {what} test needs the local broker");
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_restart_mid_stream_loses_no_confirmed_message() {
    if !local_broker("restart") {
        return;
    }
    let _serial = SERIAL.lock().await;
    with_broker!(|conn| {
        let names = Names::new("restart");
        names
            .topology(QueueSpec::durable(&names.queue))
            .declare(&conn)
            .await
            .expect("declare");
        drop(conn);

        let config = RabbitPublisherConfig {
            confirm_timeout: Duration::from_secs(5),
            reconnect_backoff: Duration::from_millis(200),
            ..RabbitPublisherConfig::new(common::url())
        };
        let publisher = Arc::new(RabbitPublisher::new(config));
        let subscriber = RabbitSubscriber::new(common::url());
        let mut stream = subscriber
            .subscribe(&names.queue, 10)
            .await
            .expect("subscribe");

        // Publish batches for a while; the broker stops and starts in the middle.
        let exchange = names.exchange.clone();
        let p = Arc::clone(&publisher);
        let producer = tokio::spawn(async move {
            let (mut confirmed, mut failed) = (HashSet::new(), HashSet::new());
            let started = tokio::time::Instant::now();
            while started.elapsed() < Duration::from_secs(20) {
                let batch: Vec<_> = (0..50)
                    .map(|_| {
                        NewMessage::new(&exchange, "k", vec![b'x'; 256]).into_message(
                            MessageId::from_uuid(*outbox_testkit::message("k", "k").id.as_uuid()),
                            Timestamp::now_utc(),
                        )
                    })
                    .collect();
                let outcomes = p.publish(&batch).await;
                assert_eq!(outcomes.len(), batch.len(), "one outcome per message");
                for (m, o) in batch.iter().zip(&outcomes) {
                    match o {
                        PublishOutcome::Confirmed => confirmed.insert(m.id),
                        _ => failed.insert(m.id),
                    };
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            (confirmed, failed)
        });
        tokio::time::sleep(Duration::from_secs(2)).await;
        // Started again when dropped, also if the test fails.
        let stopped = tokio::task::spawn_blocking(services::stop_rabbitmq)
            .await
            .expect("ctl");
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(
            tokio::task::spawn_blocking(move || stopped.restore())
                .await
                .expect("ctl"),
            "RabbitMQ did not come back"
        );
        let (confirmed, failed) = producer.await.expect("producer");
        eprintln!(
            "confirmed {}, reported failed {}",
            confirmed.len(),
            failed.len()
        );
        assert!(
            !failed.is_empty(),
            "the restart failed nothing: it did not happen mid-stream"
        );
        assert!(
            confirmed.len() > 500,
            "publishing did not resume after the restart"
        );

        // The consumer reconnected by itself; drain everything in the queue with it.
        let mut in_queue = HashSet::new();
        let mut acked_from_stream = 0;
        loop {
            match tokio::time::timeout(Duration::from_secs(3), stream.next()).await {
                Ok(Some(Ok(d))) => {
                    let id = d
                        .envelope
                        .to_message(Timestamp::now_utc())
                        .expect("decodes")
                        .id;
                    // Deliveries prefetched before the restart cannot be acked on their
                    // dead channel; the broker still holds them and delivers them again.
                    if d.acker.ack().await.is_ok() {
                        in_queue.insert(id);
                        acked_from_stream += 1;
                    }
                }
                Ok(Some(Err(e))) => eprintln!("stream error while reconnecting: {e}"),
                Ok(None) => panic!("the subscription ended"),
                Err(_) => break,
            }
        }
        drop(stream);
        // Only 10 deliveries (the prefetch) could sit on the channel lost in the
        // restart; anything beyond came through the resubscribed consumer.
        assert!(
            acked_from_stream > 10,
            "the consumer did not resume after the restart ({acked_from_stream} acked)"
        );
        // Anything the reconnecting consumer left behind, read directly.
        let conn = common::connection().await.expect("broker back");
        let ch = conn.create_channel().await.expect("channel");
        while let Some(got) = ch
            .basic_get(names.queue.as_str().into(), BasicGetOptions::default())
            .await
            .expect("get")
        {
            if let Some(id) = got.delivery.properties.message_id() {
                in_queue.insert(id.as_str().parse().expect("uuid"));
            }
            got.delivery
                .acker
                .ack(BasicAckOptions::default())
                .await
                .expect("ack");
        }
        let lost: Vec<_> = confirmed.difference(&in_queue).collect();
        assert!(
            lost.is_empty(),
            "{} messages were confirmed but are not in the queue",
            lost.len()
        );
        names.delete(&conn).await;
    });
}

/// The broker's memory watermark now (a relative value such as `0.4`).
fn watermark() -> String {
    let out = Command::new("rabbitmqctl")
        .args(["eval", "vm_memory_monitor:get_vm_memory_high_watermark()."])
        .output()
        .expect("rabbitmqctl eval");
    let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if text.parse::<f64>().is_ok() {
        text
    } else {
        "0.4".to_owned()
    }
}

/// Puts the memory watermark back when dropped (also on a failing test).
struct ClearAlarm(String);

impl Drop for ClearAlarm {
    fn drop(&mut self) {
        let ok = Command::new("rabbitmqctl")
            .args(["set_vm_memory_high_watermark", &self.0])
            .status()
            .is_ok_and(|s| s.success());
        eprintln!("memory watermark restored to {}: {ok}", self.0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_connection_confirms_nothing_and_recovers_when_unblocked() {
    if !local_broker("alarm") {
        return;
    }
    let _serial = SERIAL.lock().await;
    with_broker!(|conn| {
        let names = Names::new("blocked");
        names
            .topology(QueueSpec::durable(&names.queue))
            .declare(&conn)
            .await
            .expect("declare");
        let config = RabbitPublisherConfig {
            confirm_timeout: Duration::from_secs(2),
            reconnect_backoff: Duration::from_millis(200),
            ..RabbitPublisherConfig::new(common::url())
        };
        let publisher = RabbitPublisher::new(config);
        let batch = |n| -> Vec<_> {
            (0..n)
                .map(|_| {
                    NewMessage::new(&names.exchange, "k", vec![b'x'; 64]).into_message(
                        MessageId::from_uuid(*outbox_testkit::message("k", "k").id.as_uuid()),
                        Timestamp::now_utc(),
                    )
                })
                .collect()
        };
        assert!(
            publisher
                .publish(&batch(5))
                .await
                .iter()
                .all(PublishOutcome::is_confirmed)
        );

        let _clear = ClearAlarm(watermark());
        assert!(
            Command::new("rabbitmqctl")
                .args(["set_vm_memory_high_watermark", "0"])
                .status()
                .is_ok_and(|s| s.success()),
            "could not raise a memory alarm"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        let blocked = tokio::time::timeout(Duration::from_secs(30), publisher.publish(&batch(5)))
            .await
            .expect("a blocked broker must not hang the publisher");
        for o in &blocked {
            match o {
                // Known blocked before sending: not sent; learnt while waiting for the
                // confirms: failed (it may have reached the broker). Never confirmed.
                PublishOutcome::NotSent(e) | PublishOutcome::Failed(e) => {
                    assert!(e.is_retryable(), "{e}");
                }
                other => panic!("published while the broker blocked publishing: {other}"),
            }
        }
        eprintln!("while blocked: {}", blocked[0]);
        drop(_clear);
        tokio::time::sleep(Duration::from_secs(1)).await;
        let mut recovered = false;
        for _ in 0..10 {
            let outcomes =
                tokio::time::timeout(Duration::from_secs(30), publisher.publish(&batch(5)))
                    .await
                    .expect("the publisher hangs after the alarm");
            if outcomes.iter().all(PublishOutcome::is_confirmed) {
                recovered = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        assert!(
            recovered,
            "publishing did not resume after the alarm cleared"
        );
        names.delete(&conn).await;
    });
}

/// A non-durable exchange of the publisher's topology is gone after a broker
/// restart; the publisher declares its topology again on the connection it opens
/// after the restart, so no message for it is refused (none would go dead).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transient_configured_exchange_is_back_after_a_broker_restart() {
    if !local_broker("restart") {
        return;
    }
    let _serial = SERIAL.lock().await;
    with_broker!(|conn| {
        drop(conn);
        let names = Names::new("transient");
        let mut topology = names.topology(QueueSpec::durable(&names.queue));
        topology.exchanges[0].durable = false;
        let config = RabbitPublisherConfig {
            confirm_timeout: Duration::from_secs(5),
            reconnect_backoff: Duration::from_millis(200),
            ..RabbitPublisherConfig::new(common::url())
        };
        let publisher = RabbitPublisher::new(config).with_topology(topology);
        let batch = |n: usize| -> Vec<outbox_core::Message> {
            (0..n)
                .map(|_| {
                    NewMessage::new(&names.exchange, "k", vec![b'x'; 16]).into_message(
                        MessageId::from_uuid(*outbox_testkit::message("k", "k").id.as_uuid()),
                        Timestamp::now_utc(),
                    )
                })
                .collect()
        };
        assert!(
            publisher
                .publish(&batch(3))
                .await
                .iter()
                .all(PublishOutcome::is_confirmed),
            "declared on the first connection"
        );
        let stopped = tokio::task::spawn_blocking(services::stop_rabbitmq)
            .await
            .expect("ctl");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(
            tokio::task::spawn_blocking(move || stopped.restore())
                .await
                .expect("ctl"),
            "RabbitMQ did not come back"
        );
        let started = tokio::time::Instant::now();
        let mut confirmed = 0;
        while confirmed < 10 && started.elapsed() < Duration::from_secs(60) {
            for o in publisher.publish(&batch(5)).await {
                match o {
                    PublishOutcome::Confirmed => confirmed += 1,
                    // Refused for want of the exchange or its binding: what a
                    // topology declared only at start leads to.
                    PublishOutcome::Failed(outbox_ports::PortError::NotFound { .. })
                    | PublishOutcome::Unroutable(_) => {
                        panic!("refused after the restart: {o}")
                    }
                    // The broker still coming up, or the old connection found dead.
                    _ => {}
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert!(
            confirmed >= 10,
            "publishing did not resume: {confirmed} confirmed"
        );
        let conn = common::connection().await.expect("broker back");
        names.delete(&conn).await;
    });
}
