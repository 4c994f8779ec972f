//! Test harness: a pool on the server named by `OUTBOX_TEST_DATABASE_URL` (default:
//! the local server) and a fresh schema per test.

#![allow(dead_code, unreachable_pub)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use outbox_adapters_postgres::{PgPool, PgSchema, connect, migrate, redact_url};
use tokio::sync::OnceCell;

/// Where the tests look when no URL is given.
pub const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

pub fn url() -> String {
    outbox_testkit::services::TestUrls::from_env().pg
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// Whether the test process that made schema `obt_<pid>_...` still runs here.
fn owner_alive(schema: &str) -> bool {
    schema
        .strip_prefix("obt_")
        .and_then(|rest| rest.split('_').next())
        .and_then(|pid| pid.parse::<u32>().ok())
        .is_some_and(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists())
}

static CLEANED: OnceCell<()> = OnceCell::const_new();
static SEQ: AtomicU64 = AtomicU64::new(0);

/// A pool, or `None` outside CI when no server answers (the test then says it is
/// skipped). In CI an unreachable server fails the test, naming the URL tried.
pub async fn pool() -> Option<PgPool> {
    let url = url();
    match connect(&url, 8, Duration::from_secs(5)).await {
        Ok(pool) => {
            CLEANED
                .get_or_init(|| async {
                    // Schemas of earlier runs of this test binary: gone.
                    let prefix = format!("obt_{}_", std::process::id());
                    let old: Vec<String> = sqlx::query_scalar(
                        "SELECT nspname::text FROM pg_namespace WHERE nspname LIKE 'obt\\_%' AND nspname NOT LIKE $1",
                    )
                    .bind(format!("{prefix}%"))
                    .fetch_all(&pool)
                    .await
                    .unwrap_or_default();
                    for s in old {
                        // Only schemas whose test process is gone: another test binary
                        // running at the same time on this machine keeps its own.
                        if owner_alive(&s) {
                            continue;
                        }
                        if let Ok(schema) = PgSchema::new(&s) {
                            let _ = sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA IF EXISTS {} CASCADE", schema.quoted())))
                                .execute(&pool)
                                .await;
                        }
                    }
                })
                .await;
            Some(pool)
        }
        Err(e) if in_ci() => panic!(
            "PostgreSQL is required in CI and unreachable at {} (set OUTBOX_TEST_DATABASE_URL): {e}",
            redact_url(&url)
        ),
        Err(e) => {
            eprintln!(
                "SKIPPED (not in CI): PostgreSQL unreachable at {} (set OUTBOX_TEST_DATABASE_URL): {e}",
                redact_url(&url)
            );
            None
        }
    }
}

/// A migrated schema of its own for one test.
pub async fn fresh(pool: &PgPool) -> PgSchema {
    let name = format!(
        "obt_{}_{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::SeqCst)
    );
    let schema = PgSchema::new(&name).expect("valid schema name");
    migrate(pool, &schema).await.expect("migrate");
    schema
}

/// Runs `$body` with `(pool, schema)`, or reports the skip.
#[macro_export]
macro_rules! with_db {
    (|$pool:ident, $schema:ident| $body:block) => {{
        let Some($pool) = common::pool().await else {
            return;
        };
        let $schema = common::fresh(&$pool).await;
        $body
    }};
}

/// The largest `rows=` count a scan node of an `EXPLAIN ANALYZE` text reports.
pub fn most_rows_read_by_a_scan(plan: &str) -> u64 {
    plan.lines()
        .filter(|l| l.contains("Scan"))
        .filter_map(|l| l.split("actual").nth(1))
        .filter_map(|a| a.split("rows=").nth(1))
        .filter_map(|r| r.split([' ', ')']).next())
        .filter_map(|n| n.parse::<u64>().ok())
        .max()
        .unwrap_or(0)
}

/// Rows an `EXPLAIN ANALYZE` text says its scans visited: rows returned (times
/// loops) plus rows removed by a filter.
pub fn rows_visited(plan: &str) -> u64 {
    let number_after = |line: &str, key: &str| -> Option<u64> {
        line.split(key)
            .nth(1)?
            .split([' ', ')'])
            .next()?
            .parse()
            .ok()
    };
    let mut visited = 0;
    for line in plan.lines() {
        if line.contains("Scan") && line.contains("actual") {
            let rows = number_after(line, "rows=").unwrap_or(0);
            let loops = number_after(line, "loops=").unwrap_or(1);
            visited += rows * loops;
        }
        if line.contains("Rows Removed by Filter:") {
            visited += number_after(line, "Filter: ").unwrap_or(0);
        }
    }
    visited
}

/// A second pool on the same server whose planner prices random reads at 10
/// instead of the default 4 (`random_page_cost`). A plan test run on both pools
/// sees each side of a near tie between an index probe and a walk in another
/// index's order: which one the default costs pick can turn on the statistics an
/// `ANALYZE` sampled, or on whether a concurrent snapshot kept a `VACUUM` from
/// marking pages all-visible, so a plan that holds on one pool only is not
/// robust. (From 8 on, the inbox's old head rule walked the primary key; at 40 a
/// claim's final join of 199 rows is planned as a sequential scan of a small
/// table, which is no tie.)
pub async fn pool_pricing_random_reads_high() -> PgPool {
    use std::str::FromStr;
    let options = sqlx::postgres::PgConnectOptions::from_str(&url())
        .expect("test database URL")
        .options([("random_page_cost", "10")]);
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(5))
        .connect_with(options)
        .await
        .expect("a pool with random_page_cost = 10")
}

/// The test's pool under each planner a plan test checks: the default costs, and
/// [`pool_pricing_random_reads_high`]'s; each with its name for the assertion.
pub async fn planners(pool: &PgPool) -> [(&'static str, PgPool); 2] {
    [
        ("default costs", pool.clone()),
        (
            "random_page_cost = 10",
            pool_pricing_random_reads_high().await,
        ),
    ]
}

/// Inserts one row through plain SQL with the given headers JSON and routing key.
pub async fn insert_raw(
    pool: &PgPool,
    schema: &PgSchema,
    routing_key: &str,
    headers: &str,
) -> Result<uuid::Uuid, sqlx::Error> {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {}.outbox_messages (exchange, routing_key, headers, payload) \
         VALUES ('orders', $1, $2::jsonb, '\\x7b7d') RETURNING id",
        schema.quoted()
    )))
    .bind(routing_key)
    .bind(headers)
    .fetch_one(pool)
    .await
}
