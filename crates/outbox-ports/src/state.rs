//! The shared sweep state: the last sweep's report, read by every instance to space
//! sweeps across the cluster (the seed kept it in FusionCache).

use std::time::Duration;

use async_trait::async_trait;
use outbox_core::SweepReport;

use crate::PortError;

/// Whether a fenced write was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateWrite {
    /// Stored.
    Written,
    /// Refused: the stored report came from a holder with a newer fencing token.
    Fenced,
}

/// Stores the last [`SweepReport`] under a key, with a time to live.
#[cfg_attr(feature = "mocks", mockall::automock)]
#[async_trait]
pub trait SweepStateStore: Send + Sync {
    /// The stored report, `None` when there is none (or it expired, or it cannot be
    /// decoded: adapters log a warning and report it as absent).
    ///
    /// # Errors
    /// [`PortError::Transient`] when the store cannot be reached.
    async fn get(&self, key: &str) -> Result<Option<SweepReport>, PortError>;

    /// Stores `report` for `ttl`, unless the stored one was written under a newer
    /// fencing token than `fencing_token`.
    ///
    /// # Errors
    /// [`PortError::Transient`] when the store cannot be reached.
    async fn set(
        &self,
        key: &str,
        report: &SweepReport,
        ttl: Duration,
        fencing_token: u64,
    ) -> Result<StateWrite, PortError>;
}
