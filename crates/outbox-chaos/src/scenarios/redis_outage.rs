//! Stops Redis (the sweep's lock and state) while the sweep retries refused
//! publishes; checks that no sweep runs and no failed message is retried without
//! it, and that the sweep finishes the work once Redis is back.

use std::time::{Duration, Instant};

use super::support::{produce_failing, publish_failed, report, require_local};
use crate::world::{Coordination, SweepOpts, World, free_port, metric};
use crate::{Ctx, Report, conclude};
use outbox_testkit::services;

/// Scenario 4: Redis (lock and sweep state) stops while the sweep retries failed publishes;
/// without it no sweep may run; after it is back the sweep finishes the work.
pub(crate) async fn redis_outage(ctx: &Ctx) -> anyhow::Result<Report> {
    require_local(&ctx.urls.redis, services::REDIS_ADDR, "Redis")?;
    let w = World::new("redis", &ctx.urls, &ctx.bins).await?;
    let port = free_port()?;
    let sweep = SweepOpts {
        batch_size: 20,
        max_batches: 5,
        lock_ttl: "3s",
    };
    let cfg = w.relay_config("r1", Coordination::Redis, Some(port), sweep);
    let relay = w.relay("r1", &cfg)?;
    let consumer = w.consumer("c1", &[])?;
    let produced = produce_failing(&w, if ctx.quick { 1_000 } else { 2_500 }).await?;
    let before = publish_failed(&w).await;
    w.wait_until(
        "the sweep to retry a batch",
        Duration::from_secs(30),
        async |w| publish_failed(w).await + 20 <= before,
    )
    .await?;
    let stopped = services::stop_redis();
    // The holder's lease runs out (3 s) and its batch in hand ends; from then on
    // nothing may be swept.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (held_rows, held_sweeps) = (
        publish_failed(&w).await,
        metric(port, "outbox_sweeps_total").await,
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (later_rows, later_sweeps) = (
        publish_failed(&w).await,
        metric(port, "outbox_sweeps_total").await,
    );
    let mut r = report("redis_outage");
    if later_rows != held_rows {
        r.failures.push(format!(
            "{} failed messages were retried while Redis (the lock) was down",
            held_rows.saturating_sub(later_rows)
        ));
    }
    if held_sweeps.is_none() || later_sweeps != held_sweeps {
        r.failures.push(format!(
            "outbox_sweeps_total moved while Redis was down: {held_sweeps:?} -> {later_sweeps:?}"
        ));
    }
    r.notes.push(format!(
        "without Redis for 5 s: publish_failed stayed at {later_rows}, sweeps at {}",
        later_sweeps.unwrap_or(-1.0)
    ));
    anyhow::ensure!(stopped.restore(), "Redis did not come back");
    let fault_end = Instant::now();
    let r = conclude(ctx, &w, r, produced, fault_end, vec![relay, consumer]).await;
    w.cleanup(r.as_ref().map_or(true, |r| !r.passed())).await;
    r
}
