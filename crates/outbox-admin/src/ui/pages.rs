//! The pages and the actions. Each page reads through the [`crate::AdminService`]
//! as the JSON API does; each action is a POST that carries the session's CSRF
//! token, needs a write session, goes through the same service (so it is audited
//! under the token's name) and redirects back with a notice. Actions are offered
//! behind a confirmation: an in-page dialog whose button is "Confirm"; bulk actions
//! show the dry-run count of what the filter matches first.

use std::sync::Arc;

use askama::Template;
use axum::extract::rejection::{FormRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::{Extension, Form};
use outbox_core::Status;
use outbox_ports::{deletable_statuses, requeueable_statuses};
use serde::Deserialize;

use super::filters::{ListQuery, encode};
use super::render::render;
use super::session::{Session, check_write, redirect};
use super::view::{self, Badge, PayloadView, StatusOption};
use super::{Page, Ui, UiError};
use crate::model::{ConsumerItem, MessageDetail, MessagePage, StatsResponse};
use crate::params::{DEFAULT_BULK_MAX, Side, parse_cursor, parse_dead_letter_id, parse_message_id};
use crate::{AdminError, Role};

type UiState = State<Arc<Ui>>;

/// What every page's frame shows.
pub(crate) struct Chrome {
    pub(crate) base: String,
    pub(crate) home: String,
    pub(crate) csrf: String,
    pub(crate) actor: String,
    pub(crate) role: &'static str,
    pub(crate) can_write: bool,
    pub(crate) theme: &'static str,
    pub(crate) nav: &'static str,
}

fn chrome(ui: &Ui, session: &Session, nav: &'static str) -> Chrome {
    Chrome {
        base: ui.options.base.clone(),
        home: ui.home(),
        csrf: session.csrf.clone(),
        actor: session.actor.name.clone(),
        role: match session.actor.role {
            Role::Read => "read",
            Role::Write => "write",
        },
        can_write: session.can_write(),
        theme: session.theme,
        nav,
    }
}

fn notice_text(notice: Option<&str>) -> Option<String> {
    let text = match notice? {
        "requeued" => "Requeued: the message is pending again.",
        "published-now" => "Due now: the relay publishes it at its next claim.",
        "deleted" => "Deleted.",
        "reconsumed" => {
            "Reconsumed: the delivery goes through the handler again at the next sweep."
        }
        other => {
            // Bulk results come as `<verb>-<changed>`.
            let (verb, n) = other.split_once('-')?;
            let n: u64 = n.parse().ok()?;
            let verb = match verb {
                "requeued" => "Requeued",
                "deleted" => "Deleted",
                "reconsumed" => "Reconsumed",
                _ => return None,
            };
            return Some(format!("{verb} {n}."));
        }
    };
    Some(text.to_owned())
}

// ---------------------------------------------------------------- overview

/// The overview's live numbers.
pub(crate) struct Live {
    pending: u64,
    scheduled: u64,
    publish_failed: u64,
    dead: u64,
    blocked_keys: u64,
    oldest_age: String,
    /// Each consumer with the link to its deliveries.
    consumers: Vec<(String, ConsumerItem)>,
    chart: String,
    published_total: u64,
    consumed_total: u64,
    per_minute: String,
    sweeps: Vec<SweepRow>,
    locks: Vec<(String, String)>,
}

struct SweepRow {
    key: String,
    completed_at: String,
    publish: String,
    consume: String,
}

fn age(seconds: Option<u64>) -> String {
    match seconds {
        None => "none unsent".to_owned(),
        Some(s) if s < 120 => format!("{s} s"),
        Some(s) if s < 7200 => format!("{} min", s / 60),
        Some(s) => format!("{} h {} min", s / 3600, (s % 3600) / 60),
    }
}

fn opt_num(n: Option<u64>) -> String {
    n.map_or_else(|| "–".to_owned(), |n| n.to_string())
}

fn live(ui: &Ui, stats: StatsResponse) -> Live {
    let sweeps = stats
        .sweeps
        .into_iter()
        .map(|s| SweepRow {
            completed_at: if s.available {
                s.completed_at.unwrap_or_else(|| "never".to_owned())
            } else {
                "unknown (state store did not answer)".to_owned()
            },
            publish: format!(
                "{} retried, {} failed",
                opt_num(s.publish_retried),
                opt_num(s.publish_failed)
            ),
            consume: format!(
                "{} retried, {} failed",
                opt_num(s.consume_retried),
                opt_num(s.consume_failed)
            ),
            key: s.key,
        })
        .collect();
    let locks = stats
        .locks
        .into_iter()
        .map(|l| {
            let held = match l.held {
                Some(true) => "held: a sweep is running",
                Some(false) => "free",
                None => "unknown (lock service did not answer)",
            };
            (l.key, held.to_owned())
        })
        .collect();
    Live {
        pending: stats.outbox.pending,
        scheduled: stats.outbox.scheduled,
        publish_failed: stats.outbox.publish_failed,
        dead: stats.outbox.dead,
        blocked_keys: stats.outbox.blocked_keys,
        oldest_age: age(stats.outbox.oldest_unsent_age_seconds),
        chart: view::chart_svg(&stats.published_per_minute, &stats.consumed_per_minute),
        published_total: stats.published_per_minute.iter().map(|m| m.count).sum(),
        consumed_total: stats.consumed_per_minute.iter().map(|m| m.count).sum(),
        per_minute: stats.precision.per_minute,
        consumers: stats
            .consumers
            .into_iter()
            .map(|c| (ui.at(&format!("/consumers/{}", encode(&c.name))), c))
            .collect(),
        sweeps,
        locks,
    }
}

#[derive(Template)]
#[template(path = "overview.html")]
struct OverviewPage {
    chrome: Chrome,
    live: Live,
    paused: bool,
}

#[derive(Template)]
#[template(path = "overview_live.html")]
struct LiveFragment {
    chrome: Chrome,
    live: Live,
    paused: bool,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct OverviewQuery {
    paused: Option<String>,
}

/// `GET <base>/`: counts, oldest unsent age, the chart, the sweeps; refreshed
/// every 5 s by htmx unless paused.
pub(crate) async fn overview(
    State(ui): UiState,
    Extension(session): Extension<Session>,
    q: Result<Query<OverviewQuery>, QueryRejection>,
) -> Page {
    let paused = q.is_ok_and(|Query(q)| q.paused.is_some_and(|p| p == "1"));
    let stats = ui.service.stats().await?;
    render(
        StatusCode::OK,
        &OverviewPage {
            chrome: chrome(&ui, &session, "overview"),
            live: live(&ui, stats),
            paused,
        },
    )
}

/// `GET <base>/overview/live`: the overview's numbers alone (what htmx polls).
pub(crate) async fn overview_live(
    State(ui): UiState,
    Extension(session): Extension<Session>,
) -> Page {
    let stats = ui.service.stats().await?;
    render(
        StatusCode::OK,
        &LiveFragment {
            chrome: chrome(&ui, &session, "overview"),
            live: live(&ui, stats),
            paused: false,
        },
    )
}

// ---------------------------------------------------------------- lists

struct Row {
    href: String,
    id: String,
    badge: Badge,
    exchange: String,
    routing_key: String,
    message_type: String,
    created_at: String,
    attempts: u32,
    preview: String,
    last_error: String,
}

/// The confirmation dialog of an action.
struct Confirm {
    title: String,
    text: String,
    action: String,
    hidden: Vec<(&'static str, String)>,
    cancel: String,
    danger: bool,
}

struct BulkButton {
    verb: &'static str,
    label: &'static str,
}

/// The inputs' current values.
#[derive(Default)]
struct FilterValues {
    exchange: String,
    routing_key: String,
    message_type: String,
    created_after: String,
    created_before: String,
    q: String,
}

#[derive(Template)]
#[template(path = "messages.html")]
struct ListPage {
    chrome: Chrome,
    title: String,
    intro: String,
    list_href: String,
    statuses: Vec<StatusOption>,
    legend: Vec<(&'static str, &'static str)>,
    values: FilterValues,
    rows: Vec<Row>,
    next: Option<String>,
    first: Option<String>,
    hidden: Vec<(&'static str, String)>,
    bulk: Vec<BulkButton>,
    confirm: Option<Confirm>,
    notice: Option<String>,
    error: Option<String>,
}

fn values(q: &ListQuery) -> FilterValues {
    let v = |o: &Option<String>| o.clone().unwrap_or_default();
    FilterValues {
        exchange: v(&q.exchange),
        routing_key: v(&q.routing_key),
        message_type: v(&q.message_type),
        created_after: v(&q.created_after),
        created_before: v(&q.created_before),
        q: v(&q.q),
    }
}

/// What differs between the outbox's list and a consumer's.
struct ListKind {
    side: Side,
    title: String,
    intro: String,
    list_href: String,
    /// Where a row links: this plus `/<id>`.
    item_href: String,
    bulk: Vec<BulkButton>,
    /// Where each bulk verb posts.
    bulk_href: String,
}

fn rows(kind: &ListKind, page: MessagePage) -> Vec<Row> {
    page.items
        .into_iter()
        .map(|m| Row {
            href: format!("{}/{}", kind.item_href, m.id),
            badge: view::message_badge(&m.status, m.due_at.as_deref()),
            exchange: m.exchange,
            routing_key: m.routing_key,
            message_type: m.message_type.unwrap_or_default(),
            created_at: m.created_at,
            attempts: m.attempts,
            preview: view::preview(&m.payload_preview, m.payload_preview_base64, 80),
            last_error: m
                .last_error
                .map(|e| view::preview(&e, false, 80))
                .unwrap_or_default(),
            id: m.id,
        })
        .collect()
}

/// A list of messages (`consumer: None`) or of one consumer's deliveries.
async fn list(
    ui: &Ui,
    session: &Session,
    mut kind: ListKind,
    consumer: Option<&str>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Page {
    let nav = if consumer.is_some() {
        "consumers"
    } else {
        "messages"
    };
    let q = match q {
        Ok(Query(q)) => q,
        Err(e) => return Err(AdminError::bad("bad_query", e.body_text()).into()),
    };
    let mut page = ListPage {
        chrome: chrome(ui, session, nav),
        title: kind.title.clone(),
        intro: kind.intro.clone(),
        list_href: kind.list_href.clone(),
        statuses: view::status_options(kind.side, q.status.as_deref()),
        legend: view::statuses(kind.side)
            .iter()
            .map(|s| (*s, view::meaning(s)))
            .collect(),
        values: values(&q),
        rows: Vec::new(),
        next: None,
        first: None,
        hidden: q.pairs(),
        bulk: if session.can_write() {
            std::mem::take(&mut kind.bulk)
        } else {
            Vec::new()
        },
        confirm: None,
        notice: notice_text(q.notice.as_deref()),
        error: None,
    };
    let parsed = q
        .filter(kind.side)
        .and_then(|filter| q.page().map(|(cursor, limit)| (filter, cursor, limit)));
    let (filter, cursor, limit) = match parsed {
        Ok(parsed) => parsed,
        Err(e) => {
            page.error = Some(e.to_string());
            page.bulk = Vec::new();
            return render(e.status_and_code().0, &page);
        }
    };
    let result = match consumer {
        None => ui.service.list_messages(&filter, cursor, limit).await?,
        Some(name) => {
            ui.service
                .list_deliveries(name, &filter, cursor, limit)
                .await?
        }
    };
    page.next = result
        .next_cursor
        .as_deref()
        .map(|c| format!("{}?{}", kind.list_href, q.query_string(&[("cursor", c)])));
    if cursor.is_some() {
        page.first = Some(format!("{}?{}", kind.list_href, q.query_string(&[])));
    }
    page.rows = rows(&kind, result);
    let verb = q.confirm.as_deref();
    if let Some(button) = page.bulk.iter().find(|b| Some(b.verb) == verb) {
        // A dry run: counted, nothing changed, nothing audited.
        let actor = session.actor.name.as_str();
        let matched = match consumer {
            None => {
                ui.service
                    .requeue_matching(actor, &filter, String::new(), true, DEFAULT_BULK_MAX)
                    .await?
            }
            Some(name) => {
                ui.service
                    .reconsume_matching(actor, name, &filter, String::new(), true, DEFAULT_BULK_MAX)
                    .await?
            }
        }
        .matched;
        let what = if consumer.is_some() {
            "deliveries"
        } else {
            "messages"
        };
        let scope = if page.hidden.iter().any(|(k, _)| *k != "limit") {
            "match this filter"
        } else {
            "exist (no filter: every one)"
        };
        let capped = if matched >= DEFAULT_BULK_MAX {
            format!(" At most {DEFAULT_BULK_MAX} are acted on at once.")
        } else {
            String::new()
        };
        let only = match button.verb {
            "requeue" => " Only dead and publish-failed ones are requeued.",
            "delete" => " Only dead ones are deleted.",
            _ => {
                " Only dead and consume-failed ones are reconsumed (consumed ones too when the filter says status consumed)."
            }
        };
        let mut hidden = page.hidden.clone();
        hidden.push(("csrf", session.csrf.clone()));
        page.confirm = Some(Confirm {
            title: format!("{} every matching {what}?", button.label),
            text: format!("Dry run: {matched} {what} {scope}.{only}{capped}"),
            action: format!("{}/{}", kind.bulk_href, button.verb),
            hidden,
            cancel: format!("{}?{}", kind.list_href, q.query_string(&[])),
            danger: button.verb == "delete",
        });
    }
    render(StatusCode::OK, &page)
}

/// `GET <base>/messages`: the outbox, filtered by the query string.
pub(crate) async fn messages(
    State(ui): UiState,
    Extension(session): Extension<Session>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Page {
    let kind = ListKind {
        side: Side::Outbox,
        title: "Messages".to_owned(),
        intro: "The outbox, newest first.".to_owned(),
        list_href: ui.at("/messages"),
        item_href: ui.at("/messages"),
        bulk: vec![
            BulkButton {
                verb: "requeue",
                label: "Requeue",
            },
            BulkButton {
                verb: "delete",
                label: "Delete",
            },
        ],
        bulk_href: ui.at("/messages"),
    };
    list(&ui, &session, kind, None, q).await
}

/// `GET <base>/consumers/{name}`: one consumer's deliveries.
pub(crate) async fn deliveries(
    State(ui): UiState,
    Extension(session): Extension<Session>,
    name: Result<Path<String>, PathRejection>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Page {
    let name = crate::params::text("consumer", path(name)?)?;
    let at = ui.at(&format!("/consumers/{}", encode(&name)));
    let kind = ListKind {
        side: Side::Inbox,
        title: format!("Deliveries of {name}"),
        intro: format!("What consumer `{name}` received, newest first."),
        list_href: at.clone(),
        item_href: format!("{at}/deliveries"),
        bulk: vec![BulkButton {
            verb: "reconsume",
            label: "Reconsume",
        }],
        bulk_href: at,
    };
    list(&ui, &session, kind, Some(&name), q).await
}

fn path<T>(p: Result<Path<T>, PathRejection>) -> Result<T, UiError> {
    p.map(|Path(p)| p)
        .map_err(|e| AdminError::bad("bad_path", e.body_text()).into())
}

// ---------------------------------------------------------------- detail

struct DeliveryRow {
    consumer: String,
    href: String,
    badge: Badge,
    attempts: u32,
    last_error: String,
    consumed_at: String,
}

struct ActionButton {
    verb: &'static str,
    danger: bool,
}

#[derive(Template)]
#[template(path = "message.html")]
struct DetailPage {
    chrome: Chrome,
    /// The head a waiting keyed message waits behind.
    waits_behind_href: Option<String>,
    title: String,
    here: String,
    back: String,
    back_label: String,
    d: MessageDetail,
    badge: Badge,
    headers: Vec<(String, String)>,
    payload: PayloadView,
    show_all: Option<String>,
    deliveries: Vec<DeliveryRow>,
    actions: Vec<ActionButton>,
    confirm: Option<Confirm>,
    notice: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct DetailQuery {
    confirm: Option<String>,
    notice: Option<String>,
    all: Option<String>,
}

fn detail_query(q: Result<Query<DetailQuery>, QueryRejection>) -> Result<DetailQuery, UiError> {
    q.map(|Query(q)| q)
        .map_err(|e| AdminError::bad("bad_query", e.body_text()).into())
}

#[allow(clippy::too_many_arguments)]
fn detail_page(
    ui: &Ui,
    session: &Session,
    d: MessageDetail,
    side: Side,
    here: String,
    back: (String, String),
    post: String,
    q: DetailQuery,
) -> Page {
    let status = side.parse_status(&d.status).ok();
    let mut actions = Vec::new();
    if session.can_write() {
        let can = |set: Vec<Status>| status.is_some_and(|s| set.contains(&s));
        match side {
            Side::Outbox => {
                if status == Some(Status::Pending) && d.due_at.is_some() {
                    actions.push(ActionButton {
                        verb: "Publish now",
                        danger: false,
                    });
                }
                if can(requeueable_statuses()) {
                    actions.push(ActionButton {
                        verb: "Requeue",
                        danger: false,
                    });
                }
                if can(deletable_statuses(false)) {
                    actions.push(ActionButton {
                        verb: "Delete",
                        danger: true,
                    });
                }
            }
            Side::Inbox => {
                if status.is_some_and(|s| s.can_become(Status::Sent)) {
                    actions.push(ActionButton {
                        verb: "Reconsume",
                        danger: false,
                    });
                }
            }
        }
    }
    let mut released = String::new();
    let confirm = q.confirm.as_deref().and_then(|verb| {
        let action = actions.iter().find(|a| a.verb.eq_ignore_ascii_case(verb))?;
        let what = match side {
            Side::Outbox => format!("message {}", d.id),
            Side::Inbox => format!("delivery {} of {}", d.id, back.1),
        };
        let text = match action.verb {
            "Requeue" => "It goes back to pending and is published again.",
            "Publish now" => {
                "It is published at the relay's next claim, without waiting for its due time."
            }
            "Delete" => match (d.ordering_key.as_deref(), d.waiting_behind) {
                (Some(key), Some(n)) if n > 0 => {
                    released = format!(
                        "It is removed from the outbox for good. It heads ordering key {key}: \
                         the {n}{} message(s) waiting behind it are released and published, in order.",
                        if n >= outbox_ports::BLOCKED_WAITING_CAP { " or more" } else { "" }
                    );
                    released.as_str()
                }
                _ => "It is removed from the outbox for good.",
            },
            _ if status == Some(Status::Consumed) => {
                "It was consumed: its handler runs once more at the consumer's next retry sweep."
            }
            _ => "Its handler runs again at the consumer's next retry sweep.",
        };
        let mut hidden = vec![("csrf", session.csrf.clone())];
        // The operator acts on the status shown: a consumed delivery is reconsumed
        // again only because the page showed it consumed; a failed one the page
        // showed is never run again if its retry consumes it meanwhile.
        if side == Side::Inbox && status == Some(Status::Consumed) {
            hidden.push(("again", "true".to_owned()));
        }
        Some(Confirm {
            title: format!("{} {what}?", action.verb),
            text: text.to_owned(),
            action: format!(
                "{post}/{}",
                action.verb.to_ascii_lowercase().replace(' ', "-")
            ),
            hidden,
            cancel: here.clone(),
            danger: action.danger,
        })
    });
    let all = q.all.as_deref() == Some("1");
    let payload = view::payload(&d.payload, d.payload_base64, all);
    let show_all = (payload.cut && !all).then(|| format!("{here}?all=1"));
    let deliveries = match side {
        Side::Outbox => d
            .deliveries
            .iter()
            .map(|c| DeliveryRow {
                href: ui.at(&format!(
                    "/consumers/{}/deliveries/{}",
                    encode(&c.consumer),
                    d.id
                )),
                consumer: c.consumer.clone(),
                badge: view::badge(&c.status),
                attempts: c.attempts,
                last_error: c.last_error.clone().unwrap_or_default(),
                consumed_at: c.consumed_at.clone().unwrap_or_default(),
            })
            .collect(),
        Side::Inbox => Vec::new(),
    };
    let waits_behind_href = d
        .waits_behind
        .as_deref()
        .map(|head| ui.at(&format!("/messages/{head}")));
    let page = DetailPage {
        waits_behind_href,
        chrome: chrome(
            ui,
            session,
            if side == Side::Outbox {
                "messages"
            } else {
                "consumers"
            },
        ),
        title: match side {
            Side::Outbox => format!("Message {}", d.id),
            Side::Inbox => format!("Delivery {} to {}", d.id, back.1),
        },
        here,
        back: back.0,
        back_label: back.1,
        badge: view::message_badge(&d.status, d.due_at.as_deref()),
        headers: d
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        payload,
        show_all,
        deliveries,
        actions,
        confirm,
        notice: notice_text(q.notice.as_deref()),
        d,
    };
    render(StatusCode::OK, &page)
}

/// `GET <base>/messages/{id}`.
pub(crate) async fn message(
    State(ui): UiState,
    Extension(session): Extension<Session>,
    id: Result<Path<String>, PathRejection>,
    q: Result<Query<DetailQuery>, QueryRejection>,
) -> Page {
    let id = parse_message_id(&path(id)?)?;
    let q = detail_query(q)?;
    let d = ui.service.get_message(id).await?;
    let here = ui.at(&format!("/messages/{id}"));
    let back = (ui.at("/messages"), "Messages".to_owned());
    detail_page(&ui, &session, d, Side::Outbox, here.clone(), back, here, q)
}

/// `GET <base>/consumers/{name}/deliveries/{id}`.
pub(crate) async fn delivery(
    State(ui): UiState,
    Extension(session): Extension<Session>,
    p: Result<Path<(String, String)>, PathRejection>,
    q: Result<Query<DetailQuery>, QueryRejection>,
) -> Page {
    let (name, id) = path(p)?;
    let name = crate::params::text("consumer", name)?;
    let id = parse_message_id(&id)?;
    let q = detail_query(q)?;
    let d = ui.service.get_delivery(&name, id).await?;
    let here = ui.at(&format!("/consumers/{}/deliveries/{id}", encode(&name)));
    let back = (ui.at(&format!("/consumers/{}", encode(&name))), name);
    detail_page(&ui, &session, d, Side::Inbox, here.clone(), back, here, q)
}

// ---------------------------------------------------------------- actions

#[derive(Debug, Default, Deserialize)]
pub(crate) struct ActionForm {
    csrf: Option<String>,
    /// Reconsume: the delivery was shown consumed and is to run once more.
    again: Option<String>,
}

fn action_form(form: Result<Form<ActionForm>, FormRejection>) -> ActionForm {
    // A body that is not a form has no CSRF token: refused as such below.
    form.map(|Form(f)| f).unwrap_or_default()
}

/// `POST <base>/messages/{id}/requeue`.
pub(crate) async fn requeue(
    State(ui): UiState,
    Extension(session): Extension<Session>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
    form: Result<Form<ActionForm>, FormRejection>,
) -> Page {
    check_write(&session, &headers, action_form(form).csrf.as_deref())?;
    let id = parse_message_id(&path(id)?)?;
    ui.service.requeue_message(&session.actor.name, id).await?;
    Ok(redirect(&ui.at(&format!("/messages/{id}?notice=requeued"))))
}

/// `POST <base>/messages/{id}/publish-now`.
pub(crate) async fn publish_now(
    State(ui): UiState,
    Extension(session): Extension<Session>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
    form: Result<Form<ActionForm>, FormRejection>,
) -> Page {
    check_write(&session, &headers, action_form(form).csrf.as_deref())?;
    let id = parse_message_id(&path(id)?)?;
    ui.service.publish_now(&session.actor.name, id).await?;
    Ok(redirect(
        &ui.at(&format!("/messages/{id}?notice=published-now")),
    ))
}

/// `POST <base>/messages/{id}/delete`.
pub(crate) async fn delete(
    State(ui): UiState,
    Extension(session): Extension<Session>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
    form: Result<Form<ActionForm>, FormRejection>,
) -> Page {
    check_write(&session, &headers, action_form(form).csrf.as_deref())?;
    let id = parse_message_id(&path(id)?)?;
    ui.service
        .delete_message(&session.actor.name, id, false)
        .await?;
    Ok(redirect(&ui.at("/messages?notice=deleted")))
}

/// `POST <base>/consumers/{name}/deliveries/{id}/reconsume`.
pub(crate) async fn reconsume(
    State(ui): UiState,
    Extension(session): Extension<Session>,
    headers: HeaderMap,
    p: Result<Path<(String, String)>, PathRejection>,
    form: Result<Form<ActionForm>, FormRejection>,
) -> Page {
    let form = action_form(form);
    check_write(&session, &headers, form.csrf.as_deref())?;
    let (name, id) = path(p)?;
    let name = crate::params::text("consumer", name)?;
    let id = parse_message_id(&id)?;
    let again = form.again.as_deref() == Some("true");
    ui.service
        .reconsume(&session.actor.name, &name, id, again)
        .await?;
    Ok(redirect(&ui.at(&format!(
        "/consumers/{}/deliveries/{id}?notice=reconsumed",
        encode(&name)
    ))))
}

fn bulk_form(form: Result<Form<ListQuery>, FormRejection>) -> Result<ListQuery, UiError> {
    form.map(|Form(f)| f)
        .map_err(|e| AdminError::bad("bad_body", e.body_text()).into())
}

/// A bulk action's form, once the session may write and its CSRF token matches.
fn checked_bulk_form(
    session: &Session,
    headers: &HeaderMap,
    form: Result<Form<ListQuery>, FormRejection>,
) -> Result<ListQuery, UiError> {
    let csrf = form.as_ref().ok().and_then(|Form(f)| f.csrf.clone());
    check_write(session, headers, csrf.as_deref())?;
    bulk_form(form)
}

/// Back to the filtered list `at`, telling how many the bulk action `verb` changed.
fn bulk_done(at: &str, q: &ListQuery, verb: &str, changed: u64) -> Response {
    let notice = format!("{verb}-{changed}");
    redirect(&format!("{at}?{}", q.query_string(&[("notice", &notice)])))
}

fn filter_target(q: &ListQuery) -> String {
    serde_json::to_string(&q.body()).unwrap_or_else(|_| "{}".to_owned())
}

/// `POST <base>/messages/requeue`: everything matching the form's filter.
pub(crate) async fn bulk_requeue(
    State(ui): UiState,
    Extension(session): Extension<Session>,
    headers: HeaderMap,
    form: Result<Form<ListQuery>, FormRejection>,
) -> Page {
    let q = checked_bulk_form(&session, &headers, form)?;
    let filter = q.filter(Side::Outbox)?;
    let done = ui
        .service
        .requeue_matching(
            &session.actor.name,
            &filter,
            filter_target(&q),
            false,
            DEFAULT_BULK_MAX,
        )
        .await?;
    Ok(bulk_done(&ui.at("/messages"), &q, "requeued", done.changed))
}

/// `POST <base>/messages/delete`: every dead message matching the form's filter.
pub(crate) async fn bulk_delete(
    State(ui): UiState,
    Extension(session): Extension<Session>,
    headers: HeaderMap,
    form: Result<Form<ListQuery>, FormRejection>,
) -> Page {
    let q = checked_bulk_form(&session, &headers, form)?;
    let filter = q.filter(Side::Outbox)?;
    let done = ui
        .service
        .delete_matching(
            &session.actor.name,
            &filter,
            filter_target(&q),
            false,
            DEFAULT_BULK_MAX,
            false,
        )
        .await?;
    Ok(bulk_done(&ui.at("/messages"), &q, "deleted", done.changed))
}

/// `POST <base>/consumers/{name}/reconsume`: a consumer's deliveries matching the
/// form's filter.
pub(crate) async fn bulk_reconsume(
    State(ui): UiState,
    Extension(session): Extension<Session>,
    headers: HeaderMap,
    name: Result<Path<String>, PathRejection>,
    form: Result<Form<ListQuery>, FormRejection>,
) -> Page {
    let q = checked_bulk_form(&session, &headers, form)?;
    let name = crate::params::text("consumer", path(name)?)?;
    let filter = q.filter(Side::Inbox)?;
    let done = ui
        .service
        .reconsume_matching(
            &session.actor.name,
            &name,
            &filter,
            filter_target(&q),
            false,
            DEFAULT_BULK_MAX,
        )
        .await?;
    Ok(bulk_done(
        &ui.at(&format!("/consumers/{}", encode(&name))),
        &q,
        "reconsumed",
        done.changed,
    ))
}

// ---------------------------------------------------------------- consumers

struct ConsumerRow {
    href: String,
    dead_href: String,
    item: ConsumerItem,
    consumed: String,
}

#[derive(Template)]
#[template(path = "consumers.html")]
struct ConsumersPage {
    chrome: Chrome,
    rows: Vec<ConsumerRow>,
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
            chrome: chrome(&ui, &session, "consumers"),
            rows,
        },
    )
}

// ---------------------------------------------------------------- dead letters

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
    let q = q
        .map(|Query(q)| q)
        .map_err(|e| AdminError::bad("bad_query", e.body_text()))?;
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
            chrome: chrome(&ui, &session, "overview"),
            rows,
            next,
        },
    )
}

/// `GET <base>/dead-letters`: deliveries that could not become messages.
pub(crate) async fn dead_letters(
    State(ui): UiState,
    Extension(session): Extension<Session>,
    q: Result<Query<LettersQuery>, QueryRejection>,
) -> Page {
    let q = q
        .map(|Query(q)| q)
        .map_err(|e| AdminError::bad("bad_query", e.body_text()))?;
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
            chrome: chrome(&ui, &session, "dead-letters"),
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
    let q = detail_query(q)?;
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
            chrome: chrome(&ui, &session, "dead-letters"),
            show_all: (body.cut && !all).then(|| format!("{here}?all=1")),
            here,
            letter,
            body,
            confirm,
        },
    )
}

/// `POST <base>/dead-letters/{id}/delete`.
pub(crate) async fn delete_dead_letter(
    State(ui): UiState,
    Extension(session): Extension<Session>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
    form: Result<Form<ActionForm>, FormRejection>,
) -> Page {
    check_write(&session, &headers, action_form(form).csrf.as_deref())?;
    let id = parse_dead_letter_id(&path(id)?)?;
    ui.service
        .delete_dead_letter(&session.actor.name, id)
        .await?;
    Ok(redirect(&ui.at("/dead-letters?notice=deleted")))
}

// ---------------------------------------------------------------- audit

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
    let q = q
        .map(|Query(q)| q)
        .map_err(|e| AdminError::bad("bad_query", e.body_text()))?;
    let cursor = parse_cursor(q.cursor.as_deref().filter(|c| !c.is_empty()))?;
    let page = ui
        .service
        .audit_log(cursor, crate::params::DEFAULT_LIMIT)
        .await?;
    render(
        StatusCode::OK,
        &AuditPage {
            chrome: chrome(&ui, &session, "audit"),
            next: page
                .next_cursor
                .map(|c| format!("{}?cursor={c}", ui.at("/audit"))),
            items: page.items,
        },
    )
}
