//! The one lease-renewal loop of the lock adapters (feature `renewal`): PostgreSQL
//! and Redis differ only in the statement that renews, so the timing, the validity
//! clock and the rules for losing a lease live here once.
//!
//! The rules: renew every third of the TTL; after a renewal that failed, again after
//! a twelfth (at most a second), so two short blips do not lose the lease. The lease
//! counts as valid until the send time of the last renewal that got through, plus
//! the TTL, minus a quarter of the TTL (for clock-rate differences and for the step a
//! caller takes between checking and acting). A renewal is given only the time left
//! before that point; one that has not got through by then, or that gets through
//! too late, or that finds the lease taken, loses it for good. `is_held` reads the
//! clock itself, so a renewal stuck on a dead connection cannot keep it true.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::PortError;

/// What one renewal found, when it got an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenewalAnswer {
    /// The lease is still ours and was extended by its TTL.
    Renewed,
    /// Someone else holds the key now (or it ran out and is gone).
    Taken,
}

/// How often a lease of `ttl` is renewed.
#[must_use]
pub fn renew_every(ttl: Duration) -> Duration {
    ttl / 3
}

/// How long after a failed renewal the next is tried: a twelfth of the TTL, at most a
/// second. Waiting the usual third would leave only a twelfth of the TTL for the
/// next one before the lease must be given up.
#[must_use]
pub fn retry_after_failure(ttl: Duration) -> Duration {
    (ttl / 12).min(Duration::from_secs(1))
}

/// The part of a TTL a holder may count on, from the send time of the renewal that
/// got through.
#[must_use]
pub fn usable(ttl: Duration) -> Duration {
    ttl.saturating_sub(ttl / 4)
}

/// Until when this process may count on its lease, by its own clock.
#[derive(Debug)]
struct Validity {
    origin: Instant,
    ttl: Duration,
    /// Milliseconds after `origin`; only ever grows.
    until_ms: AtomicU64,
}

impl Validity {
    fn new(sent: Instant, ttl: Duration) -> Self {
        let v = Self {
            origin: sent,
            ttl,
            until_ms: AtomicU64::new(0),
        };
        v.extend_from(sent);
        v
    }

    /// A renewal sent at `sent` got through.
    fn extend_from(&self, sent: Instant) {
        let until = sent.saturating_duration_since(self.origin) + usable(self.ttl);
        let ms = u64::try_from(until.as_millis()).unwrap_or(u64::MAX);
        self.until_ms.fetch_max(ms, Ordering::SeqCst);
    }

    /// Time left before the lease must be given up (zero once it is).
    fn remaining(&self) -> Duration {
        let until = self.origin + Duration::from_millis(self.until_ms.load(Ordering::SeqCst));
        until.saturating_duration_since(Instant::now())
    }
}

/// A lease kept alive by a background task until it is lost, stopped or dropped.
#[derive(Debug)]
pub struct RenewedLease {
    held: Arc<AtomicBool>,
    validity: Arc<Validity>,
    task: tokio::task::JoinHandle<()>,
}

impl RenewedLease {
    /// Starts renewing a lease of `ttl` on `key` (named in logs only), acquired by a
    /// request sent at `acquired_sent_at`. `renew_once` renews it once; the loop
    /// bounds how long each call may take.
    pub fn start<F, Fut>(
        key: String,
        ttl: Duration,
        acquired_sent_at: Instant,
        renew_once: F,
    ) -> Self
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = Result<RenewalAnswer, PortError>> + Send + 'static,
    {
        let held = Arc::new(AtomicBool::new(true));
        let validity = Arc::new(Validity::new(acquired_sent_at, ttl));
        let task = tokio::spawn(keep_renewed(
            key,
            ttl,
            Arc::clone(&held),
            Arc::clone(&validity),
            renew_once,
        ));
        Self {
            held,
            validity,
            task,
        }
    }

    /// Whether the lease may still be counted on: not lost, and its validity not run
    /// out by this process's clock.
    #[must_use]
    pub fn is_held(&self) -> bool {
        self.held.load(Ordering::SeqCst) && !self.validity.remaining().is_zero()
    }

    /// Stops renewing and counts the lease as gone (before releasing it).
    pub fn stop(&self) {
        self.task.abort();
        self.held.store(false, Ordering::SeqCst);
    }
}

impl Drop for RenewedLease {
    // No async drop: stop renewing and let the lease run out.
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn keep_renewed<F, Fut>(
    key: String,
    ttl: Duration,
    held: Arc<AtomicBool>,
    validity: Arc<Validity>,
    mut renew_once: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<RenewalAnswer, PortError>>,
{
    let lost = |why: &str| {
        held.store(false, Ordering::SeqCst);
        tracing::warn!(%key, "lock lease lost: {why}");
    };
    // Renewals are timed from the send time of the last one (or of the
    // acquisition), not from its answer: a slow answer must not push the next
    // renewal towards the end of the validity.
    let mut next = validity.origin + renew_every(ttl);
    loop {
        tokio::time::sleep_until(next).await;
        let sent = Instant::now();
        next = sent + renew_every(ttl);
        let left = validity.remaining();
        if left.is_zero() {
            return lost("no renewal got through before the lease could run out");
        }
        match tokio::time::timeout(left, renew_once()).await {
            Err(_) => return lost("no renewal got through before the lease could run out"),
            // Through, but after the lease was given up: it stays given up.
            Ok(Ok(_)) if validity.remaining().is_zero() => {
                return lost("the renewal got through too late");
            }
            Ok(Ok(RenewalAnswer::Renewed)) => validity.extend_from(sent),
            Ok(Ok(RenewalAnswer::Taken)) => return lost("another holder took it"),
            Ok(Err(e)) => {
                let pause = retry_after_failure(ttl);
                next = Instant::now() + pause;
                tracing::warn!(%key, error = %e, retry_in = ?pause, "lock renewal failed; retrying");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    const TTL: Duration = Duration::from_millis(1200);

    type Renewal = std::pin::Pin<Box<dyn Future<Output = Result<RenewalAnswer, PortError>> + Send>>;
    type Step = (Duration, Result<RenewalAnswer, ()>);

    /// A renewal whose answers are scripted: each call takes the next (delay, answer).
    fn scripted(steps: Vec<Step>) -> (impl FnMut() -> Renewal + Send + 'static, Arc<Mutex<u32>>) {
        let calls = Arc::new(Mutex::new(0_u32));
        let steps = Arc::new(Mutex::new(steps.into_iter()));
        let c = Arc::clone(&calls);
        let f = move || {
            *c.lock().expect("calls") += 1;
            let step = steps.lock().expect("steps").next();
            Box::pin(async move {
                match step {
                    Some((delay, answer)) => {
                        tokio::time::sleep(delay).await;
                        answer.map_err(|()| PortError::transient("renew", "connection refused"))
                    }
                    // Out of script: hang like a dead connection.
                    None => std::future::pending().await,
                }
            }) as Renewal
        };
        (f, calls)
    }

    #[tokio::test(start_paused = true)]
    async fn renewals_that_get_through_keep_the_lease() {
        let steps = (0..30)
            .map(|_| (Duration::from_millis(5), Ok(RenewalAnswer::Renewed)))
            .collect();
        let (f, calls) = scripted(steps);
        let lease = RenewedLease::start("k".into(), TTL, Instant::now(), f);
        tokio::time::sleep(TTL * 5).await;
        assert!(lease.is_held());
        assert!(*calls.lock().expect("calls") >= 12);
    }

    #[tokio::test(start_paused = true)]
    async fn a_hanging_renewal_loses_the_lease_before_the_ttl_runs_out() {
        // The first renewal hangs for ever (a dead connection).
        let (f, _) = scripted(Vec::new());
        let start = Instant::now();
        let lease = RenewedLease::start("k".into(), TTL, start, f);
        tokio::time::sleep(usable(TTL) - Duration::from_millis(10)).await;
        assert!(
            lease.is_held(),
            "still valid just before the usable part ends"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            !lease.is_held(),
            "given up by {:?}, before the TTL",
            usable(TTL)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn two_failed_renewals_in_a_row_do_not_lose_the_lease() {
        let fail = (Duration::from_millis(5), Err(()));
        let ok = (Duration::from_millis(5), Ok(RenewalAnswer::Renewed));
        let steps = vec![fail, fail, ok, ok, ok, ok];
        let (f, _) = scripted(steps);
        let lease = RenewedLease::start("k".into(), TTL, Instant::now(), f);
        tokio::time::sleep(TTL * 2).await;
        assert!(lease.is_held());
    }

    #[tokio::test(start_paused = true)]
    async fn a_taken_lease_is_lost_at_once() {
        let (f, _) = scripted(vec![(Duration::from_millis(5), Ok(RenewalAnswer::Taken))]);
        let lease = RenewedLease::start("k".into(), TTL, Instant::now(), f);
        tokio::time::sleep(renew_every(TTL) + Duration::from_millis(10)).await;
        assert!(!lease.is_held());
    }

    #[tokio::test(start_paused = true)]
    async fn validity_counts_from_the_send_time_not_the_answer() {
        // Each renewal takes most of the time left; measured from its answer, the
        // lease would look valid for longer than the server grants.
        let slow = (Duration::from_millis(350), Ok(RenewalAnswer::Renewed));
        let (f, _) = scripted(vec![slow]);
        let start = Instant::now();
        let lease = RenewedLease::start("k".into(), TTL, start, f);
        // The only renewal is sent at TTL/3 = 400 ms; valid until 400 + 900 ms.
        tokio::time::sleep(Duration::from_millis(1290)).await;
        assert!(lease.is_held());
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            !lease.is_held(),
            "valid until send time + usable TTL, not answer time"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn slow_answers_do_not_push_the_next_renewal_late() {
        // Every renewal answers after 300 ms. Timed from the answers, renewals go
        // out every 700 ms and each leaves the next less margin; timed from the
        // sends, every 400 ms.
        let slow = (Duration::from_millis(300), Ok(RenewalAnswer::Renewed));
        let (f, calls) = scripted(vec![slow; 20]);
        let lease = RenewedLease::start("k".into(), TTL, Instant::now(), f);
        tokio::time::sleep(Duration::from_millis(4050)).await;
        assert!(lease.is_held());
        assert_eq!(
            *calls.lock().expect("calls"),
            10,
            "one renewal every 400 ms"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn stop_counts_the_lease_gone() {
        let (f, _) = scripted(Vec::new());
        let lease = RenewedLease::start("k".into(), TTL, Instant::now(), f);
        lease.stop();
        assert!(!lease.is_held());
    }
}
