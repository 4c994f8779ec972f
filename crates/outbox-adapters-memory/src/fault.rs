//! A counter of faults still to inject.

use std::sync::atomic::{AtomicU64, Ordering};

/// Fails the next N calls that consult it. Shared by reference; thread safe.
#[derive(Debug, Default)]
pub struct FaultCounter(AtomicU64);

impl FaultCounter {
    /// A counter with nothing armed.
    #[must_use]
    pub const fn new() -> Self {
        Self(AtomicU64::new(0))
    }

    /// Arms `n` more faults.
    pub fn arm(&self, n: u64) {
        self.0.fetch_add(n, Ordering::SeqCst);
    }

    /// Consumes one armed fault: `true` means "fail this call".
    pub fn take(&self) -> bool {
        self.0
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }

    /// Faults still armed.
    #[must_use]
    pub fn remaining(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fails_exactly_n_times() {
        let f = FaultCounter::new();
        f.arm(2);
        assert!(f.take());
        assert!(f.take());
        assert!(!f.take());
        assert_eq!(f.remaining(), 0);
    }
}
