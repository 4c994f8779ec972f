//! The operators' audit log on PostgreSQL (`outbox_audit`).

use async_trait::async_trait;
use outbox_core::Timestamp;
use outbox_ports::{AuditEntry, AuditLog, Page, PageCursor, PortError, page_limit};
use sqlx::PgPool;

use crate::PgSchema;
use crate::error::port;
use crate::listing::page_of;

/// [`AuditLog`] on PostgreSQL: one row per operator write, stamped with the
/// database's `now()`.
#[derive(Debug, Clone)]
pub struct PgAuditLog {
    pool: PgPool,
    insert: String,
    first_page: String,
    next_page: String,
    of_target: String,
}

impl PgAuditLog {
    /// A log on `pool` in the tables of `schema` (run [`crate::migrate`] first).
    #[must_use]
    pub fn new(pool: PgPool, schema: &PgSchema) -> Self {
        let t = format!("{}.outbox_audit", schema.quoted());
        let columns = format!(
            "seq, actor, action, target, count, {} AS at",
            crate::rows::readable_time("at")
        );
        Self {
            pool,
            insert: format!(
                "INSERT INTO {t} (actor, action, target, count) VALUES ($1, $2, $3, $4)"
            ),
            first_page: format!("SELECT {columns} FROM {t} ORDER BY seq DESC LIMIT $1"),
            next_page: format!(
                "SELECT {columns} FROM {t} WHERE seq < $2 ORDER BY seq DESC LIMIT $1"
            ),
            // outbox_audit_target (migration 20261222000005) serves it.
            of_target: format!(
                "SELECT {columns} FROM {t} WHERE target = $2 ORDER BY seq DESC LIMIT $1"
            ),
        }
    }
}

#[derive(sqlx::FromRow)]
struct Row {
    seq: i64,
    actor: String,
    action: String,
    target: String,
    count: i64,
    at: Option<Timestamp>,
}

#[async_trait]
impl AuditLog for PgAuditLog {
    async fn record(&self, entry: AuditEntry) -> Result<(), PortError> {
        sqlx::query(sqlx::AssertSqlSafe(&*self.insert))
            .bind(entry.actor)
            .bind(entry.action)
            .bind(entry.target)
            .bind(i64::try_from(entry.count).unwrap_or(i64::MAX))
            .execute(&self.pool)
            .await
            .map_err(|e| port("audit", e))?;
        Ok(())
    }

    async fn list(
        &self,
        after: Option<PageCursor>,
        limit: u32,
    ) -> Result<Page<AuditEntry>, PortError> {
        let limit = page_limit(limit);
        let query = match after {
            None => sqlx::query_as::<_, Row>(sqlx::AssertSqlSafe(&*self.first_page))
                .bind(i64::from(limit) + 1),
            Some(c) => sqlx::query_as::<_, Row>(sqlx::AssertSqlSafe(&*self.next_page))
                .bind(i64::from(limit) + 1)
                .bind(i64::try_from(c.0).unwrap_or(i64::MAX)),
        };
        let rows = query
            .fetch_all(&self.pool)
            .await
            .map_err(|e| port("audit list", e))?;
        page_of(
            rows,
            limit,
            |r| r.seq,
            |r| {
                Ok(AuditEntry {
                    actor: r.actor,
                    action: r.action,
                    target: r.target,
                    count: u64::try_from(r.count).unwrap_or(0),
                    at: r.at,
                })
            },
        )
    }

    async fn of_target(&self, target: &str, limit: u32) -> Result<Vec<AuditEntry>, PortError> {
        let rows = sqlx::query_as::<_, Row>(sqlx::AssertSqlSafe(&*self.of_target))
            .bind(i64::from(limit))
            .bind(target)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| port("audit of a target", e))?;
        Ok(rows
            .into_iter()
            .map(|r| AuditEntry {
                actor: r.actor,
                action: r.action,
                target: r.target,
                count: u64::try_from(r.count).unwrap_or(0),
                at: r.at,
            })
            .collect())
    }
}
