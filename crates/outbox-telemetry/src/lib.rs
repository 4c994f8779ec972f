//! Telemetry for a process running outbox's relay or consumers, as `outbox run`
//! has it: [`init`] installs the log (text or JSON lines on stderr, filtered in
//! `RUST_LOG` syntax) and, with the feature `otel` and an OTLP endpoint, the span
//! exporter; with the feature `http`, [`http`] has the Prometheus recorder and a
//! consumer's `/healthz`, `/readyz` and `/metrics`. docs/telemetry.md lists the
//! metrics and spans.

mod config;
#[cfg(feature = "http")]
pub mod http;
pub mod logging;
#[cfg(feature = "otel")]
pub mod otel;

pub use config::{LogConfig, LogFormat, TelemetryConfig};
pub use logging::{Telemetry, init};
