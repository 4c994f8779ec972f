//! Per-minute totals in memory.

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
    minutes: Arc<Mutex<BTreeMap<(ThroughputKindKey, i64), u64>>>,
    /// Per name: `(kind, name, minute) -> count`, kept for a week as PostgreSQL's.
    named: Arc<Mutex<BTreeMap<NamedMinute, u64>>>,
}

/// How long per-name minutes are kept, in minutes: the longest window and its
/// bucket.
const NAMED_KEPT_MINUTES: i64 = 7 * 24 * 60 + 60;

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
}

#[async_trait]
impl ThroughputLog for MemoryThroughputLog {
    async fn add(&self, kind: ThroughputKind, count: u64) -> Result<(), PortError> {
        if count == 0 {
            return Ok(());
        }
        let minute = self.clock.now().unix_timestamp().div_euclid(60);
        let mut m = self
            .minutes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *m.entry((kind.as_str(), minute)).or_default() += count;
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
        let m = self
            .minutes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Ok(m.iter()
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
        let minute = self.clock.now().unix_timestamp().div_euclid(60);
        let mut m = self
            .named
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (name, count) in counts.iter().filter(|(_, c)| *c > 0) {
            *m.entry((kind.as_str(), name.clone(), minute)).or_default() += count;
        }
        // What no window shows any more goes, as the writers forget on PostgreSQL.
        m.retain(|(_, _, at), _| *at > minute - NAMED_KEPT_MINUTES);
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
        let m = self
            .named
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
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
        let m = self
            .named
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut totals: BTreeMap<String, u64> = BTreeMap::new();
        for ((k, name, minute), count) in m.iter() {
            if *k == kind.as_str() && *minute >= since {
                *totals.entry(name.clone()).or_default() += count;
            }
        }
        Ok(totals.into_iter().filter(|(_, c)| *c > 0).collect())
    }
}
