//! Every port of `outbox` in memory: for the demo, for tests, and as the reference
//! behaviour that the shared contract tests (`outbox-testkit`) hold real adapters to.
//!
//! Each adapter can inject faults: [`MemoryBroker`] fails, nacks or returns the next
//! N publishes; [`MemoryLock`] can lose a held lock; [`MemorySweepState`] can fail
//! reads; [`FaultCounter`] fails the next N calls of anything, e.g. a handler.
//!
//! Nothing here survives the process; do not use it in production.

mod audit;
mod broker;
mod clock;
mod fault;
mod inbox;
mod inbox_operator;
mod listing;
mod lock;
mod outbox;
mod outbox_operator;
mod pauses;
mod state;
mod throughput;

pub use audit::MemoryAuditLog;
pub use broker::{ExchangeKind, MemoryBroker};
pub use clock::TokioClock;
pub use fault::FaultCounter;
pub use inbox::MemoryInboxStore;
pub use lock::MemoryLock;
pub use outbox::MemoryOutboxStore;
pub use pauses::MemoryPauses;
pub use state::MemorySweepState;
pub use throughput::MemoryThroughputLog;

/// The instant `age` before `now`: what retention deletes is older. `None` when
/// that lies before the calendar's start (nothing is that old).
fn older_than(
    now: outbox_core::Timestamp,
    age: std::time::Duration,
) -> Option<outbox_core::Timestamp> {
    now.checked_sub(time::Duration::try_from(age).unwrap_or(time::Duration::MAX))
}

/// Locks a std mutex, recovering the data if a panicking thread poisoned it: every
/// critical section here leaves the state consistent before it can panic.
fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Who holds a row and until when: the lease part of outbox and inbox rows.
#[derive(Debug, Clone, Default)]
pub(crate) struct LeaseSlot {
    holder: Option<String>,
    until: Option<outbox_core::Timestamp>,
}

impl LeaseSlot {
    /// Whether a holder's lease still runs at `now`.
    fn is_live(&self, now: outbox_core::Timestamp) -> bool {
        self.holder.is_some() && self.until.is_some_and(|u| u > now)
    }

    /// Whether `lease` is the holder (live or not: nobody else has taken it).
    fn is_held_by(&self, lease: &outbox_ports::Lease) -> bool {
        self.holder.as_deref() == Some(lease.holder.as_str())
    }

    fn take(&mut self, lease: &outbox_ports::Lease, now: outbox_core::Timestamp) {
        self.holder = Some(lease.holder.clone());
        self.until = Some(now + lease.ttl);
    }

    fn clear(&mut self) {
        self.holder = None;
        self.until = None;
    }
}
