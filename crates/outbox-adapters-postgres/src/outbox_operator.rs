//! The operator's view of the outbox on PostgreSQL: keyset pages by `seq`, bulk
//! actions in batches of statements whose status guard is in the UPDATE/DELETE.

use std::time::Duration;

use async_trait::async_trait;
use outbox_core::{MessageId, OutboxStatus};
use outbox_ports::{
    BulkOutcome, FailureGroup, MessageFilter, MessageSummary, MinuteCount, OutboxOperator,
    OutboxRecord, Page, PageCursor, PortError, deletable_statuses, page_limit,
    requeueable_statuses,
};

use crate::PgOutboxStore;
use crate::diagnostics::{self, Explain};
use crate::error::port;
use crate::listing::{
    SummaryRow, Where, batch_statement, count_at_most, failure_groups, in_batches, page_of,
    per_minute, revive_batch, summary_columns,
};
use crate::rows::{names, readable_time, stored_status};

impl PgOutboxStore {
    /// What a page of [`OutboxOperator::list_messages`] does: `EXPLAIN (ANALYZE)`
    /// of the same statement with the same bound values (read-only), for operators
    /// and tests checking that lists stay on an index however large the table.
    ///
    /// # Errors
    /// A database error.
    pub async fn explain_list_messages(
        &self,
        filter: &MessageFilter,
        after: Option<PageCursor>,
        limit: u32,
    ) -> Result<String, PortError> {
        let (sql, args) = self.list_statement(filter, after, limit)?;
        let explain = Explain::Analyze.of(&sql);
        let query = sqlx::query_with(sqlx::AssertSqlSafe(explain), args).persistent(false);
        diagnostics::plan(self.pool(), "explain list", query).await
    }

    fn list_statement(
        &self,
        filter: &MessageFilter,
        after: Option<PageCursor>,
        limit: u32,
    ) -> Result<(String, sqlx::postgres::PgArguments), PortError> {
        let mut w = Where::new()
            .filter(filter, "id")?
            .after_cursor(after.map(|c| c.0), filter.oldest_first)?;
        let lp = w.bind(i64::from(page_limit(limit)) + 1)?;
        let sql = format!(
            "SELECT {}, {} AS due_at FROM {}{} ORDER BY seq {} LIMIT {lp}",
            summary_columns("id", "sent_at"),
            readable_time("not_before"),
            self.table(),
            w.sql(),
            crate::listing::order(filter.oldest_first)
        );
        Ok((sql, w.into_args()))
    }

    fn table(&self) -> String {
        format!("{}.outbox_messages", self.outbox().schema().quoted())
    }

    /// The delete guard: dead rows always; with `force` also pending and failed
    /// rows that no live lease holds. Binds (always, forced) and returns the clause.
    fn delete_guard(w: &mut Where, force: bool) -> Result<String, PortError> {
        let always: Vec<OutboxStatus> = OutboxStatus::deletable().collect();
        let forced: Vec<OutboxStatus> = deletable_statuses(force)
            .into_iter()
            .filter(|s| !always.contains(s))
            .collect();
        let a = w.bind(names(&always))?;
        let f = w.bind(names(&forced))?;
        Ok(format!(
            "(status = ANY({a}) OR (status = ANY({f}) \
              AND (locked_until IS NULL OR locked_until < now())))"
        ))
    }
}

#[async_trait]
impl OutboxOperator for PgOutboxStore {
    async fn blocked_keys(
        &self,
        after: Option<String>,
        limit: u32,
    ) -> Result<Vec<outbox_ports::BlockedKey>, PortError> {
        self.blocked_keys_page(after, limit).await
    }

    async fn exchange_counts(&self) -> Result<Vec<outbox_ports::ExchangeCounts>, PortError> {
        // One scan a status, each with its status as a literal so that its
        // partial index serves it (as failure_groups), never the sent rows. A
        // delayed message not yet due waits for nothing; an overdue one since
        // its due time.
        let t = self.table();
        let waits = readable_time(
            "CASE WHEN status <> 'pending' OR not_before IS NULL THEN created_at \
             WHEN not_before <= now() THEN not_before END",
        );
        let scans: Vec<String> = ["pending", "publish_failed", "dead"]
            .iter()
            .map(|status| {
                // SAFETY-SQL: a status literal of this crate's and the quoted table.
                format!(
                    "SELECT exchange, status, \
                     CASE WHEN status = 'dead' THEN NULL ELSE {waits} END AS waits \
                     FROM {t} WHERE status = '{status}'"
                )
            })
            .collect();
        let sql = format!(
            "SELECT exchange, count(*) FILTER (WHERE status = 'pending'), \
               count(*) FILTER (WHERE status = 'publish_failed'), \
               count(*) FILTER (WHERE status = 'dead'), min(waits) \
             FROM ({}) AS unsent GROUP BY exchange ORDER BY exchange",
            scans.join(" UNION ALL ")
        );
        type CountsRow = (String, i64, i64, i64, Option<outbox_core::Timestamp>);
        let rows: Vec<CountsRow> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .persistent(false)
            .fetch_all(self.pool())
            .await
            .map_err(|e| port("count per exchange", e))?;
        let n = |c: i64| u64::try_from(c).unwrap_or(0);
        Ok(rows
            .into_iter()
            .map(
                |(exchange, pending, failed, dead, oldest)| outbox_ports::ExchangeCounts {
                    exchange,
                    pending: n(pending),
                    publish_failed: n(failed),
                    dead: n(dead),
                    oldest_unsent_at: oldest,
                },
            )
            .collect())
    }

    async fn head_of_key(&self, key: &str) -> Result<Option<outbox_ports::KeyHead>, PortError> {
        self.head_of_key_id(key).await
    }

    async fn list_messages(
        &self,
        filter: &MessageFilter,
        after: Option<PageCursor>,
        limit: u32,
    ) -> Result<Page<MessageSummary>, PortError> {
        let (sql, args) = self.list_statement(filter, after, limit)?;
        let rows: Vec<SummaryRow> = sqlx::query_as_with(sqlx::AssertSqlSafe(sql), args)
            .persistent(false)
            .fetch_all(self.pool())
            .await
            .map_err(|e| port("list", e))?;
        page_of(rows, page_limit(limit), |r| r.seq, |r| r.summary())
    }

    async fn get_message(&self, id: MessageId) -> Result<Option<OutboxRecord>, PortError> {
        self.record(id).await
    }

    async fn oldest_messages(
        &self,
        status: OutboxStatus,
        limit: u32,
    ) -> Result<Vec<OutboxRecord>, PortError> {
        self.records(status, limit).await
    }

    async fn requeue_message(&self, id: MessageId) -> Result<(), PortError> {
        self.requeue_record(id).await
    }

    async fn replay_message(
        &self,
        original: MessageId,
        replay: outbox_core::Message,
    ) -> Result<(), PortError> {
        self.replay_record(original, replay).await
    }

    async fn publish_now(&self, id: MessageId) -> Result<(), PortError> {
        let t = self.table();
        // The guard is in the statement: a message sent or failed meanwhile is left
        // alone, and the reason read from the row as it is now.
        let changed = sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE {t} SET not_before = NULL WHERE id = $1 AND status = 'pending'"
        )))
        .bind(id.as_uuid())
        .execute(self.pool())
        .await
        .map_err(|e| port("publish now", e))?
        .rows_affected();
        if changed == 1 {
            return Ok(());
        }
        let status: Option<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT status FROM {t} WHERE id = $1"
        )))
        .bind(id.as_uuid())
        .fetch_optional(self.pool())
        .await
        .map_err(|e| port("publish now", e))?;
        match status {
            None => Err(PortError::NotFound {
                what: "message",
                id: id.to_string(),
            }),
            Some(s) => Err(PortError::IllegalTransition(
                outbox_core::TransitionError::Outbox {
                    from: stored_status(&s).map_err(|e| PortError::fatal("read row", e))?,
                    to: OutboxStatus::Pending,
                },
            )),
        }
    }

    async fn delete_message(&self, id: MessageId, force: bool) -> Result<(), PortError> {
        if !force {
            return self.delete_record(id).await;
        }
        let t = self.table();
        let mut w = Where::new();
        let idp = w.bind(*id.as_uuid())?;
        let guard = Self::delete_guard(&mut w, true)?;
        let deleted = sqlx::query_with(
            sqlx::AssertSqlSafe(format!("DELETE FROM {t} WHERE id = {idp} AND {guard}")),
            w.into_args(),
        )
        .persistent(false)
        .execute(self.pool())
        .await
        .map_err(|e| port("delete", e))?
        .rows_affected();
        if deleted == 1 {
            return Ok(());
        }
        // Nothing deleted: say why, from the row as it is now.
        let found: Option<(String, bool)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT status, coalesce(locked_until >= now(), false) FROM {t} WHERE id = $1"
        )))
        .bind(id.as_uuid())
        .fetch_optional(self.pool())
        .await
        .map_err(|e| port("delete", e))?;
        let Some((status, leased)) = found else {
            return Err(PortError::NotFound {
                what: "message",
                id: id.to_string(),
            });
        };
        let status =
            stored_status::<OutboxStatus>(&status).map_err(|e| PortError::fatal("delete", e))?;
        if !deletable_statuses(true).contains(&status) {
            status.check_delete()?;
        }
        Err(PortError::transient(
            "delete",
            if leased {
                format!("message {id} is held by a relay right now; try again")
            } else {
                format!("message {id} changed meanwhile; try again")
            },
        ))
    }

    async fn count_messages(&self, filter: &MessageFilter, max: u64) -> Result<u64, PortError> {
        let w = Where::new().filter(filter, "id")?;
        count_at_most(self.pool(), &self.table(), w, max).await
    }

    async fn requeue_matching(
        &self,
        filter: &MessageFilter,
        max: u64,
    ) -> Result<BulkOutcome, PortError> {
        let t = self.table();
        in_batches(self.pool(), "requeue", max, |cursor, batch| {
            let mut w = Where::new().filter(filter, "id")?.below(cursor)?;
            let guard = w.bind(names(&requeueable_statuses()))?;
            let limit = w.bind(i64::try_from(batch).unwrap_or(i64::MAX))?;
            // As the single requeue: pending, due now, a fresh retry budget.
            Ok(revive_batch(
                &t,
                w,
                &limit,
                &guard,
                "status = 'pending', attempts = 0, next_attempt_at = NULL, sent_at = NULL, \
                 locked_by = NULL, locked_until = NULL",
            ))
        })
        .await
    }

    async fn delete_matching(
        &self,
        filter: &MessageFilter,
        max: u64,
        force: bool,
    ) -> Result<BulkOutcome, PortError> {
        let t = self.table();
        in_batches(self.pool(), "delete", max, |cursor, batch| {
            let mut w = Where::new().filter(filter, "id")?.below(cursor)?;
            let guard = Self::delete_guard(&mut w, force)?;
            let limit = w.bind(i64::try_from(batch).unwrap_or(i64::MAX))?;
            let action = format!(
                "DELETE FROM {t} WHERE seq IN (SELECT seq FROM picked) AND {guard} RETURNING 1"
            );
            Ok((
                batch_statement(&t, &w.sql(), &limit, &action),
                w.into_args(),
            ))
        })
        .await
    }

    async fn failure_groups(&self) -> Result<Vec<FailureGroup>, PortError> {
        failure_groups(
            self.pool(),
            &self.table(),
            "exchange",
            &[OutboxStatus::PublishFailed, OutboxStatus::Dead],
        )
        .await
    }

    async fn published_per_minute(&self, window: Duration) -> Result<Vec<MinuteCount>, PortError> {
        // Served by outbox_sent_at (sent_at) WHERE status = 'sent'.
        per_minute(self.pool(), &self.table(), "sent", "sent_at", window).await
    }
}
