//! The operators' audit log in memory.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use outbox_ports::{AuditEntry, AuditLog, Clock, Page, PageCursor, PortError};

use crate::listing::{below, page};
use crate::lock;

/// [`AuditLog`] in memory: entries in recording order, stamped with the clock's time.
#[derive(Clone)]
pub struct MemoryAuditLog {
    entries: Arc<Mutex<std::collections::BTreeMap<u64, AuditEntry>>>,
    clock: Arc<dyn Clock>,
}

impl MemoryAuditLog {
    /// An empty log stamping entries with `clock`.
    #[must_use]
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            entries: Arc::default(),
            clock,
        }
    }
}

#[async_trait]
impl AuditLog for MemoryAuditLog {
    async fn record(&self, mut entry: AuditEntry) -> Result<(), PortError> {
        entry.at = Some(self.clock.now());
        let mut entries = lock(&self.entries);
        // Ids from 1, as a database identity column's.
        let seq = entries.last_key_value().map_or(1, |(k, _)| k + 1);
        entries.insert(seq, entry);
        Ok(())
    }

    async fn list(
        &self,
        after: Option<PageCursor>,
        limit: u32,
    ) -> Result<Page<AuditEntry>, PortError> {
        let entries = lock(&self.entries);
        Ok(page(
            entries
                .range(below(after))
                .rev()
                .map(|(seq, e)| (*seq, e.clone())),
            limit,
        ))
    }

    async fn of_target(&self, target: &str, limit: u32) -> Result<Vec<AuditEntry>, PortError> {
        let entries = lock(&self.entries);
        Ok(entries
            .values()
            .rev()
            .filter(|e| e.target == target)
            .take(usize::try_from(limit).unwrap_or(usize::MAX))
            .cloned()
            .collect())
    }
}
