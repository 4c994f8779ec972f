//! The [`ThroughputLog`] contract.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::Timestamp;
use outbox_ports::{ThroughputKind, ThroughputLog};

/// Adds of one kind within a minute sum up in that minute; kinds stay apart.
pub async fn adds_sum_up_per_minute_and_kind(log: Arc<dyn ThroughputLog>) {
    let before = Timestamp::now_utc() - time::Duration::minutes(1);
    log.add(ThroughputKind::Published, 3).await.expect("add");
    log.add(ThroughputKind::Published, 4).await.expect("add");
    log.add(ThroughputKind::Consumed, 5).await.expect("add");
    log.add(ThroughputKind::Consumed, 0)
        .await
        .expect("add nothing");
    let window = Duration::from_secs(3600);
    let published = log
        .per_minute(ThroughputKind::Published, window)
        .await
        .expect("read");
    let consumed = log
        .per_minute(ThroughputKind::Consumed, window)
        .await
        .expect("read");
    // The adds may straddle a minute boundary: totals, not one row, are certain.
    assert_eq!(published.iter().map(|m| m.count).sum::<u64>(), 7);
    assert_eq!(consumed.iter().map(|m| m.count).sum::<u64>(), 5);
    for m in published.iter().chain(&consumed) {
        assert!(
            m.minute >= before.replace_second(0).expect("valid"),
            "{m:?}"
        );
        assert_eq!(m.minute.second(), 0, "a minute's start: {m:?}");
        assert!(m.count > 0, "minutes with none are left out");
    }
    assert!(
        published.windows(2).all(|w| w[0].minute < w[1].minute),
        "oldest first"
    );
    // Failed attempts of either side: kinds of their own.
    log.add(ThroughputKind::PublishFailed, 2)
        .await
        .expect("add");
    log.add(ThroughputKind::ConsumeFailed, 9)
        .await
        .expect("add");
    for (kind, want) in [
        (ThroughputKind::PublishFailed, 2),
        (ThroughputKind::ConsumeFailed, 9),
        (ThroughputKind::Published, 7),
    ] {
        let read = log.per_minute(kind, window).await.expect("read");
        assert_eq!(read.iter().map(|m| m.count).sum::<u64>(), want, "{kind:?}");
    }
}

/// An empty log reads as no minutes.
pub async fn an_empty_log_has_no_minutes(log: Arc<dyn ThroughputLog>) {
    let read = log
        .per_minute(ThroughputKind::Published, Duration::from_secs(3600))
        .await
        .expect("read");
    assert!(read.is_empty(), "{read:?}");
}
