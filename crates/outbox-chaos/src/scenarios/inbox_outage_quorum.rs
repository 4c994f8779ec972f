//! Cuts the consumer off PostgreSQL (its inbox) for 30 s through a TCP proxy, on a
//! quorum queue with a delivery limit of 3; checks that the consumer holds its
//! deliveries (it reports the inbox unreachable), none reaches the dead-letter
//! queue, and nothing is lost or twice.

use std::time::{Duration, Instant};

use anyhow::Context as _;

use super::support::report;
use crate::world::{Coordination, SweepOpts, World};
use crate::{Ctx, Report, conclude};
use outbox_adapters_rabbitmq::QueueType;
use outbox_examples::BillingQueue;
use outbox_testkit::proxy::TcpProxy;

/// Scenario: the billing consumer on a quorum queue with a delivery limit of 3
/// (`BILLING_QUEUE_TYPE=quorum`, `BILLING_DELIVERY_LIMIT=3`) loses PostgreSQL for
/// 30 s: it reaches the database through a TCP proxy the suite cuts (its
/// connections closed, new ones refused) while the server stays up for the relay
/// and the counting. A consumer that returned its deliveries while the inbox is
/// unreachable would spend their limit in seconds and the broker would give up on
/// them; held, none reaches it.
pub(crate) async fn inbox_outage_quorum(ctx: &Ctx) -> anyhow::Result<Report> {
    const LIMIT: u32 = 3;
    const OUTAGE: Duration = Duration::from_secs(30);
    let queue = BillingQueue {
        queue_type: QueueType::Quorum,
        delivery_limit: Some(LIMIT),
    };
    let w = World::with_queue("inboxq", &ctx.urls, &ctx.bins, queue).await?;
    let target = outbox_testkit::proxy::host_port(&w.urls.pg)
        .context("no host:port in the PostgreSQL URL")?
        .to_owned();
    let proxy = TcpProxy::start(&target).await?;
    let cfg = w.relay_config("r1", Coordination::Postgres, None, SweepOpts::default());
    let relay = w.relay("r1", &cfg)?;
    let consumer_pg = proxy.url_for(&w.proc_pg_url());
    let consumer = w.consumer("c1", &[("SHOP_DATABASE_URL", consumer_pg.as_str())])?;
    let n = ctx.orders();
    let producer = w.produce(1, n, Ctx::RATE);
    // Once the consumer is consuming: the cut then meets deliveries in hand.
    w.wait_until("first invoices", Duration::from_secs(60), async |w| {
        w.tally().await.is_ok_and(|t| t.consumed > 0)
    })
    .await?;
    let before = w.tally().await?;
    proxy.cut();
    tokio::time::sleep(OUTAGE).await;
    proxy.restore();
    let fault_end = Instant::now();
    let mut r = report("inbox_outage_quorum");
    r.notes.push(format!(
        "PostgreSQL unreachable for the consumer for {}s from {} committed and {} consumed; queue limit {LIMIT}; {} in the queue when it came back",
        OUTAGE.as_secs(),
        before.committed,
        before.consumed,
        w.queue_depth(&w.shop.queue).await.unwrap_or(0)
    ));
    let produced = producer.finish().await;
    let r = conclude(ctx, &w, r, produced, fault_end, vec![relay, consumer]).await;
    let r = match r {
        Ok(mut r) => {
            let log = std::fs::read_to_string(w.dir.join("c1.log")).unwrap_or_default();
            if !log.contains("holding the deliveries in hand") {
                r.failures
                    .push("the consumer never reported the inbox unreachable".into());
            }
            let dlq = w.shop.dead_letter_queue().unwrap_or_default();
            match w.queue_depth(&dlq).await {
                Ok(0) => {}
                Ok(left) => r.failures.push(format!(
                    "{left} deliveries left in the dead-letter queue {dlq}"
                )),
                Err(e) => r.failures.push(format!("cannot read {dlq}: {e}")),
            }
            Ok(r)
        }
        Err(e) => Err(e),
    };
    w.cleanup(r.as_ref().map_or(true, |r| !r.passed())).await;
    r
}
