//! One retention loop for both sides: the relay's (sent messages) and each
//! consumer's (consumed deliveries). A round deletes in short batches until one
//! comes back short or a stop is asked for; after it, the table is vacuumed when
//! that falls to the caller ([`VacuumMode::Auto`]); rounds repeat every interval.
//! What is deleted, and how old it must be, is the [`RetentionTarget`]'s: the
//! loop never decides which rows go.

use std::time::Duration;

use async_trait::async_trait;
use outbox_ports::{PortError, SpaceReclaim};
use tokio_util::sync::CancellationToken;

use crate::sleep_or_cancel;
use crate::vacuum::{VacuumLog, VacuumMode};

/// What a retention loop deletes from.
#[async_trait]
pub trait RetentionTarget: Send + Sync {
    /// What the logs call the rows (`sent messages`, `consumer billing's consumed
    /// deliveries`).
    fn rows(&self) -> &str;

    /// The table, for the vacuum's logs.
    fn table(&self) -> &'static str;

    /// Deletes up to `limit` rows old enough to go; returns how many. One short
    /// statement.
    ///
    /// # Errors
    /// The store's; what was deleted before stays deleted.
    async fn delete_batch(&self, limit: u32) -> Result<u64, PortError>;

    /// Vacuums the table if that falls to the caller and enough of it is dead.
    ///
    /// # Errors
    /// The store's.
    async fn reclaim_space(&self) -> Result<SpaceReclaim, PortError>;
}

/// How a retention loop runs: rows per statement, time between rounds, and
/// whether rounds vacuum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetentionRounds {
    /// Rows per delete statement (at least 1).
    pub batch_size: u32,
    /// Time between rounds.
    pub interval: Duration,
    /// Whether a round vacuums the table when autovacuum is off for it.
    pub vacuum: VacuumMode,
}

/// One round: batches of `batch_size` until one comes back short or `cancel`
/// fires; `deleted` is told each batch's count as it lands. Returns the total.
///
/// # Errors
/// The store's error; rows deleted before it stay deleted (and were told).
pub async fn round(
    target: &dyn RetentionTarget,
    batch_size: u32,
    cancel: &CancellationToken,
    deleted: &(dyn Fn(u64) + Send + Sync),
) -> Result<u64, PortError> {
    let batch = batch_size.max(1);
    let mut total = 0;
    // Cancellation is checked between batches: a batch in hand is one short
    // statement and always finishes.
    while !cancel.is_cancelled() {
        let n = target.delete_batch(batch).await?;
        deleted(n);
        total += n;
        if n < u64::from(batch) {
            break;
        }
    }
    Ok(total)
}

/// Runs a round at once and then every interval until `cancel` fires. A failed
/// round is logged and tried again at the next interval. After each round the
/// table is vacuumed if `rounds.vacuum` says so, raced with `cancel`: a vacuum may
/// take long, and a stop must not wait for it (dropped, its connection closes).
pub async fn run(
    target: &dyn RetentionTarget,
    rounds: RetentionRounds,
    cancel: &CancellationToken,
    deleted: &(dyn Fn(u64) + Send + Sync),
) {
    let mut vacuum = VacuumLog::default();
    loop {
        match round(target, rounds.batch_size, cancel, deleted).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                rows = target.rows(),
                deleted = n,
                "retention deleted old rows"
            ),
            Err(e) => tracing::warn!(
                rows = target.rows(),
                error = %e,
                "retention failed; trying again next interval"
            ),
        }
        if rounds.vacuum == VacuumMode::Auto && !cancel.is_cancelled() {
            tokio::select! {
                outcome = target.reclaim_space() => vacuum.note(target.table(), outcome),
                () = cancel.cancelled() => return,
            }
        }
        if !sleep_or_cancel(rounds.interval, cancel).await {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    /// `left` rows to delete; each batch takes what it may.
    struct Rows {
        left: AtomicU64,
        batches: Mutex<Vec<u32>>,
    }

    #[async_trait]
    impl RetentionTarget for Rows {
        fn rows(&self) -> &str {
            "test rows"
        }
        fn table(&self) -> &'static str {
            "test"
        }
        async fn delete_batch(&self, limit: u32) -> Result<u64, PortError> {
            self.batches
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(limit);
            let left = self.left.load(Ordering::SeqCst);
            let n = left.min(u64::from(limit));
            self.left.store(left - n, Ordering::SeqCst);
            Ok(n)
        }
        async fn reclaim_space(&self) -> Result<SpaceReclaim, PortError> {
            Ok(SpaceReclaim::ByTheStore)
        }
    }

    fn rows(n: u64) -> Rows {
        Rows {
            left: AtomicU64::new(n),
            batches: Mutex::default(),
        }
    }

    #[tokio::test]
    async fn a_round_deletes_in_batches_until_one_comes_back_short() {
        let target = rows(5);
        let told = AtomicU64::new(0);
        let count = |n| {
            told.fetch_add(n, Ordering::SeqCst);
        };
        let total = round(&target, 2, &CancellationToken::new(), &count)
            .await
            .expect("round");
        assert_eq!(total, 5);
        assert_eq!(told.load(Ordering::SeqCst), 5);
        assert_eq!(
            target.batches.lock().map(|b| b.len()).unwrap_or_default(),
            3,
            "2, 2, then 1 (short)"
        );
        // Exactly a multiple: one more batch finds nothing and ends the round.
        let target = rows(4);
        round(&target, 2, &CancellationToken::new(), &|_| {})
            .await
            .expect("round");
        assert_eq!(
            target.batches.lock().map(|b| b.len()).unwrap_or_default(),
            3
        );
    }

    #[tokio::test]
    async fn a_stopped_round_takes_no_batch_and_a_zero_batch_size_is_one() {
        let target = rows(5);
        let cancel = CancellationToken::new();
        cancel.cancel();
        assert_eq!(round(&target, 2, &cancel, &|_| {}).await.expect("round"), 0);
        let target = rows(1);
        round(&target, 0, &CancellationToken::new(), &|_| {})
            .await
            .expect("round");
        assert_eq!(
            target.batches.lock().map(|b| b.clone()).unwrap_or_default(),
            [1, 1]
        );
    }
}
