//! The retry sweeper against every branch of the seed service, on paused tokio time,
//! with mocked ports (and memory adapters where several instances share them).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use outbox_adapters_memory::{MemoryLock, MemorySweepState, TokioClock};
use outbox_core::{BatchCounts, SweepConfig, SweepReport, Timestamp};
use outbox_ports::{
    Clock, DistributedLock, LockGuard, MockDistributedLock, MockLockGuard, MockSweepStateStore,
    PortError, StateWrite, SweepStateStore,
};
use outbox_runtime::{CancellationToken, RetrySweeper, SweepTask};
use tokio::sync::mpsc;
use tokio::time::Instant;

const INTERVAL: Duration = Duration::from_secs(60);

fn base() -> Timestamp {
    Timestamp::from_unix_timestamp(1_700_000_000).expect("valid")
}

fn config() -> SweepConfig {
    SweepConfig {
        interval: INTERVAL,
        batch_size: 50,
        max_batches_per_sweep: 10,
        ..SweepConfig::default()
    }
}

/// A sweep task that plays back scripted batch results (then empty batches) and
/// records when each batch ran.
#[derive(Default)]
struct ScriptedTask {
    script: Mutex<VecDeque<Result<BatchCounts, PortError>>>,
    batches_at: Mutex<Vec<Instant>>,
}

impl ScriptedTask {
    fn with(script: Vec<Result<BatchCounts, PortError>>) -> Arc<Self> {
        Arc::new(Self {
            script: Mutex::new(script.into()),
            batches_at: Mutex::default(),
        })
    }

    fn batches(&self) -> Vec<Instant> {
        self.batches_at.lock().expect("lock").clone()
    }
}

#[async_trait]
impl SweepTask for ScriptedTask {
    fn name(&self) -> &'static str {
        "scripted"
    }

    async fn run_batch(&self, _limit: u32) -> Result<BatchCounts, PortError> {
        self.batches_at.lock().expect("lock").push(Instant::now());
        self.script
            .lock()
            .expect("lock")
            .pop_front()
            .unwrap_or(Ok(BatchCounts::default()))
    }
}

fn full(n: u64) -> BatchCounts {
    BatchCounts {
        claimed: n,
        publish_retried: n,
        ..BatchCounts::default()
    }
}

/// A mock lock that always grants a guard (held, token 1) and records when. More
/// than 50 acquisitions in one test means a spinning sweeper: the mock panics, which
/// ends the sweeper task and fails the test instead of hanging it.
fn granting_lock(
    acquired: Arc<Mutex<Vec<Instant>>>,
    released: Arc<AtomicU32>,
) -> MockDistributedLock {
    let mut lock = MockDistributedLock::new();
    lock.expect_acquire().returning(move |_, _, _| {
        let mut at = acquired.lock().expect("lock");
        at.push(Instant::now());
        assert!(at.len() <= 50, "the sweeper is spinning on the lock");
        drop(at);
        let mut guard = MockLockGuard::new();
        guard.expect_fencing_token().return_const(1u64);
        guard.expect_is_held().return_const(true);
        let released = Arc::clone(&released);
        guard.expect_release().returning(move || {
            released.fetch_add(1, Ordering::SeqCst);
            Ok(())
        });
        Ok(Some(Box::new(guard) as Box<dyn LockGuard>))
    });
    lock
}

fn report_completed_at(at: Timestamp) -> SweepReport {
    SweepReport {
        started_at: at,
        completed_at: at,
        publish_retried: 3,
        publish_failed: 0,
        consume_retried: 0,
        consume_failed: 0,
    }
}

struct Run {
    cancel: CancellationToken,
    handle: tokio::task::JoinHandle<()>,
    reports: mpsc::Receiver<SweepReport>,
    started: Instant,
}

fn start(
    config: SweepConfig,
    lock: Arc<dyn DistributedLock>,
    state: Arc<dyn SweepStateStore>,
    clock: Arc<dyn Clock>,
    task: Arc<dyn SweepTask>,
) -> Run {
    let (tx, reports) = mpsc::channel(1 << 16);
    let cancel = CancellationToken::new();
    let sweeper = RetrySweeper::new(config, lock, state, clock, task).with_reports(tx);
    let started = Instant::now();
    let handle = tokio::spawn(sweeper.run(cancel.clone()));
    Run {
        cancel,
        handle,
        reports,
        started,
    }
}

impl Run {
    async fn stop(mut self) -> Vec<SweepReport> {
        self.cancel.cancel();
        tokio::time::timeout(Duration::from_secs(1), self.handle)
            .await
            .expect("sweeper stops promptly when cancelled")
            .expect("sweeper task");
        let mut out = Vec::new();
        while let Ok(r) = self.reports.try_recv() {
            out.push(r);
        }
        out
    }

    fn offsets(&self, at: &[Instant]) -> Vec<u64> {
        at.iter().map(|t| (*t - self.started).as_secs()).collect()
    }
}

fn state_returning(
    reads: Vec<Result<Option<SweepReport>, PortError>>,
    last: fn() -> Result<Option<SweepReport>, PortError>,
) -> (MockSweepStateStore, Arc<AtomicU32>) {
    let reads = Mutex::new(VecDeque::from(reads));
    let mut state = MockSweepStateStore::new();
    state
        .expect_get()
        .returning(move |_| reads.lock().expect("lock").pop_front().unwrap_or_else(last));
    let writes = Arc::new(AtomicU32::new(0));
    let w = Arc::clone(&writes);
    state.expect_set().returning(move |_, _, _, _| {
        w.fetch_add(1, Ordering::SeqCst);
        Ok(StateWrite::Written)
    });
    (state, writes)
}

#[tokio::test(start_paused = true)]
async fn lock_not_acquired_skips_the_round_without_spinning() {
    let (state, writes) = state_returning(vec![], || Ok(None));
    let attempts = Arc::new(Mutex::new(Vec::new()));
    let mut lock = MockDistributedLock::new();
    let a = Arc::clone(&attempts);
    // This lock gives up at once instead of waiting: the sweeper must still pace
    // itself by the lock wait, not spin.
    lock.expect_acquire().returning(move |_, _, _| {
        a.lock().expect("lock").push(Instant::now());
        Ok(None)
    });
    let task = ScriptedTask::with(vec![]);
    let clock = Arc::new(TokioClock::starting_at(base()));
    let run = start(
        config(),
        Arc::new(lock),
        Arc::new(state),
        clock,
        task.clone(),
    );
    tokio::time::sleep(Duration::from_secs(10)).await;
    let offsets = run.offsets(&attempts.lock().expect("lock"));
    let reports = run.stop().await;
    assert_eq!(offsets, [0, 3, 6, 9], "one try per lock wait (3 s)");
    assert!(task.batches().is_empty(), "never swept without the lock");
    assert!(reports.is_empty());
    assert_eq!(writes.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn a_lock_error_skips_the_round_and_waits_one_interval() {
    let (state, _) = state_returning(vec![], || Ok(None));
    let attempts = Arc::new(Mutex::new(Vec::new()));
    let mut lock = MockDistributedLock::new();
    let a = Arc::clone(&attempts);
    lock.expect_acquire().returning(move |_, _, _| {
        a.lock().expect("lock").push(Instant::now());
        Err(PortError::transient("acquire lock", "redis unreachable"))
    });
    let task = ScriptedTask::with(vec![]);
    let clock = Arc::new(TokioClock::starting_at(base()));
    let run = start(
        config(),
        Arc::new(lock),
        Arc::new(state),
        clock,
        task.clone(),
    );
    tokio::time::sleep(Duration::from_secs(150)).await;
    let offsets = run.offsets(&attempts.lock().expect("lock"));
    run.stop().await;
    assert_eq!(offsets, [0, 60, 120]);
    assert!(task.batches().is_empty(), "never swept without the lock");
}

#[tokio::test(start_paused = true)]
async fn another_instances_recent_sweep_means_wait() {
    // Another instance completed a sweep 20 s before we start: the first sweep is
    // due 40 s from now, and the stored report is adopted at start.
    let recent = report_completed_at(base() - Duration::from_secs(20));
    let (state, writes) = state_returning(vec![], move || {
        Ok(Some(report_completed_at(base() - Duration::from_secs(20))))
    });
    let _ = recent;
    let acquired = Arc::new(Mutex::new(Vec::new()));
    let lock = granting_lock(Arc::clone(&acquired), Arc::default());
    let task = ScriptedTask::with(vec![]);
    let clock = Arc::new(TokioClock::starting_at(base()));
    let run = start(
        config(),
        Arc::new(lock),
        Arc::new(state),
        clock,
        task.clone(),
    );
    tokio::time::sleep(Duration::from_secs(39)).await;
    assert!(
        acquired.lock().expect("lock").is_empty(),
        "no lock attempt before the interval"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let offsets = run.offsets(&acquired.lock().expect("lock"));
    run.stop().await;
    assert_eq!(offsets, [40]);
    assert_eq!(task.batches().len(), 1);
    assert_eq!(writes.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn an_unreadable_state_falls_back_to_this_instances_last_sweep() {
    // The state store answers once (nothing stored) and then fails on every read.
    let (state, _) = state_returning(vec![Ok(None), Ok(None), Ok(None)], || {
        Err(PortError::transient("read state", "redis unreachable"))
    });
    let acquired = Arc::new(Mutex::new(Vec::new()));
    let lock = granting_lock(Arc::clone(&acquired), Arc::default());
    let task = ScriptedTask::with(vec![]);
    let clock = Arc::new(TokioClock::starting_at(base()));
    let run = start(
        config(),
        Arc::new(lock),
        Arc::new(state),
        clock,
        task.clone(),
    );
    tokio::time::sleep(Duration::from_secs(150)).await;
    let batches = run.offsets(&task.batches());
    let reports = run.stop().await;
    assert_eq!(
        batches,
        [0, 60, 120],
        "one sweep per interval, timed from local memory"
    );
    assert_eq!(reports.len(), 3);
}

#[tokio::test(start_paused = true)]
async fn the_last_sweep_is_adopted_at_start() {
    // At start the stored report says 10 s ago; after that the store is unreadable.
    // The adopted completion time alone must hold the first sweep back 50 s.
    let (state, _) = state_returning(
        vec![Ok(Some(report_completed_at(
            base() - Duration::from_secs(10),
        )))],
        || Err(PortError::transient("read state", "down")),
    );
    let acquired = Arc::new(Mutex::new(Vec::new()));
    let lock = granting_lock(Arc::clone(&acquired), Arc::default());
    let task = ScriptedTask::with(vec![]);
    let clock = Arc::new(TokioClock::starting_at(base()));
    let run = start(
        config(),
        Arc::new(lock),
        Arc::new(state),
        clock,
        task.clone(),
    );
    tokio::time::sleep(Duration::from_secs(55)).await;
    let offsets = run.offsets(&acquired.lock().expect("lock"));
    run.stop().await;
    assert_eq!(offsets, [50]);
}

#[tokio::test(start_paused = true)]
async fn a_failed_sweep_is_logged_and_waits_one_interval() {
    let (state, writes) = state_returning(vec![], || Ok(None));
    let released = Arc::new(AtomicU32::new(0));
    let lock = granting_lock(Arc::default(), Arc::clone(&released));
    let task = ScriptedTask::with(vec![Err(PortError::transient("claim", "db down"))]);
    let clock = Arc::new(TokioClock::starting_at(base()));
    let run = start(
        config(),
        Arc::new(lock),
        Arc::new(state),
        clock,
        task.clone(),
    );
    tokio::time::sleep(Duration::from_secs(61)).await;
    let batches = run.offsets(&task.batches());
    let reports = run.stop().await;
    assert_eq!(
        batches,
        [0, 60],
        "after a failure the next try is one interval later"
    );
    assert_eq!(reports.len(), 1, "the failed sweep records nothing");
    assert_eq!(writes.load(Ordering::SeqCst), 1);
    assert_eq!(
        released.load(Ordering::SeqCst),
        2,
        "the lock is released after a failure too"
    );
}

#[tokio::test(start_paused = true)]
async fn a_sweep_that_retried_nothing_still_waits_the_interval() {
    // The seed returned without recording when nothing was retried, so its next round
    // started at once: lock, scan, lock, scan... Here it waits a full interval.
    let clock: Arc<dyn Clock> = Arc::new(TokioClock::starting_at(base()));
    let state = Arc::new(MemorySweepState::new(Arc::clone(&clock)));
    let acquired = Arc::new(Mutex::new(Vec::new()));
    let lock = granting_lock(Arc::clone(&acquired), Arc::default());
    let task = ScriptedTask::with(vec![]);
    let run = start(config(), Arc::new(lock), state, clock, task.clone());
    tokio::time::sleep(Duration::from_secs(150)).await;
    let offsets = run.offsets(&acquired.lock().expect("lock"));
    let reports = run.stop().await;
    assert_eq!(offsets, [0, 60, 120], "the lock is not hammered");
    assert_eq!(reports.len(), 3);
    assert!(reports.iter().all(|r| r.total() == 0));
}

#[tokio::test(start_paused = true)]
async fn under_the_lock_the_state_is_checked_again() {
    // Our first read finds nothing; by the time we hold the lock another instance has
    // recorded a sweep that completed just now: we must not sweep again.
    let (state, writes) = state_returning(
        vec![Ok(None), Ok(None), Ok(Some(report_completed_at(base())))],
        || Ok(Some(report_completed_at(base()))),
    );
    let released = Arc::new(AtomicU32::new(0));
    let acquired = Arc::new(Mutex::new(Vec::new()));
    let lock = granting_lock(Arc::clone(&acquired), Arc::clone(&released));
    let task = ScriptedTask::with(vec![]);
    let clock = Arc::new(TokioClock::starting_at(base()));
    let run = start(
        config(),
        Arc::new(lock),
        Arc::new(state),
        clock,
        task.clone(),
    );
    tokio::time::sleep(Duration::from_secs(30)).await;
    let offsets = run.offsets(&acquired.lock().expect("lock"));
    run.stop().await;
    assert_eq!(offsets, [0]);
    assert!(
        task.batches().is_empty(),
        "no sweep right after another instance's"
    );
    assert_eq!(released.load(Ordering::SeqCst), 1);
    assert_eq!(writes.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn a_sweep_drains_batches_until_a_short_one() {
    let (state, _) = state_returning(vec![], || Ok(None));
    let lock = granting_lock(Arc::default(), Arc::default());
    let task = ScriptedTask::with(vec![Ok(full(50)), Ok(full(50)), Ok(full(7))]);
    let clock = Arc::new(TokioClock::starting_at(base()));
    let run = start(
        config(),
        Arc::new(lock),
        Arc::new(state),
        clock,
        task.clone(),
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let reports = run.stop().await;
    assert_eq!(task.batches().len(), 3, "three batches in one sweep");
    assert_eq!(reports.len(), 1);
    assert_eq!(reports[0].publish_retried, 107);
}

#[tokio::test(start_paused = true)]
async fn a_sweep_stops_at_its_batch_bound() {
    let (state, _) = state_returning(vec![], || Ok(None));
    let lock = granting_lock(Arc::default(), Arc::default());
    let task = ScriptedTask::with((0..30).map(|_| Ok(full(50))).collect());
    let clock = Arc::new(TokioClock::starting_at(base()));
    let run = start(
        config(),
        Arc::new(lock),
        Arc::new(state),
        clock,
        task.clone(),
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let reports = run.stop().await;
    assert_eq!(task.batches().len(), 10);
    assert_eq!(reports[0].publish_retried, 500);
}

#[tokio::test(start_paused = true)]
async fn a_sweep_stops_when_the_lease_is_lost_and_records_no_state() {
    let (state, writes) = state_returning(vec![], || Ok(None));
    let memory = MemoryLock::new();
    // Full batches: without the loss, the sweep would go on to its bound.
    let task = Arc::new(WatchedTask {
        lose_in_batch: Some(memory.clone()),
        ..WatchedTask::default()
    });
    let clock = Arc::new(TokioClock::starting_at(base()));
    let run = start(
        config(),
        Arc::new(memory),
        Arc::new(state),
        clock,
        task.clone(),
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    run.stop().await;
    assert_eq!(
        task.batches.load(Ordering::SeqCst),
        1,
        "no batch after the lease was lost"
    );
    assert_eq!(
        writes.load(Ordering::SeqCst),
        0,
        "a sweep without the lock must not record the shared state"
    );
}

#[tokio::test(start_paused = true)]
async fn cancellation_ends_a_wait_and_a_lock_wait_cleanly() {
    let (state, _) = state_returning(vec![], || Ok(None));
    let released = Arc::new(AtomicU32::new(0));
    let lock = granting_lock(Arc::default(), Arc::clone(&released));
    let task = ScriptedTask::with(vec![]);
    let clock = Arc::new(TokioClock::starting_at(base()));
    let run = start(
        config(),
        Arc::new(lock),
        Arc::new(state),
        clock,
        task.clone(),
    );
    tokio::time::sleep(Duration::from_secs(30)).await; // mid-wait
    run.stop().await;
    assert_eq!(released.load(Ordering::SeqCst), 1);

    // Waiting for a lock someone else holds: cancellation does not sit out the wait.
    let memory_lock = Arc::new(MemoryLock::new());
    let held = memory_lock
        .acquire("outbox.retry.run-lock", INTERVAL, Duration::from_secs(1))
        .await
        .expect("acquire")
        .expect("free");
    let config = SweepConfig {
        lock_wait: Duration::from_secs(30),
        ..config()
    };
    let (state, _) = state_returning(vec![], || Ok(None));
    let clock = Arc::new(TokioClock::starting_at(base()));
    let run = start(config, memory_lock, Arc::new(state), clock, task.clone());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = Instant::now();
    run.stop().await;
    assert!(before.elapsed() < Duration::from_secs(1));
    held.release().await.expect("release");
}

#[tokio::test(start_paused = true)]
async fn two_instances_share_one_sweep_per_interval() {
    let clock: Arc<dyn Clock> = Arc::new(TokioClock::starting_at(base()));
    let lock: Arc<dyn DistributedLock> = Arc::new(MemoryLock::new());
    let state: Arc<dyn SweepStateStore> = Arc::new(MemorySweepState::new(Arc::clone(&clock)));
    let (a, b) = (ScriptedTask::with(vec![]), ScriptedTask::with(vec![]));
    let run_a = start(
        config(),
        lock.clone(),
        state.clone(),
        clock.clone(),
        a.clone(),
    );
    tokio::time::sleep(Duration::from_secs(17)).await;
    let run_b = start(config(), lock, state, clock, b.clone());
    tokio::time::sleep(Duration::from_secs(590) - Duration::from_secs(17)).await;
    let started = run_a.started;
    run_a.stop().await;
    run_b.stop().await;
    let mut all: Vec<_> = a.batches().into_iter().chain(b.batches()).collect();
    all.sort();
    let secs: Vec<u64> = all.iter().map(|t| (*t - started).as_secs()).collect();
    // 590 s: sweeps at 0, 60, ..., 540: ten, not twenty, never two within one interval.
    assert_eq!(secs.len(), 10, "{secs:?}");
    assert!(all.windows(2).all(|w| w[1] - w[0] >= INTERVAL), "{secs:?}");
}

/// A [`MemoryLock`] whose holder loses the lock right after acquiring it, as a lease
/// that runs out at once would.
struct LosingLock {
    inner: MemoryLock,
    acquisitions: AtomicU32,
}

#[async_trait]
impl DistributedLock for LosingLock {
    async fn acquire(
        &self,
        key: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Option<Box<dyn LockGuard>>, PortError> {
        let n = self.acquisitions.fetch_add(1, Ordering::SeqCst);
        assert!(n < 50, "the sweeper is spinning on the lock");
        let guard = self.inner.acquire(key, ttl, wait).await?;
        if guard.is_some() {
            self.inner.lose(key);
        }
        Ok(guard)
    }

    async fn is_locked(&self, key: &str) -> Result<bool, PortError> {
        DistributedLock::is_locked(&self.inner, key).await
    }
}

/// A sweep task that counts its `before_sweep` runs and batches (each full), and can
/// make the lock be lost while `before_sweep` or a batch runs.
#[derive(Default)]
struct WatchedTask {
    lose_in_before_sweep: Option<MemoryLock>,
    lose_in_batch: Option<MemoryLock>,
    /// The batch fails too (after losing the lock, if it does).
    fail_in_batch: bool,
    before_sweeps: AtomicU32,
    batches: AtomicU32,
}

#[async_trait]
impl SweepTask for WatchedTask {
    fn name(&self) -> &'static str {
        "watched"
    }

    async fn before_sweep(&self) -> Result<(), PortError> {
        self.before_sweeps.fetch_add(1, Ordering::SeqCst);
        if let Some(lock) = &self.lose_in_before_sweep {
            lock.lose(&config().lock_key);
        }
        Ok(())
    }

    async fn run_batch(&self, _limit: u32) -> Result<BatchCounts, PortError> {
        self.batches.fetch_add(1, Ordering::SeqCst);
        if let Some(lock) = &self.lose_in_batch {
            lock.lose(&config().lock_key);
        }
        if self.fail_in_batch {
            return Err(PortError::transient("batch", "its claim's lease ran out"));
        }
        Ok(full(50))
    }
}

/// A batch that fails after the lock was lost (a relay paused past its lease finds
/// its batch's time gone) ends the sweep as a lost lock, as if the batch had
/// returned: no state written, reported, not taken for a failed sweep.
#[tokio::test(start_paused = true)]
async fn a_batch_failing_after_the_lock_was_lost_ends_the_sweep_as_lost() {
    let (state, writes) = state_returning(vec![], || Ok(None));
    let memory = MemoryLock::new();
    let task = Arc::new(WatchedTask {
        lose_in_batch: Some(memory.clone()),
        fail_in_batch: true,
        ..WatchedTask::default()
    });
    let clock = Arc::new(TokioClock::starting_at(base()));
    let run = start(
        config(),
        Arc::new(memory),
        Arc::new(state),
        clock,
        task.clone(),
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let reports = run.stop().await;
    assert_eq!(task.batches.load(Ordering::SeqCst), 1);
    assert_eq!(
        writes.load(Ordering::SeqCst),
        0,
        "no state without the lock"
    );
    assert_eq!(
        reports.len(),
        1,
        "the sweep ended as a lost lock (reported), not as a failed sweep"
    );
}

#[tokio::test(start_paused = true)]
async fn a_lock_lost_right_after_acquiring_runs_no_batch_and_does_not_spin() {
    let (state, writes) = state_returning(vec![], || Ok(None));
    let lock = Arc::new(LosingLock {
        inner: MemoryLock::new(),
        acquisitions: AtomicU32::new(0),
    });
    let task = Arc::new(WatchedTask::default());
    let clock = Arc::new(TokioClock::starting_at(base()));
    let run = start(config(), lock.clone(), Arc::new(state), clock, task.clone());
    tokio::time::sleep(INTERVAL / 2).await;
    run.stop().await;
    assert_eq!(lock.acquisitions.load(Ordering::SeqCst), 1, "one round");
    assert_eq!(
        task.before_sweeps.load(Ordering::SeqCst),
        0,
        "no housekeeping without the lock"
    );
    assert_eq!(
        task.batches.load(Ordering::SeqCst),
        0,
        "no batch without the lock"
    );
    assert_eq!(
        writes.load(Ordering::SeqCst),
        0,
        "no state without the lock"
    );
}

#[tokio::test(start_paused = true)]
async fn a_lock_lost_during_before_sweep_runs_no_batch() {
    let (state, writes) = state_returning(vec![], || Ok(None));
    let memory = MemoryLock::new();
    let task = Arc::new(WatchedTask {
        lose_in_before_sweep: Some(memory.clone()),
        ..WatchedTask::default()
    });
    let clock = Arc::new(TokioClock::starting_at(base()));
    let run = start(
        config(),
        Arc::new(memory),
        Arc::new(state),
        clock,
        task.clone(),
    );
    tokio::time::sleep(INTERVAL / 2).await;
    run.stop().await;
    assert_eq!(task.before_sweeps.load(Ordering::SeqCst), 1);
    assert_eq!(
        task.batches.load(Ordering::SeqCst),
        0,
        "no batch after the lock was lost"
    );
    assert_eq!(
        writes.load(Ordering::SeqCst),
        0,
        "no state without the lock"
    );
}

/// A task that claims row by row (as the consume retries do), each row taking a
/// second, and asks `held` before each claim.
#[derive(Default)]
struct RowByRowTask {
    rows: AtomicU32,
}

#[async_trait]
impl SweepTask for RowByRowTask {
    fn name(&self) -> &'static str {
        "row-by-row"
    }

    async fn run_batch(&self, limit: u32) -> Result<BatchCounts, PortError> {
        self.run_batch_while_held(limit, &|| true).await
    }

    async fn run_batch_while_held(
        &self,
        limit: u32,
        held: &(dyn Fn() -> bool + Send + Sync),
    ) -> Result<BatchCounts, PortError> {
        let mut counts = BatchCounts::default();
        while counts.claimed < u64::from(limit) && held() {
            counts.claimed += 1;
            tokio::time::sleep(Duration::from_secs(1)).await;
            self.rows.fetch_add(1, Ordering::SeqCst);
        }
        Ok(counts)
    }
}

/// Shutdown stops a batch between two rows: the row in hand is finished and no
/// other is claimed, so a consumer stops within one handler's time, not a whole
/// batch's (50 rows of up to 30 s each).
#[tokio::test(start_paused = true)]
async fn shutdown_stops_a_row_by_row_batch_after_the_row_in_hand() {
    let (state, _writes) = state_returning(vec![], || Ok(None));
    let task = Arc::new(RowByRowTask::default());
    let clock = Arc::new(TokioClock::starting_at(base()));
    let run = start(
        config(),
        Arc::new(MemoryLock::new()),
        Arc::new(state),
        clock,
        task.clone(),
    );
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    run.cancel.cancel();
    tokio::time::timeout(Duration::from_secs(2), run.handle)
        .await
        .expect("the sweeper stopped within the row in hand")
        .expect("sweeper task");
    assert_eq!(
        task.rows.load(Ordering::SeqCst),
        3,
        "the third row, in hand at the cancel, was finished; no fourth was claimed"
    );
}
