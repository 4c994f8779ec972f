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
    let urls: Vec<String> = std::env::var(CLUSTER_URLS)
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(str::to_owned)
        .collect();
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
