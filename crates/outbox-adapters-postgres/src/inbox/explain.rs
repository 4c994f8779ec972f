//! The inbox's `EXPLAIN` helpers: what a due claim, the held-row safety net, a hold
//! behind a key and a retention statement do, with the store's own statements and
//! values (through [`crate::diagnostics`]). For operators and the plan tests: each
//! reads what it takes, whatever the rows queued behind a key or other consumers
//! keep.

use std::time::Duration;

use outbox_core::Message;
use outbox_ports::PortError;

use super::PgInboxStore;
use super::arrival::bind_delivery;
use crate::diagnostics::{self, Explain};
use crate::rows::millis;
use crate::storable;

impl PgInboxStore {
    /// The plan and row counts of a due claim for `consumer` (`EXPLAIN ANALYZE`),
    /// run in a transaction that is rolled back, so nothing stays claimed: for
    /// operators and tests checking that a claim reads only what it takes.
    ///
    /// # Errors
    /// A database error.
    pub async fn explain_analyze_claim_due(
        &self,
        consumer: &str,
        limit: u32,
    ) -> Result<String, PortError> {
        let explain = Explain::Analyze.of(&self.sql.claim_due);
        let query = sqlx::query(sqlx::AssertSqlSafe(explain))
            .bind(consumer)
            .bind(i64::from(limit))
            .bind("explain")
            .bind(0_i64);
        diagnostics::rolled_back(&self.pool, "explain due claim", query).await
    }

    /// The plan and row counts of the held-row safety net for `consumer` (`EXPLAIN
    /// ANALYZE`), in a transaction that is rolled back: for tests checking that it
    /// reads the keys with held rows, not every key.
    ///
    /// # Errors
    /// A database error.
    pub async fn explain_analyze_release_held(&self, consumer: &str) -> Result<String, PortError> {
        let explain = Explain::Analyze.of(&self.sql.release_held);
        let query = sqlx::query(sqlx::AssertSqlSafe(explain)).bind(consumer);
        diagnostics::rolled_back(&self.pool, "explain held check", query).await
    }

    /// The plan and row counts of [`outbox_ports::InboxConsumerPath::hold_behind_key`]'s
    /// insert for `message` (`EXPLAIN ANALYZE`), in a transaction that is rolled
    /// back: for tests checking that the look for an unfinished predecessor is one
    /// probe.
    ///
    /// # Errors
    /// A database error.
    pub async fn explain_analyze_hold_behind_key(
        &self,
        consumer: &str,
        message: &Message,
    ) -> Result<String, PortError> {
        let stored = storable::message(message);
        let explain = Explain::Analyze.of(&self.sql.arrive_held);
        let query = bind_delivery(&explain, consumer, &stored).bind(&stored.ordering_key);
        diagnostics::rolled_back(&self.pool, "explain hold", query).await
    }

    /// The plan PostgreSQL would use for one retention statement of `consumer`
    /// (`EXPLAIN`, nothing is deleted): for operators checking that retention stays
    /// on its index (`inbox_retention`) whatever other consumers keep.
    ///
    /// # Errors
    /// A database error.
    pub async fn explain_retention(
        &self,
        consumer: &str,
        age: Duration,
        batch: u32,
    ) -> Result<String, PortError> {
        let explain = Explain::Plan.of(&self.sql.retention);
        let query = sqlx::query(sqlx::AssertSqlSafe(explain))
            .bind(millis(age))
            .bind(i64::from(batch.max(1)))
            .bind(consumer);
        diagnostics::plan(&self.pool, "explain retention", query).await
    }
}
