//! What the operator's queries share: the filter as SQL with bound values, list
//! items with a payload preview, keyset pages by `seq`, bulk actions in batches.
//!
//! Operator queries are sent unnamed (`persistent(false)`), so PostgreSQL plans each
//! with its bound values: a generic plan could not use the partial indexes by status
//! (`status = $1` proves no index predicate), a plan for the values does.

use outbox_core::{Lifecycle, MessageId, Timestamp};
use outbox_ports::{BulkOutcome, MessageFilter, MessageSummary, PREVIEW_BYTES, PortError};
use sqlx::postgres::PgArguments;
use sqlx::{Arguments, PgPool, Postgres};

use crate::error::port;
use crate::rows::{readable_time, stored_status};

/// Rows selected and changed per statement by a bulk action.
pub(crate) const BULK_BATCH: u64 = 1_000;

/// The list columns: everything but the payload, of which a preview and the size.
pub(crate) fn summary_columns(id: &str, completed: &str) -> String {
    // Times through `readable_time`: one row holding a time sqlx cannot decode
    // must not fail (or panic) the whole page.
    format!(
        "seq, {id} AS id, exchange, routing_key, message_type, correlation_id, \
         {} AS created_at, status, attempts, last_error, {} AS next_attempt_at, \
         {} AS completed_at, \
         substring(payload FROM 1 FOR {PREVIEW_BYTES}) AS payload_preview, \
         octet_length(payload)::bigint AS payload_size",
        readable_time("created_at"),
        readable_time("next_attempt_at"),
        readable_time(completed),
    )
}

/// A `WHERE` clause and its bound values, built clause by clause.
///
/// SAFETY-SQL: a clause holds column names and expressions of this crate and the
/// `$n` placeholders [`Where::bind`] returns, never a value: every value of a
/// filter (an operator's input) is bound.
pub(crate) struct Where {
    clauses: Vec<String>,
    args: PgArguments,
    count: usize,
}

impl Where {
    pub(crate) fn new() -> Self {
        Self {
            clauses: Vec::new(),
            args: PgArguments::default(),
            count: 0,
        }
    }

    /// Binds `value` and returns its placeholder (`$n`).
    pub(crate) fn bind<T>(&mut self, value: T) -> Result<String, PortError>
    where
        T: for<'q> sqlx::Encode<'q, Postgres> + sqlx::Type<Postgres> + Send + 'static,
    {
        self.args
            .add(value)
            .map_err(|e| PortError::fatal("bind", e.to_string()))?;
        self.count += 1;
        Ok(format!("${}", self.count))
    }

    /// Adds a clause (ANDed with the others).
    pub(crate) fn and(&mut self, clause: String) {
        self.clauses.push(clause);
    }

    /// The filter's clauses; `id` names the message id column, `side` the table.
    pub(crate) fn filter<S: Lifecycle>(
        mut self,
        filter: &MessageFilter<S>,
        id: &str,
    ) -> Result<Self, PortError> {
        if let Some(s) = filter.status {
            let p = self.bind(s.as_str().to_owned())?;
            self.and(format!("status = {p}"));
        }
        for (column, value) in [
            ("exchange", &filter.exchange),
            ("routing_key", &filter.routing_key),
            ("message_type", &filter.message_type),
        ] {
            if let Some(v) = value {
                let p = self.bind(v.clone())?;
                self.and(format!("{column} = {p}"));
            }
        }
        if let Some(at) = filter.created_after {
            let p = self.bind(at)?;
            self.and(format!("created_at >= {p}"));
        }
        if let Some(at) = filter.created_before {
            let p = self.bind(at)?;
            self.and(format!("created_at < {p}"));
        }
        if let Some(group) = &filter.error_group {
            if group.is_empty() {
                // As failure_groups reads them: no last error is the empty group.
                self.and("coalesce(error_group, '') = ''".to_owned());
            } else {
                // Served by the error_group index (rows that ever failed), which
                // holds the group's md5 (a group may be too long for a btree
                // entry); the text is compared too.
                let p = self.bind(group.clone())?;
                self.and(format!("md5(error_group) = md5({p}) AND error_group = {p}"));
            }
        }
        if let Some(q) = &filter.q {
            let corr = self.bind(q.clone())?;
            match q.parse::<MessageId>() {
                Ok(m) => {
                    let idp = self.bind(*m.as_uuid())?;
                    self.and(format!("({id} = {idp} OR correlation_id = {corr})"));
                }
                Err(_) => self.and(format!("correlation_id = {corr}")),
            }
        }
        Ok(self)
    }

    /// Only rows older than the cursor.
    pub(crate) fn below(mut self, cursor: Option<u64>) -> Result<Self, PortError> {
        if let Some(c) = cursor {
            let p = self.bind(i64::try_from(c).unwrap_or(i64::MAX))?;
            self.and(format!("seq < {p}"));
        }
        Ok(self)
    }

    /// Only rows after the cursor in a list's order: older (newest first) or
    /// newer (`oldest_first`).
    pub(crate) fn after_cursor(
        mut self,
        cursor: Option<u64>,
        oldest_first: bool,
    ) -> Result<Self, PortError> {
        if !oldest_first {
            return self.below(cursor);
        }
        if let Some(c) = cursor {
            let p = self.bind(i64::try_from(c).unwrap_or(i64::MAX))?;
            self.and(format!("seq > {p}"));
        }
        Ok(self)
    }

    /// ` WHERE a AND b` (or nothing).
    pub(crate) fn sql(&self) -> String {
        if self.clauses.is_empty() {
            String::new()
        } else {
            format!(" WHERE {}", self.clauses.join(" AND "))
        }
    }

    pub(crate) fn into_args(self) -> PgArguments {
        self.args
    }
}

/// A list row as read.
#[derive(sqlx::FromRow)]
pub(crate) struct SummaryRow {
    pub(crate) seq: i64,
    id: uuid::Uuid,
    exchange: String,
    routing_key: String,
    message_type: Option<String>,
    correlation_id: Option<String>,
    /// `None`: unreadable (shown as the Unix epoch, as `get` does).
    created_at: Option<Timestamp>,
    status: String,
    attempts: i32,
    last_error: Option<String>,
    next_attempt_at: Option<Timestamp>,
    completed_at: Option<Timestamp>,
    payload_preview: Vec<u8>,
    payload_size: i64,
    /// Outbox pages only (see `outbox_operator`); absent from inbox pages.
    #[sqlx(default)]
    due_at: Option<Timestamp>,
    /// Inbox pages only; absent from outbox pages.
    #[sqlx(default)]
    received_at: Option<Timestamp>,
}

impl SummaryRow {
    pub(crate) fn summary<S: Lifecycle>(self) -> Result<MessageSummary<S>, PortError> {
        Ok(MessageSummary {
            id: MessageId::from_uuid(self.id),
            status: stored_status(&self.status).map_err(|e| PortError::fatal("read row", e))?,
            exchange: self.exchange,
            routing_key: self.routing_key,
            message_type: self.message_type,
            correlation_id: self.correlation_id,
            created_at: self.created_at.unwrap_or(Timestamp::UNIX_EPOCH),
            received_at: self.received_at,
            attempts: u32::try_from(self.attempts).unwrap_or(0),
            last_error: self.last_error,
            next_attempt_at: self.next_attempt_at,
            due_at: self.due_at,
            completed_at: self.completed_at,
            payload_preview: self.payload_preview,
            payload_size: u64::try_from(self.payload_size).unwrap_or(0),
        })
    }
}

/// Runs a bulk action: `statement(where)` is one batch's statement over the rows
/// `where` selects (its `LIMIT` bound last), answering (picked, changed, lowest
/// seq picked). Batches go newest first until `max` rows were picked or none is
/// left; each batch is one short statement whose guard is in the UPDATE/DELETE.
pub(crate) async fn in_batches(
    pool: &PgPool,
    operation: &'static str,
    max: u64,
    mut make: impl FnMut(Option<u64>, u64) -> Result<(String, PgArguments), PortError>,
) -> Result<BulkOutcome, PortError> {
    let mut outcome = BulkOutcome::default();
    let mut cursor = None;
    while outcome.matched < max {
        let batch = (max - outcome.matched).min(BULK_BATCH);
        let (sql, args) = make(cursor, batch)?;
        let (picked, changed, lowest): (i64, i64, Option<i64>) =
            sqlx::query_as_with(sqlx::AssertSqlSafe(sql), args)
                .persistent(false)
                .fetch_one(pool)
                .await
                .map_err(|e| port(operation, e))?;
        outcome.matched += u64::try_from(picked).unwrap_or(0);
        outcome.changed += u64::try_from(changed).unwrap_or(0);
        match lowest {
            Some(seq) if u64::try_from(picked).unwrap_or(0) == batch => {
                cursor = u64::try_from(seq).ok();
            }
            _ => break,
        }
    }
    Ok(outcome)
}

/// A bulk batch statement: picks up to the batch size of rows the `where_` selects,
/// newest first, and runs `action` (an UPDATE or DELETE naming `picked` and its own
/// guard, `RETURNING 1`) on them.
pub(crate) fn batch_statement(table: &str, where_: &str, limit: &str, action: &str) -> String {
    format!(
        "WITH picked AS (SELECT seq FROM {table}{where_} ORDER BY seq DESC LIMIT {limit}), \
         changed AS ({action}) \
         SELECT (SELECT count(*) FROM picked), (SELECT count(*) FROM changed), \
                (SELECT min(seq) FROM picked)"
    )
}

/// A bulk requeue's or reconsume's batch statement ([`batch_statement`]) with
/// `where_`'s values: `set` on the picked rows still in a status of `guard` (a
/// bound list), under no live lease and never replayed (its replay carries its
/// effect), as the single requeue and reconsume do.
pub(crate) fn revive_batch(
    table: &str,
    mut where_: Where,
    limit: &str,
    guard: &str,
    set: &str,
) -> (String, PgArguments) {
    // Picked only when it can change: a batch of replayed originals alone would
    // change nothing and end the bulk action before the rows behind them.
    where_.and("replayed_as IS NULL".to_owned());
    let action = format!(
        "UPDATE {table} SET {set} \
         WHERE seq IN (SELECT seq FROM picked) AND status = ANY({guard}) \
         AND (locked_until IS NULL OR locked_until < now()) AND replayed_as IS NULL RETURNING 1"
    );
    (
        batch_statement(table, &where_.sql(), limit, &action),
        where_.into_args(),
    )
}

/// Completions per minute since `window` ago: the rows of `table` in `status`
/// (a literal) by their completion time `completed`, which the partial index on
/// `completed` for that status serves.
pub(crate) async fn per_minute(
    pool: &PgPool,
    table: &str,
    status: &str,
    completed: &str,
    window: std::time::Duration,
) -> Result<Vec<outbox_ports::MinuteCount>, PortError> {
    // SAFETY-SQL: `table` is the quoted table of a validated schema; `status` and
    // `completed` are this crate's constants (a status name, a column), never input.
    let sql = format!(
        "SELECT date_trunc('minute', {completed}) AS minute, count(*) FROM {table} \
         WHERE status = '{status}' AND {completed} >= now() - $1 * interval '1 millisecond' \
         GROUP BY 1 ORDER BY 1"
    );
    let rows: Vec<(Timestamp, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(crate::rows::millis(window))
        .fetch_all(pool)
        .await
        .map_err(|e| port("per minute", e))?;
    Ok(rows
        .into_iter()
        .map(|(minute, count)| outbox_ports::MinuteCount {
            minute,
            count: u64::try_from(count).unwrap_or(0),
        })
        .collect())
}

/// A row of [`failure_groups`]: place, group, an example, count, oldest and
/// newest time.
type GroupRow = (
    String,
    String,
    String,
    i64,
    Option<Timestamp>,
    Option<Timestamp>,
);

/// Failures of `table` in `statuses` in groups per `place` column and stored
/// failure group (`error_group`, migration 20261222000001), every group counted
/// exactly, the largest first. One scan per status, each with the status as a
/// literal so that the status's partial index can serve it (seen: index scans of
/// `outbox_publish_failed` and `outbox_dead` beside 200,000 sent rows; the inbox
/// has `inbox_due` and `inbox_dead`); the example is the least text (`min`, no
/// sort by frequency). Times through [`readable_time`] (an unreadable one counts
/// as unknown).
pub(crate) async fn failure_groups<S: Lifecycle>(
    pool: &PgPool,
    table: &str,
    place: &str,
    statuses: &[S],
) -> Result<Vec<outbox_ports::FailureGroup>, PortError> {
    let at = readable_time("coalesce(last_attempt_at, created_at)");
    let scans: Vec<String> = statuses
        .iter()
        .map(|s| {
            // SAFETY-SQL: a status name of the core's, not input: a literal is safe
            // here; `place` and `table` are this crate's column and quoted table.
            format!(
                "SELECT {place} AS place, coalesce(error_group, '') AS error_group, \
                 coalesce(last_error, '') AS error, {at} AS at \
                 FROM {table} WHERE status = '{}'",
                s.as_str()
            )
        })
        .collect();
    let sql = format!(
        "SELECT place, error_group, min(error), count(*), min(at), max(at) FROM ({}) AS failures \
         GROUP BY 1, 2 ORDER BY 4 DESC, 1, 2",
        scans.join(" UNION ALL ")
    );
    let rows: Vec<GroupRow> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .persistent(false)
        .fetch_all(pool)
        .await
        .map_err(|e| port("count failures", e))?;
    Ok(rows
        .into_iter()
        .map(
            |(place, error, example, count, oldest, newest)| outbox_ports::FailureGroup {
                error,
                example,
                place,
                count: u64::try_from(count).unwrap_or(0),
                oldest,
                newest,
            },
        )
        .collect())
}

/// `count(*)` of what `where_` selects, stopping at `max`.
pub(crate) async fn count_at_most(
    pool: &PgPool,
    table: &str,
    mut where_: Where,
    max: u64,
) -> Result<u64, PortError> {
    let limit = where_.bind(i64::try_from(max).unwrap_or(i64::MAX))?;
    let sql = format!(
        "SELECT count(*) FROM (SELECT 1 FROM {table}{} LIMIT {limit}) AS matched",
        where_.sql()
    );
    let n: i64 = sqlx::query_scalar_with(sqlx::AssertSqlSafe(sql), where_.into_args())
        .persistent(false)
        .fetch_one(pool)
        .await
        .map_err(|e| port("count", e))?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// One keyset page of list rows: `limit + 1` fetched, so the page knows whether
/// another follows.
pub(crate) async fn summary_page<S: Lifecycle>(
    pool: &PgPool,
    select: &str,
    mut where_: Where,
    limit: u32,
    oldest_first: bool,
) -> Result<outbox_ports::Page<MessageSummary<S>>, PortError> {
    let limit = outbox_ports::page_limit(limit);
    let lp = where_.bind(i64::from(limit) + 1)?;
    let sql = format!(
        "{select}{} ORDER BY seq {} LIMIT {lp}",
        where_.sql(),
        order(oldest_first)
    );
    let rows: Vec<SummaryRow> = sqlx::query_as_with(sqlx::AssertSqlSafe(sql), where_.into_args())
        .persistent(false)
        .fetch_all(pool)
        .await
        .map_err(|e| port("list", e))?;
    page_of(rows, limit, |r| r.seq, SummaryRow::summary)
}

/// A list's `ORDER BY seq` direction.
pub(crate) const fn order(oldest_first: bool) -> &'static str {
    if oldest_first { "ASC" } else { "DESC" }
}

/// The first `limit` rows as a page, with a cursor when one more was fetched.
pub(crate) fn page_of<R, T>(
    mut rows: Vec<R>,
    limit: u32,
    seq: impl Fn(&R) -> i64,
    convert: impl Fn(R) -> Result<T, PortError>,
) -> Result<outbox_ports::Page<T>, PortError> {
    let more = rows.len() > limit as usize;
    rows.truncate(limit as usize);
    let next = if more {
        rows.last()
            .and_then(|r| u64::try_from(seq(r)).ok())
            .map(outbox_ports::PageCursor)
    } else {
        None
    };
    Ok(outbox_ports::Page {
        items: rows.into_iter().map(convert).collect::<Result<_, _>>()?,
        next,
    })
}
