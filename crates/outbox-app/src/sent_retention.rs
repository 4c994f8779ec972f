//! Retention of the outbox: sent messages older than `sent_after` are deleted in
//! short batches, every `interval`, so the table does not grow forever. Only `Sent`
//! rows go (the store's statement is guarded by the status); pending, failed and
//! dead messages stay until they are sent or an operator acts.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::config::ConfigError;
use outbox_ports::OutboxRetention;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use crate::sleep_or_cancel;

/// The Prometheus counter of rows deleted by retention.
pub const RETENTION_DELETED_TOTAL: &str = "outbox_retention_deleted_total";

/// Retention of sent messages (`[retention]`). Dead messages are never deleted by
/// it: they wait for an operator.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetentionConfig {
    /// Run retention at all.
    pub enabled: bool,
    /// Sent messages older than this (since they were sent) are deleted.
    #[serde(with = "outbox_core::duration")]
    pub sent_after: Duration,
    /// Time between rounds.
    #[serde(with = "outbox_core::duration")]
    pub interval: Duration,
    /// Rows per delete statement (short statements hold few locks).
    pub batch_size: u32,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            sent_after: Duration::from_secs(7 * 24 * 3600),
            interval: Duration::from_secs(60),
            batch_size: 5000,
        }
    }
}

impl RetentionConfig {
    /// Checks the settings; `section` names them in the error.
    ///
    /// # Errors
    /// [`ConfigError`] naming a zero duration or batch size.
    pub fn validate(&self, section: &str) -> Result<(), ConfigError> {
        for (key, d) in [("sent_after", self.sent_after), ("interval", self.interval)] {
            if d.is_zero() {
                return Err(ConfigError::new(section, key, "must be greater than zero"));
            }
        }
        if self.batch_size == 0 {
            return Err(ConfigError::new(
                section,
                "batch_size",
                "must be at least 1",
            ));
        }
        Ok(())
    }
}

/// Deletes old sent messages periodically until cancelled.
pub struct SentRetentionTask {
    store: Arc<dyn OutboxRetention>,
    config: RetentionConfig,
}

impl SentRetentionTask {
    /// A task over `store` with `config` (validated by [`RetentionConfig::validate`]).
    pub fn new(store: Arc<dyn OutboxRetention>, config: RetentionConfig) -> Self {
        Self { store, config }
    }

    /// One round: batches of `batch_size` until a batch comes back short or
    /// `cancel` fires; returns how many rows were deleted.
    ///
    /// # Errors
    /// The store's error; rows deleted before it stay deleted (and are counted).
    pub async fn run_once(
        &self,
        cancel: &CancellationToken,
    ) -> Result<u64, outbox_ports::PortError> {
        let batch = self.config.batch_size.max(1);
        let mut total = 0;
        // Cancellation is checked between batches: a batch in hand is one short
        // statement and always finishes.
        while !cancel.is_cancelled() {
            let n = self
                .store
                .delete_sent_batch(self.config.sent_after, batch)
                .await;
            let n = match n {
                Ok(n) => n,
                Err(e) => {
                    metrics::counter!(RETENTION_DELETED_TOTAL).increment(total);
                    return Err(e);
                }
            };
            total += n;
            if n < u64::from(batch) {
                break;
            }
        }
        metrics::counter!(RETENTION_DELETED_TOTAL).increment(total);
        Ok(total)
    }

    /// Runs a round at start and then every `interval` until `cancel` fires. A
    /// failed round is logged and tried again at the next interval.
    pub async fn run(self, cancel: CancellationToken) {
        // Registered at 0, so the counter is on /metrics before anything is deleted.
        metrics::counter!(RETENTION_DELETED_TOTAL).increment(0);
        tracing::info!(
            sent_after = ?self.config.sent_after,
            interval = ?self.config.interval,
            "retention of sent messages running"
        );
        loop {
            match self.run_once(&cancel).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(deleted = n, "retention: old sent messages deleted"),
                Err(e) => {
                    tracing::warn!(error = %e, "retention failed; trying again next interval")
                }
            }
            if !sleep_or_cancel(self.config.interval, &cancel).await {
                return;
            }
        }
    }
}
