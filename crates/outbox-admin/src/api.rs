//! The admin API's router: the endpoints of `routes` and the document of
//! `openapi` (which describes those endpoints), behind the bearer token check.

use std::sync::Arc;

use axum::Router;
use axum::routing::{get, post};

use crate::auth::{AdminAuth, Gate, require_token};
use crate::openapi::openapi_json;
use crate::routes::{
    audit, blocked_keys, consumers, delete_dead_letter, delete_failure_group, delete_matching,
    delete_message, failures, get_dead_letter, get_delivery, get_message, list_dead_letters,
    list_deliveries, list_messages, pause_consumer, pause_exchange, pauses, publish_now, reconsume,
    reconsume_failure_group, reconsume_matching, replay_delivery, replay_message,
    requeue_failure_group, requeue_matching, requeue_message, resume_consumer, resume_exchange,
    stats,
};
use crate::routes::{consumer_throughput, exchange_throughput, throughput};
use crate::{AdminError, AdminService};

async fn no_route() -> AdminError {
    AdminError::NoRoute
}

async fn method_not_allowed() -> AdminError {
    AdminError::MethodNotAllowed
}

/// The admin API, to be nested (e.g. under `/api/v1`) into any axum service.
/// Every request, unknown routes included, needs a configured token. Unknown
/// bearer tokens are limited per client address (ten in a burst, then one every
/// six seconds; then 429 with `Retry-After`), which the server must give: serve
/// it with `into_make_service_with_connect_info::<SocketAddr>()` (without, no
/// client is limited).
pub fn router(service: AdminService, auth: AdminAuth) -> Router {
    Router::new()
        .route("/stats", get(stats))
        .route("/messages", get(list_messages))
        .route("/messages/requeue", post(requeue_matching))
        .route("/messages/delete", post(delete_matching))
        .route("/messages/{id}", get(get_message).delete(delete_message))
        .route("/messages/{id}/requeue", post(requeue_message))
        .route("/messages/{id}/publish-now", post(publish_now))
        .route("/messages/{id}/replay", post(replay_message))
        .route("/ordering/blocked-keys", get(blocked_keys))
        .route("/failures", get(failures))
        .route("/failures/requeue", post(requeue_failure_group))
        .route("/failures/delete", post(delete_failure_group))
        .route("/failures/reconsume", post(reconsume_failure_group))
        .route("/exchanges/{exchange}/pause", post(pause_exchange))
        .route("/exchanges/{exchange}/resume", post(resume_exchange))
        .route("/exchanges/{exchange}/throughput", get(exchange_throughput))
        .route("/throughput", get(throughput))
        .route("/pauses", get(pauses))
        .route("/consumers", get(consumers))
        .route("/consumers/{name}/pause", post(pause_consumer))
        .route("/consumers/{name}/resume", post(resume_consumer))
        .route("/consumers/{name}/throughput", get(consumer_throughput))
        .route("/consumers/{name}/deliveries", get(list_deliveries))
        .route(
            "/consumers/{name}/deliveries/reconsume",
            post(reconsume_matching),
        )
        .route("/consumers/{name}/deliveries/{id}", get(get_delivery))
        .route(
            "/consumers/{name}/deliveries/{id}/reconsume",
            post(reconsume),
        )
        .route(
            "/consumers/{name}/deliveries/{id}/replay",
            post(replay_delivery),
        )
        .route("/dead-letters", get(list_dead_letters))
        .route(
            "/dead-letters/{id}",
            get(get_dead_letter).delete(delete_dead_letter),
        )
        .route("/audit", get(audit))
        .route("/openapi.json", get(openapi_json))
        .fallback(no_route)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(
            Arc::new(Gate::new(auth)),
            require_token,
        ))
        .with_state(Arc::new(service))
}
