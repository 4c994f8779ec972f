//! The dashboard's session store (feature `ui-sessions`) against PostgreSQL: create,
//! save, load, an expired session not loaded, delete, and the deletion of expired
//! rows (`cargo test -p outbox-adapters-postgres --features ui-sessions --test ui_sessions`).
#![cfg(feature = "ui-sessions")]

mod common;

use std::collections::HashMap;

use outbox_adapters_postgres::{
    PgPool, PgSchema, PgUiSessionStore, UI_SESSIONS_TABLE, delete_expired_ui_sessions, ui_sessions,
};
use time::{Duration, OffsetDateTime};
use tower_sessions_core::session::{Id, Record};
use tower_sessions_core::session_store::{ExpiredDeletion, SessionStore};

fn record(expiry_date: OffsetDateTime, actor: &str) -> Record {
    Record {
        id: Id::default(),
        data: HashMap::from([
            ("actor".to_owned(), serde_json::json!(actor)),
            (
                "role".to_owned(),
                serde_json::json!({"write": true, "n": 3}),
            ),
        ]),
        // PostgreSQL keeps microseconds: a record read back compares equal.
        expiry_date: expiry_date.replace_nanosecond(0).expect("whole seconds"),
    }
}

fn in_an_hour() -> OffsetDateTime {
    OffsetDateTime::now_utc() + Duration::hours(1)
}

async fn rows(pool: &PgPool, schema: &PgSchema) -> Vec<(String, OffsetDateTime)> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT id, expiry_date FROM {}.{UI_SESSIONS_TABLE} ORDER BY id",
        schema.quoted()
    )))
    .fetch_all(pool)
    .await
    .expect("the sessions' rows")
}

fn store(pool: &PgPool, schema: &PgSchema) -> PgUiSessionStore {
    ui_sessions(pool.clone(), schema).expect("a store")
}

#[tokio::test]
async fn create_save_load_delete() {
    with_db!(|pool, schema| {
        let store = store(&pool, &schema);
        let mut first = record(in_an_hour(), "ops-alice");
        store.create(&mut first).await.expect("create");
        assert_eq!(
            store.load(&first.id).await.expect("load"),
            Some(first.clone())
        );
        // The row: the id's text, the expiry in its column.
        assert_eq!(
            rows(&pool, &schema).await,
            vec![(first.id.to_string(), first.expiry_date)]
        );

        // save overwrites data and expiry.
        first
            .data
            .insert("csrf".to_owned(), serde_json::json!("nonce"));
        first.expiry_date += Duration::minutes(5);
        store.save(&first).await.expect("save");
        assert_eq!(
            store.load(&first.id).await.expect("load"),
            Some(first.clone())
        );

        // create never overwrites: a taken id gets a fresh one.
        let mut clash = record(in_an_hour(), "ops-bob");
        clash.id = first.id;
        store.create(&mut clash).await.expect("create");
        assert_ne!(clash.id, first.id, "a fresh id");
        assert_eq!(
            store.load(&first.id).await.expect("load"),
            Some(first.clone())
        );
        assert_eq!(
            store.load(&clash.id).await.expect("load"),
            Some(clash.clone())
        );

        // save of a new id inserts.
        let saved = record(in_an_hour(), "ops-carol");
        store.save(&saved).await.expect("save");
        assert_eq!(
            store.load(&saved.id).await.expect("load"),
            Some(saved.clone())
        );

        store.delete(&first.id).await.expect("delete");
        assert_eq!(store.load(&first.id).await.expect("load"), None);
        // Deleting what is not there is no error.
        store.delete(&first.id).await.expect("delete again");
        assert_eq!(store.load(&Id::default()).await.expect("load"), None);
        assert_eq!(rows(&pool, &schema).await.len(), 2, "the other two kept");
    });
}

#[tokio::test]
async fn expired_sessions_are_not_loaded_and_are_deleted() {
    with_db!(|pool, schema| {
        let store = store(&pool, &schema);
        let mut live = record(in_an_hour(), "live");
        let mut expired = record(OffsetDateTime::now_utc() - Duration::seconds(1), "gone");
        store.create(&mut live).await.expect("create");
        store.create(&mut expired).await.expect("create");
        assert_eq!(rows(&pool, &schema).await.len(), 2, "both stored");
        assert_eq!(store.load(&expired.id).await.expect("load"), None);
        assert_eq!(
            store.load(&live.id).await.expect("load"),
            Some(live.clone())
        );

        assert_eq!(
            delete_expired_ui_sessions(&pool, &schema)
                .await
                .expect("delete expired"),
            1
        );
        assert_eq!(
            rows(&pool, &schema).await,
            vec![(live.id.to_string(), live.expiry_date)]
        );
        assert_eq!(
            delete_expired_ui_sessions(&pool, &schema)
                .await
                .expect("delete expired"),
            0
        );

        // The tower-sessions way does the same.
        let mut later = record(OffsetDateTime::now_utc() - Duration::minutes(1), "gone too");
        store.save(&later).await.expect("save");
        store
            .create(&mut later)
            .await
            .expect("create under a fresh id");
        assert_eq!(rows(&pool, &schema).await.len(), 3);
        store.delete_expired().await.expect("delete_expired");
        assert_eq!(
            rows(&pool, &schema).await,
            vec![(live.id.to_string(), live.expiry_date)]
        );
    });
}

#[tokio::test]
async fn stores_of_two_schemas_are_apart() {
    with_db!(|pool, schema| {
        let other = common::fresh(&pool).await;
        let (here, there) = (store(&pool, &schema), store(&pool, &other));
        let mut session = record(in_an_hour(), "ops-alice");
        here.create(&mut session).await.expect("create");
        assert_eq!(there.load(&session.id).await.expect("load"), None);
        there.delete(&session.id).await.expect("delete");
        assert_eq!(
            here.load(&session.id).await.expect("load"),
            Some(session.clone())
        );
    });
}

/// The data column is MessagePack of the whole record, as tower-sessions-sqlx-store
/// wrote it, so the sessions it saved before the change still load.
#[tokio::test]
async fn rows_are_messagepack_records() {
    with_db!(|pool, schema| {
        let store = store(&pool, &schema);
        let written = record(in_an_hour(), "ops-alice");
        // A row as the old store wrote it.
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {}.{UI_SESSIONS_TABLE} (id, data, expiry_date) VALUES ($1, $2, $3)",
            schema.quoted()
        )))
        .bind(written.id.to_string())
        .bind(rmp_serde::to_vec(&written).expect("encode"))
        .bind(written.expiry_date)
        .execute(&pool)
        .await
        .expect("insert");
        assert_eq!(
            store.load(&written.id).await.expect("load"),
            Some(written.clone())
        );
        let mut created = record(in_an_hour(), "ops-bob");
        store.create(&mut created).await.expect("create");
        let data: Vec<u8> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT data FROM {}.{UI_SESSIONS_TABLE} WHERE id = $1",
            schema.quoted()
        )))
        .bind(created.id.to_string())
        .fetch_one(&pool)
        .await
        .expect("the row");
        assert_eq!(
            rmp_serde::from_slice::<Record>(&data).expect("decode"),
            created
        );
    });
}
