//! Throughput: every exchange and consumer with what it did over the last hour,
//! day or week, and each one's own chart with its pause and its rows a click away.

use askama::Template;
use axum::Extension;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use outbox_ports::{ChartWindow, PauseKind};
use serde::Deserialize;

use super::{Chrome, UiState, chrome, path, query};
use crate::model::PauseKindItem;
use crate::params::parse_window;
use crate::ui::filters::encode;
use crate::ui::render::render;
use crate::ui::session::Session;
use crate::ui::{Page, Ui, chart};

/// The window asked for.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct WindowQuery {
    window: Option<String>,
}

/// A window's tab: `1 h`, `24 h`, `7 d`.
struct WindowTab {
    label: &'static str,
    href: String,
    current: bool,
}

fn window_tabs(here: &str, current: ChartWindow) -> Vec<WindowTab> {
    ChartWindow::ALL
        .into_iter()
        .map(|w| WindowTab {
            label: match w {
                ChartWindow::Day => "24 h",
                ChartWindow::Week => "7 d",
                _ => "1 h",
            },
            href: format!("{here}?window={}", w.as_str()),
            current: w == current,
        })
        .collect()
}

/// What a window is in words: `the last hour`.
const fn span(window: ChartWindow) -> &'static str {
    match window {
        ChartWindow::Day => "the last 24 hours",
        ChartWindow::Week => "the last 7 days",
        _ => "the last hour",
    }
}

struct NameRow {
    name: String,
    href: String,
    done: u64,
    failed: u64,
    paused: bool,
}

#[derive(Template)]
#[template(path = "throughput.html")]
struct ThroughputPage {
    chrome: Chrome,
    tabs: Vec<WindowTab>,
    span: &'static str,
    exchanges: Vec<NameRow>,
    consumers: Vec<NameRow>,
}

/// The names paused now, of `kind`.
async fn paused(ui: &Ui, kind: PauseKindItem) -> Result<Vec<String>, crate::AdminError> {
    Ok(ui
        .service
        .pauses()
        .await?
        .items
        .into_iter()
        .filter(|p| p.kind == kind)
        .map(|p| p.name)
        .collect())
}

/// `GET <base>/throughput`: every exchange and consumer with something counted
/// over the window.
pub(crate) async fn throughput(
    State(ui): UiState,
    Extension(session): Extension<Session>,
    q: Result<Query<WindowQuery>, QueryRejection>,
) -> Page {
    let window = parse_window(query(q)?.window.as_deref())?;
    let totals = ui.service.throughput_totals(window).await?;
    let (paused_exchanges, paused_consumers) = (
        paused(&ui, PauseKindItem::Exchange).await?,
        paused(&ui, PauseKindItem::Consumer).await?,
    );
    let exchanges = totals
        .exchanges
        .into_iter()
        .map(|t| NameRow {
            href: format!(
                "{}?window={}",
                ui.at(&format!("/throughput/exchanges/{}", encode(&t.exchange))),
                window.as_str()
            ),
            paused: paused_exchanges.contains(&t.exchange),
            name: t.exchange,
            done: t.published,
            failed: t.failed,
        })
        .collect();
    let consumers = totals
        .consumers
        .into_iter()
        .map(|t| NameRow {
            href: format!(
                "{}?window={}",
                ui.at(&format!("/throughput/consumers/{}", encode(&t.consumer))),
                window.as_str()
            ),
            paused: paused_consumers.contains(&t.consumer),
            name: t.consumer,
            done: t.consumed,
            failed: t.failed,
        })
        .collect();
    render(
        StatusCode::OK,
        &ThroughputPage {
            chrome: chrome(&ui, &session, "throughput").await,
            tabs: window_tabs(&ui.at("/throughput"), window),
            span: span(window),
            exchanges,
            consumers,
        },
    )
}

#[derive(Template)]
#[template(path = "chart.html")]
struct ChartPage {
    chrome: Chrome,
    /// `exchange` or `consumer`.
    kind: &'static str,
    name: String,
    paused: bool,
    tabs: Vec<WindowTab>,
    span: &'static str,
    chart: String,
    /// `published` or `consumed`.
    done_word: &'static str,
    done: u64,
    failed: u64,
    /// Its messages or deliveries.
    rows_href: String,
    rows_word: &'static str,
    /// Where its pause and resume are confirmed.
    pauses: String,
}

/// One exchange's or consumer's counts over a window, and where its rows are.
struct Charted {
    kind: PauseKind,
    name: String,
    window: ChartWindow,
    /// A bucket each: completed (published or consumed), failed attempts.
    done: Vec<u64>,
    failed: Vec<u64>,
    /// Their sums.
    totals: (u64, u64),
    rows_href: String,
    rows_word: &'static str,
}

/// The chart page of `c`.
async fn chart_page(ui: &Ui, session: &Session, c: Charted) -> Page {
    let (item, done_word, path) = match c.kind {
        PauseKind::Consumer => (PauseKindItem::Consumer, "consumed", "consumers"),
        _ => (PauseKindItem::Exchange, "published", "exchanges"),
    };
    let paused = paused(ui, item).await?.contains(&c.name);
    let here = ui.at(&format!("/throughput/{path}/{}", encode(&c.name)));
    render(
        StatusCode::OK,
        &ChartPage {
            chrome: chrome(ui, session, "throughput").await,
            kind: c.kind.as_str(),
            paused,
            tabs: window_tabs(&here, c.window),
            span: span(c.window),
            chart: chart::window(c.window, done_word, &c.done, &c.failed),
            done_word,
            done: c.totals.0,
            failed: c.totals.1,
            rows_href: c.rows_href,
            rows_word: c.rows_word,
            pauses: ui.at("/pauses"),
            name: c.name,
        },
    )
}

/// `GET <base>/throughput/exchanges/{name}`: one exchange's chart.
pub(crate) async fn exchange_chart(
    State(ui): UiState,
    Extension(session): Extension<Session>,
    name: Result<Path<String>, PathRejection>,
    q: Result<Query<WindowQuery>, QueryRejection>,
) -> Page {
    let name = crate::params::text("exchange", path(name)?)?;
    let window = parse_window(query(q)?.window.as_deref())?;
    let t = ui.service.exchange_throughput(&name, window).await?;
    let (done, failed) = t.buckets.iter().map(|b| (b.published, b.failed)).unzip();
    let charted = Charted {
        kind: PauseKind::Exchange,
        window,
        done,
        failed,
        totals: (t.published, t.failed),
        rows_href: format!("{}?exchange={}", ui.at("/messages"), encode(&name)),
        rows_word: "Its messages",
        name,
    };
    chart_page(&ui, &session, charted).await
}

/// `GET <base>/throughput/consumers/{name}`: one consumer's chart.
pub(crate) async fn consumer_chart(
    State(ui): UiState,
    Extension(session): Extension<Session>,
    name: Result<Path<String>, PathRejection>,
    q: Result<Query<WindowQuery>, QueryRejection>,
) -> Page {
    let name = crate::params::text("consumer", path(name)?)?;
    let window = parse_window(query(q)?.window.as_deref())?;
    let t = ui.service.consumer_throughput(&name, window).await?;
    let (done, failed) = t.buckets.iter().map(|b| (b.consumed, b.failed)).unzip();
    let charted = Charted {
        kind: PauseKind::Consumer,
        window,
        done,
        failed,
        totals: (t.consumed, t.failed),
        rows_href: ui.consumer_at(&name),
        rows_word: "Its deliveries",
        name,
    };
    chart_page(&ui, &session, charted).await
}
