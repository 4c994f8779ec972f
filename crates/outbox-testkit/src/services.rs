//! The local PostgreSQL, RabbitMQ and Redis for tests that need them: their URLs
//! (`OUTBOX_TEST_*`, else the local servers), and stopping and starting them with
//! guards that bring them back when dropped, so a failing test or fault scenario
//! never leaves a service down. Only the local servers are ever stopped
//! ([`is_local`]); the commands are the machine's documented ones.

use std::process::Command;
use std::time::{Duration, Instant};

pub use crate::urls::{TestUrls, answering};

/// The local PostgreSQL.
pub const PG_ADDR: &str = "127.0.0.1:5432";
/// The local RabbitMQ.
pub const AMQP_ADDR: &str = "127.0.0.1:5672";
/// The local Redis.
pub const REDIS_ADDR: &str = "127.0.0.1:6379";

impl TestUrls {
    /// Reads the environment; with the `containers` feature, when no
    /// `OUTBOX_TEST_*` URL is set and a Docker engine answers, the URLs of
    /// PostgreSQL, RabbitMQ and Redis containers instead (see
    /// [`crate::containers`]).
    ///
    /// # Panics
    /// With the `containers` feature, when Docker answers but the containers
    /// cannot be started (the message says why).
    #[must_use]
    pub fn from_env() -> Self {
        use crate::containers::{Source, URL_VARIABLES, choose, docker_answers};
        let any_set = URL_VARIABLES.iter().any(|k| std::env::var_os(k).is_some());
        if choose(any_set, cfg!(feature = "containers"), docker_answers) == Source::Containers {
            #[cfg(feature = "containers")]
            return crate::containers::urls().unwrap_or_else(|e| panic!("Docker answers, but {e}"));
        }
        let var = |k: &str, d: &str| std::env::var(k).unwrap_or_else(|_| d.to_owned());
        Self {
            pg: var(
                "OUTBOX_TEST_DATABASE_URL",
                "postgres://postgres@127.0.0.1:5432/test",
            ),
            amqp: var(
                "OUTBOX_TEST_AMQP_URL",
                "amqp://guest:guest@127.0.0.1:5672/%2f",
            ),
            redis: var("OUTBOX_TEST_REDIS_URL", "redis://127.0.0.1:6379/"),
        }
    }
}

fn run(program: &str, args: &[&str]) -> bool {
    let ok = Command::new(program)
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    eprintln!(
        "services: {program} {}: {}",
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
    eprintln!("services: {what} did not come back within {timeout:?}");
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
pub fn start_postgres() -> bool {
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
pub fn start_rabbitmq() -> bool {
    if answering(AMQP_ADDR) {
        return true;
    }
    if !run("rabbitmqctl", &["start_app"]) {
        run("rabbitmq-server", &["-detached"]);
    }
    wait_until("RabbitMQ", Duration::from_secs(120), rabbit_ready)
}

/// Starts Redis as the machine's setup does (nothing kept on disk).
pub fn start_redis() -> bool {
    if answering(REDIS_ADDR) {
        return true;
    }
    let _ = std::fs::create_dir_all("/var/lib/redis");
    let _ = std::fs::create_dir_all("/var/log/redis");
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

/// Starts whatever of the three is down.
///
/// # Errors
/// Names the services that could not be started.
pub fn ensure_all_up() -> Result<(), String> {
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
pub struct Stopped {
    name: &'static str,
    start: fn() -> bool,
    restored: bool,
}

impl Stopped {
    /// Starts the service now; false if it did not come back.
    pub fn restore(mut self) -> bool {
        self.restored = true;
        (self.start)()
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        if !self.restored && !(self.start)() {
            eprintln!("services: could not restore {}", self.name);
        }
    }
}

/// `rabbitmqctl stop_app`: the node stays, the broker closes every connection.
pub fn stop_rabbitmq() -> Stopped {
    let guard = Stopped {
        name: "RabbitMQ",
        start: start_rabbitmq,
        restored: false,
    };
    run("rabbitmqctl", &["stop_app"]);
    guard
}

/// `redis-cli shutdown nosave`.
pub fn stop_redis() -> Stopped {
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
pub fn restart_postgres() -> bool {
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

/// True if `url` names the local server at `addr` (only those may be stopped): a
/// loopback host (`127.0.0.1`, `localhost`, `::1`) and the same port (the scheme's
/// default when the URL has none). Paths, users and passwords do not matter.
pub fn is_local(url: &str, addr: &str) -> bool {
    let (Some(server), Some(port)) = (Server::of(url), addr.rsplit_once(':')) else {
        return false;
    };
    server.host == Host::Loopback && port.1.parse() == Ok(server.port)
}

/// True if both URLs name the same server: the same scheme (`postgres` and
/// `postgresql` alike), host (loopback names alike, other names ignoring case) and
/// port (the scheme's default when absent). `redis://127.0.0.1:6379` and
/// `redis://localhost:6379/0` are the same server; a URL that cannot be read names
/// none.
pub fn same_server(a: &str, b: &str) -> bool {
    matches!((Server::of(a), Server::of(b)), (Some(x), Some(y)) if x == y)
}

/// Where a URL points, as far as "is it the same server" goes.
#[derive(Debug, PartialEq, Eq)]
struct Server {
    scheme: String,
    host: Host,
    port: u16,
}

#[derive(Debug, PartialEq, Eq)]
enum Host {
    Loopback,
    Named(String),
}

impl Server {
    fn of(url: &str) -> Option<Self> {
        let (scheme, rest) = url.split_once("://")?;
        let scheme = match scheme.to_ascii_lowercase().as_str() {
            "postgresql" => "postgres".to_owned(),
            other => other.to_owned(),
        };
        let authority = rest.split(['/', '?', '#']).next()?;
        let host_port = authority.rsplit_once('@').map_or(authority, |(_, hp)| hp);
        let (host, port) = if let Some(v6) = host_port.strip_prefix('[') {
            let (host, after) = v6.split_once(']')?;
            (host, after.strip_prefix(':'))
        } else {
            match host_port.split_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (host_port, None),
            }
        };
        let port = match port {
            Some(p) => p.parse().ok()?,
            None => default_port(&scheme)?,
        };
        let host = host.to_ascii_lowercase();
        if host.is_empty() {
            return None;
        }
        let loopback = host == "localhost"
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback());
        Some(Self {
            scheme,
            host: if loopback {
                Host::Loopback
            } else {
                Host::Named(host)
            },
            port,
        })
    }
}

fn default_port(scheme: &str) -> Option<u16> {
    match scheme {
        "postgres" => Some(5432),
        "amqp" => Some(5672),
        "amqps" => Some(5671),
        "redis" | "rediss" => Some(6379),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_server_however_its_url_is_written() {
        for (a, b) in [
            ("redis://127.0.0.1:6379", "redis://127.0.0.1:6379/"),
            ("redis://localhost:6379/0", "redis://127.0.0.1:6379/"),
            ("redis://[::1]:6379", "redis://127.0.0.1:6379/"),
            ("redis://:secret@127.0.0.1/", "redis://127.0.0.1:6379/"),
            (
                "amqp://guest:guest@localhost:5672",
                "amqp://guest:guest@127.0.0.1:5672/%2f",
            ),
            (
                "postgresql://postgres@127.0.0.1/test",
                "postgres://postgres@127.0.0.1:5432/test",
            ),
            ("redis://Cache.Example:6379", "redis://cache.example:6379/1"),
        ] {
            assert!(same_server(a, b), "{a} and {b} are the same server");
            assert!(same_server(b, a), "{b} and {a} are the same server");
        }
    }

    #[test]
    fn other_servers_are_other_servers() {
        for (a, b) in [
            ("redis://127.0.0.1:6380/", "redis://127.0.0.1:6379/"),
            ("redis://10.0.0.5:6379/", "redis://127.0.0.1:6379/"),
            ("rediss://127.0.0.1:6379/", "redis://127.0.0.1:6379/"),
            ("amqp://127.0.0.1:5672/", "redis://127.0.0.1:5672/"),
            ("redis+unix:///tmp/redis.sock", "redis://127.0.0.1:6379/"),
            ("not a url", "not a url"),
        ] {
            assert!(!same_server(a, b), "{a} and {b} are different servers");
        }
    }

    #[test]
    fn only_loopback_urls_on_the_port_are_local() {
        assert!(is_local("redis://127.0.0.1:6379", REDIS_ADDR));
        assert!(is_local("redis://localhost/", REDIS_ADDR));
        assert!(is_local("redis://[::1]:6379/", REDIS_ADDR));
        assert!(is_local("amqp://guest:guest@127.0.0.1:5672/%2f", AMQP_ADDR));
        assert!(is_local("postgres://postgres@localhost/test", PG_ADDR));
        assert!(
            !is_local("redis://127.0.0.1:63790/", REDIS_ADDR),
            "another port"
        );
        assert!(!is_local("redis://db.internal:6379/", REDIS_ADDR));
        assert!(
            !is_local("postgres://u@db.internal/x?host=127.0.0.1:5432", PG_ADDR),
            "an address in the query is not the host"
        );
    }
}
