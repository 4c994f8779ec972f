//! `outbox-chaos`: the fault suite behind `cargo xtask chaos` (see RELIABILITY.md).
//!
//! Each scenario runs the real `outbox` relay and the example billing consumer as
//! processes against the local PostgreSQL, RabbitMQ and Redis, injects one kind of
//! fault, waits until every committed message is consumed or dead, and counts.
//! A scenario passes when nothing is lost and nothing took effect twice (and its own
//! checks hold). Services a scenario stops are started again even when it fails.
//!
//! Usage: `outbox-chaos [--quick] [--only NAME[,NAME...]]` (or `--generative
//! [--seed N] [--duration D]`, the generative checker); the programs under test
//! are found next to this one (`outbox`, `billing-consumer`). Prints a table and
//! writes `target/chaos/summary.json`; exits 1 if a scenario failed.

mod generative;
mod scenarios;
mod soak;
mod world;

use std::process::ExitCode;
use std::time::{Duration, Instant};

use outbox_testkit::services::{self, TestUrls as Urls};
use world::{Bins, Produced, Tally, World};

/// One scenario's outcome, as written to the summary.
#[derive(Debug, Clone, Default)]
pub(crate) struct Report {
    pub(crate) name: &'static str,
    pub(crate) enqueued: u64,
    pub(crate) committed: u64,
    pub(crate) delivered_unique: u64,
    pub(crate) consumed: u64,
    pub(crate) dead: u64,
    pub(crate) lost: u64,
    pub(crate) duplicate_deliveries: u64,
    pub(crate) duplicate_effects: u64,
    pub(crate) recovery_s: f64,
    /// The dead the scenario provokes on purpose (poison orders, foreign deliveries,
    /// bad rows); any other number of dead fails it, since a message that went dead
    /// for no reason the scenario gave is a defect, not a success.
    pub(crate) expected_dead: u64,
    /// Inputs a bad-input scenario tried, and how many were refused clearly (non-zero
    /// exit, a message naming the problem, nothing written, no secret shown). Such a
    /// scenario reports these instead of message counts.
    pub(crate) bad_inputs: u64,
    pub(crate) refused_clearly: u64,
    /// Checks of the scenario's own that failed (empty when it passed them all).
    pub(crate) failures: Vec<String>,
    /// What else was seen, for the reader.
    pub(crate) notes: Vec<String>,
}

impl Report {
    pub(crate) fn passed(&self) -> bool {
        self.lost == 0
            && self.duplicate_effects == 0
            && self.dead == self.expected_dead
            && self.refused_clearly == self.bad_inputs
            && self.failures.is_empty()
    }

    /// A scenario about bad input rather than messages.
    fn is_bad_input(&self) -> bool {
        self.bad_inputs > 0
    }

    fn json(&self) -> serde_json::Value {
        if self.is_bad_input() {
            return serde_json::json!({
                "name": self.name,
                "bad_inputs": self.bad_inputs,
                "refused_clearly": self.refused_clearly,
                "passed": self.passed(),
                "failures": self.failures,
                "notes": self.notes,
            });
        }
        serde_json::json!({
            "name": self.name,
            "enqueued": self.enqueued,
            "committed": self.committed,
            "delivered_unique": self.delivered_unique,
            "consumed": self.consumed,
            "dead": self.dead,
            "expected_dead": self.expected_dead,
            "lost": self.lost,
            "duplicate_deliveries": self.duplicate_deliveries,
            "duplicate_effects": self.duplicate_effects,
            "recovery_s": (self.recovery_s * 10.0).round() / 10.0,
            "passed": self.passed(),
            "failures": self.failures,
            "notes": self.notes,
        })
    }
}

/// What every scenario gets.
pub(crate) struct Ctx {
    pub(crate) urls: Urls,
    /// The local RabbitMQ cluster's AMQP URLs (`OUTBOX_TEST_CLUSTER_URLS`, else the
    /// xtask cluster's ports): `cluster_node_kill` needs them.
    pub(crate) cluster: Vec<String>,
    pub(crate) bins: Bins,
    pub(crate) quick: bool,
}

impl Ctx {
    /// Orders a streaming scenario creates.
    pub(crate) fn orders(&self) -> i64 {
        if self.quick { 1_500 } else { 5_000 }
    }

    /// Orders created a second while a fault happens.
    pub(crate) const RATE: u32 = 500;

    /// How long a scenario may take to account for every message after its fault.
    pub(crate) fn settle_timeout(&self) -> Duration {
        Duration::from_secs(if self.quick { 90 } else { 180 })
    }
}

/// Ends a streaming scenario: waits for quiescence, stops the processes, drains the
/// tap and fills the report. `fault_end` is when the last fault was undone.
pub(crate) async fn conclude(
    ctx: &Ctx,
    w: &World,
    mut report: Report,
    produced: Produced,
    fault_end: Instant,
    children: Vec<tokio::process::Child>,
) -> anyhow::Result<Report> {
    let (tally, quiet_at): (Tally, Instant) = w.settle(ctx.settle_timeout()).await?;
    let absorbed = w.duplicates_absorbed().await;
    let retried = w.retried().await;
    let mut unclean = 0;
    for c in children {
        if !world::terminate(c).await {
            unclean += 1;
        }
    }
    if unclean > 0 {
        report.failures.push(format!(
            "{unclean} process(es) did not stop cleanly on SIGTERM"
        ));
    }
    let (copies, unique) = w.drain_tap().await?;
    report.enqueued += produced.attempted;
    report.committed += tally.committed;
    report.delivered_unique += unique;
    report.duplicate_deliveries += copies - unique;
    report.consumed += tally.consumed;
    report.dead += tally.dead();
    report.lost += tally.unaccounted;
    report.duplicate_effects += tally.effects - tally.consumed;
    report.recovery_s = quiet_at.saturating_duration_since(fault_end).as_secs_f64();
    if retried > 0 {
        report.notes.push(format!(
            "{retried} messages needed more than one publish attempt"
        ));
    }
    if absorbed > 0 {
        report.notes.push(format!(
            "the consumers' inboxes absorbed {absorbed} duplicate deliveries"
        ));
    }
    if produced.errors > 0 {
        report.notes.push(format!(
            "{} order transactions failed during the fault (not committed, not counted as lost)",
            produced.errors
        ));
    }
    if report.dead != report.expected_dead {
        report.failures.push(format!(
            "{} dead, the scenario provokes {}",
            report.dead, report.expected_dead
        ));
    }
    if tally.publish_failed > 0 {
        report.failures.push(format!(
            "{} messages still publish_failed",
            tally.publish_failed
        ));
    }
    Ok(report)
}

/// The cluster's AMQP URLs: `OUTBOX_TEST_CLUSTER_URLS`, else the ports `cargo xtask
/// cluster up` uses (a scenario on a cluster that does not run fails; it is never
/// skipped).
fn cluster_urls() -> Vec<String> {
    let named = outbox_testkit::cluster::named_urls();
    if !named.is_empty() {
        return named;
    }
    (5681..=5683)
        .map(|port| format!("amqp://guest:guest@127.0.0.1:{port}/%2f"))
        .collect()
}

type ScenarioFn =
    for<'a> fn(&'a Ctx) -> std::pin::Pin<Box<dyn Future<Output = anyhow::Result<Report>> + 'a>>;

const SCENARIOS: &[(&str, bool, ScenarioFn)] = &[
    ("broker_restart", true, |c| {
        Box::pin(scenarios::broker_restart(c))
    }),
    ("relay_kill", true, |c| Box::pin(scenarios::relay_kill(c))),
    ("postgres_faults", true, |c| {
        Box::pin(scenarios::postgres_faults(c))
    }),
    ("redis_outage", false, |c| {
        Box::pin(scenarios::redis_outage(c))
    }),
    ("lease_lost", false, |c| Box::pin(scenarios::lease_lost(c))),
    ("racing", true, |c| Box::pin(scenarios::racing(c))),
    ("poison", true, |c| Box::pin(scenarios::poison(c))),
    ("bad_rows", true, |c| Box::pin(scenarios::bad_rows(c))),
    ("handler_db_faults", true, |c| {
        Box::pin(scenarios::handler_db_faults(c))
    }),
    ("bad_config", true, |c| Box::pin(scenarios::bad_config(c))),
    ("ordered", true, |c| Box::pin(scenarios::ordered(c))),
    ("exchange_lost", true, |c| {
        Box::pin(scenarios::exchange_lost(c))
    }),
    ("pause_resume", true, |c| {
        Box::pin(scenarios::pause_resume(c))
    }),
    ("inbox_outage_quorum", true, |c| {
        Box::pin(scenarios::inbox_outage_quorum(c))
    }),
    ("pg_lock_stall", true, |c| {
        Box::pin(scenarios::pg_lock_stall(c))
    }),
    ("cluster_node_kill", true, |c| {
        Box::pin(scenarios::cluster_node_kill(c))
    }),
    ("slow_network", false, |c| {
        Box::pin(scenarios::slow_network(c))
    }),
    ("network_blackhole", false, |c| {
        Box::pin(scenarios::network_blackhole(c))
    }),
];

#[allow(clippy::print_stdout)]
fn print_table(reports: &[Report]) {
    println!(
        "{:<16} {:>8} {:>9} {:>9} {:>8} {:>5} {:>5} {:>8} {:>8} {:>9}  result",
        "scenario",
        "enqueued",
        "committed",
        "delivered",
        "consumed",
        "dead",
        "lost",
        "dup.del",
        "dup.eff",
        "recover_s"
    );
    for r in reports {
        if r.is_bad_input() {
            println!(
                "{:<16} {} bad inputs, {} refused clearly{:>w$}  {}",
                r.name,
                r.bad_inputs,
                r.refused_clearly,
                "",
                if r.passed() { "passed" } else { "FAILED" },
                w = 30,
            );
            print_checks(r);
            continue;
        }
        println!(
            "{:<16} {:>8} {:>9} {:>9} {:>8} {:>5} {:>5} {:>8} {:>8} {:>9.1}  {}",
            r.name,
            r.enqueued,
            r.committed,
            r.delivered_unique,
            r.consumed,
            r.dead,
            r.lost,
            r.duplicate_deliveries,
            r.duplicate_effects,
            r.recovery_s,
            if r.passed() { "passed" } else { "FAILED" }
        );
        print_checks(r);
    }
}

#[allow(clippy::print_stdout)]
fn print_checks(r: &Report) {
    for f in &r.failures {
        println!("    failed: {f}");
    }
    for n in &r.notes {
        println!("    note: {n}");
    }
}

fn bins() -> anyhow::Result<Bins> {
    let here = std::env::current_exe()?;
    let dir = here
        .parent()
        .ok_or_else(|| anyhow::anyhow!("no directory for {}", here.display()))?;
    let bins = Bins {
        outbox: dir.join("outbox"),
        consumer: dir.join("billing-consumer"),
    };
    for b in [&bins.outbox, &bins.consumer] {
        anyhow::ensure!(
            b.exists(),
            "{} is missing: build it first (cargo xtask chaos does)",
            b.display()
        );
    }
    Ok(bins)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().is_some_and(|a| a == "soak") {
        return soak::main(&args[1..], bins()).await;
    }
    if args.iter().any(|a| a == "--generative") {
        let ctx = |bins| Ctx {
            urls: Urls::from_env(),
            cluster: cluster_urls(),
            bins,
            quick: false,
        };
        return generative::main(&args, ctx, bins()).await;
    }
    if args.iter().any(|a| a == "--help" || a == "-h") {
        let names: Vec<&str> = SCENARIOS.iter().map(|(s, _, _)| *s).collect();
        eprintln!(
            "usage: outbox-chaos [--quick] [--only NAME[,NAME...]]\n       outbox-chaos --generative [--seed N] [--duration D]\n       outbox-chaos soak [--duration 60m] [--rate 1000] [--seed N]\n\nscenarios: {}\n--quick runs those of CI with smaller streams; soak is the endurance run; see RELIABILITY.md",
            names.join(", ")
        );
        return ExitCode::SUCCESS;
    }
    let quick = args.iter().any(|a| a == "--quick");
    let only: Option<Vec<String>> = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .map(|v| v.split(',').map(str::to_owned).collect());
    let known =
        |i: usize, a: &str| matches!(a, "--quick" | "--only") || (i > 0 && args[i - 1] == "--only");
    if let Some((_, bad)) = args.iter().enumerate().find(|(i, a)| !known(*i, a)) {
        eprintln!(
            "outbox-chaos: unknown argument {bad:?}; usage: outbox-chaos [--quick] [--only NAME[,NAME...]]"
        );
        return ExitCode::from(2);
    }
    if let Some(list) = &only
        && let Some(bad) = list
            .iter()
            .find(|n| !SCENARIOS.iter().any(|(s, _, _)| s == n))
    {
        let names: Vec<&str> = SCENARIOS.iter().map(|(s, _, _)| *s).collect();
        eprintln!(
            "outbox-chaos: no scenario {bad:?}; the scenarios: {}",
            names.join(", ")
        );
        return ExitCode::from(2);
    }
    let bins = match bins() {
        Ok(b) => b,
        Err(e) => {
            eprintln!("outbox-chaos: {e:#}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = services::ensure_all_up() {
        eprintln!("outbox-chaos: {e}");
        return ExitCode::FAILURE;
    }
    let ctx = Ctx {
        urls: Urls::from_env(),
        cluster: cluster_urls(),
        bins,
        quick,
    };
    let started = Instant::now();
    let mut reports = Vec::new();
    for (name, in_quick, run) in SCENARIOS {
        let wanted = match &only {
            Some(list) => list.iter().any(|n| n == name),
            None => !quick || *in_quick,
        };
        if !wanted {
            continue;
        }
        eprintln!("chaos: {name}: starting");
        let t = Instant::now();
        let outcome = tokio::select! {
            r = run(&ctx) => r,
            _ = tokio::signal::ctrl_c() => {
                // The scenario's guards are dropped here, which restores what it
                // stopped; anything else still down is started below.
                eprintln!("chaos: interrupted during {name}; restoring the services");
                Err(anyhow::anyhow!("interrupted"))
            }
        };
        let interrupted = outcome
            .as_ref()
            .is_err_and(|e| e.to_string() == "interrupted");
        let report = match outcome {
            Ok(r) => r,
            Err(e) => Report {
                name,
                failures: vec![format!("{e:#}")],
                ..Report::default()
            },
        };
        if let Err(e) = services::ensure_all_up() {
            eprintln!("chaos: after {name}: {e}");
        }
        eprintln!(
            "chaos: {name}: {} in {:.0} s",
            if report.passed() { "passed" } else { "FAILED" },
            t.elapsed().as_secs_f64()
        );
        reports.push(report);
        if interrupted {
            break;
        }
    }
    print_table(&reports);
    let summary = serde_json::json!({
        "quick": quick,
        "duration_s": started.elapsed().as_secs(),
        "scenarios": reports.iter().map(Report::json).collect::<Vec<_>>(),
    });
    let written = std::fs::create_dir_all("target/chaos").and_then(|()| {
        std::fs::write(
            "target/chaos/summary.json",
            serde_json::to_string_pretty(&summary).unwrap_or_default() + "\n",
        )
    });
    if let Err(e) = written {
        eprintln!("outbox-chaos: cannot write target/chaos/summary.json: {e}");
        return ExitCode::FAILURE;
    }
    eprintln!(
        "chaos: {} scenarios in {:.0} s; target/chaos/summary.json written",
        reports.len(),
        started.elapsed().as_secs_f64()
    );
    if reports.iter().all(Report::passed) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

#[cfg(test)]
mod tests {
    use super::Report;

    fn clean() -> Report {
        Report {
            name: "t",
            committed: 10,
            consumed: 10,
            ..Report::default()
        }
    }

    #[test]
    fn a_scenario_passes_only_with_exactly_the_dead_it_provokes() {
        assert!(clean().passed());
        let unexpected = Report { dead: 1, ..clean() };
        assert!(!unexpected.passed(), "a message dead for no reason");
        let provoked = Report {
            dead: 3,
            expected_dead: 3,
            ..clean()
        };
        assert!(provoked.passed());
        let missing = Report {
            dead: 2,
            expected_dead: 3,
            ..clean()
        };
        assert!(!missing.passed(), "a provoked dead that did not happen");
    }

    #[test]
    fn a_bad_input_scenario_passes_only_when_every_input_was_refused_clearly() {
        let r = Report {
            name: "bad",
            bad_inputs: 13,
            refused_clearly: 12,
            ..Report::default()
        };
        assert!(!r.passed());
        assert!(
            Report {
                refused_clearly: 13,
                ..r
            }
            .passed()
        );
    }
}
