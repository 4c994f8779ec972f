//! The producer's outbox: messages committed with business data, claimed by relays
//! under a lease, marked sent or failed.

use std::time::Duration;

use async_trait::async_trait;
use outbox_core::message::DEFAULT_MAX_PAYLOAD_BYTES;
use outbox_core::{Decision, Message, MessageId, OutboxStatus, SideState, Timestamp};

use crate::PortError;

/// Who holds claimed rows and for how long. `holder` must be unique per claim (the
/// services add a sequence number to their instance id), because marks are fenced by
/// it: a mark only applies to rows still held by the same `holder`, so a relay whose
/// lease expired and whose rows were claimed again cannot overwrite the new claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The claim's unique holder name.
    pub holder: String,
    /// How long the claim lasts; afterwards other claimers may take the rows.
    pub ttl: Duration,
}

impl Lease {
    /// A lease for `holder`, lasting `ttl`.
    pub fn new(holder: impl Into<String>, ttl: Duration) -> Self {
        Self {
            holder: holder.into(),
            ttl,
        }
    }
}

/// A claimed message and how many publish attempts it had before this claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimedMessage {
    /// The message.
    pub message: Message,
    /// Publish attempts made before this one.
    pub attempts: u32,
    /// An operator requeued it (it failed or died before and is pending again with
    /// a fresh budget): its publish starts a new trace linked to the stored one.
    pub requeued: bool,
}

/// What a dead message does to the later messages of its ordering key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeadHead {
    /// They wait until an operator requeues or deletes it (the order is kept).
    #[default]
    Block,
    /// They go on without it (the order is kept among the rest).
    Skip,
}

impl DeadHead {
    /// The statuses of an earlier message that hold a keyed message back.
    #[must_use]
    pub const fn blocking(self) -> &'static [OutboxStatus] {
        match self {
            Self::Block => &[
                OutboxStatus::Pending,
                OutboxStatus::PublishFailed,
                OutboxStatus::Dead,
            ],
            Self::Skip => &[OutboxStatus::Pending, OutboxStatus::PublishFailed],
        }
    }

    /// The statuses of a key's head (its earliest message in a
    /// [`blocking`](Self::blocking) status, by insert order) that hold the key
    /// back: failing (waiting for its retry), or dead unless dead ones are skipped.
    /// A key is *blocked* exactly when its head is in one of these; a pending head
    /// (due, delayed or in flight) is the key moving on. [`OutboxStats::blocked_keys`]
    /// counts such keys and [`crate::OutboxOperator::blocked_keys`] lists them.
    #[must_use]
    pub const fn stuck(self) -> &'static [OutboxStatus] {
        match self {
            Self::Block => &[OutboxStatus::PublishFailed, OutboxStatus::Dead],
            Self::Skip => &[OutboxStatus::PublishFailed],
        }
    }
}

/// A failed publish to record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishFailure {
    /// Which message.
    pub id: MessageId,
    /// What went wrong (stored as the last error).
    pub error: String,
    /// Retry later, or dead (from the core's retry policy).
    pub decision: Decision,
}

/// A stored message with its publish-side state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxRecord {
    /// The message.
    pub message: Message,
    /// `Pending`, `PublishFailed`, `Sent` or `Dead`.
    pub status: OutboxStatus,
    /// Attempts, last error, next attempt, sent at.
    pub publish: SideState,
    /// The dead message this one replays (an operator edited and sent it again).
    pub replayed_from: Option<MessageId>,
    /// The message that replays this dead one: it stays dead, and is neither
    /// requeued nor replayed again (that would send its effect twice).
    pub replayed_as: Option<MessageId>,
}

/// Counts for health, metrics and the dashboard: read at every scrape and readiness
/// check, so only what costs O(unsent rows). Sent rows are not counted here (they
/// are most of the table); the relay's `outbox_published_total` counts them as they
/// are marked, and adapters may offer an exact count for operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OutboxStats {
    /// Waiting for their first publish (delayed ones included).
    pub pending: u64,
    /// Of `pending`, those with a due time (delayed messages), due or not yet.
    pub scheduled: u64,
    /// Waiting for a publish retry.
    pub publish_failed: u64,
    /// Out of retries.
    pub dead: u64,
    /// Ordering keys held back: keys whose head is failing (waiting for its retry)
    /// or dead (unless dead ones are skipped), see [`DeadHead::stuck`]; listed by
    /// [`crate::OutboxOperator::blocked_keys`].
    pub blocked_keys: u64,
    /// Since when the longest-waiting unsent message waits: the creation time of
    /// a pending or failed one, the due time of an overdue delayed one.
    pub oldest_unsent_at: Option<Timestamp>,
}

/// The relay's path through the outbox: claim under a lease, publish, then mark
/// sent or failed, or give back. The dispatcher, the retry sweep and the lease
/// recovery need only this.
#[cfg_attr(feature = "mocks", mockall::automock)]
#[async_trait]
pub trait OutboxRelayPath: Send + Sync {
    /// Claims up to `limit` `Pending` messages that no live lease holds, oldest
    /// first, for `lease`.
    ///
    /// # Errors
    /// [`PortError::Transient`] when the store cannot be reached.
    async fn claim_pending(
        &self,
        lease: &Lease,
        limit: u32,
    ) -> Result<Vec<ClaimedMessage>, PortError>;

    /// Claims up to `limit` `PublishFailed` messages whose next attempt is due and
    /// that no live lease holds, for `lease`.
    ///
    /// # Errors
    /// [`PortError::Transient`] when the store cannot be reached.
    async fn claim_due_retries(
        &self,
        lease: &Lease,
        limit: u32,
    ) -> Result<Vec<ClaimedMessage>, PortError>;

    /// Marks messages still held by `lease` as `Sent`, in one operation. Returns how
    /// many were marked; the others were claimed by someone else meanwhile.
    ///
    /// # Errors
    /// [`PortError::Transient`] when the store cannot be reached (the rows stay
    /// claimed until the lease runs out, then are published again).
    async fn mark_sent(&self, lease: &Lease, ids: &[MessageId]) -> Result<u64, PortError>;

    /// Records failed publishes of messages still held by `lease`: `PublishFailed`
    /// with the next attempt time, or `Dead`. Returns how many were recorded.
    ///
    /// # Errors
    /// [`PortError::Transient`] when the store cannot be reached.
    async fn mark_publish_failed(
        &self,
        lease: &Lease,
        failures: &[PublishFailure],
    ) -> Result<u64, PortError>;

    /// Gives claimed messages back unchanged (no attempt counted), e.g. at shutdown.
    ///
    /// # Errors
    /// [`PortError::Transient`] when the store cannot be reached.
    async fn release(&self, lease: &Lease, ids: &[MessageId]) -> Result<u64, PortError>;

    /// Clears leases that ran out (their holder vanished), so the rows show no holder
    /// again. Returns how many. Claims skip only live leases, so this is housekeeping,
    /// and a store may bound its work: PostgreSQL looks only at the front of each of
    /// the claims' picks, where a vanished relay's claims are (a lease left beyond
    /// it is overwritten by the claim that takes the row).
    ///
    /// # Errors
    /// [`PortError::Transient`] when the store cannot be reached.
    async fn recover_expired_leases(&self) -> Result<u64, PortError>;

    /// How long until the earliest due time still to come of a delayed pending
    /// message, by the store's own clock (the one its claims compare with), so a
    /// relay with nothing to claim can sleep until then instead of polling (a due
    /// one is the claim's business: one held back by its ordering key or another
    /// relay's lock must not make an idle relay spin). A duration, not a time: a
    /// relay whose clock is off from the store's would otherwise claim in a loop
    /// (ahead) or publish late (behind). The default: the store keeps no delayed
    /// messages.
    ///
    /// # Errors
    /// [`PortError::Transient`] when the store cannot be reached.
    async fn next_due_in(&self) -> Result<Option<Duration>, PortError> {
        Ok(None)
    }

    /// Whether a claim of pending messages would take anything now (a message
    /// pending, due, its key's head, and no live lease on it), were no row locked
    /// by another session: what the relay's stall watchdog calls work that is due.
    /// `None` when the store cannot tell (the default).
    ///
    /// # Errors
    /// [`PortError::Transient`] when the store cannot be reached.
    async fn pending_claimable(&self) -> Result<Option<bool>, PortError> {
        Ok(None)
    }
}

/// Retention of sent messages: the one delete the relay itself does, kept apart
/// from the relay's path and from the operator's views.
#[cfg_attr(feature = "mocks", mockall::automock)]
#[async_trait]
pub trait OutboxRetention: Send + Sync {
    /// Retention: deletes up to `limit` `Sent` messages sent more than `age` ago
    /// (by the store's clock), oldest first; returns how many. Nothing in another
    /// status is ever deleted here. One call is one short operation; callers repeat
    /// it while it returns `limit`.
    ///
    /// # Errors
    /// [`PortError::Transient`] when the store cannot be reached (what was deleted
    /// before stays deleted).
    async fn delete_sent_batch(&self, age: Duration, limit: u32) -> Result<u64, PortError>;

    /// Reclaims the space of deleted and rewritten rows, if that falls to the
    /// caller and enough of it is dead (see [`SpaceReclaim`]). Every claim and mark
    /// rewrites a row, and retention deletes: a store whose own upkeep is switched
    /// off grows without bound at a steady live size. The default: the store needs
    /// no help.
    ///
    /// # Errors
    /// [`PortError::Transient`] when the store cannot be reached.
    async fn reclaim_space(&self) -> Result<SpaceReclaim, PortError> {
        Ok(SpaceReclaim::ByTheStore)
    }
}

/// What one [`OutboxRetention::reclaim_space`] (or an inbox's) call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SpaceReclaim {
    /// The store reclaims space by itself (PostgreSQL: autovacuum is on for the
    /// table); nothing was done.
    ByTheStore,
    /// Reclaiming falls to the caller, but too little is dead yet: `dead` rows,
    /// reclaimed once over `threshold`.
    NotYet {
        /// Dead rows now.
        dead: u64,
        /// Reclaimed when `dead` is over this.
        threshold: u64,
    },
    /// Vacuumed: `dead` rows before, `left` after (a vacuum that reclaims
    /// nothing, because another session was vacuuming or an old transaction
    /// holds the rows back, leaves them).
    Reclaimed {
        /// Dead rows before.
        dead: u64,
        /// Dead rows after.
        left: u64,
    },
    /// Reclaiming falls to the caller, which may not do it (PostgreSQL: the role
    /// does not own the table); the table grows until someone else does.
    NotPermitted,
}

/// Storage of the outbox: the relay's path and retention (its supertraits), plus
/// enqueueing and the counts health checks and metrics read. What operators read
/// and change is [`crate::OutboxOperator`]'s alone. A service that needs one
/// capability takes the small trait; an `Arc<dyn OutboxStore>` coerces to each of
/// them.
#[async_trait]
pub trait OutboxStore: OutboxRelayPath + OutboxRetention {
    /// Stores messages as `Pending`, all or none. (Adapters with transactions also
    /// offer an enqueue inside the caller's own transaction.)
    ///
    /// # Errors
    /// [`PortError::InvalidMessage`] when a message breaks a limit (nothing is
    /// stored); [`PortError::Transient`] when the store cannot be reached.
    async fn enqueue(&self, messages: Vec<Message>) -> Result<(), PortError>;

    /// Counts of the unsent statuses and the oldest unsent message; its cost
    /// follows the unsent rows, never the sent ones (it runs at every scrape).
    ///
    /// # Errors
    /// [`PortError::Transient`] when the store cannot be reached.
    async fn stats(&self) -> Result<OutboxStats, PortError>;

    /// The payload limit [`enqueue`](Self::enqueue) checks messages against, so
    /// that a typed enqueue can refuse an event before anything is written,
    /// naming the event ([`PortError::InvalidEvent`]). The default: the default
    /// limit ([`DEFAULT_MAX_PAYLOAD_BYTES`], 1 MiB); a store with another limit
    /// says so (one that does not still refuses what is over its limit, as
    /// [`PortError::InvalidMessage`]).
    fn max_payload_bytes(&self) -> usize {
        DEFAULT_MAX_PAYLOAD_BYTES
    }
}
