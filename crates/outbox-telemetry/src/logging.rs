//! The log of the `outbox` command and of services that log as it does: text or JSON lines on stderr, filtered in
//! `RUST_LOG` syntax (the variable wins over `[log] filter`), and with the `otel`
//! feature and an OTLP endpoint, the OpenTelemetry layer exporting spans. JSON
//! lines carry `trace_id` and `span_id` while an OpenTelemetry span is active.

use std::io::IsTerminal as _;

use tracing::Subscriber;
use tracing_subscriber::fmt::format::{Format, Json, JsonFields, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, MakeWriter};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::{EnvFilter, Layer};

use crate::config::{LogConfig, LogFormat, TelemetryConfig};

/// What stays alive while the process logs: the tracer provider, flushed by
/// [`Telemetry::shutdown`].
#[derive(Debug, Default)]
pub struct Telemetry {
    #[cfg(feature = "otel")]
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Telemetry {
    /// Whether spans are exported.
    #[must_use]
    pub fn exporting(&self) -> bool {
        #[cfg(feature = "otel")]
        return self.provider.is_some();
        #[cfg(not(feature = "otel"))]
        false
    }

    /// Exports the spans still buffered and stops the exporter (bounded by the
    /// SDK's own timeouts).
    pub async fn shutdown(self) {
        #[cfg(feature = "otel")]
        if let Some(p) = self.provider {
            match tokio::task::spawn_blocking(move || p.shutdown()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "flushing spans at shutdown failed"),
                Err(e) => tracing::warn!(error = %e, "flushing spans at shutdown failed"),
            }
        }
    }
}

/// The filter: `RUST_LOG` if set, else `configured`, else `default`, with
/// [`quiet_lapin`].
fn filter(default: &str, configured: Option<&str>) -> EnvFilter {
    let base = configured.unwrap_or(default);
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(quiet_lapin(base)));
    // The per-message `send`/`process` spans are for OpenTelemetry, not the log:
    // off here, they cost nothing when no exporter is configured.
    ["outbox::relay=off", "outbox::consumer=off"]
        .into_iter()
        .filter_map(|d| d.parse().ok())
        .fold(filter, EnvFilter::add_directive)
}

/// Installs the process's subscriber: the log in `log`'s format on stderr and,
/// with the `otel` feature, the span exporter of `telemetry` (none when no endpoint
/// is set). Call inside the tokio runtime. A second call in a process changes
/// nothing.
///
/// # Errors
/// The exporter could not be built (its message).
pub fn init(
    default: &str,
    log: &LogConfig,
    telemetry: &TelemetryConfig,
) -> Result<Telemetry, String> {
    #[cfg(feature = "otel")]
    let (otel, provider) = {
        crate::otel::install_propagator();
        let provider = crate::otel::tracer_provider(&crate::otel::OtlpSettings {
            endpoint: telemetry.otlp_endpoint.clone(),
            service_name: telemetry.service_name.clone(),
            sampling_ratio: telemetry.sampling_ratio,
        })?;
        (provider.as_ref().map(otel_layer), provider)
    };
    #[cfg(not(feature = "otel"))]
    let otel: Option<Box<dyn Layer<tracing_subscriber::Registry> + Send + Sync>> = {
        let _ = telemetry;
        None
    };
    let ansi = std::io::stderr().is_terminal();
    let registry = tracing_subscriber::registry().with(otel);
    let log_layer = fmt_layer(
        log.format,
        filter(default, log.filter.as_deref()),
        ansi,
        std::io::stderr,
    );
    let _ = tracing::subscriber::set_global_default(registry.with(log_layer));
    Ok(Telemetry {
        #[cfg(feature = "otel")]
        provider,
    })
}

/// The OpenTelemetry layer: every span and event at INFO or above, whatever the
/// log's filter (a quiet log must not cut traces).
#[cfg(feature = "otel")]
pub(crate) fn otel_layer<S>(
    provider: &opentelemetry_sdk::trace::SdkTracerProvider,
) -> Box<dyn Layer<S> + Send + Sync>
where
    S: Subscriber + for<'a> LookupSpan<'a> + Send + Sync,
{
    use opentelemetry::trace::TracerProvider as _;
    // Also the global provider: spans started through the OpenTelemetry API
    // itself (the `create` span of an enqueue) go to the same exporter.
    opentelemetry::global::set_tracer_provider(provider.clone());
    tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("outbox"))
        .with_filter(tracing_subscriber::filter::LevelFilter::INFO)
        .boxed()
}

/// The log layer in `format`, filtered by `filter`, writing to `writer`.
pub(crate) fn fmt_layer<S, W>(
    format: LogFormat,
    filter: EnvFilter,
    ansi: bool,
    writer: W,
) -> Box<dyn Layer<S> + Send + Sync>
where
    S: Subscriber + for<'a> LookupSpan<'a> + Send + Sync,
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    match format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(writer)
            .with_ansi(ansi)
            .with_filter(filter)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .event_format(JsonWithTrace(tracing_subscriber::fmt::format().json()))
            .fmt_fields(JsonFields::new())
            .with_writer(writer)
            .with_filter(filter)
            .boxed(),
    }
}

/// tracing-subscriber's JSON lines, with `trace_id` and `span_id` of the active
/// OpenTelemetry span added (`tracing-opentelemetry` makes an entered span's
/// context the current one).
struct JsonWithTrace(Format<Json>);

impl<S, N> FormatEvent<S, N> for JsonWithTrace
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let mut line = String::new();
        self.0.format_event(ctx, Writer::new(&mut line), event)?;
        match (trace_ids(), line.strip_suffix("}\n")) {
            (Some((trace_id, span_id)), Some(object)) => writeln!(
                writer,
                "{object},\"trace_id\":\"{trace_id}\",\"span_id\":\"{span_id}\"}}"
            ),
            _ => writer.write_str(&line),
        }
    }
}

/// The ids of the current OpenTelemetry span, if one is active.
fn trace_ids() -> Option<(String, String)> {
    #[cfg(feature = "otel")]
    {
        use opentelemetry::trace::TraceContextExt as _;
        let cx = opentelemetry::Context::current();
        let span = cx.span();
        let sc = span.span_context();
        sc.is_valid()
            .then(|| (sc.trace_id().to_string(), sc.span_id().to_string()))
    }
    #[cfg(not(feature = "otel"))]
    None
}

/// `base` with lapin's own log off unless `base` names lapin: every failure it
/// logs reaches this program as an error, said once in its own words (a refused
/// login was three lapin ERROR lines before the one that says so), and its
/// returned-message warnings log message bodies. Asked for by name, its
/// returned-message warnings stay out all the same.
fn quiet_lapin(base: &str) -> String {
    if base.contains("lapin") {
        format!("{base},lapin::returned_messages=error")
    } else {
        format!("{base},lapin=off")
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn lapin_is_quiet_unless_named() {
        assert_eq!(super::quiet_lapin("info"), "info,lapin=off");
        assert_eq!(
            super::quiet_lapin("info,lapin=debug"),
            "info,lapin=debug,lapin::returned_messages=error"
        );
    }
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use super::*;

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("lock").extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'w> MakeWriter<'w> for Buffer {
        type Writer = Self;
        fn make_writer(&'w self) -> Self {
            self.clone()
        }
    }

    fn lines(buffer: &Buffer) -> Vec<serde_json::Value> {
        let text = String::from_utf8(buffer.0.lock().expect("lock").clone()).expect("utf-8");
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?} is not JSON: {e}")))
            .collect()
    }

    #[test]
    fn json_lines_parse_and_carry_the_ids_of_the_active_span() {
        let buffer = Buffer::default();
        #[cfg(feature = "otel")]
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
        let registry = tracing_subscriber::registry();
        #[cfg(feature = "otel")]
        let registry = registry.with(otel_layer(&provider));
        let subscriber = registry.with(fmt_layer(
            LogFormat::Json,
            EnvFilter::new("info"),
            false,
            buffer.clone(),
        ));
        let expected = tracing::subscriber::with_default(subscriber, || {
            tracing::info!(answer = 42, "outside any span");
            let span = tracing::info_span!("work", job = "x");
            let _entered = span.enter();
            tracing::info!("inside \"quoted\" span");
            trace_ids()
        });
        let lines = lines(&buffer);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert_eq!(lines[0]["fields"]["answer"], 42);
        assert_eq!(lines[0].get("trace_id"), None, "no span, no ids");
        assert_eq!(lines[1]["fields"]["message"], "inside \"quoted\" span");
        assert_eq!(lines[1]["span"]["name"], "work");
        if cfg!(feature = "otel") {
            let (trace_id, span_id) = expected.expect("an active span");
            assert_eq!(lines[1]["trace_id"], trace_id.as_str());
            assert_eq!(lines[1]["span_id"], span_id.as_str());
            assert_eq!(trace_id.len(), 32);
            assert_eq!(span_id.len(), 16);
        } else {
            assert_eq!(lines[1].get("trace_id"), None);
        }
    }

    #[test]
    fn text_lines_are_unchanged() {
        let buffer = Buffer::default();
        let subscriber = tracing_subscriber::registry().with(fmt_layer(
            LogFormat::Text,
            EnvFilter::new("info"),
            false,
            buffer.clone(),
        ));
        tracing::subscriber::with_default(subscriber, || tracing::info!("plain"));
        let text = String::from_utf8(buffer.0.lock().expect("lock").clone()).expect("utf-8");
        assert!(
            text.contains(" INFO ") && text.trim_end().ends_with("plain"),
            "{text}"
        );
    }
}
