//! Every port of `outbox` in memory: for the demo, for tests, and as the reference
//! behaviour that the shared contract tests (`outbox-testkit`) hold real adapters to.
//!
//! Each adapter can inject faults: [`MemoryBroker`] fails, nacks or returns the next
//! N publishes; [`MemoryLock`] can lose a held lock; [`MemorySweepState`] can fail
//! reads; [`FaultCounter`] fails the next N calls of anything, e.g. a handler.
//!
//! Nothing here survives the process; do not use it in production.

mod broker;
mod clock;
mod fault;
mod inbox;
mod lock;
mod outbox;
mod state;

pub use broker::{ExchangeKind, MemoryBroker};
pub use clock::TokioClock;
pub use fault::FaultCounter;
pub use inbox::MemoryInboxStore;
pub use lock::MemoryLock;
pub use outbox::MemoryOutboxStore;
pub use state::MemorySweepState;

/// Locks a std mutex, recovering the data if a panicking thread poisoned it: every
/// critical section here leaves the state consistent before it can panic.
fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Whether a lease that runs until `until` still holds at `now`.
fn lease_live(until: Option<outbox_core::Timestamp>, now: outbox_core::Timestamp) -> bool {
    until.is_some_and(|u| u > now)
}
