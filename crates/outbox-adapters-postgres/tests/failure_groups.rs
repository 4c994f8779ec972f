//! Failure groups in PostgreSQL (issue 49): each row keeps the group of its last
//! error, written by the library beside the error and computed by the database
//! (`outbox_failure_group`, a trigger) for rows written by plain SQL. The two
//! computations are one function: equal on the core's examples and on random
//! texts. Groups are whole and exact past 10,000 distinct texts, and a filter by
//! group lists its members only.

mod common;

use outbox_adapters_postgres::{PgInboxStore, PgOutboxStore, PgPool, PgSchema};
use outbox_core::failure_group::failure_group;
use outbox_core::{InboxStatus, OutboxStatus};
use outbox_ports::{DeliveryFilter, InboxOperator, MessageFilter, OutboxOperator};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

/// What the database makes of each text, in one round trip.
async fn database_groups(pool: &PgPool, schema: &PgSchema, texts: &[String]) -> Vec<String> {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT {}.outbox_failure_group(t) FROM unnest($1::text[]) WITH ORDINALITY AS u(t, n) ORDER BY n",
        schema.quoted()
    )))
    .bind(texts)
    .fetch_all(pool)
    .await
    .expect("outbox_failure_group")
}

/// Texts like errors: words, digits, hex, UUIDs, quotes and apostrophes,
/// whitespace of every kind ASCII has and some it does not, non-ASCII letters.
fn error_like() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        "[a-zA-Z_]{1,8}",
        "[0-9]{1,12}",
        "[0-9a-fA-F]{1,70}",
        "0x[0-9a-fA-F]{0,70}",
        "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}[a-z0-9]?",
        Just("\"".to_owned()),
        Just("'".to_owned()),
        "[ \t\n\r\u{b}\u{c}\u{a0}\u{2003}]{1,3}",
        "[éßλ→€中-]{1,3}",
        "[.:;,()=<>/…]{1,2}",
    ];
    proptest::collection::vec(piece, 0..24).prop_map(|p| p.concat())
}

#[tokio::test]
async fn the_database_groups_every_text_as_the_core_does() {
    with_db!(|pool, schema| {
        let mut texts: Vec<String> = [
            "exchange \"orders-7\" not found",
            "message 0190a3c4-5b6d-7e8f-9a0b-1c2d3e4f5a6b failed after 3 attempts",
            "timeout after 30s on 10.0.0.7:5672",
            "key 'customer-42' is held",
            "couldn't reach 'db1'",
            "  two   spaces\tand a tab  ",
            "trace deadbeef01 broken",
            "at 0x7f3a9c00 and 0xFF",
            "v2 of handler abc123 refused cafe",
            "unterminated \"quote runs on",
            "7\"x\" then 12'y'",
            "",
            "\u{a0}non-breaking 5\u{a0}",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        texts.push("a-1-".repeat(2_000)); // past the 4,096 characters looked at
        texts.push("a1".repeat(40)); // a hex word longer than the lookahead
        texts.push(format!("{}9", "0".repeat(70)));
        let mut runner = TestRunner::new(Config {
            cases: 3_000,
            ..Config::default()
        });
        let strategy = error_like();
        for _ in 0..3_000 {
            let tree = strategy.new_tree(&mut runner).expect("a random text");
            texts.push(proptest::strategy::ValueTree::current(&tree));
        }
        let from_db = database_groups(&pool, &schema, &texts).await;
        let mut differ = Vec::new();
        for (text, db) in texts.iter().zip(&from_db) {
            let rust = failure_group(text);
            if rust != *db {
                differ.push(format!("{text:?}: rust {rust:?}, database {db:?}"));
            }
        }
        assert!(
            differ.is_empty(),
            "{} of {} texts grouped differently, e.g. {:?}",
            differ.len(),
            texts.len(),
            &differ[..differ.len().min(5)]
        );
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_are_whole_and_exact_past_ten_thousand_texts_also_for_plain_sql_rows() {
    with_db!(|pool, schema| {
        let store = PgOutboxStore::new(pool.clone(), schema.clone());
        let t = format!("{}.outbox_messages", schema.quoted());
        // 12,000 dead rows of one cause whose every text differs, written by plain
        // SQL (no error_group given: the trigger computes it), 500 of another
        // cause, 3 sent rows that once failed so, and 1,000 pending.
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {t} (exchange, routing_key, payload, status, attempts, last_error) \
             SELECT 'big', 'k', '\\x00'::bytea, 'dead', 1, \
               'PRECONDITION_FAILED - message size ' || (1000 + i) || ' is larger than max' \
             FROM generate_series(1, 12000) AS i"
        )))
        .execute(&pool)
        .await
        .expect("fill dead");
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {t} (exchange, routing_key, payload, status) \
             SELECT 'big', 'k', '\\x00'::bytea, 'pending' FROM generate_series(1, 1500)"
        )))
        .execute(&pool)
        .await
        .expect("fill pending");
        // An UPDATE by plain SQL: 500 pending rows fail with texts of another cause,
        // 3 get the same text but are sent (not a failure any more).
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE {t} SET status = 'publish_failed', attempts = 1, \
               last_error = 'exchange \"orders-' || seq || '\" not found' \
             WHERE seq IN (SELECT seq FROM {t} WHERE status = 'pending' ORDER BY seq LIMIT 500)"
        )))
        .execute(&pool)
        .await
        .expect("fail by plain SQL");
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE {t} SET status = 'sent', sent_at = now(), last_error = 'exchange \"x\" not found' \
             WHERE seq IN (SELECT seq FROM {t} WHERE status = 'pending' ORDER BY seq LIMIT 3)"
        )))
        .execute(&pool)
        .await
        .expect("sent after failing");

        let groups = store.failure_groups().await.expect("groups");
        let mine: Vec<(String, String, u64)> = groups
            .iter()
            .map(|g| (g.place.clone(), g.error.clone(), g.count))
            .collect();
        assert_eq!(
            mine,
            vec![
                (
                    "big".to_owned(),
                    "PRECONDITION_FAILED - message size <n> is larger than max".to_owned(),
                    12_000
                ),
                ("big".to_owned(), "exchange \"…\" not found".to_owned(), 500),
            ],
            "every cause a group, counted exactly"
        );
        let members = MessageFilter {
            exchange: Some("big".into()),
            error_group: Some("exchange \"…\" not found".into()),
            ..MessageFilter::default()
        };
        assert_eq!(
            store
                .count_messages(&members, u64::MAX)
                .await
                .expect("count"),
            503,
            "the failing members and the sent rows whose last error is in the group"
        );
        let failing = MessageFilter {
            status: Some(OutboxStatus::PublishFailed),
            ..members.clone()
        };
        assert_eq!(
            store
                .count_messages(&failing, u64::MAX)
                .await
                .expect("count"),
            500
        );
        let page = store
            .list_messages(&failing, None, 1_000)
            .await
            .expect("page");
        assert_eq!(page.items.len(), 500);
        assert!(
            page.items.iter().all(
                |m| failure_group(m.last_error.as_deref().unwrap_or_default())
                    == "exchange \"…\" not found"
            ),
            "a group's list holds that cause only"
        );
        // Changing the text by plain SQL moves the row to its new group.
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE {t} SET last_error = 'connection reset' \
             WHERE seq = (SELECT min(seq) FROM {t} WHERE status = 'publish_failed')"
        )))
        .execute(&pool)
        .await
        .expect("a new text");
        assert_eq!(
            store
                .count_messages(&failing, u64::MAX)
                .await
                .expect("count"),
            499
        );
        let regrouped = store.failure_groups().await.expect("groups");
        assert!(
            regrouped
                .iter()
                .any(|g| g.error == "connection reset" && g.count == 1),
            "{regrouped:?}"
        );
    });
}

#[tokio::test]
async fn the_inbox_groups_plain_sql_rows_too() {
    with_db!(|pool, schema| {
        let inbox = PgInboxStore::new(pool.clone(), &schema);
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {}.outbox_inbox (consumer, message_id, exchange, routing_key, payload, \
               created_at, status, attempts, last_error) \
             SELECT 'billing', gen_random_uuid(), 'orders', 'k', '\\x00'::bytea, now(), 'dead', 1, \
               'row ' || i || ' of \"invoices\" is locked' FROM generate_series(1, 30) AS i",
            schema.quoted()
        )))
        .execute(&pool)
        .await
        .expect("fill");
        let groups = inbox.failure_groups().await.expect("groups");
        assert_eq!(groups.len(), 1, "{groups:?}");
        assert_eq!(
            (
                groups[0].place.as_str(),
                groups[0].error.as_str(),
                groups[0].count
            ),
            ("billing", "row <n> of \"…\" is locked", 30)
        );
        let filter = DeliveryFilter {
            status: Some(InboxStatus::Dead),
            error_group: Some("row <n> of \"…\" is locked".into()),
            ..DeliveryFilter::default()
        };
        assert_eq!(
            inbox
                .count_deliveries("billing", &filter, u64::MAX)
                .await
                .expect("count"),
            30
        );
    });
}

/// An error of 4 KB of random text (its group as long, past what a btree entry
/// may hold) is marked like any other: the mark succeeds, the row is grouped
/// and found by its group. Failed with the group's text indexed as it is
/// (`index row size ... exceeds btree version 4 maximum 2704`): every mark of
/// the batch failed with it.
#[tokio::test]
async fn a_four_kilobyte_error_is_marked_grouped_and_found() {
    use outbox_ports::{Lease, OutboxRelayPath, OutboxStore, PublishFailure};
    with_db!(|pool, schema| {
        let store = PgOutboxStore::new(pool.clone(), schema.clone());
        let mut rng = TestRunner::deterministic();
        let noise = proptest::string::string_regex("[A-Za-z+/=!#%&()*,.:;<>?@^_|~-]{4000}")
            .expect("regex")
            .new_tree(&mut rng)
            .expect("text");
        let error = proptest::strategy::ValueTree::current(&noise);
        let messages: Vec<_> = (0..2)
            .map(|_| outbox_testkit::message("huge", "k"))
            .collect();
        let ids: Vec<_> = messages.iter().map(|m| m.id).collect();
        store.enqueue(messages).await.expect("enqueue");
        let lease = Lease::new("huge-errors", std::time::Duration::from_secs(60));
        let claimed = store.claim_pending(&lease, 10).await.expect("claim");
        assert_eq!(claimed.len(), 2);
        let failures: Vec<PublishFailure> = ids
            .iter()
            .map(|id| PublishFailure {
                id: *id,
                error: error.clone(),
                decision: outbox_core::Decision::Dead,
            })
            .collect();
        assert_eq!(
            store
                .mark_publish_failed(&lease, &failures)
                .await
                .expect("marked"),
            2,
            "both marked"
        );
        let groups = store.failure_groups().await.expect("groups");
        assert_eq!(groups.len(), 1, "{}", groups.len());
        assert_eq!(groups[0].count, 2);
        let filter = MessageFilter {
            error_group: Some(groups[0].error.clone()),
            ..MessageFilter::default()
        };
        assert_eq!(
            store
                .count_messages(&filter, u64::MAX)
                .await
                .expect("count"),
            2
        );
    });
}

/// Rows that failed before the stored group existed get theirs from the
/// backfill migration, in committed batches (12,003 rows: three batches and a
/// rest), on both tables.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backfill_groups_rows_that_failed_before_the_column() {
    with_db!(|pool, schema| {
        let store = PgOutboxStore::new(pool.clone(), schema.clone());
        let t = format!("{}.outbox_messages", schema.quoted());
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {t} (exchange, routing_key, payload, status, attempts, last_error) \
             SELECT 'old', 'k', '\\x00'::bytea, 'dead', 1, 'queue \"q-' || i || '\" is full' \
             FROM generate_series(1, 12003) AS i"
        )))
        .execute(&pool)
        .await
        .expect("fill");
        // As before the column: no group (an UPDATE of error_group alone fires
        // no trigger).
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE {t} SET error_group = NULL"
        )))
        .execute(&pool)
        .await
        .expect("forget the groups");
        let before = store.failure_groups().await.expect("groups");
        assert_eq!(before[0].error, "", "ungrouped: {before:?}");
        let mut conn = pool.acquire().await.expect("conn");
        sqlx::query("SELECT set_config('search_path', $1, false)")
            .bind(schema.quoted())
            .execute(&mut *conn)
            .await
            .expect("search_path");
        sqlx::raw_sql(include_str!(
            "../migrations/20261222000002_failure_group_backfill.sql"
        ))
        .execute(&mut *conn)
        .await
        .expect("backfill");
        drop(conn.detach());
        let after = store.failure_groups().await.expect("groups");
        assert_eq!(
            after
                .iter()
                .map(|g| (g.error.as_str(), g.count))
                .collect::<Vec<_>>(),
            [("queue \"…\" is full", 12_003)]
        );
    });
}
