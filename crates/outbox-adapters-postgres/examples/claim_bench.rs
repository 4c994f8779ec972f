//! Claim + mark throughput of the PostgreSQL outbox store.
//!
//! `cargo run --release -p outbox-adapters-postgres --example claim_bench -- [rows] [batch]`
//! with `OUTBOX_TEST_DATABASE_URL` (default: the local server). Fills a fresh schema
//! with `rows` pending 1 KiB messages (default 100,000), then claims `batch` (default
//! 500) at a time and marks each batch sent in one statement, until none is left.

#![allow(clippy::print_stdout)] // the report is the program's output

use std::time::{Duration, Instant};

use outbox_adapters_postgres::{PgOutboxStore, PgSchema, connect, migrate};
use outbox_ports::Lease;
use outbox_ports::prelude::*;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let rows: i64 = args.next().map_or(Ok(100_000), |a| a.parse())?;
    let batch: u32 = args.next().map_or(Ok(500), |a| a.parse())?;
    let url = std::env::var("OUTBOX_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let pool = connect(&url, 4, Duration::from_secs(5)).await?;
    let schema = PgSchema::new("outbox_claim_bench")?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS {} CASCADE",
        schema.quoted()
    )))
    .execute(&pool)
    .await?;
    migrate(&pool, &schema).await?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {}.outbox_messages (exchange, routing_key, payload) \
         SELECT 'bench', 'k', convert_to(repeat('x', 1024), 'UTF8') FROM generate_series(1, $1)",
        schema.quoted()
    )))
    .bind(rows)
    .execute(&pool)
    .await?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "VACUUM ANALYZE {}.outbox_messages",
        schema.quoted()
    )))
    .execute(&pool)
    .await?;
    let store = PgOutboxStore::new(pool.clone(), schema.clone());
    let started = Instant::now();
    let (mut done, mut claim_time, mut mark_time) = (0u64, Duration::ZERO, Duration::ZERO);
    for n in 0.. {
        let lease = Lease::new(format!("bench#{n}"), Duration::from_secs(60));
        let t = Instant::now();
        let claimed = store.claim_pending(&lease, batch).await?;
        claim_time += t.elapsed();
        if claimed.is_empty() {
            break;
        }
        let ids: Vec<_> = claimed.iter().map(|c| c.message.id).collect();
        let t = Instant::now();
        done += store.mark_sent(&lease, &ids).await?;
        mark_time += t.elapsed();
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "claim_bench: {done} rows, batch {batch}: {:.0} rows/s claim+mark ({:.1} s; claims {:.1} s, marks {:.1} s)",
        done as f64 / secs,
        secs,
        claim_time.as_secs_f64(),
        mark_time.as_secs_f64()
    );
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA {} CASCADE",
        schema.quoted()
    )))
    .execute(&pool)
    .await?;
    Ok(())
}
