//! The operator's side of the stores: browsing, searching and acting on messages,
//! deliveries and dead letters, apart from the relay's and consumers' hot path
//! (claim, mark, release). An admin service, a dashboard or a CLI needs only these
//! small traits; a relay needs none of them.
//!
//! Lists are keyset-paginated, newest first: a page ends with a [`PageCursor`] from
//! which the next page continues, so a page far down costs what the first does
//! (no OFFSET). Every list and bulk action takes the same filter, so a bulk action
//! applies to everything the filter matches, never just to a loaded page.

use std::time::Duration;

use async_trait::async_trait;
use outbox_core::{Headers, InboxStatus, Lifecycle, MessageId, OutboxStatus, Timestamp};

use crate::{InboxRecord, OutboxRecord, PortError};

/// Bytes of a payload shown in a list item (never the whole payload).
pub const PREVIEW_BYTES: usize = 256;

/// The largest page a list returns; stores clamp `limit` to `1..=MAX_PAGE_LIMIT`.
pub const MAX_PAGE_LIMIT: u32 = 1_000;

/// `limit` as a store serves it: at least 1, at most [`MAX_PAGE_LIMIT`].
#[must_use]
pub const fn page_limit(limit: u32) -> u32 {
    if limit == 0 {
        1
    } else if limit > MAX_PAGE_LIMIT {
        MAX_PAGE_LIMIT
    } else {
        limit
    }
}

/// Statuses a requeue (one or in bulk) changes: those the core lets go back to
/// `Pending` (`Dead`, `PublishFailed`).
#[must_use]
pub fn requeueable_statuses() -> Vec<OutboxStatus> {
    OutboxStatus::ALL
        .into_iter()
        .filter(|s| s.can_become(OutboxStatus::Pending))
        .collect()
}

/// Statuses an operator's delete removes: `Dead` (the core's rule), and with
/// `force` also `Pending` and `PublishFailed` (then only rows no live lease holds;
/// stores check that in the statement). `Sent` never: retention removes those.
#[must_use]
pub fn deletable_statuses(force: bool) -> Vec<OutboxStatus> {
    OutboxStatus::ALL
        .into_iter()
        .filter(|s| {
            s.can_be_deleted()
                || (force && matches!(s, OutboxStatus::Pending | OutboxStatus::PublishFailed))
        })
        .collect()
}

/// Statuses a bulk reconsume changes: failed and dead deliveries; consumed ones
/// only when the filter asks for `Consumed` explicitly, so that an unfiltered
/// reconsume never runs every handled delivery's handler again.
#[must_use]
pub fn reconsumable_statuses(filter: &DeliveryFilter) -> Vec<InboxStatus> {
    reconsumable_from(filter.status == Some(InboxStatus::Consumed))
}

/// Statuses a reconsume (one or in bulk) changes: `Dead` and `ConsumeFailed`;
/// `Consumed` only with `again` (the operator asked to run a handled delivery's
/// handler once more). Without `again`, a failed delivery whose retry commits while
/// the operator's reconsume waits for it is left consumed: the handler has run, and
/// running it again is not what the operator asked for.
#[must_use]
pub fn reconsumable_from(again: bool) -> Vec<InboxStatus> {
    InboxStatus::ALL
        .into_iter()
        .filter(|s| s.can_become(InboxStatus::Received))
        .filter(|s| *s != InboxStatus::Consumed || again)
        .collect()
}

/// Where a keyset page ends: the next page holds only older entries. Opaque to
/// callers (the stores give it a meaning: a sequence number, an insertion index).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PageCursor(pub u64);

/// One page of a list, newest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page<T> {
    /// The entries, newest first.
    pub items: Vec<T>,
    /// Where the next page starts; `None` when this was the last one.
    pub next: Option<PageCursor>,
}

/// Which outbox messages ([`MessageFilter`]) or inbox deliveries
/// ([`DeliveryFilter`]) an operator means. Every field narrows; an empty filter
/// matches everything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageFilter<S: Lifecycle = OutboxStatus> {
    /// Only this status of the side's.
    pub status: Option<S>,
    /// Only this exchange.
    pub exchange: Option<String>,
    /// Only this routing key.
    pub routing_key: Option<String>,
    /// Only this message type.
    pub message_type: Option<String>,
    /// Only messages created at or after this time.
    pub created_after: Option<Timestamp>,
    /// Only messages created before this time.
    pub created_before: Option<Timestamp>,
    /// A message id or a correlation id, exactly.
    pub q: Option<String>,
    /// Only those whose last error is in this failure group: the error's text
    /// with what varies taken out ([`outbox_core::failure_group::failure_group`];
    /// no last error is the empty group), as [`FailureGroup::error`] names it.
    pub error_group: Option<String>,
    /// Lists only: oldest first (ascending insertion order, the cursor
    /// continuing upwards) instead of newest first. Counts and bulk actions
    /// ignore it.
    pub oldest_first: bool,
}

/// Which inbox deliveries an operator means.
pub type DeliveryFilter = MessageFilter<InboxStatus>;

impl<S: Lifecycle> Default for MessageFilter<S> {
    fn default() -> Self {
        Self {
            status: None,
            exchange: None,
            routing_key: None,
            message_type: None,
            created_after: None,
            created_before: None,
            q: None,
            error_group: None,
            oldest_first: false,
        }
    }
}

/// A list entry: everything but the payload, of which only a preview. An outbox
/// message's ([`MessageSummary`]) or an inbox delivery's ([`DeliverySummary`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageSummary<S: Lifecycle = OutboxStatus> {
    /// The message id.
    pub id: MessageId,
    /// Its status on this side.
    pub status: S,
    /// Exchange.
    pub exchange: String,
    /// Routing key.
    pub routing_key: String,
    /// Message type.
    pub message_type: Option<String>,
    /// Correlation id.
    pub correlation_id: Option<String>,
    /// When it was created.
    pub created_at: Timestamp,
    /// When this consumer received it (deliveries: the order their lists follow,
    /// newest first); `None` for outbox messages.
    pub received_at: Option<Timestamp>,
    /// Attempts on this side.
    pub attempts: u32,
    /// The last failure.
    pub last_error: Option<String>,
    /// When the next attempt is due.
    pub next_attempt_at: Option<Timestamp>,
    /// A delayed message's due time (outbox side; `None` for deliveries).
    pub due_at: Option<Timestamp>,
    /// When this side succeeded (sent at, consumed at).
    pub completed_at: Option<Timestamp>,
    /// The first [`PREVIEW_BYTES`] bytes of the payload.
    pub payload_preview: Vec<u8>,
    /// The payload's full size in bytes.
    pub payload_size: u64,
}

/// An inbox delivery's list entry.
pub type DeliverySummary = MessageSummary<InboxStatus>;

/// What a bulk action found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BulkOutcome {
    /// Entries the filter matched (at most the action's `max`).
    pub matched: u64,
    /// Entries changed (a matched entry may have moved on meanwhile, or not be in a
    /// status the action applies to).
    pub changed: u64,
}

/// How many were completed in one minute (for charts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MinuteCount {
    /// The minute's start.
    pub minute: Timestamp,
    /// Messages published (outbox) or consumed (inbox) in it.
    pub count: u64,
}

/// One exchange's unsent and dead messages (see
/// [`OutboxOperator::exchange_counts`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExchangeCounts {
    /// The exchange.
    pub exchange: String,
    /// Waiting for their first publish (delayed ones included).
    pub pending: u64,
    /// Waiting for a publish retry.
    pub publish_failed: u64,
    /// Out of retries.
    pub dead: u64,
    /// Since when its longest-waiting unsent message waits: the creation time of
    /// a pending or failed one, the due time of an overdue delayed one (a delayed
    /// one not yet due waits for nothing); `None` when none waits.
    pub oldest_unsent_at: Option<Timestamp>,
}

/// A consumer known to the inbox, with its counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerSummary {
    /// The consumer's name.
    pub name: String,
    /// Its counts: in progress, failed, dead and dead letters always exact; consumed
    /// only when `consumed_counted` (a store may leave the consumed rows uncounted,
    /// as counting them costs a read of every row a consumer ever handled).
    pub stats: crate::InboxStats,
    /// Whether `stats.consumed` was counted (else it is 0 and means nothing).
    pub consumed_counted: bool,
}

/// A stored dead letter (a delivery that could not become a message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredDeadLetter {
    /// Its id in the store.
    pub id: u64,
    /// The consumer that received it.
    pub consumer: String,
    /// The delivery's message id, when it had one.
    pub message_id: Option<String>,
    /// The routing key it came with.
    pub routing_key: String,
    /// Its headers.
    pub headers: Headers,
    /// The raw body; in a list page only its first [`PREVIEW_BYTES`] (a dead
    /// letter keeps whatever the broker delivered, however large).
    pub body: Vec<u8>,
    /// The whole body's size in bytes.
    pub body_size: u64,
    /// Why it was refused.
    pub reason: String,
    /// When it arrived.
    pub received_at: Timestamp,
}

/// How many messages [`BlockedKey::waiting`] counts at most: counting every
/// message queued behind a head would cost as many index entries as the key's
/// backlog (unbounded), so a page of blocked keys costs at most this many per key.
pub const BLOCKED_WAITING_CAP: u64 = 1_000;

/// The head of an ordering key (see [`OutboxOperator::head_of_key`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyHead {
    /// The head message's id.
    pub head: MessageId,
    /// Messages of the key waiting behind it, counted up to
    /// [`BLOCKED_WAITING_CAP`] (at least this many when `waiting_capped`).
    pub waiting: u64,
    /// More than [`BLOCKED_WAITING_CAP`] messages wait behind the head.
    pub waiting_capped: bool,
}

/// An ordering key held back by its head: the key's earliest unsent message (by
/// insert order) is failing or dead (see [`crate::DeadHead::stuck`]), so none of
/// its later messages is published until an operator requeues or deletes the head
/// (or its retry succeeds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockedKey {
    /// The ordering key.
    pub key: String,
    /// The head message's id.
    pub head: MessageId,
    /// The head's status: `PublishFailed` or `Dead`.
    pub status: OutboxStatus,
    /// The head's publish attempts.
    pub attempts: u32,
    /// The head's last publish error.
    pub last_error: Option<String>,
    /// When the head's next publish attempt is due (a failing head; `None` for a
    /// dead one).
    pub next_attempt_at: Option<Timestamp>,
    /// Messages of the key waiting behind the head (those in a status that would
    /// hold the key, see [`crate::DeadHead::blocking`]), counted up to
    /// [`BLOCKED_WAITING_CAP`]: the true number when `waiting_capped` is false, at
    /// least this many when it is true.
    pub waiting: u64,
    /// More than [`BLOCKED_WAITING_CAP`] messages wait behind the head.
    pub waiting_capped: bool,
}

/// Failing and dead messages (or deliveries) of one exchange (or consumer) with
/// one error text, as a store may count them before grouping
/// ([`group_failures`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailureCount {
    /// The error text, as stored (`last_error`; empty when none was stored).
    pub error: String,
    /// The exchange (outbox) or consumer (inbox).
    pub place: String,
    /// How many.
    pub count: u64,
    /// The earliest of their last attempts (their creation, when never tried);
    /// `None` when no time of theirs can be read (a store's row written with an
    /// `infinity` or a year past 9999).
    pub oldest: Option<Timestamp>,
    /// The latest of their last attempts.
    pub newest: Option<Timestamp>,
}

/// Failures whose errors are one text once ids, numbers and quoted values are
/// taken out ([`outbox_core::failure_group::failure_group`]), per exchange or
/// consumer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailureGroup {
    /// The error with what varies taken out.
    pub error: String,
    /// One error text of the group as stored (the first in byte order: any
    /// would do, and this one a store finds without sorting the texts by count).
    pub example: String,
    /// The exchange (outbox) or consumer (inbox).
    pub place: String,
    /// How many failures.
    pub count: u64,
    /// The earliest last attempt among them (`None`: none readable).
    pub oldest: Option<Timestamp>,
    /// The latest.
    pub newest: Option<Timestamp>,
}

/// The earlier of two times, either of which may be unknown.
fn earlier(a: Option<Timestamp>, b: Option<Timestamp>) -> Option<Timestamp> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// `counts` merged into groups: one per exchange or consumer and error text with
/// what varies taken out, the largest first (then by place and text, so the order
/// is stable).
#[must_use]
pub fn group_failures(counts: Vec<FailureCount>) -> Vec<FailureGroup> {
    let mut groups: std::collections::BTreeMap<(String, String), FailureGroup> =
        std::collections::BTreeMap::new();
    for c in counts {
        let error = outbox_core::failure_group::failure_group(&c.error);
        match groups.entry((c.place.clone(), error.clone())) {
            std::collections::btree_map::Entry::Vacant(v) => {
                v.insert(FailureGroup {
                    error,
                    example: c.error,
                    place: c.place,
                    count: c.count,
                    oldest: c.oldest,
                    newest: c.newest,
                });
            }
            std::collections::btree_map::Entry::Occupied(mut o) => {
                let g = o.get_mut();
                g.count += c.count;
                g.oldest = earlier(g.oldest, c.oldest);
                g.newest = g.newest.max(c.newest);
                if c.error < g.example {
                    g.example = c.error;
                }
            }
        }
    }
    let mut out: Vec<FailureGroup> = groups.into_values().collect();
    out.sort_by(|a, b| {
        b.count
            .cmp(&a.count)
            .then_with(|| a.place.cmp(&b.place))
            .then_with(|| a.error.cmp(&b.error))
    });
    out
}

/// The operator's view of the outbox.
#[cfg_attr(feature = "mocks", mockall::automock)]
#[async_trait]
pub trait OutboxOperator: Send + Sync {
    /// A page of the messages matching `filter`, newest first, continuing after
    /// `after` (the previous page's cursor). `limit` is clamped by [`page_limit`].
    ///
    /// # Errors
    /// [`PortError::Transient`] when the store cannot be reached.
    async fn list_messages(
        &self,
        filter: &MessageFilter,
        after: Option<PageCursor>,
        limit: u32,
    ) -> Result<Page<MessageSummary>, PortError>;

    /// One message with its publish side.
    ///
    /// # Errors
    /// [`PortError::Transient`] when the store cannot be reached.
    async fn get_message(&self, id: MessageId) -> Result<Option<OutboxRecord>, PortError>;

    /// Up to `limit` messages in `status`, oldest first, with their publish side.
    ///
    /// # Errors
    /// [`PortError::Transient`] when the store cannot be reached.
    async fn oldest_messages(
        &self,
        status: OutboxStatus,
        limit: u32,
    ) -> Result<Vec<OutboxRecord>, PortError>;

    /// A `Dead` or `PublishFailed` message back to `Pending`, due now, with a fresh
    /// retry budget. Never one a relay holds (a live lease: it may be on its way to
    /// the broker), and never one that was sent meanwhile: the status is checked
    /// on the row as it is once no one else holds it.
    ///
    /// # Errors
    /// [`PortError::NotFound`] for an unknown id; [`PortError::Busy`] while a relay's
    /// lease holds it; [`PortError::IllegalTransition`] when the message is in
    /// another status.
    async fn requeue_message(&self, id: MessageId) -> Result<(), PortError>;

    /// Replays dead message `original` as `replay`, a new message an operator
    /// made from it (a new id, an edited payload and headers): in one transaction
    /// `original` is marked replayed as `replay.id` and stays dead, and `replay`
    /// is stored pending, replaying `original`. At most once per original: one
    /// already replayed, or requeued meanwhile, is refused by the statement's own
    /// guard. A keyed original is refused (its replay would go behind its key's
    /// later messages, and the dead head would hold the key for ever).
    ///
    /// # Errors
    /// [`PortError::NotFound`]; [`PortError::Refused`] when `original` is not
    /// dead, was replayed already or is keyed; [`PortError::InvalidMessage`] when
    /// `replay` breaks a limit.
    async fn replay_message(
        &self,
        original: MessageId,
        replay: outbox_core::Message,
    ) -> Result<(), PortError>;

    /// A delayed `Pending` message due now: its due time is cleared, so the next
    /// claim takes it (a pending message without one is left as it is).
    ///
    /// # Errors
    /// [`PortError::NotFound`]; [`PortError::IllegalTransition`] when it is not
    /// pending (sent, failed or dead already).
    async fn publish_now(&self, id: MessageId) -> Result<(), PortError>;

    /// Removes a message: a `Dead` one, or with `force` also a `Pending` or
    /// `PublishFailed` one that no relay holds right now (guarded in the statement).
    /// The status check is part of the delete itself, so a requeue racing it either
    /// wins (nothing is deleted) or comes too late (nothing to requeue).
    ///
    /// # Errors
    /// [`PortError::NotFound`]; [`PortError::NotDeletable`] in another status;
    /// [`PortError::Transient`] when, with `force`, a relay holds it right now.
    async fn delete_message(&self, id: MessageId, force: bool) -> Result<(), PortError>;

    /// How many messages match `filter`, counting at most `max`.
    ///
    /// # Errors
    /// [`PortError::Transient`] when the store cannot be reached.
    async fn count_messages(&self, filter: &MessageFilter, max: u64) -> Result<u64, PortError>;

    /// Requeues up to `max` messages matching `filter` (those in a requeueable
    /// status), in bounded batches.
    ///
    /// # Errors
    /// [`PortError::Transient`]; what was changed before the error stays changed.
    async fn requeue_matching(
        &self,
        filter: &MessageFilter,
        max: u64,
    ) -> Result<BulkOutcome, PortError>;

    /// Deletes up to `max` messages matching `filter` (those deletable, see
    /// [`OutboxOperator::delete_message`]), in bounded batches.
    ///
    /// # Errors
    /// [`PortError::Transient`]; what was deleted before the error stays deleted.
    async fn delete_matching(
        &self,
        filter: &MessageFilter,
        max: u64,
        force: bool,
    ) -> Result<BulkOutcome, PortError>;

    /// Messages marked sent per minute over the last `window`, oldest minute first
    /// (minutes with none are left out).
    ///
    /// # Errors
    /// [`PortError::Transient`] when the store cannot be reached.
    async fn published_per_minute(&self, window: Duration) -> Result<Vec<MinuteCount>, PortError>;

    /// The blocked ordering keys (the keys [`crate::OutboxStats::blocked_keys`]
    /// counts), in key order, starting after key `after` (the last key of the
    /// previous page; keyset pagination by key); at most `limit`, clamped by
    /// [`page_limit`]. Its cost follows the keys with unsent messages it walks
    /// until `limit` blocked ones are found (one index probe each, as a claim's),
    /// never the messages queued behind the heads (each key's `waiting` stops at
    /// [`BLOCKED_WAITING_CAP`]).
    ///
    /// # Errors
    /// [`PortError::Transient`] when the store cannot be reached.
    async fn blocked_keys(
        &self,
        after: Option<String>,
        limit: u32,
    ) -> Result<Vec<BlockedKey>, PortError>;

    /// Each exchange with a pending, failing or dead message, with how many of
    /// each and its oldest unsent message's time, by name. Reads the unsent and
    /// dead rows (each status through its own index), never the sent ones.
    ///
    /// # Errors
    /// [`PortError::Transient`] when the store cannot be reached.
    async fn exchange_counts(&self) -> Result<Vec<ExchangeCounts>, PortError>;

    /// The head of ordering key `key`: its first message in a status that holds
    /// the key back (pending or failing, and dead unless dead heads are skipped),
    /// the one every later message of the key waits behind, with how many wait;
    /// `None` when the key has no such message. One index probe, and the count
    /// stops at [`BLOCKED_WAITING_CAP`].
    ///
    /// # Errors
    /// [`PortError::Transient`] when the store cannot be reached.
    async fn head_of_key(&self, key: &str) -> Result<Option<KeyHead>, PortError>;

    /// The `PublishFailed` and `Dead` messages in groups, one per exchange and
    /// failure group ([`outbox_core::failure_group::failure_group`] of the last
    /// error), each counted exactly, the largest first (then by exchange and
    /// group). Every group, whatever the number of rows or distinct texts.
    ///
    /// # Errors
    /// [`PortError::Transient`] when the store cannot be reached.
    async fn failure_groups(&self) -> Result<Vec<FailureGroup>, PortError>;
}

/// The operator's view of the consumers' inboxes and dead letters.
#[cfg_attr(feature = "mocks", mockall::automock)]
#[async_trait]
pub trait InboxOperator: Send + Sync {
    /// Every consumer with rows or dead letters in the inbox, with its counts.
    ///
    /// # Errors
    /// [`PortError::Transient`] when the store cannot be reached.
    async fn consumers(&self) -> Result<Vec<ConsumerSummary>, PortError>;

    /// A page of `consumer`'s deliveries matching `filter`, newest first.
    ///
    /// # Errors
    /// [`PortError::Transient`] when the store cannot be reached.
    async fn list_deliveries(
        &self,
        consumer: &str,
        filter: &DeliveryFilter,
        after: Option<PageCursor>,
        limit: u32,
    ) -> Result<Page<DeliverySummary>, PortError>;

    /// One delivery of `consumer`'s.
    ///
    /// # Errors
    /// [`PortError::Transient`] when the store cannot be reached.
    async fn get_delivery(
        &self,
        consumer: &str,
        id: MessageId,
    ) -> Result<Option<InboxRecord>, PortError>;

    /// Up to `limit` of `consumer`'s deliveries in `status`, oldest first.
    ///
    /// # Errors
    /// [`PortError::Transient`] when the store cannot be reached.
    async fn oldest_deliveries(
        &self,
        consumer: &str,
        status: InboxStatus,
        limit: u32,
    ) -> Result<Vec<InboxRecord>, PortError>;

    /// A failed or dead delivery (with `again`, a consumed one too; see
    /// [`reconsumable_from`]) back to `Received`, due now, so the consume sweep
    /// runs its handler again. Never one a worker or a retry holds: the status is
    /// checked on the row as it is when no one else holds it, so a retry that
    /// commits meanwhile is not followed by a second run.
    ///
    /// # Errors
    /// [`PortError::NotFound`] for an unknown id; [`PortError::Busy`] while a worker
    /// or a retry holds it (its lease, or its transaction's row lock);
    /// [`PortError::IllegalTransition`] from any other status.
    async fn reconsume_delivery(
        &self,
        consumer: &str,
        id: MessageId,
        again: bool,
    ) -> Result<(), PortError>;

    /// Replays `consumer`'s dead delivery `original` as `replay`, a new delivery an
    /// operator made from it (a new message id, an edited payload and headers): in
    /// one transaction `original` is marked replayed as `replay.id` and stays
    /// dead, and `replay` is stored received, due now, so the consume sweep runs
    /// `consumer`'s handler on it. At most once per original (the mark's guard is
    /// in its statement); a keyed original is refused.
    ///
    /// # Errors
    /// [`PortError::NotFound`]; [`PortError::Refused`] when `original` is not dead,
    /// was replayed already or is keyed; [`PortError::InvalidMessage`] when
    /// `replay` breaks a limit.
    async fn replay_delivery(
        &self,
        consumer: &str,
        original: MessageId,
        replay: outbox_core::Message,
    ) -> Result<(), PortError>;

    /// The consume side of message `id` for every consumer that received it.
    ///
    /// # Errors
    /// [`PortError::Transient`] when the store cannot be reached.
    async fn deliveries_of(&self, id: MessageId) -> Result<Vec<InboxRecord>, PortError>;

    /// Reconsumes up to `max` of `consumer`'s deliveries matching `filter` (those in
    /// a status of [`reconsumable_statuses`]), in bounded batches.
    ///
    /// # Errors
    /// [`PortError::Transient`]; what was changed before the error stays changed.
    async fn reconsume_matching(
        &self,
        consumer: &str,
        filter: &DeliveryFilter,
        max: u64,
    ) -> Result<BulkOutcome, PortError>;

    /// How many of `consumer`'s deliveries match `filter`, counting at most `max`.
    ///
    /// # Errors
    /// [`PortError::Transient`] when the store cannot be reached.
    async fn count_deliveries(
        &self,
        consumer: &str,
        filter: &DeliveryFilter,
        max: u64,
    ) -> Result<u64, PortError>;

    /// Deliveries marked consumed per minute over the last `window`, all consumers.
    ///
    /// # Errors
    /// [`PortError::Transient`] when the store cannot be reached.
    async fn consumed_per_minute(&self, window: Duration) -> Result<Vec<MinuteCount>, PortError>;

    /// The `ConsumeFailed` and `Dead` deliveries in groups, one per consumer and
    /// failure group, each counted exactly (as [`OutboxOperator::failure_groups`]).
    ///
    /// # Errors
    /// [`PortError::Transient`] when the store cannot be reached.
    async fn failure_groups(&self) -> Result<Vec<FailureGroup>, PortError>;

    /// A page of dead letters (of `consumer`, or of all), newest first.
    ///
    /// # Errors
    /// [`PortError::Transient`] when the store cannot be reached.
    async fn list_dead_letters(
        &self,
        consumer: Option<String>,
        after: Option<PageCursor>,
        limit: u32,
    ) -> Result<Page<StoredDeadLetter>, PortError>;

    /// One dead letter.
    ///
    /// # Errors
    /// [`PortError::Transient`] when the store cannot be reached.
    async fn get_dead_letter(&self, id: u64) -> Result<Option<StoredDeadLetter>, PortError>;

    /// Removes one dead letter.
    ///
    /// # Errors
    /// [`PortError::NotFound`] for an unknown id.
    async fn delete_dead_letter(&self, id: u64) -> Result<(), PortError>;
}

/// One write done by an operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditEntry {
    /// Who: the admin token's name, or `cli:<os user>`.
    pub actor: String,
    /// What: e.g. `requeue`, `delete`, `reconsume`, `delete_dead_letter`.
    pub action: String,
    /// The target: a message id, a dead letter id, or the filter of a bulk action
    /// (as JSON).
    pub target: String,
    /// How many entries it changed.
    pub count: u64,
    /// When (set by the store).
    pub at: Option<Timestamp>,
}

/// Where operators' writes are recorded.
#[cfg_attr(feature = "mocks", mockall::automock)]
#[async_trait]
pub trait AuditLog: Send + Sync {
    /// Records one write.
    ///
    /// # Errors
    /// [`PortError::Transient`] when the store cannot be reached.
    async fn record(&self, entry: AuditEntry) -> Result<(), PortError>;

    /// A page of the recorded writes, newest first.
    ///
    /// # Errors
    /// [`PortError::Transient`] when the store cannot be reached.
    async fn list(
        &self,
        after: Option<PageCursor>,
        limit: u32,
    ) -> Result<Page<AuditEntry>, PortError>;

    /// The latest `limit` writes whose target is `target` exactly (one message's
    /// or delivery's id: what was done to it one by one), newest first.
    ///
    /// # Errors
    /// [`PortError::Transient`] when the store cannot be reached.
    async fn of_target(&self, target: &str, limit: u32) -> Result<Vec<AuditEntry>, PortError>;
}

/// Why `id` (a message or delivery, `what`) cannot be replayed, from its status,
/// key and replay link; `None` when it can. The stores' one rule, so that both
/// word it alike.
#[must_use]
pub fn replay_refusal<S: Lifecycle>(
    what: &'static str,
    id: MessageId,
    status: S,
    keyed: bool,
    replayed_as: Option<MessageId>,
) -> Option<PortError> {
    let reason = if let Some(replay) = replayed_as {
        format!("it was replayed already, as {replay}")
    } else if status != S::DEAD {
        format!("only a dead {what} can be replayed, and it is {status}")
    } else if keyed {
        "it keeps its ordering key's order, and a replay would go behind the key's later ones"
            .to_owned()
    } else {
        return None;
    };
    Some(PortError::Refused {
        what,
        id: id.to_string(),
        reason,
    })
}

/// The refusal of a requeue or reconsume of `id`, replayed as `replay`: both
/// would send its effect a second time.
#[must_use]
pub fn replayed_refusal(what: &'static str, id: MessageId, replay: MessageId) -> PortError {
    PortError::Refused {
        what,
        id: id.to_string(),
        reason: format!(
            "it was replayed as {replay}, and running it again would double its effect"
        ),
    }
}
