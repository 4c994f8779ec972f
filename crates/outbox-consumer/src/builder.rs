//! A consumer as one unit: its worker (with the inbox's retention, when the inbox
//! has one) and its own consume-retry sweep, under lock and state keys of its own
//! (`SweepConfig::for_consumer`), so failed deliveries are retried by the process
//! that owns their handlers. What [`crate::worker`] and the runtime's sweeper are
//! wired into by hand otherwise.

use std::sync::Arc;

use outbox_core::{SweepConfig, SweepReport};
use outbox_ports::{Clock, DistributedLock, SweepStateStore, SystemClock};
use outbox_runtime::supervision::supervise;
use outbox_runtime::{RetrySweeper, ServiceHealth};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::ConsumerCounters;
use crate::worker::{InboxPath, InboxWorker};

/// Builds a running consumer from its worker and the lock and state its sweep
/// needs.
///
/// ```no_run
/// # use std::sync::Arc;
/// # async fn f(
/// #     worker: outbox_consumer::ConsumerWorker,
/// #     lock: Arc<dyn outbox_ports::DistributedLock>,
/// #     state: Arc<dyn outbox_ports::SweepStateStore>,
/// # ) {
/// let cancel = outbox_consumer::CancellationToken::new();
/// let consumer = outbox_consumer::ConsumerBuilder::new(worker, lock, state).start(&cancel);
/// // ... on shutdown:
/// cancel.cancel();
/// consumer.join().await;
/// # }
/// ```
pub struct ConsumerBuilder<P: InboxPath> {
    worker: InboxWorker<P>,
    lock: Arc<dyn DistributedLock>,
    state: Arc<dyn SweepStateStore>,
    clock: Arc<dyn Clock>,
    sweep: SweepConfig,
}

/// A running consumer.
pub struct ConsumerHandles {
    /// The worker task (it finishes the deliveries in hand when stopped).
    pub worker: JoinHandle<()>,
    /// The consume-retry sweeper task.
    pub sweeper: JoinHandle<()>,
    /// What the worker and its retries counted.
    pub counters: Arc<ConsumerCounters>,
    /// The worker's progress and the stall watchdog's verdict (for readiness).
    pub progress: Arc<outbox_runtime::stall::RelayProgress>,
    /// Completed sweeps' reports, up to [`outbox_runtime::sweeper::REPORTS_KEPT`]
    /// unread (while it is full, newer ones are dropped).
    pub reports: mpsc::Receiver<SweepReport>,
    /// Failed once a task panicked or stopped before the token fired.
    pub health: Arc<ServiceHealth>,
}

impl ConsumerHandles {
    /// Waits until both tasks have stopped (after the cancellation token fired).
    pub async fn join(self) {
        for (name, task) in [("worker", self.worker), ("sweeper", self.sweeper)] {
            if let Err(e) = task.await {
                tracing::error!(task = name, error = %e, "consumer task ended abnormally");
            }
        }
    }
}

impl<P: InboxPath> ConsumerBuilder<P> {
    /// `worker` with a consume-retry sweep over `lock` and `state`, under this
    /// consumer's own keys, as often as its retry policy's first backoff
    /// (`SweepConfig::for_consumer_retrying`: 1 s by default).
    #[must_use]
    pub fn new(
        worker: InboxWorker<P>,
        lock: Arc<dyn DistributedLock>,
        state: Arc<dyn SweepStateStore>,
    ) -> Self {
        let sweep = SweepConfig::for_consumer_retrying(worker.name(), &worker.config().retry);
        Self {
            worker,
            lock,
            state,
            clock: Arc::new(SystemClock),
            sweep,
        }
    }

    /// The sweep's settings (validate them first). Keep keys of this consumer's
    /// own (`SweepConfig::for_consumer`): a key shared with another consumer or the
    /// relay makes them take turns.
    #[must_use]
    pub fn sweep(mut self, sweep: SweepConfig) -> Self {
        self.sweep = sweep;
        self
    }

    /// The sweep's clock (default: the system clock).
    #[must_use]
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Starts the worker and the sweeper; both stop when `cancel` fires.
    #[must_use]
    pub fn start(self, cancel: &CancellationToken) -> ConsumerHandles {
        if self.sweep.lock_key == outbox_core::config::DEFAULT_LOCK_KEY
            || self.sweep.state_key == outbox_core::config::DEFAULT_STATE_KEY
        {
            // `SweepConfig::default()` has the relay's keys: the two sweeps would
            // take turns, each holding back the other's retries.
            tracing::warn!(consumer = %self.worker.name(), lock_key = %self.sweep.lock_key, "this consumer's retry sweep shares the relay's keys; give it its own (SweepConfig::for_consumer_retrying)");
        }
        let counters = self.worker.counters();
        let progress = self.worker.progress();
        let (tx, reports) = mpsc::channel(outbox_runtime::sweeper::REPORTS_KEPT);
        let sweeper = RetrySweeper::new(
            self.sweep,
            self.lock,
            self.state,
            self.clock,
            Arc::new(self.worker.retry_task()),
        )
        .with_reports(tx);
        tracing::info!(consumer = %self.worker.name(), "consumer starting");
        let health = Arc::new(ServiceHealth::default());
        let worker = supervise(
            "consumer worker",
            self.worker.run(cancel.clone()),
            cancel.clone(),
            Arc::clone(&health),
        );
        let sweeper = supervise(
            "consume-retry sweeper",
            sweeper.run(cancel.clone()),
            cancel.clone(),
            Arc::clone(&health),
        );
        ConsumerHandles {
            worker,
            sweeper,
            counters,
            progress,
            reports,
            health,
        }
    }
}
