//! The outbox on PostgreSQL.

use std::time::Duration;

use async_trait::async_trait;
use outbox_core::message::DEFAULT_MAX_PAYLOAD_BYTES;
use outbox_core::{Decision, Message, MessageId, NewMessage, Status, TransitionError};
use outbox_ports::{
    ClaimedMessage, DeadHead, Lease, OutboxRecord, OutboxRelayPath, OutboxRetention, OutboxStats,
    OutboxStore, PortError, PublishFailure, SpaceReclaim,
};
use sqlx::types::Json;
use sqlx::{PgConnection, PgPool};

use crate::PgSchema;
use crate::error::port;
use crate::rows::{
    ClaimedRow, MESSAGE_COLUMNS, MessageRow, Side, decode_in_claim_order, delete_in_batches,
    millis, outbox_extra_columns, read_columns, readable_time,
};

/// Enqueues messages inside the caller's transaction. Cheap to clone; holds no pool.
///
/// ```no_run
/// # async fn example(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// use outbox_adapters_postgres::{PgOutbox, PgSchema};
/// use outbox_core::NewMessage;
///
/// let outbox = PgOutbox::new(PgSchema::new("outbox")?);
/// let mut tx = pool.begin().await?;
/// sqlx::query("INSERT INTO orders (id) VALUES (42)").execute(&mut *tx).await?;
/// outbox
///     .enqueue(&mut *tx, NewMessage::new("orders", "order.created", br#"{"id":42}"#.to_vec()))
///     .await?;
/// tx.commit().await?; // the message is published only if this commits
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct PgOutbox {
    schema: PgSchema,
    insert: String,
    insert_one: String,
    max_payload_bytes: usize,
}

impl PgOutbox {
    /// Enqueues into the tables of `schema`, with the default payload limit (1 MiB).
    #[must_use]
    pub fn new(schema: PgSchema) -> Self {
        let insert = format!(
            "INSERT INTO {}.outbox_messages (id, {MESSAGE_COLUMNS}, not_before, ordering_key) \
             SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::jsonb[], \
             $6::bytea[], $7::text[], $8::text[], $9::text[], $10::timestamptz[], $11::timestamptz[], \
             $12::text[])",
            schema.quoted()
        );
        // One message, the common case in a business transaction: a plain VALUES
        // insert, cheaper to plan and run than unnest over one-element arrays.
        let insert_one = format!(
            "INSERT INTO {}.outbox_messages (id, {MESSAGE_COLUMNS}, not_before, ordering_key) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
            schema.quoted()
        );
        Self {
            schema,
            insert,
            insert_one,
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
        }
    }

    /// Sets the payload limit.
    #[must_use]
    pub const fn with_max_payload_bytes(mut self, max: usize) -> Self {
        self.max_payload_bytes = max;
        self
    }

    /// The schema.
    #[must_use]
    pub const fn schema(&self) -> &PgSchema {
        &self.schema
    }

    /// Enqueues one message on `conn` (usually `&mut *tx` of the caller's
    /// transaction), with a new UUIDv7 id, and returns the id. With outbox-ports'
    /// `otel` feature the current trace context (`traceparent`, `tracestate`) is added
    /// to its headers unless they carry a `traceparent` already
    /// ([`outbox_ports::trace_context::record_create`]).
    ///
    /// # Errors
    /// [`PortError::InvalidMessage`] when it breaks a limit (nothing is written);
    /// a database error otherwise.
    pub async fn enqueue(
        &self,
        conn: &mut PgConnection,
        message: NewMessage,
    ) -> Result<MessageId, PortError> {
        Ok(self.enqueue_batch(conn, vec![message]).await?[0])
    }

    /// Enqueues several messages in one statement, in order.
    ///
    /// # Errors
    /// As [`PgOutbox::enqueue`]; one invalid message fails the batch.
    pub async fn enqueue_batch(
        &self,
        conn: &mut PgConnection,
        messages: Vec<NewMessage>,
    ) -> Result<Vec<MessageId>, PortError> {
        let now = time::OffsetDateTime::now_utc();
        let mut made = Vec::with_capacity(messages.len());
        for m in messages {
            m.validate(self.max_payload_bytes)?;
            let mut m = m.into_message(MessageId::from_uuid(uuid::Uuid::now_v7()), now);
            // The producer's trace context (through a `create` span), stored in this
            // same transaction (with outbox-ports' `otel` feature; nothing otherwise).
            outbox_ports::trace_context::record_create(&mut m);
            made.push(m);
        }
        self.insert_messages(conn, &made).await?;
        Ok(made.iter().map(|m| m.id).collect())
    }

    /// Stores complete messages (ids and times chosen by the caller) on `conn`.
    ///
    /// # Errors
    /// As [`PgOutbox::enqueue`].
    pub async fn insert_messages(
        &self,
        conn: &mut PgConnection,
        messages: &[Message],
    ) -> Result<(), PortError> {
        if messages.is_empty() {
            return Ok(());
        }
        for m in messages {
            m.validate(self.max_payload_bytes)?;
        }
        if let [m] = messages {
            sqlx::query(&self.insert_one)
                .bind(m.id.as_uuid())
                .bind(&m.exchange)
                .bind(&m.routing_key)
                .bind(&m.message_type)
                .bind(Json(&m.headers))
                .bind(&m.payload)
                .bind(&m.content_type)
                .bind(&m.source)
                .bind(&m.correlation_id)
                .bind(m.created_at)
                .bind(m.not_before)
                .bind(&m.ordering_key)
                .execute(conn)
                .await
                .map_err(|e| port("enqueue", e))?;
            return Ok(());
        }
        let col = |f: fn(&Message) -> Option<String>| messages.iter().map(f).collect::<Vec<_>>();
        sqlx::query(&self.insert)
            .bind(messages.iter().map(|m| *m.id.as_uuid()).collect::<Vec<_>>())
            .bind(
                messages
                    .iter()
                    .map(|m| m.exchange.clone())
                    .collect::<Vec<_>>(),
            )
            .bind(
                messages
                    .iter()
                    .map(|m| m.routing_key.clone())
                    .collect::<Vec<_>>(),
            )
            .bind(col(|m| m.message_type.clone()))
            .bind(
                messages
                    .iter()
                    .map(|m| Json(m.headers.clone()))
                    .collect::<Vec<_>>(),
            )
            .bind(
                messages
                    .iter()
                    .map(|m| m.payload.clone())
                    .collect::<Vec<_>>(),
            )
            .bind(
                messages
                    .iter()
                    .map(|m| m.content_type.clone())
                    .collect::<Vec<_>>(),
            )
            .bind(col(|m| m.source.clone()))
            .bind(col(|m| m.correlation_id.clone()))
            .bind(messages.iter().map(|m| m.created_at).collect::<Vec<_>>())
            .bind(messages.iter().map(|m| m.not_before).collect::<Vec<_>>())
            .bind(col(|m| m.ordering_key.clone()))
            .execute(conn)
            .await
            .map_err(|e| port("enqueue", e))?;
        Ok(())
    }
}

/// A row `c` no live lease holds.
pub(crate) const LEASE_FREE: &str = "(c.locked_until IS NULL OR c.locked_until < now())";

/// A row `c` of table `t` (quoted) that is its ordering key's head: no key, or no
/// earlier row of its key still unsent (in flight, delayed, failing, or dead unless
/// `dead_head` skips them); one probe of outbox_ordered. For a row `c` in a
/// blocking status itself (a failed one), written as "its key's first such row is
/// `c`" ([`first_blocking`]), where a NOT EXISTS over a key holding most of the
/// table could be planned as a sequential scan expecting an early match.
pub(crate) fn head_condition(t: &str, dead_head: DeadHead) -> String {
    format!(
        "(c.ordering_key IS NULL OR c.seq = {})",
        first_blocking(t, dead_head, "e.seq", "c.ordering_key")
    )
}

/// A subquery: `columns` of the first row `e` of table `t` (quoted) of ordering
/// key `key` (a column or parameter: it is pasted in) in a blocking status for
/// `dead_head`, by seq. The key is written as the closed range `>= key AND <=
/// key` and the rows ordered by (ordering_key, seq), not as `= key ORDER BY seq`:
/// with the equality the order reduces to seq, which the primary key and the
/// partial indexes on seq give as well, and for a key holding most of the table
/// the planner may price a walk of those (expecting an early match) below the
/// outbox_ordered probe; it then reads every row of that key (a retry claim read
/// 50,000 so). Ordered by a column that is not fixed, only outbox_ordered gives
/// the order without a sort; and a closed range is estimated as narrow, so a
/// bitmap scan and sort of what a half-open range would match is not chosen
/// either.
fn first_blocking(t: &str, dead_head: DeadHead, columns: &str, key: &str) -> String {
    let blocking = blocking_list(dead_head);
    format!(
        "(SELECT {columns} FROM {t} e WHERE e.ordering_key >= {key} AND e.ordering_key <= {key} \
           AND e.status IN ({blocking}) ORDER BY e.ordering_key, e.seq LIMIT 1)"
    )
}

/// The statuses (quoted, comma-separated) of an earlier message that hold a keyed
/// one back.
fn blocking_list(dead_head: DeadHead) -> String {
    dead_head
        .blocking()
        .iter()
        .map(|s| format!("'{}'", s.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// CTEs of table `t` (quoted) ending in `heads(seq)`: the head row of each ordering
/// key (its first unsent row) that a claim may take now (pending, due, no live
/// lease), keys in key order. The keys are walked one index probe each over
/// outbox_ordered (a loose index scan), never the rows queued behind their heads,
/// so the cost follows the number of keys visited, not the backlog. With
/// `cursor` (a parameter like `$4`), the walk starts after that key and wraps
/// around, so successive claims take turns over the keys instead of always
/// favouring the first ones. Evaluated lazily: a `LIMIT` on `heads` stops the walk.
fn keyed_heads(t: &str, dead_head: DeadHead, cursor: Option<&str>) -> String {
    format!(
        "{}, \
         heads(seq) AS (SELECT h.seq FROM keys CROSS JOIN LATERAL {} h \
           WHERE h.status = 'pending' \
           AND (h.not_before IS NULL OR h.not_before <= now()) \
           AND (h.locked_until IS NULL OR h.locked_until < now()))",
        key_walk(t, dead_head, cursor),
        first_blocking(
            t,
            dead_head,
            "e.seq, e.status, e.not_before, e.locked_until",
            "keys.k"
        )
    )
}

/// CTEs of table `t` (quoted) ending in `keys(k)`: every ordering key with an
/// unsent row, one index probe each over outbox_ordered (see [`keyed_heads`]).
fn key_walk(t: &str, dead_head: DeadHead, cursor: Option<&str>) -> String {
    let blocking = blocking_list(dead_head);
    let next_key = |after: &str, upto: &str| {
        format!(
            "(SELECT ordering_key FROM {t} WHERE ordering_key > {after}{upto} \
               AND status IN ({blocking}) ORDER BY ordering_key LIMIT 1)"
        )
    };
    let walk = |name: &str, first: String, upto: &str| {
        format!(
            "{name}(k) AS ({first} UNION ALL SELECT {} FROM {name} WHERE {name}.k IS NOT NULL)",
            next_key(&format!("{name}.k"), upto)
        )
    };
    let first_key = |cond: &str| {
        format!(
            "(SELECT ordering_key FROM {t} WHERE ordering_key IS NOT NULL{cond} \
               AND status IN ({blocking}) ORDER BY ordering_key LIMIT 1)"
        )
    };
    let (walks, keys) = match cursor {
        Some(c) => (
            format!(
                "{}, {}",
                walk(
                    "keys_after",
                    first_key(&format!(" AND ordering_key > {c}")),
                    ""
                ),
                walk(
                    "keys_before",
                    first_key(&format!(" AND ordering_key <= {c}")),
                    &format!(" AND ordering_key <= {c}")
                ),
            ),
            "SELECT k FROM keys_after WHERE k IS NOT NULL \
             UNION ALL SELECT k FROM keys_before WHERE k IS NOT NULL"
                .to_owned(),
        ),
        None => (
            walk("keys_all", first_key(""), ""),
            "SELECT k FROM keys_all WHERE k IS NOT NULL".to_owned(),
        ),
    };
    format!("{walks}, keys(k) AS ({keys})")
}

/// The statuses (quoted, comma-separated) of a key's head that block the key
/// ([`DeadHead::stuck`]).
fn stuck_list(dead_head: DeadHead) -> String {
    dead_head
        .stuck()
        .iter()
        .map(|s| format!("'{}'", s.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The blocked keys of table `t` (quoted), in key order: `$1` the page size, `$2`
/// the cap of the waiting count plus one, with `cursor` (a parameter like `$3`)
/// only keys after it. The walk visits only keys with a failing (or, blocking,
/// dead) row, one index probe each over outbox_keyed_stuck (a loose index scan),
/// and reads each one's head with one more probe of outbox_ordered; it stops as
/// soon as `$1` blocked keys are found. So a page costs the stuck keys it passes,
/// never the healthy keys nor the rows queued behind the heads (the waiting count
/// reads at most `$2` index entries of a key, in seq order). The walk carries
/// the number of blocked keys found so far; the final ORDER BY sorts only the
/// keys walked. The rows behind a head are read as [`first_blocking`] reads a
/// key's head (a closed key range in outbox_ordered's order), for its reason.
fn blocked_keys(t: &str, dead_head: DeadHead, cursor: Option<&str>) -> String {
    let blocking = blocking_list(dead_head);
    let stuck = stuck_list(dead_head);
    let next_key = |cond: &str| {
        format!(
            "(SELECT ordering_key FROM {t} WHERE {cond} \
               AND status IN ({stuck}) ORDER BY ordering_key LIMIT 1)"
        )
    };
    let first = next_key(&match cursor {
        Some(c) => format!("ordering_key > {c}"),
        None => "ordering_key IS NOT NULL".to_owned(),
    });
    let head_status = |k: &str| first_blocking(t, dead_head, "e.status", k);
    format!(
        "WITH RECURSIVE walk(k, found) AS (\
           SELECT {first}, 0 \
           UNION ALL \
           SELECT {}, walk.found + CASE WHEN {} IN ({stuck}) THEN 1 ELSE 0 END \
           FROM walk WHERE walk.k IS NOT NULL AND walk.found < $1) \
         SELECT walk.k AS key, h.id, h.status, h.attempts, h.last_error, \
           {} AS next_attempt_at, \
           (SELECT count(*) FROM (SELECT 1 FROM {t} w \
              WHERE w.ordering_key >= walk.k AND w.ordering_key <= walk.k AND w.seq > h.seq \
              AND w.status IN ({blocking}) ORDER BY w.ordering_key, w.seq LIMIT $2) behind) AS waiting \
         FROM walk CROSS JOIN LATERAL {} h \
         WHERE walk.k IS NOT NULL AND h.status IN ({stuck}) \
         ORDER BY walk.k LIMIT $1",
        next_key("ordering_key > walk.k"),
        head_status("walk.k"),
        readable_time("h.next_attempt_at"),
        first_blocking(
            t,
            dead_head,
            "e.seq, e.id, e.status, e.attempts, e.last_error, e.next_attempt_at",
            "walk.k"
        ),
    )
}

/// Whether a claim of pending rows of table `t` (quoted) would take anything: a
/// row pending and not leased that is due and its key's head, exactly what the
/// claim's three picks look for (so an idle relay is never told there is work the
/// claim will not take).
pub(crate) fn claimable_pending_exists(t: &str, dead_head: DeadHead) -> String {
    format!(
        "WITH RECURSIVE {} \
         SELECT EXISTS (SELECT 1 FROM {t} c WHERE c.status = 'pending' \
           AND c.not_before IS NULL AND c.ordering_key IS NULL AND {LEASE_FREE}) \
         OR EXISTS (SELECT 1 FROM {t} c WHERE c.status = 'pending' AND c.ordering_key IS NULL \
           AND c.not_before IS NOT NULL AND c.not_before <= now() AND {LEASE_FREE}) \
         OR EXISTS (SELECT 1 FROM heads)",
        keyed_heads(t, dead_head, None)
    )
}

/// How many rows at the front of each claim's order the clearing of expired leases
/// reads ([`OutboxRelayPath::recover_expired_leases`]): a relay's claims are at most
/// a few batches, and they sit there.
const RECOVER_WINDOW: i64 = 10_000;

/// Statements of the store, built once with the validated, quoted schema.
#[derive(Debug)]
struct Sql {
    claim_pending: String,
    claim_retries: String,
    next_due: String,
    claimable: String,
    mark_sent: String,
    mark_failed: String,
    release: String,
    recover: String,
    stats: String,
    count: String,
    get: String,
    list: String,
    requeue: String,
    status_of: String,
    delete: String,
    retention: String,
    blocked_first: String,
    blocked_after: String,
    head_of_key: String,
}

impl Sql {
    fn new(schema: &PgSchema, dead_head: DeadHead) -> Self {
        let t = format!("{}.outbox_messages", schema.quoted());
        let returning = format!(
            "{}{}",
            read_columns("id", "sent_at"),
            outbox_extra_columns()
        );
        // Keys held back: the key's head (its first row in a blocking status) is
        // failing or (unless skipped) dead; one probe of outbox_ordered per
        // failing or dead keyed row, never the rows queued behind a head.
        let stuck = stuck_list(dead_head);
        let oldest = readable_time("created_at");
        // Keyed messages waiting: each key's first pending row not delayed, which
        // is the head itself or the first one queued behind a failing, dead or
        // delayed head (those wait too, and an age alert must see them). One probe
        // of outbox_ordered_live per key, which holds no dead rows: it reads the
        // head and at most the row after it, never the rest of the queue.
        let walk = key_walk(&t, dead_head, None);
        let head_oldest = readable_time("h.created_at");
        let first_of_key = "(SELECT e.created_at, e.status, e.not_before FROM {t} e \
             WHERE e.ordering_key >= keys.k AND e.ordering_key <= keys.k \
               AND e.status = 'pending' AND e.not_before IS NULL \
             ORDER BY e.ordering_key, e.seq LIMIT 1)"
            .replace("{t}", &t);
        let recover_walk = key_walk(&t, dead_head, None);
        let recover_head = first_blocking(
            &t,
            dead_head,
            "e.seq, e.status, e.locked_by, e.locked_until",
            "ks.k",
        );
        let overdue = readable_time("not_before");
        let lease_free = LEASE_FREE;
        let head = head_condition(&t, dead_head);
        let claim_retries = format!(
            "WITH picked AS (SELECT c.seq FROM {t} c WHERE c.status = 'publish_failed' \
               AND c.next_attempt_at <= now() AND {lease_free} AND {head} \
               ORDER BY c.next_attempt_at, c.seq LIMIT $1 FOR UPDATE SKIP LOCKED) \
             UPDATE {t} m SET locked_by = $2, locked_until = now() + $3 * interval '1 millisecond' \
             FROM picked WHERE m.seq = picked.seq \
             RETURNING m.seq, {returning}"
        );
        // Three picks, oldest seq first: rows without a key and due time by seq
        // (outbox_pending_unkeyed); delayed rows without a key whose time has come
        // by due time (outbox_scheduled, read only up to now(): the delayed rows
        // still waiting are never visited); and the heads of ordering keys, walked
        // key by key from this store's cursor (outbox_ordered), so the rows queued
        // behind a head are never visited either. Each pick reads about what it
        // takes, whatever the backlog.
        let claim_pending = format!(
            "WITH RECURSIVE {}, \
             now_rows AS (SELECT c.seq FROM {t} c WHERE c.status = 'pending' \
               AND c.not_before IS NULL AND c.ordering_key IS NULL AND {lease_free} \
               ORDER BY c.seq LIMIT $1 FOR UPDATE SKIP LOCKED), \
             due_rows AS (SELECT c.seq FROM {t} c WHERE c.status = 'pending' AND c.ordering_key IS NULL \
               AND c.not_before IS NOT NULL AND c.not_before <= now() AND {lease_free} \
               ORDER BY c.not_before, c.seq LIMIT $1 FOR UPDATE SKIP LOCKED), \
             keyed_rows AS (SELECT c.seq FROM {t} c WHERE c.seq IN (SELECT seq FROM heads LIMIT $1) \
               AND c.status = 'pending' AND {lease_free} FOR UPDATE SKIP LOCKED), \
             picked AS (SELECT seq FROM now_rows UNION ALL SELECT seq FROM due_rows \
               UNION ALL SELECT seq FROM keyed_rows ORDER BY seq LIMIT $1) \
             UPDATE {t} m SET locked_by = $2, locked_until = now() + $3 * interval '1 millisecond' \
             FROM picked WHERE m.seq = picked.seq \
             RETURNING m.seq, {returning}",
            keyed_heads(&t, dead_head, Some("$4"))
        );
        Self {
            // The key's head and how many wait behind it (as a blocked key's, up
            // to the cap: $2 is the cap plus one).
            head_of_key: format!(
                "SELECT h.id, (SELECT count(*) FROM (SELECT 1 FROM {t} w \
                   WHERE w.ordering_key >= $1 AND w.ordering_key <= $1 AND w.seq > h.seq \
                   AND w.status IN ({}) ORDER BY w.ordering_key, w.seq LIMIT $2) behind) \
                 FROM {} h",
                blocking_list(dead_head),
                first_blocking(&t, dead_head, "e.id, e.seq", "$1")
            ),
            blocked_first: blocked_keys(&t, dead_head, None),
            blocked_after: blocked_keys(&t, dead_head, Some("$3")),
            claim_pending,
            claim_retries,
            // Only times still to come: a due row is the claim's business (and one
            // held back by its key or another relay's lock must not make an idle
            // relay spin).
            // The time left, computed here: one clock (the database's, which the
            // claims compare with), never the relay's. Whole microseconds.
            next_due: format!(
                "SELECT (EXTRACT(EPOCH FROM (not_before - now())) * 1000000)::bigint \
                 FROM {t} WHERE status = 'pending' AND not_before IS NOT NULL \
                 AND not_before > now() ORDER BY not_before LIMIT 1"
            ),
            mark_sent: format!(
                "UPDATE {t} SET status = 'sent', sent_at = now(), attempts = attempts + 1, \
                 last_attempt_at = now(), next_attempt_at = NULL, locked_by = NULL, locked_until = NULL \
                 WHERE id = ANY($1) AND locked_by = $2 AND status = ANY($3)"
            ),
            mark_failed: format!(
                "UPDATE {t} m SET \
                   status = CASE WHEN f.delay_ms IS NULL THEN 'dead' ELSE 'publish_failed' END, \
                   attempts = m.attempts + 1, last_attempt_at = now(), last_error = f.error, \
                   next_attempt_at = now() + f.delay_ms * interval '1 millisecond', \
                   locked_by = NULL, locked_until = NULL \
                 FROM unnest($1::uuid[], $2::text[], $3::bigint[]) AS f(id, error, delay_ms) \
                 WHERE m.id = f.id AND m.locked_by = $4 AND m.status = ANY($5)"
            ),
            release: format!(
                "UPDATE {t} SET locked_by = NULL, locked_until = NULL \
                 WHERE id = ANY($1) AND locked_by = $2"
            ),
            // No index covers the lease columns (so that a claim can rewrite a row
            // in place, migration 20261214000001): the leases of a vanished relay
            // are looked for where its claims came from, the first $1 rows of each
            // of the claims' picks (rows without a key or due time by seq, due
            // delayed ones by due time, the heads of the first $1 ordering keys,
            // failed ones by next attempt). So the cost is bounded whatever the
            // backlog; a lease beyond stays until a claim takes the row, which
            // claims do whether a lease that ran out was cleared or not. The rows
            // are then updated by seq (`= ANY` of an array: primary key probes,
            // whatever the statistics of the lease columns say), and the lease is
            // re-tested on the row's newest version, so one claimed meanwhile keeps
            // its lease.
            recover: format!(
                "WITH RECURSIVE {recover_walk}, \
                 lease_window AS ( \
                   (SELECT c.seq, c.locked_by, c.locked_until FROM {t} c WHERE c.status = 'pending' \
                     AND c.not_before IS NULL AND c.ordering_key IS NULL ORDER BY c.seq LIMIT $1) \
                   UNION ALL (SELECT c.seq, c.locked_by, c.locked_until FROM {t} c \
                     WHERE c.status = 'pending' AND c.ordering_key IS NULL AND c.not_before IS NOT NULL \
                     AND c.not_before <= now() ORDER BY c.not_before, c.seq LIMIT $1) \
                   UNION ALL (SELECT h.seq, h.locked_by, h.locked_until \
                     FROM (SELECT k FROM keys LIMIT $1) ks CROSS JOIN LATERAL {recover_head} h \
                     WHERE h.status = 'pending') \
                   UNION ALL (SELECT c.seq, c.locked_by, c.locked_until FROM {t} c \
                     WHERE c.status = 'publish_failed' ORDER BY c.next_attempt_at, c.seq LIMIT $1)) \
                 UPDATE {t} m SET locked_by = NULL, locked_until = NULL \
                 WHERE m.seq = ANY (ARRAY(SELECT seq FROM lease_window \
                     WHERE locked_by IS NOT NULL AND locked_until < now())) \
                   AND m.locked_by IS NOT NULL AND m.locked_until < now()"
            ),
            // Every part reads one partial index of an unsent status (outbox_pending,
            // outbox_retry_due, outbox_dead): no count over sent rows, which are
            // most of the table (tests/stats_scale.rs checks the plan). The oldest
            // skips times no Timestamp can hold: one such row must not fail (or,
            // in sqlx, panic) every readiness check and scrape.
            // Each count reads one partial index. A delayed row
            // waits from its due time, not its creation: only overdue ones count
            // towards the oldest unsent.
            claimable: claimable_pending_exists(&t, dead_head),
            stats: format!(
                "SELECT \
                   (SELECT count(*) FROM {t} WHERE status = 'pending') AS pending, \
                   (SELECT count(*) FROM {t} WHERE status = 'pending' AND not_before IS NOT NULL) AS scheduled, \
                   (SELECT count(*) FROM {t} WHERE status = 'publish_failed') AS publish_failed, \
                   (SELECT count(*) FROM {t} WHERE status = 'dead') AS dead, \
                   (SELECT count(*) FROM {t} c WHERE c.ordering_key IS NOT NULL \
                      AND c.status IN ({stuck}) AND {head}) AS blocked_keys, \
                   LEAST((SELECT {oldest} FROM {t} WHERE status = 'pending' AND not_before IS NULL \
                            AND ordering_key IS NULL ORDER BY seq LIMIT 1), \
                         (WITH RECURSIVE {walk} SELECT min({head_oldest}) FROM keys CROSS JOIN LATERAL \
                            {first_of_key} h \
                            WHERE h.status = 'pending' AND h.not_before IS NULL), \
                         (SELECT {overdue} FROM {t} WHERE status = 'pending' AND not_before IS NOT NULL \
                            AND not_before <= now() ORDER BY not_before LIMIT 1), \
                         (SELECT min({oldest}) FROM {t} WHERE status = 'publish_failed')) AS oldest"
            ),
            count: format!("SELECT count(*) FROM {t} WHERE status = $1"),
            get: format!("SELECT {returning} FROM {t} WHERE id = $1"),
            list: format!("SELECT {returning} FROM {t} WHERE status = $1 ORDER BY seq LIMIT $2"),
            // Never a row under a relay's live lease: it may be on its way to the
            // broker, and clearing the lease would fence off the relay's mark and
            // publish it twice. A mark that commits while this waits for the row
            // is re-checked here: a row sent meanwhile stays sent.
            requeue: format!(
                "UPDATE {t} SET status = 'pending', attempts = 0, next_attempt_at = NULL, \
                 sent_at = NULL, locked_by = NULL, locked_until = NULL \
                 WHERE id = $1 AND status = ANY($2) AND (locked_until IS NULL OR locked_until < now())"
            ),
            status_of: format!("SELECT status FROM {t} WHERE id = $1"),
            delete: format!("DELETE FROM {t} WHERE id = $1 AND status = ANY($2)"),
            // The outer `status = 'sent'` is re-checked on a row changed since the
            // subquery picked it, so only rows still sent are ever deleted.
            retention: format!(
                "DELETE FROM {t} WHERE status = 'sent' AND seq IN (SELECT seq FROM {t} WHERE status = 'sent' \
                 AND sent_at < now() - $1 * interval '1 millisecond' ORDER BY sent_at LIMIT $2)"
            ),
        }
    }
}

/// [`OutboxStore`] on PostgreSQL.
#[derive(Debug, Clone)]
pub struct PgOutboxStore {
    pool: PgPool,
    outbox: PgOutbox,
    sql: std::sync::Arc<Sql>,
    /// The ordering key after which this store's next claim starts walking the
    /// keys (see [`keyed_heads`]); shared by its clones.
    key_cursor: std::sync::Arc<std::sync::Mutex<String>>,
}

impl PgOutboxStore {
    /// A store on `pool` over the tables of `schema` (run [`crate::migrate`] first).
    #[must_use]
    pub fn new(pool: PgPool, schema: PgSchema) -> Self {
        Self {
            pool,
            sql: std::sync::Arc::new(Sql::new(&schema, DeadHead::default())),
            outbox: PgOutbox::new(schema),
            key_cursor: std::sync::Arc::default(),
        }
    }

    /// Sets the payload limit (default 1 MiB).
    #[must_use]
    pub fn with_max_payload_bytes(mut self, max: usize) -> Self {
        self.outbox = self.outbox.with_max_payload_bytes(max);
        self
    }

    /// What a dead message does to the later messages of its ordering key (default
    /// [`DeadHead::Block`]).
    #[must_use]
    pub fn with_dead_head(mut self, dead_head: DeadHead) -> Self {
        self.sql = std::sync::Arc::new(Sql::new(self.outbox.schema(), dead_head));
        self
    }

    /// The transactional enqueue handle of the same schema.
    #[must_use]
    pub const fn outbox(&self) -> &PgOutbox {
        &self.outbox
    }

    /// The pool.
    #[must_use]
    pub const fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Retention: deletes sent messages older than `age`, `batch` rows per statement,
    /// until none is left; returns how many. Each statement is short, so it never
    /// holds many locks or a long transaction.
    ///
    /// # Errors
    /// A database error; what was deleted before it stays deleted.
    pub async fn delete_sent_older_than(
        &self,
        age: Duration,
        batch: u32,
    ) -> Result<u64, PortError> {
        delete_in_batches(&self.pool, &self.sql.retention, age, batch).await
    }

    /// The plan PostgreSQL would use for a claim of `limit` pending rows (`EXPLAIN`,
    /// nothing is claimed): for operators checking that claims stay on the partial
    /// index however large the table grows.
    ///
    /// # Errors
    /// A database error.
    pub async fn explain_claim_pending(&self, limit: u32) -> Result<String, PortError> {
        let lines: Vec<String> = sqlx::query_scalar(&format!("EXPLAIN {}", self.sql.claim_pending))
            .bind(i64::from(limit))
            .bind("explain")
            .bind(0_i64)
            .bind(self.key_cursor())
            .fetch_all(&self.pool)
            .await
            .map_err(|e| port("explain claim", e))?;
        Ok(lines.join("\n"))
    }

    /// The plan and row counts of a real claim of `limit` pending rows
    /// (`EXPLAIN ANALYZE`), run in a transaction that is rolled back, so nothing
    /// stays claimed: for operators and tests checking that claims read only the
    /// rows they take.
    ///
    /// # Errors
    /// A database error.
    pub async fn explain_analyze_claim_pending(&self, limit: u32) -> Result<String, PortError> {
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(|e| port("explain claim", e))?;
        let lines: Vec<String> = sqlx::query_scalar(&format!(
            "EXPLAIN (ANALYZE, TIMING OFF, COSTS OFF) {}",
            self.sql.claim_pending
        ))
        .bind(i64::from(limit))
        .bind("explain")
        .bind(0_i64)
        .bind(self.key_cursor())
        .fetch_all(&mut *tx)
        .await
        .map_err(|e| port("explain claim", e))?;
        tx.rollback().await.map_err(|e| port("explain claim", e))?;
        Ok(lines.join("\n"))
    }

    /// The plan and row counts of a real claim of `limit` failed rows due for a
    /// retry (`EXPLAIN ANALYZE`), in a transaction that is rolled back: for tests
    /// checking that the key-head rule reads one index probe, not the rows of
    /// other keys.
    ///
    /// # Errors
    /// A database error.
    pub async fn explain_analyze_claim_retries(&self, limit: u32) -> Result<String, PortError> {
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(|e| port("explain retry claim", e))?;
        let lines: Vec<String> = sqlx::query_scalar(&format!(
            "EXPLAIN (ANALYZE, TIMING OFF, COSTS OFF) {}",
            self.sql.claim_retries
        ))
        .bind(i64::from(limit))
        .bind("explain")
        .bind(0_i64)
        .fetch_all(&mut *tx)
        .await
        .map_err(|e| port("explain retry claim", e))?;
        tx.rollback()
            .await
            .map_err(|e| port("explain retry claim", e))?;
        Ok(lines.join("\n"))
    }

    /// The plan and row counts of a real clearing of expired leases (`EXPLAIN
    /// ANALYZE` of [`OutboxRelayPath::recover_expired_leases`]), in a transaction
    /// that is rolled back: for tests checking that it reads the front of the
    /// backlog, never the whole table.
    ///
    /// # Errors
    /// A database error.
    pub async fn explain_analyze_recover_expired_leases(&self) -> Result<String, PortError> {
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(|e| port("explain recover leases", e))?;
        let lines: Vec<String> = sqlx::query_scalar(&format!(
            "EXPLAIN (ANALYZE, TIMING OFF, COSTS OFF) {}",
            self.sql.recover
        ))
        .bind(RECOVER_WINDOW)
        .fetch_all(&mut *tx)
        .await
        .map_err(|e| port("explain recover leases", e))?;
        tx.rollback()
            .await
            .map_err(|e| port("explain recover leases", e))?;
        Ok(lines.join("\n"))
    }

    /// The exact number of messages in `status`. Its cost follows the rows in that
    /// status: for `Sent`, the whole kept history. For operators and tests, never
    /// for a scrape or a health check ([`OutboxStore::stats`] is made for those).
    ///
    /// # Errors
    /// A database error.
    pub async fn count(&self, status: Status) -> Result<u64, PortError> {
        let n: i64 = sqlx::query_scalar(&self.sql.count)
            .bind(status.as_str())
            .fetch_one(&self.pool)
            .await
            .map_err(|e| port("count", e))?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// What the stats query (run by every `/metrics` scrape and `/readyz` check)
    /// does: `EXPLAIN ANALYZE` of it, with the rows each step read. It runs the
    /// query once (read-only), for operators checking that it stays on the partial
    /// indexes of the unsent rows however many sent rows the table keeps.
    ///
    /// # Errors
    /// A database error.
    pub async fn explain_stats(&self) -> Result<String, PortError> {
        let lines: Vec<String> = sqlx::query_scalar(&format!(
            "EXPLAIN (ANALYZE, TIMING OFF, COSTS OFF) {}",
            self.sql.stats
        ))
        .fetch_all(&self.pool)
        .await
        .map_err(|e| port("explain stats", e))?;
        Ok(lines.join("\n"))
    }

    /// The blocked ordering keys after `after`, at most `limit` (clamped by
    /// [`outbox_ports::page_limit`]): what [`outbox_ports::OutboxOperator::blocked_keys`]
    /// returns.
    ///
    /// # Errors
    /// A database error.
    /// See [`outbox_ports::OutboxOperator::head_of_key`].
    pub(crate) async fn head_of_key_id(
        &self,
        key: &str,
    ) -> Result<Option<outbox_ports::KeyHead>, PortError> {
        let head: Option<(uuid::Uuid, i64)> = sqlx::query_as(&self.sql.head_of_key)
            .bind(key)
            .bind(blocked_count_limit())
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| port("head of key", e))?;
        let cap = outbox_ports::BLOCKED_WAITING_CAP;
        Ok(head.map(|(id, behind)| {
            let behind = u64::try_from(behind).unwrap_or(0);
            outbox_ports::KeyHead {
                head: MessageId::from_uuid(id),
                waiting: behind.min(cap),
                waiting_capped: behind > cap,
            }
        }))
    }

    pub(crate) async fn blocked_keys_page(
        &self,
        after: Option<String>,
        limit: u32,
    ) -> Result<Vec<outbox_ports::BlockedKey>, PortError> {
        let (sql, cursor) = self.blocked_statement(after);
        let mut tx = self.blocked_keys_tx().await?;
        let mut q = sqlx::query_as::<_, BlockedRow>(sql)
            .bind(i64::from(outbox_ports::page_limit(limit)))
            .bind(blocked_count_limit());
        if let Some(k) = cursor {
            q = q.bind(k);
        }
        let rows = q
            .fetch_all(&mut *tx)
            .await
            .map_err(|e| port("blocked keys", e))?;
        tx.rollback().await.map_err(|e| port("blocked keys", e))?;
        let cap = outbox_ports::BLOCKED_WAITING_CAP;
        rows.into_iter().map(|r| r.blocked_key(cap)).collect()
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
        let explain = format!("EXPLAIN (ANALYZE, TIMING OFF, COSTS OFF) {sql}");
        let mut tx = self.blocked_keys_tx().await?;
        let mut q = sqlx::query_scalar::<_, String>(&explain)
            .bind(i64::from(outbox_ports::page_limit(limit)))
            .bind(blocked_count_limit());
        if let Some(k) = cursor {
            q = q.bind(k);
        }
        let lines = q
            .fetch_all(&mut *tx)
            .await
            .map_err(|e| port("explain blocked keys", e))?;
        tx.rollback()
            .await
            .map_err(|e| port("explain blocked keys", e))?;
        Ok(lines.join("\n"))
    }

    fn blocked_statement(&self, after: Option<String>) -> (&str, Option<String>) {
        match after {
            Some(k) => (&self.sql.blocked_after, Some(k)),
            None => (&self.sql.blocked_first, None),
        }
    }

    /// A read-only transaction for a page of blocked keys, without bitmap scans:
    /// a bitmap index scan cannot stop early, so counting a key's waiting rows
    /// through one would read every index entry behind the head (a key's whole
    /// backlog) before the LIMIT applies; an index scan stops at the cap.
    async fn blocked_keys_tx(
        &self,
    ) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, PortError> {
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(|e| port("blocked keys", e))?;
        sqlx::query("SET LOCAL enable_bitmapscan = off")
            .execute(&mut *tx)
            .await
            .map_err(|e| port("blocked keys", e))?;
        Ok(tx)
    }

    /// The key cursor's value for the next claim.
    fn key_cursor(&self) -> String {
        self.key_cursor
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Moves the key cursor past the keys a claim took: to the greatest one after
    /// where it stood, or (the walk wrapped around) the greatest one before it, or
    /// back to the start when the claim took no keyed row.
    fn advance_key_cursor(&self, claimed: &[ClaimedMessage]) {
        let mut cursor = self
            .key_cursor
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let keys = claimed
            .iter()
            .filter_map(|c| c.message.ordering_key.as_ref());
        let after = keys.clone().filter(|k| **k > *cursor).max();
        *cursor = after.or_else(|| keys.max()).cloned().unwrap_or_default();
    }

    /// Runs claim statement `sql`; `cursor` is its fourth parameter, if it has one.
    async fn claim(
        &self,
        sql: &str,
        lease: &Lease,
        limit: u32,
        cursor: Option<String>,
    ) -> Result<Vec<ClaimedMessage>, PortError> {
        let mut query = sqlx::query_as(sql)
            .bind(i64::from(limit))
            .bind(&lease.holder)
            .bind(millis(lease.ttl));
        if let Some(c) = cursor {
            query = query.bind(c);
        }
        let rows: Vec<ClaimedRow> = query
            .fetch_all(&self.pool)
            .await
            .map_err(|e| port("claim", e))?;
        let (good, bad) = decode_in_claim_order(rows);
        if !bad.is_empty() {
            self.bury_undecodable(lease, bad).await;
        }
        Ok(good
            .into_iter()
            .map(|(message, attempts, requeued)| ClaimedMessage {
                message,
                attempts,
                requeued,
            })
            .collect())
    }

    /// Marks claimed rows that cannot be decoded (written through plain SQL before
    /// the table's constraints existed) dead at once, under the claim's lease, with
    /// why: no retry can make them readable. If the mark fails, the rows stay
    /// leased, come back when the lease runs out and are tried again; the decoded
    /// rows of the claim flow either way.
    async fn bury_undecodable(&self, lease: &Lease, bad: Vec<(MessageId, String)>) {
        let failures: Vec<PublishFailure> = bad
            .into_iter()
            .map(|(id, why)| {
                tracing::warn!(message_id = %id, reason = %why, "claimed row cannot be decoded; dead at once");
                PublishFailure {
                    id,
                    error: format!("cannot be decoded: {why}"),
                    decision: Decision::Dead,
                }
            })
            .collect();
        if let Err(e) = self.mark_publish_failed(lease, &failures).await {
            tracing::warn!(error = %e, rows = failures.len(), "marking undecodable rows dead failed; they come back when their lease runs out");
        }
    }

    async fn revive_error(&self, id: MessageId, target: Status) -> PortError {
        match sqlx::query_scalar::<_, String>(&self.sql.status_of)
            .bind(id.as_uuid())
            .fetch_optional(&self.pool)
            .await
        {
            Ok(None) => PortError::NotFound {
                what: "message",
                id: id.to_string(),
            },
            Ok(Some(s)) => match s.parse::<Status>() {
                // In a status the requeue takes, only a relay's lease kept it out.
                Ok(from) if from.can_become(target) => PortError::Busy {
                    what: "message",
                    id: id.to_string(),
                    holder: "a relay is publishing it",
                },
                Ok(from) => TransitionError { from, to: target }.into(),
                Err(e) => PortError::fatal("requeue", e),
            },
            Err(e) => port("requeue", e),
        }
    }
}

#[async_trait]
impl OutboxRelayPath for PgOutboxStore {
    async fn claim_pending(
        &self,
        lease: &Lease,
        limit: u32,
    ) -> Result<Vec<ClaimedMessage>, PortError> {
        let claimed = self
            .claim(
                &self.sql.claim_pending,
                lease,
                limit,
                Some(self.key_cursor()),
            )
            .await?;
        self.advance_key_cursor(&claimed);
        Ok(claimed)
    }

    async fn claim_due_retries(
        &self,
        lease: &Lease,
        limit: u32,
    ) -> Result<Vec<ClaimedMessage>, PortError> {
        self.claim(&self.sql.claim_retries, lease, limit, None)
            .await
    }

    async fn mark_sent(&self, lease: &Lease, ids: &[MessageId]) -> Result<u64, PortError> {
        if ids.is_empty() {
            return Ok(0);
        }
        Ok(sqlx::query(&self.sql.mark_sent)
            .bind(ids.iter().map(|i| *i.as_uuid()).collect::<Vec<_>>())
            .bind(&lease.holder)
            .bind(Side::Outbox.sources_of(Status::Sent))
            .execute(&self.pool)
            .await
            .map_err(|e| port("mark sent", e))?
            .rows_affected())
    }

    async fn mark_publish_failed(
        &self,
        lease: &Lease,
        failures: &[PublishFailure],
    ) -> Result<u64, PortError> {
        if failures.is_empty() {
            return Ok(0);
        }
        let delays: Vec<Option<i64>> = failures
            .iter()
            .map(|f| match f.decision {
                Decision::RetryAfter(d) => Some(millis(d)),
                Decision::Dead => None,
            })
            .collect();
        // Both outcomes start from the same statuses (the core's table).
        let from: Vec<String> = Side::Outbox
            .sources_of(Status::PublishFailed)
            .into_iter()
            .filter(|s| Side::Outbox.sources_of(Status::Dead).contains(s))
            .collect();
        Ok(sqlx::query(&self.sql.mark_failed)
            .bind(failures.iter().map(|f| *f.id.as_uuid()).collect::<Vec<_>>())
            .bind(
                failures
                    .iter()
                    .map(|f| crate::storable::error_text(&f.error))
                    .collect::<Vec<_>>(),
            )
            .bind(delays)
            .bind(&lease.holder)
            .bind(from)
            .execute(&self.pool)
            .await
            .map_err(|e| port("mark publish failed", e))?
            .rows_affected())
    }

    async fn release(&self, lease: &Lease, ids: &[MessageId]) -> Result<u64, PortError> {
        Ok(sqlx::query(&self.sql.release)
            .bind(ids.iter().map(|i| *i.as_uuid()).collect::<Vec<_>>())
            .bind(&lease.holder)
            .execute(&self.pool)
            .await
            .map_err(|e| port("release", e))?
            .rows_affected())
    }

    async fn next_due_in(&self) -> Result<Option<Duration>, PortError> {
        let micros: Option<i64> = sqlx::query_scalar(&self.sql.next_due)
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| port("next due", e))?;
        Ok(micros.map(|us| Duration::from_micros(u64::try_from(us).unwrap_or(0))))
    }

    async fn pending_claimable(&self) -> Result<Option<bool>, PortError> {
        sqlx::query_scalar(&self.sql.claimable)
            .fetch_one(&self.pool)
            .await
            .map(Some)
            .map_err(|e| port("look for claimable messages", e))
    }

    async fn recover_expired_leases(&self) -> Result<u64, PortError> {
        Ok(sqlx::query(&self.sql.recover)
            .bind(RECOVER_WINDOW)
            .execute(&self.pool)
            .await
            .map_err(|e| port("recover leases", e))?
            .rows_affected())
    }
}

#[async_trait]
impl OutboxRetention for PgOutboxStore {
    async fn delete_sent_batch(&self, age: Duration, limit: u32) -> Result<u64, PortError> {
        // The statement's own guard: `status = 'sent'` (and an age), nothing else.
        Ok(sqlx::query(&self.sql.retention)
            .bind(millis(age))
            .bind(i64::from(limit.max(1)))
            .execute(&self.pool)
            .await
            .map_err(|e| port("retention", e))?
            .rows_affected())
    }

    /// Vacuums `outbox_messages` when autovacuum is off for it (see the `vacuum`
    /// module) and its dead rows pass autovacuum's threshold.
    async fn reclaim_space(&self) -> Result<SpaceReclaim, PortError> {
        crate::vacuum::reclaim(&self.pool, self.outbox.schema(), "outbox_messages").await
    }
}

#[async_trait]
impl OutboxStore for PgOutboxStore {
    async fn enqueue(&self, mut messages: Vec<Message>) -> Result<(), PortError> {
        for m in &mut messages {
            outbox_ports::trace_context::record_create(m);
        }
        let mut conn = self.pool.acquire().await.map_err(|e| port("enqueue", e))?;
        self.outbox.insert_messages(&mut conn, &messages).await
    }

    async fn stats(&self) -> Result<OutboxStats, PortError> {
        let (pending, scheduled, publish_failed, dead, blocked_keys, oldest): (
            i64,
            i64,
            i64,
            i64,
            i64,
            Option<time::OffsetDateTime>,
        ) = sqlx::query_as(&self.sql.stats)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| port("stats", e))?;
        let n = |v: i64| u64::try_from(v).unwrap_or(0);
        Ok(OutboxStats {
            pending: n(pending),
            scheduled: n(scheduled),
            publish_failed: n(publish_failed),
            dead: n(dead),
            blocked_keys: n(blocked_keys),
            oldest_unsent_at: oldest,
        })
    }

    async fn get(&self, id: MessageId) -> Result<Option<OutboxRecord>, PortError> {
        sqlx::query_as::<_, MessageRow>(&self.sql.get)
            .bind(id.as_uuid())
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| port("get", e))?
            .map(|r| r.outbox_record())
            .transpose()
    }

    async fn list(&self, status: Status, limit: u32) -> Result<Vec<OutboxRecord>, PortError> {
        sqlx::query_as::<_, MessageRow>(&self.sql.list)
            .bind(status.as_str())
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await
            .map_err(|e| port("list", e))?
            .iter()
            .map(MessageRow::outbox_record)
            .collect()
    }

    async fn requeue(&self, id: MessageId) -> Result<(), PortError> {
        let n = sqlx::query(&self.sql.requeue)
            .bind(id.as_uuid())
            .bind(Side::Outbox.sources_of(Status::Pending))
            .execute(&self.pool)
            .await
            .map_err(|e| port("requeue", e))?
            .rows_affected();
        if n == 1 {
            Ok(())
        } else {
            Err(self.revive_error(id, Status::Pending).await)
        }
    }

    async fn delete(&self, id: MessageId) -> Result<(), PortError> {
        // The status guard is in the statement: reading the status first and then
        // deleting by id would delete a message requeued in between.
        let n = sqlx::query(&self.sql.delete)
            .bind(id.as_uuid())
            .bind(deletable_statuses())
            .execute(&self.pool)
            .await
            .map_err(|e| port("delete", e))?
            .rows_affected();
        if n == 1 {
            return Ok(());
        }
        // Nothing deleted: say why (the row may have changed since; the answer then
        // describes its status now, and nothing was deleted either way).
        match sqlx::query_scalar::<_, String>(&self.sql.status_of)
            .bind(id.as_uuid())
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| port("delete", e))?
        {
            None => Err(PortError::NotFound {
                what: "message",
                id: id.to_string(),
            }),
            Some(s) => {
                let status = s
                    .parse::<Status>()
                    .map_err(|e| PortError::fatal("delete", e))?;
                match status.check_delete() {
                    Err(refused) => Err(refused.into()),
                    // It became dead after the delete looked: not deleted, try again.
                    Ok(()) => Err(PortError::transient(
                        "delete",
                        format!("message {id} changed status meanwhile; try again"),
                    )),
                }
            }
        }
    }
}

/// The statuses an operator may delete, from the core's rule: the `status = ANY($2)`
/// of the delete statement.
fn deletable_statuses() -> Vec<String> {
    Status::deletable().map(|s| s.as_str().to_owned()).collect()
}

/// The LIMIT of a blocked key's waiting count: one past the cap, so a count above
/// the cap is told apart from one at it.
fn blocked_count_limit() -> i64 {
    i64::try_from(outbox_ports::BLOCKED_WAITING_CAP + 1).unwrap_or(i64::MAX)
}

/// A row of the blocked keys' statement.
#[derive(sqlx::FromRow)]
struct BlockedRow {
    key: String,
    id: uuid::Uuid,
    status: String,
    attempts: i32,
    last_error: Option<String>,
    next_attempt_at: Option<time::OffsetDateTime>,
    waiting: i64,
}

impl BlockedRow {
    fn blocked_key(self, cap: u64) -> Result<outbox_ports::BlockedKey, PortError> {
        let behind = u64::try_from(self.waiting).unwrap_or(0);
        Ok(outbox_ports::BlockedKey {
            key: self.key,
            head: MessageId::from_uuid(self.id),
            status: self
                .status
                .parse::<Status>()
                .map_err(|e| PortError::fatal("blocked keys", e))?,
            attempts: u32::try_from(self.attempts).unwrap_or(0),
            last_error: self.last_error,
            next_attempt_at: self.next_attempt_at,
            waiting: behind.min(cap),
            waiting_capped: behind > cap,
        })
    }
}
