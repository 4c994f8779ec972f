//! The relay's configuration: a TOML file, overridden by `OUTBOX__SECTION__KEY`
//! environment variables (so `OUTBOX_TEST_*` and other single-underscore variables
//! never reach it). Unknown fields, unknown adapters, bad URLs and out-of-range values
//! stop start-up with a message naming the setting. `Debug` shows URLs without their
//! passwords, and the HTTP token and the admin tokens' secrets as `***`.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use outbox_core::config::{ConfigError, redact_url};
use outbox_core::{RetryPolicy, SweepConfig};
use outbox_relay::DispatcherConfig;
use serde::Deserialize;

/// Where messages are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    /// In memory (demos, tests): nothing survives a restart.
    Memory,
    /// PostgreSQL.
    Postgres,
}

/// Where messages are published.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PublisherKind {
    /// In memory (demos, tests).
    Memory,
    /// RabbitMQ.
    Rabbitmq,
}

/// Where the cluster lock or the sweep state lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CoordinationKind {
    /// In this process only (a single instance).
    Memory,
    /// PostgreSQL tables.
    Postgres,
    /// Redis.
    Redis,
}

/// Which adapter serves each port.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Adapters {
    /// Outbox store.
    pub store: StoreKind,
    /// Publisher.
    pub publisher: PublisherKind,
    /// Cluster lock of the retry sweep.
    pub lock: CoordinationKind,
    /// Shared sweep state.
    pub sweep_state: CoordinationKind,
}

/// PostgreSQL settings.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PostgresConfig {
    /// `postgres://user:password@host:port/database`.
    pub url: String,
    /// Schema of the outbox tables (a plain identifier).
    #[serde(default = "default_schema")]
    pub schema: String,
    /// Pool size.
    #[serde(default = "default_pool")]
    pub max_connections: u32,
    /// Run migrations at start (else run `outbox migrate` once).
    #[serde(default)]
    pub migrate_on_start: bool,
    /// Every statement of the relay's sessions is cancelled after this (a retryable
    /// error; the claim or mark is tried again). Migrations are exempt.
    #[serde(default = "default_statement_timeout", with = "outbox_core::duration")]
    pub statement_timeout: Duration,
    /// A statement waiting longer for a row or table lock another session holds
    /// fails (retryable). At most `statement_timeout`.
    #[serde(default = "default_lock_timeout", with = "outbox_core::duration")]
    pub lock_timeout: Duration,
    /// Silence on a session's connection before the server's first TCP keepalive
    /// probe (`tcp_keepalives_idle`, whole seconds).
    #[serde(default = "default_keepalive_idle", with = "outbox_core::duration")]
    pub keepalive_idle: Duration,
    /// Between unanswered keepalive probes (`tcp_keepalives_interval`, whole seconds).
    #[serde(default = "default_keepalive_interval", with = "outbox_core::duration")]
    pub keepalive_interval: Duration,
    /// Unanswered probes before the server ends the session and frees its locks
    /// (`tcp_keepalives_count`).
    #[serde(default = "default_keepalive_count")]
    pub keepalive_count: u32,
}

impl PostgresConfig {
    /// The bounds every session of the pool starts with.
    #[must_use]
    pub const fn session_bounds(&self) -> outbox_adapters_postgres::SessionBounds {
        outbox_adapters_postgres::SessionBounds {
            statement_timeout: Some(self.statement_timeout),
            lock_timeout: Some(self.lock_timeout),
            keepalive_idle: Some(self.keepalive_idle),
            keepalive_interval: Some(self.keepalive_interval),
            keepalive_count: Some(self.keepalive_count),
        }
    }

    fn validate_bounds(&self) -> Result<(), ConfigError> {
        // PostgreSQL keeps these settings as a 32-bit count of milliseconds (the
        // keepalives of seconds); 0 would mean "no bound" to it, not "at once".
        let max = Duration::from_millis(i32::MAX as u64);
        for (field, d) in [
            ("statement_timeout", self.statement_timeout),
            ("lock_timeout", self.lock_timeout),
        ] {
            if d < Duration::from_millis(1) || d > max {
                return Err(ConfigError::new(
                    "postgres",
                    field,
                    format!("must be between 1ms and {max:?} (got {d:?})"),
                ));
            }
        }
        if self.lock_timeout > self.statement_timeout {
            return Err(ConfigError::new(
                "postgres",
                "lock_timeout",
                format!(
                    "must not be longer than postgres.statement_timeout ({:?} > {:?}): the statement would be cancelled first",
                    self.lock_timeout, self.statement_timeout
                ),
            ));
        }
        for (field, d) in [
            ("keepalive_idle", self.keepalive_idle),
            ("keepalive_interval", self.keepalive_interval),
        ] {
            if d < Duration::from_secs(1) || d.subsec_nanos() != 0 || d > max {
                return Err(ConfigError::new(
                    "postgres",
                    field,
                    format!("must be a whole number of seconds, at least 1s (got {d:?})"),
                ));
            }
        }
        if self.keepalive_count == 0 || self.keepalive_count > i32::MAX as u32 {
            return Err(ConfigError::new(
                "postgres",
                "keepalive_count",
                format!("must be at least 1 (got {})", self.keepalive_count),
            ));
        }
        Ok(())
    }
}

// Defaults: a claim or a mark of a batch takes milliseconds; 30 s is far above any
// healthy one and still well inside a claim's 60-s lease. A lock is waited on for
// 10 s (an operator's short transaction passes, a forgotten one does not hold the
// relay). The server notices a vanished relay after 60 s of silence plus 6 probes
// 10 s apart, and frees its locks.
const fn default_statement_timeout() -> Duration {
    Duration::from_secs(30)
}

const fn default_lock_timeout() -> Duration {
    Duration::from_secs(10)
}

const fn default_keepalive_idle() -> Duration {
    Duration::from_secs(60)
}

const fn default_keepalive_interval() -> Duration {
    Duration::from_secs(10)
}

const fn default_keepalive_count() -> u32 {
    6
}

fn default_schema() -> String {
    "outbox".to_owned()
}

const fn default_pool() -> u32 {
    10
}

impl fmt::Debug for PostgresConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresConfig")
            .field("url", &redact_url(&self.url))
            .field("schema", &self.schema)
            .field("max_connections", &self.max_connections)
            .field("migrate_on_start", &self.migrate_on_start)
            .field("statement_timeout", &self.statement_timeout)
            .field("lock_timeout", &self.lock_timeout)
            .field("keepalive_idle", &self.keepalive_idle)
            .field("keepalive_interval", &self.keepalive_interval)
            .field("keepalive_count", &self.keepalive_count)
            .finish()
    }
}

/// RabbitMQ settings.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RabbitConfig {
    /// `amqp://user:password@host:port/vhost`, or `amqps://` for TLS.
    #[serde(default)]
    pub url: String,
    /// Nodes of one RabbitMQ cluster (after `url`, if both are set): connections go
    /// to one of them, a random one first, the next after a loss. Also
    /// `OUTBOX__RABBITMQ__URLS`, comma-separated.
    #[serde(default)]
    pub urls: Vec<String>,
    /// A confirm that does not come within this is a failure.
    #[serde(default = "default_confirm_timeout", with = "outbox_core::duration")]
    pub confirm_timeout: Duration,
    /// Messages in flight at most.
    #[serde(default = "default_in_flight")]
    pub max_in_flight: usize,
    /// PEM CA certificate(s) trusted for an `amqps://` URL, besides the system's roots.
    #[serde(default)]
    pub tls_ca_file: Option<PathBuf>,
    /// PEM client certificate (chain) presented to the broker; with
    /// `tls_client_key_file`.
    #[serde(default)]
    pub tls_client_cert_file: Option<PathBuf>,
    /// PEM private key of `tls_client_cert_file`.
    #[serde(default)]
    pub tls_client_key_file: Option<PathBuf>,
}

impl RabbitConfig {
    /// Every node's URL: `url` (when set), then `urls`.
    #[must_use]
    pub fn nodes(&self) -> Vec<String> {
        std::iter::once(&self.url)
            .chain(&self.urls)
            .map(|u| u.trim())
            .filter(|u| !u.is_empty())
            .map(str::to_owned)
            .collect()
    }

    /// The TLS files read and checked: they parse as PEM, the client certificate
    /// and key come together, and the URL is `amqps://` when any is set.
    ///
    /// # Errors
    /// [`ConfigError`] naming the setting.
    pub fn tls(&self) -> Result<outbox_adapters_rabbitmq::RabbitTls, ConfigError> {
        let client = match (&self.tls_client_cert_file, &self.tls_client_key_file) {
            (Some(cert), Some(key)) => Some((cert.as_path(), key.as_path())),
            (None, None) => None,
            (Some(_), None) => {
                return Err(ConfigError::new(
                    "rabbitmq",
                    "tls_client_key_file",
                    "is required with rabbitmq.tls_client_cert_file",
                ));
            }
            (None, Some(_)) => {
                return Err(ConfigError::new(
                    "rabbitmq",
                    "tls_client_cert_file",
                    "is required with rabbitmq.tls_client_key_file",
                ));
            }
        };
        let tls =
            outbox_adapters_rabbitmq::RabbitTls::from_files(self.tls_ca_file.as_deref(), client)
                .map_err(|e| {
                    let field = match e.what {
                        "CA certificate" => "tls_ca_file",
                        "client certificate" => "tls_client_cert_file",
                        _ => "tls_client_key_file",
                    };
                    ConfigError::new("rabbitmq", field, e)
                })?;
        let plain = self
            .nodes()
            .into_iter()
            .find(|u| !u.trim_start().to_ascii_lowercase().starts_with("amqps://"));
        if let (true, Some(plain)) = (tls.is_set(), plain) {
            let field = if self.tls_ca_file.is_some() {
                "tls_ca_file"
            } else {
                "tls_client_cert_file"
            };
            return Err(ConfigError::new(
                "rabbitmq",
                field,
                format!(
                    "is set but {} is not amqps://: the connection would not use TLS",
                    redact_url(&plain)
                ),
            ));
        }
        Ok(tls)
    }
}

const fn default_confirm_timeout() -> Duration {
    Duration::from_secs(30)
}

const fn default_in_flight() -> usize {
    1024
}

impl fmt::Debug for RabbitConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RabbitConfig")
            .field("url", &redact_url(&self.url))
            .field(
                "urls",
                &self.urls.iter().map(|u| redact_url(u)).collect::<Vec<_>>(),
            )
            .field("confirm_timeout", &self.confirm_timeout)
            .field("max_in_flight", &self.max_in_flight)
            .field("tls_ca_file", &self.tls_ca_file)
            .field("tls_client_cert_file", &self.tls_client_cert_file)
            .field("tls_client_key_file", &self.tls_client_key_file)
            .finish()
    }
}

/// Redis settings.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisConfig {
    /// `redis://[:password@]host:port[/db]`, or `rediss://` for TLS.
    pub url: String,
    /// PEM CA certificate(s) a `rediss://` URL trusts instead of the system's roots.
    #[serde(default)]
    pub tls_ca_file: Option<PathBuf>,
}

impl RedisConfig {
    /// The client for `url` and `tls_ca_file` (checked: PEM, and the URL is
    /// `rediss://` when it is set); no connection is made.
    ///
    /// # Errors
    /// [`ConfigError`] naming the setting.
    pub fn client(
        &self,
        max_connections: usize,
        timeout: Duration,
    ) -> Result<outbox_adapters_redis::RedisClient, ConfigError> {
        let tls = match &self.tls_ca_file {
            Some(ca) => outbox_adapters_redis::RedisTls::from_ca_file(ca)
                .map_err(|e| ConfigError::new("redis", "tls_ca_file", e))?,
            None => outbox_adapters_redis::RedisTls::default(),
        };
        outbox_adapters_redis::RedisClient::with_tls(&self.url, &tls, max_connections, timeout)
            .map_err(|e| {
                let field = if self.tls_ca_file.is_some() && !self.url.starts_with("rediss://") {
                    "tls_ca_file"
                } else {
                    "url"
                };
                ConfigError::new("redis", field, e)
            })
    }
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConfig")
            .field("url", &redact_url(&self.url))
            .field("tls_ca_file", &self.tls_ca_file)
            .finish()
    }
}

/// HTTP endpoints.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Listen address; loopback by default. Any other address requires `token`.
    pub address: SocketAddr,
    /// Bearer token for `/readyz` and `/metrics` (required off loopback).
    pub token: Option<String>,
    /// Serve HTTP at all.
    pub enabled: bool,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            address: SocketAddr::from(([127, 0, 0, 1], 9090)),
            token: None,
            enabled: true,
        }
    }
}

impl fmt::Debug for HttpConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpConfig")
            .field("address", &self.address)
            .field("token", &self.token.as_ref().map(|_| "***"))
            .field("enabled", &self.enabled)
            .finish()
    }
}

/// `[health]`: what readiness watches besides reaching the services.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HealthConfig {
    /// `/readyz` fails when work is due and no claim has taken rows and no mark has
    /// completed for this long (the relay is stuck, e.g. behind another session's
    /// lock, or the due rows are locked by another session); it clears by
    /// itself once work moves again.
    #[serde(with = "outbox_core::duration")]
    pub stall_after: Duration,
}

impl Default for HealthConfig {
    fn default() -> Self {
        Self {
            stall_after: outbox_runtime::DEFAULT_STALL_AFTER,
        }
    }
}

impl HealthConfig {
    fn validate(&self, section: &str) -> Result<(), ConfigError> {
        if self.stall_after.is_zero() {
            return Err(ConfigError::new(
                section,
                "stall_after",
                "must be greater than zero",
            ));
        }
        Ok(())
    }
}

/// Retention of sent messages (`[retention]`); defined beside its task, so that
/// embedding the relay needs no configuration file.
pub use outbox_relay::sent_retention::RetentionConfig;

/// The admin API's tokens and redaction lists (`[admin]`); defined beside the code
/// that serves it.
pub use crate::admin_api::AdminConfig;
/// `[[topology.*]]`: what the relay declares on RabbitMQ at start.
pub use crate::topology_config::TopologyConfig;

/// `[log]` and `[telemetry]`: outbox-telemetry's, shared with services that log
/// the same way.
pub use outbox_telemetry::{LogConfig, LogFormat, TelemetryConfig};

/// `[ordering]`: what a dead message does to the later messages of its key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OrderingConfig {
    /// `block` (default: the key waits until an operator requeues or deletes the
    /// dead message) or `skip` (the key goes on without it).
    pub on_dead: OnDead,
}

/// [`OrderingConfig::on_dead`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnDead {
    /// The key waits for an operator.
    #[default]
    Block,
    /// The key moves on.
    Skip,
}

impl OrderingConfig {
    /// The stores' setting.
    #[must_use]
    pub const fn dead_head(self) -> outbox_ports::DeadHead {
        match self.on_dead {
            OnDead::Block => outbox_ports::DeadHead::Block,
            OnDead::Skip => outbox_ports::DeadHead::Skip,
        }
    }
}

/// The whole configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelayConfig {
    /// This instance's name (lease holders, logs); default `relay-<uuid>`.
    #[serde(default)]
    pub instance: Option<String>,
    /// Adapter choice.
    pub adapters: Adapters,
    /// PostgreSQL (required when an adapter is `postgres`).
    #[serde(default)]
    pub postgres: Option<PostgresConfig>,
    /// RabbitMQ (required when the publisher is `rabbitmq`).
    #[serde(default)]
    pub rabbitmq: Option<RabbitConfig>,
    /// Redis (required when an adapter is `redis`).
    #[serde(default)]
    pub redis: Option<RedisConfig>,
    /// Dispatcher.
    #[serde(default)]
    pub dispatch: DispatcherConfig,
    /// Retry policy of publish failures.
    #[serde(default)]
    pub retry: RetryPolicy,
    /// The publish-retry sweep (seed defaults).
    #[serde(default)]
    pub sweep: SweepConfig,
    /// HTTP endpoints.
    #[serde(default)]
    pub http: HttpConfig,
    /// Readiness: the stall watchdog.
    #[serde(default)]
    pub health: HealthConfig,
    /// Retention of sent messages.
    #[serde(default)]
    pub retention: RetentionConfig,
    /// The admin API at `/api/v1` (closed without tokens).
    #[serde(default)]
    pub admin: AdminConfig,
    /// RabbitMQ exchanges, queues and bindings declared at start.
    #[serde(default)]
    pub topology: TopologyConfig,
    /// Per-key ordering (`[ordering]`).
    #[serde(default)]
    pub ordering: OrderingConfig,
    /// The log's format and filter.
    #[serde(default)]
    pub log: LogConfig,
    /// OpenTelemetry export (feature `otel`).
    #[serde(default)]
    pub telemetry: TelemetryConfig,
}

/// The error of a configuration that cannot be read, blamed on the environment
/// variable that set the setting at fault when one did (`OUTBOX__SWEEP__INTERVALL`
/// for an unknown field `intervall` of `sweep`, `OUTBOX__SWEEP__INTERVAL` for a bad
/// `sweep.interval`), else on the file.
fn blame(message: &str, variables: &[String], path: &Path) -> ConfigError {
    let (reason, key) = match message.rsplit_once(" for key `") {
        Some((reason, key)) => (reason, key.trim_end_matches('`')),
        None => (message, ""),
    };
    let unknown = reason
        .strip_prefix("unknown field `")
        .and_then(|rest| rest.split_once('`'))
        .map(|(field, _)| field);
    let setting = match (unknown, key) {
        (Some(field), "") => field.to_owned(),
        (Some(field), key) => format!("{key}.{field}"),
        (None, key) => key.to_owned(),
    };
    let from_env = variables.iter().find(|name| {
        let dotted = name
            .trim_start_matches("OUTBOX__")
            .to_ascii_lowercase()
            .replace("__", ".");
        !setting.is_empty() && (dotted == setting || dotted.starts_with(&format!("{setting}.")))
    });
    match from_env {
        Some(name) => ConfigError::new("", name, format!("{reason} (set in the environment)")),
        None => ConfigError::new("", &path.display().to_string(), message),
    }
}

impl RelayConfig {
    /// Loads `path` (TOML), then `OUTBOX__...` environment overrides, then validates.
    ///
    /// # Errors
    /// [`ConfigError`] naming the setting at fault, or the file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        Self::load_with_env(path, std::env::vars())
    }

    /// As [`RelayConfig::load`], with the environment given (for tests).
    ///
    /// # Errors
    /// As [`RelayConfig::load`].
    pub fn load_with_env(
        path: &Path,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let overrides: config::Map<String, String> = env
            .into_iter()
            .filter(|(k, _)| k.starts_with("OUTBOX__"))
            .collect();
        let names: Vec<String> = overrides.keys().cloned().collect();
        let loaded = config::Config::builder()
            .add_source(config::File::from(path).format(config::FileFormat::Toml))
            .add_source(
                config::Environment::with_prefix("OUTBOX")
                    .prefix_separator("__")
                    .separator("__")
                    .try_parsing(true)
                    // `OUTBOX__ADMIN__REDACT_HEADERS=authorization,x-api-key`.
                    .list_separator(",")
                    .with_list_parse_key("admin.redact_headers")
                    .with_list_parse_key("admin.redact_json_fields")
                    .with_list_parse_key("admin.ui.forwarders")
                    .with_list_parse_key("rabbitmq.urls")
                    .source(Some(overrides)),
            )
            .build()
            .map_err(|e| ConfigError::new("", &path.display().to_string(), e))?;
        let mut cfg: Self = loaded
            .try_deserialize()
            .map_err(|e| blame(&e.to_string(), &names, path))?;
        cfg.scope_default_keys();
        cfg.validate()?;
        Ok(cfg)
    }

    /// Left at their defaults, the sweep's lock and state keys are scoped by the
    /// PostgreSQL schema, so two deployments sharing one Redis never share a sweep
    /// (one would hold back the other's retries). Keys set explicitly are kept.
    pub fn scope_default_keys(&mut self) {
        let Some(pg) = &self.postgres else { return };
        // The keys an embedded relay (`Service::postgres`) derives too: both on one
        // schema share one sweep.
        let scoped = outbox_app::keys::relay_sweep(&pg.schema, self.sweep.clone());
        if self.sweep.lock_key == outbox_core::config::DEFAULT_LOCK_KEY {
            self.sweep.lock_key = scoped.lock_key;
        }
        if self.sweep.state_key == outbox_core::config::DEFAULT_STATE_KEY {
            self.sweep.state_key = scoped.state_key;
        }
    }

    /// Checks every setting and that each chosen adapter has its section.
    ///
    /// # Errors
    /// [`ConfigError`] naming the setting.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let a = &self.adapters;
        let needs_pg = a.store == StoreKind::Postgres
            || a.lock == CoordinationKind::Postgres
            || a.sweep_state == CoordinationKind::Postgres;
        let needs_redis =
            a.lock == CoordinationKind::Redis || a.sweep_state == CoordinationKind::Redis;
        if needs_pg {
            let pg = self.postgres.as_ref().ok_or_else(|| {
                ConfigError::new("postgres", "url", "is required by the chosen adapters")
            })?;
            sqlx_url_check(&pg.url).map_err(|r| ConfigError::new("postgres", "url", r))?;
            outbox_adapters_postgres::PgSchema::new(&pg.schema)
                .map_err(|e| ConfigError::new("postgres", "schema", e))?;
            if pg.max_connections == 0 {
                return Err(ConfigError::new(
                    "postgres",
                    "max_connections",
                    "must be at least 1",
                ));
            }
            pg.validate_bounds()?;
        }
        if a.publisher == PublisherKind::Rabbitmq {
            let r = self.rabbitmq.as_ref().ok_or_else(|| {
                ConfigError::new("rabbitmq", "url", "is required by the rabbitmq publisher")
            })?;
            if r.nodes().is_empty() {
                return Err(ConfigError::new(
                    "rabbitmq",
                    "url",
                    "is required by the rabbitmq publisher (or rabbitmq.urls, several nodes)",
                ));
            }
            // Every node of one cluster: the same scheme, user and vhost (a `url`
            // left over from another broker would otherwise take a share of the
            // messages where no consumer reads them).
            let mut first: Option<(String, lapin::uri::AMQPUri)> = None;
            let named = std::iter::once(("url", r.url.trim()))
                .filter(|(_, u)| !u.is_empty())
                .chain(
                    r.urls
                        .iter()
                        .map(|u| ("urls", u.trim()))
                        .filter(|(_, u)| !u.is_empty()),
                );
            for (n, (field, url)) in named.enumerate() {
                // An entry that does not parse is named by its place, not shown: a
                // password holding a comma splits the environment's list, and a
                // piece of it would not look like a URL to redact.
                let parsed = lapin::uri::AMQPUri::from_str(url).map_err(|_| {
                    ConfigError::new(
                        "rabbitmq",
                        field,
                        format!(
                            "node {} of rabbitmq.url and rabbitmq.urls is not an AMQP URL (write a comma in a password as %2C)",
                            n + 1
                        ),
                    )
                })?;
                match &first {
                    None => first = Some((url.to_owned(), parsed)),
                    Some((first_url, f)) => {
                        if f.scheme != parsed.scheme
                            || f.authority.userinfo.username != parsed.authority.userinfo.username
                            || f.vhost != parsed.vhost
                        {
                            return Err(ConfigError::new(
                                "rabbitmq",
                                field,
                                format!(
                                    "{} is not a node of the same broker as {}: every node needs the same scheme, user and vhost",
                                    redact_url(url),
                                    redact_url(first_url)
                                ),
                            ));
                        }
                    }
                }
            }
            if r.max_in_flight == 0 {
                return Err(ConfigError::new(
                    "rabbitmq",
                    "max_in_flight",
                    "must be at least 1",
                ));
            }
            if r.confirm_timeout.is_zero() {
                return Err(ConfigError::new(
                    "rabbitmq",
                    "confirm_timeout",
                    "must be greater than zero",
                ));
            }
            r.tls()?;
        }
        if needs_redis {
            let r = self.redis.as_ref().ok_or_else(|| {
                ConfigError::new("redis", "url", "is required by the chosen adapters")
            })?;
            r.client(1, Duration::from_secs(1))?;
        }
        let d = &self.dispatch;
        if d.batch_size == 0 || d.batch_size > 10_000 {
            return Err(ConfigError::new(
                "dispatch",
                "batch_size",
                format!("must be between 1 and 10000 (got {})", d.batch_size),
            ));
        }
        if d.lease_ttl < Duration::from_secs(1) {
            return Err(ConfigError::new(
                "dispatch",
                "lease_ttl",
                "must be at least 1s",
            ));
        }
        if let Some(r) = self
            .rabbitmq
            .as_ref()
            .filter(|_| a.publisher == PublisherKind::Rabbitmq)
            && d.lease_ttl <= r.confirm_timeout
        {
            return Err(ConfigError::new(
                "dispatch",
                "lease_ttl",
                format!(
                    "must be longer than rabbitmq.confirm_timeout ({:?} <= {:?}): a batch still waiting for its confirms would lose its claim and be published twice",
                    d.lease_ttl, r.confirm_timeout
                ),
            ));
        }
        if d.pipelines == 0 || d.pipelines > 16 {
            return Err(ConfigError::new(
                "dispatch",
                "pipelines",
                format!("must be between 1 and 16 (got {})", d.pipelines),
            ));
        }
        if d.idle_poll.is_zero() {
            return Err(ConfigError::new(
                "dispatch",
                "idle_poll",
                "must be greater than zero",
            ));
        }
        self.retry.validate("retry")?;
        self.sweep.validate("sweep")?;
        self.retention.validate("retention")?;
        self.health.validate("health")?;
        self.admin.validate("admin")?;
        if !self.topology.is_empty() && a.publisher != PublisherKind::Rabbitmq {
            return Err(ConfigError::new(
                "",
                "topology",
                "is declared on RabbitMQ: it needs adapters.publisher = \"rabbitmq\"",
            ));
        }
        self.topology.to_topology()?;
        self.log.validate("log")?;
        self.telemetry.validate("telemetry")?;
        if self.http.enabled && !self.http.address.ip().is_loopback() && self.http.token.is_none() {
            return Err(ConfigError::new(
                "http",
                "token",
                "is required when http.address is not a loopback address",
            ));
        }
        if let Some(i) = &self.instance {
            outbox_core::config::validate_key(i)
                .map_err(|r| ConfigError::new("", "instance", r))?;
        }
        Ok(())
    }
}

fn sqlx_url_check(url: &str) -> Result<(), String> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(())
    } else {
        Err(format!("{} is not a postgres:// URL", redact_url(url)))
    }
}
