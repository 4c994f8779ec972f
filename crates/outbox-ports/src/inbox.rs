//! The consumer's inbox: one row per (consumer, message id), so a redelivered message
//! is recognised and its effect happens once; consume failures are kept and retried.

use async_trait::async_trait;
use outbox_core::{Decision, Headers, InboxStatus, Message, MessageId, SideState};

use crate::{Lease, PortError};

/// What recording an arriving delivery found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Arrival {
    /// First time seen: run the handler, then mark consumed or failed under the lease.
    New,
    /// Seen before (already consumed, failed and awaiting its retry, dead, or being
    /// handled under a live lease): acknowledge and skip.
    Duplicate(InboxStatus),
}

/// A delivery claimed for a consume retry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimedDelivery {
    /// The message as received.
    pub message: Message,
    /// Handler attempts made before this one.
    pub attempts: u32,
}

/// A stored delivery with its consume-side state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboxRecord {
    /// The consumer that received it.
    pub consumer: String,
    /// The message.
    pub message: Message,
    /// `Sent` (received, not yet handled), `ConsumeFailed`, `Consumed` or `Dead`.
    pub status: InboxStatus,
    /// Attempts, last error, next attempt, consumed at.
    pub consume: SideState,
    /// The dead delivery this one replays (an operator edited it and ran it again
    /// as a new delivery).
    pub replayed_from: Option<MessageId>,
    /// The delivery that replays this dead one: it stays dead, and is neither
    /// reconsumed nor replayed again (that would run its handler twice).
    pub replayed_as: Option<MessageId>,
}

/// A delivery that could not become a message (no message id, undecodable), kept
/// with its raw body and headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// The message id, when the delivery had one.
    pub message_id: Option<String>,
    /// The routing key it came with.
    pub routing_key: String,
    /// Its headers.
    pub headers: Headers,
    /// The raw body.
    pub body: Vec<u8>,
    /// Why it was refused.
    pub reason: String,
}

/// Counts of one consumer's inbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InboxStats {
    /// Received and not yet handled.
    pub received: u64,
    /// Handled.
    pub consumed: u64,
    /// Waiting for a consume retry.
    pub consume_failed: u64,
    /// Out of retries.
    pub dead: u64,
    /// Deliveries that could not be decoded.
    pub dead_letters: u64,
}

/// The consumer's path through its inbox: record an arrival under a lease, mark it
/// consumed or failed, claim what is due again, keep what cannot be decoded. The
/// consumer worker and its retry sweep need only this.
#[cfg_attr(feature = "mocks", mockall::automock)]
#[async_trait]
pub trait InboxConsumerPath: Send + Sync {
    /// Records the arrival of `message` for `consumer`. When it is new, the row is
    /// held by `lease` while the handler runs; if the worker vanishes, the lease runs
    /// out and the consume sweep claims it.
    ///
    /// # Errors
    /// [`PortError::Transient`] when the store cannot be reached (the delivery is
    /// then returned to the broker, not acknowledged).
    async fn record_arrival(
        &self,
        consumer: &str,
        message: &Message,
        lease: &Lease,
    ) -> Result<Arrival, PortError>;

    /// For a consumer that keeps order by key: records `message` without a lease,
    /// to wait for the consume sweep, when an earlier delivery of its ordering key
    /// is unfinished for `consumer` (received and not yet handled, or failed and
    /// waiting for its retry; a dead one does not hold its key back). `true`: held,
    /// acknowledge it and do not handle it now; the sweep claims it once every
    /// earlier delivery of its key is consumed or dead. `false` (also for a message
    /// without a key, one recorded before, or one a store recorded as held and
    /// found its predecessors finished just after): handle it as usual, through
    /// [`InboxConsumerPath::record_arrival`], which hands a redelivered row over
    /// only when it is the first unfinished one of its key, as
    /// [`InboxConsumerPath::claim_due`] does.
    ///
    /// # Errors
    /// [`PortError::Transient`] when the store cannot be reached.
    async fn hold_behind_key(&self, consumer: &str, message: &Message) -> Result<bool, PortError>;

    /// Marks a delivery held by `lease` as `Consumed`. `false` when the lease was
    /// lost to another claimer.
    ///
    /// # Errors
    /// [`PortError::Transient`] when the store cannot be reached.
    async fn mark_consumed(
        &self,
        consumer: &str,
        id: MessageId,
        lease: &Lease,
    ) -> Result<bool, PortError>;

    /// Records a failed handler attempt of a delivery held by `lease`:
    /// `ConsumeFailed` with the next attempt time, or `Dead`.
    ///
    /// # Errors
    /// [`PortError::Transient`] when the store cannot be reached.
    async fn mark_consume_failed(
        &self,
        consumer: &str,
        id: MessageId,
        lease: &Lease,
        error: &str,
        decision: Decision,
    ) -> Result<bool, PortError>;

    /// Claims up to `limit` deliveries due for another handler attempt: failed ones
    /// whose next attempt is due, and received ones whose worker's lease ran out (or
    /// that were held behind their key). A delivery with an ordering key is claimed
    /// only while no earlier delivery of its key is unfinished, so a key's
    /// deliveries are retried one after another, in arrival order.
    ///
    /// # Errors
    /// [`PortError::Transient`] when the store cannot be reached.
    async fn claim_due(
        &self,
        consumer: &str,
        lease: &Lease,
        limit: u32,
    ) -> Result<Vec<ClaimedDelivery>, PortError>;

    /// Records `message`, which the broker gave up on (a quorum queue's delivery
    /// limit) and dead-lettered, as `consumer`'s `Dead` delivery with `reason` (the
    /// broker's `x-death` reason and count) as its last error, so operators see it
    /// and can reconsume it like any dead delivery. `false` when the inbox holds the
    /// message already: the row is left as it is (consumed, or still the consume
    /// sweep's to retry), since the inbox has it either way.
    ///
    /// # Errors
    /// [`PortError::Transient`] when the store cannot be reached.
    async fn record_given_up(
        &self,
        consumer: &str,
        message: &Message,
        reason: &str,
    ) -> Result<bool, PortError>;

    /// Keeps a delivery that could not be decoded.
    ///
    /// # Errors
    /// [`PortError::Transient`] when the store cannot be reached.
    async fn record_dead_letter(&self, consumer: &str, letter: DeadLetter)
    -> Result<(), PortError>;

    /// Whether an operator paused `consumer` (see [`crate::PauseStore`]): its
    /// workers then take no deliveries and its retry sweep runs no handler. The
    /// default: the store keeps no pauses.
    ///
    /// # Errors
    /// [`PortError::Transient`] when the store cannot be reached.
    async fn consumer_paused(&self, consumer: &str) -> Result<bool, PortError> {
        let _ = consumer;
        Ok(false)
    }
}

/// Storage of a consumer's inbox: the consumer's path (its supertrait) plus the
/// counts health checks and metrics read. What operators read and change is
/// [`crate::InboxOperator`]'s alone.
#[async_trait]
pub trait InboxStore: InboxConsumerPath {
    /// Counts of `consumer`'s inbox.
    ///
    /// # Errors
    /// [`PortError::Transient`] when the store cannot be reached.
    async fn stats(&self, consumer: &str) -> Result<InboxStats, PortError>;
}

/// Retention of a consumer's consumed deliveries: the one delete a consumer itself
/// does, kept apart from its path and from the operator's views.
#[cfg_attr(feature = "mocks", mockall::automock)]
#[async_trait]
pub trait InboxRetention: Send + Sync {
    /// Deletes up to `limit` of `consumer`'s `Consumed` deliveries consumed more
    /// than `age` ago (by the store's clock), oldest first; returns how many.
    /// Nothing in another status is ever deleted here. One call is one short
    /// operation; callers repeat it while it returns `limit`.
    ///
    /// # Errors
    /// [`PortError::Transient`] when the store cannot be reached (what was deleted
    /// before stays deleted).
    async fn delete_consumed_batch(
        &self,
        consumer: &str,
        age: std::time::Duration,
        limit: u32,
    ) -> Result<u64, PortError>;

    /// Reclaims the space of deleted and rewritten rows, as
    /// [`crate::OutboxRetention::reclaim_space`] does for the outbox. The default:
    /// the store needs no help.
    ///
    /// # Errors
    /// [`PortError::Transient`] when the store cannot be reached.
    async fn reclaim_space(&self) -> Result<crate::SpaceReclaim, PortError> {
        Ok(crate::SpaceReclaim::ByTheStore)
    }
}
