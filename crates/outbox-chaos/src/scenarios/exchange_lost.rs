//! Deletes the shop's exchange mid-stream; checks that the relay declares its
//! topology again on reconnecting and nothing goes dead or is lost.

use std::time::Instant;

use anyhow::Context as _;

use super::support::{report, wait_committed};
use crate::world::{Coordination, SweepOpts, World};
use crate::{Ctx, Report, conclude};

/// Scenario: the shop's exchange is deleted mid-stream (as a broker restart does to
/// a non-durable one, or an operator by mistake). The relay declares its configured
/// topology on every connection it opens: the window that found the exchange gone
/// spends one attempt on its messages, the relay reconnects, the exchange and its
/// bindings are back, and nothing goes dead or is lost.
pub(crate) async fn exchange_lost(ctx: &Ctx) -> anyhow::Result<Report> {
    let w = World::new("xlost", &ctx.urls, &ctx.bins).await?;
    let cfg = w.relay_config("r1", Coordination::Postgres, None, SweepOpts::default());
    // The shop's exchange and the bindings of the billing queue and the tap, as the
    // shop's setup and the suite declare them.
    let topology = format!(
        r##"
[[topology.exchanges]]
name = "{x}"
kind = "topic"

[[topology.bindings]]
queue = "{q}"
exchange = "{x}"
routing_key = "order.*"

[[topology.bindings]]
queue = "{tap}"
exchange = "{x}"
routing_key = "#"
"##,
        x = w.shop.exchange,
        q = w.shop.queue,
        tap = w.tap,
    );
    let mut text = std::fs::read_to_string(&cfg)?;
    text.push_str(&topology);
    std::fs::write(&cfg, text)?;
    let relay = w.relay("r1", &cfg)?;
    let consumer = w.consumer("c1", &[])?;
    let n = ctx.orders();
    let producer = w.produce(1, n, Ctx::RATE);
    wait_committed(&w, n as u64 / 3).await?;
    let sent_before = w.sent().await;
    let ch = w.channel().await?;
    ch.exchange_delete(
        w.shop.exchange.as_str().into(),
        lapin::options::ExchangeDeleteOptions::default(),
    )
    .await
    .context("delete the shop's exchange")?;
    let fault_end = Instant::now();
    let mut r = report("exchange_lost");
    r.notes
        .push(format!("exchange deleted with {sent_before} messages sent"));
    let produced = producer.finish().await;
    let r = conclude(ctx, &w, r, produced, fault_end, vec![relay, consumer]).await;
    w.cleanup(r.as_ref().map_or(true, |r| !r.passed())).await;
    r
}
