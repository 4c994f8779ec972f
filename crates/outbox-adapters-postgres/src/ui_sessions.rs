//! The dashboard's sessions in the outbox's schema (feature `ui-sessions`):
//! tower-sessions' PostgreSQL store over the table migration 20261219000003
//! creates, so a restart or a second instance keeps operators signed in.

use sqlx::PgPool;
use tower_sessions_sqlx_store::PostgresStore;

use crate::{PgConfigError, PgSchema};

/// The table of the sessions in `schema`.
pub const UI_SESSIONS_TABLE: &str = "outbox_ui_sessions";

/// The session store of the dashboard over `pool`, in `schema` (migrated).
///
/// # Errors
/// [`PgConfigError::InvalidSchema`] should the store refuse the schema's name
/// (it takes what [`PgSchema`] takes).
pub fn ui_sessions(pool: PgPool, schema: &PgSchema) -> Result<PostgresStore, PgConfigError> {
    let refused = |_: String| PgConfigError::InvalidSchema {
        name: schema.to_string(),
        reason: "refused by the session store as an identifier",
    };
    PostgresStore::new(pool)
        .with_schema_name(schema.to_string())
        .map_err(refused)?
        .with_table_name(UI_SESSIONS_TABLE)
        .map_err(refused)
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
    Ok(sqlx::query(&format!(
        "DELETE FROM {}.{UI_SESSIONS_TABLE} WHERE expiry_date < now()",
        schema.quoted()
    ))
    .execute(pool)
    .await?
    .rows_affected())
}
