//! Adds what an instance completed to the shared per-minute totals every few
//! seconds ([`ThroughputLog`]), so charts of the last hour cost a few rows however
//! many messages went through, and cover every instance.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use outbox_ports::{ThroughputKind, ThroughputLog};
use tokio_util::sync::CancellationToken;

use crate::sleep_or_cancel;

/// How often an instance adds its counts.
pub const THROUGHPUT_INTERVAL: Duration = Duration::from_secs(5);

/// Adds the growth of one counter to the log, every [`THROUGHPUT_INTERVAL`] and
/// once more when cancelled.
pub struct ThroughputRecorder {
    log: Arc<dyn ThroughputLog>,
    kind: ThroughputKind,
    counter: Arc<dyn Fn() -> u64 + Send + Sync>,
    interval: Duration,
}

impl ThroughputRecorder {
    /// Records the growth of `counter` (a running total, e.g.
    /// `RelayCounters::published`) as `kind`.
    pub fn new(
        log: Arc<dyn ThroughputLog>,
        kind: ThroughputKind,
        counter: Arc<dyn Fn() -> u64 + Send + Sync>,
    ) -> Self {
        Self {
            log,
            kind,
            counter,
            interval: THROUGHPUT_INTERVAL,
        }
    }

    /// Records the growth of an atomic total.
    pub fn of_total<T: Send + Sync + 'static>(
        log: Arc<dyn ThroughputLog>,
        kind: ThroughputKind,
        owner: Arc<T>,
        total: fn(&T) -> &AtomicU64,
    ) -> Self {
        Self::new(
            log,
            kind,
            Arc::new(move || total(&owner).load(Ordering::Relaxed)),
        )
    }

    /// Adds every `interval` instead.
    #[must_use]
    pub const fn every(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// Runs until `cancel` fires, then adds what is left.
    pub async fn run(self, cancel: CancellationToken) {
        // What was counted before this recorder started is not this instance's to
        // add again (another recorder of the same process, or nobody, had it).
        let mut recorded = (self.counter)();
        loop {
            let go_on = sleep_or_cancel(self.interval, &cancel).await;
            let total = (self.counter)();
            let growth = total.saturating_sub(recorded);
            match self.log.add(self.kind, growth).await {
                Ok(()) => recorded = total,
                // Kept for the next add: a chart may lag, it does not lose counts.
                Err(e) => {
                    tracing::warn!(kind = self.kind.as_str(), error = %e, "per-minute totals not recorded; trying again later");
                }
            }
            if !go_on {
                break;
            }
        }
    }
}
