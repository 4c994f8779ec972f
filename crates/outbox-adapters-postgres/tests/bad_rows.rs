//! Rows written through the SQL contract that the relay cannot publish: the table
//! refuses them at INSERT, and a row written before a constraint existed is marked
//! dead on its own (a reason naming its column) while every other row is claimed.

mod common;

use std::time::Duration;

use outbox_adapters_postgres::{PgOutbox, PgOutboxStore, PgPool, PgSchema};
use outbox_core::{NewMessage, OutboxStatus};
use outbox_ports::prelude::*;
use outbox_ports::{Lease, OutboxStore};

fn lease(name: &str) -> Lease {
    Lease::new(outbox_testkit::unique_key(name), Duration::from_secs(60))
}

/// Drops the constraints on `outbox_messages` that keep bad rows out, as on a table
/// filled before they existed. Only this test's own schema is touched.
async fn drop_row_constraints(pool: &PgPool, schema: &PgSchema) {
    let names: Vec<String> = sqlx::query_scalar(
        "SELECT conname::text FROM pg_constraint c JOIN pg_class t ON t.oid = c.conrelid \
         JOIN pg_namespace n ON n.oid = t.relnamespace \
         WHERE n.nspname = $1 AND t.relname = 'outbox_messages' AND c.contype = 'c' \
         AND conname LIKE 'outbox\\_messages\\_%\\_amqp'",
    )
    .bind(schema.as_str())
    .fetch_all(pool)
    .await
    .expect("constraint names");
    for name in names {
        // SAFETY-SQL: `name` is a constraint of our migrations, read back from
        // pg_constraint (`outbox_messages_..._amqp`, no `"` in it), quoted.
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "ALTER TABLE {}.outbox_messages DROP CONSTRAINT \"{name}\"",
            schema.quoted()
        )))
        .execute(pool)
        .await
        .expect("drop constraint");
    }
}

async fn enqueue_good(pool: &PgPool, schema: &PgSchema, n: usize) {
    let outbox = PgOutbox::new(schema.clone());
    let mut conn = pool.acquire().await.expect("conn");
    outbox
        .enqueue_batch(
            &mut conn,
            (0..n)
                .map(|i| {
                    NewMessage::new("orders", "order.created", format!("{{\"n\":{i}}}"))
                        .with_header("traceparent", "00-abc-def-01")
                })
                .collect(),
        )
        .await
        .expect("enqueue good rows");
}

#[tokio::test]
async fn a_row_whose_headers_cannot_be_decoded_is_dead_and_the_others_are_claimed() {
    for bad_headers in [r#"{"a": {"b": 1}}"#, "[1, 2]", r#"{"n": 5}"#, "null"] {
        with_db!(|pool, schema| {
            drop_row_constraints(&pool, &schema).await;
            let store = PgOutboxStore::new(pool.clone(), schema.clone());
            enqueue_good(&pool, &schema, 60).await;
            let bad = common::insert_raw(&pool, &schema, "order.created", bad_headers)
                .await
                .expect("a bad row goes in without the constraints");
            enqueue_good(&pool, &schema, 45).await;

            let holder = lease("relay");
            let claimed = store
                .claim_pending(&holder, 200)
                .await
                .unwrap_or_else(|e| panic!("claim with headers {bad_headers}: {e}"));
            assert_eq!(
                claimed.len(),
                105,
                "every good row is claimed ({bad_headers})"
            );
            assert!(claimed.iter().all(|c| c.message.id.as_uuid() != &bad));
            let ids: Vec<_> = claimed.iter().map(|c| c.message.id).collect();
            assert_eq!(store.mark_sent(&holder, &ids).await.expect("mark"), 105);

            let record = store
                .get_message(outbox_core::MessageId::from_uuid(bad))
                .await
                .expect("get");
            // `get` decodes the row too: the bad row reads back, with its reason.
            let record = record.expect("the bad row is still there");
            assert_eq!(record.status, OutboxStatus::Dead, "headers {bad_headers}");
            let reason = record.publish.last_error.unwrap_or_default();
            assert!(
                reason.contains("headers"),
                "reason names the column: {reason}"
            );
            assert!(record.message.headers.is_empty());

            // Nothing is left to claim, and the next claim does not fail either.
            assert!(
                store
                    .claim_pending(&lease("again"), 200)
                    .await
                    .expect("claim")
                    .is_empty()
            );
        });
    }
}

#[tokio::test]
async fn a_bad_row_claimed_by_a_retry_is_dead_too() {
    with_db!(|pool, schema| {
        drop_row_constraints(&pool, &schema).await;
        let store = PgOutboxStore::new(pool.clone(), schema.clone());
        let bad = common::insert_raw(&pool, &schema, "k", "[1, 2]")
            .await
            .expect("bad row");
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE {}.outbox_messages SET status = 'publish_failed', attempts = 1, \
             next_attempt_at = now() - interval '1 second'",
            schema.quoted()
        )))
        .execute(&pool)
        .await
        .expect("make it a due retry");
        let claimed = store
            .claim_due_retries(&lease("sweep"), 10)
            .await
            .expect("claim retries");
        assert!(claimed.is_empty());
        let r = store
            .get_message(outbox_core::MessageId::from_uuid(bad))
            .await
            .expect("get")
            .expect("row");
        assert_eq!(r.status, OutboxStatus::Dead);
        assert!(r.publish.last_error.unwrap_or_default().contains("headers"));
    });
}

/// The error of an INSERT, as text (panics when it succeeds).
async fn refused(pool: &PgPool, schema: &PgSchema, columns: &str, values: &str) -> String {
    match sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {}.outbox_messages (exchange, routing_key, payload, {columns}) \
         VALUES ('orders', 'k', '\\x00', {values})",
        schema.quoted()
    )))
    .execute(pool)
    .await
    {
        Ok(_) => panic!("the table took ({columns}) = ({values})"),
        Err(e) => e.to_string(),
    }
}

#[tokio::test]
async fn the_table_refuses_rows_amqp_cannot_carry() {
    with_db!(|pool, schema| {
        let long = "'".to_owned() + &"x".repeat(256) + "'";
        // 128 two-byte characters: 256 bytes, over the limit though only 128 long.
        let wide = "'".to_owned() + &"é".repeat(128) + "'";
        for (column, value, names) in [
            ("exchange", long.as_str(), "exchange"),
            ("routing_key", wide.as_str(), "routing_key"),
            ("message_type", long.as_str(), "message_type"),
            ("content_type", long.as_str(), "content_type"),
            ("correlation_id", long.as_str(), "correlation_id"),
            ("source", long.as_str(), "source"),
            ("headers", r#"'{"a": {"b": 1}}'"#, "headers"),
            ("headers", "'[1, 2]'", "headers"),
            ("headers", r#"'{"n": 5}'"#, "headers"),
            ("headers", "'null'", "headers"),
        ] {
            // exchange and routing_key are already in the column list: override them.
            let err = match column {
                "exchange" | "routing_key" => match sqlx::query(sqlx::AssertSqlSafe(format!(
                    "INSERT INTO {}.outbox_messages ({column}, {}, payload) VALUES ({value}, 'k', '\\x00')",
                    schema.quoted(),
                    if column == "exchange" { "routing_key" } else { "exchange" }
                )))
                .execute(&pool)
                .await
                {
                    Ok(_) => panic!("the table took {column} = {value}"),
                    Err(e) => e.to_string(),
                },
                _ => refused(&pool, &schema, column, value).await,
            };
            assert!(
                err.contains(&format!("outbox_messages_{names}_amqp")),
                "{column} = {value}: the error names the constraint: {err}"
            );
        }
        let long_name = format!(r#"'{{"{}": "v"}}'"#, "h".repeat(256));
        let err = refused(&pool, &schema, "headers", &long_name).await;
        assert!(err.contains("outbox_messages_headers_amqp"), "{err}");

        // At the limits, everything goes in.
        let at_limit = "x".repeat(255);
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {}.outbox_messages (exchange, routing_key, message_type, content_type, \
             correlation_id, source, headers, payload) VALUES ($1, $1, $1, $1, $1, $1, $2::jsonb, '\\x00')",
            schema.quoted()
        )))
        .bind(&at_limit)
        .bind(format!(r#"{{"{at_limit}": "{}"}}"#, "v".repeat(1000)))
        .execute(&pool)
        .await
        .expect("values at the limits are taken");
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {}.outbox_messages (exchange, routing_key, payload) VALUES ('', 'q', '\\x00')",
            schema.quoted()
        )))
        .execute(&pool)
        .await
        .expect("the smallest insert of the contract still works");
    });
}

#[tokio::test]
async fn enqueue_names_the_field_amqp_cannot_carry() {
    with_db!(|pool, schema| {
        let outbox = PgOutbox::new(schema.clone());
        let mut conn = pool.acquire().await.expect("conn");
        let err = outbox
            .enqueue(
                &mut conn,
                NewMessage::new("orders", "k".repeat(300), b"{}".to_vec()),
            )
            .await
            .expect_err("refused");
        assert!(err.to_string().contains("routing_key"), "{err}");
    });
}

/// Inserts one row through plain SQL with `created_at` and `headers` given as SQL
/// expressions (trusted test text, not input).
async fn insert_raw_expr(
    pool: &PgPool,
    schema: &PgSchema,
    created_at: &str,
    headers: &str,
) -> uuid::Uuid {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {}.outbox_messages (exchange, routing_key, headers, payload, created_at) \
         VALUES ('orders', 'order.created', {headers}, '\\x7b7d', {created_at}) RETURNING id",
        schema.quoted()
    )))
    .fetch_one(pool)
    .await
    .unwrap_or_else(|e| panic!("insert created_at = {created_at}, headers = {headers}: {e}"))
}

#[tokio::test]
async fn rows_whose_values_cannot_be_read_are_dead_and_reads_never_fail() {
    with_db!(|pool, schema| {
        drop_row_constraints(&pool, &schema).await;
        let store = PgOutboxStore::new(pool.clone(), schema.clone());
        enqueue_good(&pool, &schema, 10).await;
        let deep = format!("'{}1{}'::jsonb", r#"{"a":"#.repeat(200), "}".repeat(200));
        // (created_at, headers, the column the reason must name)
        let cases = [
            ("'infinity'::timestamptz", "'{}'::jsonb", "created_at"),
            ("'-infinity'::timestamptz", "'{}'::jsonb", "created_at"),
            // Milliseconds taken for seconds: the year 55,000 or so.
            ("to_timestamp(1700000000000)", "'{}'::jsonb", "created_at"),
            (
                "'20000-01-01 00:00:00+00'::timestamptz",
                "'{}'::jsonb",
                "created_at",
            ),
            ("now()", deep.as_str(), "headers"),
            ("now()", r#"'{"n": 1e400}'::jsonb"#, "headers"),
        ];
        let mut bad = Vec::new();
        for (created_at, headers, column) in cases {
            bad.push((
                insert_raw_expr(&pool, &schema, created_at, headers).await,
                column,
            ));
        }
        enqueue_good(&pool, &schema, 10).await;

        // Readiness and metrics read the oldest unsent row: never a panic or an error.
        let stats = store.stats().await.expect("stats with unreadable rows");
        assert_eq!(stats.pending, 26);
        let oldest = stats.oldest_unsent_at.expect("an oldest readable row");
        assert!(oldest.year() < 10000, "{oldest}");
        let listed = store
            .oldest_messages(OutboxStatus::Pending, 100)
            .await
            .expect("list");
        assert_eq!(listed.len(), 26);
        for (id, _) in &bad {
            store
                .get_message(outbox_core::MessageId::from_uuid(*id))
                .await
                .expect("get an unreadable row")
                .expect("it is there");
        }

        let holder = lease("relay");
        let claimed = store.claim_pending(&holder, 100).await.expect("claim");
        assert_eq!(claimed.len(), 20, "every readable row is claimed");
        let ids: Vec<_> = claimed.iter().map(|c| c.message.id).collect();
        assert_eq!(store.mark_sent(&holder, &ids).await.expect("mark"), 20);

        for (id, column) in &bad {
            let r = store
                .get_message(outbox_core::MessageId::from_uuid(*id))
                .await
                .expect("get")
                .expect("row");
            assert_eq!(r.status, OutboxStatus::Dead, "{column}");
            let reason = r.publish.last_error.unwrap_or_default();
            assert!(reason.contains(column), "reason names {column}: {reason}");
        }
        assert_eq!(
            store
                .oldest_messages(OutboxStatus::Dead, 100)
                .await
                .expect("list")
                .len(),
            6
        );
        let stats = store.stats().await.expect("stats");
        assert_eq!((stats.pending, stats.dead), (0, 6));
        // Failures counted with times that cannot be read (never tried, created at
        // infinity or past the year 9999): no panic, the times unknown.
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE {}.outbox_messages SET last_attempt_at = NULL WHERE status = 'dead'",
            schema.quoted()
        )))
        .execute(&pool)
        .await
        .expect("never tried");
        let counts = outbox_ports::OutboxOperator::failure_groups(&store)
            .await
            .expect("failure counts with unreadable times");
        assert_eq!(counts.iter().map(|c| c.count).sum::<u64>(), 6, "{counts:?}");
        assert!(
            counts
                .iter()
                .any(|c| c.oldest.is_none() && c.newest.is_none()),
            "{counts:?}"
        );
        assert!(
            store
                .claim_pending(&lease("again"), 100)
                .await
                .expect("claim")
                .is_empty()
        );
    });
}

#[tokio::test]
async fn headers_larger_than_an_amqp_frame_allows_are_refused_by_enqueue_and_the_table() {
    with_db!(|pool, schema| {
        let outbox = PgOutbox::new(schema.clone());
        let mut conn = pool.acquire().await.expect("conn");
        let err = outbox
            .enqueue(
                &mut conn,
                NewMessage::new("orders", "k", b"{}".to_vec())
                    .with_header("big", "v".repeat(200 * 1024)),
            )
            .await
            .expect_err("refused");
        assert!(err.to_string().contains("headers"), "{err}");
        drop(conn);

        let big = format!(r#"'{{"big": "{}"}}'"#, "v".repeat(200 * 1024));
        let err = refused(&pool, &schema, "headers", &big).await;
        assert!(err.contains("outbox_messages_headers_size_amqp"), "{err}");
        // Many small headers add up too: each carries 6 bytes of AMQP framing.
        let many = "(SELECT jsonb_object_agg('h' || i, '') FROM generate_series(1, 12000) i)";
        let err = refused(&pool, &schema, "headers", many).await;
        assert!(err.contains("outbox_messages_headers_size_amqp"), "{err}");
        // Just under the limit goes in.
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {}.outbox_messages (exchange, routing_key, headers, payload) \
             VALUES ('orders', 'k', jsonb_build_object('big', repeat('v', $1)), '\\x00')",
            schema.quoted()
        )))
        .bind(i32::try_from(outbox_core::message::MAX_HEADERS_BYTES - 9).expect("fits"))
        .execute(&pool)
        .await
        .expect("headers at the limit are taken");
    });
}

/// Puts `schema` back to where it was before the AMQP limits migration: its
/// constraints, functions and record gone, and the record of the migration that
/// rewrote its headers checks, so that the next `migrate` runs both on a table that
/// already holds rows.
async fn undo_limits_migration(pool: &PgPool, schema: &PgSchema) {
    drop_row_constraints(pool, schema).await;
    let s = schema.quoted();
    for statement in [
        format!("DROP FUNCTION {s}.outbox_headers_fit_amqp(jsonb)"),
        format!("DROP FUNCTION IF EXISTS {s}.outbox_headers_amqp_size(jsonb)"),
        format!(
            "DELETE FROM {s}._sqlx_migrations WHERE version IN (20261201000001, 20261212000001)"
        ),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(&*statement))
            .execute(pool)
            .await
            .unwrap_or_else(|e| panic!("{statement}: {e}"));
    }
}

#[tokio::test]
async fn the_limits_migration_waits_briefly_for_its_lock_adds_constraints_without_a_scan_and_old_bad_rows_still_go_dead()
 {
    with_db!(|pool, schema| {
        undo_limits_migration(&pool, &schema).await;
        // Past 2^31, as a busy outbox soon is: the bound is then a bigint literal,
        // which PostgreSQL prints quoted and cast ('3000000013'::bigint) when the
        // second migration reads it back.
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "ALTER TABLE {}.outbox_messages ALTER seq RESTART WITH 3000000000",
            schema.quoted()
        )))
        .execute(&pool)
        .await
        .expect("restart seq");
        enqueue_good(&pool, &schema, 5).await;
        let long_key = common::insert_raw(&pool, &schema, &"k".repeat(300), "{}")
            .await
            .expect("a long routing key before the constraints");
        let bad_headers = common::insert_raw(&pool, &schema, "k", r#"{"n": 5}"#)
            .await
            .expect("bad headers before the constraints");
        let infinite = insert_raw_expr(&pool, &schema, "'infinity'", "'{}'::jsonb").await;
        let big = insert_raw_expr(
            &pool,
            &schema,
            "now()",
            &format!(r#"'{{"big": "{}"}}'::jsonb"#, "v".repeat(200 * 1024)),
        )
        .await;
        enqueue_good(&pool, &schema, 5).await;

        // A long transaction reading the table: the migration gives up after its
        // lock_timeout instead of queueing every producer behind its lock for as
        // long as that transaction lasts.
        let mut reader = pool.begin().await.expect("begin");
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM {}.outbox_messages",
            schema.quoted()
        )))
        .execute(&mut *reader)
        .await
        .expect("read");
        let started = std::time::Instant::now();
        let blocked = tokio::time::timeout(
            Duration::from_secs(20),
            outbox_adapters_postgres::migrate(&pool, &schema),
        )
        .await
        .expect("the migration gives up on its lock within its lock_timeout");
        let err = blocked.expect_err("no lock, no migration").to_string();
        assert!(err.contains("lock timeout"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(10));
        reader.rollback().await.expect("rollback");

        outbox_adapters_postgres::migrate(&pool, &schema)
            .await
            .expect("migrate once the table is free");
        // Every limit is there, added NOT VALID: no scan of the table under the lock.
        let constraints: Vec<(String, bool)> = sqlx::query_as(
            "SELECT conname::text, convalidated FROM pg_constraint c \
             JOIN pg_class t ON t.oid = c.conrelid JOIN pg_namespace n ON n.oid = t.relnamespace \
             WHERE n.nspname = $1 AND t.relname = 'outbox_messages' \
             AND conname LIKE 'outbox\\_messages\\_%\\_amqp' ORDER BY 1",
        )
        .bind(schema.as_str())
        .fetch_all(&pool)
        .await
        .expect("constraints");
        let names: Vec<&str> = constraints.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "outbox_messages_content_type_amqp",
                "outbox_messages_correlation_id_amqp",
                "outbox_messages_created_at_amqp",
                "outbox_messages_exchange_amqp",
                "outbox_messages_headers_amqp",
                "outbox_messages_headers_size_amqp",
                "outbox_messages_message_type_amqp",
                "outbox_messages_routing_key_amqp",
                "outbox_messages_source_amqp",
            ]
        );
        assert!(
            constraints.iter().all(|(_, valid)| !valid),
            "{constraints:?}"
        );
        // The headers checks, rewritten by the second migration, exempt the same
        // rows as the others: every bound is the highest seq before the limits.
        let bounds: Vec<String> = sqlx::query_scalar(
            "SELECT substring(pg_get_constraintdef(c.oid) FROM E'\\\\(seq <= ''?(\\\\d+)') \
             FROM pg_constraint c JOIN pg_class t ON t.oid = c.conrelid \
             JOIN pg_namespace n ON n.oid = t.relnamespace \
             WHERE n.nspname = $1 AND t.relname = 'outbox_messages' \
             AND conname LIKE 'outbox\\_messages\\_%\\_amqp'",
        )
        .bind(schema.as_str())
        .fetch_all(&pool)
        .await
        .expect("bounds");
        let highest: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT max(seq) FROM {}.outbox_messages",
            schema.quoted()
        )))
        .fetch_one(&pool)
        .await
        .expect("highest seq");
        assert_eq!(bounds, vec![highest.to_string(); 9], "{bounds:?}");
        // New rows are held to them all the same.
        let err = refused(&pool, &schema, "created_at", "'infinity'").await;
        assert!(err.contains("outbox_messages_created_at_amqp"), "{err}");

        // The old bad rows are claimed and marked dead: no CHECK refuses the UPDATE.
        let store = PgOutboxStore::new(pool.clone(), schema.clone());
        let holder = lease("relay");
        let claimed = store.claim_pending(&holder, 100).await.expect("claim");
        // The long routing key decodes; the relay (check_amqp) makes it dead.
        assert_eq!(claimed.len(), 12);
        assert!(claimed.iter().any(|c| c.message.id.as_uuid() == &long_key));
        for (id, column) in [(bad_headers, "headers"), (infinite, "created_at")] {
            let r = store
                .get_message(outbox_core::MessageId::from_uuid(id))
                .await
                .expect("get")
                .expect("row");
            assert_eq!(r.status, OutboxStatus::Dead, "{column}");
            assert!(r.publish.last_error.unwrap_or_default().contains(column));
        }
        let failures: Vec<_> = claimed
            .iter()
            .filter(|c| [long_key, big].contains(c.message.id.as_uuid()))
            .map(|c| outbox_ports::PublishFailure {
                id: c.message.id,
                error: c
                    .message
                    .check_amqp()
                    .expect_err("cannot be carried")
                    .to_string(),
                decision: outbox_core::Decision::Dead,
            })
            .collect();
        assert_eq!(failures.len(), 2);
        assert_eq!(
            store
                .mark_publish_failed(&holder, &failures)
                .await
                .expect("marking an old bad row dead passes the constraints"),
            2
        );
    });
}
