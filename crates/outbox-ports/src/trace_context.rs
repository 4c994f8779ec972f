//! Trace context in message headers (W3C `traceparent`, `tracestate`), the one place
//! every enqueue path and the services read and write it.
//!
//! Without the `otel` feature [`inject_current`] does nothing, so adapters call it
//! unconditionally and pay nothing. With it (turned on by the `otel` feature of the
//! `outbox` facade, `outbox-relay`, `outbox-consumer` or `outbox-cli`; Cargo unifies
//! it for every adapter of the build), the current OpenTelemetry context is written
//! with the global text map propagator
//! (`opentelemetry::global::set_text_map_propagator`; `outbox-cli` installs the W3C
//! one). With `tracing-opentelemetry`'s layer the current context is the entered
//! `tracing` span's.
//!
//! It lives here, not in `outbox-core` (which stays free of everything but serde,
//! thiserror, uuid and time) nor in `outbox-relay` or `outbox-consumer` (which
//! adapters must not depend on): the ports are what both the adapters' enqueue and
//! the services already share.

use outbox_core::Headers;

/// The W3C trace context header.
pub const TRACEPARENT: &str = "traceparent";
/// The W3C trace state header.
pub const TRACESTATE: &str = "tracestate";

/// Writes the current trace context into `headers`, unless they already carry a
/// `traceparent` (a producer that set one on purpose keeps it) or no span is
/// active. Without the `otel` feature: nothing.
#[cfg_attr(not(feature = "otel"), allow(unused_variables))]
pub fn inject_current(headers: &mut Headers) {
    #[cfg(feature = "otel")]
    {
        use opentelemetry::trace::TraceContextExt as _;
        if headers.contains_key(TRACEPARENT) {
            return;
        }
        let cx = opentelemetry::Context::current();
        if !cx.span().span_context().is_valid() {
            return;
        }
        inject(&cx, headers);
    }
}

/// At enqueue: when a span is active and the message carries no `traceparent`, a
/// `create <exchange>` span (kind producer, the messaging conventions' create
/// operation) is started under it and ended, and its context written into the
/// headers, so the relay's `send` continues from the create. The span goes to the
/// global tracer provider (`opentelemetry::global::set_tracer_provider`; `outbox
/// run` sets it): without one it records nothing and the active span's context is
/// written instead. Without the `otel` feature: nothing.
#[cfg_attr(not(feature = "otel"), allow(unused_variables))]
pub fn record_create(message: &mut outbox_core::Message) {
    #[cfg(feature = "otel")]
    {
        use opentelemetry::KeyValue;
        use opentelemetry::trace::{Span as _, SpanKind, TraceContextExt as _, Tracer as _};
        if message.headers.contains_key(TRACEPARENT) {
            return;
        }
        let parent = opentelemetry::Context::current();
        if !parent.span().span_context().is_valid() {
            return;
        }
        let tracer = opentelemetry::global::tracer("outbox");
        let size = i64::try_from(message.payload.len()).unwrap_or(i64::MAX);
        let mut span = tracer
            .span_builder(format!("create {}", message.exchange))
            .with_kind(SpanKind::Producer)
            .with_attributes([
                KeyValue::new("messaging.system", "rabbitmq"),
                KeyValue::new("messaging.operation.type", "create"),
                KeyValue::new("messaging.destination.name", message.exchange.clone()),
                KeyValue::new(
                    "messaging.rabbitmq.destination.routing_key",
                    message.routing_key.clone(),
                ),
                KeyValue::new("messaging.message.id", message.id.to_string()),
                KeyValue::new("messaging.message.body.size", size),
            ])
            .start_with_context(&tracer, &parent);
        let created = span.span_context().clone();
        span.end();
        let cx = if created.is_valid() {
            parent.with_remote_span_context(created)
        } else {
            parent
        };
        inject(&cx, &mut message.headers);
    }
}

/// Writes the trace context of `cx` into `headers` with the global propagator,
/// replacing any there.
#[cfg(feature = "otel")]
pub fn inject(cx: &opentelemetry::Context, headers: &mut Headers) {
    opentelemetry::global::get_text_map_propagator(|p| {
        p.inject_context(cx, &mut HeaderMap(headers))
    });
}

/// The trace context stored in `headers` (an empty context when there is none or
/// it cannot be parsed).
#[cfg(feature = "otel")]
#[must_use]
pub fn extract(headers: &Headers) -> opentelemetry::Context {
    opentelemetry::global::get_text_map_propagator(|p| p.extract(&HeaderRef(headers)))
}

#[cfg(feature = "otel")]
struct HeaderMap<'a>(&'a mut Headers);

#[cfg(feature = "otel")]
impl opentelemetry::propagation::Injector for HeaderMap<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.insert(key.to_owned(), value);
    }
}

#[cfg(feature = "otel")]
struct HeaderRef<'a>(&'a Headers);

#[cfg(feature = "otel")]
impl opentelemetry::propagation::Extractor for HeaderRef<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(String::as_str).collect()
    }
}

#[cfg(all(test, feature = "otel"))]
mod tests {
    use opentelemetry::trace::{
        SpanContext, SpanId, TraceContextExt as _, TraceFlags, TraceId, TraceState,
    };

    use super::*;

    #[test]
    fn current_context_is_written_once_and_read_back() {
        opentelemetry::global::set_text_map_propagator(
            opentelemetry_sdk::propagation::TraceContextPropagator::new(),
        );
        let mut headers = Headers::new();
        inject_current(&mut headers);
        assert!(headers.is_empty(), "no active span: nothing written");

        let trace = TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").expect("hex");
        let span = SpanId::from_hex("00f067aa0ba902b7").expect("hex");
        let sc = SpanContext::new(
            trace,
            span,
            TraceFlags::SAMPLED,
            true,
            TraceState::default(),
        );
        let _guard = opentelemetry::Context::current()
            .with_remote_span_context(sc)
            .attach();
        inject_current(&mut headers);
        assert_eq!(
            headers.get(TRACEPARENT).map(String::as_str),
            Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        );
        let back = extract(&headers);
        assert_eq!(back.span().span_context().trace_id(), trace);

        let mut own = Headers::from([(TRACEPARENT.to_owned(), "mine".to_owned())]);
        inject_current(&mut own);
        assert_eq!(
            own[TRACEPARENT], "mine",
            "a producer's own traceparent is kept"
        );
    }
}
