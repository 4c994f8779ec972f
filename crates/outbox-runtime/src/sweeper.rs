//! The retry sweeper: the seed's `MessageOutboxRetryBackgroundService`, over the
//! ports, with every decision taken by `outbox_core::sweep`.
//!
//! One round: read the shared state (falling back to this instance's memory), wait
//! until one interval after the last completed sweep, take the cluster lock within
//! the lock wait (or skip the round), check again under the lock, then sweep batch
//! after batch until nothing is due, the per-sweep bound is hit or the lease is lost,
//! and record the report, always, so the next sweep is one interval away.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::sweep::SweepEnd;
use outbox_core::{
    BatchCounts, LastCompleted, SweepAction, SweepConfig, SweepProgress, SweepReport,
    SweepSchedule, SweepStep,
};
use outbox_ports::{Clock, DistributedLock, LockGuard, PortError, StateWrite, SweepStateStore};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::sleep_or_cancel;

/// The work a sweep does, one batch at a time.
#[async_trait]
pub trait SweepTask: Send + Sync {
    /// A short name for logs (`publish-retry`, `consume-retry`).
    fn name(&self) -> &'static str;

    /// What the task sweeps for, when there are several of its kind: the
    /// consumer's name of a consume-retry task. Logs name it.
    fn subject(&self) -> Option<&str> {
        None
    }

    /// Housekeeping at the start of a sweep, under the lock.
    ///
    /// # Errors
    /// A [`PortError`] ends the round as a failure.
    async fn before_sweep(&self) -> Result<(), PortError> {
        Ok(())
    }

    /// Retries up to `limit` due messages and says what happened.
    ///
    /// # Errors
    /// A [`PortError`] ends the round as a failure (logged; the next round waits one
    /// interval).
    async fn run_batch(&self, limit: u32) -> Result<BatchCounts, PortError>;

    /// [`SweepTask::run_batch`], told whether the sweep's lock is still held. A
    /// task whose batch takes long (one handler after another) checks it before
    /// each step and ends the batch early once it is lost, so it never goes on
    /// working while another instance sweeps. The default checks nothing more than
    /// the sweeper does between batches.
    ///
    /// # Errors
    /// As [`SweepTask::run_batch`].
    async fn run_batch_while_held(
        &self,
        limit: u32,
        held: &(dyn Fn() -> bool + Send + Sync),
    ) -> Result<BatchCounts, PortError> {
        let _ = held;
        self.run_batch(limit).await
    }
}

/// The retry background service.
pub struct RetrySweeper {
    config: SweepConfig,
    lock: Arc<dyn DistributedLock>,
    state: Arc<dyn SweepStateStore>,
    clock: Arc<dyn Clock>,
    task: Arc<dyn SweepTask>,
    schedule: SweepSchedule,
    reports: Option<mpsc::Sender<SweepReport>>,
    /// The task's name and subject, as logs say it (`consume-retry billing`).
    label: String,
}

/// Unread reports a channel keeps: while it holds this many, a new report is
/// dropped (a report is for metrics and tests, never needed to make progress).
pub const REPORTS_KEPT: usize = 64;

/// Why a sweep stopped, as a log line says it.
fn end_text(end: Option<SweepEnd>) -> &'static str {
    match end {
        Some(SweepEnd::NothingDue) => "nothing more due",
        Some(SweepEnd::BoundReached) => "batch bound reached",
        Some(SweepEnd::LockLost) => "lock lost",
        None => "cancelled",
    }
}

impl RetrySweeper {
    /// A sweeper running `task` under `config` (validate it first).
    pub fn new(
        config: SweepConfig,
        lock: Arc<dyn DistributedLock>,
        state: Arc<dyn SweepStateStore>,
        clock: Arc<dyn Clock>,
        task: Arc<dyn SweepTask>,
    ) -> Self {
        let label = match task.subject() {
            Some(subject) => format!("{} {subject}", task.name()),
            None => task.name().to_owned(),
        };
        Self {
            label,
            schedule: SweepSchedule::new(config.interval),
            config,
            lock,
            state,
            clock,
            task,
            reports: None,
        }
    }

    /// Sends every completed sweep's report to `tx` (for metrics, tests, the demo);
    /// a report that finds the channel full is dropped, never waited for.
    #[must_use]
    pub fn with_reports(mut self, tx: mpsc::Sender<SweepReport>) -> Self {
        self.reports = Some(tx);
        self
    }

    /// Runs until `cancel` fires. A batch in progress is finished first and the lock
    /// released; cancellation never leaves a claim half marked.
    pub async fn run(mut self, cancel: CancellationToken) {
        let task = self.label.clone();
        let task = task.as_str();
        self.log_last_state_at_start().await;
        tracing::info!(
            task,
            interval = %outbox_core::duration::format(self.config.interval),
            "retry sweeper started"
        );
        while !cancel.is_cancelled() {
            let wait = match self.round(&cancel).await {
                Ok(wait) => wait,
                Err(e) => {
                    tracing::error!(task, error = %e, "retry sweep failed; waiting one interval");
                    self.schedule.after_error()
                }
            };
            if !wait.is_zero() && !sleep_or_cancel(wait, &cancel).await {
                break;
            }
        }
        tracing::info!(task, "retry sweeper stopped");
    }

    /// The seed logs the stored report at start and adopts its completion time.
    async fn log_last_state_at_start(&mut self) {
        match self.state.get(&self.config.state_key).await {
            Ok(Some(r)) => {
                self.schedule.adopt_at_start(&r);
                tracing::info!(
                    task = %self.label,
                    completed_at = %r.completed_at,
                    publish_retried = r.publish_retried,
                    consume_retried = r.consume_retried,
                    "last retry sweep"
                );
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(task = %self.label, error = %e, "could not read the last sweep state");
            }
        }
    }

    async fn read_shared(&self) -> LastCompleted {
        match self.state.get(&self.config.state_key).await {
            Ok(Some(r)) => LastCompleted::Shared(r.completed_at),
            Ok(None) => LastCompleted::Absent,
            Err(e) => {
                tracing::warn!(task = %self.label, error = %e, "could not read the sweep state; using this instance's last sweep");
                LastCompleted::Unreadable
            }
        }
    }

    /// One round; returns how long to wait before the next.
    async fn round(&mut self, cancel: &CancellationToken) -> Result<Duration, PortError> {
        let shared = self.read_shared().await;
        if let SweepAction::Wait(d) = self.schedule.next_action(shared, self.clock.now()) {
            return Ok(d);
        }
        let asked = tokio::time::Instant::now();
        let acquired = tokio::select! {
            () = cancel.cancelled() => return Ok(Duration::ZERO),
            r = self.lock.acquire(&self.config.lock_key, self.config.lock_ttl, self.config.lock_wait) => r?,
        };
        let Some(guard) = acquired else {
            // Routine when several instances run: one of them sweeps.
            tracing::debug!(
                task = %self.label,
                "retry lock not acquired; skipping this round"
            );
            return Ok(self
                .schedule
                .after_lock_not_acquired(self.config.lock_wait, asked.elapsed()));
        };
        let result = self.sweep_under_lock(&*guard, cancel).await;
        if let Err(e) = guard.release().await {
            tracing::warn!(task = %self.label, error = %e, "could not release the retry lock; its lease will run out");
        }
        result
    }

    async fn sweep_under_lock(
        &mut self,
        guard: &dyn LockGuard,
        cancel: &CancellationToken,
    ) -> Result<Duration, PortError> {
        // Another instance may have swept between our read and our lock.
        let shared = self.read_shared().await;
        if let SweepAction::Wait(d) = self.schedule.recheck_under_lock(shared, self.clock.now()) {
            return Ok(d);
        }
        let task = self.label.as_str();
        let mut progress = SweepProgress::start(
            self.clock.now(),
            self.config.batch_size,
            self.config.max_batches_per_sweep,
        );
        // The lease can be lost at any point, even right after it was taken (a slow
        // acquisition, a renewal that did not get through): checked before the
        // housekeeping and before every batch, the first included.
        let end = if let SweepStep::Record(end) = progress.before_batch(guard.is_held()) {
            Some(end)
        } else {
            self.task.before_sweep().await?;
            self.batches(&mut progress, guard, cancel).await?
        };
        let report = progress.finish(self.clock.now());
        self.schedule.record(&report);
        let fencing_token = guard.fencing_token();
        if end == Some(SweepEnd::LockLost) {
            // Another instance may hold the lock now: a report from us would tell it
            // that a sweep completed which did not, so none is written (the fenced
            // write would refuse it only once the new holder has written its own).
            tracing::warn!(
                task,
                fencing_token,
                "retry lock lost during the sweep; stopped, sweep state not written"
            );
        } else {
            match self
                .state
                .set(
                    &self.config.state_key,
                    &report,
                    self.config.state_ttl,
                    fencing_token,
                )
                .await
            {
                Ok(StateWrite::Written) => {}
                Ok(StateWrite::Fenced) => tracing::warn!(
                    task,
                    fencing_token,
                    "sweep state not written: a newer lock holder has recorded its own"
                ),
                Err(e) => tracing::warn!(task, error = %e, "could not write the sweep state"),
            }
        }
        let idle = report.publish_retried == 0
            && report.publish_failed == 0
            && report.consume_retried == 0
            && report.consume_failed == 0;
        // A sweep that found nothing is routine: at DEBUG, or a consumer swept every
        // second would fill the log with it.
        macro_rules! completed {
            ($level:ident) => {
                tracing::$level!(
                    task,
                    fencing_token,
                    publish_retried = report.publish_retried,
                    publish_failed = report.publish_failed,
                    consume_retried = report.consume_retried,
                    consume_failed = report.consume_failed,
                    completed_at = %report.completed_at,
                    batches = progress.batches(),
                    end = end_text(end),
                    "retry sweep completed"
                )
            };
        }
        if idle {
            completed!(debug);
        } else {
            completed!(info);
        }
        if let Some(tx) = &self.reports {
            let _ = tx.try_send(report);
        }
        Ok(self
            .schedule
            .delay_until_due(LastCompleted::Absent, self.clock.now()))
    }

    /// Runs batches while the lock is held and the progress says so; `None` when
    /// cancelled between two batches.
    async fn batches(
        &self,
        progress: &mut SweepProgress,
        guard: &dyn LockGuard,
        cancel: &CancellationToken,
    ) -> Result<Option<SweepEnd>, PortError> {
        loop {
            if let SweepStep::Record(end) = progress.before_batch(guard.is_held()) {
                return Ok(Some(end));
            }
            // Shutdown, like a lost lock, stops a batch between two claims: a task
            // that claims row by row (consume retries, each up to its handler's
            // timeout) finishes the row in hand and claims no more.
            let held = || guard.is_held() && !cancel.is_cancelled();
            let counts = match self
                .task
                .run_batch_while_held(self.config.batch_size, &held)
                .await
            {
                Ok(counts) => counts,
                // The lost lock is what ended this sweep (another instance sweeps
                // now); the batch's error is likely its consequence (a claim whose
                // lease or time ran out while this instance stood still).
                Err(e) if !guard.is_held() => {
                    tracing::warn!(task = %self.label, error = %e, "a batch failed after the retry lock was lost");
                    return Ok(Some(SweepEnd::LockLost));
                }
                Err(e) => return Err(e),
            };
            match progress.after_batch(counts, guard.is_held()) {
                SweepStep::Record(end) => return Ok(Some(end)),
                SweepStep::NextBatch if cancel.is_cancelled() => return Ok(None),
                SweepStep::NextBatch => {}
            }
        }
    }
}
