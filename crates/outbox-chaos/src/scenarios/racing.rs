//! Races two relays and two consumers (5 % of first attempts failing) on one set
//! of tables; checks that nothing is lost and nothing takes effect twice.

use std::time::Instant;

use super::support::report;
use crate::world::{Coordination, SweepOpts, World};
use crate::{Ctx, Report, conclude};

/// Scenario 6: Two relays and two consumers (5 % of first attempts failing) on one set of
/// tables.
pub(crate) async fn racing(ctx: &Ctx) -> anyhow::Result<Report> {
    let w = World::new("race", &ctx.urls, &ctx.bins).await?;
    let mut children = Vec::new();
    for name in ["r1", "r2"] {
        let cfg = w.relay_config(name, Coordination::Postgres, None, SweepOpts::default());
        children.push(w.relay(name, &cfg)?);
    }
    for name in ["c1", "c2"] {
        children.push(w.consumer(name, &[("BILLING_FAIL_FIRST_PERCENT", "5")])?);
    }
    let produced = w.produce(1, ctx.orders() * 2, Ctx::RATE * 4).finish().await;
    let fault_end = Instant::now();
    let r = conclude(ctx, &w, report("racing"), produced, fault_end, children).await;
    w.cleanup(r.as_ref().map_or(true, |r| !r.passed())).await;
    r
}
