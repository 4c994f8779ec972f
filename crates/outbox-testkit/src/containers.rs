//! Where the services under test come from, and (feature `containers`) PostgreSQL,
//! RabbitMQ and Redis in Docker containers for a machine that has Docker but not
//! the services: `TestUrls::from_env` uses them when no `OUTBOX_TEST_*` URL is set
//! and a Docker engine answers.
//!
//! The containers are reusable (testcontainers' `ReuseDirective::Always`): the
//! first test binary starts them and every later one, in this run and the next,
//! finds them again, so a laptop keeps one set instead of a new set per binary.
//! Remove them with `docker rm -f $(docker ps -aq --filter label=outbox-testkit)`.

use std::os::unix::net::UnixStream;
use std::time::Duration;

/// The environment variables that name the services under test.
pub const URL_VARIABLES: [&str; 3] = [
    "OUTBOX_TEST_DATABASE_URL",
    "OUTBOX_TEST_AMQP_URL",
    "OUTBOX_TEST_REDIS_URL",
];

/// Where the services under test come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The `OUTBOX_TEST_*` URLs (unset ones default to the local servers).
    Environment,
    /// Containers started (or found again) through Docker.
    Containers,
    /// The local servers on their default ports.
    LocalServers,
}

/// The choice: URLs set in the environment always win (CI sets them); else
/// containers, when the `containers` feature is on and a Docker engine answers
/// (asked only then); else the local servers, as without the feature.
pub fn choose(
    any_url_set: bool,
    containers_enabled: bool,
    docker_answers: impl FnOnce() -> bool,
) -> Source {
    if any_url_set {
        Source::Environment
    } else if containers_enabled && docker_answers() {
        Source::Containers
    } else {
        Source::LocalServers
    }
}

/// Whether a Docker engine accepts connections: `DOCKER_HOST` (`unix://` or
/// `tcp://`), else `/var/run/docker.sock`.
#[must_use]
pub fn docker_answers() -> bool {
    let host = std::env::var("DOCKER_HOST").unwrap_or_default();
    if let Some(addr) = host.strip_prefix("tcp://") {
        return crate::urls::answering(addr);
    }
    let socket = host
        .strip_prefix("unix://")
        .unwrap_or("/var/run/docker.sock");
    UnixStream::connect(socket)
        .and_then(|s| s.set_read_timeout(Some(Duration::from_millis(500))))
        .is_ok()
}

#[cfg(feature = "containers")]
pub(crate) use started::urls;

#[cfg(feature = "containers")]
mod started {
    use std::sync::OnceLock;

    use testcontainers::{ImageExt, ReuseDirective, runners::SyncRunner};
    use testcontainers_modules::{postgres::Postgres, rabbitmq::RabbitMq, redis::Redis};

    use crate::urls::TestUrls;

    static URLS: OnceLock<Result<TestUrls, String>> = OnceLock::new();

    /// The containers' URLs, starting them (or finding them again) on first use.
    /// On a thread of its own: the blocking runner makes its own runtime, which
    /// must not be started inside a test's.
    pub(crate) fn urls() -> Result<TestUrls, String> {
        URLS.get_or_init(|| {
            std::thread::spawn(start)
                .join()
                .unwrap_or_else(|_| Err("starting the containers panicked".to_owned()))
        })
        .clone()
    }

    fn start() -> Result<TestUrls, String> {
        let fail = |what: &str, e: &dyn std::fmt::Display| format!("{what} container: {e}");
        let label = ("outbox-testkit", "1");
        let pg = Postgres::default()
            .with_db_name("test")
            .with_user("postgres")
            .with_password("postgres")
            .with_label(label.0, label.1)
            .with_reuse(ReuseDirective::Always)
            .start()
            .map_err(|e| fail("PostgreSQL", &e))?;
        let mq = RabbitMq::default()
            .with_label(label.0, label.1)
            .with_reuse(ReuseDirective::Always)
            .start()
            .map_err(|e| fail("RabbitMQ", &e))?;
        let redis = Redis::default()
            .with_label(label.0, label.1)
            .with_reuse(ReuseDirective::Always)
            .start()
            .map_err(|e| fail("Redis", &e))?;
        let port = |c: u16, p: Result<u16, testcontainers::TestcontainersError>| {
            p.map_err(|e| format!("port {c}: {e}"))
        };
        let urls = TestUrls {
            pg: format!(
                "postgres://postgres:postgres@127.0.0.1:{}/test",
                port(5432, pg.get_host_port_ipv4(5432))?
            ),
            amqp: format!(
                "amqp://guest:guest@127.0.0.1:{}/%2f",
                port(5672, mq.get_host_port_ipv4(5672))?
            ),
            redis: format!(
                "redis://127.0.0.1:{}/",
                port(6379, redis.get_host_port_ipv4(6379))?
            ),
        };
        // Reused containers outlive this process on purpose: dropping a handle
        // would remove them.
        std::mem::forget((pg, mq, redis));
        Ok(urls)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_in_the_environment_always_win_and_docker_is_not_asked() {
        for enabled in [false, true] {
            let source = choose(true, enabled, || panic!("Docker must not be asked"));
            assert_eq!(source, Source::Environment);
        }
    }

    #[test]
    fn containers_only_with_the_feature_and_an_answering_engine() {
        assert_eq!(choose(false, true, || true), Source::Containers);
        assert_eq!(choose(false, true, || false), Source::LocalServers);
        assert_eq!(
            choose(false, false, || panic!("not asked without the feature")),
            Source::LocalServers
        );
    }
}
