//! The relay as one unit: dispatcher + publish-retry sweeper (+ retention of sent
//! messages, when asked) over chosen adapters, for `outbox run` and for services
//! that embed the relay.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::{RetryPolicy, SweepConfig, SweepReport};
use outbox_ports::{
    Clock, DistributedLock, OutboxStore, Publisher, SweepStateStore, SystemClock, ThroughputKind,
    ThroughputLog,
};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::dispatcher::Wakeup;
use crate::{
    Dispatcher, DispatcherConfig, PublishRetryTask, RelayCounters, RetentionConfig,
    SentRetentionTask,
};
use outbox_runtime::supervision::supervise;
use outbox_runtime::{LeaseFactory, RetrySweeper, ServiceHealth};
use outbox_runtime::{TallyRecorder, ThroughputRecorder};

/// Builds a relay from its adapters.
///
/// ```no_run
/// # async fn f(store: std::sync::Arc<dyn outbox_ports::OutboxStore>,
/// #            publisher: std::sync::Arc<dyn outbox_ports::Publisher>,
/// #            lock: std::sync::Arc<dyn outbox_ports::DistributedLock>,
/// #            state: std::sync::Arc<dyn outbox_ports::SweepStateStore>) {
/// let cancel = outbox_relay::CancellationToken::new();
/// let relay = outbox_relay::RelayBuilder::new(store, publisher, lock, state).start(&cancel);
/// // ... on shutdown:
/// cancel.cancel();
/// relay.join().await;
/// # }
/// ```
pub struct RelayBuilder {
    store: Arc<dyn OutboxStore>,
    publisher: Arc<dyn Publisher>,
    lock: Arc<dyn DistributedLock>,
    state: Arc<dyn SweepStateStore>,
    clock: Arc<dyn Clock>,
    wakeup: Option<Box<dyn Wakeup>>,
    dispatch: DispatcherConfig,
    sweep: SweepConfig,
    instance: String,
    retention: Option<RetentionConfig>,
    throughput: Option<Arc<dyn ThroughputLog>>,
    stall_after: Duration,
}

/// A running relay.
pub struct RelayHandles {
    /// The dispatcher task (all of its pipelines).
    pub dispatcher: JoinHandle<()>,
    /// The publish-retry sweeper task.
    pub sweeper: JoinHandle<()>,
    /// Totals of both.
    pub counters: Arc<RelayCounters>,
    /// Completed sweeps' reports, up to [`outbox_runtime::sweeper::REPORTS_KEPT`]
    /// unread (while it is full, newer ones are dropped).
    pub reports: mpsc::Receiver<SweepReport>,
    /// This instance's name.
    pub instance: String,
    /// Failed once a task panicked or stopped before the token fired: readiness
    /// fails, and `outbox run` exits non-zero.
    pub health: Arc<ServiceHealth>,
    /// The retention task, when retention is on.
    pub retention: Option<JoinHandle<()>>,
    /// The task adding what this relay published to the shared per-minute totals,
    /// when a log was given.
    pub throughput: Option<JoinHandle<()>>,
    /// The dispatcher's progress and the stall watchdog's verdict (`/readyz`).
    pub progress: Arc<outbox_runtime::stall::RelayProgress>,
    /// The stall watchdog task.
    pub watchdog: JoinHandle<()>,
}

impl RelayHandles {
    /// Waits until every task has stopped (after the cancellation token fired).
    pub async fn join(self) {
        let tasks = [
            ("dispatcher", self.dispatcher),
            ("sweeper", self.sweeper),
            ("stall watchdog", self.watchdog),
        ]
        .into_iter()
        .chain(self.retention.map(|t| ("retention", t)))
        .chain(self.throughput.map(|t| ("throughput", t)));
        for (name, task) in tasks {
            if let Err(e) = task.await {
                tracing::error!(task = name, error = %e, "relay task ended abnormally");
            }
        }
    }
}

impl RelayBuilder {
    /// A relay over these adapters with default settings.
    pub fn new(
        store: Arc<dyn OutboxStore>,
        publisher: Arc<dyn Publisher>,
        lock: Arc<dyn DistributedLock>,
        state: Arc<dyn SweepStateStore>,
    ) -> Self {
        Self {
            store,
            publisher,
            lock,
            state,
            clock: Arc::new(SystemClock),
            wakeup: None,
            dispatch: DispatcherConfig::default(),
            sweep: SweepConfig::default(),
            instance: LeaseFactory::instance_id("relay"),
            retention: None,
            throughput: None,
            stall_after: outbox_runtime::stall::DEFAULT_STALL_AFTER,
        }
    }

    /// Readiness fails once work is due and no claim or mark has completed for
    /// this long (`[health] stall_after`; default
    /// [`outbox_runtime::stall::DEFAULT_STALL_AFTER`]). Zero is taken as 1 ms.
    #[must_use]
    pub fn stall_after(mut self, stall_after: Duration) -> Self {
        self.stall_after = stall_after.max(Duration::from_millis(1));
        self
    }

    /// The clock (default: the system clock).
    #[must_use]
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Wakes the idle dispatcher (default: poll).
    #[must_use]
    pub fn wakeup(mut self, wakeup: Box<dyn Wakeup>) -> Self {
        self.wakeup = Some(wakeup);
        self
    }

    /// Dispatcher settings.
    #[must_use]
    pub fn dispatch(mut self, dispatch: DispatcherConfig) -> Self {
        self.dispatch = dispatch;
        self
    }

    /// Retry policy (shared by the dispatcher and the sweep).
    #[must_use]
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.dispatch.retry = retry;
        self
    }

    /// Sweep settings (validate them first).
    #[must_use]
    pub fn sweep(mut self, sweep: SweepConfig) -> Self {
        self.sweep = sweep;
        self
    }

    /// Deletes old sent messages periodically (validate the settings first); off
    /// unless set here, and off when `retention.enabled` is false.
    #[must_use]
    pub fn retention(mut self, retention: RetentionConfig) -> Self {
        self.retention = retention.enabled.then_some(retention);
        self
    }

    /// Adds what this relay publishes to `log`'s per-minute totals (the admin API's
    /// charts), every few seconds.
    #[must_use]
    pub fn throughput(mut self, log: Arc<dyn ThroughputLog>) -> Self {
        self.throughput = Some(log);
        self
    }

    /// This instance's name.
    #[must_use]
    pub fn instance(mut self, instance: impl Into<String>) -> Self {
        self.instance = instance.into();
        self
    }

    /// Starts the dispatcher and the sweeper; both stop when `cancel` fires.
    #[must_use]
    pub fn start(self, cancel: &CancellationToken) -> RelayHandles {
        let counters = Arc::new(RelayCounters::default());
        let progress = Arc::new(outbox_runtime::stall::RelayProgress::default());
        let mut wakeup = self.wakeup;
        let dispatchers: Vec<Dispatcher> = (0..self.dispatch.pipelines.max(1))
            .map(|i| {
                // Lease holders must differ between pipelines, so each has a name.
                let name = if i == 0 {
                    self.instance.clone()
                } else {
                    format!("{}.p{i}", self.instance)
                };
                let d = Dispatcher::new(
                    self.store.clone(),
                    Arc::clone(&self.publisher),
                    self.dispatch.clone(),
                    &name,
                )
                .with_counters(Arc::clone(&counters))
                .with_progress(Arc::clone(&progress));
                // The first pipeline sleeps on the wake-up; the others poll, and
                // matter only under load.
                match wakeup.take() {
                    Some(w) => d.with_wakeup(w),
                    None => d,
                }
            })
            .collect();
        let retention = self
            .retention
            .map(|r| SentRetentionTask::new(self.store.clone(), r));
        let watch_store: Arc<dyn outbox_ports::OutboxRelayPath> = self.store.clone();
        let task = PublishRetryTask::new(
            self.store,
            self.publisher,
            self.dispatch.retry,
            &self.instance,
            self.dispatch.lease_ttl.max(Duration::from_secs(1)),
        )
        .with_counters(Arc::clone(&counters));
        let (tx, reports) = mpsc::channel(outbox_runtime::sweeper::REPORTS_KEPT);
        let sweeper = RetrySweeper::new(
            self.sweep,
            self.lock,
            self.state,
            self.clock,
            Arc::new(task),
        )
        .with_reports(tx);
        tracing::info!(instance = %self.instance, "relay starting");
        let health = Arc::new(ServiceHealth::default());
        // Fired as the pipelines and the sweep end, however they end (a panic too:
        // the guards drop).
        let (dispatch_done, sweep_done) = (CancellationToken::new(), CancellationToken::new());
        // Made before any pipeline runs: everything they count is recorded.
        let throughput = self.throughput.map(|log| {
            // Published and failed attempts (the overview's failures series), one
            // task: both stop together at shutdown, each adding what is left.
            let published = ThroughputRecorder::of_total(
                Arc::clone(&log),
                ThroughputKind::Published,
                Arc::clone(&counters),
                |c| &c.published,
            );
            let failed = ThroughputRecorder::of_total(
                Arc::clone(&log),
                ThroughputKind::PublishFailed,
                Arc::clone(&counters),
                |c| &c.publish_failures,
            );
            // Each exchange's own chart.
            let per_exchange = TallyRecorder::new(
                Arc::clone(&log),
                Arc::clone(&counters.per_exchange),
                ThroughputKind::Published,
                ThroughputKind::PublishFailed,
            );
            // The recorders stop once the pipelines and the sweep have stopped (their
            // last marks counted), not when the token fires: what the last batches
            // did is added too.
            let (dispatched, swept) = (dispatch_done.clone(), sweep_done.clone());
            let stop = CancellationToken::new();
            supervise(
                "throughput",
                async move {
                    let stop_after_work = async {
                        dispatched.cancelled().await;
                        swept.cancelled().await;
                        stop.cancel();
                    };
                    tokio::join!(
                        stop_after_work,
                        published.run(stop.clone()),
                        failed.run(stop.clone()),
                        per_exchange.run(stop.clone())
                    );
                },
                cancel.clone(),
                Arc::clone(&health),
            )
        });
        // Each pipeline on its own task, so one that panics ends only itself; any
        // such end fails the relay (see `supervision`).
        let pipelines: Vec<JoinHandle<()>> = dispatchers
            .into_iter()
            .map(|d| {
                supervise(
                    "dispatcher",
                    d.run(cancel.clone()),
                    cancel.clone(),
                    Arc::clone(&health),
                )
            })
            .collect();
        // Supervised too: a retention that stopped would let the table grow unseen.
        let retention = retention.map(|task| {
            supervise(
                "retention",
                task.run(cancel.clone()),
                cancel.clone(),
                Arc::clone(&health),
            )
        });
        // Supervised like the others: a watchdog gone would leave readiness green
        // whatever happens.
        let watchdog = supervise(
            "stall watchdog",
            outbox_runtime::stall::watch(
                Arc::clone(&progress),
                Some(watch_store),
                self.stall_after,
                cancel.clone(),
            ),
            cancel.clone(),
            Arc::clone(&health),
        );
        RelayHandles {
            dispatcher: {
                // Made now, so a task dropped before it first runs fires it too.
                let done = dispatch_done.drop_guard();
                tokio::spawn(async move {
                    let _done = done;
                    futures::future::join_all(pipelines).await;
                })
            },
            sweeper: supervise(
                "publish-retry sweeper",
                {
                    let run = sweeper.run(cancel.clone());
                    let done = sweep_done.drop_guard();
                    async move {
                        let _done = done;
                        run.await;
                    }
                },
                cancel.clone(),
                Arc::clone(&health),
            ),
            counters,
            reports,
            instance: self.instance,
            health,
            retention,
            throughput,
            progress,
            watchdog,
        }
    }
}
