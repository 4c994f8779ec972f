//! The cluster lock in memory.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use outbox_ports::{DistributedLock, LockGuard, PortError};

use crate::lock;

#[derive(Debug, Default)]
struct Table {
    /// Key -> fencing token of the current holder.
    held: HashMap<String, u64>,
    /// Last fencing token handed out; grows on every acquisition of any key.
    last_token: u64,
}

/// [`DistributedLock`] in memory. A lease lasts as long as its guard (the memory
/// adapter renews for free); [`MemoryLock::lose`] takes a held lock away, as an
/// expired lease would, for fault tests.
#[derive(Clone, Default)]
pub struct MemoryLock {
    table: Arc<Mutex<Table>>,
    /// Woken on every release, so waiters retry at once.
    released: Arc<tokio::sync::Notify>,
}

impl MemoryLock {
    /// A lock table with nothing held.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Fault injection: the current holder of `key` loses it (its guard's
    /// `is_held` turns false) and the key is free for others.
    pub fn lose(&self, key: &str) {
        lock(&self.table).held.remove(key);
        self.released.notify_waiters();
    }

    /// Whether someone holds `key`.
    #[must_use]
    pub fn is_locked(&self, key: &str) -> bool {
        lock(&self.table).held.contains_key(key)
    }

    fn try_take(&self, key: &str) -> Option<u64> {
        let mut t = lock(&self.table);
        if t.held.contains_key(key) {
            return None;
        }
        t.last_token += 1;
        let token = t.last_token;
        t.held.insert(key.to_owned(), token);
        Some(token)
    }
}

#[async_trait]
impl DistributedLock for MemoryLock {
    async fn acquire(
        &self,
        key: &str,
        _ttl: Duration,
        wait: Duration,
    ) -> Result<Option<Box<dyn LockGuard>>, PortError> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            if let Some(token) = self.try_take(key) {
                return Ok(Some(Box::new(MemoryLockGuard {
                    lock: self.clone(),
                    key: key.to_owned(),
                    token,
                    released: AtomicBool::new(false),
                })));
            }
            if tokio::time::timeout_at(deadline, released).await.is_err() {
                return Ok(None);
            }
        }
    }

    async fn is_locked(&self, key: &str) -> Result<bool, PortError> {
        Ok(Self::is_locked(self, key))
    }
}

struct MemoryLockGuard {
    lock: MemoryLock,
    key: String,
    token: u64,
    released: AtomicBool,
}

impl MemoryLockGuard {
    fn let_go(&self) {
        if self.released.swap(true, Ordering::SeqCst) {
            return;
        }
        let mut t = lock(&self.lock.table);
        if t.held.get(&self.key) == Some(&self.token) {
            t.held.remove(&self.key);
        }
        drop(t);
        self.lock.released.notify_waiters();
    }
}

#[async_trait]
impl LockGuard for MemoryLockGuard {
    fn fencing_token(&self) -> u64 {
        self.token
    }

    fn is_held(&self) -> bool {
        !self.released.load(Ordering::SeqCst)
            && lock(&self.lock.table).held.get(&self.key) == Some(&self.token)
    }

    async fn release(&self) -> Result<(), PortError> {
        self.let_go();
        Ok(())
    }
}

impl Drop for MemoryLockGuard {
    fn drop(&mut self) {
        self.let_go();
    }
}
