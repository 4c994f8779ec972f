//! Inbox retention costs the rows it deletes, not the whole inbox: with 300,000 old
//! consumed rows of another consumer and 50,000 recent ones of its own, one
//! consumer's retention statement is served by the `inbox_retention` index on
//! (consumer, consumed_at).

mod common;

use std::time::Duration;

use outbox_adapters_postgres::PgInboxStore;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_retention_reads_only_its_own_consumers_rows() {
    with_db!(|pool, schema| {
        let inbox = PgInboxStore::new(pool.clone(), &schema);
        let t = format!("{}.outbox_inbox", schema.quoted());
        for (n, consumer, age) in [
            (300_000_i64, "other", "30 days"),
            (100, "billing", "30 days"),
            (50_000, "billing", "1 minute"),
        ] {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO {t} (consumer, message_id, exchange, routing_key, payload, \
                 created_at, status, consumed_at) \
                 SELECT $2, gen_random_uuid(), 'scale', 'k', '\\x00'::bytea, now(), \
                   'consumed', now() - $3::interval \
                 FROM generate_series(1, $1)"
            )))
            .bind(n)
            .bind(consumer)
            .bind(age)
            .execute(&pool)
            .await
            .expect("fill");
        }
        sqlx::query(sqlx::AssertSqlSafe(format!("ANALYZE {t}")))
            .execute(&pool)
            .await
            .expect("analyze");
        let plan = inbox
            .explain_retention("billing", Duration::from_secs(3600), 5_000)
            .await
            .expect("explain");
        eprintln!("{plan}");
        // The rows to delete are found on inbox_retention; the DELETE then reaches
        // each by its seq (a point lookup, whichever index), never by a walk over
        // other consumers' old rows (inbox_consumed_at) or its own recent ones.
        assert!(
            plan.contains("Index Scan using inbox_retention"),
            "the rows to delete are not found on inbox_retention (consumer, consumed_at):\n{plan}"
        );
        assert!(
            !plan.contains("inbox_consumed_at") && !plan.contains("Seq Scan"),
            "retention walks rows it does not delete:\n{plan}"
        );
        for line in plan.lines().filter(|l| l.contains("inbox_consumer_seq")) {
            assert!(
                !line.contains("Bitmap"),
                "walks all of its consumer's rows:\n{plan}"
            );
        }
        assert_eq!(
            inbox
                .delete_consumed_older_than("billing", Duration::from_secs(3600), 5_000)
                .await
                .expect("retention"),
            100
        );
    });
}

/// The admin API's consumer counts read the unsent states and dead letters through
/// their partial indexes, never the consumed rows (here 350,000).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_counts_never_read_the_consumed_rows() {
    with_db!(|pool, schema| {
        let inbox = PgInboxStore::new(pool.clone(), &schema);
        let t = format!("{}.outbox_inbox", schema.quoted());
        for (n, status) in [
            (350_000_i64, "consumed"),
            (7, "dead"),
            (5, "consume_failed"),
        ] {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO {t} (consumer, message_id, exchange, routing_key, payload, \
                 created_at, status, consumed_at, next_attempt_at) \
                 SELECT 'billing', gen_random_uuid(), 'scale', 'k', '\\x00'::bytea, now(), $2, \
                   CASE WHEN $2 = 'consumed' THEN now() END, \
                   CASE WHEN $2 = 'consume_failed' THEN now() END \
                 FROM generate_series(1, $1)"
            )))
            .bind(n)
            .bind(status)
            .execute(&pool)
            .await
            .expect("fill");
        }
        sqlx::query(sqlx::AssertSqlSafe(format!("ANALYZE {t}")))
            .execute(&pool)
            .await
            .expect("analyze");
        let plan = inbox
            .explain_consumer_counts("billing")
            .await
            .expect("explain");
        eprintln!("{plan}");
        assert!(!plan.contains("Seq Scan"), "scans the inbox:\n{plan}");
        // No step of the plan reads more rows than the unsent ones.
        for line in plan.lines() {
            if let Some(rows) = line
                .split("actual rows=")
                .nth(1)
                .and_then(|r| r.split_whitespace().next())
                .and_then(|r| r.parse::<f64>().ok())
            {
                assert!(rows <= 12.0, "reads {rows} rows in one step:\n{plan}");
            }
        }
        let consumers = outbox_ports::InboxOperator::consumers(&inbox)
            .await
            .expect("consumers");
        let billing = consumers
            .iter()
            .find(|c| c.name == "billing")
            .expect("listed");
        assert_eq!((billing.stats.dead, billing.stats.consume_failed), (7, 5));
        assert!(!billing.consumed_counted);
    });
}
