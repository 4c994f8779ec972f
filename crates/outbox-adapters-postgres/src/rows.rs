//! Rows as read from the tables, and their conversion to domain types.

use outbox_core::{
    Decision, FAILED_ATTEMPTS_KEPT, FailedAttempt, Headers, Lifecycle, Message, MessageId, Side,
    SideState, Timestamp,
};
use outbox_ports::{InboxRecord, OutboxRecord, PortError};
use sqlx::Postgres;
use sqlx::postgres::PgArguments;
use sqlx::query::Query;
use sqlx::types::Json;

/// A row `c` no live lease holds.
pub(crate) const LEASE_FREE: &str = "(c.locked_until IS NULL OR c.locked_until < now())";

/// The message columns, in the order both tables share (for INSERTs).
pub(crate) const MESSAGE_COLUMNS: &str = "exchange, routing_key, message_type, headers, payload, content_type, source, correlation_id, created_at";

/// Binds `m`'s id and then its [`MESSAGE_COLUMNS`], in that order: the values every
/// insert of a message into either table lists first (after the inbox's consumer).
pub(crate) fn bind_message_columns<'q>(
    q: Query<'q, Postgres, PgArguments>,
    m: &'q Message,
) -> Query<'q, Postgres, PgArguments> {
    q.bind(m.id.as_uuid())
        .bind(&m.exchange)
        .bind(&m.routing_key)
        .bind(&m.message_type)
        .bind(Json(&m.headers))
        .bind(&m.payload)
        .bind(&m.content_type)
        .bind(&m.source)
        .bind(&m.correlation_id)
        .bind(m.created_at)
}

/// One column of `messages`, as the array an insert over `unnest` binds (the
/// outbox's batch enqueue, the inbox's batch arrival).
pub(crate) fn column<'m, T>(
    messages: impl IntoIterator<Item = &'m Message>,
    value: impl Fn(&'m Message) -> T,
) -> Vec<T> {
    messages.into_iter().map(value).collect()
}

/// `column` where a [`Timestamp`] can hold it, else NULL. sqlx panics decoding a
/// timestamptz outside the `time` crate's years (±9999), and `'infinity'` is one:
/// rows written through plain SQL may hold such values (e.g. `to_timestamp` given
/// milliseconds), and one of them must not crash every read of the table.
pub(crate) fn readable_time(column: &str) -> String {
    format!("CASE WHEN {} THEN {column} END", time_is_readable(column))
}

/// The condition under which [`readable_time`] keeps `column`; the same predicate
/// as the table's `outbox_messages_created_at_amqp` constraint.
pub(crate) fn time_is_readable(column: &str) -> String {
    format!("(isfinite({column}) AND {column} < '10000-01-01 00:00:00+00')")
}

/// What a read of either table selects into a [`MessageRow`]: `id` and `completed`
/// name the table's id and completion columns. Values that could fail or panic in
/// sqlx's decoding are read so that they cannot: headers as text (parsed row by row:
/// jsonb deeper than serde's limit or a number beyond f64 would fail the whole
/// fetch as `Json<Value>`), times through [`readable_time`].
pub(crate) fn read_columns(id: &str, completed: &str) -> String {
    format!(
        "{id} AS id, exchange, routing_key, message_type, headers::text AS headers, payload, \
         content_type, source, correlation_id, {} AS created_at, status, attempts, \
         {} AS last_attempt_at, {} AS next_attempt_at, last_error, {} AS completed_at",
        readable_time("created_at"),
        readable_time("last_attempt_at"),
        readable_time("next_attempt_at"),
        readable_time(completed),
    )
}

#[derive(sqlx::FromRow)]
pub(crate) struct MessageRow {
    pub(crate) id: uuid::Uuid,
    pub(crate) exchange: String,
    pub(crate) routing_key: String,
    pub(crate) message_type: Option<String>,
    /// The jsonb as text, parsed row by row: rows written through plain SQL before
    /// the table's constraints existed may hold anything.
    pub(crate) headers: String,
    pub(crate) payload: Vec<u8>,
    pub(crate) content_type: String,
    pub(crate) source: Option<String>,
    pub(crate) correlation_id: Option<String>,
    /// `None`: a time no [`Timestamp`] can hold (see [`readable_time`]).
    pub(crate) created_at: Option<Timestamp>,
    pub(crate) status: String,
    pub(crate) attempts: i32,
    pub(crate) last_attempt_at: Option<Timestamp>,
    pub(crate) next_attempt_at: Option<Timestamp>,
    pub(crate) last_error: Option<String>,
    pub(crate) completed_at: Option<Timestamp>,
    /// The outbox's due time (absent in inbox reads; see [`outbox_extra_columns`]).
    #[sqlx(default)]
    pub(crate) not_before: Option<Timestamp>,
    /// The outbox's ordering key (absent in inbox reads).
    #[sqlx(default)]
    pub(crate) ordering_key: Option<String>,
    /// The dead row this one replays (read by an operator's reads only).
    #[sqlx(default)]
    pub(crate) replayed_from: Option<uuid::Uuid>,
    /// The row replaying this dead one (read by an operator's reads only).
    #[sqlx(default)]
    pub(crate) replayed_as: Option<uuid::Uuid>,
    /// The attempt history as JSON text (read by an operator's reads only).
    #[sqlx(default)]
    pub(crate) failed_attempts: Option<String>,
}

/// What an operator's reads of one row select beside the rest: its replay links.
pub(crate) const REPLAY_COLUMNS: &str = ", replayed_from, replayed_as";

/// What an operator's reads of one row select for its attempt history (as text,
/// parsed leniently: see [`MessageRow::failed_attempts`]).
pub(crate) const HISTORY_COLUMNS: &str = ", failed_attempts::text AS failed_attempts";

/// The `SET` item of a failure mark that appends this attempt to the row's
/// history and keeps the newest [`FAILED_ATTEMPTS_KEPT`]: `row` qualifies the
/// row's columns (`m.` or empty; a `SET` sees the values before the update), and
/// `error` is the stored error's expression.
pub(crate) fn append_failed_attempt(row: &str, error: &str) -> String {
    format!(
        "failed_attempts = jsonb_path_query_array( \
           coalesce({row}failed_attempts, '[]'::jsonb) || jsonb_build_array(jsonb_build_object( \
             'attempt', {row}attempts + 1, 'at', now(), 'error', {error})), \
           '$[last - {} to last]')",
        FAILED_ATTEMPTS_KEPT - 1
    )
}

/// What outbox reads select beside [`read_columns`]: the due time of a delayed
/// message (a time no [`Timestamp`] can hold reads as none).
pub(crate) fn outbox_extra_columns() -> String {
    format!(
        ", {} AS not_before, ordering_key",
        readable_time("not_before")
    )
}

impl MessageRow {
    /// The headers, or why they are not an object of strings (naming the column).
    pub(crate) fn headers(&self) -> Result<Headers, String> {
        serde_json::from_str::<Headers>(&self.headers)
            .map_err(|e| format!("headers must be a JSON object whose values are strings ({e})"))
    }

    /// The creation time, or why it cannot be read (naming the column).
    fn created_at(&self) -> Result<Timestamp, String> {
        self.created_at.ok_or_else(|| {
            "created_at must be a finite time before the year 10000 (AMQP carries it as \
             a timestamp)"
                .to_owned()
        })
    }

    /// The message, or why the row cannot be one (naming the column).
    pub(crate) fn decoded_message(&self) -> Result<Message, String> {
        let headers = self.headers()?;
        let created_at = self.created_at()?;
        Ok(self.message_with(headers, created_at))
    }

    /// The message as far as it can be read: headers that are not an object of
    /// strings read as none, and a creation time that cannot be read as the Unix
    /// epoch (operators still see the row, and its last error says why). Claims use
    /// [`MessageRow::decoded_message`] instead.
    pub(crate) fn message(&self) -> Message {
        self.message_with(
            self.headers().unwrap_or_default(),
            self.created_at().unwrap_or(Timestamp::UNIX_EPOCH),
        )
    }

    fn message_with(&self, headers: Headers, created_at: Timestamp) -> Message {
        Message {
            id: MessageId::from_uuid(self.id),
            exchange: self.exchange.clone(),
            routing_key: self.routing_key.clone(),
            message_type: self.message_type.clone(),
            headers,
            payload: self.payload.clone(),
            content_type: self.content_type.clone(),
            source: self.source.clone(),
            correlation_id: self.correlation_id.clone(),
            created_at,
            not_before: self.not_before,
            ordering_key: self.ordering_key.clone(),
        }
    }

    /// The attempt history, oldest first. Leniently: an entry that is not an
    /// attempt (a row edited by hand) is left out rather than failing the read,
    /// which an operator needs most when something is wrong.
    pub(crate) fn failed_attempts(&self) -> Vec<FailedAttempt> {
        let Some(text) = self.failed_attempts.as_deref() else {
            return Vec::new();
        };
        let entries: Vec<serde_json::Value> = serde_json::from_str(text).unwrap_or_default();
        entries
            .iter()
            .filter_map(|e| {
                let at = Timestamp::parse(
                    e.get("at")?.as_str()?,
                    &time::format_description::well_known::Rfc3339,
                )
                .ok()?;
                Some(FailedAttempt {
                    attempt: u32::try_from(e.get("attempt")?.as_u64()?).ok()?,
                    at,
                    error: e.get("error")?.as_str()?.to_owned(),
                })
            })
            .collect()
    }

    pub(crate) fn attempts(&self) -> u32 {
        u32::try_from(self.attempts).unwrap_or(0)
    }

    pub(crate) fn status<S: Lifecycle>(&self) -> Result<S, PortError> {
        stored_status(&self.status).map_err(|e| PortError::fatal("read row", e))
    }

    fn state(&self) -> SideState {
        SideState {
            attempts: self.attempts(),
            last_attempt_at: self.last_attempt_at,
            next_attempt_at: self.next_attempt_at,
            last_error: self.last_error.clone(),
            completed_at: self.completed_at,
            failed_attempts: self.failed_attempts(),
        }
    }

    pub(crate) fn outbox_record(&self) -> Result<OutboxRecord, PortError> {
        Ok(OutboxRecord {
            message: self.message(),
            status: self.status()?,
            publish: self.state(),
            replayed_from: self.replayed_from.map(MessageId::from_uuid),
            replayed_as: self.replayed_as.map(MessageId::from_uuid),
        })
    }

    pub(crate) fn inbox_record(&self, consumer: &str) -> Result<InboxRecord, PortError> {
        Ok(InboxRecord {
            consumer: consumer.to_owned(),
            message: self.message(),
            status: self.status()?,
            consume: self.state(),
            replayed_from: self.replayed_from.map(MessageId::from_uuid),
            replayed_as: self.replayed_as.map(MessageId::from_uuid),
        })
    }
}

/// A row returned by a claim, with its claim order.
#[derive(sqlx::FromRow)]
pub(crate) struct ClaimedRow {
    seq: i64,
    #[sqlx(flatten)]
    row: MessageRow,
}

/// Claimed rows in claim order (`UPDATE ... RETURNING` does not keep it), as
/// (message, attempts made before this claim).
pub(crate) fn in_claim_order(mut rows: Vec<ClaimedRow>) -> impl Iterator<Item = (Message, u32)> {
    rows.sort_by_key(|r| r.seq);
    rows.into_iter()
        .map(|r| (r.row.message(), r.row.attempts()))
}

/// Decoded claimed rows (message, attempts before this claim, requeued) and the
/// undecodable ones (id, why).
pub(crate) type DecodedClaim = (Vec<(Message, u32, bool)>, Vec<(MessageId, String)>);

/// Claimed rows in claim order, decoded one by one: the messages with the attempts
/// made before this claim, and the rows that cannot be decoded with why (naming the
/// column), so that one bad row never fails the whole claim.
pub(crate) fn decode_in_claim_order(mut rows: Vec<ClaimedRow>) -> DecodedClaim {
    rows.sort_by_key(|r| r.seq);
    let mut good = Vec::with_capacity(rows.len());
    let mut bad = Vec::new();
    for r in rows {
        match r.row.decoded_message() {
            // Pending with a last error: it failed before and an operator requeued it.
            Ok(m) => good.push((
                m,
                r.row.attempts(),
                r.row.status == "pending" && r.row.last_error.is_some(),
            )),
            Err(why) => bad.push((MessageId::from_uuid(r.row.id), why)),
        }
    }
    (good, bad)
}

/// The status a stored name stands for on `S`'s side, with a message naming the
/// side and the name when it is none of that side's (an inbox row still saying
/// `sent` was written before the migration that renamed it `received`).
pub(crate) fn stored_status<S: Lifecycle>(name: &str) -> Result<S, String> {
    S::parse(name).ok_or_else(|| match (S::SIDE, name) {
        (Side::Inbox, "sent") => {
            "an inbox row with status 'sent' (before `outbox migrate`: it is 'received' now)"
                .to_owned()
        }
        (Side::Outbox, _) => format!("an outbox row with status {name:?}"),
        (Side::Inbox, _) => format!("an inbox row with status {name:?}"),
    })
}

/// `statuses` as stored, for `status = ANY($n)`.
pub(crate) fn names<S: Lifecycle>(statuses: &[S]) -> Vec<String> {
    statuses.iter().map(|s| s.as_str().to_owned()).collect()
}

/// Statuses from which `target` may be reached, by the core's transition table,
/// as stored: the `WHERE status = ANY(..)` of every status-changing statement.
pub(crate) fn sources_of<S: Lifecycle>(target: S) -> Vec<String> {
    let sources: Vec<S> = S::ALL
        .into_iter()
        .filter(|s| s.can_become(target))
        .collect();
    names(&sources)
}

/// The statuses a failure mark takes a row from, whether it ends failed (tried
/// again later) or dead: both outcomes of the one statement start from the same
/// statuses, those from which the core's table allows either.
pub(crate) fn failure_sources<S: Lifecycle>() -> Vec<String> {
    let dead = sources_of(S::DEAD);
    sources_of(S::FAILED)
        .into_iter()
        .filter(|s| dead.contains(s))
        .collect()
}

/// The delay before a failure's next attempt in milliseconds, `None` for a dead
/// one: the failure marks' `delay_ms`, whose NULL makes the row dead.
pub(crate) fn retry_delay_ms(decision: Decision) -> Option<i64> {
    // Within what `now() + interval` can hold (a thousand years is far inside it).
    const LONGEST_MS: i64 = 1_000 * 366 * 24 * 3_600 * 1_000;
    match decision {
        Decision::RetryAfter(d) => Some(millis(d).min(LONGEST_MS)),
        Decision::Dead => None,
    }
}

/// Message ids as the `uuid[]` of `id = ANY($n)`.
pub(crate) fn uuids(ids: &[MessageId]) -> Vec<uuid::Uuid> {
    ids.iter().map(|i| *i.as_uuid()).collect()
}

/// A `count(*)` as read (`bigint`), as a `u64`.
pub(crate) fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// Milliseconds of a duration, for `$n * interval '1 millisecond'`.
pub(crate) fn millis(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Runs a retention `DELETE` (binds: age in ms, batch size) until a statement deletes
/// fewer than `batch` rows; returns how many were deleted. Each statement is short,
/// so retention never holds many locks or a long transaction.
pub(crate) async fn delete_in_batches(
    pool: &sqlx::PgPool,
    sql: &str,
    age: std::time::Duration,
    batch: u32,
) -> Result<u64, PortError> {
    let batch = batch.max(1);
    let mut total = 0;
    loop {
        let n = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(millis(age))
            .bind(i64::from(batch))
            .execute(pool)
            .await
            .map_err(|e| crate::error::port("retention", e))?
            .rows_affected();
        total += n;
        if n < u64::from(batch) {
            return Ok(total);
        }
    }
}

#[cfg(test)]
mod status_tests {
    use outbox_core::{InboxStatus, OutboxStatus};

    use super::*;

    #[test]
    fn guards_come_from_each_sides_own_table() {
        assert_eq!(
            sources_of(OutboxStatus::Sent),
            ["pending", "publish_failed"]
        );
        assert_eq!(
            sources_of(OutboxStatus::Pending),
            ["publish_failed", "dead"]
        );
        assert_eq!(
            failure_sources::<OutboxStatus>(),
            ["pending", "publish_failed"]
        );
        assert_eq!(
            sources_of(InboxStatus::Consumed),
            ["received", "consume_failed"]
        );
        assert_eq!(
            sources_of(InboxStatus::Received),
            ["consumed", "consume_failed", "dead"]
        );
        assert_eq!(
            failure_sources::<InboxStatus>(),
            ["received", "consume_failed"]
        );
        assert_eq!(
            stored_status::<InboxStatus>("received"),
            Ok(InboxStatus::Received)
        );
        assert!(
            stored_status::<InboxStatus>("sent")
                .expect_err("old name")
                .contains("outbox migrate")
        );
        assert!(stored_status::<OutboxStatus>("received").is_err());
    }
}
