//! The overview: counts, the oldest unsent age, the chart, the sweeps and locks;
//! and its live part alone, which htmx polls.

use askama::Template;
use axum::Extension;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use serde::Deserialize;

use super::{Chrome, UiState, chrome, opt_num};
use crate::model::{ConsumerItem, StatsResponse};
use crate::ui::filters::encode;
use crate::ui::render::render;
use crate::ui::session::Session;
use crate::ui::view;
use crate::ui::{Page, Ui};

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
        Some(s) if s < 120 => format!("{s} s"),
        Some(s) if s < 7200 => format!("{} min", s / 60),
        Some(s) => format!("{} h {} min", s / 3600, (s % 3600) / 60),
    }
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
        oldest_age: age(stats.outbox.oldest_unsent_age_seconds, &stats.outbox),
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
            chrome: chrome(&ui, &session, "overview").await,
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
            chrome: chrome(&ui, &session, "overview").await,
            live: live(&ui, stats),
            paused: false,
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
