//! Unique lease holders for claims.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use outbox_ports::Lease;

/// Makes leases whose holder is `<instance>~<random>#<n>`: the instance name, a
/// random part drawn once per factory and a per-claim counter. Marks are fenced by
/// the holder, so it must never repeat: not between two factories of one process
/// (the dispatch loops and the retry sweep each have one), and not between replicas
/// configured with the same `instance` name. The name alone is only for reading.
#[derive(Debug)]
pub struct LeaseFactory {
    prefix: String,
    ttl: Duration,
    seq: AtomicU64,
}

impl LeaseFactory {
    /// Leases of `ttl` for `instance` (e.g. `relay-<uuid>`, or a configured name
    /// that other replicas may share).
    pub fn new(instance: impl Into<String>, ttl: Duration) -> Self {
        // A random UUID per factory, from the operating system's generator (fastrand
        // is seeded from the clock and the thread id, which two replicas started at
        // once may share): holders of two factories never collide, whatever names
        // they were given.
        let prefix = format!("{}~{}", instance.into(), uuid::Uuid::new_v4().simple());
        Self {
            prefix,
            ttl,
            seq: AtomicU64::new(0),
        }
    }

    /// A new instance id: `prefix` and a UUIDv7, unique across the cluster.
    #[must_use]
    pub fn instance_id(prefix: &str) -> String {
        format!("{prefix}-{}", uuid::Uuid::now_v7().simple())
    }

    /// The next lease.
    #[must_use]
    pub fn next(&self) -> Lease {
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        Lease::new(format!("{}#{n}", self.prefix), self.ttl)
    }

    /// The lease duration.
    #[must_use]
    pub const fn ttl(&self) -> Duration {
        self.ttl
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holders_never_repeat() {
        let f = LeaseFactory::new(LeaseFactory::instance_id("relay"), Duration::from_secs(1));
        let a = f.next();
        let b = f.next();
        assert_ne!(a.holder, b.holder);
        assert!(a.holder.starts_with("relay-"));
    }

    #[test]
    fn factories_with_one_name_make_different_holders() {
        let a = LeaseFactory::new("same", Duration::from_secs(1));
        let b = LeaseFactory::new("same", Duration::from_secs(1));
        assert_ne!(a.next().holder, b.next().holder);
    }
}
