//! Kills one of two racing relays and restarts RabbitMQ while keyed orders stream
//! to a consumer keeping order by key; checks that, beside nothing lost and nothing
//! twice, every customer's invoices are written in the order of their orders.

use std::time::{Duration, Instant};

use super::support::{report, require_local, wait_committed};
use crate::world::{Coordination, SweepOpts, World};
use crate::{Ctx, Report, conclude};
use outbox_testkit::services;

/// Consecutive effects of one ordering key (`c<order id % keys>`) in the wrong
/// order: invoices of a key by the order they were written (`billed_seq`), each
/// compared with the one before it.
async fn effects_out_of_order(w: &World, keys: i64) -> anyhow::Result<u64> {
    let s = w.shop.schema.quoted();
    let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM (SELECT order_id, lag(order_id) OVER \
           (PARTITION BY order_id % $1 ORDER BY billed_seq) AS before FROM {s}.invoices) x \
         WHERE before >= order_id"
    )))
    .bind(keys)
    .fetch_one(&w.pool)
    .await?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// Scenario: per-key order through the faults. Orders of 40 customers (the
/// ordering key), two relays racing, one consumer keeping order by key; one relay
/// is killed with SIGKILL and the broker restarts mid-stream. Beside nothing lost
/// and nothing twice, every customer's invoices must be written in the order of
/// their orders.
pub(crate) async fn ordered(ctx: &Ctx) -> anyhow::Result<Report> {
    const KEYS: i64 = 40;
    require_local(&ctx.urls.amqp, services::AMQP_ADDR, "RabbitMQ")?;
    let w = World::new("ordered", &ctx.urls, &ctx.bins).await?;
    let cfg1 = w.relay_config("r1", Coordination::Postgres, None, SweepOpts::default());
    let cfg2 = w.relay_config("r2", Coordination::Postgres, None, SweepOpts::default());
    let mut victim = w.relay("r1", &cfg1)?;
    let other = w.relay("r2", &cfg2)?;
    let consumer = w.consumer("c1", &[("BILLING_ORDERED_BY_KEY", "true")])?;
    let n = ctx.orders();
    let producer = w.produce_keyed(1, n, Ctx::RATE, 4, Some(KEYS));
    w.wait_until("a quarter sent", Duration::from_secs(60), async |w| {
        w.sent().await >= n as u64 / 4
    })
    .await?;
    victim.start_kill()?;
    let _ = victim.wait().await;
    let cfg3 = w.relay_config("r3", Coordination::Postgres, None, SweepOpts::default());
    let successor = w.relay("r3", &cfg3)?;
    wait_committed(&w, n as u64 / 2).await?;
    let stopped = services::stop_rabbitmq();
    tokio::time::sleep(Duration::from_secs(3)).await;
    anyhow::ensure!(stopped.restore(), "RabbitMQ did not come back");
    let fault_end = Instant::now();
    let produced = producer.finish().await;
    let r = conclude(
        ctx,
        &w,
        report("ordered"),
        produced,
        fault_end,
        vec![other, successor, consumer],
    )
    .await;
    let r = match r {
        Ok(mut r) => {
            let wrong = effects_out_of_order(&w, KEYS).await?;
            if wrong > 0 {
                r.failures.push(format!(
                    "{wrong} invoices were written before an earlier order of their customer"
                ));
            } else {
                r.notes.push(format!(
                    "every one of the {KEYS} customers' invoices in the order of their orders"
                ));
            }
            Ok(r)
        }
        Err(e) => Err(e),
    };
    w.cleanup(r.as_ref().map_or(true, |r| !r.passed())).await;
    r
}
