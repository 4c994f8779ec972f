//! The operator's lists cost a page, not the table: with 1,000,000 messages, lists
//! filtered by status and searches by id or correlation id are served by indexes
//! (no Seq Scan), and a page far down by cursor costs what the first does. Prints
//! the times (`cargo test -p outbox-adapters-postgres --test admin_scale -- --nocapture`).

mod common;

use std::time::{Duration, Instant};

use outbox_adapters_postgres::PgOutboxStore;
use outbox_core::{MessageId, OutboxStatus};
use outbox_ports::{MessageFilter, OutboxOperator, OutboxStore, PageCursor};

/// (first call, median of seven calls) of `f`.
async fn times<F, Fut>(mut f: F) -> (Duration, Duration)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut all = Vec::new();
    for _ in 0..7 {
        let started = Instant::now();
        f().await;
        all.push(started.elapsed());
    }
    let first = all[0];
    all.sort();
    (first, all[all.len() / 2])
}

fn status(s: OutboxStatus) -> MessageFilter {
    MessageFilter {
        status: Some(s),
        ..MessageFilter::default()
    }
}

fn q(q: String) -> MessageFilter {
    MessageFilter {
        q: Some(q),
        ..MessageFilter::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_use_indexes_with_a_million_messages() {
    with_db!(|pool, schema| {
        let store = PgOutboxStore::new(pool.clone(), schema.clone());
        let t = format!("{}.outbox_messages", schema.quoted());
        // 998,900 sent (every 1,000th with a correlation id), then the unsent ones.
        for (n, st) in [
            (998_900_i64, "sent"),
            (100, "publish_failed"),
            (500, "dead"),
            (500, "pending"),
        ] {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO {t} (exchange, routing_key, payload, status, sent_at, correlation_id) \
                 SELECT 'scale', 'k', convert_to(repeat('x', 300), 'UTF8'), $2, \
                   CASE WHEN $2 = 'sent' THEN now() END, \
                   CASE WHEN i % 1000 = 0 THEN 'corr-' || i END \
                 FROM generate_series(1, $1) AS i"
            )))
            .bind(n)
            .bind(st)
            .execute(&pool)
            .await
            .expect("fill");
        }
        sqlx::query(sqlx::AssertSqlSafe(format!("ANALYZE {t}")))
            .execute(&pool)
            .await
            .expect("analyze");
        let some_id: uuid::Uuid = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT id FROM {t} WHERE seq = 500000"
        )))
        .fetch_one(&pool)
        .await
        .expect("an id");

        let all = MessageFilter::default();
        let deep = Some(PageCursor(1_000));
        let mut plans = vec![
            (
                "first page",
                store.explain_list_messages(&all, None, 50).await,
            ),
            (
                "deep page",
                store.explain_list_messages(&all, deep, 50).await,
            ),
            (
                "q by id",
                store
                    .explain_list_messages(&q(some_id.to_string()), None, 50)
                    .await,
            ),
            (
                "q by correlation id",
                store
                    .explain_list_messages(&q("corr-4000".into()), None, 50)
                    .await,
            ),
        ];
        for s in [
            OutboxStatus::Pending,
            OutboxStatus::PublishFailed,
            OutboxStatus::Dead,
            OutboxStatus::Sent,
        ] {
            plans.push((
                s.as_str(),
                store.explain_list_messages(&status(s), None, 50).await,
            ));
            plans.push((
                s.as_str(),
                store
                    .explain_list_messages(&status(s), Some(PageCursor(999_950)), 50)
                    .await,
            ));
        }
        for (what, plan) in plans {
            let plan = plan.expect("explain");
            assert!(
                !plan.contains("Seq Scan"),
                "{what}: the list scans the table:\n{plan}"
            );
        }

        // What an operator sees: the right rows, by index.
        let found = store
            .list_messages(&q(some_id.to_string()), None, 50)
            .await
            .expect("q");
        assert_eq!(found.items.len(), 1);
        assert_eq!(found.items[0].id, MessageId::from_uuid(some_id));
        assert_eq!(found.items[0].payload_size, 300);
        assert_eq!(found.items[0].payload_preview.len(), 256);
        let dead = store
            .list_messages(&status(OutboxStatus::Dead), None, 1000)
            .await
            .expect("dead");
        assert_eq!(dead.items.len(), 500);
        assert_eq!(dead.next, None);

        let (first, first_median) = times(|| async {
            let page = store.list_messages(&all, None, 50).await.expect("first");
            assert_eq!(page.items.len(), 50);
        })
        .await;
        let (deep_first, deep_median) = times(|| async {
            let page = store.list_messages(&all, deep, 50).await.expect("deep");
            assert_eq!(page.items.len(), 50);
            assert!(page.items.iter().all(|s| s.status == OutboxStatus::Sent));
        })
        .await;
        let (stats_first, stats_median) = times(|| async {
            let s = store.stats().await.expect("stats");
            assert_eq!((s.pending, s.publish_failed, s.dead), (500, 100, 500));
        })
        .await;
        eprintln!(
            "1,000,000 messages: admin_list_first_ms first {:.2} median {:.2}; \
             admin_list_deep_ms (cursor 1,000) first {:.2} median {:.2}; \
             admin_stats_ms first {:.2} median {:.2}",
            ms(first),
            ms(first_median),
            ms(deep_first),
            ms(deep_median),
            ms(stats_first),
            ms(stats_median)
        );
    });
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
