//! Bulk actions on chosen rows: the rows ticked in a list (at most a page's
//! worth), confirmed in a dialog that counts them, then each one acted on through
//! the service's single-row action (so each is checked and audited on its own),
//! and back to the list with how many changed.

use std::sync::Arc;

use askama::Template;
use axum::Extension;
use axum::body::Bytes;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};

use super::{Chrome, Confirm, UiState, chrome, path};
use crate::AdminError;
use crate::params::parse_message_id;
use crate::ui::filters::with_query;
use crate::ui::render::render;
use crate::ui::session::{Session, check_write, redirect};
use crate::ui::view;
use crate::ui::{Page, Ui};
use outbox_core::MessageId;

/// The most rows one selection acts on: a page's worth at the largest page size.
pub(crate) const MAX_SELECTED: usize = 1000;

/// The list filters a selection form carries, to come back to the same view.
const FILTER_KEYS: [&str; 8] = [
    "status",
    "exchange",
    "routing_key",
    "type",
    "created_after",
    "created_before",
    "q",
    "limit",
];

/// A selection form as posted: repeated `id` fields (which a struct form cannot
/// take), the verb, the CSRF token, whether the dialog was confirmed, and the
/// list's filters.
#[derive(Debug, Default)]
struct SelectionForm {
    csrf: Option<String>,
    verb: Option<String>,
    confirmed: bool,
    ids: Vec<String>,
    filters: Vec<(&'static str, String)>,
}

fn selection_form(body: &[u8]) -> SelectionForm {
    let mut form = SelectionForm::default();
    for (key, value) in form_urlencoded::parse(body) {
        match key.as_ref() {
            "csrf" => form.csrf = Some(value.into_owned()),
            "verb" => form.verb = Some(value.into_owned()),
            "confirmed" => form.confirmed = value == "1",
            "id" => form.ids.push(value.into_owned()),
            other => {
                if let Some(k) = FILTER_KEYS.iter().find(|k| **k == other)
                    && !value.is_empty()
                {
                    form.filters.push((k, value.into_owned()));
                }
            }
        }
    }
    form
}

/// What a selection does: the outbox's requeue or delete, or a consumer's
/// reconsume.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Verb {
    Requeue,
    Delete,
    Reconsume,
}

impl Verb {
    fn parse(side_is_outbox: bool, verb: Option<&str>) -> Result<Self, AdminError> {
        match (side_is_outbox, verb) {
            (true, Some("requeue")) => Ok(Self::Requeue),
            (true, Some("delete")) => Ok(Self::Delete),
            (false, Some("reconsume")) => Ok(Self::Reconsume),
            _ => Err(AdminError::bad(
                "bad_body",
                "verb must be requeue or delete (messages) or reconsume (deliveries)",
            )),
        }
    }

    const fn word(self) -> &'static str {
        match self {
            Self::Requeue => "requeue",
            Self::Delete => "delete",
            Self::Reconsume => "reconsume",
        }
    }

    const fn done(self) -> &'static str {
        match self {
            Self::Requeue => "requeued",
            Self::Delete => "deleted",
            Self::Reconsume => "reconsumed",
        }
    }
}

#[derive(Template)]
#[template(path = "selected.html")]
struct SelectedPage {
    chrome: Chrome,
    title: String,
    c: Confirm,
    /// The chosen rows' ids, as the dialog lists them.
    ids: Vec<String>,
}

/// Where the list was: its path with the form's filters.
fn list_url(list: &str, filters: &[(&'static str, String)], extra: Option<(&str, &str)>) -> String {
    with_query(
        list,
        filters.iter().map(|(k, v)| (*k, v.as_str())).chain(extra),
    )
}

/// A selection of the outbox's list (`consumer` `None`) or of a consumer's.
async fn selected(
    ui: &Arc<Ui>,
    session: &Session,
    headers: &HeaderMap,
    consumer: Option<&str>,
    body: &[u8],
) -> Page {
    let form = selection_form(body);
    check_write(session, headers, form.csrf.as_deref())?;
    let verb = Verb::parse(consumer.is_none(), form.verb.as_deref())?;
    let (list, post) = match consumer {
        None => (ui.at("/messages"), ui.at("/messages/selected")),
        Some(name) => {
            let at = ui.consumer_at(name);
            (at.clone(), format!("{at}/selected"))
        }
    };
    if form.ids.is_empty() {
        return Ok(redirect(&list_url(
            &list,
            &form.filters,
            Some(("notice", "none-selected")),
        )));
    }
    if form.ids.len() > MAX_SELECTED {
        return Err(AdminError::bad(
            "bad_body",
            format!("at most {MAX_SELECTED} rows are acted on at once"),
        )
        .into());
    }
    let mut ids = Vec::with_capacity(form.ids.len());
    for id in &form.ids {
        let id = parse_message_id(id)?;
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    let (one, many) = match consumer {
        None => ("message", "messages"),
        Some(_) => ("delivery", "deliveries"),
    };
    if !form.confirmed {
        let counted = view::count(ids.len() as u64, one, many);
        let only = match verb {
            Verb::Requeue => "Only dead and publish-failed ones are requeued",
            Verb::Delete => "Only dead ones are deleted, for good",
            Verb::Reconsume => "Only dead and consume-failed ones are reconsumed",
        };
        let mut hidden = vec![
            ("csrf", session.csrf.clone()),
            ("verb", verb.word().to_owned()),
            ("confirmed", "1".to_owned()),
        ];
        hidden.extend(ids.iter().map(|id| ("id", id.to_string())));
        hidden.extend(form.filters.iter().cloned());
        let title = format!("{} {counted}, as selected?", capitalised(verb.word()));
        let page = SelectedPage {
            chrome: chrome(
                ui,
                session,
                if consumer.is_some() {
                    "consumers"
                } else {
                    "messages"
                },
            )
            .await,
            title: title.clone(),
            c: Confirm {
                title,
                text: format!("{only}; the others are left as they are."),
                action: post,
                hidden,
                cancel: list_url(&list, &form.filters, None),
                danger: verb == Verb::Delete,
            },
            ids: ids.iter().map(ToString::to_string).collect(),
        };
        return render(StatusCode::OK, &page);
    }
    // In a task of its own: a browser that goes away mid-way (a closed tab, a
    // proxy's timeout) does not cut the loop between an action and its audit.
    let job = tokio::spawn(act_on_each(
        Arc::clone(ui),
        session.actor.name.clone(),
        verb,
        consumer.map(str::to_owned),
        ids.clone(),
    ));
    let changed = match job.await {
        Ok(Ok(changed)) => changed,
        Ok(Err((changed, e))) => {
            // Said with how far it got: what changed before the error stays.
            return Err(AdminError::Port(outbox_ports::PortError::transient(
                "act on the selected rows",
                format!("stopped after {changed} of {} changed: {e}", ids.len()),
            ))
            .into());
        }
        Err(e) => {
            return Err(AdminError::Port(outbox_ports::PortError::transient(
                "act on the selected rows",
                format!("the action stopped: {e}"),
            ))
            .into());
        }
    };
    let notice = format!("{}-{changed}-of-{}", verb.done(), ids.len());
    Ok(redirect(&list_url(
        &list,
        &form.filters,
        Some(("notice", &notice)),
    )))
}

/// Each row through the service's single-row action; how many changed. A row
/// refused for what it is (gone, a status that does not allow it, busy, replayed)
/// is passed over, as a bulk action passes it over; anything else stops the loop,
/// with how many had changed.
async fn act_on_each(
    ui: Arc<Ui>,
    actor: String,
    verb: Verb,
    consumer: Option<String>,
    ids: Vec<MessageId>,
) -> Result<u64, (u64, AdminError)> {
    let mut changed = 0u64;
    for id in ids {
        let outcome = match (verb, consumer.as_deref()) {
            (Verb::Requeue, None) => ui.service.requeue_message(&actor, id).await,
            (Verb::Delete, None) => ui.service.delete_message(&actor, id, false).await,
            (Verb::Reconsume, Some(name)) => ui.service.reconsume(&actor, name, id, false).await,
            // Verb::parse takes requeue and delete for the outbox only, reconsume
            // for a consumer only.
            _ => Err(AdminError::bad("bad_body", "no such action on this list")),
        };
        match outcome {
            Ok(()) => changed += 1,
            Err(e) if passed_over(&e) => {}
            Err(e) => return Err((changed, e)),
        }
    }
    Ok(changed)
}

/// Whether `e` refuses one row for what it is, not the action as a whole.
fn passed_over(e: &AdminError) -> bool {
    matches!(
        e.status_and_code().1,
        "not_found" | "illegal_transition" | "not_deletable" | "busy" | "refused"
    )
}

fn capitalised(word: &str) -> String {
    let mut chars = word.chars();
    chars
        .next()
        .map(|c| c.to_ascii_uppercase().to_string() + chars.as_str())
        .unwrap_or_default()
}

/// `POST <base>/messages/selected`: the chosen messages, requeued or deleted.
pub(crate) async fn messages_selected(
    State(ui): UiState,
    Extension(session): Extension<Session>,
    headers: HeaderMap,
    body: Bytes,
) -> Page {
    selected(&ui, &session, &headers, None, &body).await
}

/// `POST <base>/consumers/{name}/selected`: the chosen deliveries, reconsumed.
pub(crate) async fn deliveries_selected(
    State(ui): UiState,
    Extension(session): Extension<Session>,
    headers: HeaderMap,
    name: Result<Path<String>, PathRejection>,
    body: Bytes,
) -> Page {
    let name = crate::params::text("consumer", path(name)?)?;
    selected(&ui, &session, &headers, Some(&name), &body).await
}

#[cfg(test)]
mod tests {
    use outbox_core::{OutboxStatus, TransitionError};
    use outbox_ports::PortError;

    use super::passed_over;
    use crate::AdminError;

    #[test]
    fn only_a_refusal_of_the_row_itself_is_passed_over() {
        for e in [
            AdminError::Port(PortError::NotFound {
                what: "message",
                id: "7".into(),
            }),
            AdminError::Port(PortError::IllegalTransition(TransitionError::Outbox {
                from: OutboxStatus::Sent,
                to: OutboxStatus::Pending,
            })),
        ] {
            assert!(passed_over(&e), "{e}");
        }
        for e in [
            AdminError::Forbidden {
                actor: "viewer".into(),
            },
            AdminError::bad("bad_body", "no"),
            AdminError::Port(PortError::transient("requeue", "connection refused")),
        ] {
            assert!(!passed_over(&e), "{e}");
        }
    }
}
