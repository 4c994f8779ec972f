//! Kills the relay with SIGKILL mid-stream and starts a successor; checks that
//! nothing is lost and nothing takes effect twice.

use std::time::{Duration, Instant};

use super::support::{relay_and_consumer, report};
use crate::world::{Coordination, SweepOpts, World};
use crate::{Ctx, Report, conclude};

/// Scenario 2: The relay is killed with SIGKILL mid-stream; a new one takes over.
pub(crate) async fn relay_kill(ctx: &Ctx) -> anyhow::Result<Report> {
    let w = World::new("kill", &ctx.urls, &ctx.bins).await?;
    let (mut victim, consumer) = relay_and_consumer(&w)?;
    let n = ctx.orders();
    let producer = w.produce(1, n, Ctx::RATE);
    w.wait_until("a third sent", Duration::from_secs(60), async |w| {
        w.sent().await >= n as u64 / 3
    })
    .await?;
    victim.start_kill()?;
    let _ = victim.wait().await;
    let mut r = report("relay_kill");
    r.notes.push(format!(
        "relay killed with {} messages sent",
        w.sent().await
    ));
    let cfg = w.relay_config("r2", Coordination::Postgres, None, SweepOpts::default());
    let successor = w.relay("r2", &cfg)?;
    let fault_end = Instant::now();
    let produced = producer.finish().await;
    let r = conclude(ctx, &w, r, produced, fault_end, vec![successor, consumer]).await;
    w.cleanup(r.as_ref().map_or(true, |r| !r.passed())).await;
    r
}
