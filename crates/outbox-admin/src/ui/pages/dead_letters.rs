//! Deliveries that could not become messages: the list and one letter.

use askama::Template;
use axum::Extension;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use serde::Deserialize;

use super::{Chrome, Confirm, DetailQuery, UiState, chrome, notice_text, path, query};
use crate::params::{parse_cursor, parse_dead_letter_id};
use crate::ui::Page;
use crate::ui::filters::encode;
use crate::ui::render::render;
use crate::ui::session::Session;
use crate::ui::view::{self, PayloadView};

struct LetterRow {
    href: String,
    id: u64,
    consumer: String,
    message_id: String,
    routing_key: String,
    reason: String,
    received_at: String,
    preview: String,
}

#[derive(Template)]
#[template(path = "dead_letters.html")]
struct LettersPage {
    chrome: Chrome,
    rows: Vec<LetterRow>,
    consumer: String,
    next: Option<String>,
    notice: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct LettersQuery {
    consumer: Option<String>,
    cursor: Option<String>,
    notice: Option<String>,
}

/// `GET <base>/dead-letters`: deliveries that could not become messages.
pub(crate) async fn dead_letters(
    State(ui): UiState,
    Extension(session): Extension<Session>,
    q: Result<Query<LettersQuery>, QueryRejection>,
) -> Page {
    let q = query(q)?;
    let consumer = q
        .consumer
        .filter(|c| !c.trim().is_empty())
        .map(|c| crate::params::text("consumer", c))
        .transpose()?;
    let cursor = parse_cursor(q.cursor.as_deref().filter(|c| !c.is_empty()))?;
    let page = ui
        .service
        .list_dead_letters(consumer.clone(), cursor, crate::params::DEFAULT_LIMIT)
        .await?;
    let base = ui.at("/dead-letters");
    let next = page.next_cursor.map(|c| match &consumer {
        Some(name) => format!("{base}?consumer={}&cursor={c}", encode(name)),
        None => format!("{base}?cursor={c}"),
    });
    let rows = page
        .items
        .into_iter()
        .map(|l| LetterRow {
            href: format!("{base}/{}", l.id),
            id: l.id,
            consumer: l.consumer,
            message_id: l.message_id.unwrap_or_default(),
            routing_key: l.routing_key,
            reason: view::preview(&l.reason, false, 80),
            received_at: l.received_at,
            preview: view::preview(&l.body, l.body_base64, 60),
        })
        .collect();
    render(
        StatusCode::OK,
        &LettersPage {
            chrome: chrome(&ui, &session, "dead-letters").await,
            rows,
            consumer: consumer.unwrap_or_default(),
            next,
            notice: notice_text(q.notice.as_deref()),
        },
    )
}

#[derive(Template)]
#[template(path = "dead_letter.html")]
struct LetterPage {
    chrome: Chrome,
    here: String,
    letter: crate::model::DeadLetterView,
    body: PayloadView,
    show_all: Option<String>,
    confirm: Option<Confirm>,
}

/// `GET <base>/dead-letters/{id}`: the raw body and headers.
pub(crate) async fn dead_letter(
    State(ui): UiState,
    Extension(session): Extension<Session>,
    id: Result<Path<String>, PathRejection>,
    q: Result<Query<DetailQuery>, QueryRejection>,
) -> Page {
    let id = parse_dead_letter_id(&path(id)?)?;
    let q = query(q)?;
    let letter = ui.service.get_dead_letter(id).await?;
    let here = ui.at(&format!("/dead-letters/{id}"));
    let all = q.all.as_deref() == Some("1");
    let body = view::payload(&letter.body, letter.body_base64, all);
    let confirm =
        (session.can_write() && q.confirm.as_deref() == Some("delete")).then(|| Confirm {
            title: format!("Delete dead letter {id}?"),
            text: "It is removed for good.".to_owned(),
            action: format!("{here}/delete"),
            hidden: vec![("csrf", session.csrf.clone())],
            cancel: here.clone(),
            danger: true,
        });
    render(
        StatusCode::OK,
        &LetterPage {
            chrome: chrome(&ui, &session, "dead-letters").await,
            show_all: (body.cut && !all).then(|| format!("{here}?all=1")),
            here,
            letter,
            body,
            confirm,
        },
    )
}
