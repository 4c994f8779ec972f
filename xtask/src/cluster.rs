//! `cargo xtask cluster up | down | status`: a local 3-node RabbitMQ cluster for the
//! tests, chaos scenarios and bench figures that need more than one broker node.
//!
//! The nodes are started from the machine's RabbitMQ installation (the same
//! `rabbitmq-server` and `rabbitmqctl` as the node on 5672, never touched here), as the
//! `rabbitmq` user when run as root (so they share the machine's Erlang cookie in
//! `/var/lib/rabbitmq`), each with a node name, AMQP port and distribution port of its
//! own ([`NODES`]), no plugins, and its data and logs under `<target>/cluster/` (the
//! cargo target directory; under the temporary directory when the `rabbitmq` user
//! cannot reach the target, see [`base`]). `up` starts what is not running and joins nodes 2 and 3
//! to node 1; it can be run again at any time. `down` stops the three and returns
//! once their ports are free, then removes their data, so the next `up` starts clean.
//! `status` prints each node, whether it runs, and the cluster's running members.
//!
//! Tests find the cluster through `OUTBOX_TEST_CLUSTER_URLS` ([`urls`]).

#![allow(clippy::print_stdout)] // a command whose output is what it prints

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A node of the cluster: its Erlang node name, AMQP port and distribution port.
struct Node {
    name: &'static str,
    amqp: u16,
    dist: u16,
}

/// The three nodes. The distribution ports sit beside the default node's 25672.
const NODES: [Node; 3] = [
    Node {
        name: "outbox-cluster-1@localhost",
        amqp: 5681,
        dist: 25681,
    },
    Node {
        name: "outbox-cluster-2@localhost",
        amqp: 5682,
        dist: 25682,
    },
    Node {
        name: "outbox-cluster-3@localhost",
        amqp: 5683,
        dist: 25683,
    },
];

/// The home of the `rabbitmq` user, where the machine's Erlang cookie is.
const RABBITMQ_HOME: &str = "/var/lib/rabbitmq";

/// How long one node may take to start, and the cluster to form.
const START_TIMEOUT: Duration = Duration::from_secs(90);

/// How long `down` waits for a node's ports to be free.
const STOP_TIMEOUT: Duration = Duration::from_secs(60);

/// `OUTBOX_TEST_CLUSTER_URLS` for the cluster `up` starts: the nodes' AMQP URLs,
/// comma-separated.
pub(crate) fn urls() -> String {
    NODES
        .iter()
        .map(|n| format!("amqp://guest:guest@127.0.0.1:{}/%2f", n.amqp))
        .collect::<Vec<_>>()
        .join(",")
}

/// `cargo xtask cluster <up|down|status>`.
pub(crate) fn cluster(args: &[String]) -> Result<(), String> {
    match args.first().map(String::as_str) {
        Some("up") => up().map(|_| ()),
        Some("down") => down(),
        Some("status") => status(),
        _ => Err("usage: cargo xtask cluster <up|down|status>".to_owned()),
    }
}

/// Where the nodes keep their data and logs: `<target>/cluster`, or, when the
/// `rabbitmq` user cannot reach the target directory (a checkout under a home
/// directory only its owner may enter), a directory of the system's temporary
/// directory named after it. Decided once a run.
fn base() -> PathBuf {
    static BASE: OnceLock<PathBuf> = OnceLock::new();
    BASE.get_or_init(|| {
        let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".to_owned());
        let target = Path::new(&target);
        let target = if target.is_absolute() {
            target.to_path_buf()
        } else {
            // Relative to the workspace, wherever the command was run from.
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .parent()
                .unwrap_or_else(|| Path::new("."))
                .join(target)
        };
        let reachable = !is_root()
            || rabbit("test", &["-x"], None)
                .arg(&target)
                .status()
                .is_ok_and(|s| s.success());
        if reachable {
            return target.join("cluster");
        }
        let mut hash = std::collections::hash_map::DefaultHasher::new();
        std::hash::Hash::hash(&target, &mut hash);
        let fallback = std::env::temp_dir().join(format!(
            "outbox-cluster-{:016x}",
            std::hash::Hasher::finish(&hash)
        ));
        eprintln!(
            "cluster: the rabbitmq user cannot reach {}; the nodes' data goes to {}",
            target.display(),
            fallback.display()
        );
        fallback
    })
    .clone()
}

fn node_dir(node: &Node) -> PathBuf {
    base().join(node.name.split('@').next().unwrap_or(node.name))
}

/// Whether this process runs as root (then the nodes run as `rabbitmq`).
fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// `program args`, as the `rabbitmq` user when we are root, with the environment of
/// `node` (when given) and the machine's cookie.
fn rabbit(program: &str, args: &[&str], node: Option<&Node>) -> Command {
    let mut cmd = if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "rabbitmq", "--", program]);
        c
    } else {
        Command::new(program)
    };
    cmd.args(args).env("HOME", RABBITMQ_HOME);
    if let Some(n) = node {
        let dir = node_dir(n);
        cmd.env("RABBITMQ_NODENAME", n.name)
            .env("RABBITMQ_NODE_PORT", n.amqp.to_string())
            .env("RABBITMQ_DIST_PORT", n.dist.to_string())
            .env("RABBITMQ_MNESIA_BASE", dir.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", dir.join("log"))
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", dir.join("enabled_plugins"))
            .env("RABBITMQ_CONFIG_FILE", dir.join("rabbitmq.conf"))
            .env("RABBITMQ_PID_FILE", dir.join("pid"));
    }
    cmd
}

/// `rabbitmqctl -n NODE args` (with a timeout of its own), its output.
fn ctl(node: &Node, args: &[&str]) -> Result<Output, String> {
    let mut all = vec!["-n", node.name, "--timeout", "30"];
    all.extend_from_slice(args);
    rabbit("rabbitmqctl", &all, None)
        .output()
        .map_err(|e| format!("rabbitmqctl: {e}"))
}

fn ctl_ok(node: &Node, args: &[&str]) -> Result<String, String> {
    let out = ctl(node, args)?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "rabbitmqctl -n {} {}: {}{}",
            node.name,
            args.join(" "),
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Whether something accepts connections on `port` of the loopback address.
fn listening(port: u16) -> bool {
    TcpStream::connect_timeout(
        &SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_millis(300),
    )
    .is_ok()
}

/// Whether `node` runs (its Erlang node answers).
fn running(node: &Node) -> bool {
    listening(node.dist) && ctl(node, &["ping"]).is_ok_and(|o| o.status.success())
}

/// The node's directories and files, owned by `rabbitmq` when we are root.
fn prepare(node: &Node) -> Result<(), String> {
    let dir = node_dir(node);
    for sub in ["mnesia", "log"] {
        std::fs::create_dir_all(dir.join(sub))
            .map_err(|e| format!("create {}: {e}", dir.join(sub).display()))?;
    }
    let write = |file: &str, text: String| {
        std::fs::write(dir.join(file), text)
            .map_err(|e| format!("write {}: {e}", dir.join(file).display()))
    };
    write("enabled_plugins", "[].\n".to_owned())?;
    write(
        "rabbitmq.conf",
        format!(
            "listeners.tcp.local = 127.0.0.1:{}\n\
             # The tests start and stop nodes on a small machine: no disk alarm for them.\n\
             disk_free_limit.absolute = 1MB\n",
            node.amqp
        ),
    )?;
    if is_root() {
        let status = Command::new("chown")
            .args(["-R", "rabbitmq:rabbitmq"])
            .arg(base())
            .status()
            .map_err(|e| format!("chown: {e}"))?;
        if !status.success() {
            return Err(format!("chown -R rabbitmq {} failed", base().display()));
        }
    }
    // The node runs as `rabbitmq`, which must reach its directory (every parent
    // searchable): said now, not after the start's timeout with an empty log.
    let reachable = rabbit("test", &["-w"], None)
        .arg(dir.join("mnesia"))
        .status()
        .is_ok_and(|s| s.success());
    if !reachable {
        return Err(format!(
            "the rabbitmq user cannot write {}: every directory above it must be searchable by that user (chmod o+x), or set CARGO_TARGET_DIR to a directory it can reach",
            dir.display()
        ));
    }
    Ok(())
}

/// Starts `node` (detached) unless it runs; whether it was started now. A node
/// that runs with its broker application stopped (a test's `stop_app` whose guard
/// never ran) gets it started again.
fn launch(node: &Node) -> Result<bool, String> {
    if running(node) {
        ctl_ok(node, &["start_app"])?;
        println!("cluster: {} runs already", node.name);
        return Ok(false);
    }
    for port in [node.amqp, node.dist] {
        if listening(port) {
            return Err(format!(
                "port {port} is taken by something other than {}",
                node.name
            ));
        }
    }
    prepare(node)?;
    let status = rabbit("rabbitmq-server", &["-detached"], Some(node))
        .status()
        .map_err(|e| format!("rabbitmq-server: {e}"))?;
    if !status.success() {
        return Err(format!(
            "rabbitmq-server -detached for {} failed",
            node.name
        ));
    }
    Ok(true)
}

/// Waits until `node` runs and its broker has started.
fn await_node(node: &Node) -> Result<(), String> {
    let deadline = Instant::now() + START_TIMEOUT;
    while !running(node) {
        if Instant::now() > deadline {
            return Err(format!(
                "{} did not start within {START_TIMEOUT:?}; see {} and /var/log/rabbitmq/startup_err",
                node.name,
                node_dir(node).join("log").display()
            ));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    ctl_ok(node, &["await_startup"])?;
    Ok(())
}

/// The running members of `node`'s cluster, as its `cluster_status` lists them.
fn running_members(node: &Node) -> Result<Vec<String>, String> {
    let out = ctl_ok(node, &["cluster_status", "--formatter", "json"])?;
    // `"running_nodes":["a@h","b@h"]`: the standard library has no JSON parser, and
    // node names hold no quotes or brackets.
    let after = out
        .split("\"running_nodes\":[")
        .nth(1)
        .ok_or_else(|| format!("no running_nodes in {out}"))?;
    let list = after.split(']').next().unwrap_or("");
    Ok(list
        .split(',')
        .map(|s| s.trim().trim_matches('"').to_owned())
        .filter(|s| !s.is_empty())
        .collect())
}

/// Starts what does not run and forms the cluster; whether any node was started
/// now (a run that found them all running leaves them to whoever started them).
fn up() -> Result<bool, String> {
    // All three launched before any is awaited: a node restarting on old data
    // waits for its peers' tables.
    let mut started = false;
    for node in &NODES {
        started |= launch(node)?;
    }
    for node in &NODES {
        await_node(node)?;
    }
    let first = &NODES[0];
    for node in &NODES[1..] {
        if running_members(first)?.iter().any(|m| m == node.name) {
            continue;
        }
        // A node that was in another cluster (or half-joined) starts afresh.
        ctl_ok(node, &["stop_app"])?;
        ctl_ok(node, &["reset"])?;
        ctl_ok(node, &["join_cluster", first.name])?;
        ctl_ok(node, &["start_app"])?;
        ctl_ok(node, &["await_startup"])?;
        println!("cluster: {} joined {}", node.name, first.name);
    }
    let members = running_members(first)?;
    if members.len() != NODES.len() {
        return Err(format!("the cluster runs {members:?}, not all three nodes"));
    }
    println!(
        "cluster: up, {} nodes; OUTBOX_TEST_CLUSTER_URLS={}",
        members.len(),
        urls()
    );
    Ok(started)
}

fn down() -> Result<(), String> {
    let mut problems = Vec::new();
    for node in &NODES {
        if running(node)
            && let Err(e) = ctl_ok(node, &["stop"])
        {
            problems.push(e);
        }
    }
    for node in &NODES {
        let deadline = Instant::now() + STOP_TIMEOUT;
        while listening(node.amqp) || listening(node.dist) {
            if Instant::now() > deadline {
                // Still bound: the node's VM, by its pid file, if it has one.
                kill_by_pid_file(node);
                if listening(node.amqp) || listening(node.dist) {
                    problems.push(format!(
                        "{}: ports {} and {} still taken after {STOP_TIMEOUT:?}",
                        node.name, node.amqp, node.dist
                    ));
                }
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    if !problems.is_empty() {
        return Err(problems.join("; "));
    }
    if base().exists() {
        std::fs::remove_dir_all(base()).map_err(|e| format!("remove {}: {e}", base().display()))?;
    }
    println!("cluster: down");
    Ok(())
}

fn kill_by_pid_file(node: &Node) {
    let Ok(pid) = std::fs::read_to_string(node_dir(node).join("pid")) else {
        return;
    };
    let pid = pid.trim();
    if !pid.is_empty() && pid.chars().all(|c| c.is_ascii_digit()) {
        let _ = Command::new("kill").args(["-9", pid]).status();
        std::thread::sleep(Duration::from_secs(1));
    }
}

fn status() -> Result<(), String> {
    for node in &NODES {
        println!(
            "{:<28} AMQP {}  {}",
            node.name,
            node.amqp,
            if running(node) { "running" } else { "stopped" }
        );
    }
    match NODES.iter().find(|n| running(n)) {
        Some(n) => println!("members: {}", running_members(n)?.join(", ")),
        None => println!("members: none (no node runs)"),
    }
    Ok(())
}

/// The cluster for a test run: the one `OUTBOX_TEST_CLUSTER_URLS` names, or (unset)
/// one started now and stopped when this is dropped, whatever the tests did.
pub(crate) struct ForTests {
    /// `OUTBOX_TEST_CLUSTER_URLS` for the tests.
    pub(crate) urls: String,
    started: bool,
}

impl ForTests {
    /// No cluster (`urls` empty): for a run that needs none.
    pub(crate) fn none() -> Self {
        Self {
            urls: String::new(),
            started: false,
        }
    }

    /// The named cluster, or a local one started now.
    ///
    /// # Errors
    /// The local cluster could not be started.
    pub(crate) fn start() -> Result<Self, String> {
        if let Ok(named) = std::env::var("OUTBOX_TEST_CLUSTER_URLS")
            && !named.trim().is_empty()
        {
            return Ok(Self {
                urls: named,
                started: false,
            });
        }
        // Started by this run: stopped (and its data removed) by it too, also when
        // starting failed half-way. Nodes that ran already are left running.
        let mut guard = Self {
            urls: urls(),
            started: true,
        };
        // On an error the guard goes with `started` still true: down() cleans up.
        guard.started = up()?;
        Ok(guard)
    }
}

impl Drop for ForTests {
    fn drop(&mut self) {
        if self.started
            && let Err(e) = down()
        {
            eprintln!("xtask: cluster down: {e}");
        }
    }
}
