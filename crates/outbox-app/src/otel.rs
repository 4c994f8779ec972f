//! OpenTelemetry (feature `otel`), after the messaging semantic conventions.
//!
//! - At enqueue the producer's trace context is stored in the message's headers
//!   ([`outbox_ports::trace_context`], turned on by this feature).
//! - The relay publishes each message under a `send <exchange>` span (kind
//!   producer) whose parent is the stored context; the published `traceparent` is
//!   that span's, so the consumer's span is its child.
//! - A consumer handles a delivery under a `process <queue>` span (kind consumer)
//!   whose parent is the delivery's `traceparent`; a retry by the consume sweep
//!   (which is also how a reconsume runs) starts a new trace linked to it.
//!
//! The spans are `tracing` spans carried to OpenTelemetry by `tracing-opentelemetry`
//! (a process without its layer creates no OpenTelemetry span and leaves the stored
//! headers as they are). [`tracer_provider`] builds the OTLP exporter (http/protobuf)
//! of `outbox run`; [`install_propagator`] makes W3C trace context the global
//! propagator, which [`outbox_ports::trace_context`] uses.

use std::sync::Arc;
use std::time::Duration;

use opentelemetry::trace::{Status, TraceContextExt as _};
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider, SpanData, SpanExporter};
use outbox_core::Message;
use outbox_ports::{PortError, PublishOutcome, trace_context};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::consumer::{ConsumerConfig, Handled, Unrecorded};

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

/// A `send <exchange>` span per message (kind client), each continuing the trace
/// stored in its headers (a requeued one: a new trace linked to it), and the
/// headers given the span's own context (what the broker carries
/// on). A span that has no OpenTelemetry context (no layer) leaves them untouched.
pub(crate) fn send_spans(
    messages: &mut [Message],
    attempts: &[u32],
    requeued: &[bool],
) -> Vec<tracing::Span> {
    messages
        .iter_mut()
        .zip(attempts)
        .zip(requeued)
        .map(|((m, attempts), requeued)| {
            let span = tracing::info_span!(
                target: "outbox::relay",
                "send",
                otel.name = %format_args!("send {}", m.exchange),
                otel.kind = "client",
                messaging.system = "rabbitmq",
                messaging.destination.name = %m.exchange,
                messaging.rabbitmq.destination.routing_key = %m.routing_key,
                messaging.message.id = %m.id,
                messaging.message.body.size = m.payload.len() as u64,
                outbox.attempt = attempts.saturating_add(1),
            );
            span.set_attribute("messaging.operation.type", "send");
            let stored = trace_context::extract(&m.headers);
            if *requeued {
                // An operator's requeue is a new piece of work: its own trace,
                // linked to the one the message was created in.
                span.set_attribute("outbox.requeued", true);
                let _ = span.set_parent(opentelemetry::Context::new());
                span.add_link(stored.span().span_context().clone());
            } else {
                let _ = span.set_parent(stored);
            }
            let cx = span.context();
            if cx.span().span_context().is_valid() {
                trace_context::inject(&cx, &mut m.headers);
            }
            span
        })
        .collect()
}

/// Records each publish outcome on its span: `error.type` and an error status for
/// anything but a confirm.
pub(crate) fn publish_outcomes(spans: &[tracing::Span], outcomes: &[PublishOutcome]) {
    for (i, span) in spans.iter().enumerate() {
        let error = match outcomes.get(i) {
            Some(PublishOutcome::Confirmed) => None,
            Some(o @ PublishOutcome::Nacked(_)) => Some(("nacked", o.to_string())),
            Some(o @ PublishOutcome::Unroutable(_)) => Some(("unroutable", o.to_string())),
            Some(o @ PublishOutcome::Failed(_)) => Some(("publish_failed", o.to_string())),
            Some(o @ PublishOutcome::NotSent(PortError::OutOfTime { .. })) => {
                Some(("out_of_time", o.to_string()))
            }
            Some(o @ PublishOutcome::NotSent(_)) => Some(("not_sent", o.to_string())),
            Some(o @ PublishOutcome::Rejected(_)) => Some(("rejected", o.to_string())),
            None => Some(("no_outcome", "publisher returned no outcome".to_owned())),
        };
        if let Some((kind, text)) = error {
            span.set_attribute("error.type", kind);
            span.set_status(Status::error(text));
        }
    }
}

/// The `process <queue>` span of one handling. A first delivery continues the
/// delivery's trace; a retry by the consume sweep (`retry`, also a reconsume)
/// starts a new trace linked to it.
pub(crate) fn process_span(
    config: &ConsumerConfig,
    message: &Message,
    attempt: u32,
    retry: bool,
) -> tracing::Span {
    let span = tracing::info_span!(
        target: "outbox::consumer",
        "process",
        otel.name = %format_args!("process {}", config.queue),
        otel.kind = "consumer",
        messaging.system = "rabbitmq",
        messaging.destination.name = %message.exchange,
        messaging.rabbitmq.destination.routing_key = %message.routing_key,
        messaging.destination.subscription.name = %config.queue,
        messaging.consumer.group.name = %config.name,
        messaging.message.id = %message.id,
        messaging.message.body.size = message.payload.len() as u64,
        outbox.attempt = attempt,
        outbox.retry = retry,
    );
    span.set_attribute("messaging.operation.type", "process");
    let stored = trace_context::extract(&message.headers);
    if retry {
        let _ = span.set_parent(opentelemetry::Context::new());
        span.add_link(stored.span().span_context().clone());
    } else {
        let _ = span.set_parent(stored);
    }
    span
}

/// Records what a handling did on its span: whether the inbox absorbed a
/// duplicate, and `error.type` with an error status for a failure.
pub(crate) fn handled(span: &tracing::Span, result: &Result<Handled, Unrecorded>) {
    let error = match result {
        Ok(Handled::Duplicate) => {
            span.set_attribute("outbox.inbox.duplicate", true);
            None
        }
        Ok(Handled::Consumed { .. }) => {
            span.set_attribute("outbox.inbox.duplicate", false);
            None
        }
        Ok(Handled::Failed(f)) => {
            span.set_attribute("outbox.dead", f.dead);
            Some((
                if f.dead { "dead" } else { "handler_failed" },
                f.error.clone(),
            ))
        }
        Err(Unrecorded::Nothing(e)) => Some(("inbox_unavailable", e.to_string())),
        Err(Unrecorded::Outcome { error, .. }) => Some(("outcome_unrecorded", error.to_string())),
    };
    if let Some((kind, text)) = error {
        span.set_attribute("error.type", kind);
        span.set_status(Status::error(text));
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
    fn a_requeued_message_is_sent_in_a_new_trace_linked_to_its_own() {
        use opentelemetry_sdk::trace::InMemorySpanExporter;
        use tracing_subscriber::layer::SubscriberExt as _;
        install_propagator();
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        let stored = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let mut messages: Vec<Message> = (0..2)
            .map(|n| {
                let mut m = outbox_core::NewMessage::new("x", "k", vec![n])
                    .with_header("traceparent", stored)
                    .into_message(
                        outbox_core::MessageId::from_uuid(uuid::Uuid::now_v7()),
                        outbox_core::Timestamp::now_utc(),
                    );
                m.not_before = None;
                m
            })
            .collect();
        tracing::subscriber::with_default(subscriber, || {
            let spans = send_spans(&mut messages, &[0, 0], &[false, true]);
            drop(spans);
        });
        let _ = provider.force_flush();
        let finished = exporter.get_finished_spans().expect("spans");
        assert_eq!(finished.len(), 2);
        let continued = &finished[0];
        let requeued = &finished[1];
        assert_eq!(
            continued.span_context.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736",
            "a first publish continues the stored trace"
        );
        assert_ne!(
            requeued.span_context.trace_id(),
            continued.span_context.trace_id(),
            "a requeue starts a new trace"
        );
        assert_eq!(
            requeued.links.links[0].span_context.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736",
            "linked to the stored one"
        );
        assert_eq!(continued.span_kind, opentelemetry::trace::SpanKind::Client);
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
