//! The OpenTelemetry exporter of `outbox run` (feature `otel`): [`tracer_provider`]
//! builds the OTLP exporter (http/protobuf over the hyper client);
//! [`install_propagator`] makes W3C trace context the global propagator, which
//! [`outbox_ports::trace_context`] uses. The spans themselves are the relay's
//! (`outbox_relay::otel`) and the consumers' (`outbox_consumer::otel`).

use std::sync::Arc;
use std::time::Duration;

use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider, SpanData, SpanExporter};

/// Makes W3C trace context (`traceparent`, `tracestate`) the global propagator:
/// what enqueue writes and the relay and consumers read.
pub fn install_propagator() {
    opentelemetry::global::set_text_map_propagator(
        opentelemetry_sdk::propagation::TraceContextPropagator::new(),
    );
}

/// Where and how spans are exported.
#[derive(Debug, Clone, PartialEq)]
pub struct OtlpSettings {
    /// The collector's base URL (`http://host:4318`; spans go to `/v1/traces`).
    /// `None`: `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`) if set, else
    /// no exporter.
    pub endpoint: Option<String>,
    /// `service.name`, unless `OTEL_SERVICE_NAME` is set.
    pub service_name: String,
    /// Share of new traces sampled (0.0..=1.0); a continued trace follows its parent.
    pub sampling_ratio: f64,
}

/// The tracer provider exporting over OTLP (http/protobuf) in batches, or `None`
/// when no endpoint is configured (neither in `settings` nor in the environment).
/// Call it inside a tokio runtime: the exporter sends on it. Shut the provider down
/// (`SdkTracerProvider::shutdown`, from a blocking thread) to flush before exiting.
///
/// # Errors
/// The exporter's own message (a bad endpoint), or no tokio runtime.
pub fn tracer_provider(settings: &OtlpSettings) -> Result<Option<SdkTracerProvider>, String> {
    use opentelemetry_otlp::WithExportConfig as _;
    let from_env = [
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
    ]
    .iter()
    .any(|v| std::env::var(v).is_ok_and(|v| !v.trim().is_empty()));
    let endpoint = settings
        .endpoint
        .as_ref()
        .map(|e| format!("{}/v1/traces", e.trim_end_matches('/')));
    if endpoint.is_none() && !from_env {
        return Ok(None);
    }
    let runtime = tokio::runtime::Handle::try_current()
        .map_err(|_| "the OTLP exporter needs a tokio runtime".to_owned())?;
    let mut builder = opentelemetry_otlp::SpanExporter::builder().with_http();
    if let Some(e) = endpoint {
        builder = builder.with_endpoint(e);
    }
    let exporter = builder.build().map_err(|e| e.to_string())?;
    let mut resource = opentelemetry_sdk::Resource::builder();
    if std::env::var("OTEL_SERVICE_NAME").is_err() {
        resource = resource.with_service_name(settings.service_name.clone());
    }
    Ok(Some(
        SdkTracerProvider::builder()
            .with_resource(resource.build())
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                settings.sampling_ratio,
            ))))
            .with_batch_exporter(OnRuntime {
                inner: Arc::new(exporter),
                runtime,
            })
            .build(),
    ))
}

/// Runs an exporter's sends on a tokio runtime. The SDK's batch processor exports
/// from a thread of its own with a plain executor, where the hyper client (which
/// spawns its connections on tokio) cannot run; this hands each export to the
/// runtime and waits for it there.
#[derive(Debug)]
struct OnRuntime<E> {
    inner: Arc<E>,
    runtime: tokio::runtime::Handle,
}

impl<E: SpanExporter + 'static> SpanExporter for OnRuntime<E> {
    fn export(
        &self,
        batch: Vec<SpanData>,
    ) -> impl std::future::Future<Output = OTelSdkResult> + Send {
        let inner = Arc::clone(&self.inner);
        let task = self.runtime.spawn(async move { inner.export(batch).await });
        async move {
            task.await
                .unwrap_or_else(|e| Err(OTelSdkError::InternalFailure(e.to_string())))
        }
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.set_resource(resource);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead as _, BufReader, Read as _, Write as _};

    use opentelemetry::trace::{Tracer as _, TracerProvider as _};

    use super::*;

    /// A collector of one request: its request line and body size.
    fn collector() -> (String, std::thread::JoinHandle<(String, usize)>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let handle = std::thread::spawn(move || {
            let (stream, _) = listener.accept().expect("accept");
            let mut reader = BufReader::new(stream.try_clone().expect("clone"));
            let mut request_line = String::new();
            reader.read_line(&mut request_line).expect("request line");
            let mut length = 0;
            loop {
                let mut line = String::new();
                reader.read_line(&mut line).expect("header");
                if line.trim().is_empty() {
                    break;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = v.trim().parse().expect("length");
                }
            }
            let mut body = vec![0; length];
            reader.read_exact(&mut body).expect("body");
            let mut stream = stream;
            stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n")
                .expect("answer");
            (request_line.trim().to_owned(), body.len())
        });
        (url, handle)
    }

    #[test]
    fn no_endpoint_no_exporter() {
        if std::env::var_os("OTEL_EXPORTER_OTLP_ENDPOINT").is_some() {
            return;
        }
        let settings = OtlpSettings {
            endpoint: None,
            service_name: "t".into(),
            sampling_ratio: 1.0,
        };
        assert!(tracer_provider(&settings).expect("builds").is_none());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn spans_reach_the_collector_over_http_protobuf_at_shutdown() {
        let (url, collector) = collector();
        let provider = tracer_provider(&OtlpSettings {
            endpoint: Some(format!("{url}/")),
            service_name: "otel-unit".into(),
            sampling_ratio: 1.0,
        })
        .expect("builds")
        .expect("an exporter");
        provider.tracer("t").in_span("work", |_| {});
        tokio::task::spawn_blocking(move || provider.shutdown())
            .await
            .expect("join")
            .expect("flushed");
        let (request_line, body) = collector.join().expect("collector");
        assert_eq!(request_line, "POST /v1/traces HTTP/1.1");
        assert!(body > 0, "a protobuf body");
    }
}
