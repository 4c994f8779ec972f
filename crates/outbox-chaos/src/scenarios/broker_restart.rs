//! Stops RabbitMQ (`rabbitmqctl stop_app`) for three seconds while orders stream
//! in; checks that nothing is lost and nothing takes effect twice.

use std::time::{Duration, Instant};

use super::support::{relay_and_consumer, report, require_local, wait_committed};
use crate::world::World;
use crate::{Ctx, Report, conclude};
use outbox_testkit::services;

/// Scenario 1: `rabbitmqctl stop_app` mid-stream for three seconds, then `start_app`.
pub(crate) async fn broker_restart(ctx: &Ctx) -> anyhow::Result<Report> {
    require_local(&ctx.urls.amqp, services::AMQP_ADDR, "RabbitMQ")?;
    let w = World::new("broker", &ctx.urls, &ctx.bins).await?;
    let (relay, consumer) = relay_and_consumer(&w)?;
    let n = ctx.orders();
    let producer = w.produce(1, n, Ctx::RATE);
    wait_committed(&w, n as u64 / 3).await?;
    let stopped = services::stop_rabbitmq();
    tokio::time::sleep(Duration::from_secs(3)).await;
    anyhow::ensure!(stopped.restore(), "RabbitMQ did not come back");
    let fault_end = Instant::now();
    let produced = producer.finish().await;
    let r = conclude(
        ctx,
        &w,
        report("broker_restart"),
        produced,
        fault_end,
        vec![relay, consumer],
    )
    .await;
    w.cleanup(r.as_ref().map_or(true, |r| !r.passed())).await;
    r
}
