//! The relay and the consumer reach the broker through a proxy. A backlog of half
//! the orders is committed while they are stopped; they start and drain it
//! undelayed. They stop, the proxy delays every chunk 50 ms each way (a round trip
//! 100 ms longer, as to a broker in another region), a second backlog is
//! committed and they start again to drain it. The report gives both drains'
//! rates (process start included, the same in both), so the cost of the delay on
//! every confirm and acknowledgement shows as their ratio. Checks nothing lost or
//! twice.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use outbox_testkit::proxy::{TcpProxy, host_port};

use super::support::{relay_and_consumer, report};
use crate::world::{self, Produced, World};
use crate::{Ctx, Report, conclude};

/// The delay each way.
const DELAY: Duration = Duration::from_millis(50);

pub(crate) async fn slow_network(ctx: &Ctx) -> anyhow::Result<Report> {
    let target = host_port(&ctx.urls.amqp).context("no host:port in the AMQP URL")?;
    let proxy = TcpProxy::start(target).await?;
    let mut w = World::new("slow_network", &ctx.urls, &ctx.bins).await?;
    w.through(proxy.url_for(&ctx.urls.amqp));
    let r = run(ctx, &w, &proxy).await;
    w.cleanup(r.as_ref().map_or(true, |r| !r.passed())).await;
    r
}

async fn run(ctx: &Ctx, w: &World, proxy: &TcpProxy) -> anyhow::Result<Report> {
    let mut report = report("slow_network");
    let half = ctx.orders() / 2;
    let (direct, children) = drain(ctx, w, 1, half).await?;
    for child in children {
        if !world::terminate(child).await {
            report
                .failures
                .push("a process did not stop cleanly on SIGTERM between the drains".to_owned());
        }
    }
    proxy.delay(DELAY);
    let (delayed, children) = drain(ctx, w, 1 + half, half).await?;
    let rate = |(orders, took): (u64, Duration)| orders as f64 / took.as_secs_f64();
    report.notes.push(format!(
        "backlogs drained (orders a second, relay and consumer start to last invoice): {:.0} undelayed, {:.0} with {DELAY:?} each way ({:.2} of it)",
        rate(direct),
        rate(delayed),
        rate(delayed) / rate(direct)
    ));
    let produced = Produced {
        attempted: 2 * u64::try_from(half).unwrap_or(0),
        errors: 0,
    };
    conclude(ctx, w, report, produced, Instant::now(), children).await
}

/// Commits orders `first..first + n` with no relay or consumer running, then
/// starts them; how many orders the backlog held, the time from the start until
/// every committed order is invoiced, and the running relay and consumer.
async fn drain(
    ctx: &Ctx,
    w: &World,
    first: i64,
    n: i64,
) -> anyhow::Result<((u64, Duration), Vec<tokio::process::Child>)> {
    let before = w.committed().await;
    let produced = w.produce_with(first, n, 10_000, 16).finish().await;
    anyhow::ensure!(
        produced.errors == 0,
        "{} order transactions failed",
        produced.errors
    );
    let committed = w.committed().await;
    let started = Instant::now();
    let (relay, consumer) = relay_and_consumer(w)?;
    w.wait_until(
        "every committed order invoiced",
        ctx.settle_timeout(),
        async |w| w.invoiced().await >= committed,
    )
    .await?;
    Ok((
        (committed - before, started.elapsed()),
        vec![relay, consumer],
    ))
}
