//! The soak's picture, `target/soak/soak.svg`: latency (p50, p99 and the steady
//! p99, log scale), backlog and each process's RSS over time, one panel each,
//! with the faults marked across all three. Written by hand (polylines and text):
//! a plotting library would bring more code than this file for three line charts.

use std::collections::BTreeMap;
use std::fmt::Write as _;

/// What the picture shows; times in seconds since the start of the run.
#[derive(Debug, Clone, Default)]
pub(crate) struct Chart {
    pub(crate) title: String,
    pub(crate) duration_s: f64,
    /// (t, p50 ms, p99 ms) per latency window.
    pub(crate) latency: Vec<(f64, Option<f64>, Option<f64>)>,
    pub(crate) steady_p99_ms: Option<f64>,
    /// (t, outbox backlog, inbox backlog).
    pub(crate) backlog: Vec<(f64, f64, f64)>,
    /// Process name to (t, RSS MiB).
    pub(crate) rss: BTreeMap<String, Vec<(f64, f64)>>,
    /// (start, end, kind).
    pub(crate) faults: Vec<(f64, f64, String)>,
}

const W: f64 = 1000.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 150.0;
const PANEL_H: f64 = 170.0;
const GAP: f64 = 50.0;
const TOP: f64 = 50.0;
const COLORS: [&str; 8] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A panel: its vertical place and how values map onto it.
struct Panel {
    top: f64,
    duration_s: f64,
    max: f64,
    log: bool,
}

impl Panel {
    fn x(&self, t: f64) -> f64 {
        LEFT + (t / self.duration_s.max(1.0)).clamp(0.0, 1.0) * (W - LEFT - RIGHT)
    }

    fn y(&self, v: f64) -> f64 {
        let frac = if self.log {
            (v.max(1.0).log10() / self.max.max(10.0).log10()).clamp(0.0, 1.0)
        } else {
            (v / self.max.max(1.0)).clamp(0.0, 1.0)
        };
        self.top + PANEL_H * (1.0 - frac)
    }

    /// Frame, title, y ticks, x ticks.
    fn frame(&self, out: &mut String, title: &str, unit: &str) {
        let (x0, x1, bottom) = (LEFT, W - RIGHT, self.top + PANEL_H);
        let _ = writeln!(
            out,
            r##"<rect x="{x0}" y="{}" width="{}" height="{PANEL_H}" fill="none" stroke="#999"/>"##,
            self.top,
            x1 - x0
        );
        let _ = writeln!(
            out,
            r#"<text x="{x0}" y="{}" font-size="13" font-weight="bold">{}</text>"#,
            self.top - 8.0,
            esc(title)
        );
        let ticks: Vec<f64> = if self.log {
            let mut v = vec![1.0];
            while v[v.len() - 1] * 10.0 <= self.max.max(10.0) {
                let next = v[v.len() - 1] * 10.0;
                v.push(next);
            }
            v
        } else {
            (0..=4)
                .map(|i| self.max.max(1.0) * f64::from(i) / 4.0)
                .collect()
        };
        for v in ticks {
            let y = self.y(v);
            let _ = writeln!(
                out,
                r##"<line x1="{x0}" y1="{y:.1}" x2="{x1}" y2="{y:.1}" stroke="#eee"/><text x="{}" y="{:.1}" font-size="10" text-anchor="end">{} {}</text>"##,
                x0 - 4.0,
                y + 3.0,
                human(v),
                esc(unit)
            );
        }
        let step = nice_step(self.duration_s);
        let mut t = 0.0;
        while t <= self.duration_s + 1e-9 {
            let x = self.x(t);
            let _ = writeln!(
                out,
                r#"<text x="{x:.1}" y="{}" font-size="10" text-anchor="middle">{}</text>"#,
                bottom + 12.0,
                clock(t)
            );
            t += step;
        }
    }

    /// A line through `points`, broken where a value is missing.
    fn line(&self, out: &mut String, points: &[(f64, Option<f64>)], color: &str, dash: bool) {
        let mut segment: Vec<String> = Vec::new();
        let flush = |segment: &mut Vec<String>, out: &mut String| {
            if !segment.is_empty() {
                let _ = writeln!(
                    out,
                    r#"<polyline fill="none" stroke="{color}" stroke-width="1.5"{} points="{}"/>"#,
                    if dash {
                        r#" stroke-dasharray="6,4""#
                    } else {
                        ""
                    },
                    segment.join(" ")
                );
                segment.clear();
            }
        };
        for &(t, v) in points {
            match v {
                Some(v) => segment.push(format!("{:.1},{:.1}", self.x(t), self.y(v))),
                None => flush(&mut segment, out),
            }
        }
        flush(&mut segment, out);
    }

    fn legend(&self, out: &mut String, entries: &[(&str, &str)]) {
        for (i, (name, color)) in entries.iter().enumerate() {
            let y = self.top + 12.0 + 16.0 * i as f64;
            let x = W - RIGHT + 10.0;
            let _ = writeln!(
                out,
                r#"<line x1="{x}" y1="{y}" x2="{}" y2="{y}" stroke="{color}" stroke-width="3"/><text x="{}" y="{}" font-size="11">{}</text>"#,
                x + 18.0,
                x + 22.0,
                y + 4.0,
                esc(name)
            );
        }
    }
}

fn human(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else if v >= 10.0 || v == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

fn clock(t: f64) -> String {
    let s = t.round() as u64;
    format!("{}:{:02}", s / 60, s % 60)
}

/// Seconds between x ticks: about eight of them.
fn nice_step(duration_s: f64) -> f64 {
    let raw = duration_s.max(1.0) / 8.0;
    [
        10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1800.0, 3600.0,
    ]
    .into_iter()
    .find(|s| *s >= raw)
    .unwrap_or(7200.0)
}

fn max_of(values: impl Iterator<Item = f64>) -> f64 {
    values.fold(0.0, f64::max)
}

/// The SVG document.
pub(crate) fn render(c: &Chart) -> String {
    let height = TOP + 3.0 * PANEL_H + 2.0 * GAP + 40.0;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" viewBox="0 0 {W} {height}" font-family="sans-serif">"#
    );
    let _ = writeln!(
        out,
        r#"<rect width="100%" height="100%" fill="white"/><text x="{LEFT}" y="22" font-size="15" font-weight="bold">{}</text>"#,
        esc(&c.title)
    );
    let panel = |i: f64, max: f64, log: bool| Panel {
        top: TOP + i * (PANEL_H + GAP),
        duration_s: c.duration_s,
        max,
        log,
    };
    // Latency, log scale.
    let lat_max = max_of(
        c.latency
            .iter()
            .filter_map(|l| l.2)
            .chain(c.steady_p99_ms)
            .chain(std::iter::once(10.0)),
    );
    let lat = panel(0.0, lat_max, true);
    lat.frame(
        &mut out,
        "commit-to-consume latency per 10 s window (log scale)",
        "ms",
    );
    lat.line(
        &mut out,
        &c.latency.iter().map(|l| (l.0, l.1)).collect::<Vec<_>>(),
        COLORS[0],
        false,
    );
    lat.line(
        &mut out,
        &c.latency.iter().map(|l| (l.0, l.2)).collect::<Vec<_>>(),
        COLORS[1],
        false,
    );
    let mut legend = vec![("p50", COLORS[0]), ("p99", COLORS[1])];
    if let Some(s) = c.steady_p99_ms {
        lat.line(
            &mut out,
            &[(0.0, Some(s)), (c.duration_s, Some(s))],
            "#555",
            true,
        );
        legend.push(("steady p99", "#555"));
    }
    lat.legend(&mut out, &legend);
    // Backlog.
    let bl_max = max_of(c.backlog.iter().flat_map(|b| [b.1, b.2]));
    let bl = panel(1.0, bl_max, false);
    bl.frame(&mut out, "backlog", "msgs");
    bl.line(
        &mut out,
        &c.backlog
            .iter()
            .map(|b| (b.0, Some(b.1)))
            .collect::<Vec<_>>(),
        COLORS[2],
        false,
    );
    bl.line(
        &mut out,
        &c.backlog
            .iter()
            .map(|b| (b.0, Some(b.2)))
            .collect::<Vec<_>>(),
        COLORS[3],
        false,
    );
    bl.legend(
        &mut out,
        &[("outbox unsent", COLORS[2]), ("inbox + queue", COLORS[3])],
    );
    // RSS.
    let rss_max = max_of(c.rss.values().flatten().map(|p| p.1)) * 1.1;
    let rss = panel(2.0, rss_max, false);
    rss.frame(&mut out, "resident memory of each process", "MiB");
    let mut legend = Vec::new();
    for (i, (name, points)) in c.rss.iter().enumerate() {
        let color = COLORS[(i + 4) % COLORS.len()];
        rss.line(
            &mut out,
            &points.iter().map(|p| (p.0, Some(p.1))).collect::<Vec<_>>(),
            color,
            false,
        );
        legend.push((name.as_str(), color));
    }
    rss.legend(&mut out, &legend);
    // Faults across the three panels.
    let (y0, y1) = (TOP, TOP + 3.0 * PANEL_H + 2.0 * GAP);
    for (i, (start, end, kind)) in c.faults.iter().enumerate() {
        let (x0, x1) = (lat.x(*start), lat.x(*end));
        let _ = writeln!(
            out,
            r##"<g class="fault"><rect x="{x0:.1}" y="{y0}" width="{:.1}" height="{}" fill="#d62728" fill-opacity="0.15"/><line x1="{x0:.1}" y1="{y0}" x2="{x0:.1}" y2="{y1}" stroke="#d62728" stroke-width="1"/><text x="{:.1}" y="{}" font-size="10" fill="#d62728" text-anchor="end" transform="rotate(-90 {:.1} {})">{} {}</text></g>"##,
            (x1 - x0).max(2.0),
            y1 - y0,
            x0 + 11.0,
            y0 + 4.0,
            x0 + 11.0,
            y0 + 4.0,
            i + 1,
            esc(kind)
        );
    }
    let _ = writeln!(
        out,
        r##"<text x="{LEFT}" y="{}" font-size="11" fill="#555">time since the start (m:ss); red: faults, from injection to service back</text>"##,
        y1 + 30.0
    );
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every element opened is closed, in order (enough XML for what `render` writes).
    fn well_formed(svg: &str) -> bool {
        let mut stack: Vec<String> = Vec::new();
        let mut rest = svg;
        while let Some(i) = rest.find('<') {
            let Some(j) = rest[i..].find('>') else {
                return false;
            };
            let tag = &rest[i + 1..i + j];
            rest = &rest[i + j + 1..];
            if let Some(name) = tag.strip_prefix('/') {
                if stack.pop().as_deref() != Some(name.trim()) {
                    return false;
                }
            } else if !tag.ends_with('/') {
                let name = tag.split_whitespace().next().unwrap_or_default();
                stack.push(name.to_owned());
            }
            if !tag.matches('"').count().is_multiple_of(2) {
                return false;
            }
        }
        stack.is_empty() && !rest.contains('>')
    }

    fn chart() -> Chart {
        Chart {
            title: "soak <3m> & co".into(),
            duration_s: 180.0,
            latency: vec![
                (10.0, Some(20.0), Some(80.0)),
                (20.0, None, None),
                (30.0, Some(25.0), Some(4000.0)),
                (40.0, Some(22.0), Some(90.0)),
            ],
            steady_p99_ms: Some(85.0),
            backlog: vec![(10.0, 5.0, 3.0), (20.0, 900.0, 40.0)],
            rss: [
                ("relay-1".to_owned(), vec![(10.0, 30.0), (20.0, 31.0)]),
                ("consumer-1".to_owned(), vec![(10.0, 40.0), (20.0, 41.0)]),
            ]
            .into(),
            faults: vec![
                (15.0, 18.0, "broker_restart".into()),
                (60.0, 60.5, "relay_kill".into()),
            ],
        }
    }

    #[test]
    fn the_picture_is_well_formed_and_shows_every_series_and_fault() {
        let svg = render(&chart());
        assert!(well_formed(&svg), "{svg}");
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        // p50 and p99 are broken where a window had nothing: two pieces each, plus
        // the steady line, two backlog lines, two RSS lines.
        assert_eq!(svg.matches("<polyline").count(), 2 + 2 + 1 + 2 + 2);
        assert_eq!(svg.matches(r#"<g class="fault">"#).count(), 2);
        for text in [
            "1 broker_restart",
            "2 relay_kill",
            "relay-1",
            "consumer-1",
            "steady p99",
            "soak &lt;3m&gt; &amp; co",
        ] {
            assert!(svg.contains(text), "{text} missing");
        }
        assert!(!svg.contains("NaN") && !svg.contains("inf"));
    }

    #[test]
    fn the_checker_catches_a_broken_document() {
        assert!(!well_formed("<svg><g></svg>"));
        assert!(!well_formed(r#"<svg><text x="1>a</text></svg>"#));
    }

    #[test]
    fn an_empty_chart_still_renders() {
        let svg = render(&Chart {
            duration_s: 0.0,
            ..Chart::default()
        });
        assert!(well_formed(&svg));
        assert!(!svg.contains("NaN"));
    }
}
