//! Failures grouped by error, per exchange and per consumer.

use askama::Template;
use axum::Extension;
use axum::extract::State;
use axum::http::StatusCode;

use super::{Chrome, UiState, chrome};
use crate::ui::Page;
use crate::ui::filters::encode;
use crate::ui::render::render;
use crate::ui::session::Session;
use crate::ui::view;

struct GroupRow {
    count: u64,
    /// `exchange orders` or `consumer billing`.
    place: String,
    /// The dead ones of that exchange or consumer, listed.
    dead: String,
    /// The failing ones (waiting for their retry), listed.
    failing: String,
    error: String,
    example: String,
    oldest: String,
    newest: String,
}

#[derive(Template)]
#[template(path = "failures.html")]
struct FailuresPage {
    chrome: Chrome,
    rows: Vec<GroupRow>,
    capped: bool,
}

/// `GET <base>/failures`: the groups of `GET /api/v1/failures`, each linking to the
/// dead messages of its exchange or the dead deliveries of its consumer.
pub(crate) async fn failures(State(ui): UiState, Extension(session): Extension<Session>) -> Page {
    let groups = ui.service.failure_groups().await?;
    let capped = groups.capped;
    let rows = groups
        .groups
        .into_iter()
        .map(|g| {
            let (place, dead, failing) = match (&g.exchange, &g.consumer) {
                (Some(x), _) => (
                    format!("exchange {x}"),
                    ui.at(&format!("/messages?status=dead&exchange={}", encode(x))),
                    ui.at(&format!(
                        "/messages?status=publish_failed&exchange={}",
                        encode(x)
                    )),
                ),
                (None, Some(c)) => (
                    format!("consumer {c}"),
                    ui.at(&format!("/consumers/{}?status=dead", encode(c))),
                    ui.at(&format!("/consumers/{}?status=consume_failed", encode(c))),
                ),
                (None, None) => (String::new(), ui.at("/messages"), ui.at("/messages")),
            };
            GroupRow {
                count: g.count,
                place,
                dead,
                failing,
                error: view::preview(&g.error, false, 160),
                example: view::preview(&g.example, false, 160),
                oldest: g.oldest.unwrap_or_default(),
                newest: g.newest.unwrap_or_default(),
            }
        })
        .collect();
    render(
        StatusCode::OK,
        &FailuresPage {
            chrome: chrome(&ui, &session, "failures"),
            rows,
            capped,
        },
    )
}
