//! The operator's API of `outbox`: an [`AdminService`] over the ports (browse,
//! search, requeue, delete, reconsume; stats; dead letters; an audit log) and an
//! axum [`router`] that serves it as JSON, described by an OpenAPI document.
//!
//! ```no_run
//! # fn mount(service: outbox_admin::AdminService, auth: outbox_admin::AdminAuth) {
//! let app: axum::Router = axum::Router::new().nest("/api/v1", outbox_admin::router(service, auth));
//! # }
//! ```
//!
//! The API is closed unless [`AdminAuth`] has tokens; every write is recorded in
//! the [`outbox_ports::AuditLog`]; payload and header views go through
//! [`Redaction`]. No input makes it answer 5xx: a 503 means a store could not be
//! reached.
//!
//! Architecture Invariant: this crate reaches the stores through the ports only,
//! never an adapter, sqlx, lapin or redis (`cargo xtask guard`).

mod api;
mod auth;
mod client;
mod error;
mod failure_limit;
pub mod model;
mod openapi;
pub mod params;
mod redact;
mod responses;
mod routes;
mod service;
#[cfg(feature = "ui")]
mod ui;

pub use api::router;
pub use auth::{
    Actor, AdminAuth, AdminToken, CLI_ACTOR, ONCE_ACTOR, Role, SSO_ACTOR, Secret, TOKEN_ACTOR,
};
pub use error::AdminError;
pub use openapi::document as openapi_document;
pub use redact::{REDACTED, Redaction, ShownBytes, WITHHELD};
pub use service::{AdminPorts, AdminService, DEFAULT_BULK_BATCH, OnBatch};
#[cfg(feature = "ui")]
pub use ui::{OneTimeLogin, OneTimeRenewal, TrustedProxy, UiOptions, random_secret, ui_router};
