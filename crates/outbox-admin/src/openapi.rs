//! The OpenAPI document, generated from the endpoints' annotations and the model's
//! types, so it cannot drift from what the router serves without a test noticing.

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::model;
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
        routes::delete_message,
        routes::requeue_matching,
        routes::delete_matching,
        routes::consumers,
        routes::list_deliveries,
        routes::get_delivery,
        routes::reconsume,
        routes::reconsume_matching,
        routes::list_dead_letters,
        routes::get_dead_letter,
        routes::delete_dead_letter,
        routes::audit,
        routes::openapi_json,
    ),
    components(schemas(model::ErrorBody, model::FilterBody))
)]
struct AdminApi;

/// The admin API's OpenAPI document (paths relative to where it is mounted).
#[must_use]
pub fn document() -> utoipa::openapi::OpenApi {
    AdminApi::openapi()
}
