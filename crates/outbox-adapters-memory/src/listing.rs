//! What the operator views of the memory stores share: the filter's meaning, list
//! items, keyset pages over insertion order, per-minute counts, failure counts.

use std::collections::BTreeMap;

use outbox_core::{Lifecycle, Message, SideState, Timestamp};
use outbox_ports::{
    FailureCount, FailureGroup, MessageFilter, MessageSummary, MinuteCount, PREVIEW_BYTES, Page,
    PageCursor, page_limit,
};

/// Rows changed per lock acquisition by a bulk action, so that other callers get
/// the store between batches.
pub(crate) const BULK_BATCH: usize = 1_000;

/// Whether a message in `status` is one `filter` means (see [`MessageFilter`]).
pub(crate) fn matches<S: Lifecycle>(
    filter: &MessageFilter<S>,
    message: &Message,
    status: S,
    last_error: Option<&str>,
) -> bool {
    filter.status.is_none_or(|s| s == status)
        && filter.error_group.as_ref().is_none_or(|g| {
            outbox_core::failure_group::failure_group(last_error.unwrap_or_default()) == *g
        })
        && filter
            .exchange
            .as_ref()
            .is_none_or(|e| *e == message.exchange)
        && filter
            .routing_key
            .as_ref()
            .is_none_or(|k| *k == message.routing_key)
        && filter
            .message_type
            .as_ref()
            .is_none_or(|t| message.message_type.as_ref() == Some(t))
        && filter
            .created_after
            .is_none_or(|at| message.created_at >= at)
        && filter
            .created_before
            .is_none_or(|at| message.created_at < at)
        && filter.q.as_ref().is_none_or(|q| {
            message.id.to_string() == *q || message.correlation_id.as_ref() == Some(q)
        })
}

/// The entries of `map` after the cursor in a list's order: newest first
/// (below the cursor), or oldest first (above it).
pub(crate) fn in_list_order<'a, V>(
    map: &'a BTreeMap<u64, V>,
    after: Option<PageCursor>,
    oldest_first: bool,
) -> Box<dyn Iterator<Item = (&'a u64, &'a V)> + 'a> {
    if oldest_first {
        let from = after.map_or(0, |c| c.0.saturating_add(1));
        Box::new(map.range(from..))
    } else {
        Box::new(map.range(below(after)).rev())
    }
}

/// A list item: the message without its payload, of which a preview.
pub(crate) fn summary<S: Lifecycle>(
    message: &Message,
    status: S,
    state: &SideState,
    received_at: Option<outbox_core::Timestamp>,
) -> MessageSummary<S> {
    MessageSummary {
        id: message.id,
        status,
        exchange: message.exchange.clone(),
        routing_key: message.routing_key.clone(),
        message_type: message.message_type.clone(),
        correlation_id: message.correlation_id.clone(),
        created_at: message.created_at,
        received_at,
        attempts: state.attempts,
        last_error: state.last_error.clone(),
        next_attempt_at: state.next_attempt_at,
        due_at: message.not_before,
        completed_at: state.completed_at,
        payload_preview: message.payload[..message.payload.len().min(PREVIEW_BYTES)].to_vec(),
        payload_size: message.payload.len() as u64,
    }
}

/// The keys below the cursor (all without one), for a newest-first walk.
pub(crate) const fn below(after: Option<PageCursor>) -> std::ops::Range<u64> {
    match after {
        Some(c) => 0..c.0,
        None => 0..u64::MAX,
    }
}

/// One page from `entries` (newest first, already past the cursor and filtered):
/// up to `limit` of them, and a cursor when at least one more follows.
pub(crate) fn page<T>(entries: impl Iterator<Item = (u64, T)>, limit: u32) -> Page<T> {
    let limit = page_limit(limit) as usize;
    let mut items = Vec::with_capacity(limit);
    let mut last = None;
    for (key, item) in entries {
        if items.len() == limit {
            return Page {
                items,
                next: last.map(PageCursor),
            };
        }
        last = Some(key);
        items.push(item);
    }
    Page { items, next: None }
}

/// Completions per minute at or after `since`, oldest minute first.
pub(crate) fn per_minute(
    completions: impl Iterator<Item = Timestamp>,
    since: Timestamp,
) -> Vec<MinuteCount> {
    let mut by_minute: BTreeMap<i64, u64> = BTreeMap::new();
    for at in completions.filter(|at| *at >= since) {
        *by_minute
            .entry(at.unix_timestamp().div_euclid(60))
            .or_default() += 1;
    }
    by_minute
        .into_iter()
        .filter_map(|(minute, count)| {
            Timestamp::from_unix_timestamp(minute * 60)
                .ok()
                .map(|minute| MinuteCount { minute, count })
        })
        .collect()
}

/// `now - window`, or the earliest time when that underflows.
pub(crate) fn window_start(now: Timestamp, window: std::time::Duration) -> Timestamp {
    time::Duration::try_from(window)
        .ok()
        .and_then(|w| now.checked_sub(w))
        .unwrap_or(Timestamp::UNIX_EPOCH)
}

/// Failures in groups per place and failure group, every one counted (see
/// [`outbox_ports::OutboxOperator::failure_groups`]): from each failure's place
/// (exchange or consumer), its side's state and when its message was created.
pub(crate) fn failure_groups<'a>(
    failures: impl Iterator<Item = (&'a str, &'a SideState, Timestamp)>,
) -> Vec<FailureGroup> {
    let mut counts: BTreeMap<(String, String), FailureCount> = BTreeMap::new();
    for (place, state, created_at) in failures {
        let error = state.last_error.clone().unwrap_or_default();
        let at = state.last_attempt_at.unwrap_or(created_at);
        counts
            .entry((place.to_owned(), error.clone()))
            .and_modify(|c| {
                c.count += 1;
                c.oldest = c.oldest.min(Some(at)).or(Some(at));
                c.newest = c.newest.max(Some(at));
            })
            .or_insert(FailureCount {
                error,
                place: place.to_owned(),
                count: 1,
                oldest: Some(at),
                newest: Some(at),
            });
    }
    outbox_ports::group_failures(counts.into_values().collect())
}
