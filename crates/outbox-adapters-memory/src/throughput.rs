//! Per-minute totals in memory, forgotten as PostgreSQL's are: the plain totals
//! after a day, each name's minutes after 1,455 minutes (the day chart and its
//! first bucket) and its hours after 169 hours (the week chart and its first
//! bucket). So what a long-running process (`demo --serve`) keeps is bounded by
//! the names counted, never by how long it runs.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::Timestamp;
use outbox_ports::{
    BucketCount, ChartWindow, Clock, MinuteCount, PortError, ThroughputKind, ThroughputLog,
    check_names_per_add,
};

use crate::listing::window_start;

/// [`ThroughputLog`] in memory, by the minutes of its clock.
#[derive(Clone)]
pub struct MemoryThroughputLog {
    clock: Arc<dyn Clock>,
    /// `(kind, minute) -> count`, kept [`PLAIN_KEPT_SECONDS`].
    minutes: Arc<Mutex<Kept<(ThroughputKindKey, i64)>>>,
    /// Per name, by minute and by hour.
    named: Arc<Mutex<Named>>,
}

/// How long the plain per-minute totals are kept, in seconds: a day, as
/// PostgreSQL's (`outbox_throughput`).
const PLAIN_KEPT_SECONDS: i64 = 24 * 3600;
/// How long a name's minutes are kept, in seconds: the day chart and its first
/// bucket (1,455 minutes), as PostgreSQL's.
const NAMED_MINUTES_KEPT_SECONDS: i64 = 1455 * 60;
/// How long a name's hours are kept, in seconds: the week chart and its first
/// bucket (169 hours), as PostgreSQL's.
const NAMED_HOURS_KEPT_SECONDS: i64 = 169 * 3600;

/// Counts by a key ending in a minute (since the Unix epoch), and the minute of
/// the clock they were last looked over for what to forget (once a minute is
/// enough: they age by the minute).
struct Kept<K> {
    counts: BTreeMap<K, u64>,
    forgotten_at: i64,
}

impl<K> Default for Kept<K> {
    fn default() -> Self {
        Self {
            counts: BTreeMap::new(),
            forgotten_at: i64::MIN,
        }
    }
}

impl<K: Ord> Kept<K> {
    /// Drops, at most once per minute `now_minute`, the entries whose minute
    /// (`minute_of`) starts before `oldest` (Unix seconds).
    fn forget(&mut self, now_minute: i64, oldest: i64, minute_of: impl Fn(&K) -> i64) {
        if self.forgotten_at == now_minute {
            return;
        }
        self.forgotten_at = now_minute;
        self.counts.retain(|k, _| minute_of(k) * 60 >= oldest);
    }
}

/// A name's counts: `(kind, name, minute)` for the hour and day charts, and
/// `(kind, name, first minute of the hour)` for the week's.
#[derive(Default)]
struct Named {
    minutes: Kept<NamedMinute>,
    hours: Kept<NamedMinute>,
}

/// `ThroughputKind` as an ordered map key.
type ThroughputKindKey = &'static str;

/// A kind, a name and a minute (since the Unix epoch).
type NamedMinute = (ThroughputKindKey, String, i64);

impl std::fmt::Debug for MemoryThroughputLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryThroughputLog")
            .finish_non_exhaustive()
    }
}

impl MemoryThroughputLog {
    /// An empty log on `clock`.
    #[must_use]
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            clock,
            minutes: Arc::default(),
            named: Arc::default(),
        }
    }

    /// How many (kind, minute) and (kind, name, minute or hour) entries it holds.
    #[cfg(test)]
    fn stored(&self) -> (usize, usize, usize) {
        let plain = lock(&self.minutes).counts.len();
        let named = lock(&self.named);
        (plain, named.minutes.counts.len(), named.hours.counts.len())
    }
}

/// `m` locked, whatever a panicking holder left.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[async_trait]
impl ThroughputLog for MemoryThroughputLog {
    async fn add(&self, kind: ThroughputKind, count: u64) -> Result<(), PortError> {
        if count == 0 {
            return Ok(());
        }
        let now = self.clock.now().unix_timestamp();
        let minute = now.div_euclid(60);
        let mut m = lock(&self.minutes);
        *m.counts.entry((kind.as_str(), minute)).or_default() += count;
        m.forget(minute, now - PLAIN_KEPT_SECONDS, |(_, at)| *at);
        Ok(())
    }

    async fn per_minute(
        &self,
        kind: ThroughputKind,
        window: Duration,
    ) -> Result<Vec<MinuteCount>, PortError> {
        let since = window_start(self.clock.now(), window)
            .unix_timestamp()
            .div_euclid(60);
        let m = lock(&self.minutes);
        Ok(m.counts
            .iter()
            .filter(|((k, minute), _)| *k == kind.as_str() && *minute >= since)
            .filter_map(|((_, minute), count)| {
                Timestamp::from_unix_timestamp(minute * 60)
                    .ok()
                    .map(|minute| MinuteCount {
                        minute,
                        count: *count,
                    })
            })
            .collect())
    }

    async fn add_named(
        &self,
        kind: ThroughputKind,
        counts: &[(String, u64)],
    ) -> Result<(), PortError> {
        check_names_per_add(counts.len())?;
        let now = self.clock.now().unix_timestamp();
        let minute = now.div_euclid(60);
        let hour = minute.div_euclid(60) * 60;
        let mut m = lock(&self.named);
        for (name, count) in counts.iter().filter(|(_, c)| *c > 0) {
            *m.minutes
                .counts
                .entry((kind.as_str(), name.clone(), minute))
                .or_default() += count;
            *m.hours
                .counts
                .entry((kind.as_str(), name.clone(), hour))
                .or_default() += count;
        }
        // What no window shows any more goes, as the writers forget on PostgreSQL.
        m.minutes
            .forget(minute, now - NAMED_MINUTES_KEPT_SECONDS, |(_, _, at)| *at);
        m.hours
            .forget(minute, now - NAMED_HOURS_KEPT_SECONDS, |(_, _, at)| *at);
        Ok(())
    }

    async fn named_series(
        &self,
        kind: ThroughputKind,
        name: &str,
        window: ChartWindow,
    ) -> Result<Vec<BucketCount>, PortError> {
        let starts = window.bucket_starts(self.clock.now());
        let width = window.bucket_seconds();
        let named = lock(&self.named);
        let m = &kept_for(&named, window).counts;
        Ok(starts
            .into_iter()
            .map(|start| {
                let from = start.unix_timestamp().div_euclid(60);
                let to = from + width / 60;
                let count = m
                    .range(
                        (kind.as_str(), name.to_owned(), from)
                            ..(kind.as_str(), name.to_owned(), to),
                    )
                    .map(|(_, c)| *c)
                    .sum();
                BucketCount { start, count }
            })
            .collect())
    }

    async fn named_totals(
        &self,
        kind: ThroughputKind,
        window: ChartWindow,
    ) -> Result<Vec<(String, u64)>, PortError> {
        let since = window
            .bucket_starts(self.clock.now())
            .first()
            .map_or(i64::MIN, |s| s.unix_timestamp().div_euclid(60));
        let named = lock(&self.named);
        let mut totals: BTreeMap<String, u64> = BTreeMap::new();
        for ((k, name, minute), count) in &kept_for(&named, window).counts {
            if *k == kind.as_str() && *minute >= since {
                *totals.entry(name.clone()).or_default() += count;
            }
        }
        Ok(totals.into_iter().filter(|(_, c)| *c > 0).collect())
    }
}

/// What `window`'s buckets are summed from: hours for the week (its buckets are
/// whole hours), minutes for the others, as on PostgreSQL.
fn kept_for(named: &Named, window: ChartWindow) -> &Kept<NamedMinute> {
    match window {
        ChartWindow::Week => &named.hours,
        _ => &named.minutes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A clock the test moves.
    struct Hand(Mutex<Timestamp>);

    impl Clock for Hand {
        fn now(&self) -> Timestamp {
            *lock(&self.0)
        }
    }

    impl Hand {
        fn set(&self, at: i64) {
            *lock(&self.0) = Timestamp::from_unix_timestamp(at).expect("a time");
        }
    }

    /// What a window's buckets must read, from the adds made (Unix seconds, count).
    fn expected(adds: &[(i64, u64)], window: ChartWindow, now: Timestamp) -> Vec<BucketCount> {
        let width = window.bucket_seconds();
        window
            .bucket_starts(now)
            .into_iter()
            .map(|start| {
                let from = start.unix_timestamp();
                let count = adds
                    .iter()
                    .filter(|(at, _)| (from..from + width).contains(at))
                    .map(|(_, c)| c)
                    .sum();
                BucketCount { start, count }
            })
            .collect()
    }

    #[tokio::test]
    async fn old_minutes_are_forgotten_and_the_charts_answer_as_before() {
        let start: i64 = 1_800_000_000; // a whole hour since the epoch
        let hand = Arc::new(Hand(Mutex::new(Timestamp::UNIX_EPOCH)));
        hand.set(start);
        let log = MemoryThroughputLog::new(hand.clone());
        let (named, plain) = (ThroughputKind::Published, ThroughputKind::Consumed);
        let mut adds = Vec::new();
        let mut most = (0, 0, 0);
        // Ten days, a count every 5 minutes (at a second that varies) for two names
        // and the plain totals.
        for step in 0..(10 * 24 * 12) {
            let at = start + step * 300 + step % 60;
            hand.set(at);
            let count = u64::try_from(step % 7 + 1).expect("small");
            log.add(plain, count).await.expect("add");
            log.add_named(named, &[("a".to_owned(), count), ("b".to_owned(), 1)])
                .await
                .expect("add");
            adds.push((at, count));
            let (p, m, h) = log.stored();
            most = (most.0.max(p), most.1.max(m), most.2.max(h));
        }
        eprintln!("most entries kept over ten days (plain, named minutes, named hours): {most:?}");
        // Bounded by what the windows need: a day of minutes of one kind, a day
        // and 15 minutes of minutes of two names, a week and an hour of hours.
        assert!(most.0 <= 24 * 12 + 1, "plain minutes kept: {most:?}");
        assert!(most.1 <= 2 * (1455 / 5 + 1), "named minutes kept: {most:?}");
        assert!(most.2 <= 2 * (169 + 1), "named hours kept: {most:?}");

        // The charts read as from every add.
        let now = hand.now();
        for window in ChartWindow::ALL {
            let series = log.named_series(named, "a", window).await.expect("read");
            assert_eq!(series, expected(&adds, window, now), "{window:?}");
            let total: u64 = expected(&adds, window, now).iter().map(|b| b.count).sum();
            let totals = log.named_totals(named, window).await.expect("totals");
            let b = u64::try_from(expected(&adds, window, now).len()).expect("small");
            assert_eq!(totals.first(), Some(&("a".to_owned(), total)), "{window:?}");
            assert!(
                totals
                    .get(1)
                    .is_some_and(|(n, t)| n == "b" && *t > 0 && *t <= b * 12),
                "{window:?}: {totals:?}"
            );
        }
        let day = log
            .per_minute(plain, Duration::from_secs(24 * 3600))
            .await
            .expect("read");
        let since = now.unix_timestamp() - 24 * 3600;
        let want: Vec<(i64, u64)> = adds
            .iter()
            // Kept as PostgreSQL keeps them: minutes starting within the day.
            .filter(|(at, _)| at.div_euclid(60) * 60 >= since)
            .map(|(at, c)| (at.div_euclid(60) * 60, *c))
            .collect();
        let got: Vec<(i64, u64)> = day
            .iter()
            .map(|m| (m.minute.unix_timestamp(), m.count))
            .collect();
        assert_eq!(got, want, "the last day's minutes, each as added");

        // Thirty days later: one add, and everything older is gone.
        hand.set(now.unix_timestamp() + 30 * 24 * 3600);
        log.add(plain, 1).await.expect("add");
        log.add_named(named, &[("a".to_owned(), 1)])
            .await
            .expect("add");
        assert_eq!(log.stored(), (1, 1, 1));
        let all = log
            .per_minute(plain, Duration::from_secs(365 * 24 * 3600))
            .await
            .expect("read");
        assert_eq!(all.len(), 1, "{all:?}");
        for window in ChartWindow::ALL {
            let totals = log.named_totals(named, window).await.expect("totals");
            assert_eq!(totals, [("a".to_owned(), 1)], "{window:?}");
        }
    }
}
