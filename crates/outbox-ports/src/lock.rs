//! The cluster-wide lock that lets one instance at a time run a sweep (the seed used
//! Medallion's distributed lock; we add a lease and a fencing token).

use std::time::Duration;

use async_trait::async_trait;

use crate::PortError;

/// A lock with a lease, shared by every instance.
#[cfg_attr(feature = "mocks", mockall::automock)]
#[async_trait]
pub trait DistributedLock: Send + Sync {
    /// Tries to take `key` for a lease of `ttl`, waiting up to `wait` for another
    /// holder to let go. `Ok(None)` when the wait ran out.
    ///
    /// # Errors
    /// [`PortError::Transient`] when the lock service cannot be reached; the caller
    /// must then not do the guarded work.
    async fn acquire(
        &self,
        key: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Option<Box<dyn LockGuard>>, PortError>;

    /// Whether some instance holds `key` under a lease that has not run out (for
    /// operators: "is a sweep running now?"). Takes nothing.
    ///
    /// # Errors
    /// [`PortError::Transient`] when the lock service cannot be reached.
    async fn is_locked(&self, key: &str) -> Result<bool, PortError>;
}

/// A held lock. Adapters renew the lease in the background while the guard lives;
/// when a renewal fails or the lease is found taken, [`LockGuard::is_held`] turns
/// false and stays false.
#[cfg_attr(feature = "mocks", mockall::automock)]
#[async_trait]
pub trait LockGuard: Send + Sync {
    /// A number that grows with every acquisition of the key: writes made under the
    /// lock carry it, so a newer holder's state is never overwritten by an older one.
    fn fencing_token(&self) -> u64;

    /// Whether the lease is still ours, as far as this guard knows.
    fn is_held(&self) -> bool;

    /// Lets the lock go (only if still ours). Idempotent.
    ///
    /// # Errors
    /// [`PortError::Transient`] when the lock service cannot be reached; the lease
    /// then runs out by itself.
    async fn release(&self) -> Result<(), PortError>;
}
