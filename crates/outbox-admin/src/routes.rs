//! The HTTP endpoints: each parses its input (a 400 for anything malformed), calls
//! the service, and answers JSON. Each carries its OpenAPI description.

use std::sync::Arc;

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use outbox_core::{InboxStatus, Lifecycle, OutboxStatus};
use outbox_ports::{MessageFilter, PauseKind};

use crate::auth::Actor;
use crate::model::{
    AuditPage, BlockedKeyPage, BlockedKeysQuery, BulkDeleteRequest, BulkRequest, BulkResponse,
    ConsumerFailuresRequest, ConsumerList, DeadLetterPage, DeadLetterQuery, DeadLetterView,
    DeleteQuery, DeliveryQuery, ExchangeFailuresRequest, FailureGroups, FilterBody, MessageDetail,
    MessagePage, MessageQuery, PageQuery, PauseList, PauseState, ReconsumeOneRequest,
    ReconsumeRequest, ReplayRequest, ReplayResponse, StatsResponse, ThroughputQuery,
};
use crate::model::{ConsumerThroughput, ExchangeThroughput, ThroughputTotals};
use crate::params::{
    filter_from_body, list_from_query, parse_cursor, parse_dead_letter_id, parse_limit, parse_max,
    parse_message_id, parse_window, text,
};
#[allow(unused_imports)] // Named by the OpenAPI annotations only.
use crate::responses::{DeliveryDetail, DeliveryPage, QueryErrors, ReadErrors, WriteErrors};
use crate::{AdminError, AdminService};

type Service = State<Arc<AdminService>>;
type Answer<T> = Result<Json<T>, AdminError>;

fn query<T>(q: Result<Query<T>, QueryRejection>) -> Result<T, AdminError> {
    q.map(|Query(q)| q)
        .map_err(|e| AdminError::bad("bad_query", e.body_text()))
}

fn body<T>(b: Result<Json<T>, JsonRejection>) -> Result<T, AdminError> {
    b.map(|Json(b)| b)
        .map_err(|e| AdminError::bad("bad_body", e.body_text()))
}

fn path<T>(p: Result<Path<T>, PathRejection>) -> Result<T, AdminError> {
    p.map(|Path(p)| p)
        .map_err(|e| AdminError::bad("bad_path", e.body_text()))
}

/// A bulk request's filter parsed for its side `S`, its `max`, and the filter as
/// the audit log records it.
fn bulk_input<S: Lifecycle>(
    filter: &FilterBody,
    max: Option<u64>,
) -> Result<(MessageFilter<S>, u64, String), AdminError> {
    let parsed = filter_from_body(filter)?;
    let max = parse_max(max)?;
    let target = serde_json::to_string(filter).unwrap_or_else(|_| "{}".to_owned());
    Ok((parsed, max, target))
}

/// Counts, throughput and sweep reports.
#[utoipa::path(get, path = "/stats", tag = "stats",
    responses((status = 200, body = StatsResponse), ReadErrors))]
pub(crate) async fn stats(State(s): Service) -> Answer<StatsResponse> {
    Ok(Json(s.stats().await?))
}

/// Outbox messages, newest first.
#[utoipa::path(get, path = "/messages", tag = "messages", params(MessageQuery),
    responses((status = 200, body = MessagePage), QueryErrors))]
pub(crate) async fn list_messages(
    State(s): Service,
    q: Result<Query<MessageQuery>, QueryRejection>,
) -> Answer<MessagePage> {
    let (filter, cursor, limit) = list_from_query::<OutboxStatus>(query(q)?)?;
    Ok(Json(s.list_messages(&filter, cursor, limit).await?))
}

/// One message: every column, the payload, and each consumer's side.
#[utoipa::path(get, path = "/messages/{id}", tag = "messages", params(("id" = String, Path, description = "Message id (UUID)", format = "uuid", pattern = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")),
    responses((status = 200, body = MessageDetail), QueryErrors))]
pub(crate) async fn get_message(
    State(s): Service,
    id: Result<Path<String>, PathRejection>,
) -> Answer<MessageDetail> {
    let id = parse_message_id(&path(id)?)?;
    Ok(Json(s.get_message(id).await?))
}

/// A dead or failed message back to pending.
#[utoipa::path(post, path = "/messages/{id}/requeue", tag = "messages", params(("id" = String, Path, description = "Message id (UUID)", format = "uuid", pattern = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")),
    responses((status = 204), WriteErrors))]
pub(crate) async fn requeue_message(
    State(s): Service,
    Extension(actor): Extension<Actor>,
    id: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, AdminError> {
    let id = parse_message_id(&path(id)?)?;
    s.requeue_message(&actor.name, id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Replays a dead message as a new one with an edited payload and headers (a
/// field left out keeps the original's; a hidden value sent back as `***` keeps
/// the original's value). The original stays dead, marked replayed: it is never
/// requeued or replayed again (409 `refused`), nor is a keyed one replayed. Only
/// with `[admin] allow_edit = true`; otherwise 404 `edit_off`, whatever the body.
#[utoipa::path(post, path = "/messages/{id}/replay", tag = "messages", params(("id" = String, Path, description = "Message id (UUID)", format = "uuid", pattern = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")),
    request_body = ReplayRequest,
    responses((status = 200, body = ReplayResponse), WriteErrors))]
pub(crate) async fn replay_message(
    State(s): Service,
    Extension(actor): Extension<Actor>,
    id: Result<Path<String>, PathRejection>,
    b: Result<Json<ReplayRequest>, JsonRejection>,
) -> Answer<ReplayResponse> {
    if !s.edit_allowed() {
        return Err(AdminError::EditOff);
    }
    let id = parse_message_id(&path(id)?)?;
    Ok(Json(s.replay_message(&actor.name, id, body(b)?).await?))
}

/// Replays a consumer's dead delivery as a new delivery (a new message id) with an
/// edited payload and headers, which the consumer's retry sweep hands to its
/// handler; as the message replay otherwise (the original stays dead, marked
/// replayed, never reconsumed or replayed again; 404 `edit_off` while editing is
/// off, whatever the body).
#[utoipa::path(post, path = "/consumers/{name}/deliveries/{id}/replay", tag = "consumers",
    params(("name" = String, Path, description = "Consumer name", pattern = "^[^\\u0000]*$"), ("id" = String, Path, description = "Message id (UUID)", format = "uuid", pattern = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")),
    request_body = ReplayRequest,
    responses((status = 200, body = ReplayResponse), WriteErrors))]
pub(crate) async fn replay_delivery(
    State(s): Service,
    Extension(actor): Extension<Actor>,
    p: Result<Path<(String, String)>, PathRejection>,
    b: Result<Json<ReplayRequest>, JsonRejection>,
) -> Answer<ReplayResponse> {
    if !s.edit_allowed() {
        return Err(AdminError::EditOff);
    }
    let (name, id) = path(p)?;
    let name = text("consumer", name)?;
    let id = parse_message_id(&id)?;
    Ok(Json(
        s.replay_delivery(&actor.name, &name, id, body(b)?).await?,
    ))
}

/// A delayed (scheduled) pending message due now: published at the next claim.
#[utoipa::path(post, path = "/messages/{id}/publish-now", tag = "messages", params(("id" = String, Path, description = "Message id (UUID)", format = "uuid", pattern = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")),
    responses((status = 204), WriteErrors))]
pub(crate) async fn publish_now(
    State(s): Service,
    Extension(actor): Extension<Actor>,
    id: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, AdminError> {
    let id = parse_message_id(&path(id)?)?;
    s.publish_now(&actor.name, id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Deletes a dead message (with `force=true` also a pending or failed one).
#[utoipa::path(delete, path = "/messages/{id}", tag = "messages",
    params(("id" = String, Path, description = "Message id (UUID)", format = "uuid", pattern = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"), DeleteQuery),
    responses((status = 204), WriteErrors))]
pub(crate) async fn delete_message(
    State(s): Service,
    Extension(actor): Extension<Actor>,
    id: Result<Path<String>, PathRejection>,
    q: Result<Query<DeleteQuery>, QueryRejection>,
) -> Result<StatusCode, AdminError> {
    let id = parse_message_id(&path(id)?)?;
    let force = query(q)?.force.unwrap_or(false);
    s.delete_message(&actor.name, id, force).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Requeues everything matching a filter, up to `max`.
#[utoipa::path(post, path = "/messages/requeue", tag = "messages", request_body = BulkRequest,
    responses((status = 200, body = BulkResponse), WriteErrors))]
pub(crate) async fn requeue_matching(
    State(s): Service,
    Extension(actor): Extension<Actor>,
    b: Result<Json<BulkRequest>, JsonRejection>,
) -> Answer<BulkResponse> {
    let b = body(b)?;
    let (filter, max, target) = bulk_input::<OutboxStatus>(&b.filter, b.max)?;
    Ok(Json(
        s.requeue_matching(&actor.name, &filter, target, b.dry_run, max)
            .await?,
    ))
}

/// Deletes everything matching a filter, up to `max`.
#[utoipa::path(post, path = "/messages/delete", tag = "messages", request_body = BulkDeleteRequest,
    responses((status = 200, body = BulkResponse), WriteErrors))]
pub(crate) async fn delete_matching(
    State(s): Service,
    Extension(actor): Extension<Actor>,
    b: Result<Json<BulkDeleteRequest>, JsonRejection>,
) -> Answer<BulkResponse> {
    let b = body(b)?;
    let (filter, max, target) = bulk_input::<OutboxStatus>(&b.filter, b.max)?;
    Ok(Json(
        s.delete_matching(&actor.name, &filter, target, b.dry_run, max, b.force)
            .await?,
    ))
}

/// Ordering keys held back by a failing or (unless skipped) dead head, in key
/// order: each with its head message and how many wait behind it.
#[utoipa::path(get, path = "/ordering/blocked-keys", tag = "ordering", params(BlockedKeysQuery),
    responses((status = 200, body = BlockedKeyPage), QueryErrors))]
pub(crate) async fn blocked_keys(
    State(s): Service,
    q: Result<Query<BlockedKeysQuery>, QueryRejection>,
) -> Answer<BlockedKeyPage> {
    let q = query(q)?;
    let limit = parse_limit(q.limit.as_deref())?;
    let after = q.after.map(|a| text("after", a)).transpose()?;
    Ok(Json(s.blocked_keys(after, limit).await?))
}

/// Failing and dead messages and deliveries grouped by their error, with ids,
/// numbers and quoted values taken out: per exchange, then per consumer, the
/// largest groups first.
#[utoipa::path(get, path = "/failures", tag = "failures",
    responses((status = 200, body = FailureGroups), ReadErrors))]
pub(crate) async fn failures(State(s): Service) -> Answer<FailureGroups> {
    Ok(Json(s.failure_groups().await?))
}

/// Every consumer with its counts.
#[utoipa::path(get, path = "/consumers", tag = "consumers",
    responses((status = 200, body = ConsumerList), ReadErrors))]
pub(crate) async fn consumers(State(s): Service) -> Answer<ConsumerList> {
    Ok(Json(ConsumerList {
        items: s.consumers().await?,
    }))
}

/// One consumer's deliveries, newest first.
#[utoipa::path(get, path = "/consumers/{name}/deliveries", tag = "consumers",
    params(("name" = String, Path, description = "Consumer name", pattern = "^[^\\u0000]*$"), DeliveryQuery),
    responses((status = 200, body = DeliveryPage), QueryErrors))]
pub(crate) async fn list_deliveries(
    State(s): Service,
    name: Result<Path<String>, PathRejection>,
    q: Result<Query<DeliveryQuery>, QueryRejection>,
) -> Answer<MessagePage> {
    let name = text("name", path(name)?)?;
    let (filter, cursor, limit) = list_from_query::<InboxStatus>(query(q)?.into())?;
    Ok(Json(
        s.list_deliveries(&name, &filter, cursor, limit).await?,
    ))
}

/// One delivery of one consumer.
#[utoipa::path(get, path = "/consumers/{name}/deliveries/{id}", tag = "consumers",
    params(("name" = String, Path, description = "Consumer name", pattern = "^[^\\u0000]*$"), ("id" = String, Path, description = "Message id (UUID)", format = "uuid", pattern = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")),
    responses((status = 200, body = DeliveryDetail), QueryErrors))]
pub(crate) async fn get_delivery(
    State(s): Service,
    p: Result<Path<(String, String)>, PathRejection>,
) -> Answer<MessageDetail> {
    let (name, id) = path(p)?;
    let name = text("name", name)?;
    let id = parse_message_id(&id)?;
    Ok(Json(s.get_delivery(&name, id).await?))
}

/// Runs one delivery's handler again: a dead or consume-failed delivery, or a
/// consumed one with `"again": true`. A delivery a worker or a retry holds right
/// now is refused (409 `busy`), as is one in another status (409
/// `illegal_transition`): a failed delivery whose retry consumed it meanwhile is
/// not run a second time.
#[utoipa::path(post, path = "/consumers/{name}/deliveries/{id}/reconsume", tag = "consumers",
    params(("name" = String, Path, description = "Consumer name", pattern = "^[^\\u0000]*$"), ("id" = String, Path, description = "Message id (UUID)", format = "uuid", pattern = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")),
    request_body = Option<ReconsumeOneRequest>,
    responses((status = 204), WriteErrors))]
pub(crate) async fn reconsume(
    State(s): Service,
    Extension(actor): Extension<Actor>,
    p: Result<Path<(String, String)>, PathRejection>,
    b: Result<Option<Json<Option<ReconsumeOneRequest>>>, JsonRejection>,
) -> Result<StatusCode, AdminError> {
    let (name, id) = path(p)?;
    let name = text("name", name)?;
    let id = parse_message_id(&id)?;
    // No body, and a body of `null` (the document's optional body allows it),
    // are both no options.
    let again = b
        .map_err(|e| AdminError::bad("bad_body", e.body_text()))?
        .and_then(|Json(b)| b)
        .is_some_and(|b| b.again);
    s.reconsume(&actor.name, &name, id, again).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Reconsumes one consumer's deliveries matching a filter, up to `max`.
#[utoipa::path(post, path = "/consumers/{name}/deliveries/reconsume", tag = "consumers",
    params(("name" = String, Path, description = "Consumer name", pattern = "^[^\\u0000]*$")), request_body = ReconsumeRequest,
    responses((status = 200, body = BulkResponse), WriteErrors))]
pub(crate) async fn reconsume_matching(
    State(s): Service,
    Extension(actor): Extension<Actor>,
    name: Result<Path<String>, PathRejection>,
    b: Result<Json<ReconsumeRequest>, JsonRejection>,
) -> Answer<BulkResponse> {
    let name = text("name", path(name)?)?;
    let b = body(b)?;
    let (filter, max, target) = bulk_input::<InboxStatus>(&b.filter.into(), b.max)?;
    Ok(Json(
        s.reconsume_matching(&actor.name, &name, &filter, target, b.dry_run, max)
            .await?,
    ))
}

/// Deliveries that could not become messages, newest first.
#[utoipa::path(get, path = "/dead-letters", tag = "dead letters", params(DeadLetterQuery),
    responses((status = 200, body = DeadLetterPage), QueryErrors))]
pub(crate) async fn list_dead_letters(
    State(s): Service,
    q: Result<Query<DeadLetterQuery>, QueryRejection>,
) -> Answer<DeadLetterPage> {
    let q = query(q)?;
    let limit = parse_limit(q.limit.as_deref())?;
    let cursor = parse_cursor(q.cursor.as_deref())?;
    let consumer = q.consumer.map(|c| text("consumer", c)).transpose()?;
    Ok(Json(s.list_dead_letters(consumer, cursor, limit).await?))
}

/// One dead letter with its raw body and headers.
#[utoipa::path(get, path = "/dead-letters/{id}", tag = "dead letters", params(("id" = u64, Path, description = "Dead letter id")),
    responses((status = 200, body = DeadLetterView), QueryErrors))]
pub(crate) async fn get_dead_letter(
    State(s): Service,
    id: Result<Path<String>, PathRejection>,
) -> Answer<DeadLetterView> {
    let id = parse_dead_letter_id(&path(id)?)?;
    Ok(Json(s.get_dead_letter(id).await?))
}

/// Removes one dead letter.
#[utoipa::path(delete, path = "/dead-letters/{id}", tag = "dead letters", params(("id" = u64, Path, description = "Dead letter id")),
    responses((status = 204), WriteErrors))]
pub(crate) async fn delete_dead_letter(
    State(s): Service,
    Extension(actor): Extension<Actor>,
    id: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, AdminError> {
    let id = parse_dead_letter_id(&path(id)?)?;
    s.delete_dead_letter(&actor.name, id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Every write done through the API, newest first.
#[utoipa::path(get, path = "/audit", tag = "audit", params(PageQuery),
    responses((status = 200, body = AuditPage), QueryErrors))]
pub(crate) async fn audit(
    State(s): Service,
    q: Result<Query<PageQuery>, QueryRejection>,
) -> Answer<AuditPage> {
    let q = query(q)?;
    let limit = parse_limit(q.limit.as_deref())?;
    let cursor = parse_cursor(q.cursor.as_deref())?;
    Ok(Json(s.audit_log(cursor, limit).await?))
}

/// Pauses (`pause`) or resumes `kind` named in the path, checked.
async fn set_pause(
    s: &AdminService,
    actor: &Actor,
    kind: PauseKind,
    name: Result<Path<String>, PathRejection>,
    pause: bool,
) -> Answer<PauseState> {
    let name = text("name", path(name)?)?;
    let state = if pause {
        s.pause(&actor.name, kind, &name).await?
    } else {
        s.resume(&actor.name, kind, &name).await?
    };
    Ok(Json(state))
}

/// Pauses an exchange: the relays hold its messages pending (each ordering key's
/// order kept) while every other exchange flows. Takes no body. The answer counts
/// the exchange's unsent messages now (`unsent`); when none carries that name, the
/// pause is in force all the same (it holds what is written to it from now on) and
/// `warning` says so: a typo, or a shard's name (`orders.shard-1`: messages carry
/// the sharded exchange's own name) holds nothing.
#[utoipa::path(post, path = "/exchanges/{exchange}/pause", tag = "pauses",
    params(("exchange" = String, Path, description = "Exchange name: 1 to 255 characters, no control character", pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]{1,255}$")),
    responses((status = 200, body = PauseState, description = "Paused (`changed`: it was not before), with the exchange's unsent messages now (`unsent`) and a `warning` (null, or a text when no unsent message carries the name)"), WriteErrors))]
pub(crate) async fn pause_exchange(
    State(s): Service,
    Extension(actor): Extension<Actor>,
    name: Result<Path<String>, PathRejection>,
) -> Answer<PauseState> {
    set_pause(&s, &actor, PauseKind::Exchange, name, true).await
}

/// Lifts an exchange's pause. Takes no body.
#[utoipa::path(post, path = "/exchanges/{exchange}/resume", tag = "pauses",
    params(("exchange" = String, Path, description = "Exchange name: 1 to 255 characters, no control character", pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]{1,255}$")),
    responses((status = 200, body = PauseState), WriteErrors))]
pub(crate) async fn resume_exchange(
    State(s): Service,
    Extension(actor): Extension<Actor>,
    name: Result<Path<String>, PathRejection>,
) -> Answer<PauseState> {
    set_pause(&s, &actor, PauseKind::Exchange, name, false).await
}

/// Pauses a consumer: its workers finish the deliveries in hand, cancel their
/// subscriptions and take no more (nothing is handed back), and its retry sweep
/// runs no handler. Takes no body.
#[utoipa::path(post, path = "/consumers/{name}/pause", tag = "pauses",
    params(("name" = String, Path, description = "Consumer name: 1 to 255 characters, no control character", pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]{1,255}$")),
    responses((status = 200, body = PauseState), WriteErrors))]
pub(crate) async fn pause_consumer(
    State(s): Service,
    Extension(actor): Extension<Actor>,
    name: Result<Path<String>, PathRejection>,
) -> Answer<PauseState> {
    set_pause(&s, &actor, PauseKind::Consumer, name, true).await
}

/// Lifts a consumer's pause: its workers subscribe again. Takes no body.
#[utoipa::path(post, path = "/consumers/{name}/resume", tag = "pauses",
    params(("name" = String, Path, description = "Consumer name: 1 to 255 characters, no control character", pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]{1,255}$")),
    responses((status = 200, body = PauseState), WriteErrors))]
pub(crate) async fn resume_consumer(
    State(s): Service,
    Extension(actor): Extension<Actor>,
    name: Result<Path<String>, PathRejection>,
) -> Answer<PauseState> {
    set_pause(&s, &actor, PauseKind::Consumer, name, false).await
}

/// One exchange's publishes and failed publish attempts over the last hour (a
/// bucket a minute), day (every 15 minutes) or week (an hour), every bucket
/// listed. From the totals every relay adds per exchange every few seconds; 404
/// (`not_recorded`) where the service reads no throughput log.
#[utoipa::path(get, path = "/exchanges/{exchange}/throughput", tag = "throughput",
    params(("exchange" = String, Path, description = "Exchange name: 1 to 255 characters (one no exchange or consumer has reads as an empty chart)", pattern = "^[^\\u0000]{1,255}$"), ThroughputQuery),
    responses((status = 200, body = ExchangeThroughput), QueryErrors))]
pub(crate) async fn exchange_throughput(
    State(s): Service,
    name: Result<Path<String>, PathRejection>,
    q: Result<Query<ThroughputQuery>, QueryRejection>,
) -> Answer<ExchangeThroughput> {
    let name = text("exchange", path(name)?)?;
    let window = parse_window(query(q)?.window.as_deref())?;
    Ok(Json(s.exchange_throughput(&name, window).await?))
}

/// One consumer's completed deliveries and failed handler attempts over the last
/// hour, day or week, as the exchange's.
#[utoipa::path(get, path = "/consumers/{name}/throughput", tag = "throughput",
    params(("name" = String, Path, description = "Consumer name: 1 to 255 characters (one no exchange or consumer has reads as an empty chart)", pattern = "^[^\\u0000]{1,255}$"), ThroughputQuery),
    responses((status = 200, body = ConsumerThroughput), QueryErrors))]
pub(crate) async fn consumer_throughput(
    State(s): Service,
    name: Result<Path<String>, PathRejection>,
    q: Result<Query<ThroughputQuery>, QueryRejection>,
) -> Answer<ConsumerThroughput> {
    let name = text("consumer", path(name)?)?;
    let window = parse_window(query(q)?.window.as_deref())?;
    Ok(Json(s.consumer_throughput(&name, window).await?))
}

/// Every exchange and consumer with something counted over the window, with its
/// totals, each by name.
#[utoipa::path(get, path = "/throughput", tag = "throughput", params(ThroughputQuery),
    responses((status = 200, body = ThroughputTotals), QueryErrors))]
pub(crate) async fn throughput(
    State(s): Service,
    q: Result<Query<ThroughputQuery>, QueryRejection>,
) -> Answer<ThroughputTotals> {
    let window = parse_window(query(q)?.window.as_deref())?;
    Ok(Json(s.throughput_totals(window).await?))
}

/// Every pause in force, exchanges first, each kind by name.
#[utoipa::path(get, path = "/pauses", tag = "pauses",
    responses((status = 200, body = PauseList), ReadErrors))]
pub(crate) async fn pauses(State(s): Service) -> Answer<PauseList> {
    Ok(Json(s.pauses().await?))
}

/// The group of a failure-group action, checked: names without NUL.
fn group(place: &str, name: String, error: String) -> Result<(String, String), AdminError> {
    Ok((text(place, name)?, text("error", error)?))
}

/// Requeues the failing and dead messages of one exchange's failure group (as
/// `GET /failures` names it), up to `max`; `dry_run` counts only. 404 when none of
/// the exchange's failing or dead messages is in that group.
#[utoipa::path(post, path = "/failures/requeue", tag = "failures", request_body = ExchangeFailuresRequest,
    responses((status = 200, body = BulkResponse), WriteErrors))]
pub(crate) async fn requeue_failure_group(
    State(s): Service,
    Extension(actor): Extension<Actor>,
    b: Result<Json<ExchangeFailuresRequest>, JsonRejection>,
) -> Answer<BulkResponse> {
    let b = body(b)?;
    let max = parse_max(b.max)?;
    let (exchange, error) = group("exchange", b.exchange, b.error)?;
    Ok(Json(
        s.requeue_failure_group(&actor.name, &exchange, &error, b.dry_run, max)
            .await?,
    ))
}

/// Deletes the dead messages of one exchange's failure group (its failing ones
/// stay), up to `max`; `dry_run` counts only. 404 when none of the exchange's
/// failing or dead messages is in that group.
#[utoipa::path(post, path = "/failures/delete", tag = "failures", request_body = ExchangeFailuresRequest,
    responses((status = 200, body = BulkResponse), WriteErrors))]
pub(crate) async fn delete_failure_group(
    State(s): Service,
    Extension(actor): Extension<Actor>,
    b: Result<Json<ExchangeFailuresRequest>, JsonRejection>,
) -> Answer<BulkResponse> {
    let b = body(b)?;
    let max = parse_max(b.max)?;
    let (exchange, error) = group("exchange", b.exchange, b.error)?;
    Ok(Json(
        s.delete_failure_group(&actor.name, &exchange, &error, b.dry_run, max)
            .await?,
    ))
}

/// Reconsumes the failing and dead deliveries of one consumer's failure group,
/// up to `max`; `dry_run` counts only. 404 when none of the consumer's failing or
/// dead deliveries is in that group.
#[utoipa::path(post, path = "/failures/reconsume", tag = "failures", request_body = ConsumerFailuresRequest,
    responses((status = 200, body = BulkResponse), WriteErrors))]
pub(crate) async fn reconsume_failure_group(
    State(s): Service,
    Extension(actor): Extension<Actor>,
    b: Result<Json<ConsumerFailuresRequest>, JsonRejection>,
) -> Answer<BulkResponse> {
    let b = body(b)?;
    let max = parse_max(b.max)?;
    let (consumer, error) = group("consumer", b.consumer, b.error)?;
    Ok(Json(
        s.reconsume_failure_group(&actor.name, &consumer, &error, b.dry_run, max)
            .await?,
    ))
}
