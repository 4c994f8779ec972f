//! OpenTelemetry spans of the relay (feature `otel`), after the messaging semantic
//! conventions: each message is published under a `send <exchange>` span (kind
//! client) whose parent is the trace context stored at enqueue
//! ([`outbox_ports::trace_context`]); the published `traceparent` is that span's,
//! so the consumer's `process` span is its child. An operator's requeue starts a
//! new trace linked to the stored one. A process without a `tracing-opentelemetry`
//! layer creates no OpenTelemetry span and leaves the headers as they are.

use opentelemetry::trace::{Status, TraceContextExt as _};
use outbox_ports::{PortError, PublishOutcome, trace_context};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// A `send <exchange>` span per message (kind client), each continuing the trace
/// stored in its headers (a requeued one: a new trace linked to it), and the
/// headers given the span's own context (what the broker carries
/// on). A span that has no OpenTelemetry context (no layer) leaves them untouched.
pub fn send_spans(batch: &mut [crate::layer::Outgoing<'_>]) -> Vec<tracing::Span> {
    batch
        .iter_mut()
        .map(|m| {
            let span = tracing::info_span!(
                target: "outbox::relay",
                "send",
                otel.name = %format_args!("send {}", m.exchange),
                otel.kind = "client",
                messaging.system = "rabbitmq",
                messaging.destination.name = %m.exchange,
                messaging.rabbitmq.destination.routing_key = %m.routing_key,
                messaging.message.id = %m.id,
                messaging.message.body.size = m.payload_len as u64,
                outbox.attempt = m.attempts.saturating_add(1),
            );
            span.set_attribute("messaging.operation.type", "send");
            let stored = trace_context::extract(m.headers);
            if m.requeued {
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
                trace_context::inject(&cx, m.headers);
            }
            span
        })
        .collect()
}

/// Records each publish outcome on its span: `error.type` and an error status for
/// anything but a confirm.
pub fn publish_outcomes(spans: &[tracing::Span], outcomes: &[PublishOutcome]) {
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

#[cfg(test)]
mod tests {
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_sdk::trace::SdkTracerProvider;

    use super::*;

    #[test]
    fn a_requeued_message_is_sent_in_a_new_trace_linked_to_its_own() {
        use opentelemetry_sdk::trace::InMemorySpanExporter;
        use tracing_subscriber::layer::SubscriberExt as _;
        opentelemetry::global::set_text_map_propagator(
            opentelemetry_sdk::propagation::TraceContextPropagator::new(),
        );
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        let stored = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let mut messages: Vec<outbox_core::Message> = (0..2)
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
            let spans = send_spans(&mut crate::layer::outgoing(
                &mut messages,
                &[0, 0],
                &[false, true],
            ));
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
}

/// The relay's tracing layer: a `send <exchange>` span per message
/// ([`send_spans`]), each told its outcome ([`publish_outcomes`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct SendSpans;

impl crate::layer::PublishLayer for SendSpans {
    fn before_publish(
        &self,
        batch: &mut [crate::layer::Outgoing<'_>],
    ) -> crate::layer::AfterPublish {
        let spans = send_spans(batch);
        Box::new(move |outcomes| publish_outcomes(&spans, outcomes))
    }
}
