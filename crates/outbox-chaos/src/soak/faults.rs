//! The processes under test and the faults done to them, at the times of the
//! schedule. Every service a fault stops is held by the testkit's guard, which
//! starts it again when dropped: at the end of the fault, or when the run is
//! interrupted (the fault task is aborted and its guard dropped).

use std::time::{Duration, Instant};

use outbox_testkit::services;
use tokio::io::AsyncBufReadExt as _;
use tokio::process::{Child, Command};

use super::schedule::{FaultKind, Planned};
use super::verdict::FaultRecord;
use crate::world::{self, Coordination, SweepOpts, World};

/// How long Redis and the broker stay down.
const BROKER_DOWN: Duration = Duration::from_secs(3);
const REDIS_DOWN: Duration = Duration::from_secs(9);
/// How long the lock holder stays paused: past the sweep lock's lease (3 s) and the
/// claims' lease (5 s).
const PAUSE: Duration = Duration::from_secs(8);
/// How long to look for a relay holding the sweep lock.
const CATCH_HOLDER: Duration = Duration::from_secs(30);

/// The relays' retention of sent messages: the shortest that makes sense (any
/// positive duration is valid), so the outbox table stays at its backlog.
const RELAY_RETENTION: &str =
    "\n[retention]\nenabled = true\nsent_after = \"1s\"\ninterval = \"5s\"\nbatch_size = 5000\n";

/// The consumers' retention of consumed inbox rows: the least their validation
/// allows (one hour, so that a late copy still finds its row).
const CONSUMER_RETENTION: &str = "1h";

/// One process under test.
pub(crate) struct Proc {
    /// `relay-1`, `consumer-2`: kept by successors.
    pub(crate) name: String,
    /// 1 for the first, then each successor's number.
    n: u32,
    child: Child,
    /// A relay's `instance` (the holder named in the sweep lock).
    instance: Option<String>,
}

impl Proc {
    fn relay(w: &World, name: &str, n: u32) -> anyhow::Result<Self> {
        let run = format!("{name}.{n}");
        let cfg = w.relay_config(&run, Coordination::Redis, None, SweepOpts::default());
        let mut text = std::fs::read_to_string(&cfg)?;
        text.push_str(RELAY_RETENTION);
        std::fs::write(&cfg, text)?;
        Ok(Self {
            name: name.to_owned(),
            n,
            child: w.relay(&run, &cfg)?,
            instance: Some(format!("{run}-{}", w.id)),
        })
    }

    fn consumer(w: &World, name: &str, n: u32) -> anyhow::Result<Self> {
        Ok(Self {
            name: name.to_owned(),
            n,
            child: w.consumer(
                &format!("{name}.{n}"),
                &[("BILLING_RETENTION_CONSUMED_AFTER", CONSUMER_RETENTION)],
            )?,
            instance: None,
        })
    }

    fn pid(&self) -> Option<u32> {
        self.child.id()
    }
}

/// The two relays and two consumers.
pub(crate) struct Procs {
    pub(crate) relays: Vec<Proc>,
    pub(crate) consumers: Vec<Proc>,
}

impl Procs {
    pub(crate) fn start(w: &World) -> anyhow::Result<Self> {
        Ok(Self {
            relays: vec![Proc::relay(w, "relay-1", 1)?, Proc::relay(w, "relay-2", 1)?],
            consumers: vec![
                Proc::consumer(w, "consumer-1", 1)?,
                Proc::consumer(w, "consumer-2", 1)?,
            ],
        })
    }

    /// (name, pid) of every process running now.
    pub(crate) fn pids(&self) -> Vec<(String, u32)> {
        self.relays
            .iter()
            .chain(&self.consumers)
            .filter_map(|p| p.pid().map(|pid| (p.name.clone(), pid)))
            .collect()
    }

    /// SIGTERM to all; how many did not exit cleanly.
    pub(crate) async fn terminate_all(&mut self) -> u64 {
        let mut unclean = 0;
        for p in self.relays.drain(..).chain(self.consumers.drain(..)) {
            let name = format!("{}.{}", p.name, p.n);
            if !world::terminate(p.child).await {
                eprintln!("soak: {name} did not stop cleanly on SIGTERM");
                unclean += 1;
            }
        }
        unclean
    }
}

/// SIGCONT to a paused process when dropped.
struct Paused(u32);

impl Drop for Paused {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-CONT", &self.0.to_string()])
            .status();
    }
}

/// Injects the planned faults at their times; what was done, and when.
pub(crate) async fn run(
    w: &World,
    procs: &tokio::sync::Mutex<Procs>,
    plan: Vec<Planned>,
    t0: Instant,
) -> Vec<FaultRecord> {
    let mut done = Vec::new();
    for p in plan {
        tokio::time::sleep_until(tokio::time::Instant::from_std(
            t0 + Duration::from_secs_f64(p.at_s),
        ))
        .await;
        let at_s = t0.elapsed().as_secs_f64();
        eprintln!("soak: {at_s:>5.0} s  fault {}: starting", p.kind.name());
        let note = match inject(w, procs, p).await {
            Ok(note) => note,
            Err(e) => format!("the fault failed: {e:#}"),
        };
        let end_s = t0.elapsed().as_secs_f64();
        eprintln!(
            "soak: {end_s:>5.0} s  fault {}: over after {:.1} s: {note}",
            p.kind.name(),
            end_s - at_s
        );
        done.push(FaultRecord {
            at_s,
            end_s,
            kind: p.kind.name(),
            recovery_s: None,
            note,
        });
    }
    done
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> anyhow::Result<T> {
    Ok(tokio::task::spawn_blocking(f).await?)
}

async fn inject(
    w: &World,
    procs: &tokio::sync::Mutex<Procs>,
    p: Planned,
) -> anyhow::Result<String> {
    match p.kind {
        FaultKind::BrokerRestart => {
            let stopped = blocking(services::stop_rabbitmq).await?;
            tokio::time::sleep(BROKER_DOWN).await;
            anyhow::ensure!(
                blocking(move || stopped.restore()).await?,
                "RabbitMQ did not come back"
            );
            Ok(format!(
                "rabbitmqctl stop_app, {BROKER_DOWN:?} down, start_app"
            ))
        }
        FaultKind::RedisOutage => {
            let stopped = blocking(services::stop_redis).await?;
            tokio::time::sleep(REDIS_DOWN).await;
            anyhow::ensure!(
                blocking(move || stopped.restore()).await?,
                "Redis did not come back"
            );
            Ok(format!("Redis shut down for {REDIS_DOWN:?}"))
        }
        FaultKind::RelayKill | FaultKind::ConsumerKill => {
            let mut all = procs.lock().await;
            let relay = p.kind == FaultKind::RelayKill;
            let list = if relay {
                &mut all.relays
            } else {
                &mut all.consumers
            };
            let victim = &mut list[p.target % 2];
            let (name, n, pid) = (victim.name.clone(), victim.n, victim.pid());
            victim.child.start_kill()?;
            let _ = victim.child.wait().await;
            *victim = if relay {
                Proc::relay(w, &name, n + 1)?
            } else {
                Proc::consumer(w, &name, n + 1)?
            };
            Ok(format!(
                "SIGKILL to {name}.{n} (pid {}); {name}.{} started",
                pid.unwrap_or(0),
                n + 1
            ))
        }
        FaultKind::PgConnKill => {
            let n: i64 = sqlx::query_scalar(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1",
            )
            .bind(&w.proc_app)
            .fetch_one(&w.pool)
            .await?;
            Ok(format!(
                "pg_terminate_backend of the relays' and consumers' {n} connections"
            ))
        }
        FaultKind::LockHolderPause => pause_holder(w, procs).await,
    }
}

/// Catches the relay holding the sweep lock (Redis) while it holds it, SIGSTOPs it
/// past the leases, SIGCONTs it.
async fn pause_holder(w: &World, procs: &tokio::sync::Mutex<Procs>) -> anyhow::Result<String> {
    let holders: Vec<(String, String, u32)> = {
        let all = procs.lock().await;
        all.relays
            .iter()
            .filter_map(|r| Some((r.instance.clone()?, format!("{}.{}", r.name, r.n), r.pid()?)))
            .collect()
    };
    // One redis-cli polling the lock every 5 ms, rather than a process per poll.
    let mut poll = Command::new("redis-cli")
        .args([
            "-u",
            &w.urls.redis,
            "--raw",
            "-r",
            "-1",
            "-i",
            "0.005",
            "GET",
        ])
        .arg(&w.lock_key)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let out = poll
        .stdout
        .take()
        .ok_or_else(|| anyhow::anyhow!("no output from redis-cli"))?;
    let mut lines = tokio::io::BufReader::new(out).lines();
    let deadline = tokio::time::Instant::now() + CATCH_HOLDER;
    let mut tries = 0;
    loop {
        let line = tokio::select! {
            l = lines.next_line() => l?,
            () = tokio::time::sleep_until(deadline) => None,
        };
        let Some(value) = line else {
            return Ok(format!(
                "no relay was caught holding the sweep lock within {CATCH_HOLDER:?} ({tries} near misses); nothing paused"
            ));
        };
        let Some((_, name, pid)) = holders.iter().find(|(i, _, _)| {
            value
                .strip_prefix(i.as_str())
                .is_some_and(|rest| !rest.starts_with(|c: char| c.is_ascii_digit()))
        }) else {
            continue;
        };
        let _ = Command::new("kill")
            .args(["-STOP", &pid.to_string()])
            .status()
            .await;
        let paused = Paused(*pid);
        // Still the holder once stopped? (The lock may have gone in between.)
        let now = Command::new("redis-cli")
            .args(["-u", &w.urls.redis, "--raw", "GET"])
            .arg(&w.lock_key)
            .output()
            .await?;
        if String::from_utf8_lossy(&now.stdout).trim() != value.trim() {
            tries += 1;
            drop(paused);
            continue;
        }
        drop(poll);
        tokio::time::sleep(PAUSE).await;
        drop(paused);
        return Ok(format!(
            "{name} (pid {pid}) SIGSTOPped holding the sweep lock ({}) for {PAUSE:?}, past the lock's 3 s and the claims' 5 s leases; then SIGCONT",
            value.trim()
        ));
    }
}
