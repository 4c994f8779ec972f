//! Who may use the admin API: named bearer tokens with a read or write role. The
//! API is closed unless tokens are configured, secrets are compared in constant
//! time, and a secret never appears in `Debug` output or logs.

use std::fmt;

use axum::extract::{Request, State};
use axum::http::{Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use subtle::ConstantTimeEq;

use crate::AdminError;

/// A token's secret. Its `Debug` shows `***`, so configs and tokens can be logged.
#[derive(Clone, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret.
    #[must_use]
    pub fn new(secret: impl Into<String>) -> Self {
        Self(secret.into())
    }

    /// The secret itself (for validation; never log it).
    #[must_use]
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Every `GET`.
    Read,
    /// Everything, writes included.
    Write,
}

/// One configured token.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct AdminToken {
    /// Its name, recorded in the audit log as the actor.
    pub name: String,
    /// What the client sends as `Authorization: Bearer <secret>`.
    pub secret: Secret,
    /// What it may do.
    pub role: Role,
}

/// The caller of a request, once authenticated (a request extension).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actor {
    /// The token's name.
    pub name: String,
    /// The token's role.
    pub role: Role,
}

/// The configured tokens. Without any, every request is refused with 403.
#[derive(Debug, Clone, Default)]
pub struct AdminAuth {
    tokens: Vec<AdminToken>,
}

impl AdminAuth {
    /// Accepts these tokens.
    #[must_use]
    pub fn new(tokens: Vec<AdminToken>) -> Self {
        Self { tokens }
    }

    /// The configured token named `name`.
    #[cfg(feature = "ui")]
    pub(crate) fn token_named(&self, name: &str) -> Option<&AdminToken> {
        self.tokens.iter().find(|t| t.name == name)
    }

    /// Whether no token is configured (then everything is refused).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The token whose secret is `presented`, checking every token in constant time
    /// per token (no early exit on a match, so timing does not tell which matched).
    fn find(&self, presented: &[u8]) -> Option<&AdminToken> {
        let mut found = None;
        for token in &self.tokens {
            if bool::from(token.secret.0.as_bytes().ct_eq(presented)) && found.is_none() {
                found = Some(token);
            }
        }
        found
    }

    /// Who sends `authorization` and whether they may use `method`.
    ///
    /// # Errors
    /// [`AdminError::NotConfigured`] without tokens, [`AdminError::Unauthorized`]
    /// for a missing or unknown token, [`AdminError::Forbidden`] for a read token
    /// on a write.
    pub fn authorize(
        &self,
        method: &Method,
        authorization: Option<&[u8]>,
    ) -> Result<Actor, AdminError> {
        if self.tokens.is_empty() {
            return Err(AdminError::NotConfigured);
        }
        let presented = authorization
            .and_then(|v| v.strip_prefix(b"Bearer "))
            .ok_or(AdminError::Unauthorized)?;
        let token = self.find(presented).ok_or(AdminError::Unauthorized)?;
        let is_read = matches!(*method, Method::GET | Method::HEAD);
        if !is_read && token.role != Role::Write {
            return Err(AdminError::Forbidden {
                actor: token.name.clone(),
            });
        }
        Ok(Actor {
            name: token.name.clone(),
            role: token.role,
        })
    }
}

/// The middleware in front of every admin route.
pub(crate) async fn require_token(
    State(auth): State<std::sync::Arc<AdminAuth>>,
    mut request: Request,
    next: Next,
) -> Response {
    let authorization = request
        .headers()
        .get(header::AUTHORIZATION)
        .map(axum::http::HeaderValue::as_bytes);
    match auth.authorize(request.method(), authorization) {
        Ok(actor) => {
            request.extensions_mut().insert(actor);
            next.run(request).await
        }
        Err(e) => e.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_a_secret() {
        let token = AdminToken {
            name: "ops".into(),
            secret: Secret::new("correct-horse-battery-staple"),
            role: Role::Write,
        };
        let shown = format!("{:?} {:?}", token, AdminAuth::new(vec![token.clone()]));
        assert!(!shown.contains("correct-horse"), "{shown}");
        assert!(shown.contains("ops"));
    }
}
