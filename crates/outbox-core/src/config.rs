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

    /// [`Self::for_consumer`], swept as often as `retry`'s first backoff (at least
    /// every second, at most every minute): a delivery that failed is retried about
    /// when the consumer's policy says, not at the next minute.
    #[must_use]
    pub fn for_consumer_retrying(consumer: &str, retry: &crate::RetryPolicy) -> Self {
        let interval = retry
            .initial_backoff
            .clamp(Duration::from_secs(1), Duration::from_secs(60));
        let base = Self::for_consumer(consumer);
        Self {
            interval,
            state_ttl: base.state_ttl.max(interval),
            ..base
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

/// Query keys whose values are secrets (compared case-insensitively, also as the
/// end of a longer key: `client_secret`, `access_token`, `sslpassword`).
const SECRET_QUERY_KEYS: &[&str] = &["password", "pass", "pwd", "sslpassword", "token", "secret"];

/// Whether query key `key` names a secret.
fn is_secret_key(key: &str) -> bool {
    let key = percent_decoded(key).to_ascii_lowercase();
    SECRET_QUERY_KEYS.contains(&key.as_str())
        || ["password", "token", "secret"]
            .iter()
            .any(|end| key.ends_with(end))
}

/// `text` with its `%XX` escapes decoded (bytes that are not UTF-8 replaced).
fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).copied(),
            bytes.get(i + 2).copied(),
        ) {
            (b'%', Some(h), Some(l)) if hex(h).is_some() && hex(l).is_some() => {
                let (h, l) = (hex(h).unwrap_or(0), hex(l).unwrap_or(0));
                out.push(u8::try_from(h * 16 + l).unwrap_or(b'?'));
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The query of `url` (after the first `?`, before any `#`) as its range.
fn query_range(url: &str) -> Option<std::ops::Range<usize>> {
    let start = url.find('?')? + 1;
    let end = url[start..].find('#').map_or(url.len(), |e| start + e);
    Some(start..end)
}

/// The query's `key=value` pairs (split on `&` and `;`), as written.
fn query_pairs(query: &str) -> impl Iterator<Item = (&str, Option<&str>)> {
    query
        .split(['&', ';'])
        .map(|pair| match pair.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (pair, None),
        })
}

/// Passwords never reach logs, errors or `Debug` output: connection URLs are shown
/// through these.
/// `url` with any password replaced by `***`, for messages and logs: the
/// user-info's, and the value of every secret query key (`?password=`,
/// `sslpassword`, `pass`, `pwd`, `token`, `secret`, any case).
#[must_use]
pub fn redact_url(url: &str) -> String {
    let shown = redact_userinfo(url);
    let Some(range) = query_range(&shown) else {
        return shown;
    };
    let query: Vec<String> = query_pairs(&shown[range.clone()])
        .map(|(k, v)| match v {
            Some(_) if is_secret_key(k) => format!("{k}=***"),
            Some(v) => format!("{k}={v}"),
            None => k.to_owned(),
        })
        .collect();
    // Separators kept as written (`&` or `;`).
    let mut rebuilt = String::new();
    let mut seps = shown[range.clone()]
        .chars()
        .filter(|c| *c == '&' || *c == ';');
    for (i, pair) in query.iter().enumerate() {
        if i > 0 {
            rebuilt.push(seps.next().unwrap_or('&'));
        }
        rebuilt.push_str(pair);
    }
    format!("{}{rebuilt}{}", &shown[..range.start], &shown[range.end..])
}

/// `url` with the user-info's password replaced by `***`.
fn redact_userinfo(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let rest = &url[scheme_end + 3..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
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

/// `text` with `url` shown redacted and its secrets (the user-info's password,
/// secret query values; as written and percent-decoded) replaced by `***`, in case
/// an error message echoes either.
#[must_use]
pub fn redact_secret_in(text: &str, url: &str) -> String {
    let mut out = text.replace(url, &redact_url(url));
    let mut secrets = secrets_of(url);
    // The longest first: a secret that holds another is replaced whole.
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    for secret in secrets {
        if !secret.is_empty() && secret != "***" {
            out = out.replace(&secret, "***");
        }
    }
    out
}

/// The secrets `url` holds, as written and percent-decoded.
fn secrets_of(url: &str) -> Vec<String> {
    let mut secrets: Vec<String> = Vec::new();
    if let Some(password) = password_of(url) {
        secrets.push(password.to_owned());
    }
    if let Some(range) = query_range(url) {
        for (k, v) in query_pairs(&url[range]) {
            if let Some(v) = v.filter(|_| is_secret_key(k)) {
                secrets.push(v.to_owned());
                secrets.push(v.replace('+', " "));
            }
        }
    }
    let decoded: Vec<String> = secrets.iter().map(|s| percent_decoded(s)).collect();
    secrets.extend(decoded);
    secrets.sort();
    secrets.dedup();
    secrets
}

fn password_of(url: &str) -> Option<&str> {
    let rest = &url[url.find("://")? + 3..];
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
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
    fn a_password_in_the_query_never_shows() {
        let url = "postgres://app@db.example/orders?sslmode=require&PassWord=s3cr%2Ft&application_name=relay";
        let shown = redact_url(url);
        assert_eq!(
            shown,
            "postgres://app@db.example/orders?sslmode=require&PassWord=***&application_name=relay"
        );
        for key in [
            "password",
            "pass",
            "pwd",
            "sslpassword",
            "token",
            "secret",
            "SSLPASSWORD",
            "client_secret",
            "access_token",
        ] {
            let url = format!("amqp://guest@h:5672/%2f?heartbeat=10;{key}=hunter2#frag");
            let shown = redact_url(&url);
            assert!(!shown.contains("hunter2"), "{key}: {shown}");
            assert!(shown.contains("heartbeat=10;"), "{key}: {shown}");
            assert!(shown.ends_with("=***#frag"), "{key}: {shown}");
        }
        // Both places at once, and a user-info password still hidden.
        assert_eq!(
            redact_url("redis://u:pw1@h/0?token=t0k"),
            "redis://u:***@h/0?token=***"
        );
        // Keys that only look alike are kept; a bare key has no value to hide.
        assert_eq!(
            redact_url("postgres://h/db?passage=1&password"),
            "postgres://h/db?passage=1&password"
        );
        // An error that echoes the value, as written or decoded, hides it too.
        let said = format!("cannot connect to {url}: password s3cr/t refused (s3cr%2Ft)");
        let redacted = redact_secret_in(&said, url);
        assert!(!redacted.contains("s3cr"), "{redacted}");
        assert!(redacted.contains("PassWord=***"), "{redacted}");
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
    fn a_consumer_sweep_follows_its_first_backoff_within_a_second_and_a_minute() {
        let at = |secs_ms: u64| {
            let retry = crate::RetryPolicy {
                initial_backoff: Duration::from_millis(secs_ms),
                max_backoff: Duration::from_secs(3600),
                ..crate::RetryPolicy::default()
            };
            SweepConfig::for_consumer_retrying("billing", &retry)
        };
        assert_eq!(at(2_000).interval, Duration::from_secs(2));
        assert_eq!(at(10).interval, Duration::from_secs(1));
        assert_eq!(at(600_000).interval, Duration::from_secs(60));
        let c = at(1_000);
        assert_eq!(c.lock_key, SweepConfig::for_consumer("billing").lock_key);
        assert!(c.validate("sweep").is_ok());
    }

    #[test]
    fn consumer_keys_differ_from_the_relays() {
        let c = SweepConfig::for_consumer("billing");
        assert_ne!(c.lock_key, SweepConfig::default().lock_key);
        assert_ne!(c.state_key, SweepConfig::default().state_key);
        assert!(c.validate("consumer.sweep").is_ok());
    }
}
