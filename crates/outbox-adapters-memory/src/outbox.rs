//! The outbox in memory.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use outbox_core::message::DEFAULT_MAX_PAYLOAD_BYTES;
use outbox_core::status::Tracked;
use outbox_core::{Message, MessageId, OutboxStatus};
use outbox_ports::{
    ClaimedMessage, Clock, DeadHead, Lease, OutboxRecord, OutboxRelayPath, OutboxRetention,
    OutboxStats, OutboxStore, PauseKind, PortError, PublishFailure,
};

use crate::MemoryPauses;

use crate::{LeaseSlot, lock};

#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub(crate) message: Message,
    pub(crate) tracked: Tracked<OutboxStatus>,
    pub(crate) lease: LeaseSlot,
    /// The dead message this one replays.
    pub(crate) replayed_from: Option<MessageId>,
    /// The message replaying this dead one.
    pub(crate) replayed_as: Option<MessageId>,
}

impl Row {
    fn new(message: Message, now: outbox_core::Timestamp) -> Self {
        Self {
            message,
            tracked: Tracked::new(now),
            lease: LeaseSlot::default(),
            replayed_from: None,
            replayed_as: None,
        }
    }

    fn record(&self) -> OutboxRecord {
        OutboxRecord {
            message: self.message.clone(),
            status: self.tracked.status,
            publish: self.tracked.state.clone(),
            replayed_from: self.replayed_from,
            replayed_as: self.replayed_as,
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct Table {
    /// Rows in enqueue order (the sequence plays the identity column's part).
    pub(crate) rows: BTreeMap<u64, Row>,
    pub(crate) by_id: HashMap<MessageId, u64>,
    next_seq: u64,
}

/// [`OutboxStore`] in memory, with the same claim, lease and fencing rules as the
/// PostgreSQL store.
#[derive(Clone)]
pub struct MemoryOutboxStore {
    pub(crate) table: Arc<Mutex<Table>>,
    pub(crate) clock: Arc<dyn Clock>,
    max_payload_bytes: usize,
    dead_head: DeadHead,
    pauses: MemoryPauses,
}

impl MemoryOutboxStore {
    /// An empty outbox reading time from `clock`.
    #[must_use]
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            table: Arc::default(),
            pauses: MemoryPauses::new(Arc::clone(&clock)),
            clock,
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
            dead_head: DeadHead::default(),
        }
    }

    /// Claims pass over the messages of the exchanges paused in `pauses` (by
    /// default the store's own, which [`pauses`](Self::pauses) hands out).
    #[must_use]
    pub fn with_pauses(mut self, pauses: &MemoryPauses) -> Self {
        self.pauses = pauses.clone();
        self
    }

    /// The pauses this store's claims obey, to share with an inbox and an admin
    /// service.
    #[must_use]
    pub fn pauses(&self) -> MemoryPauses {
        self.pauses.clone()
    }

    /// What a dead message does to the later messages of its ordering key (default
    /// [`DeadHead::Block`]).
    #[must_use]
    pub fn with_dead_head(mut self, dead_head: DeadHead) -> Self {
        self.dead_head = dead_head;
        self
    }

    /// Sets the payload limit (default 1 MiB).
    #[must_use]
    pub const fn with_max_payload_bytes(mut self, max: usize) -> Self {
        self.max_payload_bytes = max;
        self
    }

    /// How many messages are in each status.
    #[must_use]
    pub fn count(&self, status: OutboxStatus) -> u64 {
        lock(&self.table)
            .rows
            .values()
            .filter(|r| r.tracked.status == status)
            .count() as u64
    }

    /// Fault injection: stores messages as `Pending` without checking any limit, as
    /// rows written through plain SQL before the table's constraints existed (e.g. a
    /// routing key AMQP cannot carry). Ids already present are skipped.
    pub fn insert_unchecked(&self, messages: Vec<Message>) {
        let now = self.clock.now();
        let mut t = lock(&self.table);
        for message in messages {
            if t.by_id.contains_key(&message.id) {
                continue;
            }
            t.next_seq += 1;
            let seq = t.next_seq;
            t.by_id.insert(message.id, seq);
            t.rows.insert(seq, Row::new(message, now));
        }
    }

    /// Claims up to `limit` rows in `status` for `lease`; without a lease, only
    /// looks: which rows such a claim would take, none of them taken.
    fn claim(
        &self,
        lease: Option<&Lease>,
        limit: u32,
        status: OutboxStatus,
    ) -> Vec<ClaimedMessage> {
        let now = self.clock.now();
        let mut t = lock(&self.table);
        let mut claimed = Vec::new();
        // Keys with an earlier row still unsent (in seq order, as the walk goes):
        // a keyed row is claimable only as its key's head.
        let blocking = self.dead_head.blocking();
        let mut held_back: HashSet<String> = HashSet::new();
        for row in t.rows.values_mut() {
            if claimed.len() >= limit as usize {
                break;
            }
            let key = row.message.ordering_key.clone();
            let head = key.as_ref().is_none_or(|k| !held_back.contains(k));
            if let Some(k) = key.filter(|_| blocking.contains(&row.tracked.status)) {
                held_back.insert(k);
            }
            let due = row.tracked.state.next_attempt_at.is_none_or(|at| at <= now)
                // A delayed message waits for its due time (pending only: a failed
                // one waits for its retry).
                && (status != OutboxStatus::Pending || row.message.not_before.is_none_or(|at| at <= now));
            // A paused exchange's message stays where it is (still its key's head).
            let paused = self
                .pauses
                .is_paused(PauseKind::Exchange, &row.message.exchange);
            if row.tracked.status == status && due && head && !paused && !row.lease.is_live(now) {
                if let Some(lease) = lease {
                    row.lease.take(lease, now);
                }
                claimed.push(ClaimedMessage {
                    message: row.message.clone(),
                    attempts: row.tracked.state.attempts,
                    // Pending with a last error: failed before, requeued by an operator.
                    requeued: status == OutboxStatus::Pending
                        && row.tracked.state.last_error.is_some(),
                });
            }
        }
        claimed
    }

    /// Every ordering key with a row in a status of `dead_head.blocking()`, in key
    /// order: its head (the first such row, by seq) and how many such rows follow
    /// it. A key is blocked when its head's status is one of
    /// [`DeadHead::stuck`].
    pub(crate) fn key_heads(&self, t: &Table) -> BTreeMap<String, (u64, u64)> {
        let blocking = self.dead_head.blocking();
        let mut heads: BTreeMap<String, (u64, u64)> = BTreeMap::new();
        for (seq, row) in &t.rows {
            let Some(k) = row.message.ordering_key.as_ref() else {
                continue;
            };
            if !blocking.contains(&row.tracked.status) {
                continue;
            }
            heads
                .entry(k.clone())
                .and_modify(|(_, behind)| *behind += 1)
                .or_insert((*seq, 0));
        }
        heads
    }

    /// What a dead message does to its key in this store.
    pub(crate) const fn dead_head(&self) -> DeadHead {
        self.dead_head
    }

    fn with_row<T>(
        &self,
        id: MessageId,
        f: impl FnOnce(&mut Table, u64) -> Result<T, PortError>,
    ) -> Result<T, PortError> {
        let mut t = lock(&self.table);
        let seq = *t.by_id.get(&id).ok_or_else(|| PortError::NotFound {
            what: "message",
            id: id.to_string(),
        })?;
        f(&mut t, seq)
    }
}

#[async_trait]
impl OutboxRelayPath for MemoryOutboxStore {
    async fn claim_pending(
        &self,
        lease: &Lease,
        limit: u32,
    ) -> Result<Vec<ClaimedMessage>, PortError> {
        Ok(self.claim(Some(lease), limit, OutboxStatus::Pending))
    }

    async fn claim_due_retries(
        &self,
        lease: &Lease,
        limit: u32,
    ) -> Result<Vec<ClaimedMessage>, PortError> {
        Ok(self.claim(Some(lease), limit, OutboxStatus::PublishFailed))
    }

    async fn next_due_in(&self) -> Result<Option<std::time::Duration>, PortError> {
        let now = self.clock.now();
        let t = lock(&self.table);
        Ok(t.rows
            .values()
            .filter(|r| r.tracked.status == OutboxStatus::Pending)
            .filter_map(|r| r.message.not_before)
            .filter(|due| *due > now)
            .min()
            .map(|due| std::time::Duration::try_from(due - now).unwrap_or_default()))
    }

    async fn pending_claimable(&self) -> Result<Option<bool>, PortError> {
        Ok(Some(!self.claim(None, 1, OutboxStatus::Pending).is_empty()))
    }

    async fn mark_sent(&self, lease: &Lease, ids: &[MessageId]) -> Result<u64, PortError> {
        let now = self.clock.now();
        let mut t = lock(&self.table);
        let mut marked = 0;
        for id in ids {
            let Some(seq) = t.by_id.get(id).copied() else {
                continue;
            };
            if let Some(row) = t.rows.get_mut(&seq).filter(|r| r.lease.is_held_by(lease)) {
                row.tracked.succeed(now)?;
                row.lease.clear();
                marked += 1;
            }
        }
        Ok(marked)
    }

    async fn mark_publish_failed(
        &self,
        lease: &Lease,
        failures: &[PublishFailure],
    ) -> Result<u64, PortError> {
        let now = self.clock.now();
        let mut t = lock(&self.table);
        let mut marked = 0;
        for f in failures {
            let Some(seq) = t.by_id.get(&f.id).copied() else {
                continue;
            };
            if let Some(row) = t.rows.get_mut(&seq).filter(|r| r.lease.is_held_by(lease)) {
                row.tracked.fail(now, &f.error, f.decision)?;
                row.lease.clear();
                marked += 1;
            }
        }
        Ok(marked)
    }

    async fn release(&self, lease: &Lease, ids: &[MessageId]) -> Result<u64, PortError> {
        let mut t = lock(&self.table);
        let mut released = 0;
        for id in ids {
            let Some(seq) = t.by_id.get(id).copied() else {
                continue;
            };
            if let Some(row) = t.rows.get_mut(&seq).filter(|r| r.lease.is_held_by(lease)) {
                row.lease.clear();
                released += 1;
            }
        }
        Ok(released)
    }

    async fn recover_expired_leases(&self) -> Result<u64, PortError> {
        let now = self.clock.now();
        let mut t = lock(&self.table);
        let mut recovered = 0;
        for row in t.rows.values_mut() {
            if row.lease.holder.is_some() && !row.lease.is_live(now) {
                row.lease.clear();
                recovered += 1;
            }
        }
        Ok(recovered)
    }
}

#[async_trait]
impl OutboxRetention for MemoryOutboxStore {
    async fn delete_sent_batch(
        &self,
        age: std::time::Duration,
        limit: u32,
    ) -> Result<u64, PortError> {
        let Some(before) = crate::older_than(self.clock.now(), age) else {
            return Ok(0);
        };
        let mut t = lock(&self.table);
        let mut old: Vec<(outbox_core::Timestamp, u64)> = t
            .rows
            .iter()
            .filter(|(_, r)| r.tracked.status == OutboxStatus::Sent)
            .filter_map(|(seq, r)| r.tracked.state.completed_at.map(|at| (at, *seq)))
            .filter(|(at, _)| *at < before)
            .collect();
        old.sort_unstable();
        old.truncate(limit.max(1) as usize);
        for (_, seq) in &old {
            if let Some(row) = t.rows.remove(seq) {
                t.by_id.remove(&row.message.id);
            }
        }
        Ok(old.len() as u64)
    }
}

#[async_trait]
impl OutboxStore for MemoryOutboxStore {
    async fn enqueue(&self, mut messages: Vec<Message>) -> Result<(), PortError> {
        for m in &mut messages {
            outbox_ports::trace_context::record_create(m);
        }
        let now = self.clock.now();
        let mut t = lock(&self.table);
        for m in &messages {
            m.validate(self.max_payload_bytes)?;
            if t.by_id.contains_key(&m.id) {
                return Err(PortError::fatal(
                    "enqueue",
                    format!("message id {} is already in the outbox", m.id),
                ));
            }
        }
        for message in messages {
            t.next_seq += 1;
            let seq = t.next_seq;
            t.by_id.insert(message.id, seq);
            t.rows.insert(seq, Row::new(message, now));
        }
        Ok(())
    }

    async fn stats(&self) -> Result<OutboxStats, PortError> {
        let now = self.clock.now();
        let t = lock(&self.table);
        let mut s = OutboxStats::default();
        // Keys whose head is failing or (unless skipped) dead.
        let stuck = self.dead_head.stuck();
        s.blocked_keys = self
            .key_heads(&t)
            .values()
            .filter(|(seq, _)| {
                t.rows
                    .get(seq)
                    .is_some_and(|r| stuck.contains(&r.tracked.status))
            })
            .count() as u64;
        for row in t.rows.values() {
            match row.tracked.status {
                OutboxStatus::Pending => {
                    s.pending += 1;
                    s.scheduled += u64::from(row.message.not_before.is_some());
                }
                OutboxStatus::PublishFailed => s.publish_failed += 1,
                OutboxStatus::Dead => s.dead += 1,
                OutboxStatus::Sent => {}
            }
            // A delayed message waits from its due time, and only once overdue.
            let waiting_since = match (row.tracked.status, row.message.not_before) {
                (OutboxStatus::Pending, Some(due)) => (due <= now).then_some(due),
                (OutboxStatus::Pending | OutboxStatus::PublishFailed, _) => {
                    Some(row.message.created_at)
                }
                _ => None,
            };
            if let Some(at) = waiting_since {
                s.oldest_unsent_at = Some(s.oldest_unsent_at.map_or(at, |o| o.min(at)));
            }
        }
        Ok(s)
    }

    fn max_payload_bytes(&self) -> usize {
        self.max_payload_bytes
    }
}

/// The record-level calls of the operator's interface ([`outbox_ports::OutboxOperator`]).
impl MemoryOutboxStore {
    pub(crate) async fn record(&self, id: MessageId) -> Result<Option<OutboxRecord>, PortError> {
        let t = lock(&self.table);
        Ok(t.by_id
            .get(&id)
            .and_then(|s| t.rows.get(s))
            .map(Row::record))
    }

    pub(crate) async fn records(
        &self,
        status: OutboxStatus,
        limit: u32,
    ) -> Result<Vec<OutboxRecord>, PortError> {
        let t = lock(&self.table);
        Ok(t.rows
            .values()
            .filter(|r| r.tracked.status == status)
            .take(limit as usize)
            .map(Row::record)
            .collect())
    }

    pub(crate) async fn requeue_record(&self, id: MessageId) -> Result<(), PortError> {
        let now = self.clock.now();
        self.with_row(id, |t, seq| {
            let row = t.rows.get_mut(&seq).ok_or_else(|| PortError::NotFound {
                what: "message",
                id: id.to_string(),
            })?;
            if let Some(replay) = row.replayed_as {
                return Err(outbox_ports::replayed_refusal("message", id, replay));
            }
            if row.tracked.status.can_become(OutboxStatus::Pending) && row.lease.is_live(now) {
                return Err(PortError::Busy {
                    what: "message",
                    id: id.to_string(),
                    holder: "a relay is publishing it",
                });
            }
            row.tracked.revive(now)?;
            row.lease.clear();
            Ok(())
        })
    }

    pub(crate) fn replay_record(
        &self,
        original: MessageId,
        replay: Message,
    ) -> Result<(), PortError> {
        replay.validate(self.max_payload_bytes)?;
        let now = self.clock.now();
        self.with_row(original, |t, seq| {
            if t.by_id.contains_key(&replay.id) {
                return Err(PortError::fatal(
                    "replay",
                    format!("message id {} is already in the outbox", replay.id),
                ));
            }
            let row = t.rows.get_mut(&seq).ok_or_else(|| PortError::NotFound {
                what: "message",
                id: original.to_string(),
            })?;
            if let Some(refused) = outbox_ports::replay_refusal(
                "message",
                original,
                row.tracked.status,
                row.message.ordering_key.is_some(),
                row.replayed_as,
            ) {
                return Err(refused);
            }
            row.replayed_as = Some(replay.id);
            let id = replay.id;
            let mut new = Row::new(replay, now);
            new.replayed_from = Some(original);
            t.next_seq += 1;
            let seq = t.next_seq;
            t.by_id.insert(id, seq);
            t.rows.insert(seq, new);
            Ok(())
        })
    }

    pub(crate) async fn delete_record(&self, id: MessageId) -> Result<(), PortError> {
        self.with_row(id, |t, seq| {
            if let Some(row) = t.rows.get(&seq) {
                row.tracked.status.check_delete()?;
            }
            t.rows.remove(&seq);
            t.by_id.remove(&id);
            Ok(())
        })
    }
}
