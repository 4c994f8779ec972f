//! The inbox's status for a delivery received and not yet handled is `received`
//! (it was `sent`, the outbox's word for confirmed by the broker). The migration
//! rewrites a live inbox of the release before: its rows in progress, its CHECK,
//! its default and its three partial indexes.

mod common;

use std::time::Duration;

use outbox_adapters_postgres::{PgInboxStore, migrate};
use outbox_ports::prelude::*;
use outbox_ports::{InboxStore, Lease};

async fn exec(pool: &sqlx::PgPool, sql: &str) {
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .execute(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// An inbox as the release before left it, with one delivery in progress (plain
/// and keyed), one held behind its key and one consumed; then `outbox migrate`.
#[tokio::test]
async fn the_migration_rewrites_an_inbox_of_the_release_before() {
    with_db!(|pool, schema| {
        let s = schema.quoted();
        let t = format!("{s}.outbox_inbox");
        // Back to the release before: its CHECK, default and indexes, and the two
        // migrations not yet run.
        for sql in [
            format!("ALTER TABLE {t} DROP CONSTRAINT outbox_inbox_status_check"),
            format!(
                "ALTER TABLE {t} ADD CONSTRAINT outbox_inbox_status_check \
                 CHECK (status IN ('sent', 'consumed', 'consume_failed', 'dead'))"
            ),
            format!("ALTER TABLE {t} ALTER COLUMN status SET DEFAULT 'sent'"),
            format!("DROP INDEX {s}.inbox_due"),
            format!("DROP INDEX {s}.inbox_ordered"),
            format!("DROP INDEX {s}.inbox_held"),
            format!(
                "CREATE INDEX inbox_due ON {t} (consumer, next_attempt_at, seq) \
                 WHERE status IN ('sent', 'consume_failed')"
            ),
            format!(
                "CREATE INDEX inbox_ordered ON {t} (consumer, ordering_key, seq) \
                 WHERE ordering_key IS NOT NULL AND status IN ('sent', 'consume_failed')"
            ),
            format!(
                "CREATE INDEX inbox_held ON {t} (consumer, ordering_key, seq) \
                 WHERE status = 'sent' AND next_attempt_at IS NULL AND ordering_key IS NOT NULL"
            ),
            format!("DELETE FROM {s}._sqlx_migrations WHERE version >= 20261215000001"),
        ] {
            exec(&pool, &sql).await;
        }
        let insert = |status: &str, key: &str, next: &str| {
            format!(
                "INSERT INTO {t} (consumer, message_id, exchange, routing_key, headers, payload, \
                 created_at, status, ordering_key, next_attempt_at) \
                 VALUES ('billing', gen_random_uuid(), 'x', 'k', '{{}}'::jsonb, '\\x00'::bytea, \
                 now(), '{status}', {key}, {next})"
            )
        };
        for sql in [
            insert("sent", "NULL", "now()"),
            insert("sent", "'k1'", "now()"),
            insert("sent", "'k1'", "NULL"),
            insert("consumed", "NULL", "NULL"),
        ] {
            exec(&pool, &sql).await;
        }

        migrate(&pool, &schema).await.expect("migrate");

        let statuses: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT status FROM {t} ORDER BY seq"
        )))
        .fetch_all(&pool)
        .await
        .expect("statuses");
        assert_eq!(statuses, ["received", "received", "received", "consumed"]);
        let refused = sqlx::query(sqlx::AssertSqlSafe(&*insert("sent", "NULL", "now()")))
            .execute(&pool)
            .await
            .expect_err("'sent' is no inbox status any more");
        assert!(
            refused.to_string().contains("outbox_inbox_status_check"),
            "{refused}"
        );
        let default: String = sqlx::query_scalar(
            "SELECT pg_get_expr(d.adbin, d.adrelid) FROM pg_attrdef d \
             JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum \
             WHERE d.adrelid = $1::regclass AND a.attname = 'status'",
        )
        .bind(format!("{}.outbox_inbox", schema.as_str()))
        .fetch_one(&pool)
        .await
        .expect("default");
        assert!(default.contains("received"), "{default}");
        let validated: bool = sqlx::query_scalar(
            "SELECT convalidated FROM pg_constraint \
             WHERE conrelid = $1::regclass AND conname = 'outbox_inbox_status_check'",
        )
        .bind(format!("{}.outbox_inbox", schema.as_str()))
        .fetch_one(&pool)
        .await
        .expect("constraint");
        assert!(validated, "the CHECK is validated by the second migration");
        for index in ["inbox_due", "inbox_ordered", "inbox_held"] {
            let def: String = sqlx::query_scalar("SELECT pg_get_indexdef($1::regclass)")
                .bind(format!("{}.{index}", schema.as_str()))
                .fetch_one(&pool)
                .await
                .unwrap_or_else(|e| panic!("{index}: {e}"));
            assert!(
                def.contains("'received'") && !def.contains("'sent'"),
                "{index}: {def}"
            );
        }

        // The store reads and moves the rewritten rows: the plain delivery in
        // progress is claimed by the consume sweep once its lease is gone.
        let inbox = PgInboxStore::new(pool.clone(), &schema);
        let stats = inbox.stats("billing").await.expect("stats");
        assert_eq!((stats.received, stats.consumed), (3, 1), "{stats:?}");
        let sweep = Lease::new("sweep", Duration::from_secs(60));
        let due = inbox.claim_due("billing", &sweep, 10).await.expect("claim");
        assert!(
            due.iter().any(|d| d.message.ordering_key.is_none()),
            "the plain delivery in progress is due: {due:?}"
        );
    })
}

/// An index a failed `CREATE INDEX CONCURRENTLY` left INVALID under the name the
/// migration looks for is refused, naming it, not renamed into place; dropped,
/// the migration goes through.
#[tokio::test]
async fn an_invalid_index_built_ahead_is_refused_not_renamed_into_place() {
    with_db!(|pool, schema| {
        let s = schema.quoted();
        let t = format!("{s}.outbox_inbox");
        for sql in [
            format!("DELETE FROM {s}._sqlx_migrations WHERE version >= 20261215000001"),
            insert_two_of_one_consumer(&t),
        ] {
            exec(&pool, &sql).await;
        }
        // UNIQUE over two rows of one consumer fails half way: INVALID is left.
        let failed = sqlx::query(sqlx::AssertSqlSafe(format!(
            "CREATE UNIQUE INDEX CONCURRENTLY inbox_due_received ON {t} (consumer)"
        )))
        .execute(&pool)
        .await;
        assert!(failed.is_err(), "the concurrent build fails");
        let refused = migrate(&pool, &schema).await.expect_err("an invalid index");
        assert!(
            refused.to_string().contains("inbox_due_received"),
            "{refused}"
        );
        exec(&pool, &format!("DROP INDEX {s}.inbox_due_received")).await;
        migrate(&pool, &schema).await.expect("migrate");
        let def: String = sqlx::query_scalar("SELECT pg_get_indexdef($1::regclass)")
            .bind(format!("{}.inbox_due", schema.as_str()))
            .fetch_one(&pool)
            .await
            .expect("inbox_due");
        assert!(def.contains("'received'"), "{def}");
    })
}

fn insert_two_of_one_consumer(t: &str) -> String {
    format!(
        "INSERT INTO {t} (consumer, message_id, exchange, routing_key, headers, payload, \
         created_at, status) \
         SELECT 'billing', gen_random_uuid(), 'x', 'k', '{{}}'::jsonb, '\\x00'::bytea, now(), \
         'consumed' FROM generate_series(1, 2)"
    )
}
