//! Retention of a consumer's inbox: consumed rows are deleted once they are old
//! enough that no redelivery of their message can still come.
//!
//! An inbox row is what makes a redelivery harmless: while it exists, a second
//! delivery of its message is recognised and skipped. Once it is deleted, a copy of
//! the message that still arrives (the relay's publish retries, a broker
//! redelivery, a message requeued by an operator) runs its handler again. So the
//! age after which rows go must outlast the publish side's retry horizon; values
//! under [`MIN_CONSUMED_AFTER`] are refused. Failed and dead rows, and dead letters,
//! are never deleted: they stay until an operator acts.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use outbox_core::config::ConfigError;
use outbox_ports::{InboxRetention, PortError, SpaceReclaim};
use outbox_runtime::retention::{RetentionRounds, RetentionTarget};
use tokio_util::sync::CancellationToken;

use crate::counters::ConsumerCounters;

use outbox_runtime::sleep_or_cancel;
use outbox_runtime::vacuum::VacuumMode;

/// The shortest `consumed_after` accepted: one hour.
pub const MIN_CONSUMED_AFTER: Duration = Duration::from_secs(3600);

/// Why a `consumed_after` under [`MIN_CONSUMED_AFTER`] is refused.
const TOO_SHORT: &str = "is under the minimum of one hour: an inbox row is what makes a \
     redelivery harmless, so it must outlast the publish side's retry horizon; a message \
     that arrives again after its row is gone runs its handler again";

fn invalid(name: &str, reason: impl std::fmt::Display) -> ConfigError {
    ConfigError::new("consumer.retention", name, reason)
}

/// Retention of consumed inbox rows. Defaults: enabled, rows consumed more than 7
/// days ago, checked every minute, deleted 5,000 per statement, the inbox vacuumed
/// after a round when autovacuum is off for it ([`VacuumMode::Auto`]). Only valid
/// values can be built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConsumerRetention {
    enabled: bool,
    consumed_after: Duration,
    interval: Duration,
    batch_size: u32,
    vacuum: VacuumMode,
}

impl Default for ConsumerRetention {
    fn default() -> Self {
        Self {
            enabled: true,
            consumed_after: Duration::from_secs(7 * 24 * 3600),
            interval: Duration::from_secs(60),
            batch_size: 5_000,
            vacuum: VacuumMode::Auto,
        }
    }
}

impl ConsumerRetention {
    /// No retention: the inbox grows until something else deletes from it, and
    /// is not vacuumed after rounds either (see [`Self::with_vacuum`]).
    #[must_use]
    pub fn disabled() -> Self {
        Self {
            enabled: false,
            ..Self::default()
        }
    }

    /// Deletes rows consumed more than `age` ago.
    ///
    /// # Errors
    /// `age` under [`MIN_CONSUMED_AFTER`], with the reason.
    pub fn with_consumed_after(self, age: Duration) -> Result<Self, ConfigError> {
        if age < MIN_CONSUMED_AFTER {
            return Err(invalid("consumed_after", format!("{age:?} {TOO_SHORT}")));
        }
        Ok(Self {
            consumed_after: age,
            ..self
        })
    }

    /// Runs every `interval`.
    ///
    /// # Errors
    /// A zero interval.
    pub fn with_interval(self, interval: Duration) -> Result<Self, ConfigError> {
        if interval.is_zero() {
            return Err(invalid("interval", "must be longer than zero"));
        }
        Ok(Self { interval, ..self })
    }

    /// Deletes at most `batch_size` rows per statement.
    ///
    /// # Errors
    /// Zero.
    pub fn with_batch_size(self, batch_size: u32) -> Result<Self, ConfigError> {
        if batch_size == 0 {
            return Err(invalid("batch_size", "must be at least 1"));
        }
        Ok(Self { batch_size, ..self })
    }

    /// Whether rounds vacuum the inbox table when autovacuum is off for it.
    #[must_use]
    pub fn with_vacuum(self, vacuum: VacuumMode) -> Self {
        Self { vacuum, ..self }
    }

    /// See [`Self::with_vacuum`].
    #[must_use]
    pub const fn vacuum(&self) -> VacuumMode {
        self.vacuum
    }

    /// Whether retention runs.
    #[must_use]
    pub const fn enabled(&self) -> bool {
        self.enabled
    }

    /// Age after which consumed rows are deleted.
    #[must_use]
    pub const fn consumed_after(&self) -> Duration {
        self.consumed_after
    }

    /// Time between two runs.
    #[must_use]
    pub const fn interval(&self) -> Duration {
        self.interval
    }

    /// Rows deleted per statement.
    #[must_use]
    pub const fn batch_size(&self) -> u32 {
        self.batch_size
    }
}

/// Runs retention for `consumer` at start and then every interval until `cancel`
/// fires ([`outbox_runtime::retention::run`], the relay's loop too). One loop per
/// worker, so at most one delete loop at a time in a process; it stops between
/// batches when cancelled. Errors are logged and the next interval tries again.
pub(crate) async fn run_retention(
    inbox: Arc<dyn InboxRetention>,
    consumer: String,
    retention: ConsumerRetention,
    counters: Arc<ConsumerCounters>,
    cancel: CancellationToken,
) {
    if !retention.enabled() {
        return;
    }
    let target = ConsumedDeliveries {
        rows: format!("consumer {consumer}'s consumed deliveries"),
        inbox: &*inbox,
        consumer: &consumer,
        age: retention.consumed_after(),
    };
    let rounds = RetentionRounds {
        batch_size: retention.batch_size(),
        interval: retention.interval(),
        // The inbox is shared by the schema's consumers: each one's loop checks it
        // (a check is one small read; `SKIP_LOCKED` keeps two vacuums from queueing).
        vacuum: retention.vacuum(),
    };
    let count = |n| {
        counters.retention_deleted.fetch_add(n, Ordering::Relaxed);
    };
    // Its log lines carry the consumer, as a field, from the span.
    let span = tracing::info_span!("inbox_retention", consumer = %consumer);
    tracing::Instrument::instrument(
        outbox_runtime::retention::run(&target, rounds, &cancel, &count),
        span,
    )
    .await;
}

/// One consumer's consumed deliveries older than `age`, as a retention loop
/// deletes them.
struct ConsumedDeliveries<'a> {
    rows: String,
    inbox: &'a dyn InboxRetention,
    consumer: &'a str,
    age: Duration,
}

#[async_trait::async_trait]
impl RetentionTarget for ConsumedDeliveries<'_> {
    fn rows(&self) -> &str {
        &self.rows
    }

    fn table(&self) -> &'static str {
        "outbox_inbox"
    }

    async fn delete_batch(&self, limit: u32) -> Result<u64, PortError> {
        self.inbox
            .delete_consumed_batch(self.consumer, self.age, limit)
            .await
    }

    async fn reclaim_space(&self) -> Result<SpaceReclaim, PortError> {
        self.inbox.reclaim_space().await
    }
}

/// One run of a retention loop.
pub(crate) type RetentionLoop = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// Runs the retention loop `first` in a task of its own until it returns (when
/// `cancel` fires). A run that panics is logged at error level and replaced, after
/// `pause`, by a new one from `make`. Retention is housekeeping beside a consumer
/// that works without it, and the worker's `run` has no error to return: so the
/// consumer goes on, the panic is in the error log, and the loop starts again, at
/// most once per `pause` (the retention interval: the same wait as after a failed
/// delete), never in a hot loop.
pub(crate) async fn supervise(
    consumer: String,
    pause: Duration,
    first: RetentionLoop,
    make: impl Fn() -> Option<RetentionLoop>,
    cancel: CancellationToken,
) {
    let mut run = first;
    loop {
        match tokio::spawn(run).await {
            Ok(()) => return,
            Err(e) if e.is_panic() => {
                let panic = outbox_runtime::supervision::panic_text(e.into_panic().as_ref());
                tracing::error!(%consumer, %panic, ?pause, "inbox retention panicked; starting it again after a pause");
            }
            Err(e) => {
                tracing::error!(%consumer, error = %e, "inbox retention task ended abnormally");
                return;
            }
        }
        if !sleep_or_cancel(pause, &cancel).await {
            return;
        }
        match make() {
            Some(next) => run = next,
            None => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_seven_days_every_minute_in_batches_of_5000() {
        let r = ConsumerRetention::default();
        assert!(r.enabled());
        assert_eq!(r.consumed_after(), Duration::from_secs(604_800));
        assert_eq!(r.interval(), Duration::from_secs(60));
        assert_eq!(r.batch_size(), 5_000);
        assert!(!ConsumerRetention::disabled().enabled());
    }

    #[test]
    fn consumed_after_under_an_hour_is_refused_with_the_reason() {
        let err = ConsumerRetention::default()
            .with_consumed_after(Duration::from_secs(3599))
            .expect_err("refused");
        let text = err.to_string();
        assert_eq!(err.field, "consumer.retention.consumed_after");
        assert!(text.contains("one hour"), "{text}");
        assert!(text.contains("redelivery harmless"), "{text}");
        assert!(text.contains("retry horizon"), "{text}");
        let ok = ConsumerRetention::default()
            .with_consumed_after(MIN_CONSUMED_AFTER)
            .expect("one hour is enough");
        assert_eq!(ok.consumed_after(), MIN_CONSUMED_AFTER);
    }

    #[test]
    fn zero_interval_and_zero_batch_are_refused() {
        let interval = ConsumerRetention::default()
            .with_interval(Duration::ZERO)
            .expect_err("zero interval");
        assert_eq!(interval.field, "consumer.retention.interval");
        let batch = ConsumerRetention::default()
            .with_batch_size(0)
            .expect_err("zero batch");
        assert_eq!(batch.field, "consumer.retention.batch_size");
    }
}
