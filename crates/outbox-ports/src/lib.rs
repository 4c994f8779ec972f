//! The ports of `outbox`: the async traits through which the services of
//! `outbox-relay` and `outbox-consumer` reach storage, the broker, the cluster lock, the shared sweep state
//! and the clock. Adapters (memory, PostgreSQL, RabbitMQ, Redis) implement them.
//!
//! Every trait is object safe and `Send + Sync`, so adapters can be chosen by
//! configuration at run time and shared as `Arc<dyn Port>`.
//!
//! Errors say whether retrying can help ([`PortError::is_retryable`]).
//!
//! With the `mocks` feature, every port has a mockall mock (`MockOutboxStore`, ...).

mod broker;
mod clock;
mod error;
mod inbox;
mod lock;
#[cfg(feature = "mocks")]
mod mocks;
mod operator;
mod outbox;
mod pause;
mod queues;
#[cfg(feature = "renewal")]
pub mod renewal;
mod state;
mod throughput;
pub mod trace_context;

pub use broker::{
    Acker, Death, DecodeError, Delivery, DeliveryStream, EXCHANGE_HEADER, Envelope,
    NO_PUBLISH_DEADLINE, ORDERING_KEY_HEADER, PublishOutcome, Publisher, REPLAY_OF_HEADER,
    Subscriber, replay_root, stamp_replay_of,
};
pub use clock::{Clock, SystemClock};
pub use error::{BoxError, PortError};
pub use inbox::{
    Arrival, ClaimedDelivery, DeadLetter, InboxConsumerPath, InboxRecord, InboxRetention,
    InboxStats, InboxStore,
};
pub use lock::{DistributedLock, LockGuard};
pub use operator::{
    AuditEntry, AuditLog, BLOCKED_WAITING_CAP, BlockedKey, BulkOutcome, ConsumerSummary,
    DeliveryFilter, DeliverySummary, ExchangeCounts, FailureCount, FailureGroup, InboxOperator,
    KeyHead, MAX_PAGE_LIMIT, MessageFilter, MessageSummary, MinuteCount, OutboxOperator,
    PREVIEW_BYTES, Page, PageCursor, StoredDeadLetter, deletable_statuses, group_failures,
    page_limit, reconsumable_from, reconsumable_statuses, replay_refusal, replayed_refusal,
    requeueable_statuses,
};
pub use outbox::{
    ClaimedMessage, DeadHead, Lease, OutboxRecord, OutboxRelayPath, OutboxRetention, OutboxStats,
    OutboxStore, PublishFailure, SpaceReclaim,
};
pub use pause::{MAX_PAUSE_NAME_CHARS, Pause, PauseKind, PauseStore, invalid_pause_name};
pub use queues::{QueueDepth, QueueDepths};
pub use state::{StateWrite, SweepStateStore};
pub use throughput::{
    BucketCount, ChartWindow, MAX_NAMES_PER_ADD, ThroughputKind, ThroughputLog, check_names_per_add,
};

#[cfg(feature = "mocks")]
pub use {
    broker::{MockAcker, MockPublisher, MockSubscriber},
    clock::MockClock,
    inbox::MockInboxConsumerPath,
    lock::{MockDistributedLock, MockLockGuard},
    mocks::{MockInboxStore, MockOutboxStore},
    operator::{MockAuditLog, MockInboxOperator, MockOutboxOperator},
    outbox::{MockOutboxRelayPath, MockOutboxRetention},
    pause::MockPauseStore,
    state::MockSweepStateStore,
    throughput::MockThroughputLog,
};

/// Every port trait, imported anonymously: `use outbox_ports::prelude::*;` makes
/// every port method callable on a concrete adapter (the stores' methods are spread
/// over small capability traits, which a method call needs in scope).
pub mod prelude {
    pub use crate::{
        Acker as _, AuditLog as _, Clock as _, DistributedLock as _, InboxConsumerPath as _,
        InboxOperator as _, InboxRetention as _, InboxStore as _, LockGuard as _,
        OutboxOperator as _, OutboxRelayPath as _, OutboxRetention as _, OutboxStore as _,
        PauseStore as _, Publisher as _, Subscriber as _, SweepStateStore as _, ThroughputLog as _,
    };
}
