//! What several scenarios share: their report, the check that a service they stop
//! is the local one, the usual relay and consumer, waiting for committed orders,
//! a broker that refuses publishes for a while, and the relay's `/readyz`.

use std::time::Duration;

use tokio::process::Command;

use crate::Report;
use crate::world::{Coordination, SweepOpts, World};
use outbox_testkit::services;

pub(super) fn report(name: &'static str) -> Report {
    Report {
        name,
        ..Report::default()
    }
}

/// Fails unless `url` is the local server at `addr`: only those may be stopped.
pub(super) fn require_local(url: &str, addr: &str, what: &str) -> anyhow::Result<()> {
    anyhow::ensure!(
        services::is_local(url, addr),
        "this scenario stops {what} and needs the local server at {addr}, not {}",
        outbox_core::config::redact_url(url)
    );
    Ok(())
}

/// One relay (lock in PostgreSQL) and one consumer.
pub(super) fn relay_and_consumer(
    w: &World,
) -> anyhow::Result<(tokio::process::Child, tokio::process::Child)> {
    let cfg = w.relay_config("r1", Coordination::Postgres, None, SweepOpts::default());
    Ok((w.relay("r1", &cfg)?, w.consumer("c1", &[])?))
}

pub(super) async fn wait_committed(w: &World, at_least: u64) -> anyhow::Result<()> {
    w.wait_until(
        &format!("{at_least} committed orders"),
        Duration::from_secs(60),
        async |w| w.committed().await >= at_least,
    )
    .await
}

/// Makes the broker refuse every message for the scenario's queues (a policy of
/// `max-length` 0 with `reject-publish`: publishes are nacked), so every publish
/// fails while the topology stays as it is. Dropping the guard lifts the policy.
struct Refusing {
    name: String,
    lifted: bool,
}

impl Refusing {
    async fn start(w: &World) -> anyhow::Result<Self> {
        let name = format!("chaos-{}", w.id);
        let pattern = format!("^chaos\\.{}\\.(billing|tap)$", w.id);
        let ok = Command::new("rabbitmqctl")
            .args([
                "set_policy",
                "--apply-to",
                "queues",
                "--priority",
                "100",
                &name,
                &pattern,
                r#"{"max-length":0,"overflow":"reject-publish"}"#,
            ])
            .output()
            .await?;
        anyhow::ensure!(
            ok.status.success(),
            "rabbitmqctl set_policy failed: {}",
            String::from_utf8_lossy(&ok.stderr)
        );
        Ok(Self {
            name,
            lifted: false,
        })
    }

    fn clear(name: &str) -> bool {
        std::process::Command::new("rabbitmqctl")
            .args(["clear_policy", name])
            .output()
            .is_ok_and(|o| o.status.success())
    }

    fn lift(mut self) -> anyhow::Result<()> {
        self.lifted = true;
        anyhow::ensure!(Self::clear(&self.name), "rabbitmqctl clear_policy failed");
        Ok(())
    }
}

impl Drop for Refusing {
    fn drop(&mut self) {
        if !self.lifted {
            Self::clear(&self.name);
        }
    }
}

/// Produces `n` orders quickly while the broker refuses them, waits until all have
/// failed their first publish, and lifts the refusal.
pub(super) async fn produce_failing(w: &World, n: i64) -> anyhow::Result<crate::Produced> {
    let refusing = Refusing::start(w).await?;
    let produced = w.produce(1, n, 2_000).finish().await;
    w.wait_until(
        "every message to fail its first publish",
        Duration::from_secs(60),
        async |w| {
            w.tally()
                .await
                .is_ok_and(|t| t.publish_failed + t.dead_outbox == t.committed)
        },
    )
    .await?;
    refusing.lift()?;
    Ok(produced)
}

pub(super) async fn publish_failed(w: &World) -> u64 {
    w.tally().await.map_or(u64::MAX, |t| t.publish_failed)
}

/// The HTTP status of `127.0.0.1:port/readyz`.
pub(super) async fn readyz(port: u16) -> Option<u16> {
    let out = Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "5",
            &format!("http://127.0.0.1:{port}/readyz"),
        ])
        .output()
        .await
        .ok()?;
    String::from_utf8_lossy(&out.stdout).trim().parse().ok()
}
