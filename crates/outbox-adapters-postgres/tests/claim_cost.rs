//! A claim's estimated cost stays far under `jit_above_cost`. Over it, PostgreSQL
//! JIT-compiles the statement every time it runs: a claim that reads a thousand
//! rows then spends most of its time compiling. That happened once to a form of
//! the key walk the planner priced as a sort over a third of the table (an unkeyed
//! drain became seven times slower while its plan read the same rows), and no
//! rows-visited test could see it.

mod common;

use std::time::Duration;

use outbox_adapters_postgres::{PgOutboxStore, PgPauses, PgPool, PgSchema};
use outbox_ports::Lease;
use outbox_ports::PauseKind;
use outbox_ports::prelude::*;

/// PostgreSQL's default `jit_above_cost`: the threshold on a server as installed
/// (a server's own setting may differ, or JIT be off; the hazard is the default).
const JIT_ABOVE_COST: f64 = 100_000.0;

/// The total cost estimate on the first line of an `EXPLAIN` text.
fn total_cost(plan: &str) -> f64 {
    let first = plan.lines().next().unwrap_or_default();
    first
        .split("cost=")
        .nth(1)
        .and_then(|c| c.split("..").nth(1))
        .and_then(|c| c.split(' ').next())
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no cost on {first:?}"))
}

/// 20,000 pending rows of 1 KiB, keyed by `key` (SQL over `i`), as the bench's
/// backlog; then three batches drained through the relay's own claim and mark,
/// and the table analyzed.
async fn backlog(pool: &PgPool, schema: &PgSchema, key: &str) {
    let t = format!("{}.outbox_messages", schema.quoted());
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {t} (exchange, routing_key, payload, ordering_key) \
         SELECT 'bench', 'k', convert_to(repeat('x', 1024), 'UTF8'), {key} \
         FROM generate_series(0, 19999) i"
    )))
    .execute(pool)
    .await
    .expect("fill");
    let store = PgOutboxStore::new(pool.clone(), schema.clone());
    for _ in 0..3 {
        let lease = Lease::new("drain", Duration::from_secs(60));
        let claimed = store.claim_pending(&lease, 1000).await.expect("claim");
        let ids: Vec<_> = claimed.iter().map(|c| c.message.id).collect();
        store.mark_sent(&lease, &ids).await.expect("mark");
    }
    sqlx::query(sqlx::AssertSqlSafe(format!("ANALYZE {t}")))
        .execute(pool)
        .await
        .expect("analyze");
}

#[tokio::test]
async fn a_claim_is_estimated_far_under_the_jit_threshold() {
    for (backlog_of, key) in [
        ("no keys", "NULL"),
        ("1,000 keys", "'customer-' || (i % 1000)"),
        (
            "half of them keyed",
            "CASE WHEN i % 2 = 0 THEN 'customer-' || (i % 1000) END",
        ),
    ] {
        with_db!(|pool, schema| {
            backlog(&pool, &schema, key).await;
            // Each form of the claim: as usual, and while another exchange is
            // paused (the claim then reads the backlog's exchange by itself).
            for form in ["no pause", "another exchange paused"] {
                if form != "no pause" {
                    PgPauses::new(pool.clone(), &schema)
                        .pause(PauseKind::Exchange, "held", "test")
                        .await
                        .expect("pause");
                }
                for (planner, p) in common::planners(&pool).await {
                    let store = PgOutboxStore::new(p, schema.clone());
                    let plan = store.explain_claim_pending(1000).await.expect("explain");
                    let cost = total_cost(&plan);
                    eprintln!("{backlog_of}, {form}, {planner}: estimated {cost}");
                    // The claims as they are estimate 3,700 to 15,600 here; a quarter
                    // of the threshold leaves room for other statistics, not for a
                    // sort.
                    assert!(
                        cost < JIT_ABOVE_COST / 4.0,
                        "{backlog_of}, {form}, {planner}: a claim is estimated at {cost} \
                         (jit_above_cost {JIT_ABOVE_COST} by default):\n{plan}"
                    );
                }
            }
        });
    }
}
