//! Confirmed messages per second: `RabbitPublisher` next to a plain lapin loop with
//! the same window, alternating in one run.
//!
//! `cargo run --release -p outbox-adapters-rabbitmq --example publish_bench -- [messages] [window]`
//! with `OUTBOX_TEST_AMQP_URL` (default: the local broker). 1 KiB persistent
//! messages to a durable queue, which is purged between runs and deleted at the end
//! (kept, empty, with a third argument `keep`, for a relay run against it).

#![allow(clippy::print_stdout)] // the report is the program's output

use std::time::{Duration, Instant};

use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, QueueDeleteOptions, QueuePurgeOptions,
};
use lapin::{BasicProperties, Confirmation};
use outbox_adapters_rabbitmq::{
    BindingSpec, ExchangeKind, ExchangeSpec, QueueSpec, RabbitPublisher, RabbitPublisherConfig,
    Topology, connect,
};
use outbox_core::{MessageId, NewMessage, Timestamp};
use outbox_ports::Publisher;

const EXCHANGE: &str = "outbox-bench.x";
const QUEUE: &str = "outbox-bench.q";

async fn raw(
    conn: &lapin::Connection,
    n: usize,
    window: usize,
) -> Result<f64, Box<dyn std::error::Error>> {
    let ch = conn.create_channel().await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    let body = vec![b'x'; 1024];
    let started = Instant::now();
    let mut sent = 0;
    while sent < n {
        let mut confirms = Vec::with_capacity(window);
        for _ in 0..window.min(n - sent) {
            confirms.push(
                ch.basic_publish(
                    EXCHANGE.into(),
                    "k".into(),
                    BasicPublishOptions {
                        mandatory: true,
                        ..BasicPublishOptions::default()
                    },
                    &body,
                    BasicProperties::default().with_delivery_mode(2),
                )
                .await?,
            );
        }
        for c in confirms {
            assert!(
                matches!(c.await?, Confirmation::Ack(None)),
                "raw publish not confirmed"
            );
            sent += 1;
        }
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

/// The messages are made before the clock starts: the relay has them from the store.
async fn ours(p: &RabbitPublisher, n: usize, window: usize) -> f64 {
    let all: Vec<_> = (0..n)
        .map(|_| {
            NewMessage::new(EXCHANGE, "k", vec![b'x'; 1024])
                .with_type("bench")
                .into_message(MessageId::from_uuid(uuid_v7()), Timestamp::now_utc())
        })
        .collect();
    let started = Instant::now();
    for batch in all.chunks(window) {
        let outcomes = p.publish(batch).await;
        assert!(
            outcomes.iter().all(|o| o.is_confirmed()),
            "publisher outcome not confirmed"
        );
    }
    n as f64 / started.elapsed().as_secs_f64()
}

fn uuid_v7() -> uuid::Uuid {
    uuid::Uuid::now_v7()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().map_or(Ok(20_000), |a| a.parse())?;
    let window: usize = args.next().map_or(Ok(1024), |a| a.parse())?;
    let keep = args.next().as_deref() == Some("keep");
    let url = std::env::var("OUTBOX_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned());
    let conn = connect(&url, Duration::from_secs(5)).await?;
    Topology {
        exchanges: vec![ExchangeSpec {
            name: EXCHANGE.into(),
            kind: ExchangeKind::Direct,
            durable: true,
            shards: 1,
        }],
        queues: vec![QueueSpec::durable(QUEUE)],
        bindings: vec![BindingSpec {
            queue: QUEUE.into(),
            exchange: EXCHANGE.into(),
            routing_key: "k".into(),
        }],
    }
    .declare(&conn)
    .await?;
    let admin = conn.create_channel().await?;
    let publisher = RabbitPublisher::new(RabbitPublisherConfig {
        max_in_flight: window,
        ..RabbitPublisherConfig::new(&url)
    });
    let (mut raws, mut oursv) = (Vec::new(), Vec::new());
    for round in 1..=3 {
        let r = raw(&conn, n, window).await?;
        admin
            .queue_purge(QUEUE.into(), QueuePurgeOptions::default())
            .await?;
        let o = ours(&publisher, n, window).await;
        admin
            .queue_purge(QUEUE.into(), QueuePurgeOptions::default())
            .await?;
        println!(
            "round {round}: raw lapin {r:.0} msg/s, RabbitPublisher {o:.0} msg/s, ratio {:.2}",
            o / r
        );
        raws.push(r);
        oursv.push(o);
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    println!(
        "publish_bench: {n} x 1 KiB persistent, window {window}: raw lapin {:.0} msg/s, RabbitPublisher {:.0} msg/s, ratio {:.2} (means of 3 alternating rounds)",
        mean(&raws),
        mean(&oursv),
        mean(&oursv) / mean(&raws)
    );
    if !keep {
        admin
            .queue_delete(QUEUE.into(), QueueDeleteOptions::default())
            .await?;
    }
    Ok(())
}
