//! What an instance completes reaches the shared per-minute totals: every interval,
//! once more at shutdown, and after a failed add (the count is kept, not lost).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use outbox_adapters_memory::MemoryThroughputLog;
use outbox_ports::{
    BucketCount, ChartWindow, MinuteCount, PortError, SystemClock, ThroughputKind, ThroughputLog,
};
use outbox_runtime::{CancellationToken, NamedTally, TallyRecorder, ThroughputRecorder};

/// A log that refuses adds while `down` is set.
struct Flaky {
    inner: MemoryThroughputLog,
    down: AtomicBool,
}

impl Flaky {
    fn new() -> Self {
        Self {
            inner: MemoryThroughputLog::new(Arc::new(SystemClock)),
            down: AtomicBool::new(false),
        }
    }

    fn refusing(&self) -> Result<(), PortError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(PortError::transient("add", "store down"));
        }
        Ok(())
    }
}

#[async_trait]
impl ThroughputLog for Flaky {
    async fn add(&self, kind: ThroughputKind, count: u64) -> Result<(), PortError> {
        self.refusing()?;
        self.inner.add(kind, count).await
    }

    async fn per_minute(
        &self,
        kind: ThroughputKind,
        window: Duration,
    ) -> Result<Vec<MinuteCount>, PortError> {
        self.inner.per_minute(kind, window).await
    }

    async fn add_named(
        &self,
        kind: ThroughputKind,
        counts: &[(String, u64)],
    ) -> Result<(), PortError> {
        self.refusing()?;
        self.inner.add_named(kind, counts).await
    }

    async fn named_series(
        &self,
        kind: ThroughputKind,
        name: &str,
        window: ChartWindow,
    ) -> Result<Vec<BucketCount>, PortError> {
        self.inner.named_series(kind, name, window).await
    }

    async fn named_totals(
        &self,
        kind: ThroughputKind,
        window: ChartWindow,
    ) -> Result<Vec<(String, u64)>, PortError> {
        self.inner.named_totals(kind, window).await
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
    let log = Arc::new(Flaky::new());
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

async fn named(log: &dyn ThroughputLog, kind: ThroughputKind) -> Vec<(String, u64)> {
    log.named_totals(kind, ChartWindow::Hour)
        .await
        .expect("read")
}

#[tokio::test]
async fn a_tally_is_added_per_name_kept_across_a_failed_add_and_flushed_at_shutdown() {
    let log = Arc::new(Flaky::new());
    let tally = Arc::new(NamedTally::default());
    let recorder = TallyRecorder::new(
        log.clone(),
        Arc::clone(&tally),
        ThroughputKind::Published,
        ThroughputKind::PublishFailed,
    )
    .every(Duration::from_millis(30));
    let cancel = CancellationToken::new();
    let task = tokio::spawn(recorder.run(cancel.clone()));
    tally.add_all([("orders", 3, 1), ("billing", 2, 0), ("orders", 1, 0)]);
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(
        named(&*log, ThroughputKind::Published).await,
        vec![("billing".to_owned(), 2), ("orders".to_owned(), 4)]
    );
    assert_eq!(
        named(&*log, ThroughputKind::PublishFailed).await,
        vec![("orders".to_owned(), 1)],
        "failed attempts as their own kind, and added once"
    );
    // Refused adds are kept and added once the log is back.
    log.down.store(true, Ordering::SeqCst);
    tally.add_all([("orders", 5, 2)]);
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(
        named(&*log, ThroughputKind::Published).await,
        vec![("billing".to_owned(), 2), ("orders".to_owned(), 4)]
    );
    log.down.store(false, Ordering::SeqCst);
    tally.add_all([("billing", 1, 0)]);
    cancel.cancel();
    task.await.expect("recorder");
    assert_eq!(
        named(&*log, ThroughputKind::Published).await,
        vec![("billing".to_owned(), 3), ("orders".to_owned(), 9)],
        "what the log refused and what came last are both added"
    );
    assert_eq!(
        named(&*log, ThroughputKind::PublishFailed).await,
        vec![("orders".to_owned(), 3)]
    );
    assert!(tally.take().is_empty(), "nothing held after the last add");
}

#[tokio::test]
async fn a_named_recorder_adds_a_totals_growth_under_its_name_only() {
    let log = Arc::new(MemoryThroughputLog::new(Arc::new(SystemClock)));
    let counter = Arc::new(AtomicU64::new(10));
    let recorder = ThroughputRecorder::of_total(
        log.clone(),
        ThroughputKind::Consumed,
        counter.clone(),
        |c| c,
    )
    .named("billing")
    .every(Duration::from_millis(30));
    let cancel = CancellationToken::new();
    let task = tokio::spawn(recorder.run(cancel.clone()));
    tokio::time::sleep(Duration::from_millis(50)).await;
    counter.fetch_add(7, Ordering::SeqCst);
    cancel.cancel();
    task.await.expect("recorder");
    assert_eq!(
        named(&*log, ThroughputKind::Consumed).await,
        vec![("billing".to_owned(), 7)]
    );
    let totals = log
        .per_minute(ThroughputKind::Consumed, Duration::from_secs(3600))
        .await
        .expect("read");
    assert!(totals.is_empty(), "not in the totals of all: {totals:?}");
}

#[test]
fn a_tally_holds_at_most_as_many_names_as_one_add_takes() {
    let tally = NamedTally::default();
    tally.add_all([("before", 1, 0)]);
    assert!(
        tally.take().is_empty(),
        "nothing held before a recorder takes from it"
    );
    tally.start_recording();
    // No exchange can have these names, and no store could keep them.
    tally.add_all([("a\0b", 1, 0), (&"x".repeat(256), 1, 0)]);
    assert!(tally.take().is_empty());
    let names: Vec<String> = (0..outbox_ports::MAX_NAMES_PER_ADD + 5)
        .map(|i| format!("e{i}"))
        .collect();
    tally.add_all(names.iter().map(|n| (n.as_str(), 1, 0)));
    // A name held already still counts.
    tally.add_all([("e0", 1, 0), ("quiet", 0, 0)]);
    let taken = tally.take();
    assert_eq!(taken.len(), outbox_ports::MAX_NAMES_PER_ADD);
    assert!(taken.contains(&("e0".to_owned(), 2, 0)));
    assert!(!taken.iter().any(|t| t.0 == "quiet"));
}
