//! Pauses (SIGSTOP) the relay holding the sweep lock past its lease; checks that
//! the other relay sweeps meanwhile, that the first, resumed, logs the lost lock
//! and stops its sweep, and that the sweep state carries a newer fencing token.

use std::time::{Duration, Instant};

use tokio::process::Command;

use super::support::{produce_failing, publish_failed, report};
use crate::world::{Coordination, SweepOpts, World, signal};
use crate::{Ctx, Report, conclude};

async fn redis_get(url: &str, key: &str) -> Option<String> {
    let out = Command::new("redis-cli")
        .args(["-u", url, "--raw", "GET", key])
        .output()
        .await
        .ok()?;
    let v = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    (!v.is_empty()).then_some(v)
}

/// `fencing_token=N` (a tracing field) or `"fencing_token":N` (JSON) in `text`.
fn fencing_token(text: &str) -> Option<u64> {
    let at = text.find("fencing_token")? + "fencing_token".len();
    text[at..]
        .trim_start_matches(['=', '"', ':'])
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .ok()
}

/// Scenario 5: The relay sweeping under the lock is paused (SIGSTOP) past its lease; the
/// other relay takes over; the first, resumed, stops and records nothing.
pub(crate) async fn lease_lost(ctx: &Ctx) -> anyhow::Result<Report> {
    let w = World::new("lease", &ctx.urls, &ctx.bins).await?;
    let sweep = SweepOpts {
        batch_size: 5,
        max_batches: 100_000,
        lock_ttl: "2s",
    };
    let names = ["ra", "rb"];
    let mut relays = Vec::new();
    for name in names {
        let cfg = w.relay_config(name, Coordination::Redis, None, sweep);
        relays.push(w.relay(name, &cfg)?);
    }
    let consumer = w.consumer("c1", &[])?;
    let produced = produce_failing(&w, if ctx.quick { 2_000 } else { 4_000 }).await?;
    // Catch the holder in the middle of its sweep.
    let deadline = Instant::now() + Duration::from_secs(30);
    let holder = loop {
        if let Some(v) = redis_get(&w.urls.redis, &w.lock_key).await
            && let Some(i) = names.iter().position(|n| v.starts_with(&format!("{n}-")))
        {
            break i;
        }
        anyhow::ensure!(Instant::now() < deadline, "no relay took the sweep lock");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    signal(&relays[holder], "-STOP").await;
    let at_pause = publish_failed(&w).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after_pause = publish_failed(&w).await;
    let taken_over = redis_get(&w.urls.redis, &w.lock_key).await;
    signal(&relays[holder], "-CONT").await;
    let fault_end = Instant::now();
    let mut r = report("lease_lost");
    if after_pause >= at_pause {
        r.failures.push(format!(
            "the other relay did not sweep while {} was paused ({at_pause} -> {after_pause} failed)",
            names[holder]
        ));
    }
    r.notes.push(format!(
        "{} paused 5 s mid-sweep (lease 2 s); meanwhile the other relay retried {} messages; lock then {}",
        names[holder],
        at_pause.saturating_sub(after_pause),
        taken_over.as_deref().map_or("free", |v| v.split('/').next().unwrap_or(v))
    ));
    let mut r = conclude(
        ctx,
        &w,
        r,
        produced,
        fault_end,
        relays.into_iter().chain([consumer]).collect(),
    )
    .await?;
    let log =
        std::fs::read_to_string(w.dir.join(format!("{}.log", names[holder]))).unwrap_or_default();
    let lost_line = log
        .lines()
        .find(|l| l.contains("retry lock lost during the sweep"));
    match lost_line.and_then(fencing_token) {
        None => r.failures.push(format!(
            "{} did not stop its sweep on losing the lock (no 'retry lock lost' in its log)",
            names[holder]
        )),
        Some(lost) => {
            let stored = redis_get(&w.urls.redis, &w.state_key)
                .await
                .as_deref()
                .and_then(fencing_token);
            match stored {
                Some(s) if s > lost => r.notes.push(format!(
                    "sweep state carries token {s}, newer than the lost lease's {lost}"
                )),
                other => r.failures.push(format!(
                    "sweep state token {other:?} is not newer than the lost lease's {lost}"
                )),
            }
        }
    }
    let fenced = log.lines().filter(|l| l.contains("fenced")).count();
    r.notes.push(format!(
        "{fenced} log lines of the paused relay report fenced (refused) marks"
    ));
    let passed = r.passed();
    w.cleanup(!passed).await;
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::fencing_token;

    #[test]
    fn fencing_tokens_are_read_from_log_lines_and_json() {
        assert_eq!(
            fencing_token(
                "WARN outbox_runtime::sweeper: retry lock lost task=\"publish-retry\" fencing_token=1796044583355966 ..."
            ),
            Some(1_796_044_583_355_966)
        );
        assert_eq!(
            fencing_token(r#"{"completed_at":"x","fencing_token":42,"publish_retried":1}"#),
            Some(42)
        );
        assert_eq!(fencing_token("no token here"), None);
        assert_eq!(fencing_token("fencing_token=abc"), None);
    }
}
