//! Per-minute totals in memory.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::Timestamp;
use outbox_ports::{Clock, MinuteCount, PortError, ThroughputKind, ThroughputLog};

use crate::listing::window_start;

/// [`ThroughputLog`] in memory, by the minutes of its clock.
#[derive(Clone)]
pub struct MemoryThroughputLog {
    clock: Arc<dyn Clock>,
    minutes: Arc<Mutex<BTreeMap<(ThroughputKindKey, i64), u64>>>,
}

/// `ThroughputKind` as an ordered map key.
type ThroughputKindKey = &'static str;

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
}
