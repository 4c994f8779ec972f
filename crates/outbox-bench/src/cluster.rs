//! `--cluster-only`: the relay and a raw confirm loop on the local 3-node RabbitMQ
//! cluster (`OUTBOX_TEST_CLUSTER_URLS`, `cargo xtask cluster up`), publishing to
//! one quorum queue replicated on the three nodes: `raw_confirm_cluster`,
//! `relay_cluster_1q` and their ratio. A quorum queue confirms once a majority of
//! its replicas wrote the message, so both pay the replication. Then the same
//! backlog through a sharded exchange into a quorum queue of four shards whose
//! leaders are spread over the nodes: `relay_sharded_4q`.

use std::time::Duration;

use lapin::options::{ExchangeDeleteOptions, QueueDeleteOptions};
use outbox_adapters_rabbitmq::{
    BindingSpec, ExchangeKind, ExchangeSpec, QueueSpec, QueueType, RabbitPublisher,
    RabbitPublisherConfig, Topology,
};
use outbox_testkit::cluster::{named_urls, node_of_port, queue_leader};

use crate::bench::{Bench, EXCHANGE, QUEUE, Sizes};

const SHARDED_EXCHANGE: &str = "outbox-bench.sx";
const SHARDED_QUEUE: &str = "outbox-bench.sq";
const SHARDS: u16 = 4;

/// The cluster's first AMQP URL (the queue is declared through it, so its leader
/// is there).
///
/// # Errors
/// `OUTBOX_TEST_CLUSTER_URLS` unset or empty.
pub(crate) fn first_url() -> anyhow::Result<String> {
    named_urls().into_iter().next().ok_or_else(|| {
        anyhow::anyhow!(
            "--cluster-only needs OUTBOX_TEST_CLUSTER_URLS (cargo xtask cluster up prints it)"
        )
    })
}

/// `raw_confirm_cluster`, `relay_cluster_1q` and `relay_cluster_1q/raw_confirm_cluster`;
/// the queue and exchange are deleted afterwards.
pub(crate) async fn record_cluster(b: &mut Bench, sizes: &Sizes) -> anyhow::Result<()> {
    let n = usize::try_from(sizes.backlog)?;
    let (raw, raw_cpu) = b.raw_confirm(n).await?;
    b.record("raw_confirm_cluster", raw, "msg/s");
    b.record_cpu("raw_confirm_cluster", raw_cpu);
    let (relay, relay_cpu) = b.relay(sizes.backlog, 1).await?;
    b.record("relay_cluster_1q", relay, "msg/s");
    b.record_cpu("relay_cluster_1q", relay_cpu);
    b.record("relay_cluster_1q/raw_confirm_cluster", relay / raw, "ratio");
    let (sharded, sharded_cpu) = relay_sharded(b, sizes.backlog).await?;
    b.record("relay_sharded_4q", sharded, "msg/s");
    b.record_cpu("relay_sharded_4q", sharded_cpu);
    b.record(
        "relay_sharded_4q/raw_confirm_cluster",
        sharded / raw,
        "ratio",
    );
    b.record(
        "relay_sharded_4q/relay_cluster_1q",
        sharded / relay,
        "ratio",
    );
    let ch = b.amqp.create_channel().await?;
    ch.queue_delete(QUEUE.into(), QueueDeleteOptions::default())
        .await?;
    ch.exchange_delete(EXCHANGE.into(), ExchangeDeleteOptions::default())
        .await?;
    let _ = sqlx::query("DROP SCHEMA IF EXISTS bench_relay CASCADE")
        .execute(&b.pool)
        .await;
    Ok(())
}

/// The sharded stream: exchange `outbox-bench.sx` of 4 shards, quorum queue
/// `outbox-bench.sq` of 4 shards bound shard to shard.
fn sharded_topology() -> Topology {
    Topology {
        exchanges: vec![ExchangeSpec {
            name: SHARDED_EXCHANGE.into(),
            kind: ExchangeKind::Direct,
            durable: true,
            shards: SHARDS,
        }],
        queues: vec![QueueSpec {
            queue_type: QueueType::Quorum,
            shards: SHARDS,
            ..QueueSpec::durable(SHARDED_QUEUE)
        }],
        bindings: vec![BindingSpec {
            queue: SHARDED_QUEUE.into(),
            exchange: SHARDED_EXCHANGE.into(),
            routing_key: "k".into(),
        }],
    }
}

/// The relay (one pipeline, as `relay_cluster_1q`) draining `n` messages without
/// ordering keys into the sharded stream, each shard queue declared through node
/// `i % 3` so that its leader is there (checked: the run fails when the leaders are
/// not on every node). Also records how many each shard got; everything is deleted
/// afterwards.
async fn relay_sharded(b: &mut Bench, n: i64) -> anyhow::Result<(f64, crate::cpu::CpuPerMessage)> {
    let urls = named_urls();
    let topology = sharded_topology();
    let plain = topology.expanded();
    for (i, q) in plain.queues.iter().enumerate() {
        let conn =
            outbox_adapters_rabbitmq::connect(&urls[i % urls.len()], Duration::from_secs(10))
                .await?;
        Topology {
            queues: vec![q.clone()],
            ..Topology::default()
        }
        .declare(&conn)
        .await?;
        let _ = conn.close(200, "declared".into()).await;
    }
    let any = node_of_port(5681);
    let mut leaders: Vec<String> = plain
        .queues
        .iter()
        .map(|q| queue_leader(&any, &q.name).unwrap_or_else(|| "?".to_owned()))
        .collect();
    println!("relay_sharded_4q: shard leaders {leaders:?}");
    leaders.sort();
    leaders.dedup();
    anyhow::ensure!(
        leaders.len() == urls.len().min(usize::from(SHARDS)),
        "the shards' leaders are not spread over the nodes: {leaders:?}"
    );
    let schema = b.fresh_schema("bench_relay_sharded").await?;
    b.backlog_for(SHARDED_EXCHANGE, &schema, n, None).await?;
    let publisher =
        RabbitPublisher::new(RabbitPublisherConfig::new(&b.amqp_url)).with_topology(topology);
    let measured = b.drain_with(publisher, &schema, n, 1).await?;
    let mut per_shard = Vec::new();
    for q in &plain.queues {
        per_shard.push(b.depth(&q.name).await?);
    }
    println!("relay_sharded_4q: messages per shard {per_shard:?}");
    anyhow::ensure!(
        i64::from(per_shard.iter().sum::<u32>()) == n && per_shard.iter().all(|d| *d > 0),
        "the shards do not hold the stream: {per_shard:?} of {n}"
    );
    let ch = b.amqp.create_channel().await?;
    for q in &plain.queues {
        ch.queue_delete(q.name.as_str().into(), QueueDeleteOptions::default())
            .await?;
    }
    for x in &plain.exchanges {
        ch.exchange_delete(x.name.as_str().into(), ExchangeDeleteOptions::default())
            .await?;
    }
    let _ = sqlx::query("DROP SCHEMA IF EXISTS bench_relay_sharded CASCADE")
        .execute(&b.pool)
        .await;
    Ok(measured)
}
