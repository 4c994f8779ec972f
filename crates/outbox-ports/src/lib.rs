//! The ports of `outbox`: the async traits through which the services of
//! `outbox-app` reach storage, the broker, the cluster lock, the shared sweep state
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
mod operator;
mod outbox;
mod state;
mod throughput;

pub use broker::{
    Acker, DecodeError, Delivery, DeliveryStream, Envelope, NO_PUBLISH_DEADLINE, PublishOutcome,
    Publisher, Subscriber,
};
pub use clock::{Clock, SystemClock};
pub use error::{BoxError, PortError};
pub use inbox::{Arrival, ClaimedDelivery, DeadLetter, InboxRecord, InboxStats, InboxStore};
pub use lock::{DistributedLock, LockGuard};
pub use operator::{
    AuditEntry, AuditLog, BulkOutcome, ConsumerSummary, InboxOperator, MAX_PAGE_LIMIT,
    MessageFilter, MessageSummary, MinuteCount, OutboxOperator, PREVIEW_BYTES, Page, PageCursor,
    StoredDeadLetter, deletable_statuses, page_limit, reconsumable_statuses, requeueable_statuses,
};
pub use outbox::{ClaimedMessage, Lease, OutboxRecord, OutboxStats, OutboxStore, PublishFailure};
pub use state::{StateWrite, SweepStateStore};
pub use throughput::{ThroughputKind, ThroughputLog};

#[cfg(feature = "mocks")]
pub use {
    broker::{MockAcker, MockPublisher, MockSubscriber},
    clock::MockClock,
    inbox::MockInboxStore,
    lock::{MockDistributedLock, MockLockGuard},
    operator::{MockAuditLog, MockInboxOperator, MockOutboxOperator},
    outbox::MockOutboxStore,
    state::MockSweepStateStore,
    throughput::MockThroughputLog,
};
