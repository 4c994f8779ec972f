//! The local 3-node RabbitMQ cluster of `cargo xtask cluster up` for tests that need
//! more than one broker node: its URLs from `OUTBOX_TEST_CLUSTER_URLS`, and stopping
//! a node's broker with a guard that starts it again when dropped (so a failing test
//! never leaves a node down). Node `outbox-cluster-N@localhost` serves AMQP on port
//! `5680 + N`, as the xtask starts them: the tests that stop nodes or list their
//! connections need that cluster, with no other client connected.

use std::process::Command;
use std::time::{Duration, Instant};

/// The variable naming the cluster's AMQP URLs, comma-separated.
pub const CLUSTER_URLS: &str = "OUTBOX_TEST_CLUSTER_URLS";

/// The cluster's URLs, or `None` outside CI when the variable is unset (the test
/// then says it is skipped).
///
/// # Panics
/// In CI (`CI=true`) when the variable is unset or empty, naming it.
#[must_use]
pub fn cluster_urls(test: &str) -> Option<Vec<String>> {
    let urls = named_urls();
    if !urls.is_empty() {
        return Some(urls);
    }
    assert!(
        std::env::var("CI").map_or(true, |v| v != "true"),
        "{test} needs a RabbitMQ cluster: set {CLUSTER_URLS} (cargo xtask cluster up prints it; cargo xtask ci sets it)"
    );
    eprintln!(
        "SKIPPED (not in CI): {test} needs a RabbitMQ cluster; set {CLUSTER_URLS} (cargo xtask cluster up)"
    );
    None
}

/// The URLs `OUTBOX_TEST_CLUSTER_URLS` names, empty entries dropped (none when it
/// is unset).
#[must_use]
pub fn named_urls() -> Vec<String> {
    std::env::var(CLUSTER_URLS)
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The node name serving AMQP on `port` (`5681` is `outbox-cluster-1@localhost`).
#[must_use]
pub fn node_of_port(port: u16) -> String {
    format!("outbox-cluster-{}@localhost", port.saturating_sub(5680))
}

/// `rabbitmqctl -n NODE args`, as the `rabbitmq` user when run as root (the nodes'
/// cookie is that user's); its standard output when it succeeded.
fn ctl(node: &str, args: &[&str]) -> Option<String> {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    let mut cmd = if root {
        let mut c = Command::new("runuser");
        c.args(["-u", "rabbitmq", "--", "rabbitmqctl"]);
        c
    } else {
        Command::new("rabbitmqctl")
    };
    let out = cmd
        .args(["-n", node, "--timeout", "30"])
        .args(args)
        .env("HOME", "/var/lib/rabbitmq")
        .output()
        .ok()?;
    eprintln!(
        "cluster: rabbitmqctl -n {node} {}: {}",
        args.join(" "),
        if out.status.success() { "ok" } else { "failed" }
    );
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The AMQP ports of the nodes holding client connections now, one per connection
/// (`rabbitmqctl list_connections` asks every node of the cluster).
#[must_use]
pub fn connection_ports(any_node: &str) -> Vec<u16> {
    let Some(out) = ctl(
        any_node,
        &["list_connections", "name", "--no-table-headers"],
    ) else {
        return Vec::new();
    };
    // "127.0.0.1:40312 -> 127.0.0.1:5682"
    out.lines()
        .filter_map(|l| {
            l.rsplit_once("-> ")?
                .1
                .trim()
                .rsplit_once(':')?
                .1
                .parse()
                .ok()
        })
        .collect()
}

/// A node whose broker was stopped; dropping it starts the broker again.
#[must_use = "the node's broker starts again when this is dropped"]
pub struct StoppedNode {
    node: String,
    restored: bool,
}

impl StoppedNode {
    /// Starts the node's broker now and waits for it; false if it did not come back.
    pub fn restore(mut self) -> bool {
        self.restored = true;
        start(&self.node)
    }
}

impl Drop for StoppedNode {
    fn drop(&mut self) {
        if !self.restored && !start(&self.node) {
            eprintln!("cluster: could not restore {}", self.node);
        }
    }
}

fn start(node: &str) -> bool {
    ctl(node, &["start_app"]).is_some() && ctl(node, &["await_startup"]).is_some()
}

/// `rabbitmqctl -n NODE stop_app`: the node stays in the cluster, its broker closes
/// every connection it holds. `None` when the command failed.
#[must_use]
pub fn stop_node(node: &str) -> Option<StoppedNode> {
    let guard = StoppedNode {
        node: node.to_owned(),
        restored: false,
    };
    ctl(node, &["stop_app"])?;
    Some(guard)
}

/// Waits up to `limit` for `ready`, checking every 200 ms; whether it became true.
pub fn wait_for(limit: Duration, mut ready: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if ready() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    ready()
}

/// The operating system's process id of `node` (its Erlang VM), as the node says.
#[must_use]
pub fn os_pid(node: &str) -> Option<u32> {
    // Prints the pid as an Erlang string: "12345".
    ctl(node, &["eval", "os:getpid()."])?
        .trim()
        .trim_matches('"')
        .parse()
        .ok()
}

/// The node leading quorum queue `queue` of the default virtual host, as `node`
/// lists it.
#[must_use]
pub fn queue_leader(node: &str, queue: &str) -> Option<String> {
    let out = ctl(
        node,
        &["list_queues", "name", "leader", "--no-table-headers"],
    )?;
    out.lines().find_map(|l| {
        let (name, leader) = l.split_once('\t')?;
        (name == queue).then(|| leader.trim().to_owned())
    })
}

/// The cluster's AMQP ports (5681 to 5683) that process `pid` holds established
/// connections to, from `ss`.
#[must_use]
pub fn amqp_ports_of(pid: u32) -> Vec<u16> {
    let Ok(out) = Command::new("ss")
        .args(["-tnpH", "state", "established"])
        .output()
    else {
        return Vec::new();
    };
    let owner = format!("pid={pid},");
    // "0 0 127.0.0.1:40312 127.0.0.1:5682 users:((\"outbox\",pid=1234,fd=12))"
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(&owner))
        .filter_map(|l| {
            let peer = l.split_whitespace().nth(3)?;
            let port: u16 = peer.rsplit_once(':')?.1.parse().ok()?;
            (5681..=5683).contains(&port).then_some(port)
        })
        .collect()
}

/// A node killed with SIGKILL (no clean shutdown: its connections drop, its queue
/// leaderships move by election); dropping it starts the node again.
#[must_use = "the node starts again when this is dropped"]
pub struct KilledNode {
    node: String,
    restored: bool,
}

impl KilledNode {
    /// Starts the node again (`cargo xtask cluster up`, which starts what does not
    /// run and checks the cluster's members) and waits for it; whether it came back.
    pub fn restore(mut self) -> bool {
        self.restored = true;
        start_cluster()
    }
}

impl Drop for KilledNode {
    fn drop(&mut self) {
        if !self.restored && !start_cluster() {
            eprintln!("cluster: could not start {} again", self.node);
        }
    }
}

/// SIGKILLs `node`'s Erlang VM, process `pid` (see [`os_pid`]), and waits until the
/// process is gone; `None` when the signal failed.
#[must_use]
pub fn kill_node(node: &str, pid: u32) -> Option<KilledNode> {
    let killed = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success());
    if !killed {
        return None;
    }
    let guard = KilledNode {
        node: node.to_owned(),
        restored: false,
    };
    // Polled often: what follows a node's death happens within a few hundred
    // milliseconds (a quorum queue elects its next leader), and callers act in it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
    }
    let gone = !alive(pid);
    if !gone {
        eprintln!("cluster: {node} (pid {pid}) still runs 10 s after SIGKILL");
    }
    Some(guard)
}

/// Whether process `pid` runs: it exists and is not a zombie (a killed process
/// whose parent has not reaped it yet holds nothing).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        // "pid (comm) S ...": the state follows the last ')'.
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X")
    })
}

/// `cargo xtask cluster up`: through the xtask binary that runs this process when
/// it says where it is (`OUTBOX_XTASK`), else through cargo in the workspace.
fn start_cluster() -> bool {
    let mut cmd = match std::env::var("OUTBOX_XTASK") {
        Ok(xtask) if !xtask.is_empty() => Command::new(xtask),
        _ => {
            let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
            c.arg("xtask")
                .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
            c
        }
    };
    let ok = cmd
        .args(["cluster", "up"])
        .status()
        .is_ok_and(|s| s.success());
    eprintln!("cluster: cluster up: {}", if ok { "ok" } else { "failed" });
    ok
}
