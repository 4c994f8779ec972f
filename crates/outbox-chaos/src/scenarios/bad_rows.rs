//! Writes malformed rows by plain SQL into an outbox table stripped of its AMQP
//! constraints; checks that each is dead at once naming its column, every order
//! flows, and the relay stays ready and publishing.

use std::time::Instant;

use anyhow::Context as _;

use super::support::{readyz, report, wait_committed};
use crate::world::{Coordination, SweepOpts, World, free_port, metric};
use crate::{Ctx, Report, conclude};
use outbox_core::OutboxStatus;
use outbox_ports::OutboxOperator;

/// A row written through the documented SQL contract before the table's AMQP
/// constraints existed.
struct BadRow {
    label: &'static str,
    /// SQL expressions for the columns (`$1` is the shop's exchange).
    exchange: &'static str,
    routing_key: &'static str,
    message_type: &'static str,
    headers: &'static str,
    created_at: &'static str,
    /// What its dead reason must name.
    column: &'static str,
}

const fn bad_row(
    label: &'static str,
    [exchange, routing_key, message_type, headers, created_at]: [&'static str; 5],
    column: &'static str,
) -> BadRow {
    BadRow {
        label,
        exchange,
        routing_key,
        message_type,
        headers,
        created_at,
        column,
    }
}

const KEY: &str = "'order.created'";

const BAD_ROWS: &[BadRow] = &[
    bad_row(
        "nested header value",
        ["$1", KEY, "NULL", r#"'{"a": {"b": 1}}'"#, "now()"],
        "headers",
    ),
    bad_row(
        "headers an array",
        ["$1", KEY, "NULL", "'[1, 2]'", "now()"],
        "headers",
    ),
    bad_row(
        "routing key of 300 bytes",
        ["$1", "repeat('k', 300)", "NULL", "'{}'", "now()"],
        "routing_key",
    ),
    bad_row(
        "exchange of 300 bytes",
        ["repeat('e', 300)", KEY, "NULL", "'{}'", "now()"],
        "exchange",
    ),
    bad_row(
        "message type of 300 bytes",
        ["$1", KEY, "repeat('t', 300)", "'{}'", "now()"],
        "message_type",
    ),
    bad_row(
        "header name of 300 bytes",
        [
            "$1",
            KEY,
            "NULL",
            "jsonb_build_object(repeat('h', 300), 'v')",
            "now()",
        ],
        "headers",
    ),
    bad_row(
        "headers of 70 KB (more than an AMQP frame takes)",
        [
            "$1",
            KEY,
            "NULL",
            "jsonb_build_object('big', repeat('v', 70000))",
            "now()",
        ],
        "headers",
    ),
    bad_row(
        "created_at of infinity",
        ["$1", KEY, "NULL", "'{}'", "'infinity'"],
        "created_at",
    ),
];

/// Scenario 8: Bad rows among good orders, written by plain SQL into a table without
/// the AMQP constraints (as rows written before the constraints existed): each is
/// dead at once with a reason naming its column, every order flows, and the relay
/// stays ready and publishing.
pub(crate) async fn bad_rows(ctx: &Ctx) -> anyhow::Result<Report> {
    let w = World::new("badrows", &ctx.urls, &ctx.bins).await?;
    let o = w.shop.outbox_schema.quoted();
    let constraints: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT conname::text FROM pg_constraint WHERE conrelid = '{o}.outbox_messages'::regclass \
         AND conname LIKE 'outbox\\_messages\\_%\\_amqp'"
    )))
    .fetch_all(&w.pool)
    .await?;
    for c in &constraints {
        // SAFETY-SQL: a constraint of our migrations, read back from pg_constraint
        // (`outbox_messages_..._amqp`), quoted with any `"` removed.
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "ALTER TABLE {o}.outbox_messages DROP CONSTRAINT \"{}\"",
            c.replace('"', "")
        )))
        .execute(&w.pool)
        .await?;
    }
    let port = free_port()?;
    let cfg = w.relay_config(
        "r1",
        Coordination::Postgres,
        Some(port),
        SweepOpts::default(),
    );
    let relay = w.relay("r1", &cfg)?;
    let consumer = w.consumer("c1", &[])?;
    let producer = w.produce(1, ctx.orders(), Ctx::RATE);
    wait_committed(&w, 100).await?;
    let mut ids = Vec::new();
    for row in BAD_ROWS {
        // SAFETY-SQL: the values are SQL literals of the constant BAD_ROWS above.
        let id: uuid::Uuid = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {o}.outbox_messages (exchange, routing_key, message_type, headers, created_at, payload) \
             VALUES ({}, {}, {}, {}::jsonb, {}, convert_to('{{\"bad_row\": true}}', 'UTF8')) \
             RETURNING id",
            row.exchange, row.routing_key, row.message_type, row.headers, row.created_at
        )))
        .bind(&w.shop.exchange)
        .fetch_one(&w.pool)
        .await
        .with_context(|| format!("insert the bad row {:?}", row.label))?;
        ids.push(id);
    }
    let produced = producer.finish().await;
    let fault_end = Instant::now();
    let mut r = report("bad_rows");
    r.enqueued = BAD_ROWS.len() as u64;
    r.committed = BAD_ROWS.len() as u64;
    r.expected_dead = BAD_ROWS.len() as u64;
    // While the relay still runs: every order through, every bad row dead; then it
    // must still say it is ready and count what it published.
    let bad = BAD_ROWS.len() as u64;
    let through = w
        .wait_until(
            "every order consumed and the bad rows dead",
            ctx.settle_timeout(),
            async |w| {
                w.tally()
                    .await
                    .is_ok_and(|t| t.unaccounted == 0 && t.dead_outbox >= bad)
            },
        )
        .await;
    let orders = w.committed().await;
    let ready = readyz(port).await;
    let published = metric(port, "outbox_published_total").await.unwrap_or(0.0) as u64;
    let mut r = conclude(ctx, &w, r, produced, fault_end, vec![relay, consumer]).await?;
    if let Err(e) = through {
        r.failures.push(format!("{e:#}"));
    }
    // The migration's constraints existed (so the rows are as old rows would be).
    for column in [
        "exchange",
        "routing_key",
        "message_type",
        "headers",
        "created_at",
    ] {
        let name = format!("outbox_messages_{column}_amqp");
        if !constraints.contains(&name) {
            r.failures.push(format!(
                "the migration's constraint {name} was not there to drop: {constraints:?}"
            ));
        }
    }
    let mut dead_as_expected = 0;
    for (BadRow { label, column, .. }, id) in BAD_ROWS.iter().zip(&ids) {
        let rec = w
            .outbox
            .get_message(outbox_core::MessageId::from_uuid(*id))
            .await?;
        match rec
            .as_ref()
            .map(|r| (r.status, r.publish.last_error.as_deref()))
        {
            Some((OutboxStatus::Dead, Some(e))) if e.contains(column) => {
                dead_as_expected += 1;
                r.notes.push(format!("{label}: dead, {e}"));
            }
            other => r.failures.push(format!(
                "{label}: expected dead naming {column}, found {other:?}"
            )),
        }
    }
    // A bad row not dead is unaccounted for: the rows are not orders, so the tally
    // cannot see them.
    r.lost += BAD_ROWS.len() as u64 - dead_as_expected;
    if ready != Some(200) {
        r.failures.push(format!(
            "/readyz answered {ready:?} after the bad rows, not 200"
        ));
    }
    if published < orders {
        r.failures.push(format!(
            "outbox_published_total {published} < the {orders} committed orders"
        ));
    }
    let passed = r.passed();
    w.cleanup(!passed).await;
    Ok(r)
}
