//! The operator's view of the memory inbox and its dead letters.

use std::collections::BTreeSet;
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::{InboxStatus, MessageId};
use outbox_ports::{
    BulkOutcome, ConsumerSummary, DeliveryFilter, DeliverySummary, FailureGroup, InboxOperator,
    InboxRecord, InboxStore, MinuteCount, PREVIEW_BYTES, Page, PageCursor, PortError,
    StoredDeadLetter, reconsumable_statuses,
};

use crate::inbox::{KeptLetter, MemoryInboxStore, record};
use crate::listing::{
    BULK_BATCH, below, failure_groups, in_list_order, matches, page, per_minute, summary,
    window_start,
};
use crate::lock;

/// `k` as stored; `preview` keeps only the first [`PREVIEW_BYTES`] of its body
/// (list pages).
fn stored(id: u64, k: &KeptLetter, preview: bool) -> StoredDeadLetter {
    let body = &k.letter.body;
    let shown = if preview {
        &body[..body.len().min(PREVIEW_BYTES)]
    } else {
        body
    };
    StoredDeadLetter {
        id,
        consumer: k.consumer.clone(),
        message_id: k.letter.message_id.clone(),
        routing_key: k.letter.routing_key.clone(),
        headers: k.letter.headers.clone(),
        body: shown.to_vec(),
        body_size: body.len() as u64,
        reason: k.letter.reason.clone(),
        received_at: k.received_at,
    }
}

#[async_trait]
impl InboxOperator for MemoryInboxStore {
    async fn get_delivery(
        &self,
        consumer: &str,
        id: MessageId,
    ) -> Result<Option<InboxRecord>, PortError> {
        self.record(consumer, id).await
    }

    async fn oldest_deliveries(
        &self,
        consumer: &str,
        status: InboxStatus,
        limit: u32,
    ) -> Result<Vec<InboxRecord>, PortError> {
        self.records(consumer, status, limit).await
    }

    async fn replay_delivery(
        &self,
        consumer: &str,
        original: MessageId,
        replay: outbox_core::Message,
    ) -> Result<(), PortError> {
        self.replay_record(consumer, original, replay)
    }

    async fn reconsume_delivery(
        &self,
        consumer: &str,
        id: MessageId,
        again: bool,
    ) -> Result<(), PortError> {
        self.reconsume_record(consumer, id, again).await
    }

    async fn consumers(&self) -> Result<Vec<ConsumerSummary>, PortError> {
        let names: BTreeSet<String> = {
            let t = lock(&self.table);
            t.rows
                .keys()
                .map(|(c, _)| c.clone())
                .chain(t.dead_letters.values().map(|k| k.consumer.clone()))
                .collect()
        };
        let mut consumers = Vec::with_capacity(names.len());
        for name in names {
            let stats = self.stats(&name).await?;
            consumers.push(ConsumerSummary {
                name,
                stats,
                consumed_counted: true,
            });
        }
        Ok(consumers)
    }

    async fn list_deliveries(
        &self,
        consumer: &str,
        filter: &DeliveryFilter,
        after: Option<PageCursor>,
        limit: u32,
    ) -> Result<Page<DeliverySummary>, PortError> {
        let t = lock(&self.table);
        Ok(page(
            in_list_order(&t.order, after, filter.oldest_first)
                .filter(|(_, key)| key.0 == consumer)
                .filter_map(|(seq, key)| t.rows.get(key).map(|r| (*seq, r)))
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
                        seq,
                        summary(
                            &r.message,
                            r.tracked.status,
                            &r.tracked.state,
                            Some(r.received_at),
                        ),
                    )
                }),
            limit,
        ))
    }

    async fn deliveries_of(&self, id: MessageId) -> Result<Vec<InboxRecord>, PortError> {
        let t = lock(&self.table);
        let mut found: Vec<InboxRecord> = t
            .rows
            .iter()
            .filter(|((_, m), _)| *m == id)
            .map(|((c, _), r)| record(c, r))
            .collect();
        found.sort_by(|a, b| a.consumer.cmp(&b.consumer));
        Ok(found)
    }

    async fn reconsume_matching(
        &self,
        consumer: &str,
        filter: &DeliveryFilter,
        max: u64,
    ) -> Result<BulkOutcome, PortError> {
        let reconsumable = reconsumable_statuses(filter);
        let mut outcome = BulkOutcome::default();
        let mut cursor: Option<PageCursor> = None;
        // One lock acquisition per batch, newest first, as the outbox's bulk actions.
        while outcome.matched < max {
            let now = self.clock.now();
            let mut guard = lock(&self.table);
            let t = &mut *guard;
            let room = usize::try_from(max - outcome.matched).unwrap_or(usize::MAX);
            let picked: Vec<(u64, crate::inbox::Key)> = t
                .order
                .range(below(cursor))
                .rev()
                .filter(|(_, key)| key.0 == consumer)
                .filter(|(_, key)| {
                    // A replayed original is never picked (as on PostgreSQL).
                    t.rows.get(*key).is_some_and(|r| {
                        r.replayed_as.is_none()
                            && matches(
                                filter,
                                &r.message,
                                r.tracked.status,
                                r.tracked.state.last_error.as_deref(),
                            )
                    })
                })
                .take(room.min(BULK_BATCH))
                .map(|(seq, key)| (*seq, key.clone()))
                .collect();
            let Some((last, _)) = picked.last() else {
                break;
            };
            cursor = Some(PageCursor(*last));
            outcome.matched += picked.len() as u64;
            for (_, key) in picked {
                let Some(row) = t.rows.get_mut(&key) else {
                    continue;
                };
                if reconsumable.contains(&row.tracked.status)
                    && !row.lease.is_live(now)
                    && row.tracked.revive(now).is_ok()
                {
                    row.lease.clear();
                    outcome.changed += 1;
                }
            }
        }
        Ok(outcome)
    }

    async fn count_deliveries(
        &self,
        consumer: &str,
        filter: &DeliveryFilter,
        max: u64,
    ) -> Result<u64, PortError> {
        let t = lock(&self.table);
        Ok(t.rows
            .iter()
            .filter(|((c, _), r)| {
                c == consumer
                    && matches(
                        filter,
                        &r.message,
                        r.tracked.status,
                        r.tracked.state.last_error.as_deref(),
                    )
            })
            .take(usize::try_from(max).unwrap_or(usize::MAX))
            .count() as u64)
    }

    async fn failure_groups(&self) -> Result<Vec<FailureGroup>, PortError> {
        let t = lock(&self.table);
        Ok(failure_groups(
            t.rows
                .iter()
                .filter(|(_, r)| {
                    matches!(
                        r.tracked.status,
                        InboxStatus::ConsumeFailed | InboxStatus::Dead
                    )
                })
                .map(|((consumer, _), r)| {
                    (consumer.as_str(), &r.tracked.state, r.message.created_at)
                }),
        ))
    }

    async fn consumed_per_minute(&self, window: Duration) -> Result<Vec<MinuteCount>, PortError> {
        let since = window_start(self.clock.now(), window);
        let t = lock(&self.table);
        Ok(per_minute(
            t.rows
                .values()
                .filter(|r| r.tracked.status == InboxStatus::Consumed)
                .filter_map(|r| r.tracked.state.completed_at),
            since,
        ))
    }

    async fn list_dead_letters(
        &self,
        consumer: Option<String>,
        after: Option<PageCursor>,
        limit: u32,
    ) -> Result<Page<StoredDeadLetter>, PortError> {
        let t = lock(&self.table);
        Ok(page(
            t.dead_letters
                .range(below(after))
                .rev()
                .filter(|(_, k)| consumer.as_ref().is_none_or(|c| *c == k.consumer))
                .map(|(id, k)| (*id, stored(*id, k, true))),
            limit,
        ))
    }

    async fn get_dead_letter(&self, id: u64) -> Result<Option<StoredDeadLetter>, PortError> {
        Ok(lock(&self.table)
            .dead_letters
            .get(&id)
            .map(|k| stored(id, k, false)))
    }

    async fn delete_dead_letter(&self, id: u64) -> Result<(), PortError> {
        lock(&self.table)
            .dead_letters
            .remove(&id)
            .map(|_| ())
            .ok_or_else(|| PortError::NotFound {
                what: "dead letter",
                id: id.to_string(),
            })
    }
}
