//! Twice, each in a world of its own: the relay and the consumer reach the broker
//! (then, the second time, PostgreSQL) through a proxy that, once a third of the
//! orders is committed, forwards nothing for 20 s and closes nothing (a half-open
//! network: a partition, a dead middlebox). Checks that the relay's `/readyz`
//! stops answering 200 within a bound while it cannot work, answers 200 again
//! within a bound after the network heals, and that nothing is lost or takes
//! effect twice. Then, with every order invoiced and the relay idle, the same
//! stall for 10 s: `/readyz` must notice it too, with no batch in flight to time
//! out (its broker check makes a round trip on the connection; a check that does
//! not answer within `curl`'s 5 s counts as not ready, as a probe's timeout does).

use std::time::{Duration, Instant};

use anyhow::Context as _;
use outbox_testkit::proxy::{TcpProxy, host_port};

use super::support::{readyz, report, wait_committed};
use crate::world::{Coordination, SweepOpts, World, free_port};
use crate::{Ctx, Report, conclude};

/// How long the network forwards nothing.
const STALL: Duration = Duration::from_secs(20);

/// How long it forwards nothing again once the relay is idle.
const IDLE_STALL: Duration = Duration::from_secs(10);

/// The most the relay may take to stop reporting ready once the network stalls:
/// its batch's confirm timeout (3 s) and a readiness check's own round trip.
const NOT_READY_WITHIN: Duration = Duration::from_secs(10);

/// The most the relay may take to report ready again once the network heals.
const READY_AGAIN_WITHIN: Duration = Duration::from_secs(20);

/// The service the proxy stands in front of.
#[derive(Debug, Clone, Copy)]
enum Side {
    Broker,
    Postgres,
}

pub(crate) async fn network_blackhole(ctx: &Ctx) -> anyhow::Result<Report> {
    let mut report = report("network_blackhole");
    for side in [Side::Broker, Side::Postgres] {
        let url = match side {
            Side::Broker => &ctx.urls.amqp,
            Side::Postgres => &ctx.urls.pg,
        };
        let target = host_port(url).with_context(|| format!("no host:port in {side:?}'s URL"))?;
        let proxy = TcpProxy::start(target).await?;
        let mut w = World::new("net_blackhole", &ctx.urls, &ctx.bins).await?;
        match side {
            Side::Broker => w.through(proxy.url_for(url)),
            Side::Postgres => w.through_pg(proxy.url_for(url)),
        }
        let r = run(ctx, &w, &proxy, side, report).await;
        w.cleanup(r.as_ref().map_or(true, |r| !r.passed())).await;
        report = r?;
    }
    Ok(report)
}

async fn run(
    ctx: &Ctx,
    w: &World,
    proxy: &TcpProxy,
    side: Side,
    mut report: Report,
) -> anyhow::Result<Report> {
    let port = free_port()?;
    let cfg = w.relay_config(
        "r1",
        Coordination::Postgres,
        Some(port),
        SweepOpts::default(),
    );
    let relay = w.relay("r1", &cfg)?;
    let consumer = w.consumer("c1", &[])?;
    w.wait_until("the relay ready", Duration::from_secs(30), async |_| {
        readyz(port).await == Some(200)
    })
    .await?;
    let n = ctx.orders();
    // The stream outlasts the stall.
    let rate = u32::try_from(n / 30).unwrap_or(Ctx::RATE);
    let producer = w.produce(1, n, rate);
    wait_committed(w, n as u64 / 3).await?;
    let (not_ready_after, ready_after) = readiness_through(proxy, port, STALL).await;
    // When the network healed.
    let fault_end = Instant::now() - ready_after.unwrap_or_default();
    judge(
        &mut report,
        &format!("{side:?}, the stall"),
        not_ready_after,
        ready_after,
    );
    let produced = producer.finish().await;
    // The relay idle: nothing due, nothing in flight.
    let committed = w.committed().await;
    w.wait_until(
        "every committed order invoiced",
        ctx.settle_timeout(),
        async |w| w.invoiced().await >= committed,
    )
    .await?;
    // The settling after the heal alone (recovery_s also spans the idle stall).
    report.notes.push(format!(
        "{side:?}: every order invoiced {:.1}s after the network healed ({committed} committed, the last when the stream ended)",
        fault_end.elapsed().as_secs_f64()
    ));
    let (not_ready_after, ready_after) = readiness_through(proxy, port, IDLE_STALL).await;
    judge(
        &mut report,
        &format!("{side:?}, the idle stall"),
        not_ready_after,
        ready_after,
    );
    conclude(ctx, w, report, produced, fault_end, vec![relay, consumer]).await
}

/// Stalls the proxy for `stall`, then resumes it; when the relay's `/readyz` first
/// answered other than 200 after the stall began, and when it answered 200 again
/// after the network healed.
async fn readiness_through(
    proxy: &TcpProxy,
    port: u16,
    stall: Duration,
) -> (Option<Duration>, Option<Duration>) {
    proxy.stall();
    let stalled_at = Instant::now();
    let mut not_ready_after = None;
    while stalled_at.elapsed() < stall {
        if not_ready_after.is_none() && readyz(port).await != Some(200) {
            not_ready_after = Some(stalled_at.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    proxy.resume();
    let healed_at = Instant::now();
    while healed_at.elapsed() < READY_AGAIN_WITHIN + Duration::from_secs(10) {
        if readyz(port).await == Some(200) {
            return (not_ready_after, Some(healed_at.elapsed()));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    (not_ready_after, None)
}

/// The report's verdict on one stall.
fn judge(
    report: &mut Report,
    what: &str,
    not_ready_after: Option<Duration>,
    ready_after: Option<Duration>,
) {
    match not_ready_after {
        Some(t) if t <= NOT_READY_WITHIN => report.notes.push(format!(
            "{what}: /readyz not 200 {:.1} s into it",
            t.as_secs_f64()
        )),
        Some(t) => report.failures.push(format!(
            "{what}: /readyz not 200 only {:.1} s into it (bound {NOT_READY_WITHIN:?})",
            t.as_secs_f64()
        )),
        None => report.failures.push(format!(
            "{what}: /readyz answered 200 throughout, while the relay could not reach the broker"
        )),
    }
    match ready_after {
        Some(t) if t <= READY_AGAIN_WITHIN => report.notes.push(format!(
            "{what}: /readyz 200 again {:.1} s after the network healed",
            t.as_secs_f64()
        )),
        Some(t) => report.failures.push(format!(
            "{what}: /readyz 200 again only {:.1} s after the network healed (bound {READY_AGAIN_WITHIN:?})",
            t.as_secs_f64()
        )),
        None => report
            .failures
            .push(format!("{what}: /readyz never 200 again after the network healed")),
    }
}
