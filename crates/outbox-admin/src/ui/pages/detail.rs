//! One message (with every consumer's side) or one delivery, with the actions its
//! status allows.

use askama::Template;
use axum::Extension;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use outbox_core::{InboxStatus, OutboxStatus};
use outbox_ports::{deletable_statuses, requeueable_statuses};

use super::{Chrome, Confirm, DetailQuery, UiState, chrome, notice_text, path, query};
use crate::model::MessageDetail;
use crate::params::{Side, parse_message_id};
use crate::ui::filters::encode;
use crate::ui::render::render;
use crate::ui::session::Session;
use crate::ui::view::{self, Badge, PayloadView};
use crate::ui::{Page, Ui};

struct DeliveryRow {
    consumer: String,
    href: String,
    badge: Badge,
    attempts: u32,
    last_error: String,
    consumed_at: String,
}

/// One entry of the page's history, newest first: a failed attempt, or what an
/// operator did to it (requeued, reconsumed, made due, ...), which starts a new
/// run of attempts.
struct HistoryRow {
    /// "Attempt 3 failed", "Requeued by ops-alice".
    what: String,
    /// An operator's action (drawn as a run's boundary).
    action: bool,
    at: String,
    ago: String,
    /// How long after the entry below it ("+12 s"); empty for the oldest.
    gap: String,
    error: String,
}

/// An action's name as the history reads it.
fn acted(action: &str) -> &str {
    match action {
        "requeue" => "Requeued",
        "reconsume" => "Reconsumed",
        "publish_now" => "Made due now",
        "delete" | "delete_forced" => "Deleted",
        other => other,
    }
}

/// `b - a` as an operator reads a spacing: "+850 ms", "+12 s", "+3 min", "+2 h".
fn spacing(a: &str, b: &str) -> String {
    let parse = |t: &str| {
        time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).ok()
    };
    let (Some(a), Some(b)) = (parse(a), parse(b)) else {
        return String::new();
    };
    let ms = (b - a).whole_milliseconds().max(0);
    match ms {
        ms if ms < 1_000 => format!("+{ms} ms"),
        ms if ms < 120_000 => format!("+{} s", ms / 1_000),
        ms if ms < 7_200_000 => format!("+{} min", ms / 60_000),
        ms => format!("+{} h", ms / 3_600_000),
    }
}

/// The edit-and-replay form of a dead message (only with editing on).
struct ReplayEdit {
    action: String,
    csrf: String,
    payload: String,
    headers: String,
    /// Whether the original may have been delivered, and what the replay does then.
    reached: String,
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
    history: Vec<HistoryRow>,
    /// Failed attempts before the last requeue or reconsume (earlier runs), when
    /// there was one: the attempts count starts again at each.
    earlier_failures: Option<usize>,
    /// The last error shown is an earlier attempt's (the message was sent or
    /// consumed since, or requeued and not tried yet).
    last_error_earlier: bool,
    /// How many failed attempts a record keeps.
    kept: usize,
    actions: Vec<ActionButton>,
    confirm: Option<Confirm>,
    notice: Option<String>,
    replay: Option<ReplayEdit>,
    replayed_from_href: Option<String>,
    replayed_as_href: Option<String>,
}

#[allow(clippy::too_many_arguments)]
async fn detail_page(
    ui: &Ui,
    session: &Session,
    d: MessageDetail,
    side: Side,
    here: String,
    back: (String, String),
    post: String,
    q: DetailQuery,
) -> Page {
    // The status as its side names it (the other side's parse is `None`).
    let (outbox_status, inbox_status) = match side {
        Side::Outbox => (d.status.parse::<OutboxStatus>().ok(), None),
        Side::Inbox => (None, d.status.parse::<InboxStatus>().ok()),
    };
    let mut actions = Vec::new();
    if session.can_write() {
        let can = |set: Vec<OutboxStatus>| outbox_status.is_some_and(|s| set.contains(&s));
        match side {
            Side::Outbox => {
                if outbox_status == Some(OutboxStatus::Pending) && d.due_at.is_some() {
                    actions.push(ActionButton {
                        verb: "Publish now",
                        danger: false,
                    });
                }
                // A replayed original is never requeued (its replay carries it).
                if can(requeueable_statuses()) && d.replayed_as.is_none() {
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
                // A replayed original is never reconsumed (its replay carries it).
                if inbox_status.is_some_and(|s| s.can_become(InboxStatus::Received))
                    && d.replayed_as.is_none()
                {
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
            _ if inbox_status == Some(InboxStatus::Consumed) => {
                "It was consumed: its handler runs once more at the consumer's next retry sweep."
            }
            _ => "Its handler runs again at the consumer's next retry sweep.",
        };
        let mut hidden = vec![("csrf", session.csrf.clone())];
        // The operator acts on the status shown: a consumed delivery is reconsumed
        // again only because the page showed it consumed; a failed one the page
        // showed is never run again if its retry consumes it meanwhile.
        if inbox_status == Some(InboxStatus::Consumed) {
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
    // Only what the service would take: a dead, unkeyed, not yet replayed
    // message whose payload shows as text.
    let dead = match side {
        Side::Outbox => outbox_status == Some(OutboxStatus::Dead),
        Side::Inbox => inbox_status == Some(InboxStatus::Dead),
    };
    let replay = (session.can_write()
        && ui.service.edit_allowed()
        && dead
        && d.replayed_as.is_none()
        && d.ordering_key.is_none()
        && !d.payload_base64)
        .then(|| ReplayEdit {
            action: format!("{post}/replay"),
            csrf: session.csrf.clone(),
            payload: d.payload.clone(),
            headers: serde_json::to_string_pretty(&d.headers).unwrap_or_default(),
            reached: match side {
                Side::Outbox => outbox_reached(
                    &d.deliveries
                        .iter()
                        .map(|c| format!("{}: {}", c.consumer, c.status))
                        .collect::<Vec<_>>(),
                ),
                Side::Inbox => "This delivery's handler failed every attempt here: with a \
                    transactional handler nothing it did was kept, otherwise what it did \
                    before failing stays. The replay runs the handler once more."
                    .to_owned(),
            },
        });
    // A replay link stays on its side: a message's to a message, a delivery's to
    // its consumer's delivery.
    let link = |id: &Option<String>| {
        id.as_deref().map(|m| match side {
            Side::Outbox => ui.at(&format!("/messages/{m}")),
            Side::Inbox => ui.at(&format!("/consumers/{}/deliveries/{m}", encode(&back.1))),
        })
    };
    let replayed_from_href = link(&d.replayed_from);
    let replayed_as_href = link(&d.replayed_as);
    let waits_behind_href = d
        .waits_behind
        .as_deref()
        .map(|head| ui.at(&format!("/messages/{head}")));
    // Newest first, as the lists are: the attempt that made it dead on top, and
    // the operators' actions among the attempts, each starting a new run.
    let now = time::OffsetDateTime::now_utc();
    let consumer = (side == Side::Inbox).then_some(back.1.as_str());
    let acted_on = match d.id.parse::<outbox_core::MessageId>() {
        Ok(id) => ui
            .service
            .actions_on(consumer, id)
            .await
            .unwrap_or_default(),
        Err(_) => Vec::new(),
    };
    let last_restart = acted_on
        .iter()
        .filter(|(action, _, _)| action == "requeue" || action == "reconsume")
        .filter_map(|(_, _, at)| at.clone())
        .max();
    let mut entries: Vec<(String, HistoryRow)> = d
        .failed_attempts
        .iter()
        .map(|a| {
            (
                a.at.clone(),
                HistoryRow {
                    what: format!("Attempt {} failed", a.attempt),
                    action: false,
                    at: a.at.clone(),
                    ago: view::ago(&a.at, now),
                    gap: String::new(),
                    error: a.error.clone(),
                },
            )
        })
        .chain(acted_on.iter().filter_map(|(action, actor, at)| {
            let at = at.clone()?;
            Some((
                at.clone(),
                HistoryRow {
                    what: format!("{} by {actor}", acted(action)),
                    action: true,
                    ago: view::ago(&at, now),
                    at,
                    gap: String::new(),
                    error: String::new(),
                },
            ))
        }))
        .collect();
    let instant = |t: &str| {
        time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).ok()
    };
    entries.sort_by_key(|e| std::cmp::Reverse(instant(&e.0)));
    let mut history: Vec<HistoryRow> = entries.into_iter().map(|(_, row)| row).collect();
    for i in 0..history.len().saturating_sub(1) {
        history[i].gap = spacing(&history[i + 1].at, &history[i].at);
    }
    let earlier_failures = last_restart.as_ref().map(|restart| {
        d.failed_attempts
            .iter()
            .filter(|a| instant(&a.at) < instant(restart))
            .count()
    });
    let finished = matches!(d.status.as_str(), "sent" | "consumed");
    let last_error_earlier =
        d.last_error.is_some() && (finished || (last_restart.is_some() && d.attempts == 0));
    let page = DetailPage {
        history,
        earlier_failures,
        last_error_earlier,
        kept: outbox_core::FAILED_ATTEMPTS_KEPT,
        waits_behind_href,
        chrome: chrome(
            ui,
            session,
            if side == Side::Outbox {
                "messages"
            } else {
                "consumers"
            },
        )
        .await,
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
        replay,
        replayed_from_href,
        replayed_as_href,
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
    let q = query(q)?;
    let d = ui.service.get_message(id).await?;
    let here = ui.at(&format!("/messages/{id}"));
    let back = (ui.at("/messages"), "Messages".to_owned());
    detail_page(&ui, &session, d, Side::Outbox, here.clone(), back, here, q).await
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
    let q = query(q)?;
    let d = ui.service.get_delivery(&name, id).await?;
    let here = ui.at(&format!("/consumers/{}/deliveries/{id}", encode(&name)));
    let back = (ui.at(&format!("/consumers/{}", encode(&name))), name);
    detail_page(&ui, &session, d, Side::Inbox, here.clone(), back, here, q).await
}

/// What the replay form says of a dead message's original: which consumers here
/// recorded it (`consumer: status` each), and that the replay, carrying
/// [`outbox_ports::REPLAY_OF_HEADER`], is absorbed by them.
fn outbox_reached(recorded: &[String]) -> String {
    let header = outbox_ports::REPLAY_OF_HEADER;
    if recorded.is_empty() {
        format!(
            "No consumer's inbox here has recorded this message. It may still have reached a \
             queue (a confirm that timed out after it was sent): the replay carries {header}, \
             so a consumer that records the original, now or later, takes the two as one."
        )
    } else {
        format!(
            "The relay gave up on this message, yet {} consumer(s) here recorded it ({}). The \
             replay carries {header}: each of them takes it as this message, a duplicate, and \
             does not handle it again (where it is dead, replay that consumer's delivery \
             instead); a consumer without this library's inbox would.",
            recorded.len(),
            recorded.join(", ")
        )
    }
}
