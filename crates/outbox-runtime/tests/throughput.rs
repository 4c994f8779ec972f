//! What an instance completes reaches the shared per-minute totals: every interval,
//! once more at shutdown, and after a failed add (the count is kept, not lost).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use outbox_adapters_memory::MemoryThroughputLog;
use outbox_ports::{MinuteCount, PortError, SystemClock, ThroughputKind, ThroughputLog};
use outbox_runtime::{CancellationToken, ThroughputRecorder};

/// A log that refuses adds while `down` is set.
struct Flaky {
    inner: MemoryThroughputLog,
    down: AtomicBool,
}

#[async_trait]
impl ThroughputLog for Flaky {
    async fn add(&self, kind: ThroughputKind, count: u64) -> Result<(), PortError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(PortError::transient("add", "store down"));
        }
        self.inner.add(kind, count).await
    }

    async fn per_minute(
        &self,
        kind: ThroughputKind,
        window: Duration,
    ) -> Result<Vec<MinuteCount>, PortError> {
        self.inner.per_minute(kind, window).await
    }
}

async fn total(log: &dyn ThroughputLog) -> u64 {
    log.per_minute(ThroughputKind::Published, Duration::from_secs(3600))
        .await
        .expect("read")
        .iter()
        .map(|m| m.count)
        .sum()
}

#[tokio::test]
async fn growth_is_added_once_kept_across_a_failed_add_and_flushed_at_shutdown() {
    let log = Arc::new(Flaky {
        inner: MemoryThroughputLog::new(Arc::new(SystemClock)),
        down: AtomicBool::new(false),
    });
    let counter = Arc::new(AtomicU64::new(40));
    let recorder = ThroughputRecorder::of_total(
        log.clone(),
        ThroughputKind::Published,
        counter.clone(),
        |c| c,
    )
    .every(Duration::from_millis(30));
    let cancel = CancellationToken::new();
    let task = tokio::spawn(recorder.run(cancel.clone()));
    // What was counted before the recorder started is not added.
    tokio::time::sleep(Duration::from_millis(80)).await;
    assert_eq!(total(&*log).await, 0);
    counter.fetch_add(10, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(80)).await;
    assert_eq!(total(&*log).await, 10);
    // The store is down: the growth waits, then arrives whole.
    log.down.store(true, Ordering::SeqCst);
    counter.fetch_add(5, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(80)).await;
    assert_eq!(total(&*log).await, 10);
    log.down.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(80)).await;
    assert_eq!(total(&*log).await, 15);
    // Counted just before shutdown: added by the last flush.
    counter.fetch_add(7, Ordering::SeqCst);
    cancel.cancel();
    task.await.expect("recorder");
    assert_eq!(total(&*log).await, 22);
}
