//! Commit-to-consume latency: the steady value and each fault's recovery time, as
//! pure functions of latency windows (read from the database by the sampler).
//!
//! A window is a stretch of time and the p50/p99 of the latency of the orders whose
//! effect (the invoice) was recorded within it. Latency is measured from the order's
//! INSERT (a few milliseconds before its COMMIT) to the invoice's INSERT by the
//! consumer, both stamped with PostgreSQL's `clock_timestamp()`.
//!
//! - **Steady p99**: the median of the p99s of the 10-second windows that are
//!   after the warm-up, before the end of production, hold at least
//!   [`MIN_WINDOW_COUNT`] orders, and do not overlap any fault's span from its start
//!   to [`DISTURBED_AFTER`] after its end.
//! - **Back at steady**: a window's p99 at or under the threshold
//!   `max(1.5 × steady, steady + 50 ms)`; one 10-second p99 on a shared machine
//!   swings by that much without any fault.
//! - **Recovery time** of a fault: windows of 10 s starting every second from the
//!   fault's end; the recovery time is the start of the first one that is back at
//!   steady, minus the fault's end (0 when the fault did not disturb latency at all).

/// How long after a fault windows are left out of the steady value.
pub(crate) const DISTURBED_AFTER: f64 = 60.0;
/// Windows with fewer orders than this say nothing about a p99.
pub(crate) const MIN_WINDOW_COUNT: u64 = 20;
/// The length of a latency window.
pub(crate) const WINDOW_S: f64 = 10.0;

/// Latency of the orders consumed in `[start_s, end_s)`, seconds since the start of
/// the run; `p50`/`p99` are `None` when nothing was consumed.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Window {
    pub(crate) start_s: f64,
    pub(crate) end_s: f64,
    pub(crate) count: u64,
    pub(crate) p50_ms: Option<f64>,
    pub(crate) p99_ms: Option<f64>,
}

/// The steady p99 (see the module docs); `None` when no window qualifies.
/// `faults` are `(start_s, end_s)`; `production_end_s` is when the producer stopped.
pub(crate) fn steady_p99(
    windows: &[Window],
    warmup_s: f64,
    production_end_s: f64,
    faults: &[(f64, f64)],
) -> Option<f64> {
    let mut p99s: Vec<f64> = windows
        .iter()
        .filter(|w| w.start_s >= warmup_s && w.end_s <= production_end_s)
        .filter(|w| w.count >= MIN_WINDOW_COUNT)
        .filter(|w| {
            faults
                .iter()
                .all(|&(a, b)| w.end_s <= a || w.start_s >= b + DISTURBED_AFTER)
        })
        .filter_map(|w| w.p99_ms)
        .collect();
    if p99s.is_empty() {
        return None;
    }
    p99s.sort_by(f64::total_cmp);
    let n = p99s.len();
    Some(if n % 2 == 1 {
        p99s[n / 2]
    } else {
        f64::midpoint(p99s[n / 2 - 1], p99s[n / 2])
    })
}

/// The p99 a window may have and still count as back at steady.
pub(crate) fn threshold(steady_ms: f64) -> f64 {
    (steady_ms * 1.5).max(steady_ms + 50.0)
}

/// The recovery time of a fault that ended at `fault_end_s`, from `windows` (10-s
/// windows starting every second from the fault's end, in order): the start of the
/// first one back at steady, minus the fault's end. `None` if none is.
pub(crate) fn recovery_s(fault_end_s: f64, windows: &[Window], steady_ms: f64) -> Option<f64> {
    let limit = threshold(steady_ms);
    windows
        .iter()
        .filter(|w| w.start_s >= fault_end_s - 1e-9)
        .find(|w| w.p99_ms.is_some_and(|p| p <= limit))
        .map(|w| (w.start_s - fault_end_s).max(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(start_s: f64, p99: Option<f64>) -> Window {
        Window {
            start_s,
            end_s: start_s + WINDOW_S,
            count: 100,
            p50_ms: p99.map(|p| p / 2.0),
            p99_ms: p99,
        }
    }

    #[test]
    fn steady_is_the_median_of_the_undisturbed_windows_after_warm_up() {
        let windows: Vec<Window> = [
            (0.0, 900.0),   // warm-up
            (10.0, 900.0),  // warm-up
            (20.0, 100.0),  // steady
            (30.0, 120.0),  // steady
            (40.0, 5000.0), // the fault at 45..50
            (50.0, 3000.0), // within 60 s after it
            (100.0, 800.0), // within 60 s after it
            (110.0, 110.0), // steady
            (120.0, 90.0),  // steady
            (130.0, 140.0), // steady
            (140.0, 70.0),  // after production ended
        ]
        .iter()
        .map(|&(s, p)| w(s, Some(p)))
        .collect();
        let steady = steady_p99(&windows, 20.0, 140.0, &[(45.0, 50.0)]);
        assert_eq!(steady, Some(110.0));
    }

    #[test]
    fn windows_with_few_orders_or_none_do_not_make_the_steady_value() {
        let mut few = w(20.0, Some(5.0));
        few.count = MIN_WINDOW_COUNT - 1;
        let windows = [
            few,
            w(30.0, None),
            w(40.0, Some(100.0)),
            w(50.0, Some(200.0)),
        ];
        assert_eq!(steady_p99(&windows, 20.0, 100.0, &[]), Some(150.0));
        assert_eq!(steady_p99(&windows[..2], 20.0, 100.0, &[]), None);
    }

    #[test]
    fn recovery_is_the_start_of_the_first_window_back_at_steady() {
        // Steady 100 ms: the threshold is 150 ms.
        assert_eq!(threshold(100.0), 150.0);
        assert_eq!(threshold(20.0), 70.0);
        let windows: Vec<Window> = (0..30)
            .map(|k| {
                let p = match k {
                    0..=11 => 2000.0,
                    12 => 151.0,
                    _ => 150.0,
                };
                w(60.0 + f64::from(k), Some(p))
            })
            .collect();
        assert_eq!(recovery_s(60.0, &windows, 100.0), Some(13.0));
    }

    #[test]
    fn an_undisturbed_fault_recovers_at_once_and_a_window_without_orders_is_not_recovered() {
        let windows = [w(60.0, None), w(61.0, Some(80.0))];
        assert_eq!(recovery_s(60.0, &windows, 100.0), Some(1.0));
        assert_eq!(recovery_s(61.0, &windows, 100.0), Some(0.0));
        let never = [w(60.0, Some(1000.0)), w(61.0, None)];
        assert_eq!(recovery_s(60.0, &never, 100.0), None);
    }
}
