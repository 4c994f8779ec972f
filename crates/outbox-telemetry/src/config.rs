//! The log's and the span exporter's settings (`[log]` and `[telemetry]` of
//! `outbox.toml`).

use std::fmt;

use outbox_core::ConfigError;
use outbox_core::config::redact_url;
use serde::Deserialize;

/// How a process writes its log (`[log]` of `outbox run`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// `text` (default) or `json` (one object per line; with the `otel` feature and
    /// a span active, it carries `trace_id` and `span_id`).
    pub format: LogFormat,
    /// Which events, in `RUST_LOG` syntax (`info,outbox_relay=debug`); the `RUST_LOG`
    /// variable overrides it. Default `info`.
    pub filter: Option<String>,
}

/// The log line format.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// OpenTelemetry export (`[telemetry]`, feature `otel`). Off unless an endpoint is
/// set here or in `OTEL_EXPORTER_OTLP_ENDPOINT`.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// The OTLP collector's base URL, http/protobuf (`http://127.0.0.1:4318`; spans
    /// go to `<url>/v1/traces`). Plain `http://` only: no TLS provider is built in.
    pub otlp_endpoint: Option<String>,
    /// `service.name` of the spans (`OTEL_SERVICE_NAME` overrides it).
    pub service_name: String,
    /// Share of new traces sampled, 0.0 to 1.0; a trace continued from a producer
    /// follows the producer's decision.
    pub sampling_ratio: f64,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            otlp_endpoint: None,
            service_name: "outbox".to_owned(),
            sampling_ratio: 1.0,
        }
    }
}

impl fmt::Debug for TelemetryConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TelemetryConfig")
            .field(
                "otlp_endpoint",
                &self.otlp_endpoint.as_deref().map(redact_url),
            )
            .field("service_name", &self.service_name)
            .field("sampling_ratio", &self.sampling_ratio)
            .finish()
    }
}

impl TelemetryConfig {
    /// Checks every setting; `section` names it in the error.
    ///
    /// # Errors
    /// A [`ConfigError`] for the first setting out of range.
    pub fn validate(&self, section: &str) -> Result<(), ConfigError> {
        if !(0.0..=1.0).contains(&self.sampling_ratio) {
            return Err(ConfigError::new(
                section,
                "sampling_ratio",
                format!("must be between 0.0 and 1.0 (got {})", self.sampling_ratio),
            ));
        }
        if self.service_name.trim().is_empty() {
            return Err(ConfigError::new(
                section,
                "service_name",
                "must not be empty",
            ));
        }
        if let Some(e) = &self.otlp_endpoint {
            if !cfg!(feature = "otel") {
                return Err(ConfigError::new(
                    section,
                    "otlp_endpoint",
                    "is set, but this build has no OpenTelemetry (cargo feature `otel`)",
                ));
            }
            let rest = e.strip_prefix("http://").ok_or_else(|| {
                ConfigError::new(
                    section,
                    "otlp_endpoint",
                    format!(
                        "{} is not an http:// URL (OTLP over http/protobuf; no TLS provider is built in)",
                        redact_url(e)
                    ),
                )
            })?;
            if rest.is_empty() || rest.starts_with('/') {
                return Err(ConfigError::new(
                    section,
                    "otlp_endpoint",
                    format!("{} names no host", redact_url(e)),
                ));
            }
        }
        Ok(())
    }
}

impl LogConfig {
    /// Checks every setting; `section` names it in the error.
    ///
    /// # Errors
    /// A [`ConfigError`] for the first setting out of range.
    pub fn validate(&self, section: &str) -> Result<(), ConfigError> {
        if let Some(f) = &self.filter {
            tracing_subscriber::EnvFilter::builder()
                .parse(f)
                .map_err(|e| ConfigError::new(section, "filter", format!("{f:?}: {e}")))?;
        }
        Ok(())
    }
}
