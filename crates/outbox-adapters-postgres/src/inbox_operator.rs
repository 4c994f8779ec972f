//! The operator's view of the inbox and its dead letters on PostgreSQL.

use std::time::Duration;

use async_trait::async_trait;
use outbox_core::{Headers, InboxStatus, MessageId, Timestamp};
use outbox_ports::{
    BulkOutcome, ConsumerSummary, DeliveryFilter, DeliverySummary, FailureGroup, InboxOperator,
    InboxRecord, InboxStats, MinuteCount, PREVIEW_BYTES, Page, PageCursor, PortError,
    StoredDeadLetter, reconsumable_statuses,
};

use crate::PgInboxStore;
use crate::diagnostics::{self, Explain};
use crate::error::port;
use crate::listing::{
    Where, count_at_most, failure_groups, in_batches, page_of, per_minute, revive_batch,
    summary_columns, summary_page,
};
use crate::rows::{MessageRow, names, read_columns, readable_time};

#[derive(sqlx::FromRow)]
struct LetterRow {
    seq: i64,
    consumer: String,
    message_id: Option<String>,
    routing_key: String,
    /// The jsonb as text, parsed per row (see `rows::read_columns`).
    headers: String,
    body: Vec<u8>,
    body_size: i64,
    reason: String,
    /// `None`: a time no [`Timestamp`] can hold (see `rows::readable_time`).
    received_at: Option<Timestamp>,
}

impl LetterRow {
    fn letter(self) -> StoredDeadLetter {
        StoredDeadLetter {
            id: u64::try_from(self.seq).unwrap_or(0),
            consumer: self.consumer,
            message_id: self.message_id,
            routing_key: self.routing_key,
            // Written by this adapter from decoded headers; anything else reads as
            // none rather than failing the whole list.
            headers: serde_json::from_str::<Headers>(&self.headers).unwrap_or_default(),
            body: self.body,
            body_size: u64::try_from(self.body_size).unwrap_or(0),
            reason: self.reason,
            received_at: self.received_at.unwrap_or(Timestamp::UNIX_EPOCH),
        }
    }
}

/// A dead letter's columns; `preview` reads only the first [`PREVIEW_BYTES`] of
/// the body (list pages: a body is whatever the broker delivered, however large).
fn letter_columns(preview: bool) -> String {
    let body = if preview {
        format!("substring(body from 1 for {PREVIEW_BYTES}) AS body")
    } else {
        "body".to_owned()
    };
    format!(
        "seq, consumer, message_id, routing_key, headers::text AS headers, {body}, \
         octet_length(body)::bigint AS body_size, reason, {} AS received_at",
        readable_time("received_at")
    )
}

impl PgInboxStore {
    fn inbox(&self) -> String {
        format!("{}.outbox_inbox", self.schema.quoted())
    }

    fn letters(&self) -> String {
        format!("{}.outbox_dead_letters", self.schema.quoted())
    }

    /// The consumer's rows matching `filter`.
    fn of_consumer(consumer: &str, filter: &DeliveryFilter) -> Result<Where, PortError> {
        let mut w = Where::new();
        let c = w.bind(consumer.to_owned())?;
        w.and(format!("consumer = {c}"));
        w.filter(filter, "message_id")
    }
}

impl PgInboxStore {
    /// One consumer's counts of the unfinished states and its dead letters.
    fn consumer_counts_sql(&self) -> String {
        format!(
            "SELECT \
               (SELECT count(*) FROM {inbox} WHERE consumer = $1 AND status = 'received'), \
               (SELECT count(*) FROM {inbox} WHERE consumer = $1 AND status = 'consume_failed'), \
               (SELECT count(*) FROM {inbox} WHERE consumer = $1 AND status = 'dead'), \
               (SELECT count(*) FROM {letters} WHERE consumer = $1)",
            inbox = self.inbox(),
            letters = self.letters()
        )
    }

    /// The plan of the counts [`InboxOperator::consumers`] reads for `consumer`, as
    /// run (`EXPLAIN ANALYZE`, read-only): for operators checking that it never
    /// reads the consumed rows.
    ///
    /// # Errors
    /// A database error.
    pub async fn explain_consumer_counts(&self, consumer: &str) -> Result<String, PortError> {
        let explain = Explain::AnalyzeWithCosts.of(&self.consumer_counts_sql());
        let query = sqlx::query(sqlx::AssertSqlSafe(explain)).bind(consumer);
        diagnostics::plan(&self.pool, "explain consumer counts", query).await
    }
}

#[async_trait]
impl InboxOperator for PgInboxStore {
    async fn consumers(&self) -> Result<Vec<ConsumerSummary>, PortError> {
        // Distinct names by skipping through the (consumer, seq) indexes: one index
        // probe per consumer, not a scan of every delivery.
        let skip = |name: &str, table: &str| {
            format!(
                "{name} AS ( \
                   (SELECT consumer FROM {table} ORDER BY consumer LIMIT 1) \
                   UNION ALL \
                   SELECT (SELECT consumer FROM {table} WHERE consumer > {name}.consumer \
                           ORDER BY consumer LIMIT 1) FROM {name} WHERE {name}.consumer IS NOT NULL)"
            )
        };
        let sql = format!(
            "WITH RECURSIVE {}, {} \
             SELECT consumer FROM deliveries WHERE consumer IS NOT NULL \
             UNION SELECT consumer FROM letters WHERE consumer IS NOT NULL ORDER BY 1",
            skip("deliveries", &self.inbox()),
            skip("letters", &self.letters())
        );
        let names: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .fetch_all(&self.pool)
            .await
            .map_err(|e| port("consumers", e))?;
        // The unfinished states through their partial indexes (inbox_due, inbox_dead) and
        // the dead letters through theirs: O(unfinished) a consumer. Consumed rows are
        // not counted: that would read every row the consumer ever handled.
        let counts = self.consumer_counts_sql();
        let n = |v: i64| u64::try_from(v).unwrap_or(0);
        let mut consumers = Vec::with_capacity(names.len());
        for name in names {
            let (received, consume_failed, dead, dead_letters): (i64, i64, i64, i64) =
                sqlx::query_as(sqlx::AssertSqlSafe(&*counts))
                    .bind(&name)
                    .fetch_one(&self.pool)
                    .await
                    .map_err(|e| port("consumer counts", e))?;
            consumers.push(ConsumerSummary {
                name,
                stats: InboxStats {
                    received: n(received),
                    consumed: 0,
                    consume_failed: n(consume_failed),
                    dead: n(dead),
                    dead_letters: n(dead_letters),
                },
                consumed_counted: false,
            });
        }
        Ok(consumers)
    }

    async fn list_deliveries(
        &self,
        consumer: &str,
        filter: &DeliveryFilter,
        after: Option<PageCursor>,
        limit: u32,
    ) -> Result<Page<DeliverySummary>, PortError> {
        let select = format!(
            "SELECT {}, {} AS received_at FROM {}",
            summary_columns("message_id", "consumed_at"),
            crate::rows::readable_time("received_at"),
            self.inbox()
        );
        let w = Self::of_consumer(consumer, filter)?
            .after_cursor(after.map(|c| c.0), filter.oldest_first)?;
        summary_page(&self.pool, &select, w, limit, filter.oldest_first).await
    }

    async fn get_delivery(
        &self,
        consumer: &str,
        id: MessageId,
    ) -> Result<Option<InboxRecord>, PortError> {
        self.record(consumer, id).await
    }

    async fn oldest_deliveries(
        &self,
        consumer: &str,
        status: InboxStatus,
        limit: u32,
    ) -> Result<Vec<InboxRecord>, PortError> {
        self.records(consumer, status, limit).await
    }

    async fn replay_delivery(
        &self,
        consumer: &str,
        original: MessageId,
        replay: outbox_core::Message,
    ) -> Result<(), PortError> {
        self.replay_record(consumer, original, replay).await
    }

    async fn reconsume_delivery(
        &self,
        consumer: &str,
        id: MessageId,
        again: bool,
    ) -> Result<(), PortError> {
        self.reconsume_record(consumer, id, again).await
    }

    async fn deliveries_of(&self, id: MessageId) -> Result<Vec<InboxRecord>, PortError> {
        #[derive(sqlx::FromRow)]
        struct Row {
            consumer: String,
            #[sqlx(flatten)]
            row: MessageRow,
        }
        // With each side's attempt history: a message's page shows every consumer's.
        let sql = format!(
            "SELECT consumer, {}{} FROM {} WHERE message_id = $1 ORDER BY consumer",
            read_columns("message_id", "consumed_at"),
            crate::rows::HISTORY_COLUMNS,
            self.inbox()
        );
        sqlx::query_as::<_, Row>(sqlx::AssertSqlSafe(sql))
            .bind(id.as_uuid())
            .fetch_all(&self.pool)
            .await
            .map_err(|e| port("deliveries of", e))?
            .iter()
            .map(|r| r.row.inbox_record(&r.consumer))
            .collect()
    }

    async fn reconsume_matching(
        &self,
        consumer: &str,
        filter: &DeliveryFilter,
        max: u64,
    ) -> Result<BulkOutcome, PortError> {
        let t = self.inbox();
        let reconsumable = names(&reconsumable_statuses(filter));
        in_batches(&self.pool, "reconsume", max, |cursor, batch| {
            let mut w = Self::of_consumer(consumer, filter)?.below(cursor)?;
            let guard = w.bind(reconsumable.clone())?;
            let limit = w.bind(i64::try_from(batch).unwrap_or(i64::MAX))?;
            // As the single reconsume: in progress, due now, a fresh retry budget;
            // never a row under a live lease (a worker or the consume sweep has it).
            // A row a retry's transaction locks is waited for and re-checked: it is
            // consumed by then, which the bulk guard leaves out unless asked for.
            Ok(revive_batch(
                &t,
                w,
                &limit,
                &guard,
                "status = 'received', attempts = 0, next_attempt_at = now(), \
                 consumed_at = NULL, locked_by = NULL, locked_until = NULL",
            ))
        })
        .await
    }

    async fn count_deliveries(
        &self,
        consumer: &str,
        filter: &DeliveryFilter,
        max: u64,
    ) -> Result<u64, PortError> {
        let w = Self::of_consumer(consumer, filter)?;
        count_at_most(&self.pool, &self.inbox(), w, max).await
    }

    async fn failure_groups(&self) -> Result<Vec<FailureGroup>, PortError> {
        failure_groups(
            &self.pool,
            &self.inbox(),
            "consumer",
            &[InboxStatus::ConsumeFailed, InboxStatus::Dead],
        )
        .await
    }

    async fn consumed_per_minute(&self, window: Duration) -> Result<Vec<MinuteCount>, PortError> {
        // Served by inbox_consumed_at (consumed_at) WHERE status = 'consumed'.
        per_minute(&self.pool, &self.inbox(), "consumed", "consumed_at", window).await
    }

    async fn list_dead_letters(
        &self,
        consumer: Option<String>,
        after: Option<PageCursor>,
        limit: u32,
    ) -> Result<Page<StoredDeadLetter>, PortError> {
        let limit = outbox_ports::page_limit(limit);
        let mut w = Where::new();
        if let Some(c) = consumer {
            let p = w.bind(c)?;
            w.and(format!("consumer = {p}"));
        }
        let mut w = w.below(after.map(|c| c.0))?;
        let lp = w.bind(i64::from(limit) + 1)?;
        let sql = format!(
            "SELECT {} FROM {}{} ORDER BY seq DESC LIMIT {lp}",
            letter_columns(true),
            self.letters(),
            w.sql()
        );
        let rows: Vec<LetterRow> = sqlx::query_as_with(sqlx::AssertSqlSafe(sql), w.into_args())
            .persistent(false)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| port("list dead letters", e))?;
        page_of(rows, limit, |r| r.seq, |r| Ok(r.letter()))
    }

    async fn get_dead_letter(&self, id: u64) -> Result<Option<StoredDeadLetter>, PortError> {
        let Ok(seq) = i64::try_from(id) else {
            return Ok(None);
        };
        let row: Option<LetterRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {} FROM {} WHERE seq = $1",
            letter_columns(false),
            self.letters()
        )))
        .bind(seq)
        .fetch_optional(&self.pool)
        .await
        .map_err(|e| port("get dead letter", e))?;
        Ok(row.map(LetterRow::letter))
    }

    async fn delete_dead_letter(&self, id: u64) -> Result<(), PortError> {
        let deleted = match i64::try_from(id) {
            Ok(seq) => sqlx::query(sqlx::AssertSqlSafe(format!(
                "DELETE FROM {} WHERE seq = $1",
                self.letters()
            )))
            .bind(seq)
            .execute(&self.pool)
            .await
            .map_err(|e| port("delete dead letter", e))?
            .rows_affected(),
            Err(_) => 0,
        };
        if deleted == 1 {
            Ok(())
        } else {
            Err(PortError::NotFound {
                what: "dead letter",
                id: id.to_string(),
            })
        }
    }
}
