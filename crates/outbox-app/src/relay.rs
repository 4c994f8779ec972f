//! The relay: moves committed messages from the outbox to the broker.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::{BatchCounts, Decision, MessageId, RetryPolicy};
use outbox_ports::{ClaimedMessage, Lease, OutboxStore, PortError, PublishFailure, Publisher};
use tokio_util::sync::CancellationToken;

use crate::{LeaseFactory, Random, SweepTask, sleep_or_cancel};

/// What publishing one claimed batch did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PublishCounts {
    /// Rows claimed.
    pub claimed: u64,
    /// Confirmed and marked sent.
    pub sent: u64,
    /// Failed and scheduled for a retry.
    pub failed: u64,
    /// Failed for the last time: dead.
    pub dead: u64,
    /// Outcomes not recorded because another claimer holds the row now.
    pub fenced: u64,
}

/// Totals of a relay, for metrics and the demo. Shared by the dispatcher and the
/// publish-retry sweep.
#[derive(Debug, Default)]
pub struct RelayCounters {
    /// Messages marked sent.
    pub published: AtomicU64,
    /// Publish attempts that failed.
    pub publish_failures: AtomicU64,
    /// Messages that went dead.
    pub dead: AtomicU64,
}

impl RelayCounters {
    fn add(&self, c: &PublishCounts) {
        self.published.fetch_add(c.sent, Ordering::Relaxed);
        self.publish_failures
            .fetch_add(c.failed + c.dead, Ordering::Relaxed);
        self.dead.fetch_add(c.dead, Ordering::Relaxed);
    }
}

/// Publishes claimed messages and records every outcome under `lease`: confirmed ones
/// sent in one mark, the rest failed with the retry policy's decision.
///
/// # Errors
/// A [`PortError`] from marking. The rows then stay claimed until the lease runs out
/// and are published again (a duplicate the inbox absorbs), never lost.
pub async fn publish_claimed(
    store: &dyn OutboxStore,
    publisher: &dyn Publisher,
    lease: &Lease,
    claimed: Vec<ClaimedMessage>,
    policy: &RetryPolicy,
    random: Random,
) -> Result<PublishCounts, PortError> {
    let mut counts = PublishCounts {
        claimed: claimed.len() as u64,
        ..PublishCounts::default()
    };
    if claimed.is_empty() {
        return Ok(counts);
    }
    let (messages, attempts): (Vec<_>, Vec<_>) =
        claimed.into_iter().map(|c| (c.message, c.attempts)).unzip();
    let outcomes = publisher.publish(&messages).await;
    let mut sent: Vec<MessageId> = Vec::with_capacity(messages.len());
    let mut failures = Vec::new();
    for (i, message) in messages.iter().enumerate() {
        match outcomes.get(i) {
            Some(o) if o.is_confirmed() => sent.push(message.id),
            other => {
                let error = other.map_or_else(
                    || "publisher returned no outcome".to_owned(),
                    ToString::to_string,
                );
                let decision = policy.decide(attempts[i].saturating_add(1), random());
                if decision == Decision::Dead {
                    tracing::warn!(message_id = %message.id, %error, "message is dead after its last publish attempt");
                    counts.dead += 1;
                } else {
                    tracing::debug!(message_id = %message.id, %error, "publish failed; retry scheduled");
                    counts.failed += 1;
                }
                failures.push(PublishFailure {
                    id: message.id,
                    error,
                    decision,
                });
            }
        }
    }
    let marked_sent = store.mark_sent(lease, &sent).await?;
    counts.sent = marked_sent;
    let marked_failed = if failures.is_empty() {
        0
    } else {
        store.mark_publish_failed(lease, &failures).await?
    };
    counts.fenced = (sent.len() as u64 - marked_sent) + (failures.len() as u64 - marked_failed);
    if counts.fenced > 0 {
        tracing::warn!(
            fenced = counts.fenced,
            holder = %lease.holder,
            "outcomes not recorded: the lease ran out and another claimer holds these rows"
        );
    }
    Ok(counts)
}

/// Settings of the [`Dispatcher`].
#[derive(Debug, Clone)]
pub struct DispatcherConfig {
    /// Messages claimed and published per batch.
    pub batch_size: u32,
    /// How long a claim lasts before other relays may take the rows.
    pub lease_ttl: Duration,
    /// Pause when nothing is pending, before looking again.
    pub idle_poll: Duration,
    /// Pause after a store error.
    pub error_backoff: Duration,
    /// When failed publishes are retried, and when they are dead.
    pub retry: RetryPolicy,
}

impl Default for DispatcherConfig {
    fn default() -> Self {
        Self {
            batch_size: 100,
            lease_ttl: Duration::from_secs(30),
            idle_poll: Duration::from_millis(100),
            error_backoff: Duration::from_secs(1),
            retry: RetryPolicy::default(),
        }
    }
}

/// Which rows a relay batch claims.
#[derive(Debug, Clone, Copy)]
enum Claim {
    /// New messages (the dispatcher).
    Pending,
    /// Failed ones whose next attempt is due (the retry sweep).
    DueRetries,
}

/// What the dispatcher and the publish-retry task share: claim, publish, mark.
struct Relay {
    store: Arc<dyn OutboxStore>,
    publisher: Arc<dyn Publisher>,
    leases: LeaseFactory,
    policy: RetryPolicy,
    random: Random,
    counters: Arc<RelayCounters>,
}

impl Relay {
    fn new(
        store: Arc<dyn OutboxStore>,
        publisher: Arc<dyn Publisher>,
        policy: RetryPolicy,
        instance: &str,
        lease_ttl: Duration,
    ) -> Self {
        Self {
            store,
            publisher,
            leases: LeaseFactory::new(instance, lease_ttl),
            policy,
            random: crate::default_random,
            counters: Arc::default(),
        }
    }

    async fn batch(&self, claim: Claim, limit: u32) -> Result<PublishCounts, PortError> {
        let lease = self.leases.next();
        let claimed = match claim {
            Claim::Pending => self.store.claim_pending(&lease, limit).await?,
            Claim::DueRetries => self.store.claim_due_retries(&lease, limit).await?,
        };
        let counts = publish_claimed(
            &*self.store,
            &*self.publisher,
            &lease,
            claimed,
            &self.policy,
            self.random,
        )
        .await?;
        self.counters.add(&counts);
        Ok(counts)
    }
}

/// The relay's fast path for new messages: claim pending, publish, mark; again.
pub struct Dispatcher {
    relay: Relay,
    config: DispatcherConfig,
}

impl Dispatcher {
    /// A dispatcher for `instance` (its lease holder prefix).
    pub fn new(
        store: Arc<dyn OutboxStore>,
        publisher: Arc<dyn Publisher>,
        config: DispatcherConfig,
        instance: &str,
    ) -> Self {
        Self {
            relay: Relay::new(store, publisher, config.retry, instance, config.lease_ttl),
            config,
        }
    }

    /// Shares `counters` (e.g. with the publish-retry sweep and metrics).
    #[must_use]
    pub fn with_counters(mut self, counters: Arc<RelayCounters>) -> Self {
        self.relay.counters = counters;
        self
    }

    /// One batch: claim, publish, mark.
    ///
    /// # Errors
    /// A [`PortError`] of the store; nothing is lost (see [`publish_claimed`]).
    pub async fn run_once(&self) -> Result<PublishCounts, PortError> {
        self.relay
            .batch(Claim::Pending, self.config.batch_size)
            .await
    }

    /// Runs until `cancel` fires. A batch in flight is finished (its confirms awaited
    /// and marked) before returning; nothing is left half done.
    pub async fn run(self, cancel: CancellationToken) {
        tracing::info!(batch_size = self.config.batch_size, "dispatcher started");
        while !cancel.is_cancelled() {
            let pause = match self.run_once().await {
                Ok(c) if c.claimed == 0 => self.config.idle_poll,
                Ok(_) => Duration::ZERO,
                Err(e) => {
                    tracing::warn!(error = %e, "dispatch failed; retrying");
                    self.config.error_backoff
                }
            };
            if !pause.is_zero() && !sleep_or_cancel(pause, &cancel).await {
                break;
            }
        }
        tracing::info!("dispatcher stopped");
    }
}

/// The relay's retry sweep work: publish `PublishFailed` messages whose next attempt
/// is due.
pub struct PublishRetryTask {
    relay: Relay,
}

impl PublishRetryTask {
    /// A task claiming under leases of `lease_ttl` for `instance`.
    pub fn new(
        store: Arc<dyn OutboxStore>,
        publisher: Arc<dyn Publisher>,
        policy: RetryPolicy,
        instance: &str,
        lease_ttl: Duration,
    ) -> Self {
        Self {
            relay: Relay::new(store, publisher, policy, instance, lease_ttl),
        }
    }

    /// Shares `counters` with the dispatcher.
    #[must_use]
    pub fn with_counters(mut self, counters: Arc<RelayCounters>) -> Self {
        self.relay.counters = counters;
        self
    }
}

#[async_trait]
impl SweepTask for PublishRetryTask {
    fn name(&self) -> &'static str {
        "publish-retry"
    }

    async fn before_sweep(&self) -> Result<(), PortError> {
        let recovered = self.relay.store.recover_expired_leases().await?;
        if recovered > 0 {
            tracing::info!(recovered, "cleared expired leases of vanished relays");
        }
        Ok(())
    }

    async fn run_batch(&self, limit: u32) -> Result<BatchCounts, PortError> {
        let c = self.relay.batch(Claim::DueRetries, limit).await?;
        Ok(BatchCounts {
            claimed: c.claimed,
            publish_retried: c.sent,
            publish_failed: c.failed + c.dead,
            ..BatchCounts::default()
        })
    }
}
