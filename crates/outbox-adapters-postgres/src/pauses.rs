//! Pauses set by operators on PostgreSQL (`outbox_pauses`): written by the admin
//! service, read by every claim of the outbox (see `outbox::keys::not_paused`) and
//! by every consumer's pause check.

use async_trait::async_trait;
use outbox_core::Timestamp;
use outbox_ports::{Pause, PauseKind, PauseStore, PortError, invalid_pause_name};
use sqlx::PgPool;

use crate::PgSchema;
use crate::error::port;

/// [`PauseStore`] on PostgreSQL: one row per pause in force, stamped with the
/// database's `now()`.
#[derive(Debug, Clone)]
pub struct PgPauses {
    pool: PgPool,
    pause: String,
    resume: String,
    list: String,
    one: String,
}

impl PgPauses {
    /// Pauses on `pool` in the tables of `schema` (run [`crate::migrate`] first).
    #[must_use]
    pub fn new(pool: PgPool, schema: &PgSchema) -> Self {
        let t = format!("{}.outbox_pauses", schema.quoted());
        let since = crate::rows::readable_time("paused_at");
        Self {
            pool,
            pause: format!(
                "INSERT INTO {t} (kind, name, paused_by) VALUES ($1, $2, $3) \
                 ON CONFLICT (kind, name) DO NOTHING"
            ),
            resume: format!("DELETE FROM {t} WHERE kind = $1 AND name = $2"),
            list: format!(
                "SELECT kind, name, {since} AS since, paused_by FROM {t} ORDER BY kind DESC, name"
            ),
            one: format!("SELECT EXISTS (SELECT 1 FROM {t} WHERE kind = $1 AND name = $2)"),
        }
    }

    /// Whether `name` is paused.
    ///
    /// # Errors
    /// [`PortError::Transient`] when the database cannot be reached.
    pub async fn is_paused(&self, kind: PauseKind, name: &str) -> Result<bool, PortError> {
        sqlx::query_scalar(sqlx::AssertSqlSafe(&*self.one))
            .bind(kind.as_str())
            .bind(name)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| port("read pause", e))
    }
}

/// A name the table's check would refuse, refused before it is sent.
fn checked(name: &str) -> Result<(), PortError> {
    match invalid_pause_name(name) {
        Some(why) => Err(PortError::fatal("pause", format!("the name {why}"))),
        None => Ok(()),
    }
}

#[derive(sqlx::FromRow)]
struct Row {
    kind: String,
    name: String,
    since: Option<Timestamp>,
    paused_by: String,
}

#[async_trait]
impl PauseStore for PgPauses {
    async fn pause(&self, kind: PauseKind, name: &str, by: &str) -> Result<bool, PortError> {
        checked(name)?;
        let done = sqlx::query(sqlx::AssertSqlSafe(&*self.pause))
            .bind(kind.as_str())
            .bind(name)
            .bind(by)
            .execute(&self.pool)
            .await
            .map_err(|e| port("pause", e))?;
        Ok(done.rows_affected() == 1)
    }

    async fn resume(&self, kind: PauseKind, name: &str) -> Result<bool, PortError> {
        let done = sqlx::query(sqlx::AssertSqlSafe(&*self.resume))
            .bind(kind.as_str())
            .bind(name)
            .execute(&self.pool)
            .await
            .map_err(|e| port("resume", e))?;
        Ok(done.rows_affected() == 1)
    }

    async fn pauses(&self) -> Result<Vec<Pause>, PortError> {
        let rows: Vec<Row> = sqlx::query_as(sqlx::AssertSqlSafe(&*self.list))
            .fetch_all(&self.pool)
            .await
            .map_err(|e| port("list pauses", e))?;
        Ok(rows
            .into_iter()
            // The table's check admits these two kinds only.
            .filter_map(|r| {
                Some(Pause {
                    kind: PauseKind::parse(&r.kind)?,
                    name: r.name,
                    since: r.since,
                    by: r.paused_by,
                })
            })
            .collect())
    }
}
