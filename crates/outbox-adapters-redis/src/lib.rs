//! Redis adapter of `outbox`: the cluster lock and the shared sweep state (the seed
//! used Medallion's lock and FusionCache for these).
//!
//! - [`RedisLock`]: `SET key value NX PX ttl` in a script that also hands out a
//!   fencing token derived from the server's `TIME`, so tokens keep growing even after
//!   a restart of a Redis that keeps nothing on disk. Renewed while held; released
//!   only by its owner (compare-and-delete).
//! - [`RedisSweepState`]: the last `SweepReport` as JSON under the state key, with a
//!   TTL; writes are fenced atomically in a script.
//!
//! Connection URLs are never logged or shown in `Debug` output with their password.

mod lock;
mod state;

use std::fmt;
use std::time::Duration;

use deadpool_redis::{Config, Pool, PoolConfig, Runtime, Timeouts};
use outbox_core::config::{redact_secret_in, redact_url};
use outbox_ports::PortError;

pub use lock::RedisLock;
pub use state::RedisSweepState;

/// A configuration this adapter cannot use.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RedisConfigError {
    /// The URL does not parse.
    #[error("invalid Redis URL {url}: {reason}")]
    InvalidUrl {
        /// The URL, password removed.
        url: String,
        /// What is wrong.
        reason: String,
    },
}

/// A pool of connections to one Redis server, shared by the lock and the state store.
#[derive(Clone)]
pub struct RedisClient {
    pool: Pool,
    shown_url: String,
}

impl fmt::Debug for RedisClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisClient")
            .field("url", &self.shown_url)
            .finish_non_exhaustive()
    }
}

impl RedisClient {
    /// A pool for `url` (`redis://[:password@]host:port[/db]`). No connection is made
    /// yet; every operation fails fast (within `timeout`) while Redis is unreachable.
    ///
    /// # Errors
    /// [`RedisConfigError::InvalidUrl`] when the URL does not parse; the message shows
    /// the URL without its password.
    pub fn new(
        url: &str,
        max_connections: usize,
        timeout: Duration,
    ) -> Result<Self, RedisConfigError> {
        let invalid = |reason: String| RedisConfigError::InvalidUrl {
            url: redact_url(url),
            reason: redact_secret_in(&reason, url),
        };
        deadpool_redis::redis::parse_redis_url(url)
            .ok_or_else(|| invalid("not a redis:// or rediss:// URL".to_owned()))?;
        let mut config = Config::from_url(url);
        config.pool = Some(PoolConfig {
            max_size: max_connections.max(1),
            timeouts: Timeouts {
                wait: Some(timeout),
                create: Some(timeout),
                recycle: Some(timeout),
            },
            ..PoolConfig::default()
        });
        let pool = config
            .create_pool(Some(Runtime::Tokio1))
            .map_err(|e| invalid(e.to_string()))?;
        Ok(Self {
            pool,
            shown_url: redact_url(url),
        })
    }

    /// The URL as it may be shown: password replaced by `***`.
    #[must_use]
    pub fn shown_url(&self) -> &str {
        &self.shown_url
    }

    async fn conn(&self, operation: &'static str) -> Result<deadpool_redis::Connection, PortError> {
        self.pool.get().await.map_err(|e| PortError::Transient {
            operation,
            message: format!("Redis at {} unreachable: {e}", self.shown_url),
            source: None,
        })
    }
}

/// Maps a Redis error: anything about the connection is retryable; a refused command
/// (a script error, a wrong type) is not.
fn port(operation: &'static str, e: &deadpool_redis::redis::RedisError) -> PortError {
    use deadpool_redis::redis::ErrorKind;
    let fatal = matches!(
        e.kind(),
        ErrorKind::TypeError | ErrorKind::InvalidClientConfig | ErrorKind::AuthenticationFailed
    ) || e.code() == Some("WRONGTYPE")
        || e.code() == Some("NOSCRIPT");
    let message = e.to_string();
    if fatal {
        PortError::fatal(operation, message)
    } else {
        PortError::transient(operation, message)
    }
}
