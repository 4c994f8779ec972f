//! `PgDatabase`: one pool and one schema, every piece of that schema from it.

mod common;

use std::time::Duration;

use outbox_adapters_postgres::{PgDatabase, PgSchema};
use outbox_core::NewMessage;
use outbox_ports::{DistributedLock, InboxStore, OutboxStore};

#[tokio::test]
async fn every_piece_of_the_handle_works_on_its_schema() {
    let Some(pool) = common::pool().await else {
        return;
    };
    let name = format!("obt_{}_db", std::process::id());
    let pg = PgDatabase::new(pool.clone(), PgSchema::new(&name).expect("schema"));
    pg.migrate().await.expect("migrate");
    pg.migrate().await.expect("idempotent");

    let mut tx = pool.begin().await.expect("begin");
    pg.producer()
        .enqueue(
            &mut tx,
            NewMessage::new("orders", "order.created", b"{}".to_vec()),
        )
        .await
        .expect("enqueue");
    tx.commit().await.expect("commit");
    assert_eq!(pg.relay_store().stats().await.expect("stats").pending, 1);
    assert_eq!(
        pg.inbox().stats("billing").await.expect("stats").consumed,
        0
    );
    let held = pg
        .lock("relay-1")
        .acquire("k", Duration::from_secs(5), Duration::ZERO)
        .await
        .expect("lock");
    assert!(held.is_some(), "the lock is free in a new schema");
    assert!(pg.lock("relay-2").is_locked("k").await.expect("is locked"));
    assert!(
        pg.lock("relay-2")
            .acquire("k", Duration::from_secs(5), Duration::ZERO)
            .await
            .expect("lock")
            .is_none(),
        "one holder at a time"
    );
    drop(held);
    assert_eq!(pg.schema().as_str(), name);
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA {} CASCADE",
        pg.schema().quoted()
    )))
    .execute(pg.pool())
    .await
    .expect("drop");
}
