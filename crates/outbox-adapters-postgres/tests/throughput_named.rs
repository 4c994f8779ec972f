//! Per-name totals on PostgreSQL over time: which rows each window reads, and that
//! the writers delete what no window shows any more (rows placed in the past by
//! hand, as the store's clock cannot be moved).

mod common;

use outbox_adapters_postgres::PgThroughputLog;
use outbox_ports::{ChartWindow, ThroughputKind, ThroughputLog};

async fn place(pool: &sqlx::PgPool, table: &str, width: i32, ago: &str, count: i64) {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {table} (kind, name, width, start, count) VALUES \
         ('published', 'orders', $1, to_timestamp(floor(extract(epoch FROM now() - $2::interval) / $1) * $1), $3)"
    )))
    .bind(width)
    .bind(ago)
    .bind(count)
    .execute(pool)
    .await
    .expect("place a row");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_window_reads_its_rows_and_writers_forget_what_none_shows() {
    let pool = common::pool()
        .await
        .expect("needs PostgreSQL: set OUTBOX_TEST_DATABASE_URL");
    let schema = common::fresh(&pool).await;
    let table = format!("{}.outbox_throughput_named", schema.quoted());
    // Minute rows: 2 h ago (the day's, not the hour's), 23 h ago (the day's), 2
    // days ago (in no window, kept by no one). Hour rows: 3 days ago (the week's),
    // 8 days ago (in no window).
    place(&pool, &table, 60, "2 hours", 2).await;
    place(&pool, &table, 60, "23 hours", 3).await;
    place(&pool, &table, 60, "2 days", 100).await;
    place(&pool, &table, 3600, "3 days", 7).await;
    place(&pool, &table, 3600, "8 days", 1000).await;
    let log = PgThroughputLog::new(pool.clone(), &schema);
    let sum = async |window| {
        log.named_series(ThroughputKind::Published, "orders", window)
            .await
            .expect("read")
            .iter()
            .map(|b| b.count)
            .sum::<u64>()
    };
    assert_eq!(sum(ChartWindow::Hour).await, 0);
    assert_eq!(sum(ChartWindow::Day).await, 5);
    assert_eq!(sum(ChartWindow::Week).await, 7);

    // A writer's add forgets the rows no window shows, and only those.
    log.add_named(ThroughputKind::Published, &[("orders".to_owned(), 1)])
        .await
        .expect("add");
    let left: Vec<(i32, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT width, count FROM {table} ORDER BY width, start"
    )))
    .fetch_all(&pool)
    .await
    .expect("rows");
    assert_eq!(
        left,
        vec![(60, 3), (60, 2), (60, 1), (3600, 7), (3600, 1)],
        "the minute row of 2 days ago and the hour row of 8 days ago are gone"
    );
    assert_eq!(sum(ChartWindow::Hour).await, 1);
    assert_eq!(sum(ChartWindow::Day).await, 6);
    assert_eq!(sum(ChartWindow::Week).await, 8);
}

/// What a writer's add at `at` (an SQL expression of `now()`, a minute's start)
/// leaves: a minute row and its hour's row, counting `count`.
async fn place_add(pool: &sqlx::PgPool, table: &str, at: &str, count: i64) {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {table} (kind, name, width, start, count) \
         SELECT 'published', 'orders', w, to_timestamp(floor(extract(epoch FROM {at}) / w) * w), $1 \
         FROM (VALUES (60), (3600)) AS r(w) \
         ON CONFLICT (kind, name, width, start) DO UPDATE SET count = {table}.count + EXCLUDED.count"
    )))
    .bind(count)
    .execute(pool)
    .await
    .expect("place an add");
}

/// Counts land in their own bucket: a fresh add in the last one of every window;
/// adds on either side of a 15-minute boundary in the day's buckets on either side
/// of it; the day's first minute in its first bucket, and a writer's forgetting
/// keeps it; the list's totals (hour rows where whole hours allow) equal the sums
/// of the charts' buckets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_land_in_their_bucket_and_the_oldest_bucket_is_not_forgotten() {
    let pool = common::pool()
        .await
        .expect("needs PostgreSQL: set OUTBOX_TEST_DATABASE_URL");
    let schema = common::fresh(&pool).await;
    let table = format!("{}.outbox_throughput_named", schema.quoted());
    // Each statement reads its own now(): start well inside a minute and a quarter,
    // so none turns while the test runs (it takes well under a second).
    let (to_minute, to_quarter): (f64, f64) = sqlx::query_as(
        "SELECT (60 - extract(epoch FROM now())::numeric % 60)::float8, \
                (900 - extract(epoch FROM now())::numeric % 900)::float8",
    )
    .fetch_one(&pool)
    .await
    .expect("now");
    if to_minute < 5.0 || to_quarter < 5.0 {
        tokio::time::sleep(std::time::Duration::from_secs_f64(to_minute + 0.5)).await;
    }
    let quarter = "to_timestamp(floor(extract(epoch FROM now()) / 900) * 900)";
    let hour = "to_timestamp(floor(extract(epoch FROM now()) / 3600) * 3600)";
    // The minute before the current quarter; the day window's first minute; the
    // minute before the day window (in the week's only).
    place_add(
        &pool,
        &table,
        &format!("{quarter} - interval '1 minute'"),
        2,
    )
    .await;
    place_add(
        &pool,
        &table,
        &format!("{quarter} - interval '1425 minutes'"),
        3,
    )
    .await;
    place_add(
        &pool,
        &table,
        &format!("{quarter} - interval '1426 minutes'"),
        100,
    )
    .await;
    // The week window's first hour, and the hour before it.
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {table} (kind, name, width, start, count) VALUES \
         ('published', 'orders', 3600, {hour} - interval '167 hours', 7), \
         ('published', 'orders', 3600, {hour} - interval '168 hours', 1000)"
    )))
    .execute(&pool)
    .await
    .expect("place hours");
    let log = PgThroughputLog::new(pool.clone(), &schema);
    log.add_named(ThroughputKind::Published, &[("orders".to_owned(), 1)])
        .await
        .expect("add");
    let series = async |window| {
        log.named_series(ThroughputKind::Published, "orders", window)
            .await
            .expect("read")
            .iter()
            .map(|b| b.count)
            .collect::<Vec<u64>>()
    };
    let hour_series = series(ChartWindow::Hour).await;
    assert_eq!(
        hour_series.last(),
        Some(&1),
        "a fresh add in the last minute"
    );
    assert_eq!(hour_series.iter().sum::<u64>(), 3, "{hour_series:?}");
    let day = series(ChartWindow::Day).await;
    assert_eq!(day.len(), 96);
    assert_eq!(day[95], 1, "a fresh add in the last quarter: {day:?}");
    assert_eq!(
        day[94], 2,
        "the minute before the quarter in the one before: {day:?}"
    );
    assert_eq!(
        day[0], 3,
        "the window's first minute in its first bucket: {day:?}"
    );
    assert_eq!(
        day.iter().sum::<u64>(),
        6,
        "the minute before the window is not in it"
    );
    let week = series(ChartWindow::Week).await;
    assert_eq!(
        week[0], 7,
        "the week's first hour in its first bucket: {week:?}"
    );
    assert!(week[167] >= 1, "a fresh add in the last hour: {week:?}");
    assert_eq!(
        week.iter().sum::<u64>(),
        113,
        "the hour before the week is not in it"
    );
    for (window, want) in [
        (ChartWindow::Hour, 3),
        (ChartWindow::Day, 6),
        (ChartWindow::Week, 113),
    ] {
        let totals = log
            .named_totals(ThroughputKind::Published, window)
            .await
            .expect("totals");
        assert_eq!(totals, vec![("orders".to_owned(), want)], "{window:?}");
    }
}
