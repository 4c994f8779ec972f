//! Holds the row locks of a batch the relay has claimed for 10 s from another
//! session; checks that the relay's readiness fails naming the stall (and
//! `outbox_relay_stalled` is 1) within `stall_after` plus a little, and clears by
//! itself once the lock is gone.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use tokio::process::Command;

use super::support::{readyz, report, wait_committed};
use crate::world::{Coordination, SweepOpts, World, free_port, metric};
use crate::{Ctx, Report, conclude};

/// `127.0.0.1:port/readyz`: its HTTP status and body.
async fn readyz_body(port: u16) -> Option<(u16, String)> {
    let out = Command::new("curl")
        .args([
            "-s",
            "-w",
            "\n%{http_code}",
            "--max-time",
            "5",
            &format!("http://127.0.0.1:{port}/readyz"),
        ])
        .output()
        .await
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n')?;
    Some((code.trim().parse().ok()?, body.to_owned()))
}

/// Scenario 13: another session (an operator's forgotten `SELECT ... FOR UPDATE`)
/// holds the row locks of a batch the relay has claimed and is about to mark, for
/// 10 s. The relay's statements wait at most `lock_timeout` and are tried again;
/// its readiness must fail (503 naming the stall, `outbox_relay_stalled` 1) within
/// `stall_after` plus a few seconds, and clear by itself once the lock is gone.
pub(crate) async fn pg_lock_stall(ctx: &Ctx) -> anyhow::Result<Report> {
    const STALL_AFTER: Duration = Duration::from_secs(3);
    const HOLD: Duration = Duration::from_secs(10);
    // The watchdog's tick, the last claim completing after the lock was taken, one
    // lock wait: what readiness may take beyond `stall_after` to turn red.
    const SLACK: Duration = Duration::from_secs(3);
    let w = World::new("pglock", &ctx.urls, &ctx.bins).await?;
    let port = free_port()?;
    let cfg = w.relay_config(
        "r1",
        Coordination::Postgres,
        Some(port),
        SweepOpts::default(),
    );
    // Bounds a careful operator could choose for this small test; the claims' lease
    // outlasts the hold (as the default 60 s does), so the rows stay the relay's and
    // its mark lands once the lock is gone, instead of the rows being published again.
    let text = std::fs::read_to_string(&cfg)
        .with_context(|| format!("read {}", cfg.display()))?
        .replace(
            "max_connections = 4\n",
            "max_connections = 4\nstatement_timeout = \"5s\"\nlock_timeout = \"500ms\"\n",
        )
        .replace(
            &format!("lease_ttl = \"{}s\"", crate::world::LEASE_TTL.as_secs()),
            "lease_ttl = \"30s\"",
        )
        + &format!("[health]\nstall_after = \"{}s\"\n", STALL_AFTER.as_secs());
    std::fs::write(&cfg, text).with_context(|| format!("write {}", cfg.display()))?;
    let relay = w.relay("r1", &cfg)?;
    let consumer = w.consumer("c1", &[])?;
    let n = ctx.orders();
    let producer = w.produce(1, n, Ctx::RATE);
    wait_committed(&w, n as u64 / 3).await?;
    let mut r = report("pg_lock_stall");
    let before = readyz(port).await;
    if before != Some(200) {
        r.failures.push(format!(
            "/readyz answered {before:?} before the lock, not 200"
        ));
    }
    // A batch caught between its claim and its mark: pending rows under a live
    // lease. FOR UPDATE waits for a claim in progress and re-checks the row, so
    // what it returns is claimed, unmarked, and now locked by this session.
    let o = w.shop.outbox_schema.quoted();
    let catch = format!(
        "SELECT id FROM {o}.outbox_messages WHERE status = 'pending' \
         AND locked_until > now() FOR UPDATE"
    );
    let looking = Instant::now();
    let (holder, locked) = loop {
        let mut tx = w.pool.begin().await?;
        let ids: Vec<uuid::Uuid> = sqlx::query_scalar(sqlx::AssertSqlSafe(&*catch))
            .fetch_all(&mut *tx)
            .await?;
        if !ids.is_empty() {
            break (tx, ids.len());
        }
        tx.rollback().await?;
        anyhow::ensure!(
            looking.elapsed() < Duration::from_secs(30),
            "no batch was caught between its claim and its mark in 30 s"
        );
    };
    let locked_at = Instant::now();
    let mut red_after = None;
    let mut gauge_red = None;
    while locked_at.elapsed() < HOLD {
        if red_after.is_none()
            && let Some((503, body)) = readyz_body(port).await
            && body.contains("stalled")
        {
            red_after = Some(locked_at.elapsed());
            gauge_red = metric(port, "outbox_relay_stalled").await;
            r.notes.push(format!(
                "/readyz while locked: {}",
                body.trim().replace('\n', "; ")
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let sent_while_locked = w.sent().await;
    holder.rollback().await?;
    let fault_end = Instant::now();
    let mut green_after = None;
    while fault_end.elapsed() < Duration::from_secs(30) {
        if readyz(port).await == Some(200) {
            green_after = Some(fault_end.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let gauge_green = metric(port, "outbox_relay_stalled").await;
    r.notes.push(format!(
        "{locked} claimed rows locked for {}s ({sent_while_locked} sent by its end); readiness red after {:.1}s, green {:.1}s after the release",
        HOLD.as_secs(),
        red_after.map_or(f64::NAN, |d| d.as_secs_f64()),
        green_after.map_or(f64::NAN, |d| d.as_secs_f64()),
    ));
    match red_after {
        Some(d) if d <= STALL_AFTER + SLACK => {}
        Some(d) => r.failures.push(format!(
            "readiness turned red only after {d:?}, beyond stall_after {STALL_AFTER:?} + {SLACK:?}"
        )),
        None => r.failures.push(format!(
            "readiness never failed naming the stall in the {HOLD:?} the lock was held"
        )),
    }
    if red_after.is_some() && gauge_red != Some(1.0) {
        r.failures.push(format!(
            "outbox_relay_stalled was {gauge_red:?} while red, not 1"
        ));
    }
    match green_after {
        Some(d) if d <= Duration::from_secs(10) => {}
        other => r.failures.push(format!(
            "readiness did not clear within 10 s of the release ({other:?})"
        )),
    }
    if gauge_green != Some(0.0) {
        r.failures.push(format!(
            "outbox_relay_stalled was {gauge_green:?} after the release, not 0"
        ));
    }
    let produced = producer.finish().await;
    let r = conclude(ctx, &w, r, produced, fault_end, vec![relay, consumer]).await?;
    let passed = r.passed();
    w.cleanup(!passed).await;
    Ok(r)
}
