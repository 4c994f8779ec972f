//! On the local 3-node RabbitMQ cluster (`cargo xtask cluster up`): SIGKILLs the
//! node that holds the relay's connection and leads the billing quorum queue,
//! mid-stream, and starts it again 10 s later. The relay and the consumer get
//! every node (`[rabbitmq] urls`, `SHOP_AMQP_FAILOVER_URLS`) and fail over; the tap and the
//! billing queue are quorum queues. Checks nothing lost, nothing twice, and how
//! long after the kill publishing and effects went past it (bounded below).

use std::time::{Duration, Instant};

use anyhow::Context as _;
use outbox_testkit::cluster;

use super::support::{readyz, report, wait_committed};
use crate::world::{Coordination, SweepOpts, World, free_port};
use crate::{Ctx, Report, conclude};

/// How many times the consumer is started again to land on the relay's node (each
/// start picks a node at random: 1 in 3).
const CONSUMER_STARTS: usize = 12;

/// The billing consumer, started again (before any order) until its connection
/// is on the node at AMQP port `port`, at most [`CONSUMER_STARTS`] times; the last
/// one started either way (the report says where it is).
async fn consumer_on(w: &World, port: u16) -> anyhow::Result<tokio::process::Child> {
    let mut started = 0;
    loop {
        started += 1;
        let consumer = w.consumer("c1", &[])?;
        let pid = consumer.id().context("the consumer has no pid")?;
        let mut ports = Vec::new();
        w.wait_until(
            "the consumer's connection",
            Duration::from_secs(30),
            async |_| {
                ports = cluster::amqp_ports_of(pid);
                !ports.is_empty()
            },
        )
        .await?;
        // The subscription's connection, once the setup's own has gone.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let ports = cluster::amqp_ports_of(pid);
        if ports.contains(&port) || started == CONSUMER_STARTS {
            return Ok(consumer);
        }
        if !crate::world::terminate(consumer).await {
            anyhow::bail!("a consumer on the wrong node did not stop cleanly");
        }
    }
}

/// How long the killed node stays down.
const DOWN_FOR: Duration = Duration::from_secs(10);

/// Orders committed after the kill that must be published (and invoiced) to call
/// the stream going again: under a second of the producer's rate, so that neither
/// what was published before the kill nor one lucky message counts.
const PAST_KILL: u64 = 50;

/// The most the relay may take, from the kill, to publish [`PAST_KILL`] orders
/// committed after it (failing over to a live node, the quorum queue electing a
/// new leader), and the consumer to invoice them. Below [`DOWN_FOR`], so a relay
/// that comes back only through the restarted node fails, and so does the
/// consumer (on that node too, see [`consumer_on`]).
/// Measured (RELIABILITY.md): about 2 s.
const RECOVERY_BOUND: Duration = Duration::from_secs(9);

pub(crate) async fn cluster_node_kill(ctx: &Ctx) -> anyhow::Result<Report> {
    anyhow::ensure!(
        ctx.cluster.len() >= 3,
        "cluster_node_kill needs the local 3-node RabbitMQ cluster: set {} (cargo xtask chaos and ci start it)",
        cluster::CLUSTER_URLS
    );
    let w = World::on_cluster("cluster_kill", &ctx.urls, &ctx.bins, &ctx.cluster).await?;
    let r = run(ctx, &w).await;
    w.cleanup(r.as_ref().map_or(true, |r| !r.passed())).await;
    r
}

async fn run(ctx: &Ctx, w: &World) -> anyhow::Result<Report> {
    let mut report = report("cluster_node_kill");
    let port = free_port()?;
    let cfg = w.relay_config(
        "r1",
        Coordination::Postgres,
        Some(port),
        SweepOpts::default(),
    );
    let relay = w.relay("r1", &cfg)?;
    let relay_pid = relay.id().context("the relay has no pid")?;
    // `/readyz` connects the relay's publisher; then `ss` says to which node.
    let mut relay_port = None;
    w.wait_until(
        "the relay's connection to a node",
        Duration::from_secs(30),
        async |_| {
            if readyz(port).await == Some(200) {
                relay_port = cluster::amqp_ports_of(relay_pid).first().copied();
            }
            relay_port.is_some()
        },
    )
    .await?;
    let relay_port = relay_port.context("no relay connection")?;
    let target = cluster::node_of_port(relay_port);
    // The billing queue again, declared through the relay's node: a quorum queue's
    // leader starts where it is declared, so the node killed below holds both.
    // Nothing was produced yet and no consumer runs.
    let ch = w.channel().await?;
    ch.queue_delete(
        w.shop.queue.as_str().into(),
        lapin::options::QueueDeleteOptions::default(),
    )
    .await?;
    let through_target = outbox_examples::Shop {
        amqp_url: w
            .amqp_nodes
            .iter()
            .find(|u| u.contains(&format!(":{relay_port}/")))
            .context("the relay's node among the cluster's URLs")?
            .clone(),
        ..w.shop.clone()
    };
    through_target.setup(&w.pool).await?;
    let leader = cluster::queue_leader(&target, &w.shop.queue);
    anyhow::ensure!(
        leader.as_deref() == Some(target.as_str()),
        "the billing queue's leader is {leader:?}, not the relay's node {target}"
    );
    let consumer = consumer_on(w, relay_port).await?;

    let n = ctx.orders();
    // The stream lasts 20 s, so that orders keep coming for longer than the node
    // is down and the recovery bound.
    let rate = u32::try_from(n / 20).unwrap_or(Ctx::RATE);
    let pid = cluster::os_pid(&target).with_context(|| format!("no pid of {target}"))?;
    let producer = w.produce(1, n, rate);
    wait_committed(w, n as u64 / 4).await?;
    // The relay still on the target alone (it could have reconnected meanwhile).
    let relay_ports = cluster::amqp_ports_of(relay_pid);
    anyhow::ensure!(
        !relay_ports.is_empty() && relay_ports.iter().all(|p| *p == relay_port),
        "the relay's connections moved before the kill: {relay_ports:?}, not only {relay_port}"
    );
    let consumer_on_target = consumer
        .id()
        .is_some_and(|pid| cluster::amqp_ports_of(pid).contains(&relay_port));
    report.notes.push(if consumer_on_target {
        "the consumer was on the killed node too".to_owned()
    } else {
        format!(
            "the consumer was on another node after {CONSUMER_STARTS} starts (its failover not exercised in this run)"
        )
    });
    let killed_at = Instant::now();
    let node = target.clone();
    let killed = tokio::task::spawn_blocking(move || cluster::kill_node(&node, pid))
        .await?
        .with_context(|| format!("cannot kill {target}"))?;
    let at_kill = w.committed().await;
    report.notes.push(format!(
        "killed {target} (the relay's node, the billing queue's leader) at {at_kill} committed orders"
    ));
    // Publishing and effects past the kill: orders committed after it sent, then
    // invoiced; watched while the node is down and while it starts again.
    let watch = async {
        let (mut published, mut invoiced) = (None, None);
        while (published.is_none() || invoiced.is_none()) && killed_at.elapsed() < RECOVERY_BOUND {
            if published.is_none() && w.sent().await >= at_kill + PAST_KILL {
                published = Some(killed_at.elapsed());
            }
            if invoiced.is_none() && w.invoiced().await >= at_kill + PAST_KILL {
                invoiced = Some(killed_at.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        (published, invoiced)
    };
    let restart = async {
        tokio::time::sleep(DOWN_FOR).await;
        let restored = tokio::task::spawn_blocking(move || killed.restore())
            .await
            .unwrap_or(false);
        (restored, Instant::now())
    };
    let ((published_s, invoiced_s), (restored, fault_end)) = tokio::join!(watch, restart);
    anyhow::ensure!(restored, "{target} did not start again");
    for (what, took) in [("published", published_s), ("invoiced", invoiced_s)] {
        match took {
            Some(t) => report.notes.push(format!(
                "{PAST_KILL} orders committed after the kill {what} {:.1} s after it, the node still down",
                t.as_secs_f64()
            )),
            None => report.failures.push(format!(
                "{PAST_KILL} orders committed after the kill not {what} within {RECOVERY_BOUND:?} of it"
            )),
        }
    }
    let produced = producer.finish().await;
    conclude(ctx, w, report, produced, fault_end, vec![relay, consumer]).await
}
