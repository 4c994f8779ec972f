//! A paused exchange's backlog costs the other exchanges' claims nothing (issue 47,
//! defect 5): with 100,000 immediate, 20,000 due delayed, 20,000 failed-and-due
//! rows and 20,000 ordering keys of a paused exchange at the front of every pick's
//! order, a claim of
//! pending rows, a claim of retries and an idle relay's work check each read about
//! the rows they take, not the paused ones; the claims take none of the paused
//! rows, all of the others, and once the pause is lifted the paused rows flow.

mod common;

use common::rows_visited;

use std::time::Duration;

use outbox_adapters_postgres::{PgOutboxStore, PgPauses, PgPool, PgSchema};
use outbox_ports::Lease;
use outbox_ports::PauseKind;
use outbox_ports::prelude::*;

/// Inserts `n` rows of `exchange` in the given state (SQL for `not_before`,
/// `status` and `next_attempt_at`), unkeyed.
async fn fill(pool: &PgPool, schema: &PgSchema, exchange: &str, n: i64, state: (&str, &str, &str)) {
    fill_keyed(pool, schema, exchange, n, state, "NULL").await;
}

/// As [`fill`], with the ordering key `key` (SQL over `i`, the row's number).
async fn fill_keyed(
    pool: &PgPool,
    schema: &PgSchema,
    exchange: &str,
    n: i64,
    (not_before, status, next_attempt_at): (&str, &str, &str),
    key: &str,
) {
    let t = format!("{}.outbox_messages", schema.quoted());
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {t} (exchange, routing_key, payload, not_before, status, attempts, \
           next_attempt_at, ordering_key) \
         SELECT $1, 'k', '\\x00'::bytea, {not_before}, '{status}', \
           CASE WHEN '{status}' = 'publish_failed' THEN 1 ELSE 0 END, {next_attempt_at}, {key} \
         FROM generate_series(1, $2) i"
    )))
    .bind(exchange)
    .bind(n)
    .execute(pool)
    .await
    .expect("fill");
}

const IMMEDIATE: (&str, &str, &str) = ("NULL", "pending", "NULL");
const DUE: (&str, &str, &str) = ("now() - interval '1 minute'", "pending", "NULL");
const LATER: (&str, &str, &str) = ("now() + interval '1 day'", "pending", "NULL");
const FAILED_DUE: (&str, &str, &str) = ("NULL", "publish_failed", "now() - interval '1 minute'");
const FAILED_LATER: (&str, &str, &str) = ("NULL", "publish_failed", "now() + interval '1 day'");

/// The most rows a claim may visit here. It takes the 600 rows of the exchanges
/// not paused (50 of them the heads of 50 keys), and the plan's scans count each of them about five times over (the
/// pick, its subquery, the CTE scans, the update's join; 2,277 for the pending
/// claim as written), plus a probe a walk step and the pauses. The paused backlog
/// alone is 160,000 rows, and a claim that passed over it visited 141,904
/// (before its keys were added).
const BOUND: u64 = 3_000;

/// The most buffer accesses a scan of the due rows of one exchange may make
/// here (its index by exchange: outbox_scheduled_by_exchange or
/// outbox_retry_by_exchange) for the 100 due rows it takes: a few index pages (8
/// measured). The live exchange's 100,000 delayed and 50,000 failed rows still
/// to come sit after them in those indexes: a scan that does not stop at the
/// first row still to come reads them all (501 measured, with the exchange
/// written as a range; rows stepped over inside an index show in its pages only,
/// never in its rows).
const DUE_SCAN_PAGES: u64 = 60;

/// Per scan of an index by exchange of due rows in an `EXPLAIN (ANALYZE,
/// BUFFERS)` text, the buffers it accessed (hit and read), from the `Buffers:`
/// line below it.
fn due_scan_pages(plan: &str) -> Vec<(String, u64)> {
    let lines: Vec<&str> = plan.lines().collect();
    let mut found = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(index) = ["outbox_scheduled_by_exchange", "outbox_retry_by_exchange"]
            .into_iter()
            .find(|ix| line.contains("Scan") && line.contains(ix))
        else {
            continue;
        };
        let buffers = lines[i + 1..]
            .iter()
            .take(4)
            .find(|l| l.trim_start().starts_with("Buffers:"))
            .map_or(0, |l| {
                ["hit=", "read="]
                    .iter()
                    .filter_map(|k| l.split(k).nth(1))
                    .filter_map(|n| n.split([' ', ',']).next())
                    .filter_map(|n| n.parse::<u64>().ok())
                    .sum()
            });
        found.push((index.to_owned(), buffers));
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_backlog_costs_the_other_exchanges_claims_nothing() {
    with_db!(|pool, schema| {
        // The paused exchange's rows first: the lowest seqs and earliest due
        // times, where a pick walking its index in order meets them first.
        fill(&pool, &schema, "held", 100_000, IMMEDIATE).await;
        fill(&pool, &schema, "held", 20_000, DUE).await;
        fill(&pool, &schema, "held", 20_000, FAILED_DUE).await;
        // And 20,000 keys of the paused exchange, a row each, before the keys
        // of the live exchange in the walk's order: 50 keys of two rows each.
        fill_keyed(&pool, &schema, "held", 20_000, IMMEDIATE, "'a-' || i").await;
        // An exchange with large delayed and failed backlogs still to come (its
        // due rows must be found without visiting those), and a third, small one.
        fill(&pool, &schema, "live", 100_000, LATER).await;
        fill(&pool, &schema, "live", 50_000, FAILED_LATER).await;
        fill(&pool, &schema, "live", 300, IMMEDIATE).await;
        fill(&pool, &schema, "live", 100, DUE).await;
        fill(&pool, &schema, "live", 100, FAILED_DUE).await;
        fill(&pool, &schema, "other", 50, IMMEDIATE).await;
        fill_keyed(&pool, &schema, "live", 100, IMMEDIATE, "'b-' || (i % 50)").await;
        let pauses = PgPauses::new(pool.clone(), &schema);
        pauses
            .pause(PauseKind::Exchange, "held", "test")
            .await
            .expect("pause");
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "VACUUM ANALYZE {}.outbox_messages",
            schema.quoted()
        )))
        .execute(&pool)
        .await
        .expect("vacuum");

        for (planner, p) in common::planners(&pool).await {
            let store = PgOutboxStore::new(p, schema.clone());
            for (what, plan) in [
                (
                    "claim of pending rows",
                    store.explain_analyze_claim_pending(1000).await,
                ),
                (
                    "claim of retries",
                    store.explain_analyze_claim_retries(1000).await,
                ),
                ("work check", store.explain_analyze_claimable().await),
            ] {
                let plan = plan.expect("explain");
                let visited = rows_visited(&plan);
                let due_scans = due_scan_pages(&plan);
                eprintln!("{planner}, {what}: {visited} rows visited, due scans {due_scans:?}");
                for (index, pages) in due_scans {
                    assert!(
                        pages <= DUE_SCAN_PAGES,
                        "{planner}: a {what}'s scan of {index} accessed {pages} buffers:\n{plan}"
                    );
                }
                assert!(
                    visited <= BOUND,
                    "{planner}: a {what} visited {visited} rows (the paused backlog is \
                     160,000):\n{plan}"
                );
                // (The form for no pause may be planned as a scan expecting an
                // early match in a table of unsent rows; it must not run.)
                assert!(
                    !plan
                        .lines()
                        .any(|l| l.contains("Seq Scan on outbox_messages")
                            && !l.contains("never executed")),
                    "{planner}: a {what} scans the table:\n{plan}"
                );
            }
        }

        let store = PgOutboxStore::new(pool.clone(), schema.clone());
        let lease = Lease::new("relay", Duration::from_secs(60));
        assert_eq!(store.pending_claimable().await.expect("check"), Some(true));
        let pending = store.claim_pending(&lease, 1000).await.expect("claim");
        let retries = store.claim_due_retries(&lease, 1000).await.expect("claim");
        let of = |claimed: &[outbox_ports::ClaimedMessage], exchange: &str| {
            claimed
                .iter()
                .filter(|c| c.message.exchange == exchange)
                .count()
        };
        let keyed = pending
            .iter()
            .filter(|c| c.message.ordering_key.is_some())
            .count();
        assert_eq!(
            (
                of(&pending, "live"),
                of(&pending, "other"),
                of(&pending, "held"),
                keyed
            ),
            (450, 50, 0, 50),
            "the pending claim takes every row not paused (a keyed one a key) and none paused"
        );
        assert_eq!((of(&retries, "live"), of(&retries, "held")), (100, 0));
        assert_eq!(pending.len(), 500, "nothing but these three exchanges");
        assert_eq!(
            store.pending_claimable().await.expect("check"),
            Some(false),
            "nothing claimable is left but the paused rows"
        );

        // The pause lifted, the paused rows flow, oldest first.
        pauses
            .resume(PauseKind::Exchange, "held")
            .await
            .expect("resume");
        assert_eq!(store.pending_claimable().await.expect("check"), Some(true));
        let pending = store.claim_pending(&lease, 1000).await.expect("claim");
        assert_eq!((pending.len(), of(&pending, "held")), (1000, 1000));
        let retries = store.claim_due_retries(&lease, 1000).await.expect("claim");
        assert_eq!((retries.len(), of(&retries, "held")), (1000, 1000));
    });
}

/// While an exchange is paused, the keys of every other exchange take turns: a
/// claim walks each exchange's keys from that exchange's own cursor. With one
/// cursor shared by all, an exchange whose keys sort below another's started
/// from its first keys at every claim that took one of the other's (the cursor
/// then stood above all of its keys), so its first keys drained while the rest
/// waited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_of_every_live_exchange_take_turns_while_another_is_paused() {
    with_db!(|pool, schema| {
        let t = format!("{}.outbox_messages", schema.quoted());
        // 100 keys of 10 rows each per exchange, the two exchanges' rows
        // interleaved in seq order, so that each claim takes heads of both.
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {t} (exchange, routing_key, payload, ordering_key) \
             SELECT CASE WHEN i % 2 = 0 THEN 'billing' ELSE 'shipping' END, 'k', '\\x00'::bytea, \
               CASE WHEN i % 2 = 0 THEN 'inv-' ELSE 'shp-' END || lpad(((i / 2) % 100)::text, 4, '0') \
             FROM generate_series(0, 3999) i"
        )))
        .execute(&pool)
        .await
        .expect("fill");
        PgPauses::new(pool.clone(), &schema)
            .pause(PauseKind::Exchange, "held", "test")
            .await
            .expect("pause");
        let store = PgOutboxStore::new(pool.clone(), schema.clone());
        let mut billing_keys = std::collections::HashSet::new();
        for _ in 0..5 {
            let lease = Lease::new("relay", Duration::from_secs(60));
            let claimed = store.claim_pending(&lease, 40).await.expect("claim");
            assert!(!claimed.is_empty());
            for c in &claimed {
                if c.message.exchange == "billing" {
                    billing_keys.insert(c.message.ordering_key.clone().expect("keyed"));
                }
            }
            let ids: Vec<_> = claimed.iter().map(|c| c.message.id).collect();
            store.mark_sent(&lease, &ids).await.expect("mark");
        }
        // About 20 billing heads a claim, each claim from where the last one
        // stopped: 100 keys in 5 claims. From the first keys every time: 40 at
        // most.
        assert!(
            billing_keys.len() >= 80,
            "5 claims took the heads of only {} billing keys",
            billing_keys.len()
        );
    });
}
