//! How the operator's commands print: lists as tables ([`Table`]: a header on a
//! terminal, tab-separated lines piped), one message as a field per line, notes and
//! totals on stderr, or JSON as the admin API answers.
#![allow(clippy::print_stdout)]

use std::io::IsTerminal;

pub(crate) use crate::printable::{printable, printable_text};
use crate::table::Table;
use outbox_admin::model::{
    BlockedKeyPage, BulkProgress, ConsumerItem, DeadLetterPage, DeadLetterView, FailureGroups,
    MessageDetail, MessagePage, PauseKindItem, PauseList, StatsResponse,
};
use outbox_admin::model::{ConsumerThroughput, ExchangeThroughput, ThroughputTotals};

/// Whether a bulk action shows its progress: on a terminal (stderr), not with
/// `--json` (scripts read stdout only, but nothing extra is drawn for them either)
/// and not on a dry run (one count, no batches).
pub(crate) fn shows_progress(json: bool, dry_run: bool) -> bool {
    progress_wanted(json, dry_run, std::io::stderr().is_terminal())
}

fn progress_wanted(json: bool, dry_run: bool, stderr_is_terminal: bool) -> bool {
    !json && !dry_run && stderr_is_terminal
}

/// A bulk action's progress bar on stderr (changed so far of matched), updated
/// once per batch and cleared at the end; draws nothing when hidden.
pub(crate) struct BulkBar(indicatif::ProgressBar);

impl BulkBar {
    /// A bar when `show`, else a hidden one; `verb` says what the count is.
    pub(crate) fn new(show: bool, verb: &str) -> Self {
        if !show {
            return Self(indicatif::ProgressBar::hidden());
        }
        let bar = indicatif::ProgressBar::new(0);
        bar.set_style(
            indicatif::ProgressStyle::with_template(&format!(
                "{{bar:40}} {{pos}}/{{len}} {verb} ({{elapsed}})"
            ))
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        Self(bar)
    }

    /// After a batch.
    pub(crate) fn update(&self, progress: BulkProgress) {
        // Entries that joined the filter meanwhile may be changed too.
        self.0.set_length(progress.matched.max(progress.changed));
        self.0.set_position(progress.changed);
    }

    /// Clears the bar (the summary line follows).
    pub(crate) fn finish(&self) {
        self.0.finish_and_clear();
    }
}

/// `value` as JSON with `--json`, else as `text` prints it.
///
/// # Errors
/// When it cannot be serialized (never for the API's types).
pub(crate) fn either<T: serde::Serialize>(
    json: bool,
    value: &T,
    text: impl FnOnce(&T),
) -> anyhow::Result<()> {
    if json {
        self::json(value)
    } else {
        text(value);
        Ok(())
    }
}

/// `value` as pretty JSON on stdout.
///
/// # Errors
/// When it cannot be serialized (never for the API's types).
pub(crate) fn json(value: &impl serde::Serialize) -> anyhow::Result<()> {
    println!("{}", json_text(value)?);
    Ok(())
}

/// `value` as pretty JSON with every control character escaped: serde_json
/// escapes those below U+0020; DEL and the C1 controls (U+0080 to U+009F, CSI
/// among them), which a terminal may obey, can only stand inside strings and
/// are written `\u00XX` there too.
fn json_text(value: &impl serde::Serialize) -> anyhow::Result<String> {
    let text = serde_json::to_string_pretty(value)?;
    Ok(text
        .chars()
        .map(|c| {
            if c.is_control() && c != '\n' {
                format!("\\u{:04x}", u32::from(c))
            } else {
                c.to_string()
            }
        })
        .collect())
}

/// One line on stdout (what it names from messages or the store escaped).
pub(crate) fn line(text: &str) {
    println!("{}", printable_text(text));
}

fn or_dash(value: Option<&str>) -> &str {
    value.unwrap_or("-")
}

fn next_page(next: Option<&String>) {
    if let Some(cursor) = next {
        eprintln!("more: --cursor {cursor}");
    }
}

/// Failure groups, one line each: count, `exchange=` or `consumer=`, oldest and
/// newest last attempt, the error with what varies taken out.
pub(crate) fn failure_groups(groups: &FailureGroups) {
    let mut t = Table::new(&["COUNT", "WHERE", "OLDEST", "NEWEST", "ERROR"]);
    for g in &groups.groups {
        let place = match (&g.exchange, &g.consumer) {
            (Some(x), _) => format!("exchange={}", printable(x)),
            (None, Some(c)) => format!("consumer={}", printable(c)),
            (None, None) => "-".to_owned(),
        };
        t.row(vec![
            g.count.to_string(),
            place,
            g.oldest.clone().unwrap_or_else(|| "-".into()),
            g.newest.clone().unwrap_or_else(|| "-".into()),
            printable(&g.error),
        ]);
    }
    t.print();
    let n = groups.groups.len();
    eprintln!("{n} failure group{}", if n == 1 { "" } else { "s" });
}

/// The pauses in force, one line each: kind, name, since, by whom.
pub(crate) fn pause_list(pauses: &PauseList) {
    let mut t = Table::new(&["KIND", "NAME", "SINCE", "BY"]);
    for p in &pauses.items {
        let kind = match p.kind {
            PauseKindItem::Exchange => "exchange",
            PauseKindItem::Consumer => "consumer",
        };
        t.row(vec![
            kind.to_owned(),
            printable(&p.name),
            p.since.clone().unwrap_or_else(|| "-".into()),
            printable(&p.by),
        ]);
    }
    t.print();
    let n = pauses.items.len();
    eprintln!("{n} pause{} in force", if n == 1 { "" } else { "s" });
}

/// A page of blocked ordering keys, one line each: key, head id, head status,
/// attempts, waiting count (`1000+` past the cap), next attempt, last error.
pub(crate) fn blocked_key_page(page: &BlockedKeyPage) {
    let mut t = Table::new(&[
        "KEY",
        "HEAD",
        "HEAD STATUS",
        "ATTEMPTS",
        "WAITING",
        "NEXT ATTEMPT",
        "LAST ERROR",
    ]);
    for k in &page.items {
        let plus = if k.waiting_capped { "+" } else { "" };
        t.row(vec![
            printable(&k.key),
            k.head_id.clone(),
            k.head_status.clone(),
            k.head_attempts.to_string(),
            format!("{}{plus}", k.waiting),
            k.head_next_attempt_at.clone().unwrap_or_else(|| "-".into()),
            printable(k.head_last_error.as_deref().unwrap_or("-")),
        ]);
    }
    t.print();
    eprintln!("{} blocked key(s) shown", page.items.len());
    if let Some(after) = &page.next_after {
        // Quoted for a POSIX shell (keys are user data: spaces, `;`, a leading
        // `-`), so the hint can be pasted as it is.
        eprintln!(
            "more: --after='{}'",
            printable(after).replace('\'', r"'\''")
        );
    }
}

const MESSAGE_COLUMNS: [&str; 8] = [
    "ID",
    "STATUS",
    "CREATED",
    "EXCHANGE",
    "ROUTING KEY",
    "TYPE",
    "ATTEMPTS",
    "LAST ERROR",
];
const MESSAGE_COLUMNS_RECEIVED: [&str; 8] = [
    "ID",
    "STATUS",
    "RECEIVED",
    "EXCHANGE",
    "ROUTING KEY",
    "TYPE",
    "ATTEMPTS",
    "LAST ERROR",
];

/// A page of messages, one line each.
pub(crate) fn message_page(page: &MessagePage) {
    // A delivery's list follows its arrival: its received time.
    let deliveries = page.items.iter().any(|m| m.received_at.is_some());
    let mut t = Table::new(if deliveries {
        &MESSAGE_COLUMNS_RECEIVED
    } else {
        &MESSAGE_COLUMNS
    });
    for m in &page.items {
        t.row(vec![
            m.id.clone(),
            m.status.clone(),
            m.received_at
                .clone()
                .unwrap_or_else(|| m.created_at.clone()),
            printable(&m.exchange),
            printable(&m.routing_key),
            printable(or_dash(m.message_type.as_deref())),
            m.attempts.to_string(),
            printable(m.last_error.as_deref().unwrap_or("")),
        ]);
    }
    t.print();
    eprintln!("{} message(s) shown", page.items.len());
    next_page(page.next_cursor.as_ref());
}

/// One message, a field per line, then its payload and each consumer's side.
pub(crate) fn message_detail(m: &MessageDetail) {
    print!("{}", message_detail_text(m));
}

/// [`message_detail`]'s text: what producers, consumers and stores wrote
/// (names, headers, payload, errors) with its control characters escaped.
fn message_detail_text(m: &MessageDetail) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let fields = [
        ("id", Some(m.id.as_str())),
        ("status", Some(m.status.as_str())),
        ("exchange", Some(m.exchange.as_str())),
        ("routing_key", Some(m.routing_key.as_str())),
        ("type", m.message_type.as_deref()),
        ("content_type", Some(m.content_type.as_str())),
        ("correlation_id", m.correlation_id.as_deref()),
        ("source", m.source.as_deref()),
        ("created_at", Some(m.created_at.as_str())),
        ("last_attempt_at", m.last_attempt_at.as_deref()),
        ("due_at", m.due_at.as_deref()),
        ("next_attempt_at", m.next_attempt_at.as_deref()),
        ("completed_at", m.completed_at.as_deref()),
        ("last_error", m.last_error.as_deref()),
    ];
    for (name, value) in fields {
        let _ = writeln!(out, "{name}\t{}", printable(or_dash(value)));
    }
    let _ = writeln!(out, "attempts\t{}", m.attempts);
    for a in &m.failed_attempts {
        let _ = writeln!(
            out,
            "failed_attempt\t{}\t{}\t{}",
            a.attempt,
            a.at,
            printable(&a.error)
        );
    }
    for (name, value) in &m.headers {
        let _ = writeln!(out, "header\t{}: {}", printable(name), printable(value));
    }
    let encoding = if m.payload_base64 { " (base64)" } else { "" };
    let _ = writeln!(
        out,
        "payload\t{} bytes{encoding}{}",
        m.payload_size,
        if m.payload_redacted { ", redacted" } else { "" }
    );
    let _ = writeln!(out, "{}", printable_text(&m.payload));
    for d in &m.deliveries {
        let _ = writeln!(
            out,
            "consumer\t{}\t{}\tattempts={}\t{}\t{}",
            printable(&d.consumer),
            d.status,
            d.attempts,
            or_dash(d.consumed_at.as_deref()),
            printable(d.last_error.as_deref().unwrap_or(""))
        );
    }
    out
}

/// Every consumer with its counts.
pub(crate) fn consumers(items: &[ConsumerItem]) {
    let mut t = Table::new(&[
        "NAME",
        "RECEIVED",
        "CONSUMED",
        "CONSUME FAILED",
        "DEAD",
        "DEAD LETTERS",
        "PAUSED",
    ]);
    for c in items {
        t.row(vec![
            printable(&c.name),
            c.received.to_string(),
            c.consumed
                .map_or_else(|| "not counted".to_owned(), |n| n.to_string()),
            c.consume_failed.to_string(),
            c.dead.to_string(),
            c.dead_letters.to_string(),
            if c.paused { "paused" } else { "" }.to_owned(),
        ]);
    }
    t.print();
    eprintln!("{} consumer(s)", items.len());
}

fn dead_letter_line(d: &DeadLetterView) -> String {
    format!(
        "{}\t{}\t{}\t{}\tmessage_id={}\t{}",
        d.id,
        printable(&d.consumer),
        d.received_at,
        printable(&d.routing_key),
        printable(or_dash(d.message_id.as_deref())),
        printable(&d.reason)
    )
}

/// A page of dead letters, one line each.
pub(crate) fn dead_letter_page(page: &DeadLetterPage) {
    let mut t = Table::new(&[
        "ID",
        "CONSUMER",
        "RECEIVED",
        "ROUTING KEY",
        "MESSAGE ID",
        "REASON",
    ]);
    for d in &page.items {
        t.row(vec![
            d.id.to_string(),
            printable(&d.consumer),
            d.received_at.clone(),
            printable(&d.routing_key),
            printable(or_dash(d.message_id.as_deref())),
            printable(&d.reason),
        ]);
    }
    t.print();
    eprintln!("{} dead letter(s) shown", page.items.len());
    next_page(page.next_cursor.as_ref());
}

/// Dead letters among a consumer's dead deliveries, each line marked.
pub(crate) fn marked_dead_letters(items: &[DeadLetterView]) {
    for d in items {
        println!("dead-letter\t{}", dead_letter_line(d));
    }
}

/// One dead letter with its whole body.
pub(crate) fn dead_letter_detail(d: &DeadLetterView) {
    print!("{}", dead_letter_text(d));
}

/// [`dead_letter_detail`]'s text, control characters escaped.
fn dead_letter_text(d: &DeadLetterView) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(out, "{}", dead_letter_line(d));
    for (name, value) in &d.headers {
        let _ = writeln!(out, "header\t{}: {}", printable(name), printable(value));
    }
    let encoding = if d.body_base64 { " (base64)" } else { "" };
    let _ = writeln!(out, "body\t{} bytes{encoding}", d.body_size);
    let _ = writeln!(out, "{}", printable_text(&d.body));
    out
}

/// The dashboard's numbers.
pub(crate) fn stats(s: &StatsResponse) {
    let o = &s.outbox;
    println!(
        "outbox\tpending={}\tpublish_failed={}\tdead={}\toldest_unsent_age_seconds={}",
        o.pending,
        o.publish_failed,
        o.dead,
        o.oldest_unsent_age_seconds
            .map_or_else(|| "-".to_owned(), |a| a.to_string())
    );
    for c in &s.consumers {
        println!(
            "consumer {}\treceived={}\tconsumed={}\tconsume_failed={}\tdead={}\tdead_letters={}{}",
            printable(&c.name),
            c.received,
            c.consumed
                .map_or_else(|| "not counted".to_owned(), |n| n.to_string()),
            c.consume_failed,
            c.dead,
            c.dead_letters,
            if c.paused { "\tpaused" } else { "" }
        );
    }
    for p in s
        .pauses
        .iter()
        .filter(|p| p.kind == PauseKindItem::Exchange)
    {
        println!("exchange {}\tpaused", printable(&p.name));
    }
    let total = |m: &[outbox_admin::model::MinuteItem]| m.iter().map(|m| m.count).sum::<u64>();
    let failed = if s.precision.failures_per_minute == "recorded" {
        format!(
            "\tpublish_failed={}\tconsume_failed={}",
            total(&s.publish_failed_per_minute),
            total(&s.consume_failed_per_minute)
        )
    } else {
        String::new()
    };
    println!(
        "last hour\tpublished={}\tconsumed={}{failed}",
        total(&s.published_per_minute),
        total(&s.consumed_per_minute)
    );
    for w in &s.sweeps {
        if !w.available {
            println!("sweep {}\tstate unavailable", printable(&w.key));
            continue;
        }
        match &w.completed_at {
            Some(at) => println!(
                "sweep {}\tcompleted_at={at}\tpublish_retried={}\tpublish_failed={}",
                w.key,
                w.publish_retried.unwrap_or(0),
                w.publish_failed.unwrap_or(0)
            ),
            None => println!("sweep {}\tno report yet", w.key),
        }
    }
}

/// Every exchange and consumer with its totals over the window: kind, name,
/// completed (published or consumed), failed attempts.
pub(crate) fn throughput_totals(t: &ThroughputTotals) {
    let mut table = Table::new(&["KIND", "NAME", "COMPLETED", "FAILED ATTEMPTS"]);
    for e in &t.exchanges {
        table.row(vec![
            "exchange".to_owned(),
            printable(&e.exchange),
            e.published.to_string(),
            e.failed.to_string(),
        ]);
    }
    for c in &t.consumers {
        table.row(vec![
            "consumer".to_owned(),
            printable(&c.consumer),
            c.consumed.to_string(),
            c.failed.to_string(),
        ]);
    }
    table.print();
    eprintln!(
        "{} exchange(s), {} consumer(s) over the last {} (published or consumed: COMPLETED)",
        t.exchanges.len(),
        t.consumers.len(),
        t.window
    );
}

/// One exchange's buckets, oldest first.
pub(crate) fn exchange_throughput(t: &ExchangeThroughput) {
    let buckets = t.buckets.iter().map(|b| (&b.start, b.published, b.failed));
    let place = ("exchange", t.exchange.as_str(), "published");
    buckets_table(
        place,
        buckets,
        (t.published, t.failed),
        &t.window,
        t.bucket_seconds,
    );
}

/// One consumer's buckets, oldest first.
pub(crate) fn consumer_throughput(t: &ConsumerThroughput) {
    let buckets = t.buckets.iter().map(|b| (&b.start, b.consumed, b.failed));
    let place = ("consumer", t.consumer.as_str(), "consumed");
    buckets_table(
        place,
        buckets,
        (t.consumed, t.failed),
        &t.window,
        t.bucket_seconds,
    );
}

/// `(start, completed, failed)` a bucket under `place` (`(kind, name, what it
/// completes)`), then the sums on stderr.
fn buckets_table<'a>(
    (kind, name, done_word): (&str, &str, &str),
    buckets: impl Iterator<Item = (&'a String, u64, u64)>,
    (done, failed): (u64, u64),
    window: &str,
    bucket_seconds: u64,
) {
    let header: &'static [&'static str] = match done_word {
        "consumed" => &["START", "CONSUMED", "FAILED ATTEMPTS"],
        _ => &["START", "PUBLISHED", "FAILED ATTEMPTS"],
    };
    let mut table = Table::new(header);
    for (start, d, f) in buckets {
        table.row(vec![start.clone(), d.to_string(), f.to_string()]);
    }
    table.print();
    eprintln!(
        "{kind} {}: {done} {done_word}, {failed} failed attempts over the last {window} ({bucket_seconds} s a bucket)",
        printable(name)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_only_on_a_terminal_without_json_or_dry_run() {
        assert!(progress_wanted(false, false, true));
        assert!(!progress_wanted(true, false, true), "--json");
        assert!(!progress_wanted(false, true, true), "--dry-run");
        assert!(!progress_wanted(false, false, false), "not a terminal");
    }

    /// ESC as a producer could put it in a header, a body and an error: a
    /// sequence that clears the screen, and one in C1 form (U+009B).
    const CLEAR: &str = "\u{1b}[2J\u{1b}]0;pwned\u{7}\u{9b}31m";

    fn no_escape_reaches_the_terminal(text: &str) {
        assert!(
            !text
                .chars()
                .any(|c| c.is_control() && c != '\n' && c != '\t'),
            "{text:?}"
        );
    }

    #[test]
    fn a_message_shown_escapes_what_producers_and_handlers_wrote() {
        let detail: MessageDetail = serde_json::from_value(serde_json::json!({
            "id": "0190aa", "status": "dead", "exchange": format!("orders{CLEAR}"),
            "routing_key": "a", "headers": {format!("x-{CLEAR}"): format!("v{CLEAR}")},
            "content_type": "text/plain", "created_at": "2026-01-01T00:00:00Z",
            "payload": format!("line one{CLEAR}\nline\ttwo\r"), "payload_base64": false,
            "payload_redacted": false, "payload_size": 10, "attempts": 1,
            "last_error": format!("handler said {CLEAR}"),
            "failed_attempts": [{"attempt": 1, "at": "2026-01-01T00:00:00Z", "error": CLEAR}],
            "deliveries": [],
        }))
        .expect("a detail");
        let text = message_detail_text(&detail);
        no_escape_reaches_the_terminal(&text);
        assert!(text.contains(r"\u{1b}[2J"), "{text}");
        assert!(
            text.contains("line one") && text.contains("\nline\ttwo\\r\n"),
            "line breaks and tabs kept, CR escaped: {text:?}"
        );
        let json = json_text(&detail).expect("json");
        no_escape_reaches_the_terminal(&json);
        let back: serde_json::Value = serde_json::from_str(&json).expect("still JSON");
        assert_eq!(back["last_error"], format!("handler said {CLEAR}"));
    }

    #[test]
    fn a_dead_letter_shown_escapes_its_headers_and_body() {
        let letter: DeadLetterView = serde_json::from_value(serde_json::json!({
            "id": 1, "consumer": "billing", "routing_key": format!("k{CLEAR}"),
            "reason": format!("undecodable {CLEAR}"), "received_at": "2026-01-01T00:00:00Z",
            "headers": {"x-h": CLEAR}, "body": format!("{{}}{CLEAR}"), "body_base64": false,
            "body_redacted": false, "body_size": 2,
        }))
        .expect("a dead letter");
        let text = dead_letter_text(&letter);
        no_escape_reaches_the_terminal(&text);
        assert!(text.contains(r"undecodable \u{1b}[2J"), "{text}");
    }

    #[test]
    fn a_hidden_bar_takes_updates_quietly() {
        let bar = BulkBar::new(false, "requeued");
        bar.update(BulkProgress {
            matched: 10,
            changed: 3,
            batches: 1,
        });
        assert!(bar.0.is_hidden());
        assert_eq!(bar.0.position(), 3);
        bar.finish();
    }
}
