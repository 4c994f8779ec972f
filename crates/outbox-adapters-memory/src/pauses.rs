//! Pauses in memory, shared by the memory outbox's claims and the memory inbox's
//! pause check when they are given the same [`MemoryPauses`].

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use outbox_core::Timestamp;
use outbox_ports::{Clock, Pause, PauseKind, PauseStore, PortError, invalid_pause_name};

use crate::lock;

/// Each pause in force: when and by whom.
type Entries = BTreeMap<(PauseKind, String), (Timestamp, String)>;

/// [`PauseStore`] in memory. Clones share the pauses.
#[derive(Clone)]
pub struct MemoryPauses {
    entries: Arc<Mutex<Entries>>,
    clock: Arc<dyn Clock>,
}

impl MemoryPauses {
    /// No pauses, timed by `clock`.
    #[must_use]
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            entries: Arc::default(),
            clock,
        }
    }

    /// Whether `name` is paused.
    #[must_use]
    pub fn is_paused(&self, kind: PauseKind, name: &str) -> bool {
        lock(&self.entries).contains_key(&(kind, name.to_owned()))
    }
}

#[async_trait]
impl PauseStore for MemoryPauses {
    async fn pause(&self, kind: PauseKind, name: &str, by: &str) -> Result<bool, PortError> {
        if let Some(why) = invalid_pause_name(name) {
            return Err(PortError::fatal("pause", format!("the name {why}")));
        }
        let now = self.clock.now();
        let mut entries = lock(&self.entries);
        let key = (kind, name.to_owned());
        if entries.contains_key(&key) {
            return Ok(false);
        }
        entries.insert(key, (now, by.to_owned()));
        Ok(true)
    }

    async fn resume(&self, kind: PauseKind, name: &str) -> Result<bool, PortError> {
        Ok(lock(&self.entries)
            .remove(&(kind, name.to_owned()))
            .is_some())
    }

    async fn pauses(&self) -> Result<Vec<Pause>, PortError> {
        Ok(lock(&self.entries)
            .iter()
            .map(|((kind, name), (since, by))| Pause {
                kind: *kind,
                name: name.clone(),
                since: Some(*since),
                by: by.clone(),
            })
            .collect())
    }
}
