//! `EXPLAIN` of the stores' own statements, one way for every store: for operators
//! checking that a claim, a count or a page stays on its index however large the
//! table grows, and for the plan and scale tests in `tests/`.
//!
//! A statement is explained with the very text and bound values it runs with (the
//! store's prepared statement behind [`Explain::of`]). An `EXPLAIN ANALYZE` runs
//! the statement: one that writes (a claim, a mark, a clearing of leases) is
//! explained in a transaction rolled back afterwards ([`rolled_back`]), so nothing
//! stays claimed or changed.

use outbox_ports::PortError;
use sqlx::postgres::PgArguments;
use sqlx::query::Query;
use sqlx::{PgPool, Postgres, Row, Transaction};

use crate::error::port;

/// What an `EXPLAIN` reports.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Explain {
    /// The plan only (`EXPLAIN`): nothing runs.
    Plan,
    /// The plan as run, with the rows each step read and the pages it touched,
    /// without times and costs (`EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, COSTS
    /// OFF)`): the statement runs. (Rows an index scan steps over inside the
    /// index show in its pages only.)
    Analyze,
    /// As [`Explain::Analyze`], with the planner's costs (`EXPLAIN (ANALYZE,
    /// TIMING OFF)`).
    AnalyzeWithCosts,
}

impl Explain {
    /// The `EXPLAIN` of statement `sql`, whose parameters stay as they are.
    pub(crate) fn of(self, sql: &str) -> String {
        match self {
            Self::Plan => format!("EXPLAIN {sql}"),
            Self::Analyze => format!("EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, COSTS OFF) {sql}"),
            Self::AnalyzeWithCosts => format!("EXPLAIN (ANALYZE, TIMING OFF) {sql}"),
        }
    }
}

/// Runs `explain` (a query on an [`Explain::of`] text, its values bound) on
/// `executor` and returns the plan's lines, joined by newlines. Errors are
/// `operation`'s.
pub(crate) async fn plan<'q, 'e, 'c: 'e, E>(
    executor: E,
    operation: &'static str,
    explain: Query<'q, Postgres, PgArguments>,
) -> Result<String, PortError>
where
    'q: 'e,
    E: 'e + sqlx::Executor<'c, Database = Postgres>,
{
    let rows = explain
        .fetch_all(executor)
        .await
        .map_err(|e| port(operation, e))?;
    let lines = rows
        .iter()
        .map(|r| r.try_get::<String, _>(0))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| port(operation, e))?;
    Ok(lines.join("\n"))
}

/// As [`plan`], in a transaction of `pool` rolled back afterwards: for an
/// `EXPLAIN ANALYZE` of a statement that writes.
pub(crate) async fn rolled_back(
    pool: &PgPool,
    operation: &'static str,
    explain: Query<'_, Postgres, PgArguments>,
) -> Result<String, PortError> {
    let tx = pool.begin().await.map_err(|e| port(operation, e))?;
    rolled_back_in(tx, operation, explain).await
}

/// As [`rolled_back`], in `tx`, a transaction the caller began (and set up).
pub(crate) async fn rolled_back_in(
    mut tx: Transaction<'static, Postgres>,
    operation: &'static str,
    explain: Query<'_, Postgres, PgArguments>,
) -> Result<String, PortError> {
    let lines = plan(&mut *tx, operation, explain).await?;
    tx.rollback().await.map_err(|e| port(operation, e))?;
    Ok(lines)
}
