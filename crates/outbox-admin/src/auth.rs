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
use crate::client::{client_of, peer_of};
use crate::failure_limit::FailureLimit;

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

/// What the audit log's actor starts with for an admin token: `token:<name>`.
/// Each kind of actor has its own prefix, so none can pass for another: `token:`
/// (an admin token, on the API or in a dashboard session it opened), `sso:` (a
/// user the trusted proxy signed in), `once:` (the one-time login) and `cli:` (a
/// command run on the host, `cli:<os user>`).
pub const TOKEN_ACTOR: &str = "token:";
/// What the audit log's actor starts with for a user the trusted proxy signed in:
/// `sso:<user>` (see [`TOKEN_ACTOR`]).
pub const SSO_ACTOR: &str = "sso:";
/// What the audit log's actor starts with for the one-time login: `once:<name>`
/// (see [`TOKEN_ACTOR`]).
pub const ONCE_ACTOR: &str = "once:";
/// What the audit log's actor starts with for a command run on the host:
/// `cli:<os user>` (see [`TOKEN_ACTOR`]).
pub const CLI_ACTOR: &str = "cli:";

/// The caller of a request, once authenticated (a request extension).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actor {
    /// Who, as the audit log names them: `token:<token name>` (see
    /// [`TOKEN_ACTOR`]).
    pub name: String,
    /// The token's role.
    pub role: Role,
}

/// The configured tokens. Without any, every request is refused with 403.
#[derive(Debug, Clone, Default)]
pub struct AdminAuth {
    tokens: Vec<AdminToken>,
    /// Proxies that only forward: the API counts failed tokens per client they
    /// forward for.
    forwarders: Vec<ipnet::IpNet>,
}

impl AdminAuth {
    /// Accepts these tokens.
    #[must_use]
    pub fn new(tokens: Vec<AdminToken>) -> Self {
        Self {
            tokens,
            forwarders: Vec::new(),
        }
    }

    /// Proxies in front of the API that only forward (a TLS terminator, a load
    /// balancer): the API's failed bearer tokens are counted per client named by
    /// the last address of their `X-Forwarded-For` (else every client behind one
    /// shares its allowance, and one client's guesses lock the others out).
    #[must_use]
    pub fn with_forwarders(mut self, forwarders: Vec<ipnet::IpNet>) -> Self {
        self.forwarders = forwarders;
        self
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

    /// The token whose secret is `presented`.
    ///
    /// # Errors
    /// [`AdminError::NotConfigured`] without tokens, [`AdminError::Unauthorized`]
    /// for an unknown one.
    pub(crate) fn token(&self, presented: &[u8]) -> Result<&AdminToken, AdminError> {
        if self.tokens.is_empty() {
            return Err(AdminError::NotConfigured);
        }
        self.find(presented).ok_or(AdminError::Unauthorized)
    }

    /// Who sends `authorization` and whether they may use `method`; the actor is
    /// named as the audit log names it (`token:<name>`).
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
        let token = self.token(presented)?;
        let is_read = matches!(*method, Method::GET | Method::HEAD);
        if !is_read && token.role != Role::Write {
            return Err(AdminError::Forbidden {
                actor: token.name.clone(),
            });
        }
        Ok(Actor {
            name: format!("{TOKEN_ACTOR}{}", token.name),
            role: token.role,
        })
    }
}

/// What guards the admin routes: the tokens, and the failed ones per client.
pub(crate) struct Gate {
    auth: AdminAuth,
    limit: FailureLimit,
}

impl Gate {
    pub(crate) fn new(auth: AdminAuth) -> Self {
        Self {
            auth,
            limit: FailureLimit::new(),
        }
    }
}

/// The middleware in front of every admin route: a client that sent too many
/// unknown bearer tokens is refused (429) before its token is looked at; an
/// unknown bearer token counts against its client (a request without one, a
/// known token, or the same wrong token sent again lately, does not). Every
/// refusal is logged at warn, naming the client, method and path, never the token.
pub(crate) async fn require_token(
    State(gate): State<std::sync::Arc<Gate>>,
    mut request: Request,
    next: Next,
) -> Response {
    let client = client_of(
        peer_of(request.extensions()),
        request.headers(),
        &gate.auth.forwarders,
    );
    let refused = |status: u16, reason: &str| {
        tracing::warn!(
            client = %client.map_or_else(|| "unknown".to_owned(), |c| c.to_string()),
            method = %request.method(),
            path = %request.uri().path(),
            status,
            reason,
            "admin API request refused"
        );
    };
    if let Err(wait) = gate.limit.check(client) {
        refused(429, "too many unknown bearer tokens from this client");
        // Rounded up: a client that waits what it is told is not refused again.
        let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        return AdminError::TooManyAttempts { seconds }.into_response();
    }
    let authorization = request
        .headers()
        .get(header::AUTHORIZATION)
        .map(axum::http::HeaderValue::as_bytes);
    let bearer = authorization.filter(|v| v.starts_with(b"Bearer "));
    match gate.auth.authorize(request.method(), authorization) {
        Ok(actor) => {
            request.extensions_mut().insert(actor);
            next.run(request).await
        }
        Err(e) => {
            let (status, reason) = e.status_and_code();
            refused(status.as_u16(), reason);
            if let (Some(token), AdminError::Unauthorized) = (bearer, &e) {
                gate.limit.failed_token(client, token);
            }
            e.into_response()
        }
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
