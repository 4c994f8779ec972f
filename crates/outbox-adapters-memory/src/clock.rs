//! A clock that follows tokio's time, so tests with paused time see wall-clock
//! timestamps advance exactly as tokio's sleeps do.

use outbox_core::Timestamp;
use outbox_ports::Clock;

/// `base` plus the tokio time elapsed since the clock was made. Under
/// `tokio::time::pause` it moves only when tokio's time does.
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    base: Timestamp,
    start: tokio::time::Instant,
}

impl TokioClock {
    /// A clock reading `base` now. Must be made inside a tokio runtime when time is
    /// paused, so that its start is the paused instant.
    #[must_use]
    pub fn starting_at(base: Timestamp) -> Self {
        Self {
            base,
            start: tokio::time::Instant::now(),
        }
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Timestamp {
        self.base + self.start.elapsed()
    }
}
