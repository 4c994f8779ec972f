//! Per-name totals on PostgreSQL over time: which rows each window reads, and that
//! the writers delete what no window shows any more (rows placed in the past by
//! hand, as the store's clock cannot be moved).

mod common;

use outbox_adapters_postgres::PgThroughputLog;
use outbox_ports::{ChartWindow, ThroughputKind, ThroughputLog};

async fn place(pool: &sqlx::PgPool, table: &str, width: i32, ago: &str, count: i64) {
    sqlx::query(&format!(
        "INSERT INTO {table} (kind, name, width, start, count) VALUES \
         ('published', 'orders', $1, to_timestamp(floor(extract(epoch FROM now() - $2::interval) / $1) * $1), $3)"
    ))
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
    let totals = log
        .named_totals(ThroughputKind::Published, ChartWindow::Day)
        .await
        .expect("totals");
    assert_eq!(totals, vec![("orders".to_owned(), 5)]);

    // A writer's add forgets the rows no window shows, and only those.
    log.add_named(ThroughputKind::Published, &[("orders".to_owned(), 1)])
        .await
        .expect("add");
    let left: Vec<(i32, i64)> = sqlx::query_as(&format!(
        "SELECT width, count FROM {table} ORDER BY width, start"
    ))
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
