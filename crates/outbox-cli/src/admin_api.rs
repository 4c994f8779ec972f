//! The admin API's settings (`[admin]`) and how `outbox run` serves it: the
//! [`outbox_admin`] router, nested at [`ADMIN_API_PATH`] on the relay's HTTP address.
//! Defined here rather than in `config`, so that a service embedding the HTTP
//! endpoints can take the same settings without the command line.

use outbox_admin::{AdminAuth, AdminPorts, AdminService, AdminToken, Redaction};
use outbox_core::config::ConfigError;
use outbox_ports::SweepStateStore;
use serde::Deserialize;
use std::collections::HashSet;
use std::sync::Arc;

pub use outbox_admin::{Role, Secret};

/// Where the admin API is mounted.
pub const ADMIN_API_PATH: &str = "/api/v1";

/// Where the dashboard is mounted (its login page: `/ui/login`).
pub const UI_PATH: &str = "/ui";

/// The shortest secret accepted: a guessable token would open every write.
pub const MIN_SECRET_CHARS: usize = 16;

/// `[admin]`: who may use the admin API and what its views hide. Without tokens the
/// API answers 403 to everything. `Debug` shows secrets as `***`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// `[[admin.tokens]]`: `name`, `secret` (or `secret_file`, a file holding it),
    /// `role = "read" | "write"`.
    #[serde(deserialize_with = "tokens")]
    pub tokens: Vec<AdminToken>,
    /// Header names whose values are shown as `***`.
    pub redact_headers: Vec<String>,
    /// JSON keys (at any depth) whose values are shown as `***`.
    pub redact_json_fields: Vec<String>,
    /// Lets write tokens edit a dead message and replay it as a new one (off by
    /// default: a replay sends what no producer wrote).
    pub allow_edit: bool,
    /// `[admin.ui]`: the dashboard at [`UI_PATH`] (same tokens as the API).
    pub ui: UiConfig,
    /// `[admin.trusted_proxy]`: sign-in to the dashboard by a single sign-on proxy
    /// in front of it; none by default.
    pub trusted_proxy: Option<TrustedProxyConfig>,
}

/// `[admin.trusted_proxy]`: the proxy's addresses, the headers it names the user
/// (and groups) in, and the roles they get.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrustedProxyConfig {
    /// The header naming the signed-in user (`X-Forwarded-User`).
    pub header: String,
    /// The proxy's addresses or networks (`["127.0.0.1/32", "10.0.0.0/8"]`, a bare
    /// address for one): only requests from these are believed.
    pub from: Vec<String>,
    /// The header listing the user's groups, comma-separated.
    #[serde(default)]
    pub groups_header: Option<String>,
    /// Roles by user name: `{ alice = "write", bob = "read" }`.
    #[serde(default)]
    pub users: std::collections::BTreeMap<String, Role>,
    /// Roles by group name (the strongest of a user's groups).
    #[serde(default)]
    pub groups: std::collections::BTreeMap<String, Role>,
    /// The secret the proxy sends on every request in `secret_header` (at least
    /// [`MIN_SECRET_CHARS`] characters): without it the user header is anyone's
    /// (any local process, when `from` is loopback). `Debug` shows `***`.
    #[serde(default)]
    pub secret: Option<Secret>,
    /// A file holding the secret instead (one final line break dropped).
    #[serde(default)]
    pub secret_file: Option<std::path::PathBuf>,
    /// The header the proxy sends the secret in.
    #[serde(default = "default_secret_header")]
    pub secret_header: String,
}

fn default_secret_header() -> String {
    "X-Outbox-Proxy-Secret".to_owned()
}

/// `list` (addresses or networks) as networks: a bare address is one address;
/// `/0` (every address) is refused.
fn networks(at: &str, field: &str, list: &[String]) -> Result<Vec<ipnet::IpNet>, ConfigError> {
    let nets = list
        .iter()
        .map(|f| {
            f.parse::<ipnet::IpNet>()
                .or_else(|_| f.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
                .map_err(|_| {
                    ConfigError::new(at, field, format!("{f:?} is not an address or network"))
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(all) = nets.iter().find(|n| n.prefix_len() == 0) {
        return Err(ConfigError::new(
            at,
            field,
            format!(
                "{all} is every address: anyone could claim to be the proxy; list the proxy's own"
            ),
        ));
    }
    Ok(nets)
}

impl TrustedProxyConfig {
    /// The checked settings: at least one address, each a network or an address,
    /// a header name, and some role to give.
    ///
    /// # Errors
    /// [`ConfigError`] naming the setting.
    pub fn proxy(&self, section: &str) -> Result<outbox_admin::TrustedProxy, ConfigError> {
        let at = format!("{section}.trusted_proxy");
        if axum::http::HeaderName::from_bytes(self.header.as_bytes()).is_err() {
            return Err(ConfigError::new(&at, "header", "is not a header name"));
        }
        if let Some(g) = &self.groups_header
            && axum::http::HeaderName::from_bytes(g.as_bytes()).is_err()
        {
            return Err(ConfigError::new(
                &at,
                "groups_header",
                "is not a header name",
            ));
        }
        if self.from.is_empty() {
            return Err(ConfigError::new(
                &at,
                "from",
                "must name the proxy's addresses (requests from elsewhere are not believed)",
            ));
        }
        let from = networks(&at, "from", &self.from)?;
        if self.users.is_empty() && self.groups.is_empty() {
            return Err(ConfigError::new(
                &at,
                "users",
                "give roles to users or groups (users = { alice = \"write\" })",
            ));
        }
        if axum::http::HeaderName::from_bytes(self.secret_header.as_bytes()).is_err() {
            return Err(ConfigError::new(
                &at,
                "secret_header",
                "is not a header name",
            ));
        }
        let secret = match (&self.secret, &self.secret_file) {
            (Some(secret), None) => secret.clone(),
            (None, Some(path)) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    ConfigError::new(
                        &at,
                        "secret_file",
                        format!("{} cannot be read: {e}", path.display()),
                    )
                })?;
                let text = text.strip_suffix('\n').unwrap_or(&text);
                Secret::new(text.strip_suffix('\r').unwrap_or(text))
            }
            (Some(_), Some(_)) => {
                return Err(ConfigError::new(
                    &at,
                    "secret",
                    "and secret_file are both set; give one",
                ));
            }
            (None, None) => {
                return Err(ConfigError::new(
                    &at,
                    "secret",
                    format!(
                        "is required: the secret the proxy sends in {} on every request (without it any process that reaches the port could sign in as anyone)",
                        self.secret_header
                    ),
                ));
            }
        };
        let chars = secret.expose().chars().count();
        if chars < MIN_SECRET_CHARS {
            return Err(ConfigError::new(
                &at,
                "secret",
                format!("must be at least {MIN_SECRET_CHARS} characters (got {chars})"),
            ));
        }
        Ok(outbox_admin::TrustedProxy {
            user_header: self.header.to_ascii_lowercase(),
            groups_header: self.groups_header.as_ref().map(|g| g.to_ascii_lowercase()),
            from,
            users: self.users.clone(),
            groups: self.groups.clone(),
            secret_header: self.secret_header.to_ascii_lowercase(),
            secret,
        })
    }
}

/// A token as written in the configuration: its secret inline or in a file (a
/// mounted secret, kept out of the configuration and its history).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenEntry {
    name: String,
    secret: Option<Secret>,
    secret_file: Option<std::path::PathBuf>,
    role: Role,
}

/// The tokens, each secret read from its `secret_file` when it has one (a final
/// line break dropped): exactly one of `secret` and `secret_file`.
fn tokens<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<AdminToken>, D::Error> {
    use serde::de::Error;
    let entries = Vec::<TokenEntry>::deserialize(d)?;
    entries
        .into_iter()
        .map(|e| {
            let secret = match (e.secret, e.secret_file) {
                (Some(secret), None) => secret,
                (None, Some(path)) => {
                    let text = std::fs::read_to_string(&path).map_err(|err| {
                        D::Error::custom(format!(
                            "secret_file {} of token `{}` cannot be read: {err}",
                            path.display(),
                            e.name
                        ))
                    })?;
                    // One final line break, as `echo` and editors leave.
                    let text = text.strip_suffix('\n').unwrap_or(&text);
                    Secret::new(text.strip_suffix('\r').unwrap_or(text))
                }
                (Some(_), Some(_)) => {
                    return Err(D::Error::custom(format!(
                        "token `{}` has both secret and secret_file; give one",
                        e.name
                    )));
                }
                (None, None) => {
                    return Err(D::Error::custom(format!(
                        "token `{}` needs a secret or a secret_file",
                        e.name
                    )));
                }
            };
            Ok(AdminToken {
                name: e.name,
                secret,
                role: e.role,
            })
        })
        .collect()
}

/// `[admin.ui]`: how the dashboard's sessions work.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UiConfig {
    /// Serve the dashboard at all.
    pub enabled: bool,
    /// Mark the session cookie `Secure`: set it when browsers reach the dashboard
    /// over HTTPS (a proxy terminating TLS in front of `http.address`).
    pub secure_cookies: bool,
    /// How long a login lasts (`"8h"`).
    #[serde(with = "outbox_core::duration")]
    pub session_ttl: std::time::Duration,
    /// Addresses (or networks) of proxies that only forward (a TLS terminator, a
    /// load balancer): their `X-Forwarded-For` names the client whose failed
    /// logins (and the API's failed bearer tokens) count; nobody is signed in by
    /// them.
    pub forwarders: Vec<String>,
}

impl Default for UiConfig {
    fn default() -> Self {
        let defaults = outbox_admin::UiOptions::default();
        Self {
            enabled: true,
            secure_cookies: defaults.secure_cookies,
            session_ttl: defaults.session_ttl,
            forwarders: Vec::new(),
        }
    }
}

impl AdminConfig {
    /// Checks the tokens: names non-empty and unique, secrets at least
    /// [`MIN_SECRET_CHARS`] characters and unique (a shared secret would make the
    /// audit log name the wrong token).
    ///
    /// # Errors
    /// [`ConfigError`] naming `section.tokens` and the token.
    pub fn validate(&self, section: &str) -> Result<(), ConfigError> {
        if let Some(p) = &self.trusted_proxy {
            p.proxy(section)?;
        }
        networks(&format!("{section}.ui"), "forwarders", &self.ui.forwarders)?;
        let mut names = HashSet::new();
        let mut secrets = HashSet::new();
        for (i, token) in self.tokens.iter().enumerate() {
            let at = |what: &str| format!("tokens[{i}].{what}");
            if token.name.trim().is_empty() {
                return Err(ConfigError::new(section, &at("name"), "must not be empty"));
            }
            if !names.insert(token.name.as_str()) {
                return Err(ConfigError::new(
                    section,
                    &at("name"),
                    format!(
                        "`{}` is used by two tokens; names must be unique",
                        token.name
                    ),
                ));
            }
            let chars = token.secret.expose().chars().count();
            if chars < MIN_SECRET_CHARS {
                return Err(ConfigError::new(
                    section,
                    &at("secret"),
                    format!(
                        "of token `{}` must be at least {MIN_SECRET_CHARS} characters (got {chars})",
                        token.name
                    ),
                ));
            }
            if !secrets.insert(token.secret.expose()) {
                return Err(ConfigError::new(
                    section,
                    &at("secret"),
                    format!(
                        "of token `{}` is also another token's; secrets must be unique",
                        token.name
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The admin service over `ports` with these redaction lists, showing the last
    /// report stored under each of `sweep_keys` in `state`.
    #[must_use]
    pub fn service(
        &self,
        ports: AdminPorts,
        state: Arc<dyn SweepStateStore>,
        sweep_keys: Vec<String>,
    ) -> AdminService {
        AdminService::new(ports)
            .with_redaction(Redaction::new(
                self.redact_headers.iter().cloned(),
                self.redact_json_fields.iter().cloned(),
            ))
            .with_sweep_reports(state, sweep_keys)
            .with_edit(self.allow_edit)
    }

    /// The configured tokens; the API counts failed ones per client the
    /// `[admin.ui] forwarders` forward for, as the dashboard's login does.
    #[must_use]
    pub fn auth(&self) -> AdminAuth {
        // Checked when the configuration loaded (`validate`).
        AdminAuth::new(self.tokens.clone()).with_forwarders(
            networks("admin.ui", "forwarders", &self.ui.forwarders).unwrap_or_default(),
        )
    }

    /// The admin API's router, to nest at [`ADMIN_API_PATH`].
    pub fn router(&self, service: AdminService) -> axum::Router {
        outbox_admin::router(service, self.auth())
    }

    /// The dashboard's router over the same service and tokens, to nest at
    /// [`UI_PATH`]; `None` when `[admin.ui] enabled = false`. Its live streams
    /// end when `shutdown` turns true (or its sender is dropped); its sessions are
    /// kept in `session_store` (`None`: in memory).
    pub fn ui_router(
        &self,
        service: AdminService,
        shutdown: Option<tokio::sync::watch::Receiver<bool>>,
        session_store: Option<std::sync::Arc<dyn tower_sessions_core::SessionStore>>,
    ) -> Option<axum::Router> {
        self.ui.enabled.then(|| {
            outbox_admin::ui_router(
                service,
                self.auth(),
                outbox_admin::UiOptions {
                    base: UI_PATH.to_owned(),
                    secure_cookies: self.ui.secure_cookies,
                    session_ttl: self.ui.session_ttl,
                    // Checked when the configuration loaded (`validate`).
                    trusted_proxy: self
                        .trusted_proxy
                        .as_ref()
                        .and_then(|p| p.proxy("admin").ok()),
                    forwarders: networks("admin.ui", "forwarders", &self.ui.forwarders)
                        .unwrap_or_default(),
                    shutdown,
                    session_store,
                    ..outbox_admin::UiOptions::default()
                },
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(name: &str, secret: &str) -> AdminToken {
        AdminToken {
            name: name.into(),
            secret: Secret::new(secret),
            role: Role::Read,
        }
    }

    fn check(tokens: Vec<AdminToken>) -> Result<(), String> {
        AdminConfig {
            tokens,
            ..AdminConfig::default()
        }
        .validate("admin")
        .map_err(|e| e.to_string())
    }

    #[test]
    fn tokens_are_checked_and_the_error_names_the_setting() {
        assert_eq!(check(vec![]), Ok(()));
        assert_eq!(
            check(vec![
                token("a", "0123456789abcdef"),
                token("b", "0123456789abcdeg")
            ]),
            Ok(())
        );
        let e = check(vec![token(" ", "0123456789abcdef")]).expect_err("refused");
        assert!(e.contains("admin") && e.contains("tokens[0].name"), "{e}");
        let e = check(vec![
            token("a", "0123456789abcdef"),
            token("a", "0123456789abcdeg"),
        ])
        .expect_err("refused");
        assert!(e.contains("tokens[1].name") && e.contains("unique"), "{e}");
        let e = check(vec![token("a", "short-secret")]).expect_err("refused");
        assert!(e.contains("tokens[0].secret") && e.contains("16"), "{e}");
        assert!(!e.contains("short-secret"), "the secret is not shown: {e}");
        let e = check(vec![
            token("a", "0123456789abcdef"),
            token("b", "0123456789abcdef"),
        ])
        .expect_err("refused");
        assert!(e.contains("tokens[1].secret") && !e.contains("0123"), "{e}");
    }

    #[test]
    fn debug_hides_the_secrets() {
        let cfg = AdminConfig {
            tokens: vec![token("ops", "correct-horse-battery")],
            ..AdminConfig::default()
        };
        let shown = format!("{cfg:?}");
        assert!(!shown.contains("correct-horse"), "{shown}");
        assert!(shown.contains("ops") && shown.contains("***"), "{shown}");
    }
}
