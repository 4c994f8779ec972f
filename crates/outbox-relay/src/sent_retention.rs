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

use outbox_runtime::retention::{self, RetentionRounds, RetentionTarget};
pub use outbox_runtime::vacuum::VacuumMode;

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
    /// Whether rounds also vacuum the table when the server's autovacuum is off
    /// for it (see [`VacuumMode`]; with `enabled = false` there are no rounds).
    pub vacuum: VacuumMode,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            sent_after: Duration::from_secs(7 * 24 * 3600),
            interval: Duration::from_secs(60),
            batch_size: 5000,
            vacuum: VacuumMode::Auto,
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
        retention::round(
            &self.target(),
            self.config.batch_size,
            cancel,
            &count_deleted,
        )
        .await
    }

    /// Runs a round at start and then every `interval` until `cancel` fires. A
    /// failed round is logged and tried again at the next interval. Each round
    /// then vacuums the table if that falls to it (see [`VacuumMode`]).
    pub async fn run(self, cancel: CancellationToken) {
        // Registered at 0, so the counter is on /metrics before anything is deleted.
        metrics::counter!(RETENTION_DELETED_TOTAL).increment(0);
        tracing::info!(
            sent_after = ?self.config.sent_after,
            interval = ?self.config.interval,
            "retention of sent messages running"
        );
        let rounds = RetentionRounds {
            batch_size: self.config.batch_size,
            interval: self.config.interval,
            vacuum: self.config.vacuum,
        };
        retention::run(&self.target(), rounds, &cancel, &count_deleted).await;
    }

    fn target(&self) -> SentMessages<'_> {
        SentMessages {
            store: &*self.store,
            age: self.config.sent_after,
        }
    }
}

fn count_deleted(n: u64) {
    metrics::counter!(RETENTION_DELETED_TOTAL).increment(n);
}

/// The outbox's sent messages older than `age`, as a retention loop deletes them.
struct SentMessages<'a> {
    store: &'a dyn OutboxRetention,
    age: Duration,
}

#[async_trait::async_trait]
impl RetentionTarget for SentMessages<'_> {
    fn rows(&self) -> &str {
        "sent messages"
    }

    fn table(&self) -> &'static str {
        "outbox_messages"
    }

    async fn delete_batch(&self, limit: u32) -> Result<u64, outbox_ports::PortError> {
        self.store.delete_sent_batch(self.age, limit).await
    }

    async fn reclaim_space(&self) -> Result<outbox_ports::SpaceReclaim, outbox_ports::PortError> {
        self.store.reclaim_space().await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use async_trait::async_trait;
    use outbox_ports::{PortError, SpaceReclaim};

    use super::*;

    /// Deletes nothing; counts the reclaims asked of it.
    #[derive(Default)]
    struct Counting {
        reclaims: AtomicU32,
    }

    #[async_trait]
    impl OutboxRetention for Counting {
        async fn delete_sent_batch(&self, _: Duration, _: u32) -> Result<u64, PortError> {
            Ok(0)
        }
        async fn reclaim_space(&self) -> Result<SpaceReclaim, PortError> {
            self.reclaims.fetch_add(1, Ordering::SeqCst);
            Ok(SpaceReclaim::Reclaimed { dead: 1, left: 0 })
        }
    }

    async fn reclaims_in_three_rounds(vacuum: VacuumMode) -> u32 {
        let store = Arc::new(Counting::default());
        let config = RetentionConfig {
            interval: Duration::from_millis(20),
            vacuum,
            ..RetentionConfig::default()
        };
        let cancel = CancellationToken::new();
        let task = tokio::spawn(SentRetentionTask::new(store.clone(), config).run(cancel.clone()));
        while store.reclaims.load(Ordering::SeqCst) < 3 && !task.is_finished() {
            tokio::time::sleep(Duration::from_millis(10)).await;
            if vacuum == VacuumMode::Never {
                // Three rounds' time, then stop: none may have asked.
                tokio::time::sleep(Duration::from_millis(80)).await;
                break;
            }
        }
        cancel.cancel();
        task.await.expect("task");
        store.reclaims.load(Ordering::SeqCst)
    }

    #[tokio::test]
    async fn every_round_asks_the_store_to_reclaim_unless_never() {
        assert!(reclaims_in_three_rounds(VacuumMode::Auto).await >= 3);
        assert_eq!(reclaims_in_three_rounds(VacuumMode::Never).await, 0);
    }
}
