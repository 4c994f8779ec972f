//! The shared sweep state on PostgreSQL.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::SweepReport;
use outbox_ports::{PortError, StateWrite, SweepStateStore};
use sqlx::PgPool;
use sqlx::types::Json;

use crate::PgSchema;
use crate::error::port;
use crate::rows::millis;

#[derive(Debug)]
struct Sql {
    get: String,
    set: String,
}

/// [`SweepStateStore`] on PostgreSQL: one row per key with its expiry; a write is
/// refused when the stored report came from a newer fencing token (and has not
/// expired).
#[derive(Debug, Clone)]
pub struct PgSweepState {
    pool: PgPool,
    sql: Arc<Sql>,
}

impl PgSweepState {
    /// A state store over the tables of `schema`.
    #[must_use]
    pub fn new(pool: PgPool, schema: &PgSchema) -> Self {
        let t = format!("{}.outbox_sweep_state", schema.quoted());
        Self {
            pool,
            sql: Arc::new(Sql {
                get: format!("SELECT report FROM {t} WHERE key = $1 AND expires_at > now()"),
                set: format!(
                    "INSERT INTO {t} (key, report, token, expires_at) \
                     VALUES ($1, $2, $3, now() + $4 * interval '1 millisecond') \
                     ON CONFLICT (key) DO UPDATE SET report = EXCLUDED.report, token = EXCLUDED.token, \
                       expires_at = EXCLUDED.expires_at \
                     WHERE {t}.token <= EXCLUDED.token OR {t}.expires_at <= now() \
                     RETURNING 1"
                ),
            }),
        }
    }
}

#[async_trait]
impl SweepStateStore for PgSweepState {
    async fn get(&self, key: &str) -> Result<Option<SweepReport>, PortError> {
        let stored: Option<serde_json::Value> =
            sqlx::query_scalar(sqlx::AssertSqlSafe(&*self.sql.get))
                .bind(key)
                .fetch_optional(&self.pool)
                .await
                .map_err(|e| port("read sweep state", e))?;
        Ok(stored.and_then(|v| match serde_json::from_value(v) {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::warn!(%key, error = %e, "stored sweep state cannot be decoded; treating it as absent");
                None
            }
        }))
    }

    async fn set(
        &self,
        key: &str,
        report: &SweepReport,
        ttl: Duration,
        fencing_token: u64,
    ) -> Result<StateWrite, PortError> {
        let written = sqlx::query(sqlx::AssertSqlSafe(&*self.sql.set))
            .bind(key)
            .bind(Json(report))
            .bind(i64::try_from(fencing_token).unwrap_or(i64::MAX))
            .bind(millis(ttl))
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| port("write sweep state", e))?;
        Ok(if written.is_some() {
            StateWrite::Written
        } else {
            StateWrite::Fenced
        })
    }
}
