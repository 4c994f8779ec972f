//! Errors: configuration errors of this crate, and sqlx errors mapped to port errors.

use outbox_ports::PortError;

/// A configuration value this adapter cannot use.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PgConfigError {
    /// The schema name is not a plain identifier.
    #[error("invalid schema name {name:?}: {reason}")]
    InvalidSchema {
        /// The name given.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The database URL does not parse.
    #[error("invalid PostgreSQL URL: {reason}")]
    InvalidUrl {
        /// What is wrong with it.
        reason: String,
    },
    /// No connection could be made.
    #[error("cannot connect to PostgreSQL at {url}: {reason}")]
    Unreachable {
        /// The URL, password removed.
        url: String,
        /// Why.
        reason: String,
    },
    /// Migrations failed.
    #[error("migrating schema {schema}: {reason}")]
    Migration {
        /// The schema.
        schema: String,
        /// Why.
        reason: String,
    },
}

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

/// `text` with `url` (and its password) removed, in case an error echoes them.
#[must_use]
pub(crate) fn redact(text: &str, url: &str) -> String {
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

/// Maps a sqlx error to a port error: connection trouble, timeouts, serialization
/// failures and deadlocks are retryable; everything else is not.
pub(crate) fn port(operation: &'static str, e: sqlx::Error) -> PortError {
    let retryable = match &e {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Protocol(_)
        | sqlx::Error::Tls(_) => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|c| {
            c.starts_with("08")
                || c.starts_with("53")
                || c == "40001"
                || c == "40P01"
                || c == "57P01"
                || c == "57P02"
                || c == "57P03"
                || c == "55P03"
        }),
        _ => false,
    };
    let message = e.to_string();
    if retryable {
        PortError::Transient {
            operation,
            message,
            source: Some(Box::new(e)),
        }
    } else {
        PortError::Fatal {
            operation,
            message,
            source: Some(Box::new(e)),
        }
    }
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
            redact(&format!("failed: {url}"), url),
            "failed: postgres://app:***@db.example:5432/orders?sslmode=require"
        );
        assert_eq!(
            redact("password s3cret rejected", url),
            "password *** rejected"
        );
        assert_eq!(redact_url("postgres://app@h/db"), "postgres://app@h/db");
        assert_eq!(redact_url("not a url"), "not a url");
    }
}
