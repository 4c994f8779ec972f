//! Messages completed per minute, recorded by every instance as it goes: charts of
//! the last hour cost a few rows to read, however many messages went through.

use std::time::Duration;

use async_trait::async_trait;

use crate::{MinuteCount, PortError};

/// What is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ThroughputKind {
    /// Messages the relays marked sent.
    Published,
    /// Deliveries the consumers marked consumed.
    Consumed,
    /// Publish attempts that failed (retried later, or dead).
    PublishFailed,
    /// Handler attempts that failed (retried later, or dead).
    ConsumeFailed,
}

impl ThroughputKind {
    /// The name stored for it.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Published => "published",
            Self::Consumed => "consumed",
            Self::PublishFailed => "publish_failed",
            Self::ConsumeFailed => "consume_failed",
        }
    }
}

/// Per-minute totals shared by every instance.
#[cfg_attr(feature = "mocks", mockall::automock)]
#[async_trait]
pub trait ThroughputLog: Send + Sync {
    /// Adds `count` to the current minute of `kind` (the store's clock decides the
    /// minute, so instances with skewed clocks add to the same one).
    ///
    /// # Errors
    /// [`PortError::Transient`] when the store cannot be reached (the caller keeps
    /// the count and adds it later).
    async fn add(&self, kind: ThroughputKind, count: u64) -> Result<(), PortError>;

    /// The totals of `kind` per minute over the last `window`, oldest first
    /// (minutes with none left out).
    ///
    /// # Errors
    /// [`PortError::Transient`] when the store cannot be reached.
    async fn per_minute(
        &self,
        kind: ThroughputKind,
        window: Duration,
    ) -> Result<Vec<MinuteCount>, PortError>;
}
