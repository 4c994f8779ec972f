//! The answers the endpoints document that the model has no type for: the error
//! statuses of each kind of request, and the consumer side's deliveries described
//! apart from the outbox's messages so that each side's statuses are exact. The
//! endpoints (`routes`) name them in their annotations; the OpenAPI document
//! (`openapi`) describes them.

#![allow(dead_code)] // The delivery mirrors below exist only to be described.

use std::collections::BTreeMap;

use utoipa::{IntoResponses, ToSchema};

#[allow(unused_imports)] // The doc links' `model::`, kept as written: the document shows them.
use crate::model;
use crate::model::{ConsumeSide, ErrorBody, FailedAttemptItem, InboxStatusName};

/// The errors of a read without inputs (stats, consumers).
#[derive(IntoResponses)]
pub(crate) enum ReadErrors {
    /// No or an unknown bearer token.
    #[response(status = 401, headers(("WWW-Authenticate" = String, description = "`Bearer`")))]
    Unauthorized(ErrorBody),
    /// This client sent too many unknown bearer tokens (`too_many_attempts`): every
    /// request from it is refused, whatever its token, for `Retry-After` seconds.
    #[response(status = 429, headers(("Retry-After" = u64, description = "Seconds to wait")))]
    TooManyAttempts(ErrorBody),
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
    /// This client sent too many unknown bearer tokens (`too_many_attempts`): every
    /// request from it is refused, whatever its token, for `Retry-After` seconds.
    #[response(status = 429, headers(("Retry-After" = u64, description = "Seconds to wait")))]
    TooManyAttempts(ErrorBody),
    /// No admin token is configured (`admin_disabled`).
    #[response(status = 403)]
    Forbidden(ErrorBody),
    /// No such entry, no such path (an empty path segment), or no throughput log
    /// behind the charts (`not_recorded`).
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
    /// This client sent too many unknown bearer tokens (`too_many_attempts`): every
    /// request from it is refused, whatever its token, for `Retry-After` seconds.
    #[response(status = 429, headers(("Retry-After" = u64, description = "Seconds to wait")))]
    TooManyAttempts(ErrorBody),
    /// No admin token is configured (`admin_disabled`), or a read token (`forbidden`).
    #[response(status = 403)]
    Forbidden(ErrorBody),
    /// No such entry, or no such path (an empty path segment).
    #[response(status = 404)]
    NotFound(ErrorBody),
    /// The entry is not in a status this action applies to (`illegal_transition`,
    /// `not_deletable`), a relay, worker or retry holds it right now (`busy`), its
    /// history refuses it (`refused`: replayed already), or an edit does not fit it
    /// (`payload_not_json`, `hidden_value`).
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
    /// This client sent too many unknown bearer tokens (`too_many_attempts`): every
    /// request from it is refused, whatever its token, for `Retry-After` seconds.
    #[response(status = 429, headers(("Retry-After" = u64, description = "Seconds to wait")))]
    TooManyAttempts(ErrorBody),
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
    /// When the consumer received it, RFC 3339: the list's order, newest first.
    #[schema(format = DateTime)]
    received_at: Option<String>,
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
    /// The last failed attempts (at most 10), oldest first.
    failed_attempts: Vec<FailedAttemptItem>,
    /// When it was consumed, RFC 3339.
    #[schema(format = DateTime)]
    completed_at: Option<String>,
    /// Its own consumer's side.
    deliveries: Vec<ConsumeSide>,
    /// The dead delivery this one replays (an operator edited and ran it again).
    #[schema(format = "uuid")]
    replayed_from: Option<String>,
    /// The delivery replaying this dead one: it stays dead, and is neither
    /// reconsumed nor replayed again.
    #[schema(format = "uuid")]
    replayed_as: Option<String>,
}
