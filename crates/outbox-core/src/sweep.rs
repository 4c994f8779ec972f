//! The retry sweep's scheduling, as values.
//!
//! The seed service loops: read the last completed sweep (shared state, else the
//! instance's own memory), wait until one interval has passed, take the cluster lock
//! (giving up after the lock wait), check again under the lock, retry a batch, record
//! the report. This module makes each of those choices a plain function of its inputs;
//! `outbox-runtime`'s `RetrySweeper` performs the I/O they ask for.
//!
//! Two defects of the seed are fixed here:
//! - it recorded nothing when a sweep retried nothing, so the next round started at
//!   once and the loop spun on the lock; here every sweep ends in a report
//!   ([`SweepProgress::finish`]) and therefore a full interval of waiting;
//! - it retried one batch per interval, which cannot drain a backlog; here a sweep
//!   goes on batch after batch ([`SweepProgress::after_batch`]) while batches come back
//!   full, up to a per-sweep bound, and stops early when the lock's lease is lost.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::{Timestamp, saturating_elapsed};

/// The outcome of one sweep, stored as the shared sweep state. Field names follow the
/// seed's `MessageOutboxRetryState`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SweepReport {
    /// When the sweep started (after the lock was taken).
    #[serde(with = "time::serde::rfc3339")]
    pub started_at: Timestamp,
    /// When it completed; the next sweep is due one interval later.
    #[serde(with = "time::serde::rfc3339")]
    pub completed_at: Timestamp,
    /// Messages re-published successfully.
    pub publish_retried: u64,
    /// Publish retries that failed again (or went dead).
    pub publish_failed: u64,
    /// Deliveries handled successfully on retry.
    pub consume_retried: u64,
    /// Consume retries that failed again (or went dead).
    pub consume_failed: u64,
}

impl SweepReport {
    /// All retries, successful or not.
    #[must_use]
    pub const fn total(&self) -> u64 {
        self.publish_retried + self.publish_failed + self.consume_retried + self.consume_failed
    }
}

/// What reading the shared sweep state gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LastCompleted {
    /// A report was stored (by any instance).
    Shared(Timestamp),
    /// No report is stored (first run, or it expired).
    Absent,
    /// The state store could not be read; the seed then trusts its local memory.
    Unreadable,
}

/// The next thing the sweeper should do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SweepAction {
    /// Not due yet: sleep this long, then read the state again.
    Wait(Duration),
    /// Due: try to take the cluster lock (outside the lock) ...
    TryLock,
    /// ... or, asked under the lock, still due: sweep now.
    Sweep,
}

/// The seed's scheduling state: the interval and the last completion this instance
/// knows of by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SweepSchedule {
    interval: Duration,
    local_last_completed: Option<Timestamp>,
}

impl SweepSchedule {
    /// A schedule with no sweep known yet.
    #[must_use]
    pub const fn new(interval: Duration) -> Self {
        Self {
            interval,
            local_last_completed: None,
        }
    }

    /// The interval.
    #[must_use]
    pub const fn interval(&self) -> Duration {
        self.interval
    }

    /// The last completion this instance recorded or learnt at start.
    #[must_use]
    pub const fn local_last_completed(&self) -> Option<Timestamp> {
        self.local_last_completed
    }

    /// At start the seed logs the stored report and adopts its completion time.
    pub fn adopt_at_start(&mut self, report: &SweepReport) {
        self.local_last_completed = Some(report.completed_at);
    }

    /// The completion the schedule counts from: the shared one when stored, else the
    /// local one (also when the shared state is unreadable).
    #[must_use]
    pub const fn last_completed(&self, shared: LastCompleted) -> Option<Timestamp> {
        match shared {
            LastCompleted::Shared(at) => Some(at),
            LastCompleted::Absent | LastCompleted::Unreadable => self.local_last_completed,
        }
    }

    /// How long until the next sweep is due (zero when due). The wait is at most one
    /// interval, so a completion stamped in the future by a skewed clock delays the
    /// sweep by one interval at worst instead of suspending it.
    #[must_use]
    pub fn delay_until_due(&self, shared: LastCompleted, now: Timestamp) -> Duration {
        match self.last_completed(shared) {
            None => Duration::ZERO,
            Some(last) => {
                let elapsed = saturating_elapsed(last, now);
                if last > now {
                    self.interval
                } else {
                    self.interval.saturating_sub(elapsed)
                }
            }
        }
    }

    /// Outside the lock: wait, or try the lock.
    #[must_use]
    pub fn next_action(&self, shared: LastCompleted, now: Timestamp) -> SweepAction {
        match self.delay_until_due(shared, now) {
            Duration::ZERO => SweepAction::TryLock,
            d => SweepAction::Wait(d),
        }
    }

    /// Under the lock, the seed checks again, because another instance may have
    /// swept between our read and our lock: sweep, or release and wait.
    #[must_use]
    pub fn recheck_under_lock(&self, shared: LastCompleted, now: Timestamp) -> SweepAction {
        match self.delay_until_due(shared, now) {
            Duration::ZERO => SweepAction::Sweep,
            d => SweepAction::Wait(d),
        }
    }

    /// After a failed round (any error), the seed logs and waits one interval.
    #[must_use]
    pub const fn after_error(&self) -> Duration {
        self.interval
    }

    /// After the lock was not acquired: the seed goes straight back to reading the
    /// state, relying on the lock wait for pacing. A lock that gave up sooner than the
    /// lock wait must not turn that into a spin, so the rest of the wait is returned.
    #[must_use]
    pub fn after_lock_not_acquired(&self, lock_wait: Duration, spent: Duration) -> Duration {
        lock_wait.saturating_sub(spent).min(self.interval)
    }

    /// Records a finished sweep: the local memory now counts from it.
    pub fn record(&mut self, report: &SweepReport) {
        self.local_last_completed = Some(report.completed_at);
    }
}

/// Counts of one batch of a sweep.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BatchCounts {
    /// Rows the batch claimed. A batch that claimed fewer than the batch size means
    /// nothing more is due.
    pub claimed: u64,
    /// Messages re-published successfully.
    pub publish_retried: u64,
    /// Publish retries that failed again.
    pub publish_failed: u64,
    /// Deliveries handled successfully on retry.
    pub consume_retried: u64,
    /// Consume retries that failed again.
    pub consume_failed: u64,
}

/// Why a sweep stopped taking batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SweepEnd {
    /// The last batch was short: nothing more is due.
    NothingDue,
    /// The per-sweep batch bound was reached; the rest waits for the next sweep.
    BoundReached,
    /// The lock's lease was lost; stop before doing more work without it.
    LockLost,
}

/// What to do after a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SweepStep {
    /// Claim another batch.
    NextBatch,
    /// Stop and record the report.
    Record(SweepEnd),
}

/// One sweep in progress: its counts so far and the decision to go on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SweepProgress {
    started_at: Timestamp,
    batch_size: u64,
    max_batches: u32,
    batches: u32,
    totals: BatchCounts,
}

impl SweepProgress {
    /// A sweep starting at `started_at`.
    #[must_use]
    pub fn start(started_at: Timestamp, batch_size: u32, max_batches: u32) -> Self {
        Self {
            started_at,
            batch_size: u64::from(batch_size.max(1)),
            max_batches: max_batches.max(1),
            batches: 0,
            totals: BatchCounts::default(),
        }
    }

    /// Batches done.
    #[must_use]
    pub const fn batches(&self) -> u32 {
        self.batches
    }

    /// Whether to run the next batch (the first included): only while the lock's
    /// lease is still ours (`lock_held`); otherwise the sweep ends as
    /// [`SweepEnd::LockLost`].
    #[must_use]
    pub const fn before_batch(&self, lock_held: bool) -> SweepStep {
        if lock_held {
            SweepStep::NextBatch
        } else {
            SweepStep::Record(SweepEnd::LockLost)
        }
    }

    /// Adds a batch's counts and decides whether to take another. `lock_held` is
    /// whether the lock's lease is still ours.
    pub fn after_batch(&mut self, counts: BatchCounts, lock_held: bool) -> SweepStep {
        self.batches += 1;
        let t = &mut self.totals;
        t.claimed += counts.claimed;
        t.publish_retried += counts.publish_retried;
        t.publish_failed += counts.publish_failed;
        t.consume_retried += counts.consume_retried;
        t.consume_failed += counts.consume_failed;
        if !lock_held {
            SweepStep::Record(SweepEnd::LockLost)
        } else if counts.claimed < self.batch_size {
            SweepStep::Record(SweepEnd::NothingDue)
        } else if self.batches >= self.max_batches {
            SweepStep::Record(SweepEnd::BoundReached)
        } else {
            SweepStep::NextBatch
        }
    }

    /// The report of this sweep, made whatever the counts are (a sweep that retried
    /// nothing still ends the interval: the seed's spin-loop fix).
    #[must_use]
    pub const fn finish(&self, completed_at: Timestamp) -> SweepReport {
        SweepReport {
            started_at: self.started_at,
            completed_at,
            publish_retried: self.totals.publish_retried,
            publish_failed: self.totals.publish_failed,
            consume_retried: self.totals.consume_retried,
            consume_failed: self.totals.consume_failed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MIN: Duration = Duration::from_secs(60);

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_unix_timestamp(1_700_000_000 + secs).expect("valid")
    }

    #[test]
    fn no_batch_runs_once_the_lock_is_lost_not_even_the_first() {
        let p = SweepProgress::start(at(0), 50, 10);
        assert_eq!(p.before_batch(true), SweepStep::NextBatch);
        assert_eq!(p.before_batch(false), SweepStep::Record(SweepEnd::LockLost));
        assert_eq!(p.batches(), 0);
    }

    #[test]
    fn first_run_sweeps_at_once() {
        let s = SweepSchedule::new(MIN);
        assert_eq!(
            s.next_action(LastCompleted::Absent, at(0)),
            SweepAction::TryLock
        );
        assert_eq!(
            s.recheck_under_lock(LastCompleted::Absent, at(0)),
            SweepAction::Sweep
        );
    }

    #[test]
    fn another_instances_recent_sweep_means_wait() {
        let s = SweepSchedule::new(MIN);
        assert_eq!(
            s.next_action(LastCompleted::Shared(at(0)), at(20)),
            SweepAction::Wait(Duration::from_secs(40))
        );
        assert_eq!(
            s.recheck_under_lock(LastCompleted::Shared(at(0)), at(59)),
            SweepAction::Wait(Duration::from_secs(1))
        );
        assert_eq!(
            s.next_action(LastCompleted::Shared(at(0)), at(60)),
            SweepAction::TryLock
        );
    }

    #[test]
    fn unreadable_or_absent_state_falls_back_to_local_memory() {
        let mut s = SweepSchedule::new(MIN);
        let report = SweepProgress::start(at(0), 50, 1).finish(at(1));
        s.record(&report);
        for shared in [LastCompleted::Unreadable, LastCompleted::Absent] {
            assert_eq!(
                s.next_action(shared, at(31)),
                SweepAction::Wait(Duration::from_secs(30))
            );
        }
        // A stored report wins over local memory.
        assert_eq!(
            s.next_action(LastCompleted::Shared(at(-100)), at(31)),
            SweepAction::TryLock
        );
    }

    #[test]
    fn a_future_completion_delays_by_one_interval_at_most() {
        let s = SweepSchedule::new(MIN);
        assert_eq!(
            s.next_action(LastCompleted::Shared(at(86_400)), at(0)),
            SweepAction::Wait(MIN)
        );
    }

    #[test]
    fn an_empty_sweep_still_produces_a_report_that_ends_the_interval() {
        // The seed returned early when nothing was retried, recorded nothing, and
        // spun. Here the empty sweep's report is recorded and the next one waits.
        let mut s = SweepSchedule::new(MIN);
        let mut p = SweepProgress::start(at(0), 50, 20);
        assert_eq!(
            p.after_batch(BatchCounts::default(), true),
            SweepStep::Record(SweepEnd::NothingDue)
        );
        let report = p.finish(at(1));
        assert_eq!(report.total(), 0);
        s.record(&report);
        assert_eq!(
            s.next_action(LastCompleted::Unreadable, at(1)),
            SweepAction::Wait(MIN)
        );
    }

    #[test]
    fn a_sweep_drains_full_batches_until_a_short_one() {
        let mut p = SweepProgress::start(at(0), 50, 20);
        let full = BatchCounts {
            claimed: 50,
            publish_retried: 45,
            publish_failed: 5,
            ..BatchCounts::default()
        };
        assert_eq!(p.after_batch(full, true), SweepStep::NextBatch);
        assert_eq!(p.after_batch(full, true), SweepStep::NextBatch);
        let short = BatchCounts {
            claimed: 3,
            consume_retried: 2,
            consume_failed: 1,
            ..BatchCounts::default()
        };
        assert_eq!(
            p.after_batch(short, true),
            SweepStep::Record(SweepEnd::NothingDue)
        );
        let r = p.finish(at(5));
        assert_eq!(
            (
                r.publish_retried,
                r.publish_failed,
                r.consume_retried,
                r.consume_failed
            ),
            (90, 10, 2, 1)
        );
        assert_eq!(r.started_at, at(0));
        assert_eq!(r.completed_at, at(5));
    }

    #[test]
    fn a_sweep_stops_at_its_bound_and_when_the_lock_is_lost() {
        let full = BatchCounts {
            claimed: 10,
            ..BatchCounts::default()
        };
        let mut p = SweepProgress::start(at(0), 10, 2);
        assert_eq!(p.after_batch(full, true), SweepStep::NextBatch);
        assert_eq!(
            p.after_batch(full, true),
            SweepStep::Record(SweepEnd::BoundReached)
        );
        let mut p = SweepProgress::start(at(0), 10, 5);
        assert_eq!(
            p.after_batch(full, false),
            SweepStep::Record(SweepEnd::LockLost)
        );
    }

    #[test]
    fn lock_not_acquired_pads_to_the_lock_wait() {
        let s = SweepSchedule::new(MIN);
        let wait = Duration::from_secs(3);
        assert_eq!(
            s.after_lock_not_acquired(wait, Duration::from_secs(3)),
            Duration::ZERO
        );
        assert_eq!(
            s.after_lock_not_acquired(wait, Duration::from_millis(1)),
            Duration::from_millis(2999)
        );
        assert_eq!(s.after_error(), MIN);
    }

    #[test]
    fn report_json_uses_rfc3339_and_round_trips() {
        let r = SweepProgress::start(at(0), 50, 1).finish(at(2));
        let json = serde_json::to_string(&r).expect("json");
        assert!(
            json.contains("\"completed_at\":\"2023-11-14T22:13:22Z\""),
            "{json}"
        );
        assert_eq!(serde_json::from_str::<SweepReport>(&json).expect("back"), r);
    }

    proptest! {
        #[test]
        fn no_sweep_sooner_than_one_interval_after_a_recorded_completion(
            interval_ms in 1u64..3_600_000,
            completed in -100_000i64..100_000,
            elapsed_ms in 0u64..7_200_000,
            shared in prop_oneof![Just(0u8), Just(1), Just(2)],
        ) {
            let interval = Duration::from_millis(interval_ms);
            let mut s = SweepSchedule::new(interval);
            let done = at(completed);
            let report = SweepProgress::start(done, 50, 1).finish(done);
            let shared = match shared {
                0 => { s.record(&report); LastCompleted::Unreadable }
                1 => { s.record(&report); LastCompleted::Absent }
                _ => LastCompleted::Shared(done),
            };
            let now = done + Duration::from_millis(elapsed_ms);
            match s.next_action(shared, now) {
                SweepAction::TryLock | SweepAction::Sweep => {
                    prop_assert!(now >= done + interval);
                }
                SweepAction::Wait(d) => {
                    prop_assert!(now < done + interval);
                    prop_assert_eq!(now + d, done + interval);
                }
            }
            prop_assert_eq!(
                s.next_action(shared, now) == SweepAction::TryLock,
                s.recheck_under_lock(shared, now) == SweepAction::Sweep
            );
        }

        #[test]
        fn waits_never_exceed_one_interval(
            interval_ms in 1u64..3_600_000,
            completed in -10_000_000i64..10_000_000,
        ) {
            let s = SweepSchedule::new(Duration::from_millis(interval_ms));
            if let SweepAction::Wait(d) = s.next_action(LastCompleted::Shared(at(completed)), at(0)) {
                prop_assert!(d <= Duration::from_millis(interval_ms));
            }
        }

        #[test]
        fn a_sweep_never_exceeds_its_batch_bound(
            batch in 1u32..100, max in 1u32..30,
            claims in proptest::collection::vec(0u64..150, 1..60),
        ) {
            let mut p = SweepProgress::start(at(0), batch, max);
            let mut taken = 0;
            for claimed in claims {
                taken += 1;
                let step = p.after_batch(BatchCounts { claimed, ..BatchCounts::default() }, true);
                if claimed < u64::from(batch) {
                    prop_assert_eq!(step, SweepStep::Record(SweepEnd::NothingDue));
                }
                if let SweepStep::Record(_) = step { break; }
            }
            prop_assert!(taken <= max);
            prop_assert_eq!(p.batches(), taken);
        }
    }
}
