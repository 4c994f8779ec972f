//! HTTP endpoints of a running relay: `/healthz` (the process is up), `/readyz`
//! (store, broker and lock reachable) and `/metrics` (Prometheus text format).
//! Loopback by default; off loopback a bearer token guards `/readyz` and `/metrics`.
//! With the `admin` feature, [`serve_with_admin`] also serves the admin API at
//! `/api/v1`, which has tokens of its own: `http.token` does not apply to it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use outbox_core::SweepReport;
use outbox_ports::{DistributedLock, OutboxStore, PauseStore, Publisher};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use outbox_relay::RelayCounters;
/// Kept here too, where they were first public: the Prometheus recorder and a
/// consumer's endpoints are outbox-telemetry's.
pub use outbox_telemetry::http::{
    prometheus, record_consumer, serve_consumer, serve_consumer_ready,
};

/// What the endpoints read.
#[derive(Clone)]
pub struct HttpState {
    /// Outbox store (depth, age, dead).
    pub store: Arc<dyn OutboxStore>,
    /// Publisher (readiness).
    pub publisher: Arc<dyn Publisher>,
    /// Lock (readiness).
    pub lock: Arc<dyn DistributedLock>,
    /// Key probed for lock readiness.
    pub lock_probe_key: String,
    /// Relay totals.
    pub counters: Arc<RelayCounters>,
    /// Bearer token, if required.
    pub token: Option<String>,
    /// The relay's tasks: a panicked or stopped one fails readiness.
    pub health: Arc<outbox_runtime::ServiceHealth>,
    /// The stall watchdog's verdict (`RelayHandles::progress`): a stalled relay
    /// fails readiness; `None` checks nothing.
    pub progress: Option<Arc<outbox_runtime::stall::RelayProgress>>,
    /// The pauses operators set (`outbox_paused`); `None` shows none.
    pub pauses: Option<Arc<dyn PauseStore>>,
    /// The counts per exchange (`outbox_exchange_*{exchange}`); `None` shows none.
    pub exchanges: Option<Arc<dyn outbox_ports::OutboxOperator>>,
}

/// The exchanges `/metrics` showed, to show 0 once an exchange has nothing
/// unsent or dead any more (a gauge stays in the recorder).
static SHOWN_EXCHANGES: std::sync::Mutex<std::collections::BTreeSet<String>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// `outbox_exchange_pending{exchange}`, `..._publish_failed` and `..._dead`: each
/// exchange's counts; an exchange no longer counted goes to 0. A store that does
/// not answer leaves them as they were.
#[allow(clippy::cast_precision_loss)]
async fn record_exchanges(operator: &dyn outbox_ports::OutboxOperator) {
    let counts = match operator.exchange_counts().await {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "metrics: counts per exchange unreadable");
            return;
        }
    };
    let mut shown = SHOWN_EXCHANGES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let now: std::collections::BTreeSet<String> =
        counts.iter().map(|c| c.exchange.clone()).collect();
    for gone in shown.difference(&now) {
        for name in [
            "outbox_exchange_pending",
            "outbox_exchange_publish_failed",
            "outbox_exchange_dead",
        ] {
            metrics::gauge!(name, "exchange" => gone.clone()).set(0.0);
        }
    }
    for c in &counts {
        let e = c.exchange.clone();
        metrics::gauge!("outbox_exchange_pending", "exchange" => e.clone()).set(c.pending as f64);
        metrics::gauge!("outbox_exchange_publish_failed", "exchange" => e.clone())
            .set(c.publish_failed as f64);
        metrics::gauge!("outbox_exchange_dead", "exchange" => e).set(c.dead as f64);
    }
    *shown = now;
}

/// The pauses `/metrics` showed as 1, to show 0 once lifted (a gauge stays in
/// the recorder).
static SHOWN_PAUSES: std::sync::Mutex<std::collections::BTreeSet<(&'static str, String)>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// `outbox_paused{kind,name}`: 1 for each pause in force, 0 for one lifted since
/// the last scrape. A store that does not answer leaves them as they were.
async fn record_pauses(pauses: &dyn PauseStore) {
    let now = match pauses.pauses().await {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(error = %e, "metrics: pauses unreadable");
            return;
        }
    };
    let now: std::collections::BTreeSet<(&'static str, String)> =
        now.into_iter().map(|p| (p.kind.as_str(), p.name)).collect();
    let mut shown = SHOWN_PAUSES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for (kind, name) in shown.difference(&now) {
        metrics::gauge!("outbox_paused", "kind" => *kind, "name" => name.clone()).set(0.0);
    }
    for (kind, name) in &now {
        metrics::gauge!("outbox_paused", "kind" => *kind, "name" => name.clone()).set(1.0);
    }
    *shown = now;
}

/// Records every sweep report as metrics until the channel closes.
pub async fn record_sweeps(mut reports: mpsc::Receiver<SweepReport>) {
    let _ = prometheus();
    while let Some(r) = reports.recv().await {
        let secs = (r.completed_at - r.started_at).as_seconds_f64().max(0.0);
        metrics::histogram!("outbox_sweep_duration_seconds").record(secs);
        metrics::counter!("outbox_sweeps_total").increment(1);
        metrics::counter!("outbox_sweep_publish_retried_total").increment(r.publish_retried);
        metrics::counter!("outbox_sweep_publish_failed_total").increment(r.publish_failed);
    }
}

fn authorized(state: &HttpState, headers: &HeaderMap) -> bool {
    let Some(token) = &state.token else {
        return true;
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    // Length and content compared without an early exit on the first difference.
    given.len() == token.len()
        && given
            .bytes()
            .zip(token.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

use outbox_telemetry::http::healthz;

async fn readyz(State(state): State<HttpState>, headers: HeaderMap) -> Response {
    if !authorized(&state, &headers) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let mut checks = readiness(
        &*state.store,
        &*state.publisher,
        &*state.lock,
        &state.lock_probe_key,
    )
    .await;
    checks.push(("relay", state.health.failure().map_or(Ok(()), Err)));
    // The services answer, yet the relay may be stuck (e.g. a mark behind another
    // session's lock): the watchdog's verdict, read here, not worked out.
    if let Some(p) = &state.progress {
        checks.push(("progress", p.stalled().map_or(Ok(()), Err)));
    }
    let (status, text) = readiness_report(&checks, state.publisher.degraded());
    (status, text).into_response()
}

/// `/readyz`'s status and text: 200 when every check passed, a line a check
/// (`name: ok` or `name: error`), then a `degraded:` line for each route the
/// broker cannot serve now (detail, never a failure: every other route publishes).
fn readiness_report(
    checks: &[(&str, Result<(), String>)],
    degraded: Vec<String>,
) -> (StatusCode, String) {
    let ready = checks.iter().all(|(_, r)| r.is_ok());
    let mut lines: Vec<String> = checks
        .iter()
        .map(|(name, r)| match r {
            Ok(()) => format!("{name}: ok"),
            Err(e) => format!("{name}: {e}"),
        })
        .collect();
    lines.extend(degraded.into_iter().map(|d| format!("degraded: {d}")));
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, lines.join("\n") + "\n")
}

/// The longest `/readyz` waits for any one service. A service behind a network
/// that forwards nothing and closes nothing never answers, and the operating
/// system gives up on such a connection only after minutes: past this, the check
/// reports the service as not answering, so a probe gets its answer (503) in time.
pub const READINESS_CHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// Reaches the store, the broker and the lock once each, at the same time, each
/// within [`READINESS_CHECK_TIMEOUT`]: what `/readyz` reports.
pub async fn readiness(
    store: &dyn OutboxStore,
    publisher: &dyn Publisher,
    lock: &dyn DistributedLock,
    lock_probe_key: &str,
) -> Vec<(&'static str, Result<(), String>)> {
    let (store, broker, lock) = tokio::join!(
        bounded(check_store(store)),
        bounded(check_broker(publisher)),
        bounded(check_lock(lock, lock_probe_key)),
    );
    vec![("store", store), ("broker", broker), ("lock", lock)]
}

/// `check`, or an error once [`READINESS_CHECK_TIMEOUT`] passed without an answer.
async fn bounded(check: impl Future<Output = Result<(), String>>) -> Result<(), String> {
    tokio::time::timeout(READINESS_CHECK_TIMEOUT, check)
        .await
        .unwrap_or_else(|_| {
            Err(format!(
                "no answer within {READINESS_CHECK_TIMEOUT:?} (unreachable, or busy that long: a publish batch waiting for its confirms holds the broker's connection)"
            ))
        })
}

/// Reads the store's totals once.
///
/// # Errors
/// The store's error, as text.
pub async fn check_store(store: &dyn OutboxStore) -> Result<(), String> {
    store.stats().await.map(|_| ()).map_err(|e| e.to_string())
}

/// Reaches the broker once.
///
/// # Errors
/// The broker's error, as text.
pub async fn check_broker(publisher: &dyn Publisher) -> Result<(), String> {
    publisher.check().await.map_err(|e| e.to_string())
}

/// Takes and releases `probe_key` once; a probe held by another instance counts as
/// reachable.
///
/// # Errors
/// The lock's error, as text.
pub async fn check_lock(lock: &dyn DistributedLock, probe_key: &str) -> Result<(), String> {
    match lock
        .acquire(probe_key, Duration::from_secs(5), Duration::from_millis(1))
        .await
    {
        Ok(Some(g)) => g.release().await.map_err(|e| e.to_string()),
        Ok(None) => Ok(()),
        Err(e) => Err(e.to_string()),
    }
}

async fn metrics_text(State(state): State<HttpState>, headers: HeaderMap) -> Response {
    if !authorized(&state, &headers) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let handle = prometheus();
    let c = &state.counters;
    metrics::counter!("outbox_published_total").absolute(c.published.load(Ordering::Relaxed));
    metrics::counter!("outbox_publish_failures_total")
        .absolute(c.publish_failures.load(Ordering::Relaxed));
    metrics::counter!("outbox_dead_total").absolute(c.dead.load(Ordering::Relaxed));
    metrics::counter!("outbox_publish_deferred_total").absolute(c.deferred.load(Ordering::Relaxed));
    #[allow(clippy::cast_precision_loss)]
    metrics::gauge!("outbox_broker_degraded_routes").set(state.publisher.degraded().len() as f64);
    if let Some(p) = &state.progress {
        metrics::gauge!("outbox_relay_stalled").set(if p.stalled().is_some() { 1.0 } else { 0.0 });
    }
    if let Some(pauses) = &state.pauses {
        record_pauses(pauses.as_ref()).await;
    }
    if let Some(exchanges) = &state.exchanges {
        record_exchanges(exchanges.as_ref()).await;
    }
    match state.store.stats().await {
        Ok(s) => {
            metrics::gauge!("outbox_pending").set(s.pending as f64);
            metrics::gauge!("outbox_publish_failed").set(s.publish_failed as f64);
            metrics::gauge!("outbox_dead").set(s.dead as f64);
            metrics::gauge!("outbox_ordering_blocked_keys").set(s.blocked_keys as f64);
            let age = s.oldest_unsent_at.map_or(0.0, |t| {
                (time::OffsetDateTime::now_utc() - t)
                    .as_seconds_f64()
                    .max(0.0)
            });
            metrics::gauge!("outbox_oldest_unsent_age_seconds").set(age);
            metrics::gauge!("outbox_store_up").set(1.0);
        }
        Err(e) => {
            tracing::warn!(error = %e, "metrics: store unreachable");
            metrics::gauge!("outbox_store_up").set(0.0);
        }
    }
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        handle.render(),
    )
        .into_response()
}

/// Serves the endpoints on `address` until `cancel` fires.
///
/// # Errors
/// When the address cannot be bound.
pub async fn serve(
    address: SocketAddr,
    state: HttpState,
    cancel: CancellationToken,
) -> std::io::Result<()> {
    serve_router(address, endpoints(state), cancel).await
}

/// Serves the endpoints and, nested at [`crate::admin_api::ADMIN_API_PATH`], the
/// admin API `admin` (its own tokens guard it; `state.token` guards only
/// `/readyz` and `/metrics`), on `address` until `cancel` fires.
///
/// # Errors
/// When the address cannot be bound.
#[cfg(feature = "admin")]
pub async fn serve_with_admin(
    address: SocketAddr,
    state: HttpState,
    admin: axum::Router,
    cancel: CancellationToken,
) -> std::io::Result<()> {
    let app = endpoints(state).nest(crate::admin_api::ADMIN_API_PATH, admin);
    serve_router(address, app, cancel).await
}

/// As [`serve_with_admin`], and the dashboard `ui` (when given) nested at
/// [`crate::admin_api::UI_PATH`], on `listener` (bound by the caller, so that a
/// taken address is known before anything else starts).
///
/// # Errors
/// When serving fails.
#[cfg(feature = "admin")]
pub async fn serve_with_admin_and_ui(
    listener: tokio::net::TcpListener,
    state: HttpState,
    admin: axum::Router,
    ui: Option<axum::Router>,
    cancel: CancellationToken,
) -> std::io::Result<()> {
    let mut app = endpoints(state).nest(crate::admin_api::ADMIN_API_PATH, admin);
    if let Some(ui) = ui {
        app = app.nest(crate::admin_api::UI_PATH, ui);
    }
    serve_on(listener, app, cancel).await
}

fn endpoints(state: HttpState) -> axum::Router {
    axum::Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .with_state(state)
}

async fn serve_router(
    address: SocketAddr,
    app: axum::Router,
    cancel: CancellationToken,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(address).await?;
    serve_on(listener, app, cancel).await
}

async fn serve_on(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    cancel: CancellationToken,
) -> std::io::Result<()> {
    let _ = prometheus();
    if let Ok(address) = listener.local_addr() {
        tracing::info!(%address, "HTTP endpoints listening");
    }
    // Each request knows its peer's address: the dashboard believes a trusted
    // proxy's sign-in headers only from the proxy's own addresses.
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(cancel.cancelled_owned())
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_degraded_route_is_detail_and_a_failed_check_is_a_failure() {
        let ok = [("store", Ok(())), ("broker", Ok(()))];
        let (status, text) = readiness_report(
            &ok,
            vec!["queue \"q\" unavailable: its home node is down".into()],
        );
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            text,
            "store: ok\nbroker: ok\ndegraded: queue \"q\" unavailable: its home node is down\n"
        );
        let failed = [("store", Ok(())), ("broker", Err("unreachable".to_owned()))];
        let (status, text) = readiness_report(&failed, Vec::new());
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(text, "store: ok\nbroker: unreachable\n");
    }
}
