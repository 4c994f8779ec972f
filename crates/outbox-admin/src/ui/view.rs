//! What the pages show, ready for the templates: status badges that say what each
//! status means, payloads pretty-printed (JSON), as text, or as hex, and the
//! per-minute chart as inline SVG (numbers only, so it is safe to embed).

use std::fmt::Write as _;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use time::OffsetDateTime;

use crate::model::MinuteItem;
use crate::params::{Side, parse_time};

/// Payloads larger than this are cut unless "show all" is asked for.
pub(crate) const SHOWN_BYTES: usize = 16 * 1024;

/// A status with its meaning.
#[derive(Debug, Clone)]
pub(crate) struct Badge {
    pub(crate) name: String,
    pub(crate) class: &'static str,
    pub(crate) meaning: &'static str,
}

/// What `status` means (users confuse "pending" and "sent": sent is not consumed).
pub(crate) fn meaning(status: &str) -> &'static str {
    match status {
        "pending" => "written to the outbox, not yet published",
        "sent" => "published: the broker confirmed it (this says nothing about consumers)",
        "publish_failed" => "publishing failed; a retry is scheduled",
        "dead" => "out of retries; nothing more happens until an operator acts",
        "in_progress" => "received by the consumer; the handler has not succeeded yet",
        "consumed" => "the handler succeeded",
        "consume_failed" => "the handler failed; a retry is scheduled",
        _ => "",
    }
}

pub(crate) fn badge(status: &str) -> Badge {
    let class = match status {
        "dead" => "bad",
        "publish_failed" | "consume_failed" => "warn",
        "sent" | "consumed" => "ok",
        _ => "info",
    };
    Badge {
        name: status.to_owned(),
        class,
        meaning: meaning(status),
    }
}

/// The statuses of a side, in their order, as the API names them.
pub(crate) fn statuses(side: Side) -> &'static [&'static str] {
    match side {
        Side::Outbox => &["pending", "sent", "publish_failed", "dead"],
        Side::Inbox => &["in_progress", "consumed", "consume_failed", "dead"],
    }
}

/// One `<option>` of a status `<select>`.
#[derive(Debug, Clone)]
pub(crate) struct StatusOption {
    pub(crate) value: &'static str,
    pub(crate) meaning: &'static str,
    pub(crate) selected: bool,
}

pub(crate) fn status_options(side: Side, selected: Option<&str>) -> Vec<StatusOption> {
    statuses(side)
        .iter()
        .map(|s| StatusOption {
            value: s,
            meaning: meaning(s),
            selected: selected == Some(*s),
        })
        .collect()
}

/// A payload as shown on a detail page.
#[derive(Debug, Clone)]
pub(crate) struct PayloadView {
    /// `json`, `text` or `hex`.
    pub(crate) kind: &'static str,
    pub(crate) text: String,
    /// Cut to [`SHOWN_BYTES`]; "show all" shows the rest.
    pub(crate) cut: bool,
}

/// `shown` (text, or base64 when `base64`) as JSON pretty-printed, text, or hex.
pub(crate) fn payload(shown: &str, base64: bool, all: bool) -> PayloadView {
    if base64 {
        let bytes = STANDARD.decode(shown).unwrap_or_default();
        let cut = !all && bytes.len() > SHOWN_BYTES / 2;
        let bytes = if cut {
            &bytes[..SHOWN_BYTES / 2]
        } else {
            &bytes
        };
        return PayloadView {
            kind: "hex",
            text: hex_dump(bytes),
            cut,
        };
    }
    let (kind, text) = match serde_json::from_str::<serde_json::Value>(shown) {
        Ok(value) if shown.trim_start().starts_with(['{', '[']) => (
            "json",
            serde_json::to_string_pretty(&value).unwrap_or_else(|_| shown.to_owned()),
        ),
        _ => ("text", shown.to_owned()),
    };
    let cut = !all && text.len() > SHOWN_BYTES;
    let text = if cut {
        let mut end = SHOWN_BYTES;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text[..end].to_owned()
    } else {
        text
    };
    PayloadView { kind, text, cut }
}

/// 16 bytes a line: offset, hex, and the printable ASCII.
pub(crate) fn hex_dump(bytes: &[u8]) -> String {
    let mut out = String::new();
    for (n, chunk) in bytes.chunks(16).enumerate() {
        let _ = write!(out, "{:08x}  ", n * 16);
        for b in chunk {
            let _ = write!(out, "{b:02x} ");
        }
        for _ in chunk.len()..16 {
            out.push_str("   ");
        }
        out.push(' ');
        out.extend(chunk.iter().map(|&b| {
            if b.is_ascii_graphic() || b == b' ' {
                char::from(b)
            } else {
                '.'
            }
        }));
        out.push('\n');
    }
    out
}

/// A list preview: at most `chars` characters, with an ellipsis when cut.
pub(crate) fn preview(text: &str, base64: bool, chars: usize) -> String {
    if base64 {
        return "(binary)".to_owned();
    }
    let mut shown: String = text.chars().take(chars).collect();
    if text.chars().nth(chars).is_some() {
        shown.push('…');
    }
    shown
}

/// The per-minute chart of the last hour: published and consumed as two bar
/// series, one slot per minute, oldest left. Only numbers go into the markup.
pub(crate) fn chart_svg(published: &[MinuteItem], consumed: &[MinuteItem]) -> String {
    const SLOTS: i64 = 60;
    const W: i64 = 600;
    const H: i64 = 120;
    let now = OffsetDateTime::now_utc().unix_timestamp() / 60;
    let slots = |items: &[MinuteItem]| {
        let mut counts = [0u64; SLOTS as usize];
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
    let p = slots(published);
    let c = slots(consumed);
    let max = p.iter().chain(c.iter()).copied().max().unwrap_or(0).max(1);
    let total_p: u64 = p.iter().sum();
    let total_c: u64 = c.iter().sum();
    let slot_w = W / SLOTS;
    let bar_w = (slot_w / 2).max(1);
    let mut svg = format!(
        r#"<svg class="chart" viewBox="0 0 {W} {h}" role="img" aria-label="Per minute over the last hour: {total_p} published, {total_c} consumed (peak {max} a minute)" preserveAspectRatio="none"><title>Published and consumed per minute, last hour (peak {max})</title>"#,
        h = H + 1
    );
    for (series, counts, offset) in [("published", &p, 0), ("consumed", &c, bar_w)] {
        for (i, &n) in counts.iter().enumerate() {
            if n == 0 {
                continue;
            }
            let height = ((n as f64 / max as f64) * H as f64).ceil() as i64;
            let x = i as i64 * slot_w + offset;
            let y = H - height;
            let _ = write!(
                svg,
                r#"<rect class="{series}" x="{x}" y="{y}" width="{bar_w}" height="{height}"><title>{n} {series}</title></rect>"#
            );
        }
    }
    let _ = write!(
        svg,
        r#"<line class="axis" x1="0" y1="{H}" x2="{W}" y2="{H}"></line></svg>"#
    );
    svg
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::format_time;

    #[test]
    fn payloads_are_pretty_json_text_or_hex_and_cut_unless_all() {
        let json = payload(r#"{"a":1,"b":[2]}"#, false, false);
        assert_eq!(json.kind, "json");
        assert!(json.text.contains("\n  \"a\": 1"), "{}", json.text);
        let text = payload("plain words", false, false);
        assert_eq!((text.kind, text.text.as_str()), ("text", "plain words"));
        let hex = payload(&STANDARD.encode([0xff, 0x00, b'A']), true, false);
        assert_eq!(hex.kind, "hex");
        assert!(hex.text.starts_with("00000000  ff 00 41"), "{}", hex.text);
        assert!(hex.text.trim_end().ends_with("..A"), "{}", hex.text);
        let big = "x".repeat(SHOWN_BYTES + 10);
        let cut = payload(&big, false, false);
        assert!(cut.cut && cut.text.len() == SHOWN_BYTES);
        let whole = payload(&big, false, true);
        assert!(!whole.cut && whole.text.len() == big.len());
    }

    #[test]
    fn previews_are_cut_with_an_ellipsis() {
        assert_eq!(preview("abcdef", false, 3), "abc…");
        assert_eq!(preview("abc", false, 3), "abc");
        assert_eq!(preview("AAAA", true, 3), "(binary)");
    }

    #[test]
    fn the_chart_has_one_bar_per_minute_with_counts() {
        let now = OffsetDateTime::now_utc();
        let minute = |ago: i64, count| MinuteItem {
            minute: format_time(now - time::Duration::minutes(ago)),
            count,
        };
        let svg = chart_svg(
            &[minute(0, 10), minute(5, 5), minute(90, 7)],
            &[minute(1, 3)],
        );
        assert_eq!(svg.matches("class=\"published\"").count(), 2, "{svg}");
        assert_eq!(svg.matches("class=\"consumed\"").count(), 1, "{svg}");
        assert!(svg.contains("15 published, 3 consumed"), "{svg}");
        assert!(
            svg.contains(r#"height="120""#),
            "the peak fills the chart: {svg}"
        );
    }
}
