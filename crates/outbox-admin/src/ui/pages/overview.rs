//! The overview: counts, the oldest unsent age, the chart, the sweeps and locks;
//! and its live part alone, which htmx polls.

use askama::Template;
use axum::Extension;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use serde::Deserialize;

use super::{Chrome, UiState, frame, opt_num};
use crate::model::{ConsumerItem, StatsResponse};
use crate::ui::filters::encode;
use crate::ui::render::render;
use crate::ui::session::Session;
use crate::ui::{chart, view};
use std::sync::Arc;

use crate::ui::{Page, Ui, UiError};

/// The templates' own filters (askama finds them by this module's name).
mod filters {
    /// A count with a comma between each group of three digits (`1,520`).
    #[allow(clippy::unnecessary_wraps)] // askama's filter signature
    pub(crate) fn thousands(
        n: impl std::fmt::Display,
        _: &dyn askama::Values,
    ) -> askama::Result<String> {
        let text = n.to_string();
        Ok(text.parse::<u64>().map_or(text, crate::ui::view::thousands))
    }
}

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
    /// Each exchange with an unsent or dead message or a pause.
    exchanges: Vec<ExchangeRow>,
    /// The consumers' queues as the broker reports them: (name, messages,
    /// consumers), "unknown" where it could not say.
    queues: Vec<(String, String, String)>,
    /// Why there are no queue depths, when the broker did not answer.
    queues_unavailable: Option<String>,
    /// Pending messages the exchange pauses hold (of `pending`).
    held_by_pauses: u64,
    /// The pauses in force, as "exchange orders", "consumer billing".
    pauses: Vec<String>,
    chart: String,
    published_total: u64,
    consumed_total: u64,
    failed_total: u64,
    /// Whether failed attempts are recorded here (else the series is empty).
    failures_recorded: bool,
    per_minute: String,
    sweeps: Vec<SweepRow>,
}

/// One exchange's row on the overview.
struct ExchangeRow {
    name: String,
    /// Its messages, listed.
    href: String,
    pending: String,
    publish_failed: String,
    dead: String,
    /// Its dead messages, listed (when it has any).
    dead_href: String,
    /// Its oldest unsent message's age, or "-".
    age: String,
    paused: bool,
}

/// One sweep: its report and its lock, under a name an operator reads.
struct SweepRow {
    name: String,
    /// The stored keys (the name's tooltip).
    key: String,
    /// RFC 3339, for the tooltip; empty when unknown.
    completed_at: String,
    /// "3 min ago", "never", or why it is unknown.
    completed: String,
    publish: String,
    consume: String,
    lock: String,
}

/// A key without its `.last-state` or `.run-lock` ending: what a sweep's report
/// and its lock share.
fn sweep_base(key: &str) -> &str {
    key.strip_suffix(".last-state")
        .or_else(|| key.strip_suffix(".run-lock"))
        .unwrap_or(key)
}

/// A sweep's name as an operator reads it, from the keys `outbox` gives its
/// report and lock: `outbox.retry` (or `outbox.<schema>.retry`) is the relay's
/// retry sweep, `outbox.consume-retry.<consumer>` a consumer's; any other key is
/// shown as it is.
fn sweep_name(key: &str) -> String {
    let base = sweep_base(key);
    if let Some(consumer) = base.strip_prefix("outbox.consume-retry.") {
        return format!("Consume retries of {consumer}");
    }
    if base == "outbox.retry" || base == "outbox.publish-retry" {
        return "The relay's retry sweep".to_owned();
    }
    if let Some(schema) = base
        .strip_prefix("outbox.")
        .and_then(|rest| rest.strip_suffix(".retry"))
    {
        return format!("The relay's retry sweep (schema {schema})");
    }
    key.to_owned()
}

/// The oldest unsent message's age, or, with none waiting, what is true of the
/// unsent ones: none due, but perhaps some scheduled for later or held behind a
/// key's failing head ("none due (1 scheduled, 2 keys held back)"), never a bare
/// "none unsent" while some are.
fn age(seconds: Option<u64>, outbox: &crate::model::OutboxCounts) -> String {
    match seconds {
        None => {
            let mut why = Vec::new();
            if outbox.scheduled > 0 {
                why.push(format!("{} scheduled", outbox.scheduled));
            }
            if outbox.blocked_keys > 0 {
                why.push(view::count(
                    outbox.blocked_keys,
                    "key held back",
                    "keys held back",
                ));
            }
            if why.is_empty() && outbox.pending == 0 && outbox.publish_failed == 0 {
                "nothing unsent".to_owned()
            } else if why.is_empty() {
                "none due".to_owned()
            } else {
                format!("none due ({})", why.join(", "))
            }
        }
        Some(s) => short_age(s),
    }
}

/// An age in seconds as an operator reads it: "5 s", "3 min", "2 h 5 min".
fn short_age(s: u64) -> String {
    match s {
        s if s < 120 => format!("{s} s"),
        s if s < 7200 => format!("{} min", s / 60),
        s => format!("{} h {} min", s / 3600, (s % 3600) / 60),
    }
}

fn live(ui: &Ui, stats: StatsResponse) -> Live {
    // Failed attempts on either side, one series.
    let failed: Vec<crate::model::MinuteItem> = stats
        .publish_failed_per_minute
        .iter()
        .chain(&stats.consume_failed_per_minute)
        .map(|m| crate::model::MinuteItem {
            minute: m.minute.clone(),
            count: m.count,
        })
        .collect();
    let now = time::OffsetDateTime::now_utc();
    let mut locks: Vec<(String, &'static str)> = stats
        .locks
        .into_iter()
        .map(|l| {
            let held = match l.held {
                Some(true) => "running now",
                Some(false) => "idle",
                None => "unknown (lock service did not answer)",
            };
            (l.key, held)
        })
        .collect();
    let mut sweeps: Vec<SweepRow> = stats
        .sweeps
        .into_iter()
        .map(|s| {
            // Its lock, if one is shown: the same key but for its ending.
            let lock = locks
                .iter()
                .position(|(k, _)| sweep_base(k) == sweep_base(&s.key))
                .map(|i| locks.remove(i));
            let (completed_at, completed) = match (s.available, s.completed_at) {
                (false, _) => (
                    String::new(),
                    "unknown (state store did not answer)".to_owned(),
                ),
                (true, None) => (String::new(), "never".to_owned()),
                (true, Some(at)) => (at.clone(), view::ago(&at, now)),
            };
            // The relay's sweep retries publishes only, a consumer's consumes
            // only: the other column says so rather than "0 retried, 0 failed".
            let name = sweep_name(&s.key);
            let relay = name.starts_with("The relay's");
            let consumer = name.starts_with("Consume retries of");
            let none = || "-".to_owned();
            SweepRow {
                name,
                key: match &lock {
                    Some((k, _)) => format!("{} and {k}", s.key),
                    None => s.key.clone(),
                },
                completed_at,
                completed,
                publish: if consumer {
                    none()
                } else {
                    format!(
                        "{} retried, {} failed",
                        opt_num(s.publish_retried),
                        opt_num(s.publish_failed)
                    )
                },
                consume: if relay {
                    none()
                } else {
                    format!(
                        "{} retried, {} failed",
                        opt_num(s.consume_retried),
                        opt_num(s.consume_failed)
                    )
                },
                lock: lock.map_or("", |(_, held)| held).to_owned(),
            }
        })
        .collect();
    // A lock shown without its sweep's report: a row of its own.
    sweeps.extend(locks.into_iter().map(|(key, held)| SweepRow {
        name: sweep_name(&key),
        key,
        completed_at: String::new(),
        completed: String::new(),
        publish: String::new(),
        consume: String::new(),
        lock: held.to_owned(),
    }));
    let held_by_pauses = stats
        .exchanges
        .iter()
        .filter(|e| e.paused)
        .map(|e| e.pending)
        .sum();
    let pauses = stats
        .pauses
        .iter()
        .map(|p| match p.kind {
            crate::model::PauseKindItem::Exchange => format!("exchange {}", p.name),
            crate::model::PauseKindItem::Consumer => format!("consumer {}", p.name),
        })
        .collect();
    let exchanges = stats
        .exchanges
        .iter()
        .map(|e| {
            let href = ui.at(&format!("/messages?exchange={}", encode(&e.name)));
            ExchangeRow {
                dead_href: format!("{href}&status=dead"),
                href,
                name: e.name.clone(),
                pending: view::thousands(e.pending),
                publish_failed: view::thousands(e.publish_failed),
                dead: view::thousands(e.dead),
                age: e
                    .oldest_unsent_age_s
                    .map_or_else(|| "-".to_owned(), short_age),
                paused: e.paused,
            }
        })
        .collect();
    let queued: u64 = stats.queues.iter().filter_map(|q| q.messages).sum();
    let unknown = || "unknown".to_owned();
    let queues = stats
        .queues
        .iter()
        .map(|q| {
            (
                q.name.clone(),
                q.messages.map_or_else(unknown, view::thousands),
                q.consumers.map_or_else(unknown, view::thousands),
            )
        })
        .collect();
    let queues_unavailable = stats
        .precision
        .queues
        .strip_prefix("unavailable: ")
        .map(str::to_owned);
    let mut oldest_age = age(stats.outbox.oldest_unsent_age_seconds, &stats.outbox);
    // Left the outbox is not consumed: a backlog in the broker's queues is said
    // beside the outbox's age, never a bare "nothing unsent".
    if queued > 0 {
        oldest_age = format!(
            "{oldest_age}; {} in queues",
            view::count(queued, "message waits", "messages wait")
        );
    }
    Live {
        exchanges,
        queues,
        queues_unavailable,
        held_by_pauses,
        pauses,
        pending: stats.outbox.pending,
        scheduled: stats.outbox.scheduled,
        publish_failed: stats.outbox.publish_failed,
        dead: stats.outbox.dead,
        blocked_keys: stats.outbox.blocked_keys,
        oldest_age,
        chart: chart::overview(
            &stats.published_per_minute,
            &stats.consumed_per_minute,
            &failed,
        ),
        failed_total: failed.iter().map(|m| m.count).sum(),
        failures_recorded: stats.precision.failures_per_minute == "recorded",
        published_total: stats.published_per_minute.iter().map(|m| m.count).sum(),
        consumed_total: stats.consumed_per_minute.iter().map(|m| m.count).sum(),
        per_minute: stats.precision.per_minute,
        consumers: stats
            .consumers
            .into_iter()
            .map(|c| (ui.at(&format!("/consumers/{}", encode(&c.name))), c))
            .collect(),
        sweeps,
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
    // The navigation's dead counts, from the numbers read already.
    let chrome = Chrome {
        dead_messages: stats.outbox.dead,
        dead_deliveries: stats.consumers.iter().map(|c| c.dead).sum(),
        pauses_in_force: stats.pauses.len() as u64,
        ..frame(&ui, &session, "overview")
    };
    render(
        StatusCode::OK,
        &OverviewPage {
            chrome,
            live: live(&ui, stats),
            paused,
        },
    )
}

/// The overview's live fragment as HTML, the same for every session (it shows no
/// one's name or token): what the live stream sends.
pub(crate) async fn live_fragment(ui: &Arc<Ui>) -> Result<String, UiError> {
    let stats = ui.service.stats().await?;
    let fragment = LiveFragment {
        chrome: Chrome::bare(ui),
        live: live(ui, stats),
    };
    fragment.render().map_err(|e| {
        tracing::error!(error = %e, "template failed");
        UiError::Render
    })
}

/// `GET <base>/overview/live`: the overview's numbers alone.
pub(crate) async fn overview_live(
    State(ui): UiState,
    Extension(session): Extension<Session>,
) -> Page {
    let stats = ui.service.stats().await?;
    render(
        StatusCode::OK,
        &LiveFragment {
            chrome: frame(&ui, &session, "overview"),
            live: live(&ui, stats),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(pending: u64, scheduled: u64, blocked_keys: u64) -> crate::model::OutboxCounts {
        crate::model::OutboxCounts {
            pending,
            scheduled,
            publish_failed: 0,
            dead: 0,
            blocked_keys,
            sent: None,
            oldest_unsent_at: None,
            oldest_unsent_age_seconds: None,
        }
    }

    #[test]
    fn sweeps_and_locks_are_named_as_an_operator_reads_them() {
        assert_eq!(
            sweep_name("outbox.retry.last-state"),
            "The relay's retry sweep"
        );
        assert_eq!(
            sweep_name("outbox.retry.run-lock"),
            "The relay's retry sweep"
        );
        assert_eq!(
            sweep_name("outbox.billing_db.retry.run-lock"),
            "The relay's retry sweep (schema billing_db)"
        );
        assert_eq!(
            sweep_name("outbox.consume-retry.billing.last-state"),
            "Consume retries of billing"
        );
        assert_eq!(sweep_name("relay-sweep"), "relay-sweep");
        assert_eq!(
            sweep_base("outbox.retry.run-lock"),
            sweep_base("outbox.retry.last-state")
        );
    }

    #[test]
    fn with_none_waiting_the_age_says_what_is_true_of_the_unsent() {
        assert_eq!(age(None, &counts(0, 0, 0)), "nothing unsent");
        assert_eq!(age(None, &counts(1, 1, 0)), "none due (1 scheduled)");
        assert_eq!(
            age(None, &counts(3, 1, 2)),
            "none due (1 scheduled, 2 keys held back)"
        );
        assert_eq!(age(None, &counts(2, 0, 1)), "none due (1 key held back)");
        assert_eq!(age(Some(5), &counts(1, 0, 0)), "5 s");
    }
}
