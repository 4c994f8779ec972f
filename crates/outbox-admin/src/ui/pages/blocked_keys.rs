//! The ordering keys held back by a failing or dead head.

use askama::Template;
use axum::Extension;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use serde::Deserialize;

use super::{Chrome, UiState, chrome, query};
use crate::ui::Page;
use crate::ui::filters::encode;
use crate::ui::render::render;
use crate::ui::session::Session;
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
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct BlockedQuery {
    after: Option<String>,
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
        },
    )
}
