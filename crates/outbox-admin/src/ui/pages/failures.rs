//! Failures grouped by error, per exchange and per consumer.

use askama::Template;
use axum::extract::rejection::{FormRejection, QueryRejection};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::{Extension, Form};
use serde::Deserialize;

use super::{Chrome, Confirm, UiState, chrome, notice_text, query};
use crate::AdminError;
use crate::params::DEFAULT_BULK_MAX;
use crate::ui::Page;
use crate::ui::filters::encode;
use crate::ui::render::render;
use crate::ui::session::{Session, check_write, redirect};
use crate::ui::view;
use crate::ui::view::count;

struct GroupRow {
    /// With thousands separators.
    count: String,
    /// `exchange orders` or `consumer billing`.
    place: String,
    /// The group's members (every status: failing, dead, and those since sent
    /// or consumed that last failed so), listed.
    members: String,
    /// The group's dead members, listed.
    dead: String,
    /// The group's failing members (waiting for their retry), listed.
    failing: String,
    error: String,
    example: String,
    oldest: String,
    newest: String,
    /// How long ago each was ("5 min ago"), as the lists show times.
    oldest_ago: String,
    newest_ago: String,
    /// `exchange` or `consumer`, and its name: the group's place, for its actions.
    kind: &'static str,
    name: String,
    /// The group's error as the API names it (not shortened), for its actions.
    group: String,
}

#[derive(Template)]
#[template(path = "failures.html")]
struct FailuresPage {
    chrome: Chrome,
    rows: Vec<GroupRow>,
    here: String,
    notice: Option<String>,
    confirm: Option<Confirm>,
}

/// What the failures page is asked: a group action's dialog to open (`confirm` =
/// `requeue`, `delete` or `reconsume`, with the group), or a notice.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct FailuresQuery {
    confirm: Option<String>,
    exchange: Option<String>,
    consumer: Option<String>,
    error: Option<String>,
    notice: Option<String>,
}

/// A group action posted from its dialog.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct GroupForm {
    csrf: Option<String>,
    exchange: Option<String>,
    consumer: Option<String>,
    error: Option<String>,
}

/// What a group action does.
#[derive(Clone, Copy, PartialEq, Eq)]
enum GroupAction {
    Requeue,
    Delete,
    Reconsume,
}

impl GroupAction {
    fn parse(verb: &str) -> Option<Self> {
        match verb {
            "requeue" => Some(Self::Requeue),
            "delete" => Some(Self::Delete),
            "reconsume" => Some(Self::Reconsume),
            _ => None,
        }
    }

    const fn verb(self) -> &'static str {
        match self {
            Self::Requeue => "requeue",
            Self::Delete => "delete",
            Self::Reconsume => "reconsume",
        }
    }
}

/// The action on the group of `exchange` or `consumer` with `error`: a dry run
/// (`dry_run`) or done; what it matched and changed.
async fn run(
    ui: &crate::ui::Ui,
    actor: &str,
    action: GroupAction,
    exchange: Option<&str>,
    consumer: Option<&str>,
    error: &str,
    dry_run: bool,
) -> Result<crate::model::BulkResponse, AdminError> {
    let s = &ui.service;
    let max = DEFAULT_BULK_MAX;
    let missing = || AdminError::bad("bad_group", "the group's exchange or consumer is missing");
    match action {
        GroupAction::Requeue => {
            let x = exchange.ok_or_else(missing)?;
            s.requeue_failure_group(actor, x, error, dry_run, max).await
        }
        GroupAction::Delete => {
            let x = exchange.ok_or_else(missing)?;
            s.delete_failure_group(actor, x, error, dry_run, max).await
        }
        GroupAction::Reconsume => {
            let c = consumer.ok_or_else(missing)?;
            s.reconsume_failure_group(actor, c, error, dry_run, max)
                .await
        }
    }
}

/// `GET <base>/failures`: the groups of `GET /api/v1/failures`, each linking to the
/// dead messages of its exchange or the dead deliveries of its consumer.
pub(crate) async fn failures(
    State(ui): UiState,
    Extension(session): Extension<Session>,
    q: Result<Query<FailuresQuery>, QueryRejection>,
) -> Page {
    let q = query(q)?;
    let here = ui.at("/failures");
    let mut gone = false;
    let confirm = match (
        q.confirm.as_deref().and_then(GroupAction::parse),
        session.can_write(),
    ) {
        (Some(action), true) => 'dialog: {
            let error = crate::params::text("error", q.error.clone().ok_or_else(no_error)?)?;
            let exchange = q
                .exchange
                .clone()
                .map(|x| crate::params::text("exchange", x))
                .transpose()?;
            let consumer = q
                .consumer
                .clone()
                .map(|c| crate::params::text("consumer", c))
                .transpose()?;
            let counted = match run(
                &ui,
                &session.actor.name,
                action,
                exchange.as_deref(),
                consumer.as_deref(),
                &error,
                true,
            )
            .await
            {
                Ok(counted) => counted,
                // Emptied since the page showed it: the page, and a word on it.
                Err(AdminError::Port(outbox_ports::PortError::NotFound { .. })) => {
                    gone = true;
                    break 'dialog None;
                }
                Err(e) => return Err(e.into()),
            };
            let n = counted.matched;
            let (place, hidden_place) = match (&exchange, &consumer) {
                (Some(x), _) => (format!("exchange {x}"), ("exchange", x.clone())),
                (None, Some(c)) => (format!("consumer {c}"), ("consumer", c.clone())),
                (None, None) => (String::new(), ("exchange", String::new())),
            };
            let text = match action {
                GroupAction::Requeue => format!(
                    "{} of {place}: back to pending, and published again.",
                    count(n, "failing or dead message", "failing or dead messages")
                ),
                GroupAction::Delete => format!(
                    "{} of {place}: removed for good (its failing ones stay).",
                    count(n, "dead message", "dead messages")
                ),
                GroupAction::Reconsume => format!(
                    "{} of {place}: through the handler again at the next sweep.",
                    count(n, "failing or dead delivery", "failing or dead deliveries")
                ),
            };
            Some(Confirm {
                title: format!(
                    "{} the failures \u{201c}{error}\u{201d}?",
                    capitalised(action.verb())
                ),
                text,
                action: format!("{here}/{}", action.verb()),
                hidden: vec![
                    ("csrf", session.csrf.clone()),
                    hidden_place,
                    ("error", error),
                ],
                cancel: here.clone(),
                danger: action == GroupAction::Delete,
            })
        }
        _ => None,
    };
    let groups = ui.service.failure_groups().await?;
    let now = time::OffsetDateTime::now_utc();
    let rows = groups
        .groups
        .into_iter()
        .map(|g| {
            let group = encode(&g.error);
            let (place, list, failing_status) = match (&g.exchange, &g.consumer) {
                (Some(x), _) => (
                    format!("exchange {x}"),
                    format!("/messages?exchange={}&error={group}", encode(x)),
                    "publish_failed",
                ),
                (None, Some(c)) => (
                    format!("consumer {c}"),
                    format!("/consumers/{}?error={group}", encode(c)),
                    "consume_failed",
                ),
                (None, None) => (String::new(), format!("/messages?error={group}"), ""),
            };
            let members = ui.at(&list);
            let dead = ui.at(&format!("{list}&status=dead"));
            let failing = ui.at(&format!("{list}&status={failing_status}"));
            let (kind, name) = match (&g.exchange, &g.consumer) {
                (Some(x), _) => ("exchange", x.clone()),
                (None, Some(c)) => ("consumer", c.clone()),
                (None, None) => ("exchange", String::new()),
            };
            GroupRow {
                kind,
                name,
                group: g.error.clone(),
                count: view::thousands(g.count),
                place,
                members,
                dead,
                failing,
                error: view::preview(&g.error, false, 160),
                example: view::preview(&g.example, false, 160),
                oldest_ago: g
                    .oldest
                    .as_deref()
                    .map(|t| view::ago(t, now))
                    .unwrap_or_default(),
                newest_ago: g
                    .newest
                    .as_deref()
                    .map(|t| view::ago(t, now))
                    .unwrap_or_default(),
                oldest: g.oldest.unwrap_or_default(),
                newest: g.newest.unwrap_or_default(),
            }
        })
        .collect();
    render(
        StatusCode::OK,
        &FailuresPage {
            chrome: chrome(&ui, &session, "failures").await,
            rows,
            here,
            notice: if gone {
                Some("That group holds no failing or dead entry any more.".to_owned())
            } else {
                notice_text(q.notice.as_deref())
            },
            confirm,
        },
    )
}

/// A group action without the group's error: refused, not taken for the group
/// of failures without one.
fn no_error() -> AdminError {
    AdminError::bad("bad_group", "the group's error is missing")
}

fn capitalised(verb: &str) -> String {
    let mut c = verb.chars();
    c.next()
        .map(|f| f.to_uppercase().chain(c).collect())
        .unwrap_or_default()
}

async fn act(
    ui: &crate::ui::Ui,
    session: &Session,
    headers: &HeaderMap,
    form: Result<Form<GroupForm>, FormRejection>,
    action: GroupAction,
) -> Page {
    let form = form.map(|Form(f)| f).unwrap_or_default();
    check_write(session, headers, form.csrf.as_deref())?;
    let error = crate::params::text("error", form.error.ok_or_else(no_error)?)?;
    let exchange = form
        .exchange
        .map(|x| crate::params::text("exchange", x))
        .transpose()?;
    let consumer = form
        .consumer
        .map(|c| crate::params::text("consumer", c))
        .transpose()?;
    let done = run(
        ui,
        &session.actor.name,
        action,
        exchange.as_deref(),
        consumer.as_deref(),
        &error,
        false,
    )
    .await?;
    let verb = match action {
        GroupAction::Requeue => "requeued",
        GroupAction::Delete => "deleted",
        GroupAction::Reconsume => "reconsumed",
    };
    Ok(redirect(
        &ui.at(&format!("/failures?notice={verb}-{}", done.changed)),
    ))
}

/// `POST <base>/failures/requeue`: a group's failing and dead messages.
pub(crate) async fn requeue_group(
    State(ui): UiState,
    Extension(session): Extension<Session>,
    headers: HeaderMap,
    form: Result<Form<GroupForm>, FormRejection>,
) -> Page {
    act(&ui, &session, &headers, form, GroupAction::Requeue).await
}

/// `POST <base>/failures/delete`: a group's dead messages.
pub(crate) async fn delete_group(
    State(ui): UiState,
    Extension(session): Extension<Session>,
    headers: HeaderMap,
    form: Result<Form<GroupForm>, FormRejection>,
) -> Page {
    act(&ui, &session, &headers, form, GroupAction::Delete).await
}

/// `POST <base>/failures/reconsume`: a group's failing and dead deliveries.
pub(crate) async fn reconsume_group(
    State(ui): UiState,
    Extension(session): Extension<Session>,
    headers: HeaderMap,
    form: Result<Form<GroupForm>, FormRejection>,
) -> Page {
    act(&ui, &session, &headers, form, GroupAction::Reconsume).await
}
