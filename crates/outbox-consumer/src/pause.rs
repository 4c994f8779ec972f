//! Whether an operator paused the consumer: read from its inbox (where the admin
//! service writes pauses) every [`PAUSE_POLL`], and told to its consuming loops.

use std::future::Future;
use std::time::Duration;

use outbox_ports::PortError;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// How often a consumer reads whether it is paused: a pause or resume written by
/// any instance is obeyed within this and the time in-hand deliveries take.
pub const PAUSE_POLL: Duration = Duration::from_secs(1);

/// The longest the first read may take before the consumer holds off as if
/// paused, until a read succeeds.
const FIRST_READ: Duration = Duration::from_secs(5);

/// The first answer, then a task that keeps the answer current until `stop`
/// fires. A read that fails keeps the last answer (a paused consumer stays paused
/// while its store is away); without any answer yet the consumer holds off as if
/// paused, so that a restart during an outage never consumes through a pause.
pub(crate) async fn watch_paused<F, Fut>(
    read: F,
    consumer: String,
    stop: CancellationToken,
) -> (watch::Receiver<bool>, tokio::task::JoinHandle<()>)
where
    F: Fn() -> Fut + Send + 'static,
    Fut: Future<Output = Result<bool, PortError>> + Send,
{
    let first = tokio::time::timeout(FIRST_READ, read()).await;
    let first = match first {
        Ok(Ok(paused)) => paused,
        // The store cannot keep pauses at all (its table is missing: `outbox
        // migrate` has not run since the upgrade): waiting would stop this
        // consumer for good, silently, so it runs and says it obeys no pause.
        Ok(Err(e)) if !e.is_retryable() => {
            tracing::error!(consumer = %consumer, error = %e, "cannot read pauses (run `outbox migrate`?); this consumer obeys no pause until it can");
            false
        }
        Ok(Err(e)) => {
            tracing::warn!(consumer = %consumer, error = %e, "cannot read whether the consumer is paused; taking nothing until it can");
            true
        }
        Err(_) => {
            tracing::warn!(consumer = %consumer, "no answer on whether the consumer is paused within 5s; taking nothing until there is one");
            true
        }
    };
    let (tx, rx) = watch::channel(first);
    let task = tokio::spawn(async move {
        let mut failing = false;
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(PAUSE_POLL) => {}
            }
            match read().await {
                Ok(paused) => {
                    failing = false;
                    tx.send_if_modified(|p| std::mem::replace(p, paused) != paused);
                }
                Err(e) if !failing => {
                    failing = true;
                    tracing::warn!(consumer = %consumer, error = %e, "cannot read whether the consumer is paused; keeping the last answer");
                }
                Err(_) => {}
            }
        }
    });
    (rx, task)
}
