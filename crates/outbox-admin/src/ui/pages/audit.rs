//! The audit log: every write, newest first.

use askama::Template;
use axum::Extension;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use serde::Deserialize;

use super::{Chrome, UiState, chrome, query};
use crate::params::parse_cursor;
use crate::ui::Page;
use crate::ui::render::render;
use crate::ui::session::Session;

#[derive(Template)]
#[template(path = "audit.html")]
struct AuditPage {
    chrome: Chrome,
    items: Vec<crate::model::AuditItem>,
    next: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct CursorQuery {
    cursor: Option<String>,
}

/// `GET <base>/audit`: every write, newest first.
pub(crate) async fn audit(
    State(ui): UiState,
    Extension(session): Extension<Session>,
    q: Result<Query<CursorQuery>, QueryRejection>,
) -> Page {
    let q = query(q)?;
    let cursor = parse_cursor(q.cursor.as_deref().filter(|c| !c.is_empty()))?;
    let page = ui
        .service
        .audit_log(cursor, crate::params::DEFAULT_LIMIT)
        .await?;
    render(
        StatusCode::OK,
        &AuditPage {
            chrome: chrome(&ui, &session, "audit").await,
            next: page
                .next_cursor
                .map(|c| format!("{}?cursor={c}", ui.at("/audit"))),
            items: page.items,
        },
    )
}
