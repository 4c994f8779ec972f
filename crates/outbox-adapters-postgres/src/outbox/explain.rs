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
use super::claim::LiveExchanges;
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
        let live = self.live_exchanges().await?;
        let explain = Explain::Plan.of(self.pending_claim_sql(live.as_ref()));
        let query = self.pending_claim(&explain, limit, live);
        diagnostics::plan(&self.pool, "explain claim", query).await
    }

    /// The plan and row counts of a real claim of `limit` pending rows
    /// (`EXPLAIN ANALYZE`), run in a transaction that is rolled back, so nothing
    /// stays claimed: for operators and tests checking that claims read only the
    /// rows they take. The claim in the form that would run now (whether an
    /// exchange is paused).
    ///
    /// # Errors
    /// A database error.
    pub async fn explain_analyze_claim_pending(&self, limit: u32) -> Result<String, PortError> {
        let live = self.live_exchanges().await?;
        let explain = Explain::Analyze.of(self.pending_claim_sql(live.as_ref()));
        let query = self.pending_claim(&explain, limit, live);
        diagnostics::rolled_back(&self.pool, "explain claim", query).await
    }

    /// The pending claim's statement in the form for `live`.
    fn pending_claim_sql(&self, live: Option<&LiveExchanges>) -> &str {
        if live.is_some() {
            &self.sql.claim_pending_paused
        } else {
            &self.sql.claim_pending
        }
    }

    /// `explain` (of the pending claim) with a claim's values: `limit` rows, a
    /// lease of no time held by `explain`, and the key cursor as it stands, or
    /// the exchanges of `live` and their key cursors if an exchange is paused.
    fn pending_claim<'q>(
        &self,
        explain: &'q str,
        limit: u32,
        live: Option<LiveExchanges>,
    ) -> Query<'q, Postgres, PgArguments> {
        let query = sqlx::query(sqlx::AssertSqlSafe(explain))
            .bind(i64::from(limit))
            .bind("explain")
            .bind(0_i64);
        match live {
            Some(live) => {
                let [keyed, cursors, now, due] = self.paused_claim_lists(live);
                query.bind(keyed).bind(cursors).bind(now).bind(due)
            }
            None => query.bind(self.key_cursor()),
        }
    }

    /// The plan and row counts of a real claim of `limit` failed rows due for a
    /// retry (`EXPLAIN ANALYZE`), in a transaction that is rolled back: for tests
    /// checking that the key-head rule reads one index probe, not the rows of
    /// other keys.
    ///
    /// # Errors
    /// A database error.
    pub async fn explain_analyze_claim_retries(&self, limit: u32) -> Result<String, PortError> {
        let live = self.live_exchanges().await?;
        let sql = match live {
            Some(_) => &self.sql.claim_retries_paused,
            None => &self.sql.claim_retries,
        };
        let explain = Explain::Analyze.of(sql);
        let query = sqlx::query(sqlx::AssertSqlSafe(explain))
            .bind(i64::from(limit))
            .bind("explain")
            .bind(0_i64);
        let query = match live {
            Some(live) => query.bind(live.failed),
            None => query,
        };
        diagnostics::rolled_back(&self.pool, "explain retry claim", query).await
    }

    /// The plan and row counts of an idle relay's work check (`EXPLAIN ANALYZE`
    /// of [`outbox_ports::OutboxRelayPath::pending_claimable`], read-only): for
    /// tests checking that it reads about what a claim would take.
    ///
    /// # Errors
    /// A database error.
    pub async fn explain_analyze_claimable(&self) -> Result<String, PortError> {
        let explain = Explain::Analyze.of(&self.sql.claimable);
        diagnostics::plan(
            &self.pool,
            "explain work check",
            sqlx::query(sqlx::AssertSqlSafe(explain)),
        )
        .await
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
        let query = sqlx::query(sqlx::AssertSqlSafe(explain)).bind(RECOVER_WINDOW);
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
        diagnostics::plan(
            &self.pool,
            "explain stats",
            sqlx::query(sqlx::AssertSqlSafe(explain)),
        )
        .await
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
        let mut query = sqlx::query(sqlx::AssertSqlSafe(explain))
            .bind(i64::from(outbox_ports::page_limit(limit)))
            .bind(blocked_count_limit());
        if let Some(k) = cursor {
            query = query.bind(k);
        }
        diagnostics::rolled_back_in(tx, "explain blocked keys", query).await
    }
}
