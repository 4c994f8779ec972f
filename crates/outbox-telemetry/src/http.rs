//! The HTTP side of telemetry (feature `http`): the process's Prometheus recorder
//! with every metric's description, and a consumer's own endpoints, `/healthz`,
//! `/readyz` and `/metrics`, for a process that runs consumers (the relay's are
//! `outbox run`'s).

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

use axum::http::{StatusCode, header};
use axum::routing::get;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio_util::sync::CancellationToken;

/// `/healthz`: the process is up.
pub async fn healthz() -> &'static str {
    "ok\n"
}

/// The process-wide Prometheus recorder (installed once).
pub fn prometheus() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        if metrics::set_global_recorder(recorder).is_err() {
            tracing::warn!(
                "a metrics recorder was already installed; /metrics shows only this one's"
            );
        }
        describe_metrics();
        handle
    })
}

/// Every metric's `# HELP` line (docs/telemetry.md says more).
fn describe_metrics() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_gauge!(
        "outbox_pending",
        "Messages waiting to be published (delayed ones included)."
    );
    describe_gauge!(
        "outbox_publish_failed",
        "Messages whose publish failed, waiting for their retry."
    );
    describe_gauge!("outbox_dead", "Messages given up on, left for an operator.");
    describe_gauge!(
        "outbox_oldest_unsent_age_seconds",
        "Age of the oldest message not yet published, in seconds."
    );
    describe_gauge!(
        "outbox_ordering_blocked_keys",
        "Ordering keys held back by a failing or dead first message."
    );
    describe_gauge!(
        "outbox_relay_stalled",
        "1 while the stall watchdog finds the relay stalled."
    );
    describe_gauge!(
        "outbox_consumer_stalled",
        "1 while the stall watchdog finds the consumer stalled."
    );
    describe_gauge!(
        "outbox_paused",
        "1 while an operator has paused the exchange or consumer (kind, name); 0 once resumed."
    );
    describe_gauge!(
        "outbox_exchange_pending",
        "One exchange's messages waiting to be published (exchange)."
    );
    describe_gauge!(
        "outbox_exchange_publish_failed",
        "One exchange's messages waiting for a publish retry (exchange)."
    );
    describe_gauge!(
        "outbox_exchange_dead",
        "One exchange's messages given up on (exchange)."
    );
    describe_gauge!(
        "outbox_store_up",
        "1 when the store answered the last scrape's read."
    );
    describe_counter!(
        "outbox_published_total",
        "Messages published and confirmed by the broker."
    );
    describe_counter!(
        "outbox_publish_failures_total",
        "Publish attempts that failed (each retried or dead)."
    );
    describe_counter!("outbox_dead_total", "Messages given up on by the relay.");
    describe_counter!(
        "outbox_publish_deferred_total",
        "Messages given back unsent (broker out of reach, or the batch's budget spent)."
    );
    describe_counter!("outbox_sweeps_total", "Retry sweeps completed.");
    describe_histogram!(
        "outbox_sweep_duration_seconds",
        "How long a retry sweep took, in seconds."
    );
    describe_counter!(
        "outbox_sweep_publish_retried_total",
        "Messages a retry sweep published again."
    );
    describe_counter!(
        "outbox_sweep_publish_failed_total",
        "Messages a retry sweep found failing again."
    );
    describe_counter!(
        "outbox_retention_deleted_total",
        "Rows deleted by retention."
    );
    describe_counter!(
        "outbox_consumed_total",
        "Deliveries handled and recorded as consumed."
    );
    describe_counter!(
        "outbox_consume_failures_total",
        "Handler failures (each retried or dead)."
    );
    describe_counter!(
        "outbox_duplicates_absorbed_total",
        "Deliveries the inbox had seen before, acknowledged without their handler."
    );
    describe_counter!("outbox_consume_dead_total", "Deliveries given up on.");
    describe_counter!(
        "outbox_dead_letters_total",
        "Deliveries that could not become a message, kept as dead letters."
    );
    describe_counter!(
        "outbox_consume_held_behind_key_total",
        "Deliveries recorded to wait behind an unfinished earlier one of their key."
    );
}

/// Publishes a consumer's counters as Prometheus metrics (labelled by consumer).
pub fn record_consumer(name: &str, c: &outbox_consumer::ConsumerCounters) {
    let _ = prometheus();
    let label = [("consumer", name.to_owned())];
    metrics::counter!("outbox_consumed_total", &label).absolute(c.consumed.load(Ordering::Relaxed));
    metrics::counter!("outbox_consume_failures_total", &label)
        .absolute(c.consume_failures.load(Ordering::Relaxed));
    metrics::counter!("outbox_duplicates_absorbed_total", &label)
        .absolute(c.duplicates.load(Ordering::Relaxed));
    metrics::counter!("outbox_consume_dead_total", &label).absolute(c.dead.load(Ordering::Relaxed));
    metrics::counter!("outbox_dead_letters_total", &label)
        .absolute(c.dead_letters.load(Ordering::Relaxed));
    metrics::counter!("outbox_retention_deleted_total", &label)
        .absolute(c.retention_deleted.load(Ordering::Relaxed));
    metrics::counter!("outbox_consume_held_behind_key_total", &label)
        .absolute(c.held_behind_key.load(Ordering::Relaxed));
}

/// Serves `/healthz` and `/metrics` for a consumer process on `address` until
/// `cancel` fires; `name`'s counters are read at every scrape.
///
/// # Errors
/// When the address cannot be bound.
pub async fn serve_consumer(
    address: SocketAddr,
    name: String,
    counters: Arc<outbox_consumer::ConsumerCounters>,
    cancel: CancellationToken,
) -> std::io::Result<()> {
    serve_consumer_router(address, name, counters, None, cancel).await
}

/// As [`serve_consumer`], and `/readyz`: 200 `worker: ok`, or 503 with the reason
/// while the worker's watchdog finds it stalled (`progress`, from
/// `InboxWorker::progress` or `ConsumerHandles::progress`); the gauge
/// `outbox_consumer_stalled{consumer}` follows it.
///
/// # Errors
/// When the address cannot be bound.
pub async fn serve_consumer_ready(
    address: SocketAddr,
    name: String,
    counters: Arc<outbox_consumer::ConsumerCounters>,
    progress: Arc<outbox_runtime::stall::RelayProgress>,
    cancel: CancellationToken,
) -> std::io::Result<()> {
    serve_consumer_router(address, name, counters, Some(progress), cancel).await
}

async fn serve_consumer_router(
    address: SocketAddr,
    name: String,
    counters: Arc<outbox_consumer::ConsumerCounters>,
    progress: Option<Arc<outbox_runtime::stall::RelayProgress>>,
    cancel: CancellationToken,
) -> std::io::Result<()> {
    let mut app = axum::Router::new().route("/healthz", get(healthz));
    if let Some(progress) = progress {
        app = app.route(
            "/readyz",
            get(move || {
                let stalled = progress.stalled();
                async move {
                    match stalled {
                        None => (StatusCode::OK, "worker: ok\n".to_owned()),
                        Some(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("worker: {why}\n")),
                    }
                }
            }),
        );
    }
    let app = app.route(
        "/metrics",
        get(move || {
            let (name, counters) = (name.clone(), Arc::clone(&counters));
            async move {
                record_consumer(&name, &counters);
                (
                    [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                    prometheus().render(),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind(address).await?;
    axum::serve(listener, app)
        .with_graceful_shutdown(cancel.cancelled_owned())
        .await
}
