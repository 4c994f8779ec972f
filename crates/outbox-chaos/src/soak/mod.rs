//! `outbox-chaos soak`: the endurance run behind `cargo xtask soak` (see
//! RELIABILITY.md, "Soak").
//!
//! Two relays and two billing consumers run as processes (copies of the binaries
//! taken at the start, so a rebuild meanwhile changes nothing, not even for a
//! successor of a killed process) against the local PostgreSQL, RabbitMQ and
//! Redis, while orders are committed at a steady rate (every tenth rolled back)
//! and faults from the chaos set are injected on a seeded schedule. Every 10 s the
//! sampler reads the processes' RSS and descriptors, the connections, backlogs,
//! table sizes and the latency of the last 10 s. At the end everything is counted
//! as the chaos suite counts, duplicates at the broker live from a tap queue, and
//! `target/soak/summary.json`, `samples.json` and `soak.svg` are written.

mod faults;
mod latency;
mod sampler;
pub(crate) mod schedule;
mod svg;
mod tap;
mod verdict;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_testkit::services::{self, TestUrls as Urls};

use crate::world::{Bins, LATE_DUPLICATES, World};
use faults::Procs;
use sampler::{Reader, Sample};
use verdict::{FaultRecord, Summary};

const USAGE: &str = "usage: outbox-chaos soak [--duration 60m] [--rate 1000] [--seed N]\n\n  --duration  how long orders are produced (e.g. 90s, 3m, 60m; at least 1m)\n  --rate      orders a second (every tenth is rolled back)\n  --seed      the fault schedule's seed (default: from the clock, printed)\n\nwrites target/soak/summary.json, samples.json and soak.svg; see RELIABILITY.md";

const OUT: &str = "target/soak";
/// Time between samples.
const SAMPLE_EVERY: Duration = Duration::from_secs(10);
/// How long the relays and consumers may take to account for everything after
/// production stops.
const SETTLE: Duration = Duration::from_secs(180);
/// How far after a fault's end its recovery is looked for.
const RECOVERY_LOOKAHEAD_S: i32 = 90;

#[derive(Debug, Clone, PartialEq)]
struct Args {
    duration: Duration,
    rate: u32,
    seed: Option<u64>,
}

/// `Ok(None)`: `--help`.
fn parse_args(args: &[String]) -> Result<Option<Args>, String> {
    let mut a = Args {
        duration: Duration::from_secs(3600),
        rate: 1000,
        seed: None,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        if flag == "--help" || flag == "-h" {
            return Ok(None);
        }
        let value = |v: Option<&String>| v.cloned().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--duration" => {
                let d = outbox_core::duration::parse(&value(it.next())?)?;
                if d < Duration::from_secs(60) {
                    return Err(format!(
                        "--duration {d:?} is too short: at least 1m (faults need 90s and more)"
                    ));
                }
                a.duration = d;
            }
            "--rate" => {
                let v = value(it.next())?;
                a.rate = v.parse().ok().filter(|r| *r > 0).ok_or(format!(
                    "--rate {v:?}: a positive number of orders a second"
                ))?;
            }
            "--seed" => {
                let v = value(it.next())?;
                a.seed = Some(v.parse().map_err(|_| format!("--seed {v:?}: a number"))?);
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(Some(a))
}

/// Copies the programs under test into `target/soak/bin`, so the run keeps using
/// them whatever is rebuilt meanwhile.
fn copy_bins(from: &Bins) -> anyhow::Result<Bins> {
    let dir = Path::new(OUT).join("bin");
    std::fs::create_dir_all(&dir)?;
    let copy = |src: &PathBuf| -> anyhow::Result<PathBuf> {
        let name = src
            .file_name()
            .ok_or_else(|| anyhow::anyhow!("no file name in {}", src.display()))?;
        let dst = dir.join(name);
        // A fresh inode: a process still running the old copy keeps it.
        let _ = std::fs::remove_file(&dst);
        std::fs::copy(src, &dst)
            .map_err(|e| anyhow::anyhow!("cannot copy {}: {e}", src.display()))?;
        Ok(std::fs::canonicalize(dst)?)
    };
    Ok(Bins {
        outbox: copy(&from.outbox)?,
        consumer: copy(&from.consumer)?,
    })
}

/// Aborts a task when dropped (so an interrupted run leaves no fault running).
struct Task<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for Task<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Runs the soak; the exit code of `outbox-chaos soak`.
pub(crate) async fn main(args: &[String], bins: anyhow::Result<Bins>) -> ExitCode {
    let args = match parse_args(args) {
        Ok(Some(a)) => a,
        Ok(None) => {
            eprintln!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("outbox-chaos soak: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let bins = match bins.and_then(|b| copy_bins(&b)) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("outbox-chaos soak: {e:#}");
            return ExitCode::from(2);
        }
    };
    let urls = Urls::from_env();
    for (url, addr, what) in [
        (&urls.amqp, services::AMQP_ADDR, "RabbitMQ"),
        (&urls.redis, services::REDIS_ADDR, "Redis"),
        (&urls.pg, services::PG_ADDR, "PostgreSQL"),
    ] {
        if !services::is_local(url, addr) {
            eprintln!(
                "outbox-chaos soak: the soak stops {what} and needs the local server at {addr}"
            );
            return ExitCode::from(2);
        }
    }
    if let Err(e) = tokio::task::spawn_blocking(services::ensure_all_up)
        .await
        .unwrap_or_else(|e| Err(e.to_string()))
    {
        eprintln!("outbox-chaos soak: {e}");
        return ExitCode::FAILURE;
    }
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_secs())
    });
    let w = match World::new_in("soak", &urls, &bins, &format!("{OUT}/logs")).await {
        Ok(w) => Arc::new(w),
        Err(e) => {
            eprintln!("outbox-chaos soak: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = tokio::select! {
        r = run(&w, &args, seed) => r,
        _ = tokio::signal::ctrl_c() => {
            eprintln!("soak: interrupted; stopping the processes and restoring the services");
            Err(anyhow::anyhow!("interrupted"))
        }
    };
    // Whatever happened, every service is up again before we leave.
    if let Err(e) = tokio::task::spawn_blocking(services::ensure_all_up)
        .await
        .unwrap_or_else(|e| Err(e.to_string()))
    {
        eprintln!("soak: {e}");
    }
    // The aborted tasks of an interrupted run let go of the world shortly.
    for _ in 0..50 {
        if Arc::strong_count(&w) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let passed = outcome.as_ref().is_ok_and(Summary::passed);
    let keep = !passed;
    if keep {
        eprintln!("soak: logs and configs kept in {}", w.dir.display());
    }
    match Arc::try_unwrap(w) {
        Ok(w) => w.cleanup(keep).await,
        Err(_) => eprintln!("soak: the world is still in use; its schemas stay"),
    }
    match outcome {
        Ok(_) if passed => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("soak: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Latency columns that the soak's tables need: both timestamps at the statement
/// (not the transaction start), and indexes to read windows by time.
async fn prepare(w: &World) -> anyhow::Result<()> {
    let s = w.shop.schema.quoted();
    for sql in [
        format!("ALTER TABLE {s}.orders ALTER COLUMN created_at SET DEFAULT clock_timestamp()"),
        format!("ALTER TABLE {s}.invoices ALTER COLUMN billed_at SET DEFAULT clock_timestamp()"),
        format!("CREATE INDEX ON {s}.invoices (billed_at)"),
        format!("CREATE INDEX ON {s}.orders (created_at)"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&w.pool)
            .await?;
    }
    Ok(())
}

async fn run(w: &Arc<World>, args: &Args, seed: u64) -> anyhow::Result<Summary> {
    prepare(w).await?;
    let plan_shape = schedule::Plan::for_run(args.duration);
    let plan = schedule::schedule(seed, &plan_shape);
    eprintln!(
        "soak: {} at {} orders/s, seed {seed}; {} faults planned: {}",
        outbox_core::duration::format(args.duration),
        args.rate,
        plan.len(),
        plan.iter()
            .map(|p| format!("{} at {:.0} s", p.kind.name(), p.at_s))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let procs = Arc::new(tokio::sync::Mutex::new(Procs::start(w)?));
    let t0 = Instant::now();
    let t0_epoch: f64 = sqlx::query_scalar("SELECT extract(epoch FROM clock_timestamp())::float8")
        .fetch_one(&w.pool)
        .await?;
    let tap = tap::Tap::start(w, t0);
    let orders = i64::from(args.rate) * args.duration.as_secs() as i64;
    // One order in flight per task: enough tasks that each has 10 ms or more per
    // order, within the pool's 16 connections.
    let producer = w.produce_with(
        1,
        orders,
        args.rate,
        i64::from(args.rate / 100).clamp(4, 12),
    );
    let samples = Arc::new(std::sync::Mutex::new(Vec::<Sample>::new()));
    let sampling = {
        let (w, procs, samples) = (Arc::clone(w), Arc::clone(&procs), Arc::clone(&samples));
        Task(tokio::spawn(async move {
            let mut reader = Reader::new(&w, t0_epoch);
            let mut tick = tokio::time::interval_at(
                tokio::time::Instant::from_std(t0 + SAMPLE_EVERY),
                SAMPLE_EVERY,
            );
            loop {
                tick.tick().await;
                let t_s = t0.elapsed().as_secs_f64().round();
                let pids = procs.lock().await.pids();
                let s = reader.sample(t_s, &pids).await;
                eprintln!(
                    "soak: {:>5.0} s  p50 {:>7} ms  p99 {:>7} ms  committed/s {:>6}  consumed/s {:>6.0}  outbox {:>6}  inbox {:>6}  rss MiB {}",
                    s.t_s,
                    opt(s.latency.p50_ms),
                    opt(s.latency.p99_ms),
                    opt(s.committed_per_s),
                    s.consumed_per_s,
                    s.outbox_backlog.map_or("-".into(), |v| v.to_string()),
                    s.inbox_backlog.map_or("-".into(), |v| v.to_string()),
                    s.procs
                        .iter()
                        .map(|p| format!("{}={}", p.name, p.rss_kb / 1024))
                        .collect::<Vec<_>>()
                        .join(" ")
                );
                if let Ok(mut all) = samples.lock() {
                    all.push(s);
                }
            }
        }))
    };
    let faulting = {
        let (w, procs) = (Arc::clone(w), Arc::clone(&procs));
        Task(tokio::spawn(async move {
            faults::run(&w, &procs, plan, t0).await
        }))
    };
    tokio::time::sleep_until(tokio::time::Instant::from_std(t0 + args.duration)).await;
    let produced = producer.stop().await;
    let production_end_s = t0.elapsed().as_secs_f64();
    eprintln!(
        "soak: production stopped at {production_end_s:.0} s ({} attempted, {} failed); settling",
        produced.attempted, produced.errors
    );
    let mut faulting = faulting;
    let records: Vec<FaultRecord> = (&mut faulting.0).await.unwrap_or_default();
    let (tally, quiet_s) = settle(w, t0).await?;
    tokio::time::sleep(LATE_DUPLICATES).await;
    wait_tap_empty(w).await;
    let (duplicates, unique) = tap.finish().await;
    let last_t = t0.elapsed().as_secs_f64().round();
    // A last sample right before the processes stop: the end of the RSS series.
    {
        let pids = procs.lock().await.pids();
        let s = Reader::new(w, t0_epoch).sample(last_t, &pids).await;
        drop(sampling);
        if let Ok(mut all) = samples.lock() {
            all.push(s);
        }
    }
    let unclean = {
        let mut p = procs.lock().await;
        p.terminate_all().await
    };
    let samples: Vec<Sample> = samples.lock().map(|s| s.clone()).unwrap_or_default();

    // Latency: the steady value, then each fault's recovery.
    let warmup_s = plan_shape.warmup.as_secs_f64();
    let windows: Vec<latency::Window> = samples.iter().map(|s| s.latency).collect();
    let spans: Vec<(f64, f64)> = records.iter().map(|f| (f.at_s, f.end_s)).collect();
    let steady = latency::steady_p99(&windows, warmup_s, production_end_s, &spans);
    let reader = Reader::new(w, t0_epoch);
    let mut faults = records;
    if let Some(steady) = steady {
        for f in &mut faults {
            let sliding = reader.sliding(f.end_s, RECOVERY_LOOKAHEAD_S).await?;
            f.recovery_s = latency::recovery_s(f.end_s, &sliding, steady);
        }
    }
    let proc_samples: Vec<_> = samples.iter().flat_map(|s| s.procs.clone()).collect();
    let mut processes: Vec<String> = proc_samples.iter().map(|p| p.name.clone()).collect();
    processes.sort();
    processes.dedup();
    let mut notes = vec![format!(
        "settled {:.0} s after production stopped",
        quiet_s - production_end_s
    )];
    if produced.errors > 0 {
        notes.push(format!(
            "{} order transactions failed (not committed, not counted as lost)",
            produced.errors
        ));
    }
    let absorbed = w.duplicates_absorbed().await;
    if absorbed > 0 {
        notes.push(format!(
            "the running consumers' inboxes absorbed {absorbed} duplicate deliveries"
        ));
    }
    let achieved = tally.committed as f64 / production_end_s.max(1.0);
    notes.push(format!(
        "committed {achieved:.0} orders/s on average (asked {} attempts/s, a tenth rolled back)",
        args.rate
    ));
    let summary = Summary {
        duration_s: production_end_s,
        rate: args.rate,
        seed,
        attempted: produced.attempted,
        committed: tally.committed,
        consumed: tally.consumed,
        dead: tally.dead(),
        lost: tally.unaccounted,
        duplicate_deliveries: duplicates,
        duplicate_effects: tally.effects - tally.consumed,
        delivered_unique: unique,
        latency_p99_ms_steady: steady,
        rss_growth_pct: verdict::rss_growth(&proc_samples, warmup_s),
        outbox_table: verdict::TableGrowth::of(
            &samples
                .iter()
                .filter(|s| s.t_s <= production_end_s)
                .filter_map(|s| s.outbox_bytes.map(|b| (s.t_s, b)))
                .collect::<Vec<_>>(),
            warmup_s,
        ),
        dead_rows_peak: [
            (
                "outbox_messages",
                (|s| s.outbox_dead_rows) as fn(&Sample) -> Option<u64>,
            ),
            ("outbox_inbox", |s| s.inbox_dead_rows),
        ]
        .into_iter()
        .map(|(table, dead)| {
            let readings: Vec<(f64, u64)> = samples
                .iter()
                .filter(|s| s.t_s <= production_end_s)
                .filter_map(|s| dead(s).map(|d| (s.t_s, d)))
                .collect();
            (table, verdict::peak_dead_rows(&readings, warmup_s))
        })
        .collect(),
        dead_rows_bound: verdict::dead_rows_bound(achieved),
        processes,
        faults,
        unclean_exits: unclean,
        notes,
    };
    write_outputs(&summary, &samples, production_end_s)?;
    print_summary(&summary);
    Ok(summary)
}

fn opt(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.0}"))
}

/// Waits until nothing is in flight (cheap reads), then until every committed order
/// is invoiced or dead; the final tally and when it was reached (s since `t0`).
async fn settle(w: &World, t0: Instant) -> anyhow::Result<(crate::world::Tally, f64)> {
    let deadline = Instant::now() + SETTLE;
    let mut reader = Reader::new(w, 0.0);
    let o = w.shop.outbox_schema.quoted();
    loop {
        let backlog: Option<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT (SELECT count(*) FROM {o}.outbox_messages WHERE status IN ('pending', 'publish_failed'))
                  + (SELECT count(*) FROM {o}.outbox_inbox WHERE status IN ('received', 'consume_failed'))"
        )))
        .fetch_one(&w.pool)
        .await
        .ok();
        let queue = reader.queue_depth(&w.shop.queue).await;
        if backlog == Some(0) && queue == Some(0) {
            break;
        }
        if Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    loop {
        let t = w.tally().await?;
        if t.unaccounted == 0 || Instant::now() >= deadline {
            return Ok((t, t0.elapsed().as_secs_f64()));
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// Waits (at most 30 s) until the live tap has taken every copy from its queue.
async fn wait_tap_empty(w: &World) {
    let mut reader = Reader::new(w, 0.0);
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if reader.queue_depth(&w.tap).await == Some(0) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!("soak: the tap queue still holds copies after 30 s");
}

fn write_outputs(
    summary: &Summary,
    samples: &[Sample],
    production_end_s: f64,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(OUT)?;
    std::fs::write(
        format!("{OUT}/summary.json"),
        serde_json::to_string_pretty(&summary.json())? + "\n",
    )?;
    let all: Vec<serde_json::Value> = samples.iter().map(Sample::json).collect();
    std::fs::write(
        format!("{OUT}/samples.json"),
        serde_json::to_string(&all)? + "\n",
    )?;
    let mut rss: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for p in samples.iter().flat_map(|s| &s.procs) {
        rss.entry(p.name.clone())
            .or_default()
            .push((p.t_s, p.rss_kb as f64 / 1024.0));
    }
    let chart = svg::Chart {
        title: format!(
            "outbox soak: {:.0} min at {} orders/s, seed {}: {} committed, {} lost, {} duplicate effects, {}",
            production_end_s / 60.0,
            summary.rate,
            summary.seed,
            summary.committed,
            summary.lost,
            summary.duplicate_effects,
            if summary.passed() { "passed" } else { "FAILED" }
        ),
        duration_s: samples.last().map_or(production_end_s, |s| s.t_s),
        latency: samples
            .iter()
            .map(|s| (s.t_s, s.latency.p50_ms, s.latency.p99_ms))
            .collect(),
        steady_p99_ms: summary.latency_p99_ms_steady,
        backlog: samples
            .iter()
            .map(|s| {
                (
                    s.t_s,
                    s.outbox_backlog.unwrap_or(0) as f64,
                    s.inbox_backlog.unwrap_or(0) as f64,
                )
            })
            .collect(),
        rss,
        faults: summary
            .faults
            .iter()
            .map(|f| (f.at_s, f.end_s, f.kind.to_owned()))
            .collect(),
    };
    std::fs::write(format!("{OUT}/soak.svg"), svg::render(&chart))?;
    Ok(())
}

#[allow(clippy::print_stdout)]
fn print_summary(s: &Summary) {
    let r = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"));
    println!(
        "{:>9} {:>9} {:>5} {:>5} {:>8} {:>8} {:>13} {:>14}  result",
        "committed",
        "consumed",
        "dead",
        "lost",
        "dup.del",
        "dup.eff",
        "p99_steady_ms",
        "max_recovery_s"
    );
    println!(
        "{:>9} {:>9} {:>5} {:>5} {:>8} {:>8} {:>13} {:>14}  {}",
        s.committed,
        s.consumed,
        s.dead,
        s.lost,
        s.duplicate_deliveries,
        s.duplicate_effects,
        r(s.latency_p99_ms_steady),
        r(s.max_recovery_s()),
        if s.passed() { "passed" } else { "FAILED" }
    );
    for f in &s.faults {
        println!(
            "  fault {:>6.1} s  {:<18} recovery {:>5} s  {}",
            f.at_s,
            f.kind,
            r(f.recovery_s),
            f.note
        );
    }
    for (name, g) in &s.rss_growth_pct {
        println!("  rss growth after warm-up  {name:<12} {g:>6.1} %");
    }
    if let Some(g) = s.outbox_table {
        println!(
            "  outbox table after warm-up  {:.1} -> {:.1} MiB ({:+.0} %)",
            g.base_bytes as f64 / 1048576.0,
            g.end_bytes as f64 / 1048576.0,
            g.pct()
        );
    }
    for (table, peak) in &s.dead_rows_peak {
        println!(
            "  dead rows of {table:<16} at most {} after warm-up (bound {})",
            peak.map_or_else(|| "-".to_owned(), |p| p.to_string()),
            s.dead_rows_bound
        );
    }
    for n in &s.notes {
        println!("  note: {n}");
    }
    for f in s.failures() {
        println!("  failed: {f}");
    }
    println!("  target/soak/summary.json, samples.json and soak.svg written");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Result<Option<Args>, String> {
        parse_args(&list.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
    }

    #[test]
    fn arguments_are_read_and_unknown_ones_refused() {
        assert_eq!(
            args(&["--duration", "3m", "--rate", "500", "--seed", "1"]),
            Ok(Some(Args {
                duration: Duration::from_secs(180),
                rate: 500,
                seed: Some(1),
            }))
        );
        assert_eq!(
            args(&[]).map(|a| a.map(|a| (a.duration, a.rate))),
            Ok(Some((Duration::from_secs(3600), 1000)))
        );
        assert_eq!(
            args(&["--duration", "90s"]).map(|a| a.map(|a| a.duration)),
            Ok(Some(Duration::from_secs(90)))
        );
        assert_eq!(
            args(&["--duration", "30s"]),
            Err("--duration 30s is too short: at least 1m (faults need 90s and more)".into())
        );
        assert_eq!(args(&["--help"]), Ok(None));
        assert!(args(&["--quick"]).is_err());
        assert!(args(&["--rate"]).is_err());
        assert!(args(&["--rate", "0"]).is_err());
        assert!(args(&["--duration", "soon"]).is_err());
    }
}
