//! Configuration of the retry sweep, with the seed's defaults, and its validation.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A configuration value that cannot be used. `field` is the dotted path of the
/// setting (e.g. `relay.sweep.batch_size`), so the message points at the line to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid configuration `{field}`: {reason}")]
pub struct ConfigError {
    /// Dotted path of the offending setting.
    pub field: String,
    /// What is wrong with it.
    pub reason: String,
}

impl ConfigError {
    /// An error for `prefix.name` (or just `name` when `prefix` is empty).
    pub fn new(prefix: &str, name: &str, reason: impl fmt::Display) -> Self {
        let field = if prefix.is_empty() {
            name.to_owned()
        } else {
            format!("{prefix}.{name}")
        };
        Self {
            field,
            reason: reason.to_string(),
        }
    }
}

/// Settings of one retry sweep (the relay's publish retries, or a consumer's consume
/// retries). Defaults are the seed service's constants.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SweepConfig {
    /// Time between the end of one sweep and the start of the next, cluster-wide.
    /// Seed: 1 minute. Also the floor under every per-message backoff.
    #[serde(with = "crate::duration")]
    pub interval: Duration,
    /// Rows claimed per batch. Seed: 50.
    pub batch_size: u32,
    /// Batches at most per sweep (the seed did one); a sweep also stops when a batch
    /// comes back short, meaning nothing more is due.
    pub max_batches_per_sweep: u32,
    /// How long to wait for the cluster-wide lock before skipping a round. Seed: 3 s.
    #[serde(with = "crate::duration")]
    pub lock_wait: Duration,
    /// Lease of the lock; renewed while a sweep runs, lost if the holder stalls.
    #[serde(with = "crate::duration")]
    pub lock_ttl: Duration,
    /// How long the shared sweep state is kept. Seed: 7 days.
    #[serde(with = "crate::duration")]
    pub state_ttl: Duration,
    /// Lock key, shared by every instance of one sweep.
    pub lock_key: String,
    /// Sweep-state key, shared by every instance of one sweep.
    pub state_key: String,
}

/// Default lock key of the relay's publish-retry sweep.
pub const DEFAULT_LOCK_KEY: &str = "outbox.retry.run-lock";
/// Default state key of the relay's publish-retry sweep.
pub const DEFAULT_STATE_KEY: &str = "outbox.retry.last-state";

impl Default for SweepConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(60),
            batch_size: 50,
            max_batches_per_sweep: 20,
            lock_wait: Duration::from_secs(3),
            lock_ttl: Duration::from_secs(30),
            state_ttl: Duration::from_secs(7 * 24 * 3600),
            lock_key: DEFAULT_LOCK_KEY.to_owned(),
            state_key: DEFAULT_STATE_KEY.to_owned(),
        }
    }
}

/// Longest lock or state key accepted.
pub const MAX_KEY_LEN: usize = 200;

impl SweepConfig {
    /// The defaults with keys of a consumer's own consume-retry sweep, so that relay
    /// and consumer sweeps never share a lock or a state.
    #[must_use]
    pub fn for_consumer(consumer: &str) -> Self {
        Self {
            lock_key: format!("outbox.consume-retry.{consumer}.run-lock"),
            state_key: format!("outbox.consume-retry.{consumer}.last-state"),
            ..Self::default()
        }
    }

    /// Checks every setting; `prefix` is the dotted path of this section.
    ///
    /// # Errors
    /// [`ConfigError`] for the first setting out of range.
    pub fn validate(&self, prefix: &str) -> Result<(), ConfigError> {
        let err = |name: &str, reason: &str| Err(ConfigError::new(prefix, name, reason));
        if self.interval.is_zero() {
            return err("interval", "must be greater than zero");
        }
        if self.batch_size == 0 || self.batch_size > 10_000 {
            return Err(ConfigError::new(
                prefix,
                "batch_size",
                format!("must be between 1 and 10000 (got {})", self.batch_size),
            ));
        }
        if self.max_batches_per_sweep == 0 {
            return err("max_batches_per_sweep", "must be at least 1");
        }
        if self.lock_wait.is_zero() {
            return err("lock_wait", "must be greater than zero");
        }
        if self.lock_ttl < Duration::from_secs(1) {
            return err("lock_ttl", "must be at least 1s");
        }
        if self.state_ttl < self.interval {
            return err("state_ttl", "must be at least the interval");
        }
        for (name, key) in [("lock_key", &self.lock_key), ("state_key", &self.state_key)] {
            validate_key(key).map_err(|reason| ConfigError::new(prefix, name, reason))?;
        }
        if self.lock_key == self.state_key {
            return err("state_key", "must differ from lock_key");
        }
        Ok(())
    }
}

/// A lock or state key: 1 to [`MAX_KEY_LEN`] visible ASCII characters.
///
/// # Errors
/// A reason when the key is empty, too long, or holds spaces or control characters.
pub fn validate_key(key: &str) -> Result<(), String> {
    if key.is_empty() {
        return Err("must not be empty".to_owned());
    }
    if key.len() > MAX_KEY_LEN {
        return Err(format!("must be at most {MAX_KEY_LEN} characters"));
    }
    if !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("must be visible ASCII without spaces".to_owned());
    }
    Ok(())
}

/// Passwords never reach logs, errors or `Debug` output: connection URLs are shown
/// through these.
/// `url` with any password replaced by `***`, for messages and logs.
#[must_use]
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let rest = &url[scheme_end + 3..];
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    match authority.rfind('@') {
        Some(at) => {
            let userinfo = &authority[..at];
            let user = userinfo.split(':').next().unwrap_or("");
            let shown = if userinfo.contains(':') {
                format!("{user}:***")
            } else {
                user.to_owned()
            };
            format!("{}://{shown}{}", &url[..scheme_end], &rest[at..])
        }
        None => url.to_owned(),
    }
}

/// `text` with `url` shown redacted and its password replaced by `***`, in case an
/// error message echoes either.
#[must_use]
pub fn redact_secret_in(text: &str, url: &str) -> String {
    let mut out = text.replace(url, &redact_url(url));
    if let Some(password) = password_of(url) {
        if !password.is_empty() {
            out = out.replace(password, "***");
        }
    }
    out
}

fn password_of(url: &str) -> Option<&str> {
    let rest = &url[url.find("://")? + 3..];
    let authority = &rest[..rest.find(['/', '?']).unwrap_or(rest.len())];
    let userinfo = &authority[..authority.rfind('@')?];
    userinfo.split_once(':').map(|(_, p)| p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_show() {
        let url = "postgres://app:s3cret@db.example:5432/orders?sslmode=require";
        assert_eq!(
            redact_url(url),
            "postgres://app:***@db.example:5432/orders?sslmode=require"
        );
        assert_eq!(
            redact_secret_in(&format!("failed: {url}"), url),
            "failed: postgres://app:***@db.example:5432/orders?sslmode=require"
        );
        assert_eq!(
            redact_secret_in("password s3cret rejected", url),
            "password *** rejected"
        );
        assert_eq!(redact_url("redis://:pw@h:6379/0"), "redis://:***@h:6379/0");
        assert_eq!(redact_url("postgres://app@h/db"), "postgres://app@h/db");
        assert_eq!(redact_url("not a url"), "not a url");
    }

    #[test]
    fn defaults_are_the_seeds() {
        let c = SweepConfig::default();
        assert_eq!(c.interval, Duration::from_secs(60));
        assert_eq!(c.batch_size, 50);
        assert_eq!(c.lock_wait, Duration::from_secs(3));
        assert_eq!(c.state_ttl, Duration::from_secs(7 * 86_400));
        assert!(c.validate("sweep").is_ok());
    }

    #[test]
    fn each_bad_value_names_its_field() {
        type Mutation = fn(&mut SweepConfig);
        let cases: [(&str, Mutation); 8] = [
            ("interval", |c| c.interval = Duration::ZERO),
            ("batch_size", |c| c.batch_size = 0),
            ("batch_size", |c| c.batch_size = 10_001),
            ("max_batches_per_sweep", |c| c.max_batches_per_sweep = 0),
            ("lock_wait", |c| c.lock_wait = Duration::ZERO),
            ("lock_ttl", |c| c.lock_ttl = Duration::from_millis(10)),
            ("lock_key", |c| c.lock_key = "has space".into()),
            ("state_key", |c| c.state_key = c.lock_key.clone()),
        ];
        for (field, mutate) in cases {
            let mut c = SweepConfig::default();
            mutate(&mut c);
            let e = c.validate("relay.sweep").expect_err(field);
            assert_eq!(e.field, format!("relay.sweep.{field}"), "{e}");
            assert!(
                e.to_string()
                    .starts_with("invalid configuration `relay.sweep.")
            );
        }
    }

    #[test]
    fn deserializes_human_durations_and_rejects_unknown_fields() {
        let c: SweepConfig =
            serde_json::from_str(r#"{"interval":"5s","batch_size":10}"#).expect("valid");
        assert_eq!(c.interval, Duration::from_secs(5));
        assert_eq!(c.batch_size, 10);
        assert_eq!(c.lock_wait, Duration::from_secs(3), "default kept");
        let e = serde_json::from_str::<SweepConfig>(r#"{"intervall":"5s"}"#).expect_err("typo");
        assert!(e.to_string().contains("intervall"), "{e}");
    }

    #[test]
    fn consumer_keys_differ_from_the_relays() {
        let c = SweepConfig::for_consumer("billing");
        assert_ne!(c.lock_key, SweepConfig::default().lock_key);
        assert_ne!(c.state_key, SweepConfig::default().state_key);
        assert!(c.validate("consumer.sweep").is_ok());
    }
}
