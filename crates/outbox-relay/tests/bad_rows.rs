//! Rows AMQP cannot carry, written through the SQL contract before the table's
//! constraints existed, relayed over the real PostgreSQL and RabbitMQ: each is dead
//! at once with a reason naming its column, every other row is confirmed and sent,
//! and nothing panics.

use outbox_ports::OutboxOperator as _;
use std::time::Duration;

use outbox_adapters_postgres::{PgOutbox, PgOutboxStore, PgPool, PgSchema, connect, migrate};
use outbox_adapters_rabbitmq::{
    BindingSpec, ExchangeKind, ExchangeSpec, QueueSpec, RabbitPublisher, RabbitPublisherConfig,
    Topology,
};
use outbox_core::{MessageId, NewMessage, OutboxStatus};
use outbox_relay::{Dispatcher, DispatcherConfig};
use std::sync::Arc;

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

async fn services() -> Option<(PgPool, PgSchema, lapin::Connection, String)> {
    let urls = outbox_testkit::services::TestUrls::from_env();
    let (db, amqp) = (urls.pg, urls.amqp);
    let pool = connect(&db, 4, Duration::from_secs(5)).await;
    let conn = outbox_adapters_rabbitmq::connect(&amqp, Duration::from_secs(5)).await;
    let (pool, conn) = match (pool, conn) {
        (Ok(p), Ok(c)) => (p, c),
        (p, c) if in_ci() => panic!(
            "PostgreSQL and RabbitMQ are required in CI: {:?} / {:?}",
            p.err(),
            c.err()
        ),
        _ => {
            eprintln!("SKIPPED (not in CI): PostgreSQL or RabbitMQ unreachable");
            return None;
        }
    };
    let id = outbox_testkit::unique_key("badrows").replace(['.', '-'], "_");
    let schema = PgSchema::new(&format!("br_{}", &id[id.len() - 20..])).expect("schema");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS {} CASCADE",
        schema.quoted()
    )))
    .execute(&pool)
    .await
    .expect("drop");
    migrate(&pool, &schema).await.expect("migrate");
    // Rows "written before a constraint existed": this schema's table has none.
    let names: Vec<String> = sqlx::query_scalar(
        "SELECT conname::text FROM pg_constraint c JOIN pg_class t ON t.oid = c.conrelid \
         JOIN pg_namespace n ON n.oid = t.relnamespace \
         WHERE n.nspname = $1 AND t.relname = 'outbox_messages' AND c.contype = 'c' \
         AND conname LIKE 'outbox\\_messages\\_%\\_amqp'",
    )
    .bind(schema.as_str())
    .fetch_all(&pool)
    .await
    .expect("constraints");
    for name in names {
        // SAFETY-SQL: `name` is a constraint of our migrations, read back from
        // pg_constraint (`outbox_messages_..._amqp`, no `"` in it), quoted.
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "ALTER TABLE {}.outbox_messages DROP CONSTRAINT \"{name}\"",
            schema.quoted()
        )))
        .execute(&pool)
        .await
        .expect("drop constraint");
    }
    Some((pool, schema, conn, amqp))
}

#[tokio::test]
async fn rows_amqp_cannot_carry_are_dead_at_once_and_the_others_are_sent() {
    let Some((pool, schema, conn, amqp)) = services().await else {
        return;
    };
    let key = outbox_testkit::unique_key("bad-rows");
    let exchange = format!("outbox-test.{key}.x");
    let queue = format!("outbox-test.{key}.q");
    Topology {
        exchanges: vec![ExchangeSpec {
            name: exchange.clone(),
            kind: ExchangeKind::Topic,
            durable: false,
            shards: 1,
        }],
        queues: vec![QueueSpec::durable(&queue)],
        bindings: vec![BindingSpec {
            queue: queue.clone(),
            exchange: exchange.clone(),
            routing_key: "#".into(),
        }],
    }
    .declare(&conn)
    .await
    .expect("topology");

    let outbox = PgOutbox::new(schema.clone());
    let mut c = pool.acquire().await.expect("conn");
    let good = |n: usize| -> Vec<NewMessage> {
        (0..n)
            .map(|i| NewMessage::new(exchange.clone(), "order.created", format!("{{\"n\":{i}}}")))
            .collect()
    };
    let mut good_ids = outbox.enqueue_batch(&mut c, good(50)).await.expect("good");
    // One bad row per column, in the middle of the good ones, by plain SQL.
    let long = "k".repeat(300);
    let bad_rows: [(&str, &str); 4] = [
        (
            "routing_key",
            "INSERT INTO {t} (exchange, routing_key, payload) VALUES ($1, $2, '\\x00') RETURNING id",
        ),
        (
            "message_type",
            "INSERT INTO {t} (exchange, routing_key, message_type, payload) VALUES ($1, 'k', $2, '\\x00') RETURNING id",
        ),
        (
            "headers",
            "INSERT INTO {t} (exchange, routing_key, headers, payload) VALUES ($1, 'k', jsonb_build_object($2::text, 'v'), '\\x00') RETURNING id",
        ),
        (
            "correlation_id",
            "INSERT INTO {t} (exchange, routing_key, correlation_id, payload) VALUES ($1, 'k', $2, '\\x00') RETURNING id",
        ),
    ];
    let table = format!("{}.outbox_messages", schema.quoted());
    let mut bad = Vec::new();
    for (column, sql) in bad_rows {
        let id: uuid::Uuid = sqlx::query_scalar(sqlx::AssertSqlSafe(&*sql.replace("{t}", &table)))
            .bind(&exchange)
            .bind(&long)
            .fetch_one(&pool)
            .await
            .expect("bad row");
        bad.push((column, MessageId::from_uuid(id)));
    }
    good_ids.extend(outbox.enqueue_batch(&mut c, good(53)).await.expect("good"));
    drop(c);

    let store = Arc::new(PgOutboxStore::new(pool.clone(), schema.clone()));
    let publisher = Arc::new(RabbitPublisher::new(RabbitPublisherConfig::new(amqp)));
    let dispatcher = Dispatcher::new(
        store.clone(),
        publisher,
        DispatcherConfig {
            batch_size: 200,
            ..DispatcherConfig::default()
        },
        "bad-rows-test",
    );
    let counts = tokio::time::timeout(Duration::from_secs(60), dispatcher.run_once())
        .await
        .expect("the batch finishes")
        .expect("the batch is recorded");
    assert_eq!(counts.claimed, 107, "{counts:?}");
    assert_eq!(counts.sent, 103, "{counts:?}");
    assert_eq!(counts.dead, 4, "{counts:?}");
    for id in &good_ids {
        let r = store.get_message(*id).await.expect("get").expect("row");
        assert_eq!(r.status, OutboxStatus::Sent);
    }
    for (column, id) in bad {
        let r = store.get_message(id).await.expect("get").expect("row");
        assert_eq!(r.status, OutboxStatus::Dead, "the {column} row");
        let reason = r.publish.last_error.unwrap_or_default();
        assert!(
            reason.contains(column),
            "the reason names {column}: {reason}"
        );
    }
    // Exactly the good ones reached the queue.
    let ch = conn.create_channel().await.expect("channel");
    let q = ch
        .queue_declare(
            queue.as_str().into(),
            lapin::options::QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            lapin::types::FieldTable::default(),
        )
        .await
        .expect("passive declare");
    assert_eq!(q.message_count(), 103);
    let _ = ch
        .queue_delete(queue.as_str().into(), Default::default())
        .await;
    let _ = ch
        .exchange_delete(exchange.as_str().into(), Default::default())
        .await;
    let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA {} CASCADE",
        schema.quoted()
    )))
    .execute(&pool)
    .await;
}
