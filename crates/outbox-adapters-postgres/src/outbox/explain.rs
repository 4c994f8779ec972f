//! The outbox's `EXPLAIN` helpers: what a claim, the clearing of leases, the
//! stats and a page of blocked keys do, with the store's own statements and
//! values (through [`crate::diagnostics`]). For operators and the plan tests:
//! claims stay on their partial indexes, the stats never count sent rows, a page of
//! blocked keys never reads the rows queued behind the heads.

use outbox_ports::PortError;
use sqlx::Postgres;
use sqlx::postgres::PgArguments;
use sqlx::query::Query;

use super::PgOutboxStore;
use super::reads::blocked_count_limit;
use super::sql::RECOVER_WINDOW;
use crate::diagnostics::{self, Explain};

impl PgOutboxStore {
    /// The plan PostgreSQL would use for a claim of `limit` pending rows (`EXPLAIN`,
    /// nothing is claimed): for operators checking that claims stay on the partial
    /// index however large the table grows.
    ///
    /// # Errors
    /// A database error.
    pub async fn explain_claim_pending(&self, limit: u32) -> Result<String, PortError> {
        let explain = Explain::Plan.of(&self.sql.claim_pending);
        let query = self.pending_claim(&explain, limit);
        diagnostics::plan(&self.pool, "explain claim", query).await
    }

    /// The plan and row counts of a real claim of `limit` pending rows
    /// (`EXPLAIN ANALYZE`), run in a transaction that is rolled back, so nothing
    /// stays claimed: for operators and tests checking that claims read only the
    /// rows they take.
    ///
    /// # Errors
    /// A database error.
    pub async fn explain_analyze_claim_pending(&self, limit: u32) -> Result<String, PortError> {
        let explain = Explain::Analyze.of(&self.sql.claim_pending);
        let query = self.pending_claim(&explain, limit);
        diagnostics::rolled_back(&self.pool, "explain claim", query).await
    }

    /// `explain` (of the pending claim) with a claim's values: `limit` rows, a
    /// lease of no time held by `explain`, the key cursor as it stands.
    fn pending_claim<'q>(&self, explain: &'q str, limit: u32) -> Query<'q, Postgres, PgArguments> {
        sqlx::query(explain)
            .bind(i64::from(limit))
            .bind("explain")
            .bind(0_i64)
            .bind(self.key_cursor())
    }

    /// The plan and row counts of a real claim of `limit` failed rows due for a
    /// retry (`EXPLAIN ANALYZE`), in a transaction that is rolled back: for tests
    /// checking that the key-head rule reads one index probe, not the rows of
    /// other keys.
    ///
    /// # Errors
    /// A database error.
    pub async fn explain_analyze_claim_retries(&self, limit: u32) -> Result<String, PortError> {
        let explain = Explain::Analyze.of(&self.sql.claim_retries);
        let query = sqlx::query(&explain)
            .bind(i64::from(limit))
            .bind("explain")
            .bind(0_i64);
        diagnostics::rolled_back(&self.pool, "explain retry claim", query).await
    }

    /// The plan and row counts of a real clearing of expired leases (`EXPLAIN
    /// ANALYZE` of [`outbox_ports::OutboxRelayPath::recover_expired_leases`]), in a
    /// transaction that is rolled back: for tests checking that it reads the front
    /// of the backlog, never the whole table.
    ///
    /// # Errors
    /// A database error.
    pub async fn explain_analyze_recover_expired_leases(&self) -> Result<String, PortError> {
        let explain = Explain::Analyze.of(&self.sql.recover);
        let query = sqlx::query(&explain).bind(RECOVER_WINDOW);
        diagnostics::rolled_back(&self.pool, "explain recover leases", query).await
    }

    /// What the stats query (run by every `/metrics` scrape and `/readyz` check)
    /// does: `EXPLAIN ANALYZE` of it, with the rows each step read. It runs the
    /// query once (read-only), for operators checking that it stays on the partial
    /// indexes of the unsent rows however many sent rows the table keeps.
    ///
    /// # Errors
    /// A database error.
    pub async fn explain_stats(&self) -> Result<String, PortError> {
        let explain = Explain::Analyze.of(&self.sql.stats);
        diagnostics::plan(&self.pool, "explain stats", sqlx::query(&explain)).await
    }

    /// What a page of blocked keys does: `EXPLAIN ANALYZE` of it (read-only), for
    /// tests and operators checking that it walks the keys, never the rows queued
    /// behind their heads.
    ///
    /// # Errors
    /// A database error.
    pub async fn explain_blocked_keys(
        &self,
        after: Option<String>,
        limit: u32,
    ) -> Result<String, PortError> {
        let (sql, cursor) = self.blocked_statement(after);
        let explain = Explain::Analyze.of(sql);
        let tx = self.blocked_keys_tx().await?;
        let mut query = sqlx::query(&explain)
            .bind(i64::from(outbox_ports::page_limit(limit)))
            .bind(blocked_count_limit());
        if let Some(k) = cursor {
            query = query.bind(k);
        }
        diagnostics::rolled_back_in(tx, "explain blocked keys", query).await
    }
}
