//! Pauses: the exchanges and consumers operators paused, each with its resume
//! action, and a form to pause one by name; both behind the confirmation dialog.

use askama::Template;
use axum::extract::rejection::{FormRejection, QueryRejection};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::{Extension, Form};
use outbox_ports::PauseKind;
use serde::Deserialize;

use super::{Chrome, Confirm, UiState, chrome, query};
use crate::AdminError;
use crate::model::PauseKindItem;
use crate::ui::Page;
use crate::ui::render::render;
use crate::ui::session::{Session, check_write, redirect};

struct PauseRow {
    kind: &'static str,
    name: String,
    /// Its throughput chart.
    chart_href: String,
    since: String,
    by: String,
}

#[derive(Template)]
#[template(path = "pauses.html")]
struct PausesPage {
    chrome: Chrome,
    here: String,
    rows: Vec<PauseRow>,
    notice: Option<String>,
    confirm: Option<Confirm>,
}

/// What the pauses page is asked: a dialog to open (`confirm` = `pause` or
/// `resume`, with `kind` and `name`) or a notice to show.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct PausesQuery {
    confirm: Option<String>,
    kind: Option<String>,
    name: Option<String>,
    notice: Option<String>,
}

/// A pause or resume posted from the dialog.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct PauseForm {
    csrf: Option<String>,
    kind: Option<String>,
    name: Option<String>,
}

fn kind_of(kind: Option<&str>) -> Result<PauseKind, AdminError> {
    kind.and_then(PauseKind::parse)
        .ok_or_else(|| AdminError::bad("bad_kind", "kind must be exchange or consumer"))
}

const fn kind_name(kind: PauseKindItem) -> &'static str {
    match kind {
        PauseKindItem::Exchange => "exchange",
        PauseKindItem::Consumer => "consumer",
    }
}

/// `GET <base>/pauses`.
pub(crate) async fn pauses(
    State(ui): UiState,
    Extension(session): Extension<Session>,
    q: Result<Query<PausesQuery>, QueryRejection>,
) -> Page {
    let q = query(q)?;
    let here = ui.at("/pauses");
    let rows = ui
        .service
        .pauses()
        .await?
        .items
        .into_iter()
        .map(|p| PauseRow {
            kind: kind_name(p.kind),
            chart_href: ui.at(&format!(
                "/throughput/{}s/{}",
                kind_name(p.kind),
                crate::ui::filters::encode(&p.name)
            )),
            name: p.name,
            since: p.since.unwrap_or_default(),
            by: p.by,
        })
        .collect();
    let confirm = match (q.confirm.as_deref(), session.can_write()) {
        (Some(verb @ ("pause" | "resume")), true) => {
            let kind = kind_of(q.kind.as_deref())?;
            let name = crate::params::text("name", q.name.clone().unwrap_or_default())?;
            if let Some(why) = outbox_ports::invalid_pause_name(&name) {
                return Err(AdminError::bad("bad_name", format!("the {kind} name {why}")).into());
            }
            let text = match (verb, kind) {
                ("pause", PauseKind::Exchange) => {
                    "Every relay holds its messages pending (each ordering key keeps its order) \
                     until it is resumed; other exchanges flow."
                }
                ("pause", PauseKind::Consumer) => {
                    "Its workers finish the deliveries in hand and take no more until it is \
                     resumed; the rest waits in the queue."
                }
                (_, PauseKind::Exchange) => "Its messages are published again, in order.",
                (_, PauseKind::Consumer) => "Its workers take deliveries again.",
            };
            Some(Confirm {
                title: format!(
                    "{} {kind} {name}?",
                    if verb == "pause" { "Pause" } else { "Resume" }
                ),
                text: text.to_owned(),
                action: format!("{here}/{verb}"),
                hidden: vec![
                    ("csrf", session.csrf.clone()),
                    ("kind", kind.as_str().to_owned()),
                    ("name", name),
                ],
                cancel: here.clone(),
                danger: verb == "pause",
            })
        }
        _ => None,
    };
    let notice = match q.notice.as_deref() {
        Some("paused") => Some(
            "Paused: relays obey at their next claim, consumers within a second once \
             the deliveries they hold are handled."
                .to_owned(),
        ),
        Some("resumed") => Some("Resumed.".to_owned()),
        _ => None,
    };
    render(
        StatusCode::OK,
        &PausesPage {
            chrome: chrome(&ui, &session, "pauses").await,
            here,
            rows,
            notice,
            confirm,
        },
    )
}

async fn act(
    ui: &crate::ui::Ui,
    session: &Session,
    headers: &HeaderMap,
    form: Result<Form<PauseForm>, FormRejection>,
    pause: bool,
) -> Page {
    let form = form.map(|Form(f)| f).unwrap_or_default();
    check_write(session, headers, form.csrf.as_deref())?;
    let kind = kind_of(form.kind.as_deref())?;
    let name = crate::params::text("name", form.name.unwrap_or_default())?;
    let actor = &session.actor.name;
    let notice = if pause {
        ui.service.pause(actor, kind, &name).await?;
        "paused"
    } else {
        ui.service.resume(actor, kind, &name).await?;
        "resumed"
    };
    Ok(redirect(&ui.at(&format!("/pauses?notice={notice}"))))
}

/// `POST <base>/pauses/pause`.
pub(crate) async fn pause(
    State(ui): UiState,
    Extension(session): Extension<Session>,
    headers: HeaderMap,
    form: Result<Form<PauseForm>, FormRejection>,
) -> Page {
    act(&ui, &session, &headers, form, true).await
}

/// `POST <base>/pauses/resume`.
pub(crate) async fn resume(
    State(ui): UiState,
    Extension(session): Extension<Session>,
    headers: HeaderMap,
    form: Result<Form<PauseForm>, FormRejection>,
) -> Page {
    act(&ui, &session, &headers, form, false).await
}
