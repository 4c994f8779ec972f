//! Unique lease holders for claims.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use outbox_ports::Lease;

/// Makes leases whose holder is this instance's id plus a sequence number, so every
/// claim has its own holder and marks of an old claim cannot touch a newer one.
#[derive(Debug)]
pub struct LeaseFactory {
    instance: String,
    ttl: Duration,
    seq: AtomicU64,
}

impl LeaseFactory {
    /// Leases of `ttl` for `instance` (e.g. `relay-<uuid>`).
    pub fn new(instance: impl Into<String>, ttl: Duration) -> Self {
        Self {
            instance: instance.into(),
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
        Lease::new(format!("{}#{n}", self.instance), self.ttl)
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
}
