//! Pauses set by operators on PostgreSQL (`outbox_pauses`): written by the admin
//! service, read by every claim of the outbox (see `outbox::keys::unpaused`) and
//! by every consumer's pause check.
//!
//! An exchange's pause also flags its unsent rows (`outbox_messages.paused`, the
//! which the claims' indexes leave out, so no claim reads them), in the same
//! transaction; a resume clears the flags. Rows written while the pause is in
//! force are flagged as they are written (trigger `outbox_paused_row`, migration
//! 20261221000001), which locks the pause's row: a resume waits for those
//! transactions, then clears their rows too.

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
    flag: String,
    unflag: String,
}

impl PgPauses {
    /// Pauses on `pool` in the tables of `schema` (run [`crate::migrate`] first).
    #[must_use]
    pub fn new(pool: PgPool, schema: &PgSchema) -> Self {
        let t = format!("{}.outbox_pauses", schema.quoted());
        let since = crate::rows::readable_time("paused_at");
        let m = format!("{}.outbox_messages", schema.quoted());
        // Each unsent status through its own partial index (outbox_pending,
        // outbox_publish_failed, outbox_dead): the unsent rows are read, never
        // the sent ones.
        let unsent_of = |status: &str| {
            format!("SELECT seq FROM {m} WHERE status = '{status}' AND exchange = $1 AND NOT paused")
        };
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
            flag: format!(
                "UPDATE {m} SET paused = true WHERE seq IN ({} UNION ALL {} UNION ALL {}) \
                 AND NOT paused",
                unsent_of("pending"),
                unsent_of("publish_failed"),
                unsent_of("dead")
            ),
            unflag: format!("UPDATE {m} SET paused = false WHERE exchange = $1 AND paused"),
        }
    }

    /// Whether `name` is paused.
    ///
    /// # Errors
    /// [`PortError::Transient`] when the database cannot be reached.
    pub async fn is_paused(&self, kind: PauseKind, name: &str) -> Result<bool, PortError> {
        sqlx::query_scalar(&self.one)
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
    /// An exchange's unsent rows are flagged in the same transaction, also when
    /// it was paused already (which flags the rows a transaction under way at
    /// the first pause wrote).
    async fn pause(&self, kind: PauseKind, name: &str, by: &str) -> Result<bool, PortError> {
        checked(name)?;
        let mut tx = self.pool.begin().await.map_err(|e| port("pause", e))?;
        let done = sqlx::query(&self.pause)
            .bind(kind.as_str())
            .bind(name)
            .bind(by)
            .execute(&mut *tx)
            .await
            .map_err(|e| port("pause", e))?;
        if kind == PauseKind::Exchange {
            sqlx::query(&self.flag)
                .bind(name)
                .execute(&mut *tx)
                .await
                .map_err(|e| port("pause", e))?;
        }
        tx.commit().await.map_err(|e| port("pause", e))?;
        Ok(done.rows_affected() == 1)
    }

    /// An exchange's rows are cleared after its pause is deleted, in the same
    /// transaction: the delete waits for the transactions writing into the
    /// exchange (their rows lock the pause), whose rows the clearing then sees.
    async fn resume(&self, kind: PauseKind, name: &str) -> Result<bool, PortError> {
        let mut tx = self.pool.begin().await.map_err(|e| port("resume", e))?;
        let done = sqlx::query(&self.resume)
            .bind(kind.as_str())
            .bind(name)
            .execute(&mut *tx)
            .await
            .map_err(|e| port("resume", e))?;
        if kind == PauseKind::Exchange {
            sqlx::query(&self.unflag)
                .bind(name)
                .execute(&mut *tx)
                .await
                .map_err(|e| port("resume", e))?;
        }
        tx.commit().await.map_err(|e| port("resume", e))?;
        Ok(done.rows_affected() == 1)
    }

    async fn pauses(&self) -> Result<Vec<Pause>, PortError> {
        let rows: Vec<Row> = sqlx::query_as(&self.list)
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
