//! Messages completed per minute, recorded by every instance as it goes: charts of
//! the last hour cost a few rows to read, however many messages went through. The
//! totals of all exchanges and consumers (the overview's chart, the last hour) and
//! those of each exchange and consumer (their own charts, the last hour, day or
//! week) are kept apart.

use std::time::Duration;

use async_trait::async_trait;

use outbox_core::Timestamp;

use crate::{MinuteCount, PortError};

/// How many names one add may carry at most; a writer with more adds the rest
/// later (it keeps what it could not add).
pub const MAX_NAMES_PER_ADD: usize = 1_000;

/// What every [`ThroughputLog::add_named`] checks first: at most
/// [`MAX_NAMES_PER_ADD`] names.
///
/// # Errors
/// [`PortError::Fatal`] naming the count and the limit.
pub fn check_names_per_add(names: usize) -> Result<(), PortError> {
    if names > MAX_NAMES_PER_ADD {
        return Err(PortError::Fatal {
            operation: "record throughput per name",
            message: format!("{names} names in one add; at most {MAX_NAMES_PER_ADD}"),
            source: None,
        });
    }
    Ok(())
}

/// The span a chart of one exchange or consumer covers, and how finely.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum ChartWindow {
    /// The last hour, a bucket a minute.
    #[default]
    Hour,
    /// The last 24 hours, a bucket every 15 minutes.
    Day,
    /// The last 7 days, a bucket an hour.
    Week,
}

impl ChartWindow {
    /// Every window, shortest first.
    pub const ALL: [Self; 3] = [Self::Hour, Self::Day, Self::Week];

    /// Its name in URLs and answers: `1h`, `24h`, `7d`.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Hour => "1h",
            Self::Day => "24h",
            Self::Week => "7d",
        }
    }

    /// The window named `name` (see [`Self::as_str`]).
    #[must_use]
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|w| w.as_str() == name)
    }

    /// How long one bucket is, in seconds.
    #[must_use]
    pub const fn bucket_seconds(self) -> i64 {
        match self {
            Self::Hour => 60,
            Self::Day => 15 * 60,
            Self::Week => 3600,
        }
    }

    /// How many buckets the window has (the last one holds now).
    #[must_use]
    pub const fn buckets(self) -> usize {
        match self {
            Self::Hour => 60,
            Self::Day => 96,
            Self::Week => 168,
        }
    }

    /// The starts of the window's buckets when it is `now`, oldest first: aligned to
    /// the bucket's length since the Unix epoch, the last one holding `now`.
    #[must_use]
    pub fn bucket_starts(self, now: Timestamp) -> Vec<Timestamp> {
        let width = self.bucket_seconds();
        let last = now.unix_timestamp().div_euclid(width) * width;
        let n = self.buckets() as i64;
        (0..n)
            .filter_map(|i| Timestamp::from_unix_timestamp(last - (n - 1 - i) * width).ok())
            .collect()
    }
}

/// One bucket of a chart: what was counted from `start` for the window's bucket
/// length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketCount {
    /// The bucket's start.
    pub start: Timestamp,
    /// What was counted in it.
    pub count: u64,
}

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

    /// Adds each `(name, count)` to the current minute, hour and so on of `kind`
    /// for that name (an exchange for the publish kinds, a consumer for the consume
    /// kinds). A name given twice adds both counts; a zero count adds nothing. These
    /// are kept apart from [`Self::add`]'s totals, and for a week.
    ///
    /// # Errors
    /// [`PortError::Transient`] when the store cannot be reached (the caller keeps
    /// the counts and adds them later); [`PortError::Fatal`] when more than
    /// [`MAX_NAMES_PER_ADD`] names are given.
    async fn add_named(
        &self,
        kind: ThroughputKind,
        counts: &[(String, u64)],
    ) -> Result<(), PortError>;

    /// The totals of `kind` for `name` over `window`: exactly
    /// [`ChartWindow::buckets`] buckets, oldest first, the last holding the store's
    /// now, empty ones counted 0.
    ///
    /// # Errors
    /// [`PortError::Transient`] when the store cannot be reached.
    async fn named_series(
        &self,
        kind: ThroughputKind,
        name: &str,
        window: ChartWindow,
    ) -> Result<Vec<BucketCount>, PortError>;

    /// Every name with something of `kind` counted over `window`, with its total,
    /// by name.
    ///
    /// # Errors
    /// [`PortError::Transient`] when the store cannot be reached.
    async fn named_totals(
        &self,
        kind: ThroughputKind,
        window: ChartWindow,
    ) -> Result<Vec<(String, u64)>, PortError>;
}
