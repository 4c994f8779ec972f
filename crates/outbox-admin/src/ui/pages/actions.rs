//! The actions: POSTs that need a write session and the session's CSRF token,
//! go through the admin service (audited) and redirect back with a notice.

use axum::extract::rejection::{FormRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::{Extension, Form};
use serde::Deserialize;

use super::{UiState, path};
use crate::AdminError;
use crate::params::{DEFAULT_BULK_MAX, parse_dead_letter_id, parse_message_id};
use crate::ui::filters::{ListQuery, encode};
use crate::ui::session::{Session, check_write, redirect};
use crate::ui::{Page, Ui, UiError};

#[derive(Debug, Default, Deserialize)]
pub(crate) struct ActionForm {
    csrf: Option<String>,
    /// Reconsume: the delivery was shown consumed and is to run once more.
    again: Option<String>,
}

fn action_form(form: Result<Form<ActionForm>, FormRejection>) -> ActionForm {
    // A body that is not a form has no CSRF token: refused as such below.
    form.map(|Form(f)| f).unwrap_or_default()
}

/// What an action on one outbox message does.
#[derive(Clone, Copy)]
enum MessageAction {
    Requeue,
    PublishNow,
    Delete,
}

/// An action on the message of the path `id`: checked, done, and back to the
/// message (or, deleted, to the list) with a notice.
async fn message_action(
    ui: &Ui,
    session: &Session,
    headers: &HeaderMap,
    id: Result<Path<String>, PathRejection>,
    form: Result<Form<ActionForm>, FormRejection>,
    action: MessageAction,
) -> Page {
    check_write(session, headers, action_form(form).csrf.as_deref())?;
    let id = parse_message_id(&path(id)?)?;
    let actor = &session.actor.name;
    let back = match action {
        MessageAction::Requeue => {
            ui.service.requeue_message(actor, id).await?;
            format!("/messages/{id}?notice=requeued")
        }
        MessageAction::PublishNow => {
            ui.service.publish_now(actor, id).await?;
            format!("/messages/{id}?notice=published-now")
        }
        MessageAction::Delete => {
            ui.service.delete_message(actor, id, false).await?;
            "/messages?notice=deleted".to_owned()
        }
    };
    Ok(redirect(&ui.at(&back)))
}

/// `POST <base>/messages/{id}/requeue`.
pub(crate) async fn requeue(
    State(ui): UiState,
    Extension(session): Extension<Session>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
    form: Result<Form<ActionForm>, FormRejection>,
) -> Page {
    message_action(&ui, &session, &headers, id, form, MessageAction::Requeue).await
}

/// The edit form of a dead message: its payload as text, its headers as a JSON
/// object of strings (as shown, hidden values `***`).
#[derive(Debug, Default, Deserialize)]
pub(crate) struct ReplayForm {
    csrf: Option<String>,
    payload: Option<String>,
    headers: Option<String>,
}

/// The edit a replay form sent, checked: a write session with its CSRF token, a
/// body that is the form (anything else refused, never replayed as an empty edit,
/// which would spend the one replay on the original unchanged), the headers a JSON
/// object of texts.
fn replay_edit(
    session: &Session,
    headers: &HeaderMap,
    form: Result<Form<ReplayForm>, FormRejection>,
) -> Result<crate::model::ReplayRequest, UiError> {
    let form = form
        .map(|Form(f)| f)
        .map_err(|e| AdminError::bad("bad_body", e.body_text()))?;
    check_write(session, headers, form.csrf.as_deref())?;
    let edited_headers = match form.headers.as_deref().map(str::trim) {
        None => None,
        Some("") => Some(std::collections::BTreeMap::new()),
        Some(text) => Some(serde_json::from_str(text).map_err(|e| {
            AdminError::bad(
                "bad_headers",
                format!(
                    "the headers are not a JSON object of texts ({{\"name\": \"value\"}}): {e}"
                ),
            )
        })?),
    };
    // Browsers send a textarea's line breaks as CRLF: back to what was shown.
    Ok(crate::model::ReplayRequest {
        payload: form.payload.map(|p| p.replace("\r\n", "\n")),
        headers: edited_headers,
    })
}

/// `POST <base>/consumers/{name}/deliveries/{id}/replay`: the edit replayed as a
/// new delivery, and on to its page. Answers as an unknown page while editing is
/// off.
pub(crate) async fn replay_delivery(
    State(ui): UiState,
    Extension(session): Extension<Session>,
    headers: HeaderMap,
    p: Result<Path<(String, String)>, PathRejection>,
    form: Result<Form<ReplayForm>, FormRejection>,
) -> Page {
    if !ui.service.edit_allowed() {
        return Err(AdminError::EditOff.into());
    }
    let edit = replay_edit(&session, &headers, form)?;
    let (name, id) = path(p)?;
    let name = crate::params::text("consumer", name)?;
    let id = parse_message_id(&id)?;
    let made = ui
        .service
        .replay_delivery(&session.actor.name, &name, id, edit)
        .await?;
    Ok(redirect(&ui.at(&format!(
        "/consumers/{}/deliveries/{}?notice=replayed-delivery",
        encode(&name),
        made.id
    ))))
}

/// `POST <base>/messages/{id}/replay`: the edit replayed as a new message, and on
/// to that message's page. Answers as an unknown page while editing is off.
pub(crate) async fn replay(
    State(ui): UiState,
    Extension(session): Extension<Session>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
    form: Result<Form<ReplayForm>, FormRejection>,
) -> Page {
    if !ui.service.edit_allowed() {
        return Err(AdminError::EditOff.into());
    }
    let edit = replay_edit(&session, &headers, form)?;
    let id = parse_message_id(&path(id)?)?;
    let made = ui
        .service
        .replay_message(&session.actor.name, id, edit)
        .await?;
    Ok(redirect(
        &ui.at(&format!("/messages/{}?notice=replayed", made.id)),
    ))
}

/// `POST <base>/messages/{id}/publish-now`.
pub(crate) async fn publish_now(
    State(ui): UiState,
    Extension(session): Extension<Session>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
    form: Result<Form<ActionForm>, FormRejection>,
) -> Page {
    message_action(&ui, &session, &headers, id, form, MessageAction::PublishNow).await
}

/// `POST <base>/messages/{id}/delete`.
pub(crate) async fn delete(
    State(ui): UiState,
    Extension(session): Extension<Session>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
    form: Result<Form<ActionForm>, FormRejection>,
) -> Page {
    message_action(&ui, &session, &headers, id, form, MessageAction::Delete).await
}

/// `POST <base>/consumers/{name}/deliveries/{id}/reconsume`.
pub(crate) async fn reconsume(
    State(ui): UiState,
    Extension(session): Extension<Session>,
    headers: HeaderMap,
    p: Result<Path<(String, String)>, PathRejection>,
    form: Result<Form<ActionForm>, FormRejection>,
) -> Page {
    let form = action_form(form);
    check_write(&session, &headers, form.csrf.as_deref())?;
    let (name, id) = path(p)?;
    let name = crate::params::text("consumer", name)?;
    let id = parse_message_id(&id)?;
    let again = form.again.as_deref() == Some("true");
    ui.service
        .reconsume(&session.actor.name, &name, id, again)
        .await?;
    Ok(redirect(&ui.at(&format!(
        "/consumers/{}/deliveries/{id}?notice=reconsumed",
        encode(&name)
    ))))
}

fn bulk_form(form: Result<Form<ListQuery>, FormRejection>) -> Result<ListQuery, UiError> {
    form.map(|Form(f)| f)
        .map_err(|e| AdminError::bad("bad_body", e.body_text()).into())
}

/// A bulk action's form, once the session may write and its CSRF token matches.
fn checked_bulk_form(
    session: &Session,
    headers: &HeaderMap,
    form: Result<Form<ListQuery>, FormRejection>,
) -> Result<ListQuery, UiError> {
    let csrf = form.as_ref().ok().and_then(|Form(f)| f.csrf.clone());
    check_write(session, headers, csrf.as_deref())?;
    bulk_form(form)
}

/// Back to the filtered list `at`, telling how many the bulk action `verb` changed.
fn bulk_done(at: &str, q: &ListQuery, verb: &str, changed: u64) -> Response {
    let notice = format!("{verb}-{changed}");
    redirect(&format!("{at}?{}", q.query_string(&[("notice", &notice)])))
}

fn filter_target(q: &ListQuery) -> String {
    serde_json::to_string(&q.body()).unwrap_or_else(|_| "{}".to_owned())
}

/// What a bulk action does to what the form's filter matches.
#[derive(Clone, Copy)]
enum BulkAction<'a> {
    Requeue,
    Delete,
    Reconsume { consumer: &'a str },
}

/// A bulk action over the checked form `q`, then back to its filtered list.
async fn bulk_action(ui: &Ui, session: &Session, q: &ListQuery, action: BulkAction<'_>) -> Page {
    let (actor, target) = (&session.actor.name, filter_target(q));
    let service = &ui.service;
    let (done, at, verb) = match action {
        BulkAction::Requeue => (
            service
                .requeue_matching(actor, &q.filter()?, target, false, DEFAULT_BULK_MAX)
                .await?,
            ui.at("/messages"),
            "requeued",
        ),
        BulkAction::Delete => (
            service
                .delete_matching(actor, &q.filter()?, target, false, DEFAULT_BULK_MAX, false)
                .await?,
            ui.at("/messages"),
            "deleted",
        ),
        BulkAction::Reconsume { consumer } => (
            service
                .reconsume_matching(
                    actor,
                    consumer,
                    &q.filter()?,
                    target,
                    false,
                    DEFAULT_BULK_MAX,
                )
                .await?,
            ui.at(&format!("/consumers/{}", encode(consumer))),
            "reconsumed",
        ),
    };
    Ok(bulk_done(&at, q, verb, done.changed))
}

/// `POST <base>/messages/requeue`: everything matching the form's filter.
pub(crate) async fn bulk_requeue(
    State(ui): UiState,
    Extension(session): Extension<Session>,
    headers: HeaderMap,
    form: Result<Form<ListQuery>, FormRejection>,
) -> Page {
    let q = checked_bulk_form(&session, &headers, form)?;
    bulk_action(&ui, &session, &q, BulkAction::Requeue).await
}

/// `POST <base>/messages/delete`: every dead message matching the form's filter.
pub(crate) async fn bulk_delete(
    State(ui): UiState,
    Extension(session): Extension<Session>,
    headers: HeaderMap,
    form: Result<Form<ListQuery>, FormRejection>,
) -> Page {
    let q = checked_bulk_form(&session, &headers, form)?;
    bulk_action(&ui, &session, &q, BulkAction::Delete).await
}

/// `POST <base>/consumers/{name}/reconsume`: a consumer's deliveries matching the
/// form's filter.
pub(crate) async fn bulk_reconsume(
    State(ui): UiState,
    Extension(session): Extension<Session>,
    headers: HeaderMap,
    name: Result<Path<String>, PathRejection>,
    form: Result<Form<ListQuery>, FormRejection>,
) -> Page {
    let q = checked_bulk_form(&session, &headers, form)?;
    let name = crate::params::text("consumer", path(name)?)?;
    bulk_action(&ui, &session, &q, BulkAction::Reconsume { consumer: &name }).await
}

/// `POST <base>/dead-letters/{id}/delete`.
pub(crate) async fn delete_dead_letter(
    State(ui): UiState,
    Extension(session): Extension<Session>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
    form: Result<Form<ActionForm>, FormRejection>,
) -> Page {
    check_write(&session, &headers, action_form(form).csrf.as_deref())?;
    let id = parse_dead_letter_id(&path(id)?)?;
    ui.service
        .delete_dead_letter(&session.actor.name, id)
        .await?;
    Ok(redirect(&ui.at("/dead-letters?notice=deleted")))
}
