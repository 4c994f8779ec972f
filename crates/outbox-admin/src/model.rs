//! The JSON the API speaks: requests, answers and errors, each described in the
//! OpenAPI document. Times are RFC 3339 strings; statuses are snake_case names.

use std::collections::BTreeMap;

use outbox_ports::PauseKind;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

/// The pattern of a message id: a hyphenated UUID, as the API shows it and accepts it.
pub const MESSAGE_ID_PATTERN: &str =
    "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$";

/// The pattern of a page cursor: 8 bytes in unpadded base64url (11 characters, the
/// last one carrying only 4 bits, so exactly the strings that decode).
pub const CURSOR_PATTERN: &str = "^[A-Za-z0-9_-]{10}[AEIMQUYcgkosw048]$";

/// The pattern of a text filter or a consumer name: anything without a NUL
/// character (PostgreSQL text cannot hold one, so no stored value has it).
pub const TEXT_PATTERN: &str = "^[^\\u0000]*$";

/// The pattern of a name a pause takes: 1 to 255 characters, none a control
/// character ([`outbox_ports::invalid_pause_name`]).
pub const PAUSE_NAME_PATTERN: &str = "^[^\\u0000-\\u001F\\u007F-\\u009F]{1,255}$";

/// An outbox message's status, as the API names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OutboxStatusName {
    /// Waiting to be published.
    Pending,
    /// Published.
    Sent,
    /// The last publish failed; a retry is due later.
    PublishFailed,
    /// Out of retries.
    Dead,
}

/// A consumer's delivery status, as the API names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum InboxStatusName {
    /// Received, not yet handled.
    Received,
    /// Handled.
    Consumed,
    /// The handler failed; a retry is due later.
    ConsumeFailed,
    /// Out of retries.
    Dead,
}

/// Every error: `{"error": {"code": "...", "message": "..."}}`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    /// What went wrong.
    pub error: ErrorDetail,
}

/// An error's code and message.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ErrorDetail {
    /// A stable code (`bad_id`, `bad_cursor`, `bad_status`, `bad_time`, `bad_limit`,
    /// `bad_query`, `bad_body`, `not_found`, `illegal_transition`, `not_deletable`,
    /// `unauthorized`, `forbidden`, `admin_disabled`, `store_unavailable`, ...).
    pub code: String,
    /// For people.
    pub message: String,
}

/// Declares one side's filters: a list's query parameters (`$query`, with `limit`
/// and `cursor`) and a bulk action's JSON filter (`$body`). The outbox and the
/// inbox take the same filters and differ only in their status names
/// (`$status`); `into` makes the inbox's into the outbox's, which the parsing
/// takes.
macro_rules! side_filters {
    (
        $(#[doc = $query_doc:literal])*
        query $query:ident,
        $(#[doc = $status_doc:literal])*
        status $status:ident,
        $(#[doc = $body_doc:literal])*
        body $body:ident
        $(, into $into_query:ident, $into_body:ident)?
    ) => {
        $(#[doc = $query_doc])*
        #[derive(Debug, Default, Deserialize, Serialize, IntoParams, ToSchema)]
        #[serde(deny_unknown_fields)]
        #[into_params(parameter_in = Query)]
        pub struct $query {
            $(#[doc = $status_doc])*
            #[param(value_type = Option<$status>)]
            #[schema(value_type = Option<$status>)]
            pub status: Option<String>,
            /// Exact exchange.
            #[param(pattern = "^[^\\u0000]*$")]
            #[schema(pattern = "^[^\\u0000]*$")]
            pub exchange: Option<String>,
            /// Exact routing key.
            #[param(pattern = "^[^\\u0000]*$")]
            #[schema(pattern = "^[^\\u0000]*$")]
            pub routing_key: Option<String>,
            /// Exact message type.
            #[serde(rename = "type")]
            #[param(rename = "type", pattern = "^[^\\u0000]*$")]
            #[schema(pattern = "^[^\\u0000]*$")]
            pub message_type: Option<String>,
            /// RFC 3339; created at or after.
            #[param(format = DateTime)]
            #[schema(format = DateTime)]
            pub created_after: Option<String>,
            /// RFC 3339; created before.
            #[param(format = DateTime)]
            #[schema(format = DateTime)]
            pub created_before: Option<String>,
            /// A message id or a correlation id, exactly.
            #[param(pattern = "^[^\\u0000]*$")]
            #[schema(pattern = "^[^\\u0000]*$")]
            pub q: Option<String>,
            /// A failure group, as `/failures` names it (`error`); an error text as
            /// stored means its group.
            #[param(pattern = "^[^\\u0000]*$")]
            #[schema(pattern = "^[^\\u0000]*$")]
            pub error: Option<String>,
            /// `newest` first (the default, also when empty) or `oldest` first.
            #[param(pattern = "^(newest|oldest)?$")]
            #[schema(pattern = "^(newest|oldest)?$")]
            pub sort: Option<String>,
            /// Page size, 1 to 1000 (default 50).
            #[param(value_type = Option<u32>, minimum = 1, maximum = 1000)]
            #[schema(value_type = Option<u32>, minimum = 1, maximum = 1000)]
            pub limit: Option<String>,
            /// The previous page's `next_cursor`.
            #[param(pattern = "^[A-Za-z0-9_-]{10}[AEIMQUYcgkosw048]$")]
            #[schema(pattern = "^[A-Za-z0-9_-]{10}[AEIMQUYcgkosw048]$")]
            pub cursor: Option<String>,
        }

        $(#[doc = $body_doc])*
        #[derive(Debug, Default, Clone, Deserialize, Serialize, ToSchema)]
        #[serde(deny_unknown_fields)]
        pub struct $body {
            /// A status name of the side acted on.
            #[serde(skip_serializing_if = "Option::is_none")]
            #[schema(value_type = Option<$status>)]
            pub status: Option<String>,
            /// Exact exchange.
            #[serde(skip_serializing_if = "Option::is_none")]
            #[schema(pattern = "^[^\\u0000]*$")]
            pub exchange: Option<String>,
            /// Exact routing key.
            #[serde(skip_serializing_if = "Option::is_none")]
            #[schema(pattern = "^[^\\u0000]*$")]
            pub routing_key: Option<String>,
            /// Exact message type.
            #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
            #[schema(pattern = "^[^\\u0000]*$")]
            pub message_type: Option<String>,
            /// RFC 3339; created at or after.
            #[serde(skip_serializing_if = "Option::is_none")]
            #[schema(format = DateTime)]
            pub created_after: Option<String>,
            /// RFC 3339; created before.
            #[serde(skip_serializing_if = "Option::is_none")]
            #[schema(format = DateTime)]
            pub created_before: Option<String>,
            /// A message id or a correlation id, exactly.
            #[serde(skip_serializing_if = "Option::is_none")]
            #[schema(pattern = "^[^\\u0000]*$")]
            pub q: Option<String>,
            /// A failure group, as `/failures` names it (`error`); an error text as
            /// stored means its group.
            #[serde(skip_serializing_if = "Option::is_none")]
            #[schema(pattern = "^[^\\u0000]*$")]
            pub error: Option<String>,
        }

        $(
            impl From<$query> for $into_query {
                fn from(q: $query) -> Self {
                    Self {
                        status: q.status,
                        exchange: q.exchange,
                        routing_key: q.routing_key,
                        message_type: q.message_type,
                        created_after: q.created_after,
                        created_before: q.created_before,
                        q: q.q,
                        error: q.error,
                        sort: q.sort,
                        limit: q.limit,
                        cursor: q.cursor,
                    }
                }
            }

            impl From<$body> for $into_body {
                fn from(f: $body) -> Self {
                    Self {
                        status: f.status,
                        exchange: f.exchange,
                        routing_key: f.routing_key,
                        message_type: f.message_type,
                        created_after: f.created_after,
                        created_before: f.created_before,
                        q: f.q,
                        error: f.error,
                    }
                }
            }
        )?
    };
}

side_filters! {
    /// The filters of a list of outbox messages, as query parameters.
    query MessageQuery,
    /// A status name (pending, sent, publish_failed, dead).
    status OutboxStatusName,
    /// The filter of a bulk action on outbox messages (the list filters, as JSON).
    body FilterBody
}

side_filters! {
    /// The filters of a list of a consumer's deliveries, as query parameters (as
    /// [`MessageQuery`], with the inbox's statuses).
    query DeliveryQuery,
    /// A status name (received, consumed, consume_failed, dead).
    status InboxStatusName,
    /// The filter of a bulk reconsume of a consumer's deliveries (as [`FilterBody`],
    /// with the inbox's statuses).
    body DeliveryFilterBody,
    into MessageQuery, FilterBody
}

/// A JSON whole number as JSON Schema counts them: `331` and also `331.0` (an
/// `integer` in the document; serde alone takes only the first).
fn whole_number<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    /// Floats are exact up to here.
    const EXACT: f64 = 9_007_199_254_740_992.0;
    let Some(n) = Option::<serde_json::Number>::deserialize(d)? else {
        return Ok(None);
    };
    if let Some(n) = n.as_u64() {
        return Ok(Some(n));
    }
    match n.as_f64() {
        // In range and whole, so the cast is exact.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        Some(f) if f.fract() == 0.0 && (0.0..=EXACT).contains(&f) => Ok(Some(f as u64)),
        _ => Err(serde::de::Error::custom(format!(
            "invalid value: `{n}`, expected a whole number from 1"
        ))),
    }
}

/// Declares a bulk action's request: its `filter` (of type `$filter`), `dry_run`
/// and `max`, then the action's own fields.
macro_rules! bulk_request {
    (
        $(#[doc = $doc:literal])*
        $name:ident {
            $(#[doc = $filter_doc:literal])*
            filter: $filter:ident,
            $($own:tt)*
        }
    ) => {
        $(#[doc = $doc])*
        #[derive(Debug, Deserialize, ToSchema)]
        #[serde(deny_unknown_fields)]
        pub struct $name {
            $(#[doc = $filter_doc])*
            #[serde(default)]
            pub filter: $filter,
            /// Count only, change nothing.
            #[serde(default)]
            pub dry_run: bool,
            /// At most this many (default 10000; raise it explicitly for more).
            #[serde(default, deserialize_with = "whole_number")]
            #[schema(minimum = 1)]
            pub max: Option<u64>,
            $($own)*
        }
    };
}

bulk_request! {
    /// A bulk requeue of outbox messages.
    BulkRequest {
        /// What to act on; an empty filter matches everything.
        filter: FilterBody,
    }
}

/// A single reconsume (the body is optional: without one, `again` is false).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReconsumeOneRequest {
    /// Reconsume it even if it was consumed (its handler runs once more). Without
    /// it, only a dead or consume-failed delivery is reconsumed.
    #[serde(default)]
    pub again: bool,
}

bulk_request! {
    /// A bulk reconsume of a consumer's deliveries.
    ReconsumeRequest {
        /// What to act on; an empty filter matches everything.
        filter: DeliveryFilterBody,
    }
}

bulk_request! {
    /// A bulk delete.
    BulkDeleteRequest {
        /// What to delete; an empty filter matches everything.
        filter: FilterBody,
        /// Also delete pending and failed messages no relay holds (default: dead only).
        #[serde(default)]
        pub force: bool,
    }
}

/// A bulk action on an exchange's failure group (`POST /failures/requeue`,
/// `/failures/delete`): the group as `GET /failures` names it.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExchangeFailuresRequest {
    /// The group's exchange.
    #[schema(pattern = "^[^\\u0000]*$")]
    pub exchange: String,
    /// The group's error, with what varies taken out, as `GET /failures` shows it.
    #[schema(pattern = "^[^\\u0000]*$")]
    pub error: String,
    /// Count only, change nothing.
    #[serde(default)]
    pub dry_run: bool,
    /// At most this many (default 10000; raise it explicitly for more).
    #[serde(default, deserialize_with = "whole_number")]
    #[schema(minimum = 1)]
    pub max: Option<u64>,
}

/// A reconsume of a consumer's failure group (`POST /failures/reconsume`).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ConsumerFailuresRequest {
    /// The group's consumer.
    #[schema(pattern = "^[^\\u0000]*$")]
    pub consumer: String,
    /// The group's error, with what varies taken out, as `GET /failures` shows it.
    #[schema(pattern = "^[^\\u0000]*$")]
    pub error: String,
    /// Count only, change nothing.
    #[serde(default)]
    pub dry_run: bool,
    /// At most this many (default 10000; raise it explicitly for more).
    #[serde(default, deserialize_with = "whole_number")]
    #[schema(minimum = 1)]
    pub max: Option<u64>,
}

/// What a bulk action found and did.
#[derive(Debug, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct BulkResponse {
    /// Entries the filter matches, exactly, whatever `max` (which bounds only
    /// what the action changes).
    pub matched: u64,
    /// Entries changed (0 on a dry run).
    pub changed: u64,
}

/// Where a bulk action is, told after each of its batches (see
/// [`crate::AdminService::requeue_matching_with_progress`]): not JSON, a value for
/// progress bars.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BulkProgress {
    /// Entries the action set out to change: those the filter matched when it
    /// started, at most `max`: the
    /// length of a progress bar.
    pub matched: u64,
    /// Entries changed so far, over every batch done.
    pub changed: u64,
    /// Batches done so far.
    pub batches: u64,
}

/// `?force=true` on a single delete.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct DeleteQuery {
    /// Also delete a pending or failed message that no relay holds.
    pub force: Option<bool>,
}

/// A page position and size.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PageQuery {
    /// Page size, 1 to 1000 (default 50).
    #[param(value_type = Option<u32>, minimum = 1, maximum = 1000)]
    pub limit: Option<String>,
    /// The previous page's `next_cursor`.
    #[param(pattern = "^[A-Za-z0-9_-]{10}[AEIMQUYcgkosw048]$")]
    pub cursor: Option<String>,
}

/// Dead letters of one consumer, or of all.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct DeadLetterQuery {
    /// Only this consumer's.
    #[param(pattern = "^[^\\u0000]*$")]
    pub consumer: Option<String>,
    /// Page size, 1 to 1000 (default 50).
    #[param(value_type = Option<u32>, minimum = 1, maximum = 1000)]
    pub limit: Option<String>,
    /// The previous page's `next_cursor`.
    #[param(pattern = "^[A-Za-z0-9_-]{10}[AEIMQUYcgkosw048]$")]
    pub cursor: Option<String>,
}

/// A page of blocked ordering keys, as query parameters.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct BlockedKeysQuery {
    /// Page size, 1 to 1000 (default 50).
    #[param(value_type = Option<u32>, minimum = 1, maximum = 1000)]
    pub limit: Option<String>,
    /// Only keys after this one (the previous page's `next_after`).
    #[param(pattern = "^[^\\u0000]*$")]
    pub after: Option<String>,
}

/// An ordering key held back by its head: the key's earliest unsent message is
/// failing or dead, so its later messages wait until the head is requeued,
/// deleted or (failing) retried with success.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct BlockedKeyItem {
    /// The ordering key.
    pub key: String,
    /// The head message's id (UUID).
    #[schema(
        format = "uuid",
        pattern = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
    )]
    pub head_id: String,
    /// The head's status: publish_failed, or dead (when dead heads block).
    #[schema(value_type = OutboxStatusName)]
    pub head_status: String,
    /// The head's publish attempts.
    pub head_attempts: u32,
    /// The head's last publish error.
    pub head_last_error: Option<String>,
    /// When the head's next publish attempt is due, RFC 3339 (null for a dead head).
    #[schema(format = DateTime)]
    pub head_next_attempt_at: Option<String>,
    /// Messages of the key waiting behind the head, counted up to 1000.
    pub waiting: u64,
    /// More than `waiting` wait (the count stopped at its cap).
    pub waiting_capped: bool,
}

/// Failing and dead messages or deliveries whose errors are one text once ids,
/// numbers and quoted values are taken out, of one exchange or one consumer.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct FailureGroupItem {
    /// The error with what varies replaced (`<id>`, `<n>`, `<hex>`, `"…"`).
    pub error: String,
    /// One error of the group as stored (its most frequent text).
    pub example: String,
    /// How many.
    pub count: u64,
    /// The outbox exchange (publish failures); absent for a consumer's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exchange: Option<String>,
    /// The consumer (consume failures); absent for an exchange's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub consumer: Option<String>,
    /// The earliest last attempt among them, RFC 3339 (null when none of their
    /// times can be read).
    #[schema(format = DateTime)]
    pub oldest: Option<String>,
    /// The latest last attempt among them, RFC 3339.
    #[schema(format = DateTime)]
    pub newest: Option<String>,
}

/// Failures grouped, the largest groups first: the outbox's per exchange, then
/// the inbox's per consumer, each side by count.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct FailureGroups {
    /// The groups.
    pub groups: Vec<FailureGroupItem>,
}

/// A page of blocked ordering keys, in key order.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct BlockedKeyPage {
    /// By key.
    pub items: Vec<BlockedKeyItem>,
    /// Pass as `after` for the next page; null when this page was not full (the
    /// last one). A full last page is followed by an empty one.
    pub next_after: Option<String>,
}

/// A list entry: no whole payload, a preview.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct MessageItem {
    /// Message id (UUID).
    #[schema(
        format = "uuid",
        pattern = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
    )]
    pub id: String,
    /// Status on this side.
    #[schema(value_type = OutboxStatusName)]
    pub status: String,
    /// Exchange.
    pub exchange: String,
    /// Routing key.
    pub routing_key: String,
    /// Message type.
    #[serde(rename = "type")]
    pub message_type: Option<String>,
    /// Correlation id.
    pub correlation_id: Option<String>,
    /// RFC 3339.
    #[schema(format = DateTime)]
    pub created_at: String,
    /// When the consumer received it, RFC 3339: a delivery list's order (newest
    /// first). Null for outbox messages.
    #[schema(format = DateTime)]
    pub received_at: Option<String>,
    /// Attempts on this side.
    pub attempts: u32,
    /// The last failure.
    pub last_error: Option<String>,
    /// RFC 3339.
    #[schema(format = DateTime)]
    pub next_attempt_at: Option<String>,
    /// A delayed message's due time, RFC 3339: it stays pending (scheduled) until
    /// then. Null when published at once (and for deliveries).
    #[schema(format = DateTime)]
    pub due_at: Option<String>,
    /// When this side succeeded (sent at, consumed at), RFC 3339.
    #[schema(format = DateTime)]
    pub completed_at: Option<String>,
    /// The first 256 bytes, as text, or base64 when they are not UTF-8.
    pub payload_preview: String,
    /// Whether `payload_preview` is base64.
    pub payload_preview_base64: bool,
    /// Whether redaction changed or withheld the preview.
    pub payload_redacted: bool,
    /// The whole payload's size in bytes.
    pub payload_size: u64,
}

/// A page of messages or deliveries.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct MessagePage {
    /// Newest first.
    pub items: Vec<MessageItem>,
    /// Pass as `cursor` for the next page; null on the last.
    #[schema(pattern = "^[A-Za-z0-9_-]{10}[AEIMQUYcgkosw048]$")]
    pub next_cursor: Option<String>,
}

/// One failed attempt of a message or delivery.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct FailedAttemptItem {
    /// Which attempt (1 for the first; a requeue or reconsume starts again at 1).
    pub attempt: u32,
    /// When it failed, RFC 3339.
    #[schema(format = DateTime)]
    pub at: String,
    /// Why.
    pub error: String,
}

/// One consumer's side of a message.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ConsumeSide {
    /// The consumer.
    pub consumer: String,
    /// received, consumed, consume_failed or dead.
    #[schema(value_type = InboxStatusName)]
    pub status: String,
    /// Handler attempts.
    pub attempts: u32,
    /// RFC 3339.
    #[schema(format = DateTime)]
    pub last_attempt_at: Option<String>,
    /// RFC 3339.
    #[schema(format = DateTime)]
    pub next_attempt_at: Option<String>,
    /// The last failure.
    pub last_error: Option<String>,
    /// The last failed attempts (at most 10), oldest first.
    pub failed_attempts: Vec<FailedAttemptItem>,
    /// RFC 3339.
    #[schema(format = DateTime)]
    pub consumed_at: Option<String>,
}

/// A message with everything stored about it.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct MessageDetail {
    /// Message id (UUID).
    #[schema(
        format = "uuid",
        pattern = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
    )]
    pub id: String,
    /// Status on this side (outbox names for a message, inbox names for a delivery).
    #[schema(value_type = OutboxStatusName)]
    pub status: String,
    /// Exchange.
    pub exchange: String,
    /// Routing key.
    pub routing_key: String,
    /// Ordering key: messages of one key are published (and handled) one at a time,
    /// in order.
    pub ordering_key: Option<String>,
    /// Outbox, an unsent keyed message that is not its key's head: the id of the
    /// head it waits behind (pending, failing, or dead unless dead heads are
    /// skipped).
    #[schema(format = "uuid")]
    pub waits_behind: Option<String>,
    /// Outbox, its key's head: how many of the key's messages wait behind it
    /// (released, in order, once it is sent, or deleted), counted up to 1,000.
    pub waiting_behind: Option<u64>,
    /// Message type.
    #[serde(rename = "type")]
    pub message_type: Option<String>,
    /// Headers (redacted ones show `***`).
    pub headers: BTreeMap<String, String>,
    /// Content type.
    pub content_type: String,
    /// Source.
    pub source: Option<String>,
    /// Correlation id.
    pub correlation_id: Option<String>,
    /// RFC 3339.
    #[schema(format = DateTime)]
    pub created_at: String,
    /// The payload: text when the content type is textual or JSON and it decodes,
    /// else base64.
    pub payload: String,
    /// Whether `payload` is base64.
    pub payload_base64: bool,
    /// Whether redaction changed or withheld the payload.
    pub payload_redacted: bool,
    /// Size in bytes.
    pub payload_size: u64,
    /// Attempts on this side.
    pub attempts: u32,
    /// RFC 3339.
    #[schema(format = DateTime)]
    pub last_attempt_at: Option<String>,
    /// RFC 3339.
    #[schema(format = DateTime)]
    pub next_attempt_at: Option<String>,
    /// A delayed message's due time, RFC 3339: it stays pending (scheduled) until
    /// then. Null when published at once (and for deliveries).
    #[schema(format = DateTime)]
    pub due_at: Option<String>,
    /// The last failure.
    pub last_error: Option<String>,
    /// This side's last failed attempts (at most 10), oldest first; each
    /// consumer's are in `deliveries`.
    pub failed_attempts: Vec<FailedAttemptItem>,
    /// When this side succeeded (sent at, consumed at), RFC 3339.
    #[schema(format = DateTime)]
    pub completed_at: Option<String>,
    /// The consume side, one entry per consumer that received it (for a message;
    /// for a delivery, just its own consumer).
    pub deliveries: Vec<ConsumeSide>,
    /// The dead message this one replays (an operator edited and sent it again).
    #[schema(format = "uuid")]
    pub replayed_from: Option<String>,
    /// The message replaying this dead one: it stays dead, and is neither
    /// requeued nor replayed again.
    #[schema(format = "uuid")]
    pub replayed_as: Option<String>,
}

/// An edit of a dead message, replayed as a new one. A field left out keeps the
/// original's; a hidden (redacted) value sent back as `***` keeps the original's
/// value, never the `***`.
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReplayRequest {
    /// The new payload, as text (checked as JSON when the content type says JSON).
    pub payload: Option<String>,
    /// The new headers, all of them (a header left out is dropped): names 1 to
    /// 63 characters, names and values without a control character.
    #[schema(schema_with = replay_headers_schema)]
    pub headers: Option<BTreeMap<String, String>>,
}

/// The longest header name a replay's edit takes, in characters (63 characters
/// of up to 4 bytes each fit AMQP's 255-byte short string).
pub const MAX_REPLAY_HEADER_NAME_CHARS: usize = 63;

/// What [`ReplayRequest::headers`] takes, as the document says it.
fn replay_headers_schema() -> utoipa::openapi::schema::Object {
    use utoipa::openapi::schema::{ObjectBuilder, SchemaType, Type};
    ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::Object, Type::Null]))
        .property_names(Some(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .pattern(Some("^[^\\u0000-\\u001F\\u007F-\\u009F]{1,63}$")),
        ))
        .additional_properties(Some(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .pattern(Some("^[^\\u0000-\\u001F\\u007F-\\u009F]*$")),
        ))
        .build()
}

/// A replay made.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ReplayResponse {
    /// The new message's id.
    #[schema(format = "uuid")]
    pub id: String,
    /// The original's id (it stays dead, marked replayed).
    #[schema(format = "uuid")]
    pub replayed_from: String,
}

/// A consumer with its counts.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ConsumerItem {
    /// Its name.
    pub name: String,
    /// Received, not yet handled.
    pub received: u64,
    /// Handled; null when the store does not count them (PostgreSQL: that would
    /// read every row the consumer ever handled; see `consumed_per_minute`).
    pub consumed: Option<u64>,
    /// Waiting for a retry.
    pub consume_failed: u64,
    /// Out of retries.
    pub dead: u64,
    /// Deliveries that could not be decoded.
    pub dead_letters: u64,
    /// An operator paused it: its workers take no deliveries.
    pub paused: bool,
}

/// Every consumer.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ConsumerList {
    /// By name.
    pub items: Vec<ConsumerItem>,
}

/// A delivery that could not become a message.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DeadLetterView {
    /// Its id.
    pub id: u64,
    /// The consumer that received it.
    pub consumer: String,
    /// Its message id, when it had one.
    pub message_id: Option<String>,
    /// Routing key.
    pub routing_key: String,
    /// Why it was refused.
    pub reason: String,
    /// RFC 3339.
    #[schema(format = DateTime)]
    pub received_at: String,
    /// Headers (redacted ones show `***`).
    pub headers: BTreeMap<String, String>,
    /// The body in a list, its first 256 bytes; in detail, all of it. Text, or base64.
    pub body: String,
    /// Whether `body` is base64.
    pub body_base64: bool,
    /// Whether redaction changed or withheld the body.
    pub body_redacted: bool,
    /// The whole body's size in bytes.
    pub body_size: u64,
}

/// A page of dead letters.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DeadLetterPage {
    /// Newest first.
    pub items: Vec<DeadLetterView>,
    /// Pass as `cursor` for the next page; null on the last.
    #[schema(pattern = "^[A-Za-z0-9_-]{10}[AEIMQUYcgkosw048]$")]
    pub next_cursor: Option<String>,
}

/// One write done through the API (or the CLI).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AuditItem {
    /// The token's name, or `cli:<user>`.
    pub actor: String,
    /// requeue, delete, requeue_matching, delete_matching, reconsume,
    /// reconsume_matching, delete_dead_letter.
    pub action: String,
    /// A message id, `<consumer>/<id>`, a dead letter id, or the filter as JSON.
    pub target: String,
    /// How many it changed.
    pub count: u64,
    /// RFC 3339.
    #[schema(format = DateTime)]
    pub at: Option<String>,
}

/// A page of the audit log.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AuditPage {
    /// Newest first.
    pub items: Vec<AuditItem>,
    /// Pass as `cursor` for the next page; null on the last.
    #[schema(pattern = "^[A-Za-z0-9_-]{10}[AEIMQUYcgkosw048]$")]
    pub next_cursor: Option<String>,
}

/// How many were completed in one minute.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct MinuteItem {
    /// The minute's start, RFC 3339.
    #[schema(format = DateTime)]
    pub minute: String,
    /// How many.
    pub count: u64,
}

/// The window of a chart: `1h` (a bucket a minute, the default), `24h` (every 15
/// minutes) or `7d` (an hour).
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ThroughputQuery {
    /// `1h`, `24h` or `7d` (default `1h`).
    #[param(pattern = "^(1h|24h|7d)$")]
    pub window: Option<String>,
}

/// One bucket of an exchange's chart.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ExchangeBucket {
    /// The bucket's start, RFC 3339.
    #[schema(format = DateTime)]
    pub start: String,
    /// Messages published to the exchange and confirmed by the broker.
    pub published: u64,
    /// Publish attempts that failed (retried later, or dead).
    pub failed: u64,
}

/// One exchange's publishes over a window, from the per-name totals every relay
/// adds every few seconds (so the newest few seconds may be missing).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ExchangeThroughput {
    /// The exchange.
    pub exchange: String,
    /// `1h`, `24h` or `7d`.
    pub window: String,
    /// How long each bucket is.
    pub bucket_seconds: u64,
    /// Every bucket of the window, oldest first, the last holding now; empty ones
    /// count 0.
    pub buckets: Vec<ExchangeBucket>,
    /// The buckets' published, summed.
    pub published: u64,
    /// The buckets' failed, summed.
    pub failed: u64,
}

/// One bucket of a consumer's chart.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ConsumerBucket {
    /// The bucket's start, RFC 3339.
    #[schema(format = DateTime)]
    pub start: String,
    /// Deliveries the consumer's handler completed (marked consumed).
    pub consumed: u64,
    /// Handler attempts that failed (retried later, or dead).
    pub failed: u64,
}

/// One consumer's deliveries over a window, from the per-name totals every worker
/// adds every few seconds.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ConsumerThroughput {
    /// The consumer.
    pub consumer: String,
    /// `1h`, `24h` or `7d`.
    pub window: String,
    /// How long each bucket is.
    pub bucket_seconds: u64,
    /// Every bucket of the window, oldest first, the last holding now; empty ones
    /// count 0.
    pub buckets: Vec<ConsumerBucket>,
    /// The buckets' consumed, summed.
    pub consumed: u64,
    /// The buckets' failed, summed.
    pub failed: u64,
}

/// An exchange's totals over a window.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ExchangeTotal {
    /// The exchange.
    pub exchange: String,
    /// Messages published to it and confirmed.
    pub published: u64,
    /// Publish attempts that failed.
    pub failed: u64,
}

/// A consumer's totals over a window.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ConsumerTotal {
    /// The consumer.
    pub consumer: String,
    /// Deliveries it completed.
    pub consumed: u64,
    /// Handler attempts that failed.
    pub failed: u64,
}

/// Every exchange and consumer with something counted over a window, each by name.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ThroughputTotals {
    /// `1h`, `24h` or `7d`.
    pub window: String,
    /// The exchanges.
    pub exchanges: Vec<ExchangeTotal>,
    /// The consumers.
    pub consumers: Vec<ConsumerTotal>,
}

/// The outbox's counts.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct OutboxCounts {
    /// Exact; delayed messages included.
    pub pending: u64,
    /// Exact: of `pending`, the delayed ones (with a due time).
    pub scheduled: u64,
    /// Exact.
    pub publish_failed: u64,
    /// Exact.
    pub dead: u64,
    /// Ordering keys held back by a failing or (unless skipped) dead message.
    pub blocked_keys: u64,
    /// Not counted here (most of the table); always null. The relay's
    /// `outbox_published_total` counter and `published_per_minute` tell throughput.
    pub sent: Option<u64>,
    /// Since when the longest-waiting unsent message waits (creation time, or
    /// the due time of an overdue delayed one), RFC 3339.
    #[schema(format = DateTime)]
    pub oldest_unsent_at: Option<String>,
    /// Its age in seconds.
    pub oldest_unsent_age_seconds: Option<u64>,
}

/// One queue's depth as the broker reports it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct QueueItem {
    /// The queue.
    pub name: String,
    /// Messages ready in it (published, not yet delivered to a consumer); null
    /// when the broker could not say (no such queue, its node down).
    pub messages: Option<u64>,
    /// Consumers reading it; null as `messages`.
    pub consumers: Option<u64>,
}

/// One exchange's unsent and dead messages, and whether it is paused.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct ExchangeItem {
    /// The exchange.
    pub name: String,
    /// Exact; delayed messages included. While `paused`, the pause holds them.
    pub pending: u64,
    /// Exact. While `paused`, their retries wait too.
    pub publish_failed: u64,
    /// Exact.
    pub dead: u64,
    /// Its longest-waiting unsent message's age in seconds (null: none waits).
    pub oldest_unsent_age_s: Option<u64>,
    /// An operator paused it: the relays claim none of its messages.
    pub paused: bool,
}

/// The last report of one sweep.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct SweepItem {
    /// The state key it is stored under.
    pub key: String,
    /// Whether the state store answered (false: the report is unknown).
    pub available: bool,
    /// RFC 3339.
    #[schema(format = DateTime)]
    pub started_at: Option<String>,
    /// RFC 3339.
    #[schema(format = DateTime)]
    pub completed_at: Option<String>,
    /// Publish retries that succeeded.
    pub publish_retried: Option<u64>,
    /// Publish retries that failed.
    pub publish_failed: Option<u64>,
    /// Consume retries that succeeded.
    pub consume_retried: Option<u64>,
    /// Consume retries that failed.
    pub consume_failed: Option<u64>,
}

/// Whether a sweep's cluster lock is held right now (a sweep is running).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct LockItem {
    /// The lock key.
    pub key: String,
    /// Held under a live lease; null when the lock service did not answer.
    pub held: Option<bool>,
}

/// Which numbers are exact and which are not.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct StatsPrecision {
    /// `exact`: pending, publish_failed and dead are counted.
    pub outbox: String,
    /// `not_counted`: see `outbox.sent`.
    pub outbox_sent: String,
    /// In progress, failed, dead and dead letters are exact; `consumed` is null where
    /// the store does not count it.
    pub consumers: String,
    /// `recorded`: the per-minute totals every relay and consumer add every few
    /// seconds (every instance, across restarts; the last seconds of an instance
    /// that crashed are missing); `exact`: counted from the tables' rows (costs as
    /// many rows as went through in the hour).
    pub per_minute: String,
    /// `recorded`: failed attempts per minute as relays and consumers add them;
    /// `not_recorded`: no per-minute totals are kept here, so the failures series
    /// are empty (the rows keep only each one's last attempts).
    pub failures_per_minute: String,
    /// `broker`: `queues` as the broker reported them just now; `not_configured`:
    /// no queues to read; `unavailable: <why>`: the broker did not answer.
    pub queues: String,
}

/// The dashboard's numbers.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct StatsResponse {
    /// The outbox.
    pub outbox: OutboxCounts,
    /// Each exchange with an unsent or dead message or a pause, by name.
    pub exchanges: Vec<ExchangeItem>,
    /// The consumers' queues as the broker reports them (`outbox run`: the
    /// topology's queues), in the configured order; empty when none are
    /// configured or the broker did not answer (`precision.queues` says which).
    pub queues: Vec<QueueItem>,
    /// Each consumer's inbox.
    pub consumers: Vec<ConsumerItem>,
    /// Messages marked sent per minute over the last hour, oldest first (minutes
    /// with none left out).
    pub published_per_minute: Vec<MinuteItem>,
    /// Deliveries consumed per minute over the last hour, all consumers.
    pub consumed_per_minute: Vec<MinuteItem>,
    /// Failed publish attempts per minute over the last hour (retried or dead).
    pub publish_failed_per_minute: Vec<MinuteItem>,
    /// Failed handler attempts per minute over the last hour, all consumers that
    /// record them.
    pub consume_failed_per_minute: Vec<MinuteItem>,
    /// The last report of each configured sweep.
    pub sweeps: Vec<SweepItem>,
    /// Whether each configured sweep's lock is held now.
    pub locks: Vec<LockItem>,
    /// The exchanges and consumers operators paused, by kind and name.
    pub pauses: Vec<PauseItem>,
    /// What each number is.
    pub precision: StatsPrecision,
}

/// What a pause holds back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum PauseKindItem {
    /// The relays claim none of the exchange's messages.
    Exchange,
    /// The consumer's workers take no deliveries.
    Consumer,
}

impl From<PauseKind> for PauseKindItem {
    fn from(kind: PauseKind) -> Self {
        match kind {
            PauseKind::Exchange => Self::Exchange,
            PauseKind::Consumer => Self::Consumer,
        }
    }
}

/// A pause in force.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PauseItem {
    /// An exchange or a consumer.
    pub kind: PauseKindItem,
    /// Its name.
    pub name: String,
    /// Since when (RFC 3339; null for a time that cannot be read).
    #[schema(format = DateTime)]
    pub since: Option<String>,
    /// The operator who paused it.
    pub by: String,
}

/// Every pause in force.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PauseList {
    /// By kind (exchanges first), then name.
    pub items: Vec<PauseItem>,
}

/// What a pause or resume left.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PauseState {
    /// An exchange or a consumer.
    pub kind: PauseKindItem,
    /// Its name.
    pub name: String,
    /// Whether it is paused now.
    pub paused: bool,
    /// Whether this request changed that (false: it was so already).
    pub changed: bool,
    /// An exchange's unsent messages now (pending, delayed or failing: those a
    /// pause holds), read after the change; null for a consumer, or when they
    /// could not be counted.
    pub unsent: Option<u64>,
    /// Something the operator should read (null: nothing): an exchange paused
    /// that no unsent message carries, which may be a typo or a shard's name.
    /// The pause is in force all the same.
    pub warning: Option<String>,
}

#[cfg(test)]
mod whole_number_tests {
    use super::*;

    #[derive(Deserialize)]
    struct Max {
        #[serde(default, deserialize_with = "whole_number")]
        max: Option<u64>,
    }

    fn max(json: &str) -> Result<Option<u64>, String> {
        serde_json::from_str::<Max>(json)
            .map(|m| m.max)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn a_whole_number_written_as_a_float_is_read_exactly() {
        // Schemathesis sent this; without float_roundtrip it read as ...332.8.
        assert_eq!(
            max(r#"{"max": 2182635425020333.0}"#),
            Ok(Some(2_182_635_425_020_333))
        );
        assert_eq!(max(r#"{"max": 7}"#), Ok(Some(7)));
        assert_eq!(max(r#"{"max": 7.0}"#), Ok(Some(7)));
        assert!(max(r#"{"max": 7.5}"#).is_err());
        assert_eq!(max("{}"), Ok(None));
    }
}
