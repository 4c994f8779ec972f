//! Stopping and starting the local services, with guards that bring them back when
//! dropped, so a failing scenario never leaves a service down.

use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

/// The local servers the fault suite may stop (it never stops anything else).
pub(crate) const PG_ADDR: &str = "127.0.0.1:5432";
pub(crate) const AMQP_ADDR: &str = "127.0.0.1:5672";
pub(crate) const REDIS_ADDR: &str = "127.0.0.1:6379";

fn answering(addr: &str) -> bool {
    addr.parse()
        .ok()
        .and_then(|a| TcpStream::connect_timeout(&a, Duration::from_millis(500)).ok())
        .is_some()
}

fn run(program: &str, args: &[&str]) -> bool {
    let ok = Command::new(program)
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    eprintln!(
        "chaos: {program} {}: {}",
        args.join(" "),
        if ok { "ok" } else { "failed" }
    );
    ok
}

fn wait_until(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!("chaos: {what} did not come back within {timeout:?}");
    false
}

fn pg_cluster() -> String {
    std::fs::read_dir("/etc/postgresql")
        .ok()
        .and_then(|d| d.filter_map(Result::ok).next())
        .and_then(|e| e.file_name().into_string().ok())
        .unwrap_or_else(|| "15".to_owned())
}

fn rabbit_ready() -> bool {
    answering(AMQP_ADDR) && run("rabbitmqctl", &["await_startup", "--timeout", "5"])
}

/// Starts PostgreSQL.
pub(crate) fn start_postgres() -> bool {
    if answering(PG_ADDR) {
        return true;
    }
    run(
        "pg_ctlcluster",
        &["--skip-systemctl-redirect", &pg_cluster(), "main", "start"],
    );
    wait_until("PostgreSQL", Duration::from_secs(60), || answering(PG_ADDR))
}

/// Starts RabbitMQ (the application, or the whole node if it is not running).
pub(crate) fn start_rabbitmq() -> bool {
    if answering(AMQP_ADDR) {
        return true;
    }
    if !run("rabbitmqctl", &["start_app"]) {
        run("rabbitmq-server", &["-detached"]);
    }
    wait_until("RabbitMQ", Duration::from_secs(120), rabbit_ready)
}

/// Starts Redis as the machine's setup does (nothing kept on disk).
pub(crate) fn start_redis() -> bool {
    if answering(REDIS_ADDR) {
        return true;
    }
    run(
        "redis-server",
        &[
            "--daemonize",
            "yes",
            "--bind",
            "127.0.0.1",
            "-::1",
            "--port",
            "6379",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            "/var/lib/redis",
            "--logfile",
            "/var/log/redis/ci.log",
        ],
    );
    wait_until("Redis", Duration::from_secs(30), || answering(REDIS_ADDR))
}

/// Starts whatever of the three is down; says which could not be started.
pub(crate) fn ensure_all_up() -> Result<(), String> {
    let mut down = Vec::new();
    if !start_postgres() {
        down.push(format!("PostgreSQL ({PG_ADDR})"));
    }
    if !start_rabbitmq() {
        down.push(format!("RabbitMQ ({AMQP_ADDR})"));
    }
    if !start_redis() {
        down.push(format!("Redis ({REDIS_ADDR})"));
    }
    if down.is_empty() {
        Ok(())
    } else {
        Err(format!("cannot start {}", down.join(", ")))
    }
}

/// A stopped service; dropping it starts the service again.
#[must_use = "the service starts again when this is dropped"]
pub(crate) struct Stopped {
    name: &'static str,
    start: fn() -> bool,
    restored: bool,
}

impl Stopped {
    /// Starts the service now; false if it did not come back.
    pub(crate) fn restore(mut self) -> bool {
        self.restored = true;
        (self.start)()
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        if !self.restored && !(self.start)() {
            eprintln!("chaos: could not restore {}", self.name);
        }
    }
}

/// `rabbitmqctl stop_app`: the node stays, the broker closes every connection.
pub(crate) fn stop_rabbitmq() -> Stopped {
    let guard = Stopped {
        name: "RabbitMQ",
        start: start_rabbitmq,
        restored: false,
    };
    run("rabbitmqctl", &["stop_app"]);
    guard
}

/// `redis-cli shutdown nosave`.
pub(crate) fn stop_redis() -> Stopped {
    let guard = Stopped {
        name: "Redis",
        start: start_redis,
        restored: false,
    };
    run("redis-cli", &["-p", "6379", "shutdown", "nosave"]);
    wait_until("Redis to stop", Duration::from_secs(10), || {
        !answering(REDIS_ADDR)
    });
    guard
}

/// `pg_ctlcluster ... restart` (fast shutdown: every connection is cut); true when
/// PostgreSQL answers again.
pub(crate) fn restart_postgres() -> bool {
    let guard = Stopped {
        name: "PostgreSQL",
        start: start_postgres,
        restored: false,
    };
    run(
        "pg_ctlcluster",
        &[
            "--skip-systemctl-redirect",
            &pg_cluster(),
            "main",
            "restart",
        ],
    );
    guard.restore()
}

/// True if `url` names the local server at `addr` (only those may be stopped).
pub(crate) fn is_local(url: &str, addr: &str) -> bool {
    url.contains(addr) || url.contains(&addr.replace("127.0.0.1", "localhost"))
}
