//! The `outbox` binary: commands, configuration, wiring, logging and telemetry
//! set-up, the HTTP health and metrics endpoints, the demo.
//!
//! The engine is elsewhere: the relay in `outbox-relay`, the consumers in
//! `outbox-consumer`, both re-exported by the `outbox` facade, which is what an
//! application embedding them depends on. This crate is the only one with `clap`,
//! `config` and `anyhow`.
//!
//! # Features
//!
//! All on by default (the binary needs them all).
//! - `http`: `/healthz`, `/readyz` and `/metrics` ([`http`]), for the binary and
//!   for a service that embeds a relay or a consumer and wants the same endpoints.
//! - `admin`: the admin API ([`outbox_admin`]) and its settings ([`admin_api`]),
//!   served at `/api/v1` by [`http::serve_with_admin`]; turns on `http`.
//! - `otel`: the relay's and consumers' spans, and the OTLP exporter of `outbox
//!   run` ([`otel`]). Without it no opentelemetry crate is built.
//! - `cli`: the `outbox` command ([`cli`], [`config`], [`wiring`], the demo); turns
//!   on every adapter, `http` and `admin`.

#[cfg(feature = "admin")]
pub mod admin_api;
#[cfg(feature = "cli")]
pub mod admin_cli;
#[cfg(feature = "cli")]
mod admin_output;
#[cfg(feature = "cli")]
pub mod cli;
#[cfg(feature = "cli")]
pub mod config;
#[cfg(feature = "cli")]
pub mod demo;
#[cfg(feature = "cli")]
pub mod demo_serve;
#[cfg(feature = "http")]
pub mod http;
/// Kept here too, where they were first public: outbox-telemetry's.
#[cfg(feature = "cli")]
pub use outbox_telemetry::logging;
#[cfg(feature = "otel")]
pub use outbox_telemetry::otel;
#[cfg(feature = "cli")]
mod printable;
#[cfg(feature = "cli")]
pub mod settings_log;
#[cfg(feature = "cli")]
mod table;
#[cfg(feature = "cli")]
pub mod topology_config;
#[cfg(feature = "cli")]
pub mod wiring;
