//! The dashboard's sessions in the outbox's schema (feature `ui-sessions`): a
//! tower-sessions store ([`PgUiSessionStore`]) over the table migration
//! 20261219000003 creates, so a restart or a second instance keeps operators
//! signed in.
//!
//! Our own store rather than `tower-sessions-sqlx-store`, whose latest release is
//! built on sqlx 0.8 and would keep a second sqlx in the graph. It keeps that
//! store's rows: `id` is the session id's text, `data` the whole record as
//! MessagePack (`rmp_serde::to_vec`, as that store wrote it), `expiry_date` the
//! record's expiry; sessions it saved load here.

use std::fmt;

use async_trait::async_trait;
use sqlx::PgPool;
use time::OffsetDateTime;
use tower_sessions_core::session::{Id, Record};
use tower_sessions_core::session_store::{self, ExpiredDeletion, SessionStore};

use crate::{PgConfigError, PgSchema};

/// The table of the sessions in `schema`.
pub const UI_SESSIONS_TABLE: &str = "outbox_ui_sessions";

/// The dashboard's session store in one schema: a tower-sessions
/// [`SessionStore`] over [`UI_SESSIONS_TABLE`]. An expired session is never
/// loaded; [`delete_expired_ui_sessions`] (or [`ExpiredDeletion`]) removes its row.
#[derive(Clone)]
pub struct PgUiSessionStore {
    pool: PgPool,
    schema: PgSchema,
    /// The schema-qualified, quoted table: `"schema".outbox_ui_sessions`.
    table: String,
}

impl fmt::Debug for PgUiSessionStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgUiSessionStore")
            .field("schema", &self.schema)
            .finish_non_exhaustive()
    }
}

/// The session store of the dashboard over `pool`, in `schema` (migrated).
///
/// # Errors
/// None today: every [`PgSchema`] is a name the store takes. The `Result` stays
/// for the callers of the store this one replaced, which could refuse a name.
pub fn ui_sessions(pool: PgPool, schema: &PgSchema) -> Result<PgUiSessionStore, PgConfigError> {
    Ok(PgUiSessionStore {
        pool,
        table: table(schema),
        schema: schema.clone(),
    })
}

fn table(schema: &PgSchema) -> String {
    format!("{}.{UI_SESSIONS_TABLE}", schema.quoted())
}

/// Deletes the sessions of `schema` that expired; how many. The store reads only
/// live ones, so this only keeps the table small (`outbox run` calls it every few
/// minutes while it serves the dashboard).
///
/// # Errors
/// What PostgreSQL says.
pub async fn delete_expired_ui_sessions(
    pool: &PgPool,
    schema: &PgSchema,
) -> Result<u64, sqlx::Error> {
    Ok(sqlx::query(sqlx::AssertSqlSafe(format!(
        "DELETE FROM {} WHERE expiry_date < now()",
        table(schema)
    )))
    .execute(pool)
    .await?
    .rows_affected())
}

fn backend(e: &sqlx::Error) -> session_store::Error {
    session_store::Error::Backend(e.to_string())
}

fn encode(record: &Record) -> session_store::Result<Vec<u8>> {
    rmp_serde::to_vec(record).map_err(|e| session_store::Error::Encode(e.to_string()))
}

impl PgUiSessionStore {
    /// Inserts `record` unless its id is taken; whether it was inserted.
    async fn insert_new(&self, record: &Record) -> session_store::Result<bool> {
        let inserted = sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {} (id, data, expiry_date) VALUES ($1, $2, $3) \
             ON CONFLICT (id) DO NOTHING",
            self.table
        )))
        .bind(record.id.to_string())
        .bind(encode(record)?)
        .bind(record.expiry_date)
        .execute(&self.pool)
        .await
        .map_err(|e| backend(&e))?
        .rows_affected();
        Ok(inserted == 1)
    }
}

#[async_trait]
impl SessionStore for PgUiSessionStore {
    /// Inserts `record`, under a fresh id while its id is taken (one statement
    /// per try: no id is ever overwritten).
    async fn create(&self, record: &mut Record) -> session_store::Result<()> {
        // A fresh random id collides about never; a store that refuses every
        // insert (a trigger, a policy) must not spin forever.
        for _ in 0..8 {
            if self.insert_new(record).await? {
                return Ok(());
            }
            record.id = Id::default();
        }
        Err(session_store::Error::Backend(
            "no session id could be stored after 8 attempts".to_owned(),
        ))
    }

    async fn save(&self, record: &Record) -> session_store::Result<()> {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {} (id, data, expiry_date) VALUES ($1, $2, $3) \
             ON CONFLICT (id) DO UPDATE SET data = excluded.data, expiry_date = excluded.expiry_date",
            self.table
        )))
        .bind(record.id.to_string())
        .bind(encode(record)?)
        .bind(record.expiry_date)
        .execute(&self.pool)
        .await
        .map_err(|e| backend(&e))?;
        Ok(())
    }

    /// The record of `session_id` if it has not expired (by this process's clock,
    /// which set the expiry).
    async fn load(&self, session_id: &Id) -> session_store::Result<Option<Record>> {
        let data: Option<Vec<u8>> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT data FROM {} WHERE id = $1 AND expiry_date > $2",
            self.table
        )))
        .bind(session_id.to_string())
        .bind(OffsetDateTime::now_utc())
        .fetch_optional(&self.pool)
        .await
        .map_err(|e| backend(&e))?;
        data.map(|d| {
            rmp_serde::from_slice(&d).map_err(|e| session_store::Error::Decode(e.to_string()))
        })
        .transpose()
    }

    async fn delete(&self, session_id: &Id) -> session_store::Result<()> {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DELETE FROM {} WHERE id = $1",
            self.table
        )))
        .bind(session_id.to_string())
        .execute(&self.pool)
        .await
        .map_err(|e| backend(&e))?;
        Ok(())
    }
}

#[async_trait]
impl ExpiredDeletion for PgUiSessionStore {
    async fn delete_expired(&self) -> session_store::Result<()> {
        delete_expired_ui_sessions(&self.pool, &self.schema)
            .await
            .map_err(|e| backend(&e))?;
        Ok(())
    }
}
