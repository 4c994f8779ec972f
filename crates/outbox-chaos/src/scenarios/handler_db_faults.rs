//! Makes the transactional billing handler swallow a failed statement or fail at
//! COMMIT for some orders; checks that exactly those end dead after the retries
//! with their reason and every other order is billed.

use std::time::Instant;

use super::support::report;
use crate::world::{Coordination, SweepOpts, World};
use crate::{Ctx, Report, conclude};
use outbox_core::InboxStatus;
use outbox_examples::billing::CONSUMER;
use outbox_ports::InboxOperator;

/// Orders of [`handler_db_faults`] whose handler swallows a failed statement.
const SWALLOW_ERROR_ORDERS: [i64; 4] = [13, 113, 213, 413];
/// Orders of [`handler_db_faults`] whose COMMIT fails on a deferred constraint.
const FAIL_AT_COMMIT_ORDERS: [i64; 4] = [27, 127, 327, 527];

/// The orders among `ids` the producer commits: it rolls back every tenth order
/// (see [`World::produce`]), and those never reach the consumer.
fn committed_among(ids: &[i64]) -> Vec<i64> {
    ids.iter().copied().filter(|id| id % 10 != 0).collect()
}

/// What a dead delivery must say for each kind of injected handler fault.
const SWALLOWED_REASON: &str = "aborted by a statement the handler ignored";
const COMMIT_REASON: &str = "billing_commit_check_once";

/// Scenario 9: database faults inside the transactional handler. For some orders
/// the billing handler runs a statement that fails and swallows its error (the
/// transaction is aborted behind an `Ok`); for others it writes under a deferred
/// unique constraint that fails at COMMIT. Each such order must end dead after
/// the consumer's retries (failed attempts, never acknowledged with nothing kept,
/// never redelivered forever), with its reason; every other order is billed.
pub(crate) async fn handler_db_faults(ctx: &Ctx) -> anyhow::Result<Report> {
    let w = World::new("dbfaults", &ctx.urls, &ctx.bins).await?;
    let ids = |list: &[i64]| {
        list.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",")
    };
    let (swallow, at_commit) = (ids(&SWALLOW_ERROR_ORDERS), ids(&FAIL_AT_COMMIT_ORDERS));
    let cfg = w.relay_config("r1", Coordination::Postgres, None, SweepOpts::default());
    let relay = w.relay("r1", &cfg)?;
    // The billing consumer's own retry policy is short (MAX_ATTEMPTS attempts,
    // 200 ms doubling to 5 s) and the chaos consumer sweeps every second, so a
    // faulty order is dead within about ten seconds of its first delivery.
    let consumer = w.consumer(
        "c1",
        &[
            ("BILLING_SWALLOW_ERROR_ORDERS", swallow.as_str()),
            ("BILLING_FAIL_AT_COMMIT_ORDERS", at_commit.as_str()),
        ],
    )?;
    let produced = w.produce(1, 1_000, Ctx::RATE).finish().await;
    let fault_end = Instant::now();
    let swallow_committed = committed_among(&SWALLOW_ERROR_ORDERS);
    let commit_committed = committed_among(&FAIL_AT_COMMIT_ORDERS);
    let mut r = report("handler_db_faults");
    // The dead this scenario provokes: every faulty order that committed, nothing
    // else.
    r.expected_dead = (swallow_committed.len() + commit_committed.len()) as u64;
    let expected_dead = r.expected_dead;
    let mut r = conclude(ctx, &w, r, produced, fault_end, vec![relay, consumer]).await?;
    let dead: std::collections::HashMap<i64, (u32, String)> = w
        .inbox
        .oldest_deliveries(CONSUMER, InboxStatus::Dead, 10_000)
        .await?
        .into_iter()
        .filter_map(|rec| {
            let order = outbox_examples::billing::order_id_of(&rec.message)?;
            Some((
                order,
                (
                    rec.consume.attempts,
                    rec.consume.last_error.unwrap_or_default(),
                ),
            ))
        })
        .collect();
    let mut dead_as_expected = 0u64;
    for (orders, reason) in [
        (&swallow_committed, SWALLOWED_REASON),
        (&commit_committed, COMMIT_REASON),
    ] {
        for order in orders {
            match dead.get(order) {
                Some((attempts, error))
                    if *attempts == outbox_examples::billing::MAX_ATTEMPTS
                        && error.contains(reason) =>
                {
                    dead_as_expected += 1;
                }
                other => r.failures.push(format!(
                    "order {order} is not dead after {} attempts with {reason:?}: {other:?}",
                    outbox_examples::billing::MAX_ATTEMPTS
                )),
            }
        }
    }
    let unexpected: Vec<&i64> = dead
        .keys()
        .filter(|o| !swallow_committed.contains(o) && !commit_committed.contains(o))
        .collect();
    if !unexpected.is_empty() {
        r.failures.push(format!(
            "orders dead without an injected fault: {unexpected:?}"
        ));
    }
    if let Some((_, error)) = swallow_committed.first().and_then(|o| dead.get(o)) {
        r.notes.push(format!("swallowed statement: {error}"));
    }
    if let Some((_, error)) = commit_committed.first().and_then(|o| dead.get(o)) {
        r.notes.push(format!("failed commit: {error}"));
    }
    r.notes.push(format!(
        "{dead_as_expected} of {expected_dead} faulty orders dead with their reasons; the rest billed"
    ));
    let passed = r.passed();
    w.cleanup(!passed).await;
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::{FAIL_AT_COMMIT_ORDERS, SWALLOW_ERROR_ORDERS, committed_among};

    #[test]
    fn only_the_faulty_orders_the_producer_commits_are_expected_dead() {
        assert_eq!(committed_among(&[13, 20, 113, 1000, 7]), vec![13, 113, 7]);
        assert_eq!(committed_among(&SWALLOW_ERROR_ORDERS).len(), 4);
        assert_eq!(committed_among(&FAIL_AT_COMMIT_ORDERS).len(), 4);
        assert!(
            SWALLOW_ERROR_ORDERS
                .iter()
                .chain(&FAIL_AT_COMMIT_ORDERS)
                .all(|o| (1..=1_000).contains(o)),
            "every faulty order is among the orders the scenario creates"
        );
    }
}
