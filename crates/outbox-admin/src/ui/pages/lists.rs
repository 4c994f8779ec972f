//! The lists: the outbox's messages and one consumer's deliveries, filtered by
//! the query string, with their bulk actions behind a dry-run confirmation.

use askama::Template;
use axum::Extension;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;

use super::{Chrome, Confirm, UiState, chrome, notice_text, path, query};
use crate::model::MessagePage;
use outbox_ports::{DeliveryFilter, MessageFilter};

use crate::params::{DEFAULT_BULK_MAX, Side};
use crate::ui::filters::{ListQuery, with_query};
use crate::ui::render::render;
use crate::ui::session::Session;
use crate::ui::view::{self, Badge, StatusOption};
use crate::ui::{Page, Ui};

struct Row {
    href: String,
    id: String,
    /// The id's first characters (the full one in the tooltip).
    short_id: String,
    /// How long ago `at` was (`at`, UTC, in the tooltip).
    ago: String,
    badge: Badge,
    exchange: String,
    routing_key: String,
    message_type: String,
    /// Created (a message) or received (a delivery): the time the list's order
    /// follows.
    at: String,
    attempts: u32,
    preview: String,
    last_error: String,
}

/// A status tab above a list: every one of that status (the other filters kept),
/// with how many there are when the list is not otherwise filtered.
struct Tab {
    label: &'static str,
    /// What the status means (the tab's tooltip).
    meaning: &'static str,
    count: Option<u64>,
    href: String,
    current: bool,
}

/// The tabs of a list: "all", then each of its side's statuses. `counts` are the
/// whole list's (the outbox, or one consumer's); they are left out while another
/// filter is set, as a count of the whole would not be what the tab shows.
fn tabs(
    side: Side,
    list_href: &str,
    q: &ListQuery,
    counts: &[(&'static str, Option<u64>)],
) -> Vec<Tab> {
    let others: Vec<(&'static str, String)> = q
        .pairs()
        .into_iter()
        .filter(|(k, _)| *k != "status")
        .collect();
    let filtered = others.iter().any(|(k, _)| *k != "limit");
    let current = q.status.as_deref().filter(|s| !s.is_empty());
    let href = |status: Option<&str>| {
        with_query(
            list_href,
            others
                .iter()
                .map(|(k, v)| (*k, v.as_str()))
                .chain(status.map(|s| ("status", s))),
        )
    };
    let mut tabs = vec![Tab {
        label: "all",
        meaning: "every status",
        count: None,
        href: href(None),
        current: current.is_none(),
    }];
    for status in view::statuses(side).iter().copied() {
        tabs.push(Tab {
            label: status,
            meaning: view::meaning(status),
            count: if filtered {
                None
            } else {
                counts
                    .iter()
                    .find(|(name, _)| *name == status)
                    .and_then(|(_, n)| *n)
            },
            href: href(Some(status)),
            current: current == Some(status),
        });
    }
    tabs
}

struct BulkButton {
    verb: &'static str,
    label: &'static str,
}

/// The page sizes a list offers (the API takes any from 1 to 1,000).
const PAGE_SIZES: [u32; 5] = [50, 100, 200, 500, 1000];
/// A list's page size when none is asked for (the API's default).
const DEFAULT_PAGE_SIZE: u32 = 50;

/// [`PAGE_SIZES`], with `shown` among them (a size asked for in the URL).
fn page_sizes(shown: u32) -> Vec<u32> {
    let mut sizes = PAGE_SIZES.to_vec();
    if !sizes.contains(&shown) {
        sizes.push(shown);
        sizes.sort_unstable();
    }
    sizes
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
    error: String,
    sort: String,
}

#[derive(Template)]
#[template(path = "messages.html")]
struct ListPage {
    chrome: Chrome,
    title: String,
    /// The time column's heading: "Created" (messages) or "Received" (deliveries).
    at_heading: &'static str,
    intro: String,
    list_href: String,
    tabs: Vec<Tab>,
    /// Where the tabs are read again when a number changes (the live feed).
    tabs_href: String,
    statuses: Vec<StatusOption>,
    legend: Vec<(&'static str, &'static str)>,
    values: FilterValues,
    /// The page sizes offered, and the one shown.
    page_sizes: Vec<u32>,
    page_size: u32,
    rows: Vec<Row>,
    next: Option<String>,
    first: Option<String>,
    hidden: Vec<(&'static str, String)>,
    bulk: Vec<BulkButton>,
    /// Where the selection form posts (the rows ticked, acted on one by one).
    select_href: String,
    confirm: Option<Confirm>,
    notice: Option<String>,
    error: Option<String>,
}

impl FilterValues {
    /// A filter folded under "More filters" is set: the fold opens.
    fn more_set(&self) -> bool {
        [
            &self.routing_key,
            &self.message_type,
            &self.created_after,
            &self.created_before,
        ]
        .iter()
        .any(|v| !v.is_empty())
    }
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
        error: v(&q.error),
        sort: v(&q.sort),
    }
}

/// A list's filter: the outbox's, or a consumer's deliveries'.
enum SideFilter<'a> {
    Outbox(MessageFilter),
    Inbox(&'a str, DeliveryFilter),
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
    let now = time::OffsetDateTime::now_utc();
    page.items
        .into_iter()
        .map(|m| Row {
            short_id: view::short_id(&m.id),
            ago: view::ago(m.received_at.as_deref().unwrap_or(&m.created_at), now),
            href: format!("{}/{}", kind.item_href, m.id),
            badge: view::message_badge(&m.status, m.due_at.as_deref()),
            exchange: m.exchange,
            routing_key: m.routing_key,
            message_type: m.message_type.unwrap_or_default(),
            // A delivery list follows arrival (newest first): its time column is
            // when each was received, not when its producer made it.
            at: m.received_at.unwrap_or(m.created_at),
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

/// Where a list's tabs are read alone: `<list>/tabs` with the list's filters.
fn tabs_href(list_href: &str, q: &ListQuery) -> String {
    let pairs = q.pairs();
    with_query(
        &format!("{list_href}/tabs"),
        pairs.iter().map(|(k, v)| (*k, v.as_str())),
    )
}

/// A list's status tabs alone: what the page swaps in when the live feed says a
/// number changed. The rows stay as they are (an operator may be ticking them).
#[derive(Template)]
#[template(path = "tabs.html")]
struct TabsFragment {
    tabs: Vec<Tab>,
    tabs_href: String,
}

async fn tabs_fragment(
    ui: &Ui,
    list_href: String,
    side: Side,
    consumer: Option<&str>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Page {
    let q = query(q)?;
    let counts = ui.service.status_counts(consumer).await.unwrap_or_default();
    render(
        StatusCode::OK,
        &TabsFragment {
            tabs: tabs(side, &list_href, &q, &counts),
            tabs_href: tabs_href(&list_href, &q),
        },
    )
}

/// `GET <base>/messages/tabs`: the outbox list's tabs.
pub(crate) async fn message_tabs(
    State(ui): UiState,
    Extension(_session): Extension<Session>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Page {
    tabs_fragment(&ui, ui.at("/messages"), Side::Outbox, None, q).await
}

/// `GET <base>/consumers/{name}/tabs`: a consumer's deliveries' tabs.
pub(crate) async fn delivery_tabs(
    State(ui): UiState,
    Extension(_session): Extension<Session>,
    name: Result<Path<String>, PathRejection>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Page {
    let name = crate::params::text("consumer", path(name)?)?;
    let at = ui.consumer_at(&name);
    tabs_fragment(&ui, at, Side::Inbox, Some(&name), q).await
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
    let q = query(q)?;
    // A convenience: a store slow to count (a big backlog under a statement
    // timeout) must not take the list down with it; the tabs then show no counts.
    let counts = match ui.service.status_counts(consumer).await {
        Ok(counts) => counts,
        Err(e) => {
            tracing::debug!(error = %e, "status counts not read");
            Vec::new()
        }
    };
    let mut page = ListPage {
        tabs: tabs(kind.side, &kind.list_href, &q, &counts),
        tabs_href: tabs_href(&kind.list_href, &q),
        chrome: chrome(ui, session, nav).await,
        title: kind.title.clone(),
        at_heading: if consumer.is_some() {
            "Received"
        } else {
            "Created"
        },
        intro: kind.intro.clone(),
        list_href: kind.list_href.clone(),
        statuses: view::status_options(kind.side, q.status.as_deref()),
        legend: view::statuses(kind.side)
            .iter()
            .map(|s| (*s, view::meaning(s)))
            .collect(),
        values: values(&q),
        page_sizes: page_sizes(q.page().map_or(DEFAULT_PAGE_SIZE, |(_, limit)| limit)),
        page_size: q.page().map_or(DEFAULT_PAGE_SIZE, |(_, limit)| limit),
        rows: Vec::new(),
        next: None,
        first: None,
        hidden: q.pairs(),
        bulk: if session.can_write() {
            std::mem::take(&mut kind.bulk)
        } else {
            Vec::new()
        },
        select_href: format!("{}/selected", kind.bulk_href),
        confirm: None,
        notice: notice_text(q.notice.as_deref()),
        error: None,
    };
    // The filter of the list's side: each side parses only its own status names.
    let filter = match consumer {
        None => q.filter().map(SideFilter::Outbox),
        Some(name) => q.filter().map(|f| SideFilter::Inbox(name, f)),
    };
    let parsed = filter.and_then(|filter| q.page().map(|(cursor, limit)| (filter, cursor, limit)));
    let (filter, cursor, limit) = match parsed {
        Ok(parsed) => parsed,
        Err(e) => {
            page.error = Some(e.to_string());
            page.bulk = Vec::new();
            return render(e.status_and_code().0, &page);
        }
    };
    let result = match &filter {
        SideFilter::Outbox(f) => ui.service.list_messages(f, cursor, limit).await?,
        SideFilter::Inbox(name, f) => ui.service.list_deliveries(name, f, cursor, limit).await?,
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
        let matched = match &filter {
            SideFilter::Outbox(f) => {
                ui.service
                    .requeue_matching(actor, f, String::new(), true, DEFAULT_BULK_MAX)
                    .await?
            }
            SideFilter::Inbox(name, f) => {
                ui.service
                    .reconsume_matching(actor, name, f, String::new(), true, DEFAULT_BULK_MAX)
                    .await?
            }
        }
        .matched;
        let (one, many) = if consumer.is_some() {
            ("delivery", "deliveries")
        } else {
            ("message", "messages")
        };
        let filtered = page.hidden.iter().any(|(k, _)| *k != "limit");
        let scope = match (filtered, matched == 1) {
            (true, true) => "matches this filter",
            (true, false) => "match this filter",
            (false, true) => "exists (no filter: every one)",
            (false, false) => "exist (no filter: every one)",
        };
        let counted = crate::ui::view::count(matched, one, many);
        // The count is exact; the action's max bounds only what one run changes.
        let capped = if matched > DEFAULT_BULK_MAX {
            format!(
                " One run changes at most {} of them (its max); run it again for the rest.",
                crate::ui::view::thousands(DEFAULT_BULK_MAX)
            )
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
            title: format!("{} every matching {one}?", button.label),
            text: format!("Dry run: {counted} {scope}.{only}{capped}"),
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
    let at = ui.consumer_at(&name);
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
