//! The headers checks on `outbox_messages` refuse exactly the rows their functions
//! (`outbox_headers_fit_amqp`, `outbox_headers_amqp_size`) refuse, and the usual
//! row never calls those functions: PostgreSQL checks every constraint on every
//! INSERT and every UPDATE (a claim and a mark each rewrite the row), and a call
//! of a function it cannot inline costs a plan a statement and microseconds a row.

mod common;

use outbox_adapters_postgres::{PgPool, PgSchema};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;
use serde_json::{Map, Value};

const FIT: &str = "outbox_messages_headers_amqp";
const SIZE: &str = "outbox_messages_headers_size_amqp";

/// Text of `len` characters drawn from ones of 1 to 4 bytes and ones JSON escapes.
fn text(len: std::ops::RangeInclusive<usize>) -> impl Strategy<Value = String> {
    proptest::collection::vec(
        prop_oneof![
            4 => Just('a'),
            1 => Just('é'),
            1 => Just('€'),
            1 => Just('😀'),
            1 => Just('"'),
            1 => Just('\n'),
        ],
        len,
    )
    .prop_map(|chars| chars.into_iter().collect())
}

/// Header names around every bound the checks know: empty, 63/64 characters (the
/// quick test's), 255/256 bytes (the function's), in characters of 1 to 4 bytes.
fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        1 => Just(String::new()),
        6 => text(1..=8),
        3 => text(60..=66),
        3 => text(62..=130),
        3 => text(240..=260),
        1 => (250_usize..=260).prop_map(|n| "a".repeat(n)),
        // Wide characters only: 64 of 4 bytes are 256 bytes, 86 of 3 are 258.
        1 => (62_usize..=66).prop_map(|n| "😀".repeat(n)),
        1 => (84_usize..=88).prop_map(|n| "€".repeat(n)),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    prop_oneof![
        10 => text(0..=40).prop_map(Value::String),
        1 => any::<i32>().prop_map(Value::from),
        1 => any::<bool>().prop_map(Value::Bool),
        1 => Just(Value::Null),
        1 => text(0..=3).prop_map(|s| Value::Array(vec![Value::String(s)])),
        1 => text(0..=3).prop_map(|s| {
            let mut m = Map::new();
            m.insert("x".into(), Value::String(s));
            Value::Object(m)
        }),
        // Around the AMQP size limit (65,536 bytes as AMQP encodes the headers),
        // with characters JSON escapes, so the text is longer than the AMQP count.
        2 => (65_400_usize..=65_560).prop_map(|n| Value::String("v".repeat(n))),
        1 => (21_780_usize..=21_860).prop_map(|n| Value::String("\"".repeat(n) + "€")),
    ]
}

fn headers() -> impl Strategy<Value = Value> {
    prop_oneof![
        12 => proptest::collection::vec((name(), value()), 0..=4).prop_map(|entries| {
            Value::Object(entries.into_iter().collect())
        }),
        1 => Just(Value::Array(vec![Value::from(1)])),
        1 => Just(Value::String("a".into())),
        1 => Just(Value::Null),
    ]
}

/// What the functions say of `headers`: (fits, size within the limit).
async fn verdict(pool: &PgPool, schema: &PgSchema, headers: &Value) -> (bool, bool) {
    let s = schema.quoted();
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {s}.outbox_headers_fit_amqp($1), {s}.outbox_headers_amqp_size($1) <= 65536"
    )))
    .bind(headers)
    .fetch_one(pool)
    .await
    .expect("the functions answer")
}

#[tokio::test]
async fn the_table_refuses_exactly_the_headers_the_functions_refuse() {
    with_db!(|pool, schema| {
        let mut runner = TestRunner::deterministic();
        let strategy = headers();
        let (mut taken, mut refused_fit, mut refused_size, mut long_names_taken) = (0, 0, 0, 0);
        for case in 0..1_500 {
            let h = strategy.new_tree(&mut runner).expect("a case").current();
            let (fits, small) = verdict(&pool, &schema, &h).await;
            let short = |h: &Value| {
                let t = h.to_string();
                if t.chars().count() > 200 {
                    t.chars().take(200).chain("...".chars()).collect()
                } else {
                    t
                }
            };
            match common::insert_raw(&pool, &schema, "k", &h.to_string())
                .await
                .map_err(|e| e.to_string())
            {
                Ok(_) => {
                    assert!(
                        fits && small,
                        "case {case}: taken, but the functions refuse {}",
                        short(&h)
                    );
                    taken += 1;
                    if h.as_object()
                        .is_some_and(|m| m.keys().any(|k| k.chars().count() >= 64))
                    {
                        long_names_taken += 1;
                    }
                }
                Err(e) => {
                    assert!(
                        !(fits && small),
                        "case {case}: refused, but the functions take {}: {e}",
                        short(&h)
                    );
                    // The constraint named is one whose function refuses.
                    if e.contains(SIZE) {
                        assert!(!small, "case {case}: {e}");
                        refused_size += 1;
                    } else {
                        assert!(e.contains(FIT) && !fits, "case {case}: {e}");
                        refused_fit += 1;
                    }
                }
            }
        }
        // The cases reach every side of every bound.
        assert!(taken >= 300, "taken {taken}");
        assert!(
            long_names_taken >= 30,
            "names of 64+ characters taken {long_names_taken}"
        );
        assert!(refused_fit >= 300, "refused for their form {refused_fit}");
        assert!(refused_size >= 20, "refused for their size {refused_size}");
    });
}

/// Calls of the two headers functions in the current transaction.
async fn calls(conn: &mut sqlx::PgConnection, schema: &PgSchema) -> i64 {
    sqlx::query_scalar(
        "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_xact_user_functions \
         WHERE schemaname = $1 AND funcname IN ('outbox_headers_fit_amqp', 'outbox_headers_amqp_size')",
    )
    .bind(schema.as_str())
    .fetch_one(conn)
    .await
    .expect("function calls")
}

#[tokio::test]
async fn usual_headers_are_checked_without_calling_a_function_on_insert_or_update() {
    with_db!(|pool, schema| {
        let s = schema.quoted();
        let mut tx = pool.begin().await.expect("begin");
        sqlx::query("SET LOCAL track_functions = 'all'")
            .execute(&mut *tx)
            .await
            .expect("track function calls");
        let usual = serde_json::json!({
            "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "tracestate": "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7",
            "tenant": "société-générale",
            "x-request-id": "7c0d5a0e-1f7b-4c4b-9a55-2bd1f5e0d8f1",
        });
        for headers in [serde_json::json!({}), usual] {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO {s}.outbox_messages (exchange, routing_key, headers, payload) \
                 SELECT 'orders', 'k', $1, '\\x00' FROM generate_series(1, 20)"
            )))
            .bind(&headers)
            .execute(&mut *tx)
            .await
            .expect("insert");
        }
        // As a claim and a mark rewrite each row.
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE {s}.outbox_messages SET locked_by = 'relay', locked_until = now()"
        )))
        .execute(&mut *tx)
        .await
        .expect("update");
        assert_eq!(calls(&mut tx, &schema).await, 0);

        // The count can see a call: a name of 100 characters goes to the function.
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {s}.outbox_messages (exchange, routing_key, headers, payload) \
             VALUES ('orders', 'k', jsonb_build_object(repeat('n', 100), 'v'), '\\x00')"
        )))
        .execute(&mut *tx)
        .await
        .expect("a long name that fits");
        assert!(calls(&mut tx, &schema).await >= 1);
        tx.rollback().await.expect("rollback");
    });
}
