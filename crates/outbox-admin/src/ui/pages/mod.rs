//! The pages and the actions, by area. Each page reads through the
//! [`crate::AdminService`] as the JSON API does; each action is a POST that carries
//! the session's CSRF token, needs a write session, goes through the same service
//! (so it is audited under the token's name) and redirects back with a notice.
//! Actions are offered behind a confirmation: an in-page dialog whose button is
//! "Confirm"; bulk actions show the dry-run count of what the filter matches first.
//!
//! - `overview`: the counts, the chart and the sweeps, and their live fragment.
//! - `lists`: the outbox's messages and a consumer's deliveries, filtered.
//! - `detail`: one message or delivery, with its actions.
//! - `actions`: the POSTs (single and bulk requeue, delete, reconsume, ...).
//! - `selection`: bulk actions on the rows ticked in a list.
//! - `throughput`: every exchange's and consumer's totals, and each one's chart.
//! - `consumers`, `blocked_keys`, `failures`, `pauses`, `dead_letters`, `audit`: those
//!   pages.
//!
//! Here: what every page shares (the frame, notices, the confirmation dialog, the
//! path and query extraction). Templates become responses in `super::render`.

mod actions;
mod audit;
mod blocked_keys;
mod consumers;
mod dead_letters;
mod detail;
mod failures;
mod lists;
mod overview;
mod pauses;
mod selection;
mod throughput;

pub(crate) use actions::{
    bulk_delete, bulk_reconsume, bulk_requeue, delete, delete_dead_letter, publish_now, reconsume,
    replay, replay_delivery, requeue,
};
pub(crate) use audit::audit;
pub(crate) use blocked_keys::{blocked_keys, requeue_heads};
pub(crate) use consumers::consumers;
pub(crate) use dead_letters::{dead_letter, dead_letters};
pub(crate) use detail::{delivery, message};
pub(crate) use failures::{delete_group, failures, reconsume_group, requeue_group};
pub(crate) use lists::{deliveries, delivery_tabs, message_tabs, messages};
pub(crate) use overview::{live_fragment, overview, overview_live};
pub(crate) use pauses::{pause, pauses, resume};
pub(crate) use selection::{deliveries_selected, messages_selected};
pub(crate) use throughput::{consumer_chart, exchange_chart, throughput};

use std::sync::Arc;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use serde::Deserialize;

use super::session::Session;
use super::{Ui, UiError};
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
    /// Dead messages, shown beside Messages when there are any.
    pub(crate) dead_messages: u64,
    /// Dead deliveries of every consumer, shown beside Consumers.
    pub(crate) dead_deliveries: u64,
    /// Pauses in force, shown beside Pauses: a paused exchange or consumer
    /// explains a backlog on every page.
    pub(crate) pauses_in_force: u64,
}

/// The frame around every page: who is signed in, the navigation with what is
/// dead. A store that cannot count leaves the counts out (0) rather than failing
/// the page: the page's own read says what is wrong.
async fn chrome(ui: &Ui, session: &Session, nav: &'static str) -> Chrome {
    let (dead_messages, dead_deliveries) = ui.service.dead_counts().await.unwrap_or_default();
    let pauses_in_force = ui.service.pauses_in_force().await.unwrap_or_default();
    Chrome {
        dead_messages,
        dead_deliveries,
        pauses_in_force,
        ..frame(ui, session, nav)
    }
}

impl Chrome {
    /// The frame of what no session is rendered for (the live fragment, which
    /// uses only the mount point): nobody signed in, no token, read only.
    pub(crate) fn bare(ui: &Ui) -> Self {
        Self {
            dead_messages: 0,
            dead_deliveries: 0,
            pauses_in_force: 0,
            base: ui.options.base.clone(),
            home: ui.home(),
            csrf: String::new(),
            actor: String::new(),
            role: "read",
            can_write: false,
            theme: "auto",
            nav: "overview",
        }
    }
}

/// The frame without the dead counts, for a page that has them already (the
/// overview) or a fragment that shows no navigation.
fn frame(ui: &Ui, session: &Session, nav: &'static str) -> Chrome {
    Chrome {
        csrf: session.csrf.clone(),
        actor: session.user.clone(),
        role: match session.actor.role {
            Role::Read => "read",
            Role::Write => "write",
        },
        can_write: session.can_write(),
        theme: session.theme,
        nav,
        ..Chrome::bare(ui)
    }
}

fn notice_text(notice: Option<&str>) -> Option<String> {
    let text = match notice? {
        "requeued" => "Requeued: the message is pending again.",
        "published-now" => "Due now: the relay publishes it at its next claim.",
        "deleted" => "Deleted.",
        "replayed-delivery" => {
            "Replayed: this is the new delivery, handled at the consumer's next retry sweep. The original stays dead, marked replayed."
        }
        "replayed" => {
            "Replayed: this is the new message, pending. The original stays dead, marked replayed."
        }
        "reconsumed" => {
            "Reconsumed: the delivery goes through the handler again at the next sweep."
        }
        "none-selected" => "Nothing was selected: tick the rows to act on first.",
        other => {
            // Bulk results come as `<verb>-<changed>`, a selection's as
            // `<verb>-<changed>-of-<selected>`.
            let (verb, n) = other.split_once('-')?;
            let verb = match verb {
                "requeued" => "Requeued",
                "deleted" => "Deleted",
                "reconsumed" => "Reconsumed",
                _ => return None,
            };
            if let Some((n, of)) = n.split_once("-of-") {
                let (n, of): (u64, u64) = (n.parse().ok()?, of.parse().ok()?);
                // From a URL: a changed count past the selected one is no notice.
                let rest = match of.checked_sub(n)? {
                    0 => String::new(),
                    1 => " The other one was left as it was: its status does not allow it, or it is gone or busy.".to_owned(),
                    others => format!(
                        " The other {others} were left as they were: their status does not allow it, or they are gone or busy."
                    ),
                };
                return Some(format!("{verb} {n} of the {of} selected.{rest}"));
            }
            let n: u64 = n.parse().ok()?;
            return Some(format!("{verb} {n}."));
        }
    };
    Some(text.to_owned())
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

fn opt_num(n: Option<u64>) -> String {
    n.map_or_else(|| "–".to_owned(), |n| n.to_string())
}

fn path<T>(p: Result<Path<T>, PathRejection>) -> Result<T, UiError> {
    p.map(|Path(p)| p)
        .map_err(|e| AdminError::bad("bad_path", e.body_text()).into())
}

/// What a detail page (a message's, a delivery's, a dead letter's) is asked.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct DetailQuery {
    confirm: Option<String>,
    notice: Option<String>,
    all: Option<String>,
}

/// The query string as `T`, or a `bad_query` error.
fn query<T>(q: Result<Query<T>, QueryRejection>) -> Result<T, UiError> {
    q.map(|Query(q)| q)
        .map_err(|e| AdminError::bad("bad_query", e.body_text()).into())
}
