//! The [`ThroughputLog`] contract.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::Timestamp;
use outbox_ports::{BucketCount, ChartWindow, MAX_NAMES_PER_ADD, ThroughputKind, ThroughputLog};

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

/// Per-name adds sum up per name and kind, apart from the totals; every window
/// reads its whole run of buckets, aligned and oldest first, the last holding now.
pub async fn named_adds_sum_up_per_name_and_kind(log: Arc<dyn ThroughputLog>) {
    let name = |n: &str| n.to_owned();
    log.add_named(
        ThroughputKind::Published,
        &[
            (name("orders"), 3),
            (name("billing"), 4),
            (name("orders"), 2),
        ],
    )
    .await
    .expect("add");
    log.add_named(ThroughputKind::Published, &[(name("quiet"), 0)])
        .await
        .expect("add nothing");
    log.add_named(ThroughputKind::PublishFailed, &[(name("orders"), 1)])
        .await
        .expect("add");
    log.add_named(ThroughputKind::Published, &[])
        .await
        .expect("add no name");
    for window in ChartWindow::ALL {
        let series = |kind, n: &'static str| {
            let log = Arc::clone(&log);
            async move { log.named_series(kind, n, window).await.expect("read") }
        };
        let orders = series(ThroughputKind::Published, "orders").await;
        assert_eq!(orders.len(), window.buckets(), "{window:?}");
        let width = window.bucket_seconds();
        assert!(
            orders
                .windows(2)
                .all(|w| (w[1].start - w[0].start).whole_seconds() == width),
            "one bucket after another, oldest first: {window:?} {orders:?}"
        );
        assert!(
            orders.iter().all(|b| b.start.unix_timestamp() % width == 0),
            "aligned to the bucket's length: {window:?}"
        );
        let last = orders.last().expect("buckets").start;
        let ago = (Timestamp::now_utc() - last).whole_seconds();
        // The store's clock may differ from this one by a little.
        assert!(
            (-5..width + 5).contains(&ago),
            "the last bucket holds now: {window:?} {last} ({ago} s ago)"
        );
        let sum = |s: &[BucketCount]| s.iter().map(|b| b.count).sum::<u64>();
        assert_eq!(sum(&orders), 5, "{window:?}");
        assert_eq!(
            sum(&series(ThroughputKind::Published, "billing").await),
            4,
            "{window:?}"
        );
        assert_eq!(
            sum(&series(ThroughputKind::Published, "quiet").await),
            0,
            "{window:?}"
        );
        assert_eq!(
            sum(&series(ThroughputKind::PublishFailed, "orders").await),
            1,
            "kinds stay apart: {window:?}"
        );
        assert_eq!(
            sum(&series(ThroughputKind::Consumed, "orders").await),
            0,
            "{window:?}"
        );
        let totals = log
            .named_totals(ThroughputKind::Published, window)
            .await
            .expect("totals");
        assert_eq!(
            totals,
            vec![(name("billing"), 4), (name("orders"), 5)],
            "by name, nothing for a name with nothing: {window:?}"
        );
    }
    // The totals of all names are their own: a per-name add is not in them.
    let totals = log
        .per_minute(ThroughputKind::Published, Duration::from_secs(3600))
        .await
        .expect("read");
    assert!(totals.is_empty(), "{totals:?}");
    log.add(ThroughputKind::Consumed, 6).await.expect("add");
    assert!(
        log.named_totals(ThroughputKind::Consumed, ChartWindow::Hour)
            .await
            .expect("totals")
            .is_empty(),
        "a total is no name's"
    );
}

/// More names than one add may carry are refused, and none of them is added.
pub async fn too_many_names_are_refused(log: Arc<dyn ThroughputLog>) {
    let counts: Vec<(String, u64)> = (0..=MAX_NAMES_PER_ADD)
        .map(|i| (format!("exchange-{i}"), 1))
        .collect();
    assert!(
        log.add_named(ThroughputKind::Published, &counts)
            .await
            .is_err()
    );
    let totals = log
        .named_totals(ThroughputKind::Published, ChartWindow::Week)
        .await
        .expect("totals");
    assert!(totals.is_empty(), "{} names added", totals.len());
    log.add_named(ThroughputKind::Published, &counts[..MAX_NAMES_PER_ADD])
        .await
        .expect("as many as allowed");
    let totals = log
        .named_totals(ThroughputKind::Published, ChartWindow::Week)
        .await
        .expect("totals");
    assert_eq!(totals.len(), MAX_NAMES_PER_ADD);
}
