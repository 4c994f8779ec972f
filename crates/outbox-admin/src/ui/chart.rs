//! The charts as inline SVG: bar series side by side, one slot a bucket, oldest
//! left, with a count axis (0, half the peak, the peak) and a time axis. Only
//! numbers and fixed words go into the markup, so it is safe to embed.
//!
//! - `overview`: the last hour of all exchanges and consumers (published, consumed,
//!   failed attempts), from the per-minute totals.
//! - `window`: one exchange's or consumer's last hour, day or week (completed and
//!   failed attempts), every bucket given.

use std::fmt::Write as _;

use outbox_ports::ChartWindow;
use time::OffsetDateTime;

use crate::model::MinuteItem;
use crate::params::parse_time;

/// The plot, and the margins the axes' labels are drawn in.
const W: f64 = 600.0;
const H: i64 = 120;
const LEFT: i64 = 48;
const TOP: i64 = 8;
const BOTTOM: i64 = 20;

/// A bar series: its CSS class (also its name in tooltips) and a count a slot.
struct Series<'a> {
    class: &'static str,
    counts: &'a [u64],
}

/// A label on the time axis, `slots_ago` slots left of the right edge.
struct Tick {
    slots_ago: usize,
    label: String,
}

/// Draws `series` (all as long as one another) with `ticks`; `aria` and `title`
/// say what it shows, `{peak}` in them replaced by the peak.
fn bars(series: &[Series<'_>], ticks: &[Tick], aria: &str, title: &str) -> String {
    let slots = series.first().map_or(1, |s| s.counts.len()).max(1);
    let max = series
        .iter()
        .flat_map(|s| s.counts.iter())
        .copied()
        .max()
        .unwrap_or(0)
        .max(1);
    let slot_w = W / slots as f64;
    let bar_w = slot_w / series.len().max(1) as f64;
    let (width, height) = (LEFT + W as i64 + 8, TOP + H + BOTTOM);
    let (aria, title) = (
        aria.replace("{peak}", &max.to_string()),
        title.replace("{peak}", &max.to_string()),
    );
    let mut svg = format!(
        r#"<svg class="chart" viewBox="0 0 {width} {height}" role="img" aria-label="{aria}"><title>{title}</title>"#
    );
    let right = LEFT + W as i64;
    // The count axis: gridlines at the peak and half of it, labelled, and 0.
    let mut levels = vec![max];
    if max / 2 > 0 {
        levels.push(max / 2);
    }
    levels.push(0);
    for value in levels {
        let y = TOP + H - ((value as f64 / max as f64) * H as f64).round() as i64;
        let _ = write!(
            svg,
            r#"<line class="grid" x1="{LEFT}" y1="{y}" x2="{right}" y2="{y}"></line><text class="tick" x="{tx}" y="{ty}" text-anchor="end">{value}</text>"#,
            tx = LEFT - 6,
            ty = y + 4
        );
    }
    for tick in ticks {
        let x = right as f64 - tick.slots_ago as f64 * slot_w;
        let anchor = if tick.slots_ago == 0 {
            "end"
        } else if tick.slots_ago >= slots {
            "start"
        } else {
            "middle"
        };
        let _ = write!(
            svg,
            r#"<line class="axis" x1="{x:.1}" y1="{y1}" x2="{x:.1}" y2="{y2}"></line><text class="tick" x="{x:.1}" y="{ty}" text-anchor="{anchor}">{label}</text>"#,
            y1 = TOP + H,
            y2 = TOP + H + 4,
            ty = TOP + H + 16,
            label = tick.label
        );
    }
    for (k, s) in series.iter().enumerate() {
        for (i, &n) in s.counts.iter().enumerate() {
            if n == 0 {
                continue;
            }
            let bar = ((n as f64 / max as f64) * H as f64).ceil() as i64;
            let x = LEFT as f64 + i as f64 * slot_w + k as f64 * bar_w;
            let y = TOP + H - bar;
            let _ = write!(
                svg,
                r#"<rect class="{class}" x="{x:.1}" y="{y}" width="{bar_w:.1}" height="{bar}"><title>{n} {class}</title></rect>"#,
                class = s.class
            );
        }
    }
    let _ = write!(
        svg,
        r#"<line class="axis" x1="{LEFT}" y1="{y}" x2="{right}" y2="{y}"></line></svg>"#,
        y = TOP + H,
    );
    svg
}

/// The overview's chart of the last hour: published, consumed and failed attempts
/// per minute, one slot a minute; minutes outside the hour are left out.
pub(crate) fn overview(
    published: &[MinuteItem],
    consumed: &[MinuteItem],
    failed: &[MinuteItem],
) -> String {
    const SLOTS: i64 = 60;
    let now = OffsetDateTime::now_utc().unix_timestamp() / 60;
    let slots = |items: &[MinuteItem]| {
        let mut counts = vec![0u64; SLOTS as usize];
        for item in items {
            let Ok(at) = parse_time("minute", &item.minute) else {
                continue;
            };
            let ago = now - at.unix_timestamp() / 60;
            if (0..SLOTS).contains(&ago) {
                let slot = (SLOTS - 1 - ago) as usize;
                counts[slot] = counts[slot].saturating_add(item.count);
            }
        }
        counts
    };
    let (p, c, f) = (slots(published), slots(consumed), slots(failed));
    let sum = |v: &[u64]| v.iter().sum::<u64>();
    let aria = format!(
        "Per minute over the last hour: {} published, {} consumed, {} failed attempts (peak {{peak}} a minute)",
        sum(&p),
        sum(&c),
        sum(&f)
    );
    bars(
        &[
            Series {
                class: "published",
                counts: &p,
            },
            Series {
                class: "consumed",
                counts: &c,
            },
            Series {
                class: "failed",
                counts: &f,
            },
        ],
        &ticks(ChartWindow::Hour),
        &aria,
        "Published, consumed and failed attempts per minute, last hour (peak {peak})",
    )
}

/// The time axis of `window`: the hour every 15 minutes, the day every 6 hours,
/// the week every day, `now` at the right edge.
fn ticks(window: ChartWindow) -> Vec<Tick> {
    let (every, count, unit): (usize, usize, &str) = match window {
        ChartWindow::Day => (24, 4, "h ago"),
        ChartWindow::Week => (24, 7, "d ago"),
        _ => (15, 4, "min ago"),
    };
    // How many units one step is (15 minutes, 6 hours, 1 day).
    let per_step = match window {
        ChartWindow::Day => 6,
        ChartWindow::Week => 1,
        _ => 15,
    };
    (0..=count)
        .rev()
        .map(|i| Tick {
            slots_ago: i * every,
            label: if i == 0 {
                "now".to_owned()
            } else {
                format!("{} {unit}", i * per_step)
            },
        })
        .collect()
}

/// One exchange's or consumer's chart over `window`: what it completed (`done`,
/// drawn as `class`: `published` or `consumed`) and its failed attempts, a slot a
/// bucket.
pub(crate) fn window(
    window: ChartWindow,
    class: &'static str,
    done: &[u64],
    failed: &[u64],
) -> String {
    let sum = |v: &[u64]| v.iter().sum::<u64>();
    let (each, span, per) = match window {
        ChartWindow::Day => ("Every 15 minutes", "the last 24 hours", "in 15 minutes"),
        ChartWindow::Week => ("Per hour", "the last 7 days", "an hour"),
        _ => ("Per minute", "the last hour", "a minute"),
    };
    let aria = format!(
        "{each} over {span}: {} {class}, {} failed attempts (peak {{peak}} {per})",
        sum(done),
        sum(failed)
    );
    let title = format!("{class} and failed attempts, {each}, {span} (peak {{peak}})");
    bars(
        &[
            Series {
                class,
                counts: done,
            },
            Series {
                class: "failed",
                counts: failed,
            },
        ],
        &ticks(window),
        &aria,
        &title,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::format_time;

    #[test]
    fn the_overview_has_one_bar_per_minute_with_counts() {
        let now = OffsetDateTime::now_utc();
        let minute = |ago: i64, count| MinuteItem {
            minute: format_time(now - time::Duration::minutes(ago)),
            count,
        };
        let svg = overview(
            &[minute(0, 10), minute(5, 5), minute(90, 7)],
            &[minute(1, 3)],
            &[minute(2, 4), minute(3, 1)],
        );
        assert_eq!(svg.matches("class=\"published\"").count(), 2, "{svg}");
        assert_eq!(svg.matches("class=\"consumed\"").count(), 1, "{svg}");
        assert_eq!(svg.matches("class=\"failed\"").count(), 2, "{svg}");
        assert!(
            svg.contains("15 published, 3 consumed, 5 failed attempts (peak 10 a minute)"),
            "{svg}"
        );
        assert!(
            svg.contains(r#"height="120""#),
            "the peak fills the chart: {svg}"
        );
        // The axes: the peak, half of it and 0; the time every 15 minutes.
        for tick in [">10</text>", ">5</text>", ">0</text>"] {
            assert!(svg.contains(tick), "{tick}: {svg}");
        }
        for tick in [
            "60 min ago",
            "45 min ago",
            "30 min ago",
            "15 min ago",
            ">now<",
        ] {
            assert!(svg.contains(tick), "{tick}: {svg}");
        }
    }

    #[test]
    fn a_window_chart_has_a_slot_a_bucket_and_its_own_time_axis() {
        for (w, ticks) in [
            (ChartWindow::Hour, vec!["60 min ago", "15 min ago"]),
            (
                ChartWindow::Day,
                vec!["24 h ago", "18 h ago", "12 h ago", "6 h ago"],
            ),
            (ChartWindow::Week, vec!["7 d ago", "4 d ago", "1 d ago"]),
        ] {
            let mut done = vec![0u64; w.buckets()];
            let mut failed = vec![0u64; w.buckets()];
            done[0] = 8;
            done[w.buckets() - 1] = 4;
            failed[w.buckets() - 1] = 2;
            let svg = window(w, "consumed", &done, &failed);
            assert_eq!(svg.matches("<rect class=\"consumed\"").count(), 2, "{w:?}");
            assert_eq!(svg.matches("<rect class=\"failed\"").count(), 1, "{w:?}");
            assert!(
                svg.contains("12 consumed, 2 failed attempts (peak 8"),
                "{svg}"
            );
            assert!(svg.contains(r#"height="120""#), "the peak fills it");
            for t in ticks.iter().chain(&[">now<"]) {
                assert!(svg.contains(t), "{w:?} {t}: {svg}");
            }
            // The oldest bucket at the left edge, the newest ending at the right.
            assert!(svg.contains(r#"<rect class="consumed" x="48.0""#), "{svg}");
            let slot = W / w.buckets() as f64;
            let last_x = 48.0 + (w.buckets() - 1) as f64 * slot;
            assert!(
                svg.contains(&format!(r#"<rect class="consumed" x="{last_x:.1}""#)),
                "{w:?} {last_x}: {svg}"
            );
        }
    }
}
