//! Pauses the shop's exchange and then the billing consumer mid-stream, as an
//! operator does through the admin API; checks that the running relay and
//! consumer processes obey (nothing of the exchange is published, nothing is
//! invoiced while paused) and that after the resumes every order is invoiced once.

use std::time::{Duration, Instant};

use outbox_adapters_postgres::PgPauses;
use outbox_ports::{PauseKind, PauseStore as _};

use super::support::{report, wait_committed};
use crate::world::{Coordination, SweepOpts, World};
use crate::{Ctx, Report, conclude};

/// How long each pause is held.
const HELD: Duration = Duration::from_secs(3);
/// What a pause is given to take hold: the batch in flight marked (a relay), the
/// pause check and the deliveries in hand (a consumer, twice this).
const GRACE: Duration = Duration::from_millis(1500);

/// Scenario: while orders stream in, the exchange is paused for 3 s (sent must not
/// move once the batches in flight are marked, committed keeps growing); the
/// billing consumer is paused, then the exchange resumed, and for 3 s invoiced must
/// not move while the published backlog waits in the queue; the consumer resumed,
/// nothing lost, nothing twice, nothing dead.
pub(crate) async fn pause_resume(ctx: &Ctx) -> anyhow::Result<Report> {
    let w = World::new("pause", &ctx.urls, &ctx.bins).await?;
    let cfg = w.relay_config("r1", Coordination::Postgres, None, SweepOpts::default());
    let relay = w.relay("r1", &cfg)?;
    let consumer = w.consumer("c1", &[])?;
    let pauses = PgPauses::new(w.pool.clone(), &w.shop.outbox_schema);
    let n = ctx.orders();
    let producer = w.produce(1, n, Ctx::RATE);
    let mut r = report("pause_resume");
    wait_committed(&w, n as u64 / 5).await?;

    pauses
        .pause(PauseKind::Exchange, &w.shop.exchange, "chaos")
        .await?;
    // A claim taken just before the pause is still published and marked.
    tokio::time::sleep(GRACE).await;
    let (sent, committed) = (w.sent().await, w.committed().await);
    tokio::time::sleep(HELD).await;
    let (sent_after, committed_after) = (w.sent().await, w.committed().await);
    if sent_after != sent {
        r.failures.push(format!(
            "{} messages of the paused exchange were published while it was paused",
            sent_after - sent
        ));
    }
    if committed_after <= committed {
        r.failures
            .push("no order was committed during the exchange's pause: nothing was held".into());
    }
    r.notes.push(format!(
        "exchange paused {HELD:?}: sent stayed at {sent} while committed went {committed} to {committed_after}"
    ));

    // The consumer paused before the exchange is resumed, so that the backlog the
    // relay then publishes waits in the queue: a consumer that ignored its pause
    // would invoice it.
    let consumer_name = outbox_examples::billing::CONSUMER;
    pauses
        .pause(PauseKind::Consumer, consumer_name, "chaos")
        .await?;
    // Its pause check (1 s) and the deliveries it holds (the prefetch).
    tokio::time::sleep(GRACE * 2).await;
    let invoiced = w.invoiced().await;
    pauses.resume(PauseKind::Exchange, &w.shop.exchange).await?;
    let resumed = Instant::now();
    w.wait_until(
        "a publish after the resume",
        Duration::from_secs(10),
        async |w| w.sent().await > sent_after,
    )
    .await?;
    r.notes.push(format!(
        "published again {:.1} s after the resume",
        resumed.elapsed().as_secs_f64()
    ));
    tokio::time::sleep(HELD).await;
    let invoiced_after = w.invoiced().await;
    let waiting = w.queue_depth(&w.shop.queue).await.unwrap_or(0);
    if invoiced_after != invoiced {
        r.failures.push(format!(
            "{} orders were invoiced while the consumer was paused",
            invoiced_after - invoiced
        ));
    }
    if waiting == 0 {
        r.failures.push(
            "nothing waited in the queue during the consumer's pause: the check proved nothing"
                .into(),
        );
    }
    r.notes.push(format!(
        "consumer paused: invoiced {invoiced} before and {invoiced_after} after {HELD:?}, {waiting} deliveries waiting in the queue"
    ));
    pauses.resume(PauseKind::Consumer, consumer_name).await?;
    let fault_end = Instant::now();
    let produced = producer.finish().await;
    let r = conclude(ctx, &w, r, produced, fault_end, vec![relay, consumer]).await;
    w.cleanup(r.as_ref().map_or(true, |r| !r.passed())).await;
    r
}
