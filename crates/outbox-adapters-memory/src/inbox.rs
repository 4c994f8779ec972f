//! The inbox in memory.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use outbox_core::status::Tracked;
use outbox_core::{Decision, InboxStatus, Message, MessageId, Timestamp, TransitionError};
use outbox_ports::{
    Arrival, ClaimedDelivery, Clock, DeadLetter, InboxConsumerPath, InboxRecord, InboxRetention,
    InboxStats, InboxStore, Lease, PortError,
};

use crate::{LeaseSlot, lock};

#[derive(Debug, Clone)]
pub(crate) struct Row {
    /// Arrival order (the key of [`Table::order`]).
    pub(crate) seq: u64,
    pub(crate) message: Message,
    pub(crate) tracked: Tracked<InboxStatus>,
    pub(crate) lease: LeaseSlot,
    /// When it arrived (its first record).
    pub(crate) received_at: Timestamp,
    /// The dead delivery this one replays.
    pub(crate) replayed_from: Option<MessageId>,
    /// The delivery replaying this dead one.
    pub(crate) replayed_as: Option<MessageId>,
}

pub(crate) type Key = (String, MessageId);

/// Received and not yet handled, or failed and waiting for its retry: what holds
/// later deliveries of its ordering key back.
fn unfinished(row: &Row) -> bool {
    matches!(
        row.tracked.status,
        InboxStatus::Received | InboxStatus::ConsumeFailed
    )
}

/// A dead letter with the consumer that received it and when.
#[derive(Debug, Clone)]
pub(crate) struct KeptLetter {
    pub(crate) consumer: String,
    pub(crate) letter: DeadLetter,
    pub(crate) received_at: Timestamp,
}

#[derive(Debug, Default)]
pub(crate) struct Table {
    pub(crate) rows: HashMap<Key, Row>,
    /// Arrival order, for claims and listings.
    pub(crate) order: BTreeMap<u64, Key>,
    next_seq: u64,
    /// Dead letters by id (arrival order, from 1).
    pub(crate) dead_letters: BTreeMap<u64, KeptLetter>,
    next_letter: u64,
}

/// [`InboxStore`] in memory: dedup by (consumer, message id), leases while a handler
/// runs, failures kept for the consume sweep.
#[derive(Clone)]
pub struct MemoryInboxStore {
    pub(crate) table: Arc<Mutex<Table>>,
    pub(crate) clock: Arc<dyn Clock>,
    pauses: crate::MemoryPauses,
}

impl MemoryInboxStore {
    /// An empty inbox reading time from `clock`.
    #[must_use]
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            table: Arc::default(),
            pauses: crate::MemoryPauses::new(Arc::clone(&clock)),
            clock,
        }
    }

    /// Consumers paused in `pauses` take no deliveries (by default the store's
    /// own, which [`pauses`](Self::pauses) hands out).
    #[must_use]
    pub fn with_pauses(mut self, pauses: &crate::MemoryPauses) -> Self {
        self.pauses = pauses.clone();
        self
    }

    /// The pauses this store's consumers obey.
    #[must_use]
    pub fn pauses(&self) -> crate::MemoryPauses {
        self.pauses.clone()
    }

    /// The dead letters kept for `consumer`.
    #[must_use]
    pub fn dead_letters(&self, consumer: &str) -> Vec<DeadLetter> {
        lock(&self.table)
            .dead_letters
            .values()
            .filter(|k| k.consumer == consumer)
            .map(|k| k.letter.clone())
            .collect()
    }

    /// Whether an earlier row than `seq` of `consumer` with ordering key `key` is
    /// unfinished (received or failed, not consumed or dead).
    fn earlier_unfinished(t: &Table, consumer: &str, key: &str, seq: u64) -> bool {
        t.order.range(..seq).any(|(_, k)| {
            k.0 == consumer
                && t.rows.get(k).is_some_and(|r| {
                    unfinished(r) && r.message.ordering_key.as_deref() == Some(key)
                })
        })
    }

    fn insert<'t>(t: &'t mut Table, key: Key, message: &Message, now: Timestamp) -> &'t mut Row {
        t.next_seq += 1;
        let seq = t.next_seq;
        t.order.insert(seq, key.clone());
        t.rows.entry(key).or_insert(Row {
            seq,
            message: message.clone(),
            tracked: Tracked::new(now),
            lease: LeaseSlot::default(),
            received_at: now,
            replayed_from: None,
            replayed_as: None,
        })
    }

    fn mark(
        &self,
        consumer: &str,
        id: MessageId,
        lease: &Lease,
        apply: impl FnOnce(&mut Tracked<InboxStatus>, Timestamp) -> Result<(), PortError>,
    ) -> Result<bool, PortError> {
        let now = self.clock.now();
        let mut t = lock(&self.table);
        match t
            .rows
            .get_mut(&(consumer.to_owned(), id))
            .filter(|r| r.lease.is_held_by(lease))
        {
            Some(row) => {
                apply(&mut row.tracked, now)?;
                row.lease.clear();
                Ok(true)
            }
            None => Ok(false),
        }
    }
}

#[async_trait]
impl InboxConsumerPath for MemoryInboxStore {
    async fn record_arrival(
        &self,
        consumer: &str,
        message: &Message,
        lease: &Lease,
    ) -> Result<Arrival, PortError> {
        let now = self.clock.now();
        let mut t = lock(&self.table);
        let key = (consumer.to_owned(), message.id);
        if let Some(row) = t.rows.get(&key) {
            // Received before but its worker vanished (lease ran out): take it over,
            // unless it waits behind an earlier delivery of its key.
            let behind = row
                .message
                .ordering_key
                .as_deref()
                .is_some_and(|k| Self::earlier_unfinished(&t, consumer, k, row.seq));
            let status = row.tracked.status;
            if status == InboxStatus::Received && !row.lease.is_live(now) && !behind {
                if let Some(row) = t.rows.get_mut(&key) {
                    row.lease.take(lease, now);
                }
                return Ok(Arrival::New);
            }
            return Ok(Arrival::Duplicate(status));
        }
        Self::insert(&mut t, key, message, now)
            .lease
            .take(lease, now);
        Ok(Arrival::New)
    }

    async fn record_given_up(
        &self,
        consumer: &str,
        message: &Message,
        reason: &str,
    ) -> Result<bool, PortError> {
        let now = self.clock.now();
        let mut t = lock(&self.table);
        let key = (consumer.to_owned(), message.id);
        if t.rows.contains_key(&key) {
            return Ok(false);
        }
        let row = Self::insert(&mut t, key, message, now);
        row.tracked = Tracked {
            status: InboxStatus::Dead,
            state: outbox_core::SideState {
                last_attempt_at: Some(now),
                last_error: Some(reason.to_owned()),
                ..outbox_core::SideState::default()
            },
        };
        Ok(true)
    }

    async fn hold_behind_key(&self, consumer: &str, message: &Message) -> Result<bool, PortError> {
        let Some(k) = message.ordering_key.as_deref() else {
            return Ok(false);
        };
        let now = self.clock.now();
        let mut t = lock(&self.table);
        let key = (consumer.to_owned(), message.id);
        if t.rows.contains_key(&key) || !Self::earlier_unfinished(&t, consumer, k, u64::MAX) {
            return Ok(false);
        }
        // No lease: the consume sweep claims it once it is the head of its key. No
        // due time either, as on PostgreSQL: it waits for its key, not a clock
        // (a claim takes a row without one as due, the head rule holding it).
        Self::insert(&mut t, key, message, now)
            .tracked
            .state
            .next_attempt_at = None;
        Ok(true)
    }

    async fn mark_consumed(
        &self,
        consumer: &str,
        id: MessageId,
        lease: &Lease,
    ) -> Result<bool, PortError> {
        self.mark(consumer, id, lease, |tr, now| Ok(tr.succeed(now)?))
    }

    async fn mark_consume_failed(
        &self,
        consumer: &str,
        id: MessageId,
        lease: &Lease,
        error: &str,
        decision: Decision,
    ) -> Result<bool, PortError> {
        self.mark(consumer, id, lease, |tr, now| {
            Ok(tr.fail(now, error, decision)?)
        })
    }

    async fn claim_due(
        &self,
        consumer: &str,
        lease: &Lease,
        limit: u32,
    ) -> Result<Vec<ClaimedDelivery>, PortError> {
        let now = self.clock.now();
        let mut guard = lock(&self.table);
        let t = &mut *guard;
        let mut claimed = Vec::new();
        // Keys with an unfinished row seen so far (in arrival order): their later
        // rows wait.
        let mut blocked: HashSet<String> = HashSet::new();
        for key in t.order.values() {
            if claimed.len() >= limit as usize {
                break;
            }
            if key.0 != consumer {
                continue;
            }
            let Some(row) = t.rows.get_mut(key) else {
                continue;
            };
            let ordering_key = row.message.ordering_key.clone();
            let behind = ordering_key.as_ref().is_some_and(|k| blocked.contains(k));
            if let Some(k) = ordering_key.filter(|_| unfinished(row)) {
                blocked.insert(k);
            }
            let due = row.tracked.state.next_attempt_at.is_none_or(|at| at <= now);
            if unfinished(row) && due && !behind && !row.lease.is_live(now) {
                row.lease.take(lease, now);
                claimed.push(ClaimedDelivery {
                    message: row.message.clone(),
                    attempts: row.tracked.state.attempts,
                });
            }
        }
        Ok(claimed)
    }

    async fn consumer_paused(&self, consumer: &str) -> Result<bool, PortError> {
        Ok(self
            .pauses
            .is_paused(outbox_ports::PauseKind::Consumer, consumer))
    }

    async fn record_dead_letter(
        &self,
        consumer: &str,
        letter: DeadLetter,
    ) -> Result<(), PortError> {
        let received_at = self.clock.now();
        let mut t = lock(&self.table);
        t.next_letter += 1;
        let id = t.next_letter;
        t.dead_letters.insert(
            id,
            KeptLetter {
                consumer: consumer.to_owned(),
                letter,
                received_at,
            },
        );
        Ok(())
    }
}

#[async_trait]
impl InboxStore for MemoryInboxStore {
    async fn stats(&self, consumer: &str) -> Result<InboxStats, PortError> {
        let t = lock(&self.table);
        let mut s = InboxStats {
            dead_letters: t
                .dead_letters
                .values()
                .filter(|k| k.consumer == consumer)
                .count() as u64,
            ..InboxStats::default()
        };
        for ((c, _), row) in &t.rows {
            if c != consumer {
                continue;
            }
            match row.tracked.status {
                InboxStatus::Consumed => s.consumed += 1,
                InboxStatus::ConsumeFailed => s.consume_failed += 1,
                InboxStatus::Dead => s.dead += 1,
                _ => s.received += 1,
            }
        }
        Ok(s)
    }
}

#[async_trait]
impl InboxRetention for MemoryInboxStore {
    async fn delete_consumed_batch(
        &self,
        consumer: &str,
        age: std::time::Duration,
        limit: u32,
    ) -> Result<u64, PortError> {
        let Some(before) = crate::older_than(self.clock.now(), age) else {
            return Ok(0);
        };
        let mut t = lock(&self.table);
        let mut old: Vec<(Timestamp, u64, Key)> = t
            .rows
            .iter()
            .filter(|((c, _), r)| c == consumer && r.tracked.status == InboxStatus::Consumed)
            .filter_map(|(k, r)| {
                r.tracked
                    .state
                    .completed_at
                    .map(|at| (at, r.seq, k.clone()))
            })
            .filter(|(at, _, _)| *at < before)
            .collect();
        old.sort_unstable();
        old.truncate(limit.max(1) as usize);
        for (_, seq, key) in &old {
            t.rows.remove(key);
            t.order.remove(seq);
        }
        Ok(old.len() as u64)
    }
}

/// The record-level calls of the operator's interface ([`outbox_ports::InboxOperator`]).
impl MemoryInboxStore {
    pub(crate) async fn record(
        &self,
        consumer: &str,
        id: MessageId,
    ) -> Result<Option<InboxRecord>, PortError> {
        let t = lock(&self.table);
        Ok(t.rows
            .get(&(consumer.to_owned(), id))
            .map(|r| record(consumer, r)))
    }

    pub(crate) async fn records(
        &self,
        consumer: &str,
        status: InboxStatus,
        limit: u32,
    ) -> Result<Vec<InboxRecord>, PortError> {
        let t = lock(&self.table);
        Ok(t.order
            .values()
            .filter(|k| k.0 == consumer)
            .filter_map(|k| t.rows.get(k))
            .filter(|r| r.tracked.status == status)
            .take(limit as usize)
            .map(|r| record(consumer, r))
            .collect())
    }

    pub(crate) fn replay_record(
        &self,
        consumer: &str,
        original: MessageId,
        replay: Message,
    ) -> Result<(), PortError> {
        replay.validate(outbox_core::message::DEFAULT_MAX_PAYLOAD_BYTES)?;
        let now = self.clock.now();
        let mut t = lock(&self.table);
        let new_key = (consumer.to_owned(), replay.id);
        if t.rows.contains_key(&new_key) {
            return Err(PortError::fatal(
                "replay",
                format!("consumer {consumer} has a delivery {} already", replay.id),
            ));
        }
        let row = t
            .rows
            .get_mut(&(consumer.to_owned(), original))
            .ok_or_else(|| PortError::NotFound {
                what: "delivery",
                id: original.to_string(),
            })?;
        if let Some(refused) = outbox_ports::replay_refusal(
            "delivery",
            original,
            row.tracked.status,
            row.message.ordering_key.is_some(),
            row.replayed_as,
        ) {
            return Err(refused);
        }
        row.replayed_as = Some(replay.id);
        // Received and due now, as a reconsumed delivery: the consume sweep runs
        // the handler on it.
        let new = Self::insert(&mut t, new_key, &replay, now);
        new.replayed_from = Some(original);
        Ok(())
    }

    pub(crate) async fn reconsume_record(
        &self,
        consumer: &str,
        id: MessageId,
        again: bool,
    ) -> Result<(), PortError> {
        let now = self.clock.now();
        let mut t = lock(&self.table);
        let row =
            t.rows
                .get_mut(&(consumer.to_owned(), id))
                .ok_or_else(|| PortError::NotFound {
                    what: "delivery",
                    id: id.to_string(),
                })?;
        if let Some(replay) = row.replayed_as {
            return Err(outbox_ports::replayed_refusal("delivery", id, replay));
        }
        let from = row.tracked.status;
        if !outbox_ports::reconsumable_from(again).contains(&from) {
            return Err(TransitionError::Inbox {
                from,
                to: InboxStatus::Received,
            }
            .into());
        }
        if row.lease.is_live(now) {
            return Err(PortError::Busy {
                what: "delivery",
                id: id.to_string(),
                holder: "a worker or a consume retry is handling it",
            });
        }
        row.tracked.revive(now)?;
        row.lease.clear();
        Ok(())
    }
}

pub(crate) fn record(consumer: &str, r: &Row) -> InboxRecord {
    InboxRecord {
        consumer: consumer.to_owned(),
        message: r.message.clone(),
        status: r.tracked.status,
        consume: r.tracked.state.clone(),
        replayed_from: r.replayed_from,
        replayed_as: r.replayed_as,
    }
}
