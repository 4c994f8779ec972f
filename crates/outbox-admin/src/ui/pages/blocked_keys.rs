//! The ordering keys held back by a failing or dead head.

use askama::Template;
use axum::extract::rejection::{FormRejection, QueryRejection};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::{Extension, Form};
use serde::Deserialize;

use super::{Chrome, Confirm, UiState, chrome, notice_text, query};
use crate::params::DEFAULT_BULK_MAX;
use crate::ui::Page;
use crate::ui::filters::encode;
use crate::ui::render::render;
use crate::ui::session::Session;
use crate::ui::session::{CsrfForm, check_write, redirect};
use crate::ui::view;

struct BlockedRow {
    key: String,
    href: String,
    head_id: String,
    status: String,
    attempts: u32,
    waiting: String,
    next_attempt_at: String,
    last_error: String,
}

#[derive(Template)]
#[template(path = "blocked_keys.html")]
struct BlockedPage {
    chrome: Chrome,
    rows: Vec<BlockedRow>,
    next: Option<String>,
    here: String,
    confirm: Option<Confirm>,
    notice: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct BlockedQuery {
    after: Option<String>,
    /// `requeue`: the dialog of "Requeue every head", with its dry-run count.
    confirm: Option<String>,
    notice: Option<String>,
}

/// `GET <base>/ordering/blocked-keys`: the ordering keys held back by a failing
/// or dead head, each linking to its head message (where requeue and delete are).
pub(crate) async fn blocked_keys(
    State(ui): UiState,
    Extension(session): Extension<Session>,
    q: Result<Query<BlockedQuery>, QueryRejection>,
) -> Page {
    let q = query(q)?;
    let after = q
        .after
        .filter(|a| !a.is_empty())
        .map(|a| crate::params::text("after", a))
        .transpose()?;
    let page = ui
        .service
        .blocked_keys(after, crate::params::DEFAULT_LIMIT)
        .await?;
    let base = ui.at("/ordering/blocked-keys");
    let confirm = if q.confirm.as_deref() == Some("requeue") && session.can_write() {
        let counted = ui
            .service
            .requeue_blocked_heads(&session.actor.name, true, DEFAULT_BULK_MAX)
            .await?;
        let bounded = if counted.matched > DEFAULT_BULK_MAX {
            format!(
                " One run requeues at most {}; run it again for the rest.",
                view::thousands(DEFAULT_BULK_MAX)
            )
        } else {
            String::new()
        };
        Some(Confirm {
            title: "Requeue the head of every blocked key?".to_owned(),
            text: format!(
                "Dry run: {} blocked. Each head (failing or dead) goes back to pending with a fresh retry budget, and its key's waiting messages follow it in order; a head a relay holds right now is left as it is.{bounded}",
                view::count(counted.matched, "key is", "keys are")
            ),
            action: format!("{base}/requeue"),
            hidden: vec![("csrf", session.csrf.clone())],
            cancel: base.clone(),
            danger: false,
        })
    } else {
        None
    };
    let next = page
        .next_after
        .map(|k| format!("{base}?after={}", encode(&k)));
    let rows = page
        .items
        .into_iter()
        .map(|k| BlockedRow {
            href: ui.at(&format!("/messages/{}", k.head_id)),
            waiting: if k.waiting_capped {
                format!("{}+", k.waiting)
            } else {
                k.waiting.to_string()
            },
            next_attempt_at: k.head_next_attempt_at.unwrap_or_default(),
            last_error: view::preview(&k.head_last_error.unwrap_or_default(), false, 80),
            key: k.key,
            head_id: k.head_id,
            status: k.head_status,
            attempts: k.head_attempts,
        })
        .collect();
    render(
        StatusCode::OK,
        &BlockedPage {
            chrome: chrome(&ui, &session, "overview").await,
            rows,
            next,
            here: base,
            confirm,
            notice: notice_text(q.notice.as_deref()),
        },
    )
}

/// `POST <base>/ordering/blocked-keys/requeue`: the head of every blocked key
/// requeued (up to the bulk default), audited as one action.
pub(crate) async fn requeue_heads(
    State(ui): UiState,
    Extension(session): Extension<Session>,
    headers: HeaderMap,
    form: Result<Form<CsrfForm>, FormRejection>,
) -> Page {
    let form = form.map(|Form(f)| f).unwrap_or_default();
    check_write(&session, &headers, form.csrf.as_deref())?;
    let done = ui
        .service
        .requeue_blocked_heads(&session.actor.name, false, DEFAULT_BULK_MAX)
        .await?;
    Ok(redirect(&ui.at(&format!(
        "/ordering/blocked-keys?notice=requeued-{}",
        done.changed
    ))))
}
