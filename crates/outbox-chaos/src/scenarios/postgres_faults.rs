//! Terminates every PostgreSQL connection of the relay and the consumer, then
//! restarts PostgreSQL; checks that connections were found to terminate and that
//! nothing is lost and nothing takes effect twice.

use std::time::Instant;

use super::support::{relay_and_consumer, report, require_local, wait_committed};
use crate::world::World;
use crate::{Ctx, Report, conclude};
use outbox_testkit::services;

/// Scenario 3: Every connection of the relay and the consumer is terminated
/// (`pg_terminate_backend`), later PostgreSQL restarts.
pub(crate) async fn postgres_faults(ctx: &Ctx) -> anyhow::Result<Report> {
    require_local(&ctx.urls.pg, services::PG_ADDR, "PostgreSQL")?;
    let w = World::new("pg", &ctx.urls, &ctx.bins).await?;
    let (relay, consumer) = relay_and_consumer(&w)?;
    let n = ctx.orders();
    let producer = w.produce(1, n, Ctx::RATE);
    wait_committed(&w, n as u64 / 4).await?;
    // Exactly the relay's and the consumer's (their application_name), not those of
    // anyone else using the same database.
    let terminated: i64 = sqlx::query_scalar(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
         WHERE application_name = $1",
    )
    .bind(&w.proc_app)
    .fetch_one(&w.pool)
    .await?;
    let mut r = report("postgres_faults");
    if terminated == 0 {
        r.failures
            .push("no connection of the relay or the consumer was found to terminate".into());
    }
    r.notes.push(format!("{terminated} connections terminated"));
    wait_committed(&w, n as u64 / 2).await?;
    anyhow::ensure!(
        services::restart_postgres(),
        "PostgreSQL did not come back after its restart"
    );
    let fault_end = Instant::now();
    let produced = producer.finish().await;
    let r = conclude(ctx, &w, r, produced, fault_end, vec![relay, consumer]).await;
    w.cleanup(r.as_ref().map_or(true, |r| !r.passed())).await;
    r
}
