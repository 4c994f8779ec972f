//! `cargo xtask bench`: measures the relay, the consumer and the producer side by side
//! with what RabbitMQ and PostgreSQL do on their own, in one run, and writes
//! `target/bench/summary.json`. Benchmarks are reports, not tests: nothing here
//! asserts a time.
//!
//! `outbox-bench [--quick] [--relay-only | --consume-only | --claim-only | --delayed-only] [--out PATH] [--relay-bin PATH]`
//! (`--help` prints the usage; an unknown argument is refused with it, exit 2)
//! (`--relay-only`: raw (a sliding window, then batches of the relay's size), relay, relay with 1,000 ordering keys, relay with two
//! pipelines, raw again;
//! `--consume-only`: raw consumer, then the inbox worker, then its latency at 200/s; `--claim-only`: claim times
//! and the admin service's reads over a million rows sent through the relay's marks;
//! `--delayed-only`: the publish lateness of delayed messages, then the claim times); URLs from
//! `OUTBOX_TEST_DATABASE_URL` and `OUTBOX_TEST_AMQP_URL`, else the local servers.
//!
//! A module a phase (`raw_confirm`, `relay`, `ordered`, `naive`, `latency`,
//! `delayed`, `claim` with `admin` and `ui`, `consume`, `consume_latency`, `relay_rss`, `enqueue`),
//! over the harness in `bench`; `report` prints the table and writes the summary;
//! this file reads the arguments and runs the phases in their order.

#![allow(clippy::print_stdout)] // the table is the program's output

mod admin;
mod bench;
mod claim;
mod cluster;
mod consume;
mod consume_latency;
mod cpu;
mod delayed;
mod enqueue;
mod latency;
mod naive;
mod ordered;
mod raw_confirm;
mod relay;
mod relay_rss;
mod report;
mod ui;

use std::time::Duration;

use bench::{Bench, EXCHANGE, QUEUE, Sizes};
use claim::record_claim_scale;
use delayed::record_delayed_lateness;
use enqueue::record_enqueue;
use ordered::ORDERING_KEYS;
use outbox_adapters_rabbitmq::{BindingSpec, ExchangeKind, ExchangeSpec, QueueSpec, Topology};
use report::write_summary;

const USAGE: &str = "usage: outbox-bench [--quick] [--relay-only | --consume-only | --claim-only | --delayed-only | --enqueue-only] [--out PATH] [--relay-bin PATH]

  --quick         smaller sizes (CI smoke); the default is the full bench
  --cluster-only  on the local 3-node cluster (OUTBOX_TEST_CLUSTER_URLS), one quorum queue: raw confirms, the relay
  --relay-only    raw confirms (a sliding window, and batches of the relay's size), the relay (1 and 2 pipelines, and with ordering keys), raw confirms again
  --consume-only  a raw consumer, then the transactional inbox worker, and its latency at 200/s
  --claim-only    claim times (also beside 1,000,000 delayed rows) and the admin service's reads over 1,000,000 rows
  --delayed-only  how late delayed messages are published, then what --claim-only runs
  --enqueue-only  producer commits through PgOutbox::enqueue against plain INSERTs
  --out PATH      where summary.json goes (default target/bench/summary.json)
  --relay-bin PATH  the outbox binary for the RSS phase (default target/release/outbox)
  -h, --help      this text

URLs from OUTBOX_TEST_DATABASE_URL and OUTBOX_TEST_AMQP_URL, else the local servers.";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Only {
    Relay,
    Cluster,
    Consume,
    Claim,
    Delayed,
    Enqueue,
}

#[derive(Debug, PartialEq, Eq)]
struct Args {
    quick: bool,
    only: Option<Only>,
    out: String,
    relay_bin: String,
}

impl Args {
    /// The command line; `Ok(None)` for `--help`. Unknown arguments, a flag without
    /// its value and two phase selections are refused.
    fn parse(args: impl IntoIterator<Item = String>) -> Result<Option<Self>, String> {
        let mut parsed = Self {
            quick: false,
            only: None,
            out: "target/bench/summary.json".to_owned(),
            relay_bin: "target/release/outbox".to_owned(),
        };
        let mut args = args.into_iter();
        while let Some(a) = args.next() {
            let only = match a.as_str() {
                "-h" | "--help" => return Ok(None),
                "--quick" => {
                    parsed.quick = true;
                    continue;
                }
                "--out" | "--relay-bin" => {
                    let value = args.next().ok_or_else(|| format!("{a} needs a value"))?;
                    if a == "--out" {
                        parsed.out = value;
                    } else {
                        parsed.relay_bin = value;
                    }
                    continue;
                }
                "--relay-only" => Only::Relay,
                "--cluster-only" => Only::Cluster,
                "--consume-only" => Only::Consume,
                "--claim-only" => Only::Claim,
                "--delayed-only" => Only::Delayed,
                "--enqueue-only" => Only::Enqueue,
                other => return Err(format!("unknown argument {other:?}")),
            };
            if parsed.only.replace(only).is_some() {
                return Err(
                    "choose at most one of --relay-only, --cluster-only, --consume-only, --claim-only, --delayed-only, --enqueue-only".to_owned(),
                );
            }
        }
        Ok(Some(parsed))
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args = match Args::parse(std::env::args().skip(1)) {
        Ok(Some(args)) => args,
        Ok(None) => {
            println!("{USAGE}");
            return Ok(());
        }
        Err(e) => {
            eprintln!("outbox-bench: {e}\n\n{USAGE}");
            std::process::exit(2);
        }
    };
    let Args {
        quick,
        only,
        out,
        relay_bin,
    } = args;
    let sizes = if quick {
        Sizes {
            backlog: 20_000,
            naive: 500,
            latency: Duration::from_secs(10),
            delayed: 2_000,
            delayed_over: Duration::from_secs(10),
            claim_rows: 200_000,
            consume: 10_000,
            consume_latency: Duration::from_secs(5),
            memory_backlog: 200_000,
            enqueue_for: Duration::from_secs(3),
        }
    } else {
        Sizes {
            backlog: 100_000,
            naive: 2_000,
            latency: Duration::from_secs(30),
            delayed: 2_000,
            delayed_over: Duration::from_secs(20),
            claim_rows: 1_000_000,
            consume: 20_000,
            consume_latency: Duration::from_secs(15),
            memory_backlog: 1_000_000,
            enqueue_for: Duration::from_secs(10),
        }
    };
    let var = |k: &str, d: &str| std::env::var(k).unwrap_or_else(|_| d.to_owned());
    let pg_url = var(
        "OUTBOX_TEST_DATABASE_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    );
    let amqp_url = if only == Some(Only::Cluster) {
        cluster::first_url()?
    } else {
        var(
            "OUTBOX_TEST_AMQP_URL",
            "amqp://guest:guest@127.0.0.1:5672/%2f",
        )
    };
    let pool = outbox_adapters_postgres::connect(&pg_url, 20, Duration::from_secs(10)).await?;
    let amqp = outbox_adapters_rabbitmq::connect(&amqp_url, Duration::from_secs(10)).await?;
    Topology {
        exchanges: vec![ExchangeSpec {
            name: EXCHANGE.into(),
            kind: ExchangeKind::Direct,
            durable: true,
            shards: 1,
        }],
        queues: vec![if only == Some(Only::Cluster) {
            // Replicated on the three nodes, led by the first (declared through it).
            QueueSpec {
                queue_type: outbox_adapters_rabbitmq::QueueType::Quorum,
                ..QueueSpec::durable(QUEUE)
            }
        } else {
            QueueSpec::durable(QUEUE)
        }],
        bindings: vec![BindingSpec {
            queue: QUEUE.into(),
            exchange: EXCHANGE.into(),
            routing_key: "k".into(),
        }],
    }
    .declare(&amqp)
    .await?;
    let mut b = Bench {
        pg_url,
        amqp_url,
        pool,
        amqp,
        results: Vec::new(),
    };
    b.purge().await?;
    println!(
        "outbox bench ({}), 1 KiB persistent messages with confirms",
        if quick { "quick" } else { "full" }
    );

    if only == Some(Only::Cluster) {
        cluster::record_cluster(&mut b, &sizes).await?;
        return write_summary(&b, quick, &out);
    }
    if only == Some(Only::Consume) {
        b.consume_side_by_side(sizes.consume).await?;
        record_consume_latency(&mut b, &sizes).await?;
        return write_summary(&b, quick, &out);
    }
    if only == Some(Only::Enqueue) {
        record_enqueue(&mut b, &sizes).await?;
        let _ = sqlx::query("DROP SCHEMA IF EXISTS bench_enqueue CASCADE")
            .execute(&b.pool)
            .await;
        return write_summary(&b, quick, &out);
    }
    if only == Some(Only::Delayed) {
        record_delayed_lateness(&mut b, &sizes).await?;
    }
    if matches!(only, Some(Only::Claim | Only::Delayed)) {
        record_claim_scale(&mut b, sizes.claim_rows).await?;
        for s in ["bench_claim", "bench_delayed_claim"] {
            let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                "DROP SCHEMA IF EXISTS {s} CASCADE"
            )))
            .execute(&b.pool)
            .await;
        }
        return write_summary(&b, quick, &out);
    }
    let (raw, raw_cpu) = b.raw_confirm(usize::try_from(sizes.backlog)?).await?;
    b.record("raw_confirm", raw, "msg/s");
    b.record_cpu("raw_confirm", raw_cpu);
    // What overlapping a batch's confirm tail with the next batch could win at most.
    let (raw_batched, _) = b
        .raw_confirm_batched(
            usize::try_from(sizes.backlog)?,
            usize::try_from(bench::RELAY_BATCH)?,
        )
        .await?;
    b.record("raw_confirm_batched", raw_batched, "msg/s");
    b.record(
        "raw_confirm_batched/raw_confirm",
        raw_batched / raw,
        "ratio",
    );
    let (relay, relay_cpu) = b.relay(sizes.backlog, 1).await?;
    b.record("relay", relay, "msg/s");
    b.record_cpu("relay", relay_cpu);
    b.record("relay/raw_confirm", relay / raw, "ratio");
    b.record("relay/raw_confirm_batched", relay / raw_batched, "ratio");
    let (ordered, ordered_cpu) = b.relay_ordered(sizes.backlog, ORDERING_KEYS).await?;
    b.record("relay_ordered", ordered, "msg/s");
    b.record_cpu("relay_ordered", ordered_cpu);
    b.record("relay_ordered/relay", ordered / relay, "ratio");
    let (relay_2p, _) = b.relay(sizes.backlog, 2).await?;
    b.record("relay_2p", relay_2p, "msg/s");
    b.record("relay_2p/raw_confirm", relay_2p / raw, "ratio");
    if only == Some(Only::Relay) {
        let (raw_after, _) = b.raw_confirm(usize::try_from(sizes.backlog)?).await?;
        b.record("raw_confirm_after", raw_after, "msg/s");
        return write_summary(&b, quick, &out);
    }
    let naive = b.naive(sizes.naive).await?;
    b.record("naive", naive, "msg/s");
    b.record("relay/naive", relay / naive, "ratio");
    let l = b.latency(sizes.latency).await?;
    b.record("latency_rate_achieved", l.achieved_rate, "msg/s");
    b.record("latency_p50_ms", l.p50, "ms");
    b.record("latency_p99_ms", l.p99, "ms");
    b.record("latency_max_ms", l.max, "ms");
    record_delayed_lateness(&mut b, &sizes).await?;
    record_claim_scale(&mut b, sizes.claim_rows).await?;
    b.consume_side_by_side(sizes.consume).await?;
    record_consume_latency(&mut b, &sizes).await?;
    let rss = b.relay_rss(&relay_bin, sizes.memory_backlog).await?;
    b.record("relay_rss_peak_mib", rss, "MiB");
    record_enqueue(&mut b, &sizes).await?;

    for s in [
        "bench_relay",
        "bench_ordered",
        "bench_naive",
        "bench_latency",
        "bench_delayed_lateness",
        "bench_claim",
        "bench_delayed_claim",
        "bench_consume",
        "bench_memory",
        "bench_enqueue",
    ] {
        let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP SCHEMA IF EXISTS {s} CASCADE"
        )))
        .execute(&b.pool)
        .await;
    }
    write_summary(&b, quick, &out)
}

/// `consume_latency_*` (see `consume_latency`).
async fn record_consume_latency(b: &mut Bench, sizes: &Sizes) -> anyhow::Result<()> {
    let l = b.consume_latency(sizes.consume_latency).await?;
    b.record("consume_latency_p50_ms", l.p50, "ms");
    b.record("consume_latency_p99_ms", l.p99, "ms");
    b.record("consume_latency_max_ms", l.max, "ms");
    b.record("consume_latency_rate_achieved", l.achieved_rate, "msg/s");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(a: &[&str]) -> Result<Option<Args>, String> {
        Args::parse(a.iter().map(|s| (*s).to_owned()))
    }

    #[test]
    fn help_and_unknown_arguments_never_start_a_run() {
        assert_eq!(parse(&["--help"]), Ok(None));
        assert_eq!(parse(&["--quick", "-h"]), Ok(None));
        assert!(parse(&["--bogus"]).is_err());
        assert!(parse(&["quick"]).is_err());
        assert!(parse(&["--out"]).is_err());
        assert!(parse(&["--relay-only", "--claim-only"]).is_err());
        assert!(parse(&["--cluster-only", "--relay-only"]).is_err());
        assert!(parse(&["--delayed-only", "--claim-only"]).is_err());
        assert!(parse(&["--enqueue-only", "--relay-only"]).is_err());
        assert_eq!(
            parse(&["--enqueue-only"]).map(|a| a.map(|a| a.only)),
            Ok(Some(Some(Only::Enqueue)))
        );
    }

    #[test]
    fn flags_are_read() {
        let a = parse(&["--quick", "--claim-only", "--out", "x.json"])
            .expect("valid")
            .expect("a run");
        assert!(a.quick);
        assert_eq!(a.only, Some(Only::Claim));
        assert_eq!(a.out, "x.json");
        assert_eq!(a.relay_bin, "target/release/outbox");
        assert_eq!(parse(&[]).expect("valid").expect("a run").only, None);
        assert_eq!(
            parse(&["--delayed-only"])
                .expect("valid")
                .expect("a run")
                .only,
            Some(Only::Delayed)
        );
    }
}
