//! OpenTelemetry spans of a consumer (feature `otel`), after the messaging semantic
//! conventions: a delivery is handled under a `process <queue>` span (kind
//! consumer) whose parent is the delivery's `traceparent`; a retry by the consume
//! sweep (which is also how a reconsume runs) starts a new trace linked to it.

use opentelemetry::trace::{Status, TraceContextExt as _};
use outbox_core::Message;
use outbox_ports::trace_context;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::config::ConsumerConfig;
use crate::outcome::{Handled, Unrecorded};

/// The `process <queue>` span of one handling. A first delivery continues the
/// delivery's trace; a retry by the consume sweep (`retry`, also a reconsume)
/// starts a new trace linked to it.
pub fn process_span(
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
pub fn handled(span: &tracing::Span, result: &Result<Handled, Unrecorded>) {
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

/// The consumer's tracing layer: each handling under its `process` span
/// ([`process_span`]), which is told the outcome ([`handled`]); it is a
/// [`crate::layer::HandlingLayer`].
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessSpans;
