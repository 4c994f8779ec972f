//! `--cluster-only`: the relay and a raw confirm loop on the local 3-node RabbitMQ
//! cluster (`OUTBOX_TEST_CLUSTER_URLS`, `cargo xtask cluster up`), publishing to
//! one quorum queue replicated on the three nodes: `raw_confirm_cluster`,
//! `relay_cluster_1q` and their ratio. A quorum queue confirms once a majority of
//! its replicas wrote the message, so both pay the replication.

use lapin::options::{ExchangeDeleteOptions, QueueDeleteOptions};

use crate::bench::{Bench, EXCHANGE, QUEUE, Sizes};

/// The cluster's first AMQP URL (the queue is declared through it, so its leader
/// is there).
///
/// # Errors
/// `OUTBOX_TEST_CLUSTER_URLS` unset or empty.
pub(crate) fn first_url() -> anyhow::Result<String> {
    std::env::var("OUTBOX_TEST_CLUSTER_URLS")
        .ok()
        .and_then(|v| {
            v.split(',')
                .map(str::trim)
                .find(|u| !u.is_empty())
                .map(str::to_owned)
        })
        .ok_or_else(|| {
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
