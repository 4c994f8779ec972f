//! The pure domain of `outbox`: what a message is (and a typed one, [`Event`]),
//! which status changes are legal, when a failed message is retried, and when the
//! retry sweep runs.
//!
//! Nothing here performs I/O, spawns tasks or reads a clock. Time and randomness are
//! passed in as arguments, so every decision can be tested exhaustively without a
//! runtime. The I/O lives behind the traits of `outbox-ports` and is driven by the
//! services of `outbox-relay` and `outbox-consumer`.
//!
//! Architecture Invariant: this crate depends on no async runtime, database, broker
//! or cache client (checked by `cargo xtask ci`).

pub mod config;
pub mod dispatch;
pub mod duration;
pub mod event;
pub mod failure;
pub mod failure_group;
pub mod lanes;
pub mod lease;
pub mod message;
pub mod retry;
pub mod shard;
pub mod stall;
pub mod status;
pub mod sweep;

pub use config::{ConfigError, SweepConfig};
pub use event::{DecodeError, Event, EventError};
pub use failure::{FailureClass, HandlerFailure};
pub use message::{Due, Headers, LATEST_DUE, Message, MessageError, MessageId, NewMessage};
pub use retry::{Decision, RetryPolicy};
pub use status::{
    DeleteRefused, FAILED_ATTEMPTS_KEPT, FailedAttempt, InboxStatus, Lifecycle, OutboxStatus, Side,
    SideState, TransitionError, UnknownStatus,
};
pub use sweep::{
    BatchCounts, LastCompleted, SweepAction, SweepProgress, SweepReport, SweepSchedule, SweepStep,
};

// What a store's enqueue accepts: a `NewMessage` or `&impl Event`.
pub use event::IntoNewMessage;

/// A point in time, always UTC in this crate.
pub type Timestamp = time::OffsetDateTime;

/// `later - earlier` as a non-negative [`std::time::Duration`] (zero when `later`
/// is not after `earlier`).
#[must_use]
pub fn saturating_elapsed(earlier: Timestamp, later: Timestamp) -> std::time::Duration {
    let d = later - earlier;
    if d.is_negative() {
        std::time::Duration::ZERO
    } else {
        d.unsigned_abs()
    }
}
