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
//!
//! TLS: a `rediss://` URL connects over rustls (ring provider), verifying the
//! server's certificate and host name against the system's root certificates, or
//! only against a CA file when one is given ([`RedisClient::with_tls`]).

mod lock;
mod state;

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use deadpool_redis::redis::{self, TlsCertificates};
use deadpool_redis::{Config, Manager, Pool, PoolConfig, Runtime, Timeouts};
use outbox_core::config::{redact_secret_in, redact_url};
use outbox_ports::PortError;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject as _;

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
    /// The CA file cannot be read or holds no PEM certificate.
    #[error("Redis CA certificate {path}: {reason}")]
    CaFile {
        /// Its path.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// The CA certificates a `rediss://` connection trusts instead of the system's
/// roots. `Debug` shows only whether one is set.
#[derive(Clone, Default)]
pub struct RedisTls {
    ca_pem: Option<Vec<u8>>,
}

impl fmt::Debug for RedisTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisTls")
            .field("ca", &self.ca_pem.is_some())
            .finish()
    }
}

impl RedisTls {
    /// Reads `ca`, one or more PEM certificates.
    ///
    /// # Errors
    /// [`RedisConfigError::CaFile`] when it cannot be read or holds no PEM
    /// certificate.
    pub fn from_ca_file(ca: &Path) -> Result<Self, RedisConfigError> {
        let bad = |reason: String| RedisConfigError::CaFile {
            path: ca.to_owned(),
            reason,
        };
        let bytes = std::fs::read(ca).map_err(|e| bad(e.to_string()))?;
        let certs = CertificateDer::pem_slice_iter(&bytes)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| bad(format!("not a PEM certificate: {e}")))?;
        if certs.is_empty() {
            return Err(bad(
                "holds no PEM certificate (-----BEGIN CERTIFICATE-----)".to_owned(),
            ));
        }
        Ok(Self {
            ca_pem: Some(bytes),
        })
    }
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
        Self::with_tls(url, &RedisTls::default(), max_connections, timeout)
    }

    /// As [`RedisClient::new`]; a `rediss://` URL trusts the CA of `tls` (when set)
    /// instead of the system's roots. A server certificate that does not verify
    /// (unknown issuer, another host name) fails every operation, the message naming
    /// Redis and the reason.
    ///
    /// # Errors
    /// [`RedisConfigError::InvalidUrl`] when the URL does not parse, or a CA is set
    /// for a URL that is not `rediss://`.
    pub fn with_tls(
        url: &str,
        tls: &RedisTls,
        max_connections: usize,
        timeout: Duration,
    ) -> Result<Self, RedisConfigError> {
        let invalid = |reason: String| RedisConfigError::InvalidUrl {
            url: redact_url(url),
            reason: redact_secret_in(&reason, url),
        };
        let parsed = redis::parse_redis_url(url)
            .ok_or_else(|| invalid("not a redis:// or rediss:// URL".to_owned()))?;
        let pool_config = PoolConfig {
            max_size: max_connections.max(1),
            timeouts: Timeouts {
                wait: Some(timeout),
                create: Some(timeout),
                recycle: Some(timeout),
            },
            ..PoolConfig::default()
        };
        let pool = if let Some(ca) = &tls.ca_pem {
            if parsed.scheme() != "rediss" {
                return Err(invalid(
                    "a CA certificate is set but the URL is not rediss://".to_owned(),
                ));
            }
            // deadpool-redis' own config drops TLS parameters: build the client
            // with them and hand its connection info to the manager.
            let client = redis::Client::build_with_tls(
                url,
                TlsCertificates {
                    client_tls: None,
                    root_cert: Some(ca.clone()),
                },
            )
            .map_err(|e| invalid(e.to_string()))?;
            let manager = Manager::new(client.get_connection_info().clone())
                .map_err(|e| invalid(e.to_string()))?;
            Pool::builder(manager)
                .config(pool_config)
                .runtime(Runtime::Tokio1)
                .build()
                .map_err(|e| invalid(e.to_string()))?
        } else {
            let mut config = Config::from_url(url);
            config.pool = Some(pool_config);
            config
                .create_pool(Some(Runtime::Tokio1))
                .map_err(|e| invalid(e.to_string()))?
        };
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
        self.pool.get().await.map_err(|e| {
            // Reached, and the credentials refused: no retry can help, and the
            // server is not unreachable.
            if let deadpool_redis::PoolError::Backend(re) = &e
                && refused_credentials(re)
            {
                return PortError::fatal(
                    operation,
                    format!(
                        "Redis at {} refused the credentials: {re} (check the URL's user and password; retrying will not help)",
                        self.shown_url
                    ),
                );
            }
            PortError::Transient {
                operation,
                message: format!("Redis at {} unreachable: {e}", self.shown_url),
                source: None,
            }
        })
    }
}

/// An error of signing in: a wrong password or user, a password given to a
/// server without one, a user without the right to connect.
fn refused_credentials(e: &deadpool_redis::redis::RedisError) -> bool {
    use deadpool_redis::redis::ErrorKind;
    e.kind() == ErrorKind::AuthenticationFailed
        || matches!(e.code(), Some("WRONGPASS" | "NOAUTH" | "NOPERM"))
        || (e.code() == Some("ERR") && e.to_string().contains("AUTH"))
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
