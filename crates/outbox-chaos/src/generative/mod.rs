//! `outbox-chaos --generative`: random workloads drawn from a seed, and a checker
//! of every message's fate (see RELIABILITY.md, "The generative checker").
//!
//! A round draws a [`Plan`] from its seed (settings, producer transactions by the
//! library and by plain SQL, faults and operator actions on a timeline), runs it
//! against the real PostgreSQL, RabbitMQ and Redis with the real relay and billing
//! consumer processes ([`run`]), and [`check`]s what became of every committed
//! message: none lost, none applied twice, no key out of order, none stuck once
//! the round's time to settle is up. Rounds follow each other for `--duration`,
//! seed after seed; the seeds in [`REGRESSIONS`] (each found a defect once) go
//! first. A failing round prints its seed: `--seed N` runs that plan again.
//!
//! Writes `target/chaos/generative.json`; exits 1 on any violation.

mod check;
mod plan;
mod run;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use check::Kind;
use plan::Plan;

use crate::Ctx;
use crate::world::Bins;

const USAGE: &str = "usage: outbox-chaos --generative [--seed N] [--duration D] [--no-replay]\n\n  --seed N      the first round's seed (default: the seeds of generative-seeds.txt, then\n                one from the clock); alone, without --duration, one round of that seed\n  --duration D  run rounds (about 50 s each) for D (90s, 3m, 1h); the next round's seed\n                is the last one's plus one\n  --no-replay   skip the operator's replays the plans draw (run by default since\n                issue 47's defect 2 was fixed; --replay is accepted and changes nothing)\n  --plans N     print the plans of the first N seeds the run would go through; run nothing\n\nwrites target/chaos/generative.json; exits 1 on any lost, twice-applied, out-of-order\nor stuck message, or any message of an exchange paused throughout that moved; see\nRELIABILITY.md";

/// Seeds that once found a defect, run first by every `--duration` run: a failing
/// seed becomes a test by a line in this file (with a comment on what it found).
const REGRESSIONS: &str = include_str!("../../generative-seeds.txt");

/// About how long a round takes: its production, settling and setup.
const ROUND_ESTIMATE: Duration = Duration::from_secs(Plan::PRODUCTION_MS / 1000 + 20);

/// At most this many violations of a round are listed in the JSON, the worst
/// kinds first (all are counted).
const LISTED: usize = 200;

#[derive(Debug, Clone, PartialEq, Eq)]
struct Args {
    seed: Option<u64>,
    duration: Option<Duration>,
    /// Run the operator's replays the plans draw (the default; `--no-replay`
    /// skips them, as every run did while issue 47's defect 2, a replay of a dead
    /// message that was delivered applied twice, was open).
    replay: bool,
    /// Print the plans of the seeds the run would go through (for `--duration`,
    /// as many as `--plans N` says), run nothing.
    plans: Option<usize>,
}

/// `Ok(None)`: `--help`.
fn parse_args(args: &[String]) -> Result<Option<Args>, String> {
    let mut a = Args {
        seed: None,
        duration: None,
        replay: true,
        plans: None,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || it.next().cloned().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--help" | "-h" => return Ok(None),
            "--generative" => {}
            "--replay" => a.replay = true,
            "--no-replay" => a.replay = false,
            "--plans" if a.plans.is_none() => {
                let v = value()?;
                a.plans = Some(v.parse().map_err(|_| format!("--plans {v:?}: a number"))?);
            }
            "--seed" if a.seed.is_none() => {
                let v = value()?;
                a.seed = Some(v.parse().map_err(|_| format!("--seed {v:?}: a number"))?);
            }
            "--duration" if a.duration.is_none() => {
                let v = value()?;
                a.duration = Some(outbox_core::duration::parse(&v)?);
            }
            "--seed" | "--duration" | "--plans" => return Err(format!("{flag} given twice")),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(Some(a))
}

/// The seeds of [`REGRESSIONS`]: the first number of each line that is not a
/// comment.
fn regression_seeds(text: &str) -> Vec<u64> {
    text.lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter_map(|l| l.split_whitespace().next())
        .filter_map(|s| s.parse().ok())
        .collect()
}

/// The seeds a run goes through, lazily: `--seed` alone is that seed once;
/// otherwise the regressions, then `first` (or the clock's) and on.
fn seeds(args: &Args) -> Box<dyn Iterator<Item = u64>> {
    match (args.seed, args.duration) {
        (Some(s), None) => Box::new(std::iter::once(s)),
        (seed, _) => {
            let first = seed.unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(1, |d| d.as_secs())
            });
            Box::new(regression_seeds(REGRESSIONS).into_iter().chain(first..))
        }
    }
}

/// One round's result for the summary.
struct RoundReport {
    seed: u64,
    json: serde_json::Value,
    violations: Vec<check::Violation>,
    /// The round could not run (its setup or reading failed).
    error: Option<String>,
}

/// Copies the programs under test into `target/chaos/generative-bin/<pid>`, so a
/// long run keeps using them (successors of killed processes too) whatever is
/// rebuilt meanwhile, and another run's copies never replace them.
fn copy_bins(from: &Bins) -> anyhow::Result<Bins> {
    let dir = bin_dir();
    let dir = dir.as_path();
    std::fs::create_dir_all(dir)?;
    let copy = |src: &PathBuf| -> anyhow::Result<PathBuf> {
        let name = src
            .file_name()
            .ok_or_else(|| anyhow::anyhow!("no file name in {}", src.display()))?;
        let dst = dir.join(name);
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

fn bin_dir() -> PathBuf {
    Path::new("target/chaos/generative-bin").join(std::process::id().to_string())
}

async fn round(ctx: &Ctx, seed: u64, replay: bool) -> RoundReport {
    let plan = Plan::draw(seed);
    eprintln!("generative: seed {seed}: {}", plan.describe());
    let describe = plan.describe();
    let started = Instant::now();
    let finished = match run::run(ctx, plan, replay).await {
        Ok(f) => f,
        Err(e) => {
            return RoundReport {
                seed,
                json: serde_json::json!({"seed": seed, "plan": describe, "error": format!("{e:#}")}),
                violations: Vec::new(),
                error: Some(format!("{e:#}")),
            };
        }
    };
    let mut v = check::check(&finished.observed, true);
    v.violations.sort_by_key(|x| x.kind);
    let fates: serde_json::Map<String, serde_json::Value> = v
        .fates
        .iter()
        .map(|(f, n)| (format!("{f:?}"), serde_json::json!(n)))
        .collect();
    let passed = v.violations.is_empty() && finished.exited.is_empty();
    let json = serde_json::json!({
        "seed": seed,
        "plan": describe,
        "messages": v.messages,
        "fates": fates,
        "lost": v.count(Kind::Lost),
        "duplicate_effects": v.count(Kind::DuplicateEffect),
        "out_of_order": v.count(Kind::OutOfOrder),
        "stuck": v.count(Kind::Stuck),
        "pause_broken": v.count(Kind::PauseBroken),
        "duplicate_deliveries": v.duplicate_deliveries,
        "dead_but_delivered": v.dead_but_delivered,
        "settled_s": finished.settled_in.map(|d| (d.as_secs_f64() * 10.0).round() / 10.0),
        "duration_s": started.elapsed().as_secs(),
        "logs": finished.world.dir.display().to_string(),
        "notes": finished.notes,
        "exited": finished.exited,
        "passed": passed,
    });
    eprintln!(
        "generative: seed {seed}: {} messages, {} lost, {} duplicate effects, {} out of order, {} stuck, {} paused moved ({} dead-but-delivered, {} duplicate deliveries) in {:.0} s: {}",
        v.messages,
        v.count(Kind::Lost),
        v.count(Kind::DuplicateEffect),
        v.count(Kind::OutOfOrder),
        v.count(Kind::Stuck),
        v.count(Kind::PauseBroken),
        v.dead_but_delivered,
        v.duplicate_deliveries,
        started.elapsed().as_secs_f64(),
        if passed { "passed" } else { "FAILED" }
    );
    for n in &finished.notes {
        eprintln!("generative: seed {seed}: note: {n}");
    }
    for x in &finished.exited {
        eprintln!("generative: seed {seed}: FAILED: {x}");
    }
    for x in v.violations.iter().take(20) {
        eprintln!(
            "generative: seed {seed}: {:?} {}: {}",
            x.kind, x.message_id, x.what
        );
    }
    if !passed {
        eprintln!(
            "generative: seed {seed} FAILED; run it again with `cargo xtask chaos --generative --seed {seed}`; logs in {}",
            finished.world.dir.display()
        );
    }
    finished.world.cleanup(!passed).await;
    RoundReport {
        seed,
        json,
        violations: v.violations,
        error: (!finished.exited.is_empty()).then(|| finished.exited.join("; ")),
    }
}

/// Runs the generative checker; the exit code of `outbox-chaos --generative`.
#[allow(clippy::print_stdout)]
pub(crate) async fn main(
    args: &[String],
    ctx: impl FnOnce(Bins) -> Ctx,
    bins: anyhow::Result<Bins>,
) -> ExitCode {
    let args = match parse_args(args) {
        Ok(Some(a)) => a,
        Ok(None) => {
            eprintln!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("outbox-chaos --generative: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    if let Some(n) = args.plans {
        for seed in seeds(&args).take(n) {
            println!("seed {seed}: {}", Plan::draw(seed).describe());
        }
        return ExitCode::SUCCESS;
    }
    let bins = match bins.and_then(|b| copy_bins(&b)) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("outbox-chaos --generative: {e:#}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = outbox_testkit::services::ensure_all_up() {
        eprintln!("outbox-chaos --generative: {e}");
        return ExitCode::FAILURE;
    }
    let ctx = ctx(bins);
    let started = Instant::now();
    let mut reports: Vec<RoundReport> = Vec::new();
    for seed in seeds(&args) {
        let out_of_time = args
            .duration
            .is_none_or(|d| started.elapsed() + ROUND_ESTIMATE > d);
        if !reports.is_empty() && out_of_time {
            break;
        }
        let r = tokio::select! {
            r = round(&ctx, seed, args.replay) => r,
            _ = tokio::signal::ctrl_c() => {
                eprintln!("generative: interrupted during seed {seed}");
                reports.push(RoundReport {
                    seed,
                    json: serde_json::json!({"seed": seed, "error": "interrupted"}),
                    violations: Vec::new(),
                    error: Some("interrupted".to_owned()),
                });
                break;
            }
        };
        reports.push(r);
    }
    let all: Vec<(u64, &check::Violation)> = reports
        .iter()
        .flat_map(|r| r.violations.iter().map(move |v| (r.seed, v)))
        .collect();
    let listed: Vec<(u64, &check::Violation)> = reports
        .iter()
        .flat_map(|r| r.violations.iter().take(LISTED).map(move |v| (r.seed, v)))
        .collect();
    let count = |k: Kind| all.iter().filter(|(_, v)| v.kind == k).count();
    let failed_seeds: Vec<u64> = reports
        .iter()
        .filter(|r| !r.violations.is_empty() || r.error.is_some())
        .map(|r| r.seed)
        .collect();
    let messages: u64 = reports
        .iter()
        .filter_map(|r| r.json.get("messages").and_then(serde_json::Value::as_u64))
        .sum();
    let summary = serde_json::json!({
        "seeds": reports.iter().map(|r| r.seed).collect::<Vec<_>>(),
        "messages": messages,
        "lost": count(Kind::Lost),
        "duplicate_effects": count(Kind::DuplicateEffect),
        "out_of_order": count(Kind::OutOfOrder),
        "stuck": count(Kind::Stuck),
        "pause_broken": count(Kind::PauseBroken),
        "violations": listed.iter().map(|(seed, v)| serde_json::json!({
            "seed": seed,
            "message_id": v.message_id.to_string(),
            "what": format!("{}: {}", kind_name(v.kind), v.what),
        })).collect::<Vec<_>>(),
        "violations_listed": listed.len(),
        "violations_total": all.len(),
        "failed_seeds": failed_seeds,
        "errors": reports.iter().filter_map(|r| r.error.as_ref().map(|e| serde_json::json!({"seed": r.seed, "error": e}))).collect::<Vec<_>>(),
        "duration_s": started.elapsed().as_secs(),
        "rounds": reports.iter().map(|r| r.json.clone()).collect::<Vec<_>>(),
    });
    let _ = std::fs::remove_dir_all(bin_dir());
    let written = std::fs::create_dir_all("target/chaos").and_then(|()| {
        std::fs::write(
            "target/chaos/generative.json",
            serde_json::to_string_pretty(&summary).unwrap_or_default() + "\n",
        )
    });
    if let Err(e) = written {
        eprintln!("outbox-chaos --generative: cannot write target/chaos/generative.json: {e}");
        return ExitCode::FAILURE;
    }
    eprintln!(
        "generative: {} rounds (seeds {:?}) in {:.0} s, {messages} messages: {} lost, {} duplicate effects, {} out of order, {} stuck, {} paused moved; target/chaos/generative.json written",
        reports.len(),
        reports.iter().map(|r| r.seed).collect::<Vec<_>>(),
        started.elapsed().as_secs_f64(),
        count(Kind::Lost),
        count(Kind::DuplicateEffect),
        count(Kind::OutOfOrder),
        count(Kind::Stuck),
        count(Kind::PauseBroken),
    );
    if failed_seeds.is_empty() {
        ExitCode::SUCCESS
    } else {
        eprintln!("generative: FAILED seeds: {failed_seeds:?}");
        ExitCode::FAILURE
    }
}

fn kind_name(k: Kind) -> &'static str {
    match k {
        Kind::Lost => "lost",
        Kind::DuplicateEffect => "duplicate effect",
        Kind::OutOfOrder => "out of order",
        Kind::Stuck => "stuck",
        Kind::PauseBroken => "pause broken",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Result<Option<Args>, String> {
        parse_args(&list.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
    }

    #[test]
    fn arguments() {
        assert_eq!(
            args(&["--generative", "--seed", "5", "--duration", "3m"]),
            Ok(Some(Args {
                seed: Some(5),
                duration: Some(Duration::from_secs(180)),
                replay: true,
                plans: None,
            }))
        );
        assert_eq!(
            args(&["--no-replay"]).map(|a| a.map(|a| a.replay)),
            Ok(Some(false))
        );
        assert_eq!(args(&["--help"]), Ok(None));
        assert!(args(&["--seed"]).is_err());
        assert!(args(&["--seed", "x"]).is_err());
        assert!(args(&["--seed", "1", "--seed", "2"]).is_err());
        assert!(args(&["--duration", "soon"]).is_err());
        assert!(args(&["--quick"]).is_err());
    }

    #[test]
    fn a_seed_alone_is_one_round_and_a_duration_runs_the_regressions_first() {
        let one: Vec<u64> = seeds(&Args {
            seed: Some(9),
            duration: None,
            replay: false,
            plans: None,
        })
        .collect();
        assert_eq!(one, vec![9]);
        let many: Vec<u64> = seeds(&Args {
            seed: Some(100),
            duration: Some(Duration::from_secs(60)),
            replay: true,
            plans: None,
        })
        .take(regression_seeds(REGRESSIONS).len() + 2)
        .collect();
        let mut expected = regression_seeds(REGRESSIONS);
        expected.extend([100, 101]);
        assert_eq!(many, expected);
    }

    #[test]
    fn regression_seeds_are_read_with_their_comments() {
        assert_eq!(
            regression_seeds("# header\n\n12  # found X\n 7\nnot-a-seed\n"),
            vec![12, 7]
        );
    }
}
