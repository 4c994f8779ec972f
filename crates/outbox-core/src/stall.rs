//! Whether a service loop is stalled: work is due, and none of its store
//! operations (a claim, a mark) has completed for `stall_after`. A decision over
//! values passed in; the watchdog that feeds it only reads and reports.
//!
//! Times are offsets on one monotonic clock of the caller's choice (e.g. since
//! the process started), so no wall-clock step can make a loop look stalled.

use std::time::Duration;

/// What [`StallWatch::observe`] concluded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// No work is due: nothing to be stalled on.
    Idle,
    /// Work is due and moved within `stall_after`.
    Moving,
    /// Work has been due, and nothing completed, for `quiet` (at least
    /// `stall_after`).
    Stalled {
        /// How long nothing has completed while work was due.
        quiet: Duration,
    },
}

impl Progress {
    /// Whether this is [`Progress::Stalled`].
    #[must_use]
    pub const fn is_stalled(&self) -> bool {
        matches!(self, Self::Stalled { .. })
    }
}

/// Remembers since when work has been due, between observations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StallWatch {
    stall_after: Duration,
    due_since: Option<Duration>,
}

impl StallWatch {
    /// A watch that calls a loop stalled after `stall_after` without progress.
    #[must_use]
    pub const fn new(stall_after: Duration) -> Self {
        Self {
            stall_after,
            due_since: None,
        }
    }

    /// One observation at `now`: `due` says whether work is due (`None`: could not
    /// be told, e.g. the store did not answer; the last answer holds), and
    /// `last_progress` when a claim or mark last completed (`None`: never).
    ///
    /// Work that just became due after a long quiet time gets the whole
    /// `stall_after` before it counts as stalled: the quiet time is counted from
    /// the later of the last progress and the moment work was first seen due.
    pub fn observe(
        &mut self,
        now: Duration,
        due: Option<bool>,
        last_progress: Option<Duration>,
    ) -> Progress {
        match due {
            Some(false) => self.due_since = None,
            Some(true) => {
                self.due_since.get_or_insert(now);
            }
            None => {}
        }
        let Some(due_since) = self.due_since else {
            return Progress::Idle;
        };
        let quiet_since = last_progress.map_or(due_since, |p| p.max(due_since));
        // A progress recorded after `now` was read is no quiet time at all.
        let quiet = now.saturating_sub(quiet_since);
        if quiet >= self.stall_after {
            Progress::Stalled { quiet }
        } else {
            Progress::Moving
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn nothing_due_is_never_stalled_however_old_the_last_progress() {
        let mut w = StallWatch::new(s(60));
        assert_eq!(w.observe(s(1_000), Some(false), None), Progress::Idle);
        assert_eq!(w.observe(s(5_000), Some(false), Some(s(1))), Progress::Idle);
        // Unknown without an earlier answer: nothing is known to be due.
        assert_eq!(w.observe(s(9_000), None, Some(s(1))), Progress::Idle);
    }

    #[test]
    fn work_that_becomes_due_after_a_long_idle_time_gets_the_whole_bound() {
        let mut w = StallWatch::new(s(60));
        assert_eq!(w.observe(s(100), Some(false), Some(s(1))), Progress::Idle);
        assert_eq!(w.observe(s(200), Some(true), Some(s(1))), Progress::Moving);
        assert_eq!(w.observe(s(259), Some(true), Some(s(1))), Progress::Moving);
        assert_eq!(
            w.observe(s(260), Some(true), Some(s(1))),
            Progress::Stalled { quiet: s(60) }
        );
    }

    #[test]
    fn due_work_without_progress_stalls_and_progress_clears_it() {
        let mut w = StallWatch::new(s(60));
        assert_eq!(w.observe(s(0), Some(true), None), Progress::Moving);
        assert_eq!(w.observe(s(30), Some(true), Some(s(10))), Progress::Moving);
        assert_eq!(
            w.observe(s(75), Some(true), Some(s(10))),
            Progress::Stalled { quiet: s(65) }
        );
        // The store stops answering: the last answer (due) holds.
        assert!(w.observe(s(90), None, Some(s(10))).is_stalled());
        // A claim or mark completes: moving again, by itself.
        assert_eq!(w.observe(s(91), Some(true), Some(s(91))), Progress::Moving);
        assert!(w.observe(s(151), Some(true), Some(s(91))).is_stalled());
        // The work is gone: idle, not stalled.
        assert_eq!(w.observe(s(152), Some(false), Some(s(91))), Progress::Idle);
    }

    #[test]
    fn a_progress_newer_than_now_counts_as_no_quiet_time() {
        let mut w = StallWatch::new(s(1));
        assert_eq!(w.observe(s(10), Some(true), Some(s(11))), Progress::Moving);
    }

    proptest::proptest! {
        /// Stalled exactly when work is due and the quiet time since the later of
        /// the last progress and the first due observation reaches the bound.
        #[test]
        fn stalled_iff_due_and_quiet_for_the_bound(
            after in 1u64..1_000,
            first in 0u64..10_000,
            gap in 0u64..10_000,
            progress in proptest::option::of(0u64..20_000),
        ) {
            let mut w = StallWatch::new(Duration::from_millis(after));
            let first_at = Duration::from_millis(first);
            let now = first_at + Duration::from_millis(gap);
            let p = progress.map(Duration::from_millis);
            w.observe(first_at, Some(true), p);
            let verdict = w.observe(now, Some(true), p);
            let since = p.map_or(first_at, |p| p.max(first_at));
            let quiet = now.saturating_sub(since);
            proptest::prop_assert_eq!(
                verdict.is_stalled(),
                quiet >= Duration::from_millis(after)
            );
        }
    }
}
