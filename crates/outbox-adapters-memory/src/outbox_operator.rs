//! The operator's view of the memory outbox: pages by insertion order, bulk actions
//! under the same status guards as the single ones.

use std::time::Duration;

use async_trait::async_trait;
use outbox_core::{MessageId, OutboxStatus};
use outbox_ports::{
    BLOCKED_WAITING_CAP, BlockedKey, BulkOutcome, ExchangeCounts, FailureGroup, KeyHead,
    MessageFilter, MessageSummary, MinuteCount, OutboxOperator, OutboxRecord, Page, PageCursor,
    PortError, deletable_statuses, page_limit, requeueable_statuses,
};

use crate::listing::{
    BULK_BATCH, below, failure_groups, in_list_order, matches, page, per_minute, summary,
    window_start,
};
use crate::lock;
use crate::outbox::{MemoryOutboxStore, Row, Table};

/// What a bulk action does to one matched row under the table's lock.
enum Action {
    Requeue,
    Delete { force: bool },
}

impl MemoryOutboxStore {
    /// Applies `action` to up to `max` rows matching `filter`, newest first, one
    /// lock acquisition per batch of [`BULK_BATCH`].
    fn bulk(&self, filter: &MessageFilter, max: u64, action: &Action) -> BulkOutcome {
        let mut outcome = BulkOutcome::default();
        let mut cursor: Option<PageCursor> = None;
        while outcome.matched < max {
            let now = self.clock.now();
            let mut t = lock(&self.table);
            let room = usize::try_from(max - outcome.matched).unwrap_or(usize::MAX);
            let picked: Vec<u64> = t
                .rows
                .range(below(cursor))
                .rev()
                .filter(|(_, r)| {
                    matches(
                        filter,
                        &r.message,
                        r.tracked.status,
                        r.tracked.state.last_error.as_deref(),
                    )
                })
                // As on PostgreSQL: a requeue never picks a replayed original, so
                // a batch of them cannot end the action early.
                .filter(|(_, r)| !matches!(action, Action::Requeue) || r.replayed_as.is_none())
                .take(room.min(BULK_BATCH))
                .map(|(seq, _)| *seq)
                .collect();
            let Some(&last) = picked.last() else {
                break;
            };
            cursor = Some(PageCursor(last));
            outcome.matched += picked.len() as u64;
            for seq in picked {
                if apply(&mut t, seq, action, now) {
                    outcome.changed += 1;
                }
            }
        }
        outcome
    }
}

/// Applies `action` to row `seq` if its status (and, for a forced delete, its
/// lease) allows; whether it changed.
fn apply(t: &mut Table, seq: u64, action: &Action, now: outbox_core::Timestamp) -> bool {
    let Some(row) = t.rows.get_mut(&seq) else {
        return false;
    };
    match action {
        Action::Requeue => {
            // Never a row a relay's live lease holds (see OutboxOperator::requeue_message).
            // Nor one replayed: its replay carries its effect already.
            if !requeueable_statuses().contains(&row.tracked.status)
                || row.lease.is_live(now)
                || row.replayed_as.is_some()
            {
                return false;
            }
            let revived = row.tracked.revive(now).is_ok();
            if revived {
                row.lease.clear();
            }
            revived
        }
        Action::Delete { force } => {
            if !deletable(row, *force, now) {
                return false;
            }
            let id = row.message.id;
            t.rows.remove(&seq);
            t.by_id.remove(&id);
            true
        }
    }
}

/// Whether an operator's delete may remove `row`: a dead one, or with `force` a
/// pending or failed one that no live lease holds (a relay may be publishing it).
fn deletable(row: &Row, force: bool, now: outbox_core::Timestamp) -> bool {
    let status = row.tracked.status;
    deletable_statuses(force).contains(&status)
        && (status.can_be_deleted() || !row.lease.is_live(now))
}

#[async_trait]
impl OutboxOperator for MemoryOutboxStore {
    async fn blocked_keys(
        &self,
        after: Option<String>,
        limit: u32,
    ) -> Result<Vec<BlockedKey>, PortError> {
        let t = lock(&self.table);
        let stuck = self.dead_head().stuck();
        let heads = self.key_heads(&t);
        let from = match after {
            Some(k) => std::ops::Bound::Excluded(k),
            None => std::ops::Bound::Unbounded,
        };
        Ok(heads
            .range((from, std::ops::Bound::Unbounded))
            .filter_map(|(key, (seq, behind))| {
                let row = t.rows.get(seq)?;
                stuck.contains(&row.tracked.status).then(|| BlockedKey {
                    key: key.clone(),
                    head: row.message.id,
                    status: row.tracked.status,
                    attempts: row.tracked.state.attempts,
                    last_error: row.tracked.state.last_error.clone(),
                    next_attempt_at: row.tracked.state.next_attempt_at,
                    waiting: (*behind).min(BLOCKED_WAITING_CAP),
                    waiting_capped: *behind > BLOCKED_WAITING_CAP,
                })
            })
            .take(page_limit(limit) as usize)
            .collect())
    }

    async fn exchange_counts(&self) -> Result<Vec<ExchangeCounts>, PortError> {
        let t = lock(&self.table);
        let now = self.clock.now();
        let mut by_name: std::collections::BTreeMap<&str, ExchangeCounts> =
            std::collections::BTreeMap::new();
        for row in t.rows.values() {
            let status = row.tracked.status;
            if !matches!(
                status,
                OutboxStatus::Pending | OutboxStatus::PublishFailed | OutboxStatus::Dead
            ) {
                continue;
            }
            let m = &row.message;
            let c = by_name
                .entry(m.exchange.as_str())
                .or_insert_with(|| ExchangeCounts {
                    exchange: m.exchange.clone(),
                    pending: 0,
                    publish_failed: 0,
                    dead: 0,
                    oldest_unsent_at: None,
                });
            let waits_since = match status {
                OutboxStatus::Pending => {
                    c.pending += 1;
                    match m.not_before {
                        None => Some(m.created_at),
                        Some(due) if due <= now => Some(due),
                        Some(_) => None,
                    }
                }
                OutboxStatus::PublishFailed => {
                    c.publish_failed += 1;
                    Some(m.created_at)
                }
                _ => {
                    c.dead += 1;
                    None
                }
            };
            if let Some(at) = waits_since {
                c.oldest_unsent_at = Some(c.oldest_unsent_at.map_or(at, |o| o.min(at)));
            }
        }
        Ok(by_name.into_values().collect())
    }

    async fn head_of_key(&self, key: &str) -> Result<Option<KeyHead>, PortError> {
        let t = lock(&self.table);
        let heads = self.key_heads(&t);
        Ok(heads.get(key).and_then(|(seq, behind)| {
            t.rows.get(seq).map(|row| KeyHead {
                head: row.message.id,
                waiting: (*behind).min(BLOCKED_WAITING_CAP),
                waiting_capped: *behind > BLOCKED_WAITING_CAP,
            })
        }))
    }

    async fn list_messages(
        &self,
        filter: &MessageFilter,
        after: Option<PageCursor>,
        limit: u32,
    ) -> Result<Page<MessageSummary>, PortError> {
        let t = lock(&self.table);
        Ok(page(
            in_list_order(&t.rows, after, filter.oldest_first)
                .filter(|(_, r)| {
                    matches(
                        filter,
                        &r.message,
                        r.tracked.status,
                        r.tracked.state.last_error.as_deref(),
                    )
                })
                .map(|(seq, r)| {
                    (
                        *seq,
                        summary(&r.message, r.tracked.status, &r.tracked.state, None),
                    )
                }),
            limit,
        ))
    }

    async fn get_message(&self, id: MessageId) -> Result<Option<OutboxRecord>, PortError> {
        self.record(id).await
    }

    async fn oldest_messages(
        &self,
        status: OutboxStatus,
        limit: u32,
    ) -> Result<Vec<OutboxRecord>, PortError> {
        self.records(status, limit).await
    }

    async fn requeue_message(&self, id: MessageId) -> Result<(), PortError> {
        self.requeue_record(id).await
    }

    async fn replay_message(
        &self,
        original: MessageId,
        replay: outbox_core::Message,
    ) -> Result<(), PortError> {
        self.replay_record(original, replay)
    }

    async fn publish_now(&self, id: MessageId) -> Result<(), PortError> {
        let mut t = lock(&self.table);
        let not_found = || PortError::NotFound {
            what: "message",
            id: id.to_string(),
        };
        let seq = *t.by_id.get(&id).ok_or_else(not_found)?;
        let row = t.rows.get_mut(&seq).ok_or_else(not_found)?;
        if row.tracked.status != OutboxStatus::Pending {
            return Err(PortError::IllegalTransition(
                outbox_core::TransitionError::Outbox {
                    from: row.tracked.status,
                    to: OutboxStatus::Pending,
                },
            ));
        }
        row.message.not_before = None;
        Ok(())
    }

    async fn delete_message(&self, id: MessageId, force: bool) -> Result<(), PortError> {
        if !force {
            return self.delete_record(id).await;
        }
        let now = self.clock.now();
        let mut t = lock(&self.table);
        let not_found = || PortError::NotFound {
            what: "message",
            id: id.to_string(),
        };
        let seq = *t.by_id.get(&id).ok_or_else(not_found)?;
        let row = t.rows.get(&seq).ok_or_else(not_found)?;
        if !deletable_statuses(true).contains(&row.tracked.status) {
            // Sent (or a status foreign to the outbox): the core's refusal says why.
            row.tracked.status.check_delete()?;
        }
        if !deletable(row, true, now) {
            return Err(PortError::transient(
                "delete",
                format!("message {id} is held by a relay right now; try again"),
            ));
        }
        t.rows.remove(&seq);
        t.by_id.remove(&id);
        Ok(())
    }

    async fn count_messages(&self, filter: &MessageFilter, max: u64) -> Result<u64, PortError> {
        let t = lock(&self.table);
        Ok(t.rows
            .values()
            .filter(|r| {
                matches(
                    filter,
                    &r.message,
                    r.tracked.status,
                    r.tracked.state.last_error.as_deref(),
                )
            })
            .take(usize::try_from(max).unwrap_or(usize::MAX))
            .count() as u64)
    }

    async fn requeue_matching(
        &self,
        filter: &MessageFilter,
        max: u64,
    ) -> Result<BulkOutcome, PortError> {
        Ok(self.bulk(filter, max, &Action::Requeue))
    }

    async fn delete_matching(
        &self,
        filter: &MessageFilter,
        max: u64,
        force: bool,
    ) -> Result<BulkOutcome, PortError> {
        Ok(self.bulk(filter, max, &Action::Delete { force }))
    }

    async fn failure_groups(&self) -> Result<Vec<FailureGroup>, PortError> {
        let t = lock(&self.table);
        Ok(failure_groups(
            t.rows
                .values()
                .filter(|r| {
                    matches!(
                        r.tracked.status,
                        OutboxStatus::PublishFailed | OutboxStatus::Dead
                    )
                })
                .map(|r| {
                    (
                        r.message.exchange.as_str(),
                        &r.tracked.state,
                        r.message.created_at,
                    )
                }),
        ))
    }

    async fn published_per_minute(&self, window: Duration) -> Result<Vec<MinuteCount>, PortError> {
        let since = window_start(self.clock.now(), window);
        let t = lock(&self.table);
        Ok(per_minute(
            t.rows
                .values()
                .filter(|r| r.tracked.status == OutboxStatus::Sent)
                .filter_map(|r| r.tracked.state.completed_at),
            since,
        ))
    }
}
