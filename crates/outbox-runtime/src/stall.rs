//! The relay's progress watchdog: readiness fails while work is due and no claim or
//! mark completes (a relay waiting on a lock another session holds, a store that
//! answers nothing), and clears by itself when work moves again.

use std::time::Duration;

/// `[health] stall_after` by default: far above a healthy claim or mark, which take
/// milliseconds, and above the default `lock_timeout` (10 s), so one lock waited on
/// and given up does not turn readiness red on its own.
pub const DEFAULT_STALL_AFTER: Duration = Duration::from_secs(60);

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use outbox_core::stall::{Progress, StallWatch};
use outbox_ports::OutboxRelayPath;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::sleep_or_cancel;

/// What the dispatcher reports as it goes (every claim and mark that completes,
/// the batches it holds), and what the watchdog concluded from it: read by
/// `/readyz` and `/metrics`.
#[derive(Debug)]
pub struct RelayProgress {
    origin: Instant,
    /// Milliseconds since `origin` of the last completed claim or mark, plus one
    /// (0: none yet).
    last: AtomicU64,
    /// Batches claimed and not yet marked or given back.
    in_hand: AtomicUsize,
    /// The last claim failed (a claim that cannot run is work not looked at).
    claim_failing: AtomicBool,
    stalled: Mutex<Option<String>>,
    /// A consumer's name, for a consumer worker's progress (deliveries recorded in
    /// its inbox); `None` for a relay's (claims and marks).
    consumer: Option<String>,
}

impl Default for RelayProgress {
    fn default() -> Self {
        Self {
            origin: Instant::now(),
            last: AtomicU64::new(0),
            in_hand: AtomicUsize::new(0),
            claim_failing: AtomicBool::new(false),
            stalled: Mutex::new(None),
            consumer: None,
        }
    }
}

/// One delivery in a consumer worker's hands, until dropped.
#[derive(Debug)]
pub struct Held<'a>(&'a RelayProgress);

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0.let_go();
    }
}

impl RelayProgress {
    /// The progress of consumer `name`'s worker: a delivery counts as moving when
    /// its inbox row is recorded (handled, failed and stored, held, a duplicate),
    /// and deliveries in hand or an inbox that refuses them are work due.
    #[must_use]
    pub fn for_consumer(name: &str) -> Self {
        Self {
            consumer: Some(name.to_owned()),
            ..Self::default()
        }
    }

    /// A delivery taken in hand (a consumer's), until the guard is dropped.
    pub fn hold(&self) -> Held<'_> {
        self.in_hand.fetch_add(1, Ordering::Relaxed);
        Held(self)
    }

    /// A consumer's try at recording a delivery in its inbox: recorded, or not
    /// (the inbox refused or could not be reached).
    pub fn recorded(&self, ok: bool) {
        self.claim_failing.store(!ok, Ordering::Relaxed);
        if ok {
            self.completed();
        }
    }

    fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    /// A claim or a mark completed.
    pub fn completed(&self) {
        let ms = u64::try_from(self.now().as_millis()).unwrap_or(u64::MAX - 1);
        self.last.fetch_max(ms + 1, Ordering::Relaxed);
    }

    /// A claim completed (`took`: it returned rows, now held until marked or given
    /// back), or failed. Only a claim that took rows is progress: an empty claim
    /// also answers when every due row is locked by another session (the claim
    /// skips locked rows), and while the store says work is due, that is a relay
    /// that moves nothing.
    pub fn claimed(&self, outcome: Result<bool, ()>) {
        match outcome {
            Ok(took) => {
                self.claim_failing.store(false, Ordering::Relaxed);
                if took {
                    self.in_hand.fetch_add(1, Ordering::Relaxed);
                    self.completed();
                }
            }
            Err(()) => self.claim_failing.store(true, Ordering::Relaxed),
        }
    }

    /// A batch held was marked (or its mark given up) or given back.
    pub fn let_go(&self) {
        let _ = self
            .in_hand
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }

    fn last_progress(&self) -> Option<Duration> {
        match self.last.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(Duration::from_millis(ms - 1)),
        }
    }

    /// Whether the dispatcher holds work or cannot look for it: due work, whatever
    /// the store says.
    fn busy(&self) -> bool {
        self.in_hand.load(Ordering::Relaxed) > 0 || self.claim_failing.load(Ordering::Relaxed)
    }

    /// Why the relay is stalled, while the watchdog finds it so.
    #[must_use]
    pub fn stalled(&self) -> Option<String> {
        self.stalled
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn set(&self, verdict: Progress, stall_after: Duration) {
        let why = match (verdict, &self.consumer) {
            (Progress::Stalled { quiet }, None) => Some(format!(
                "stalled: work is due and no claim has taken rows and no mark has completed for {}s (health.stall_after {:?}); is a statement waiting on another session's lock, or are the due rows locked by another session?",
                quiet.as_secs(),
                stall_after
            )),
            (Progress::Stalled { quiet }, Some(_)) => Some(format!(
                "stalled: deliveries are in hand and none has been recorded in the inbox for {}s (stall_after {:?}); is the inbox waiting on another session's lock, or unreachable?",
                quiet.as_secs(),
                stall_after
            )),
            (Progress::Idle | Progress::Moving, _) => None,
        };
        let mut s = self
            .stalled
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match (&*s, &why) {
            (None, Some(w)) => tracing::warn!(reason = %w, "the relay is stalled; readiness fails"),
            (Some(_), None) => tracing::info!("the relay makes progress again; readiness clears"),
            _ => {}
        }
        *s = why;
        drop(s);
        let value = if verdict.is_stalled() { 1.0 } else { 0.0 };
        match &self.consumer {
            None => metrics::gauge!("outbox_relay_stalled").set(value),
            Some(name) => {
                metrics::gauge!("outbox_consumer_stalled", "consumer" => name.clone()).set(value);
            }
        }
    }
}

/// How often the watchdog looks: often enough to turn red soon after the bound,
/// never more than every 5 s.
fn tick(stall_after: Duration) -> Duration {
    (stall_after / 4).clamp(Duration::from_millis(20), Duration::from_secs(5))
}

/// Watches `progress` until `cancel` fires: while the dispatcher holds no batch, asks
/// `store` whether a claim would find work (a question bounded like every other
/// statement; no answer is no work, since the dispatcher's own claims answer), and records the [`StallWatch`]'s
/// verdict for readiness and the `outbox_relay_stalled` gauge. Without a store (a
/// consumer's worker), work is due exactly while deliveries are in hand or the
/// inbox refuses them.
pub async fn watch(
    progress: Arc<RelayProgress>,
    store: Option<Arc<dyn OutboxRelayPath>>,
    stall_after: Duration,
    cancel: CancellationToken,
) {
    let mut watch = StallWatch::new(stall_after);
    let every = tick(stall_after);
    loop {
        let due = if progress.busy() {
            Some(true)
        } else if let Some(store) = &store {
            // A store that does not answer within the bound is no answer: the
            // watchdog itself must never be the one stuck.
            // The dispatcher holds nothing and its claims answer (a failing one
            // would make it busy): a store that does not answer this question
            // is no due work. Keeping an earlier "due" instead would turn an idle
            // relay red once the question fails for stall_after, as empty claims
            // are no progress.
            match tokio::time::timeout(stall_after.max(every), store.pending_claimable()).await {
                Ok(Ok(due)) => due,
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "stall watchdog: the store did not say whether work is due");
                    Some(false)
                }
                Err(_) => Some(false),
            }
        } else {
            Some(false)
        };
        let verdict = watch.observe(progress.now(), due, progress.last_progress());
        progress.set(verdict, stall_after);
        if !sleep_or_cancel(every, &cancel).await {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use outbox_ports::{MockOutboxRelayPath, PortError};
    use tokio_util::sync::CancellationToken;

    use super::{RelayProgress, watch};

    /// An idle relay (nothing in hand, claims answering) whose store said once that
    /// work was due and then stops answering the watchdog's question: it stays
    /// ready. It turned red after stall_after when the last answer was kept.
    #[tokio::test(start_paused = true)]
    async fn an_idle_relay_stays_ready_when_the_store_stops_answering_the_watchdog() {
        let mut store = MockOutboxRelayPath::new();
        let mut asked = 0;
        store.expect_pending_claimable().returning(move || {
            asked += 1;
            if asked == 1 {
                Ok(Some(true))
            } else {
                Err(PortError::transient("look for claimable messages", "gone"))
            }
        });
        let progress = Arc::new(RelayProgress::default());
        progress.claimed(Ok(false));
        let cancel = CancellationToken::new();
        let watching = tokio::spawn(watch(
            progress.clone(),
            Some(Arc::new(store)),
            Duration::from_secs(1),
            cancel.clone(),
        ));
        tokio::time::sleep(Duration::from_secs(5)).await;
        let stalled = progress.stalled();
        cancel.cancel();
        watching.await.expect("watchdog");
        assert_eq!(stalled, None);
    }

    /// The watchdog still turns red while the dispatcher's claims fail.
    #[tokio::test(start_paused = true)]
    async fn failing_claims_turn_readiness_red_whatever_the_store_answers() {
        let mut store = MockOutboxRelayPath::new();
        store
            .expect_pending_claimable()
            .returning(|| Err(PortError::transient("look for claimable messages", "gone")));
        let progress = Arc::new(RelayProgress::default());
        progress.claimed(Err(()));
        let cancel = CancellationToken::new();
        let watching = tokio::spawn(watch(
            progress.clone(),
            Some(Arc::new(store)),
            Duration::from_secs(1),
            cancel.clone(),
        ));
        tokio::time::sleep(Duration::from_secs(5)).await;
        let stalled = progress.stalled();
        cancel.cancel();
        watching.await.expect("watchdog");
        assert!(stalled.is_some());
    }
}
