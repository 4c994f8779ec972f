//! The OpenAPI document, generated from the endpoints' annotations and the model's
//! types, so it cannot drift from what the router serves without a test noticing.
//!
//! It says what the API accepts and answers as exactly as JSON Schema can: status
//! names as enums of each side, ids with their format, times as `date-time`,
//! `limit` as an integer from 1 to 1000, cursors by pattern, every error status
//! with its `{"error": {"code", "message"}}` body, and the bearer scheme on every
//! operation. Schemathesis (`cargo xtask api-fuzz`) checks the live API against it.
//! The error statuses and the deliveries' mirrors it names are in `responses`;
//! the endpoint that serves it, `openapi_json`, is here, next to what it serves.

use axum::Json;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::model;
#[allow(unused_imports)] // Named by the OpenAPI annotations only.
use crate::responses::DocumentErrors;
use crate::routes;

struct BearerToken;

impl Modify for BearerToken {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

#[derive(OpenApi)]
#[openapi(
    info(title = "outbox admin API", description = "Browse, search and act on outbox messages, consumers' deliveries and dead letters. Every request needs `Authorization: Bearer <secret>` of a configured admin token; writes need a token with the write role."),
    servers((url = "/api/v1")),
    security(("bearer" = [])),
    modifiers(&BearerToken),
    paths(
        routes::stats,
        routes::list_messages,
        routes::get_message,
        routes::requeue_message,
        routes::publish_now,
        routes::replay_message,
        routes::delete_message,
        routes::requeue_matching,
        routes::delete_matching,
        routes::blocked_keys,
        routes::failures,
        routes::requeue_failure_group,
        routes::delete_failure_group,
        routes::reconsume_failure_group,
        routes::consumers,
        routes::pause_exchange,
        routes::resume_exchange,
        routes::pause_consumer,
        routes::resume_consumer,
        routes::pauses,
        routes::throughput,
        routes::exchange_throughput,
        routes::consumer_throughput,
        routes::list_deliveries,
        routes::get_delivery,
        routes::reconsume,
        routes::replay_delivery,
        routes::reconsume_matching,
        routes::list_dead_letters,
        routes::get_dead_letter,
        routes::delete_dead_letter,
        routes::audit,
        openapi_json,
    ),
    components(schemas(model::ErrorBody, model::FilterBody, model::DeliveryFilterBody))
)]
struct AdminApi;

/// This document.
#[utoipa::path(get, path = "/openapi.json", tag = "meta",
    responses((status = 200, description = "The OpenAPI 3.1 document", content_type = "application/json"), DocumentErrors))]
pub(crate) async fn openapi_json() -> Json<utoipa::openapi::OpenApi> {
    Json(document())
}

/// The admin API's OpenAPI document (paths relative to where it is mounted).
#[must_use]
pub fn document() -> utoipa::openapi::OpenApi {
    AdminApi::openapi()
}
