//! Where "now" comes from. Services ask the clock instead of the OS, so tests can run
//! on paused time.

use outbox_core::Timestamp;

/// A source of the current time.
#[cfg_attr(feature = "mocks", mockall::automock)]
pub trait Clock: Send + Sync {
    /// The current time, UTC.
    fn now(&self) -> Timestamp;
}

/// The operating system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now_utc()
    }
}
