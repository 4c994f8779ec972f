//! Every consumer with its counts.

use askama::Template;
use axum::Extension;
use axum::extract::State;
use axum::http::StatusCode;

use super::{Chrome, UiState, chrome, opt_num};
use crate::model::ConsumerItem;
use crate::ui::Page;
use crate::ui::filters::encode;
use crate::ui::render::render;
use crate::ui::session::Session;

struct ConsumerRow {
    href: String,
    dead_href: String,
    /// Its throughput chart.
    chart_href: String,
    item: ConsumerItem,
    consumed: String,
}

#[derive(Template)]
#[template(path = "consumers.html")]
struct ConsumersPage {
    chrome: Chrome,
    rows: Vec<ConsumerRow>,
    /// The pauses page, where a consumer's pause and resume are confirmed.
    pauses: String,
}

/// `GET <base>/consumers`: every consumer with its counts.
pub(crate) async fn consumers(State(ui): UiState, Extension(session): Extension<Session>) -> Page {
    let rows = ui
        .service
        .consumers()
        .await?
        .into_iter()
        .map(|item| {
            let href = ui.at(&format!("/consumers/{}", encode(&item.name)));
            ConsumerRow {
                chart_href: ui.at(&format!("/throughput/consumers/{}", encode(&item.name))),
                dead_href: format!("{href}?status=dead"),
                href,
                consumed: opt_num(item.consumed),
                item,
            }
        })
        .collect();
    render(
        StatusCode::OK,
        &ConsumersPage {
            chrome: chrome(&ui, &session, "consumers").await,
            rows,
            pauses: ui.at("/pauses"),
        },
    )
}
