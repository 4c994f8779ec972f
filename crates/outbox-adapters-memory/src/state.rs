//! The shared sweep state in memory.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::{SweepReport, Timestamp};
use outbox_ports::{Clock, PortError, StateWrite, SweepStateStore};

use crate::{FaultCounter, lock};

#[derive(Debug)]
struct Entry {
    report: SweepReport,
    token: u64,
    expires_at: Timestamp,
}

/// [`SweepStateStore`] in memory: reports expire after their TTL, writes are fenced.
#[derive(Clone)]
pub struct MemorySweepState {
    entries: Arc<Mutex<HashMap<String, Entry>>>,
    clock: Arc<dyn Clock>,
    failing_reads: Arc<FaultCounter>,
}

impl MemorySweepState {
    /// An empty state store reading time from `clock`.
    #[must_use]
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            entries: Arc::default(),
            clock,
            failing_reads: Arc::default(),
        }
    }

    /// Fault injection: the next `n` reads fail as if the store were unreachable.
    pub fn fail_next_reads(&self, n: u64) {
        self.failing_reads.arm(n);
    }
}

#[async_trait]
impl SweepStateStore for MemorySweepState {
    async fn get(&self, key: &str) -> Result<Option<SweepReport>, PortError> {
        if self.failing_reads.take() {
            return Err(PortError::transient("read sweep state", "injected fault"));
        }
        let now = self.clock.now();
        let entries = lock(&self.entries);
        Ok(entries
            .get(key)
            .filter(|e| e.expires_at > now)
            .map(|e| e.report))
    }

    async fn set(
        &self,
        key: &str,
        report: &SweepReport,
        ttl: Duration,
        fencing_token: u64,
    ) -> Result<StateWrite, PortError> {
        let now = self.clock.now();
        let mut entries = lock(&self.entries);
        if let Some(e) = entries.get(key)
            && e.expires_at > now
            && e.token > fencing_token
        {
            return Ok(StateWrite::Fenced);
        }
        entries.insert(
            key.to_owned(),
            Entry {
                report: *report,
                token: fencing_token,
                expires_at: now + ttl,
            },
        );
        Ok(StateWrite::Written)
    }
}
