//! The OpenAPI document, generated from the endpoints' annotations and the model's
//! types, so it cannot drift from what the router serves without a test noticing.
//!
//! It says what the API accepts and answers as exactly as JSON Schema can: status
//! names as enums of each side, ids with their format, times as `date-time`,
//! `limit` as an integer from 1 to 1000, cursors by pattern, every error status
//! with its `{"error": {"code", "message"}}` body, and the bearer scheme on every
//! operation. Schemathesis (`cargo xtask api-fuzz`) checks the live API against it.

#![allow(dead_code)] // The delivery mirrors below exist only to be described.

use std::collections::BTreeMap;

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{IntoResponses, Modify, OpenApi, ToSchema};

use crate::model::{self, ConsumeSide, ErrorBody, InboxStatusName};
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

/// The errors of a read without inputs (stats, consumers).
#[derive(IntoResponses)]
pub(crate) enum ReadErrors {
    /// No or an unknown bearer token.
    #[response(status = 401, headers(("WWW-Authenticate" = String, description = "`Bearer`")))]
    Unauthorized(ErrorBody),
    /// No admin token is configured (`admin_disabled`).
    #[response(status = 403)]
    Forbidden(ErrorBody),
    /// A store could not be reached (`store_unavailable`).
    #[response(status = 503)]
    Unavailable(ErrorBody),
}

/// The errors of a read with query or path inputs.
#[derive(IntoResponses)]
pub(crate) enum QueryErrors {
    /// A malformed input: bad id, cursor, status, time, limit, unknown parameter.
    #[response(status = 400)]
    BadRequest(ErrorBody),
    /// No or an unknown bearer token.
    #[response(status = 401, headers(("WWW-Authenticate" = String, description = "`Bearer`")))]
    Unauthorized(ErrorBody),
    /// No admin token is configured (`admin_disabled`).
    #[response(status = 403)]
    Forbidden(ErrorBody),
    /// No such entry, or no such path (an empty path segment).
    #[response(status = 404)]
    NotFound(ErrorBody),
    /// A store could not be reached (`store_unavailable`).
    #[response(status = 503)]
    Unavailable(ErrorBody),
}

/// The errors of a write.
#[derive(IntoResponses)]
pub(crate) enum WriteErrors {
    /// A malformed input: bad id, body, filter, status, time or max.
    #[response(status = 400)]
    BadRequest(ErrorBody),
    /// No or an unknown bearer token.
    #[response(status = 401, headers(("WWW-Authenticate" = String, description = "`Bearer`")))]
    Unauthorized(ErrorBody),
    /// No admin token is configured (`admin_disabled`), or a read token (`forbidden`).
    #[response(status = 403)]
    Forbidden(ErrorBody),
    /// No such entry, or no such path (an empty path segment).
    #[response(status = 404)]
    NotFound(ErrorBody),
    /// The entry is not in a status this action applies to (`illegal_transition`,
    /// `not_deletable`), or a relay, worker or retry holds it right now (`busy`).
    #[response(status = 409)]
    Conflict(ErrorBody),
    /// A store or the audit log could not be reached (`store_unavailable`,
    /// `audit_unavailable`).
    #[response(status = 503)]
    Unavailable(ErrorBody),
}

/// The errors of the document itself.
#[derive(IntoResponses)]
pub(crate) enum DocumentErrors {
    /// No or an unknown bearer token.
    #[response(status = 401, headers(("WWW-Authenticate" = String, description = "`Bearer`")))]
    Unauthorized(ErrorBody),
    /// No admin token is configured (`admin_disabled`).
    #[response(status = 403)]
    Forbidden(ErrorBody),
}

/// A consumer's delivery in a list: [`model::MessageItem`] with the inbox's
/// statuses (the same JSON; described apart so each side's status is exact).
#[derive(ToSchema)]
pub(crate) struct DeliveryItem {
    /// Message id (UUID).
    #[schema(
        format = "uuid",
        pattern = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
    )]
    id: String,
    /// Status of the delivery.
    status: InboxStatusName,
    /// Exchange.
    exchange: String,
    /// Routing key.
    routing_key: String,
    /// Message type.
    #[schema(rename = "type")]
    message_type: Option<String>,
    /// Correlation id.
    correlation_id: Option<String>,
    /// RFC 3339.
    #[schema(format = DateTime)]
    created_at: String,
    /// Handler attempts.
    attempts: u32,
    /// The last failure.
    last_error: Option<String>,
    /// RFC 3339.
    #[schema(format = DateTime)]
    next_attempt_at: Option<String>,
    /// Always null for a delivery (a due time is the outbox's).
    #[schema(format = DateTime)]
    due_at: Option<String>,
    /// When it was consumed, RFC 3339.
    #[schema(format = DateTime)]
    completed_at: Option<String>,
    /// The first 256 bytes, as text, or base64 when they are not UTF-8.
    payload_preview: String,
    /// Whether `payload_preview` is base64.
    payload_preview_base64: bool,
    /// Whether redaction changed or withheld the preview.
    payload_redacted: bool,
    /// The whole payload's size in bytes.
    payload_size: u64,
}

/// A page of a consumer's deliveries ([`model::MessagePage`] of deliveries).
#[derive(ToSchema)]
pub(crate) struct DeliveryPage {
    /// Newest first.
    items: Vec<DeliveryItem>,
    /// Pass as `cursor` for the next page; null on the last.
    #[schema(pattern = "^[A-Za-z0-9_-]{10}[AEIMQUYcgkosw048]$")]
    next_cursor: Option<String>,
}

/// One delivery with the message as received ([`model::MessageDetail`] of a
/// delivery).
#[derive(ToSchema)]
pub(crate) struct DeliveryDetail {
    /// Message id (UUID).
    #[schema(
        format = "uuid",
        pattern = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
    )]
    id: String,
    /// Status of the delivery.
    status: InboxStatusName,
    /// Exchange.
    exchange: String,
    /// Routing key.
    routing_key: String,
    /// Ordering key.
    ordering_key: Option<String>,
    /// Always null for a delivery (outbox messages only).
    #[schema(format = "uuid")]
    waits_behind: Option<String>,
    /// Always null for a delivery (outbox messages only).
    waiting_behind: Option<u64>,
    /// Message type.
    #[schema(rename = "type")]
    message_type: Option<String>,
    /// Headers (redacted ones show `***`).
    headers: BTreeMap<String, String>,
    /// Content type.
    content_type: String,
    /// Source.
    source: Option<String>,
    /// Correlation id.
    correlation_id: Option<String>,
    /// RFC 3339.
    #[schema(format = DateTime)]
    created_at: String,
    /// The payload: text when the content type is textual or JSON and it decodes,
    /// else base64.
    payload: String,
    /// Whether `payload` is base64.
    payload_base64: bool,
    /// Whether redaction changed or withheld the payload.
    payload_redacted: bool,
    /// Size in bytes.
    payload_size: u64,
    /// Handler attempts.
    attempts: u32,
    /// RFC 3339.
    #[schema(format = DateTime)]
    last_attempt_at: Option<String>,
    /// RFC 3339.
    #[schema(format = DateTime)]
    next_attempt_at: Option<String>,
    /// Always null for a delivery (a due time is the outbox's).
    #[schema(format = DateTime)]
    due_at: Option<String>,
    /// The last failure.
    last_error: Option<String>,
    /// When it was consumed, RFC 3339.
    #[schema(format = DateTime)]
    completed_at: Option<String>,
    /// Its own consumer's side.
    deliveries: Vec<ConsumeSide>,
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
        routes::delete_message,
        routes::requeue_matching,
        routes::delete_matching,
        routes::blocked_keys,
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
    components(schemas(model::ErrorBody, model::FilterBody, model::DeliveryFilterBody))
)]
struct AdminApi;

/// The admin API's OpenAPI document (paths relative to where it is mounted).
#[must_use]
pub fn document() -> utoipa::openapi::OpenApi {
    AdminApi::openapi()
}
