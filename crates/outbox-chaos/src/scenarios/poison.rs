//! Sends poison orders (the handler always fails) and foreign deliveries (no
//! message id, an undecodable payload, an oversized body); checks that each ends
//! dead with its reason and every other order is billed.

use std::time::Instant;

use lapin::BasicProperties;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};

use super::support::report;
use crate::world::{Coordination, SweepOpts, World};
use crate::{Ctx, Report, conclude};
use outbox_core::InboxStatus;
use outbox_examples::billing::CONSUMER;
use outbox_ports::InboxOperator;

/// Scenario 7: Poison orders (the handler always fails) and a foreign publisher's
/// deliveries: no message id, an undecodable payload, an oversized body.
pub(crate) async fn poison(ctx: &Ctx) -> anyhow::Result<Report> {
    let w = World::new("poison", &ctx.urls, &ctx.bins).await?;
    let poison = [7i64, 77, 177, 377, 777];
    let list = poison.map(|p| p.to_string()).join(",");
    let cfg = w.relay_config("r1", Coordination::Postgres, None, SweepOpts::default());
    let relay = w.relay("r1", &cfg)?;
    let consumer = w.consumer("c1", &[("BILLING_POISON_ORDERS", list.as_str())])?;
    let producer = w.produce(1, 1_000, Ctx::RATE);

    let ch = w.channel().await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    let undecodable = uuid::Uuid::now_v7().to_string();
    let oversized = uuid::Uuid::now_v7().to_string();
    let typed = || BasicProperties::default().with_type("order.created".into());
    let foreign: [(BasicProperties, Vec<u8>); 3] = [
        (
            typed(),
            b"{\"order_id\": 1, \"note\": \"no message id\"}".to_vec(),
        ),
        (
            typed().with_message_id(undecodable.as_str().into()),
            b"\xff\xfe not json at all".to_vec(),
        ),
        (
            typed().with_message_id(oversized.as_str().into()),
            vec![b' '; 2 * 1024 * 1024],
        ),
    ];
    let (no_id_len, oversized_len) = (foreign[0].1.len(), foreign[2].1.len());
    for (props, body) in foreign {
        let confirm = ch
            .basic_publish(
                "".into(),
                w.shop.queue.as_str().into(),
                BasicPublishOptions::default(),
                &body,
                props.with_delivery_mode(2),
            )
            .await?
            .await?;
        anyhow::ensure!(confirm.is_ack(), "the broker refused a foreign message");
    }
    let produced = producer.finish().await;
    let fault_end = Instant::now();
    // Foreign deliveries are counted by hand: they are not orders.
    let mut r = report("poison");
    r.enqueued = 3;
    r.committed = 3;
    // Orders whose id ends in 0 are rolled back by the producer (see World::produce).
    let poison_committed = poison.iter().filter(|p| *p % 10 != 0).count() as u64;
    r.expected_dead = poison_committed + 3;
    let mut r = conclude(ctx, &w, r, produced, fault_end, vec![relay, consumer]).await?;
    let o = w.shop.outbox_schema.quoted();
    let letters: Vec<(Option<String>, String, i32)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT message_id, reason, octet_length(body) FROM {o}.outbox_dead_letters ORDER BY seq"
    )))
    .fetch_all(&w.pool)
    .await?;
    let mut foreign_found = 0;
    let body_is = |len: &i32, want: usize| usize::try_from(*len).is_ok_and(|l| l == want);
    if letters.iter().any(|(id, reason, len)| {
        id.is_none() && reason.contains("no message id") && body_is(len, no_id_len)
    }) {
        foreign_found += 1;
    } else {
        r.failures.push(format!(
            "no dead letter for the delivery without an id: {letters:?}"
        ));
    }
    if letters.iter().any(|(id, reason, len)| {
        id.as_deref() == Some(oversized.as_str())
            && reason.contains("limit")
            && body_is(len, oversized_len)
    }) {
        foreign_found += 1;
    } else {
        r.failures.push(format!(
            "no dead letter for the oversized delivery: {letters:?}"
        ));
    }
    let undecodable_row = w
        .inbox
        .get_delivery(CONSUMER, undecodable.parse()?)
        .await?
        .map(|rec| (rec.status, rec.consume.last_error));
    match &undecodable_row {
        Some((InboxStatus::Dead, Some(err))) => {
            foreign_found += 1;
            r.notes.push(format!("undecodable payload dead: {err}"));
        }
        other => r.failures.push(format!(
            "the undecodable delivery is not dead with a reason: {other:?}"
        )),
    }
    r.lost += 3 - foreign_found;
    let poisoned = w
        .inbox
        .oldest_deliveries(CONSUMER, InboxStatus::Dead, 1_000)
        .await?
        .iter()
        .filter(|rec| {
            rec.consume
                .last_error
                .as_deref()
                .is_some_and(|e| e.contains("cannot be billed"))
        })
        .count() as u64;
    if poisoned != poison_committed {
        r.failures.push(format!(
            "{poisoned} poison orders dead with their reason, expected {poison_committed}"
        ));
    }
    r.notes.push(format!(
        "{poisoned} poison orders and 3 foreign deliveries dead with their reasons; the rest billed"
    ));
    let passed = r.passed();
    w.cleanup(!passed).await;
    Ok(r)
}
