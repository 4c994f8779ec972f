//! What can go wrong in an admin request, and the HTTP answer for each: a 4xx for
//! anything the caller sent, 503 when a store cannot be reached, 500 only for a
//! store's own fault (never for an input).

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use outbox_ports::PortError;

use crate::model::{ErrorBody, ErrorDetail};

/// Why an admin request was refused or failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdminError {
    /// The request is malformed: a bad id, cursor, status, time, limit or body.
    #[error("{message}")]
    BadRequest {
        /// A stable machine-readable code (`bad_id`, `bad_cursor`, ...).
        code: &'static str,
        /// What is wrong, for people.
        message: String,
    },
    /// No admin token is configured, so the API is closed.
    #[error(
        "the admin API is disabled: no admin token is configured (set [[admin.tokens]] with name, secret and role)"
    )]
    NotConfigured,
    /// No token, or not a known one.
    #[error("missing or unknown bearer token")]
    Unauthorized,
    /// The token may not do this.
    #[error("token `{actor}` has the read role; this request needs a write token")]
    Forbidden {
        /// The token's name.
        actor: String,
    },
    /// This client sent too many unknown bearer tokens: refused, whatever its
    /// token, for `seconds` (its `Retry-After`).
    #[error("too many unknown bearer tokens from your address; try again in {seconds} s")]
    TooManyAttempts {
        /// How long to wait before the next try.
        seconds: u64,
    },
    /// No such route.
    #[error("no such endpoint")]
    NoRoute,
    /// The route exists, but not for this method.
    #[error("method not allowed on this endpoint")]
    MethodNotAllowed,
    /// The request is well formed but does not fit the entry it acts on as it is
    /// stored (an edited payload that is not the JSON its content type says, a
    /// hidden value the original does not have).
    #[error("{message}")]
    Conflict {
        /// A stable code.
        code: &'static str,
        /// What does not fit, for people.
        message: String,
    },
    /// Editing and replaying is off (`[admin] allow_edit = false`, the default):
    /// the replay endpoints answer as if they did not exist.
    #[error("editing and replaying messages is off ([admin] allow_edit = false)")]
    EditOff,
    /// This service reads no throughput log, so it has no per-exchange or
    /// per-consumer charts (`outbox run` always has one).
    #[error(
        "throughput per exchange and consumer is not recorded here: the admin service has no throughput log"
    )]
    NotRecorded,
    /// What the store said.
    #[error(transparent)]
    Port(#[from] PortError),
    /// The change was made, but recording it in the audit log failed.
    #[error("the change was applied but could not be recorded in the audit log: {0}")]
    AuditFailed(PortError),
}

impl AdminError {
    /// A 400 with `code`.
    pub(crate) fn bad(code: &'static str, message: impl Into<String>) -> Self {
        Self::BadRequest {
            code,
            message: message.into(),
        }
    }

    /// The HTTP status and the code of this error.
    #[must_use]
    pub fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            Self::BadRequest { code, .. } => (StatusCode::BAD_REQUEST, code),
            Self::NotConfigured => (StatusCode::FORBIDDEN, "admin_disabled"),
            Self::Unauthorized => (StatusCode::UNAUTHORIZED, "unauthorized"),
            Self::Forbidden { .. } => (StatusCode::FORBIDDEN, "forbidden"),
            Self::TooManyAttempts { .. } => (StatusCode::TOO_MANY_REQUESTS, "too_many_attempts"),
            Self::NoRoute => (StatusCode::NOT_FOUND, "no_such_endpoint"),
            Self::EditOff => (StatusCode::NOT_FOUND, "edit_off"),
            Self::NotRecorded => (StatusCode::NOT_FOUND, "not_recorded"),
            Self::Conflict { code, .. } => (StatusCode::CONFLICT, code),
            Self::MethodNotAllowed => (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"),
            Self::Port(e) => match e {
                PortError::NotFound { .. } => (StatusCode::NOT_FOUND, "not_found"),
                PortError::IllegalTransition(_) => (StatusCode::CONFLICT, "illegal_transition"),
                PortError::NotDeletable(_) => (StatusCode::CONFLICT, "not_deletable"),
                PortError::Busy { .. } => (StatusCode::CONFLICT, "busy"),
                PortError::Refused { .. } => (StatusCode::CONFLICT, "refused"),
                // What the caller sent breaks a limit: an input, never a 500.
                PortError::InvalidMessage(_) => (StatusCode::BAD_REQUEST, "invalid_message"),
                PortError::InvalidEvent(_) => (StatusCode::BAD_REQUEST, "invalid_event"),
                PortError::Transient { .. } => {
                    (StatusCode::SERVICE_UNAVAILABLE, "store_unavailable")
                }
                _ => (StatusCode::INTERNAL_SERVER_ERROR, "store_error"),
            },
            Self::AuditFailed(_) => (StatusCode::SERVICE_UNAVAILABLE, "audit_unavailable"),
        }
    }
}

impl IntoResponse for AdminError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        if status.is_server_error() {
            tracing::warn!(code, error = %self, "admin request failed");
        }
        let body = ErrorBody {
            error: ErrorDetail {
                code: code.to_owned(),
                message: self.to_string(),
            },
        };
        let mut response = (status, Json(body)).into_response();
        if matches!(self, Self::Unauthorized) {
            response.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
        }
        if let Self::TooManyAttempts { seconds } = self {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, seconds.into());
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use outbox_core::{EventError, MessageError};

    use super::*;

    #[test]
    fn a_message_or_event_over_a_limit_is_the_callers_fault() {
        let too_large = || MessageError::PayloadTooLarge { len: 11, max: 10 };
        let message = AdminError::Port(PortError::InvalidMessage(too_large()));
        assert_eq!(
            message.status_and_code(),
            (StatusCode::BAD_REQUEST, "invalid_message")
        );
        let event = AdminError::Port(PortError::InvalidEvent(EventError::Invalid {
            message_type: "order.created",
            rust_type: "shop::OrderCreated",
            error: too_large(),
        }));
        assert_eq!(
            event.status_and_code(),
            (StatusCode::BAD_REQUEST, "invalid_event")
        );
    }
}
