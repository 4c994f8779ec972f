//! The inbox's SQL text: every statement of [`super::PgInboxStore`], built once per
//! store from the validated, quoted schema; why each is written as it is stands
//! next to it.
//!
//! A keyed delivery goes to a handler only while no earlier delivery of its
//! consumer and key is unfinished (`received` or `consume_failed`): the arrival,
//! the hold behind a key and the due claim apply that one rule, reading the key's
//! first unfinished row with [`first_unfinished`] (a scalar subquery on the closed
//! key range in `inbox_ordered`'s order, never `EXISTS`). A held row has no next
//! attempt time, so it is outside `inbox_due` and no claim walks the rows queued
//! behind a blocked key; it is made due when its predecessor finishes.

use crate::PgSchema;
use crate::rows::{
    HISTORY_COLUMNS, MESSAGE_COLUMNS, REPLAY_COLUMNS, append_failed_attempt, read_columns,
};

/// A subquery: `columns` of the first unfinished row `e` of table `t` of
/// consumer `consumer` and ordering key `key` (by seq), after seq `after` if given;
/// `consumer`, `key` and `after` are columns or parameters (each is pasted in).
/// The key is written as the closed range `>= key AND <= key` and the rows ordered
/// by (ordering_key, seq), not as `= key ORDER BY seq`: with the equality the order
/// reduces to seq, which the primary key (and inbox_consumer_seq) give as well,
/// and for a key holding most of the table the planner may price a walk of those
/// (expecting an early match) below the inbox_ordered probe; it then reads every
/// row of that key, as a claim did with 50,000 held rows (CI, on the equality).
/// Ordered by a column that is not fixed, only inbox_ordered gives the order
/// without a sort; and a closed range is estimated as narrow, so a bitmap scan and
/// sort of what a half-open range would match is not chosen either.
fn first_unfinished(
    t: &str,
    columns: &str,
    consumer: &str,
    key: &str,
    after: Option<&str>,
) -> String {
    let after = after
        .map(|s| format!(" AND e.seq > {s}"))
        .unwrap_or_default();
    format!(
        "(SELECT {columns} FROM {t} e WHERE e.consumer = {consumer} \
           AND e.ordering_key >= {key} AND e.ordering_key <= {key}{after} \
           AND e.status IN ('received', 'consume_failed') ORDER BY e.ordering_key, e.seq LIMIT 1)"
    )
}

/// Statements of the store, built once with the validated, quoted schema.
#[derive(Debug)]
pub(super) struct Sql {
    pub(super) arrive: String,
    pub(super) arrive_consumed: String,
    pub(super) arrive_consumed_many: String,
    pub(super) forget_consumed: String,
    pub(super) arrive_held: String,
    pub(super) arrive_given_up: String,
    pub(super) release_if_head: String,
    pub(super) give_up_lease: String,
    pub(super) status_of: String,
    pub(super) mark_consumed: String,
    pub(super) mark_failed: String,
    pub(super) claim_due: String,
    pub(super) promote_next: String,
    pub(super) release_held: String,
    pub(super) dead_letter: String,
    pub(super) stats: String,
    pub(super) get: String,
    pub(super) list: String,
    pub(super) reconsume: String,
    pub(super) replay_mark: String,
    pub(super) replay_insert: String,
    pub(super) retention: String,
}

impl Sql {
    pub(super) fn new(schema: &PgSchema) -> Self {
        let t = format!("{}.outbox_inbox", schema.quoted());
        let returning = format!(
            "{}, ordering_key",
            read_columns("message_id", "consumed_at")
        );
        let insert = format!(
            "INSERT INTO {t} (consumer, message_id, {MESSAGE_COLUMNS}, ordering_key, status, next_attempt_at, locked_by, locked_until) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12"
        );
        // A keyed row may be handled only while no earlier row of its consumer and
        // key is unfinished: `r`, itself unfinished, is the first unfinished row of
        // its key. Written as "the key's first unfinished row is `r`" rather than
        // NOT EXISTS, for which the planner may pick a sequential scan over a key
        // holding most of the table, expecting an early match that never comes.
        let head_of_key = |r: &str| {
            format!(
                "({r}.ordering_key IS NULL OR {r}.seq = {})",
                first_unfinished(
                    &t,
                    "e.seq",
                    &format!("{r}.consumer"),
                    &format!("{r}.ordering_key"),
                    None
                )
            )
        };
        Self {
            // New: inserted. Received before but its worker's lease ran out: taken
            // over, unless it waits behind an earlier delivery of its key (the
            // consume sweep hands it over in order). A held row taken over gets a
            // next attempt time: should this attempt end unrecorded, the sweep's
            // claim finds it once the lease runs out.
            arrive: format!(
                "{insert}, 'received', now(), $13, now() + $14 * interval '1 millisecond') \
                 ON CONFLICT (consumer, message_id) DO UPDATE \
                   SET locked_by = EXCLUDED.locked_by, locked_until = EXCLUDED.locked_until, \
                     next_attempt_at = COALESCE({t}.next_attempt_at, now()) \
                   WHERE {t}.status = 'received' AND ({t}.locked_until IS NULL OR {t}.locked_until < now()) \
                   AND {} \
                 RETURNING 1",
                head_of_key(t.as_str())
            ),
            // Recorded without a lease, to wait for the consume sweep, when an
            // earlier delivery of its key is unfinished; nothing when there is none
            // (or the row exists: a redelivery, which `arrive` sorts out). A scalar
            // subquery, not EXISTS: PostgreSQL drops the ORDER BY and LIMIT inside
            // an EXISTS, and with the key's value known plans a sequential scan
            // expecting an early match, which a key holding most of the table
            // makes a read of every row.
            // A held row has no next attempt time: it is outside the due range of
            // inbox_due, so a claim never walks the rows queued behind a blocked
            // key. It is made due when its predecessor finishes (`promote_next`,
            // run after every mark that finishes a keyed row), or right after this
            // insert by `release_if_head` when its predecessor finished meanwhile,
            // or by `release_held` if neither ran (a crash in between).
            arrive_held: format!(
                "INSERT INTO {t} (consumer, message_id, {MESSAGE_COLUMNS}, ordering_key, status, next_attempt_at) \
                 SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, 'received', NULL \
                 WHERE {} IS NOT NULL \
                 ON CONFLICT (consumer, message_id) DO NOTHING RETURNING 1",
                first_unfinished(&t, "e.seq", "$1", "$12", None)
            ),
            // A delivery the broker gave up on: dead at once, unless the inbox
            // holds the message already (then it is left as it is). No next
            // attempt time, so no claim takes it; a dead row holds no key back.
            arrive_given_up: format!(
                "INSERT INTO {t} (consumer, message_id, {MESSAGE_COLUMNS}, ordering_key, status, last_attempt_at, last_error, error_group) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, 'dead', now(), $13, $14) \
                 ON CONFLICT (consumer, message_id) DO NOTHING RETURNING 1"
            ),
            give_up_lease: format!(
                "UPDATE {t} SET locked_by = NULL, locked_until = NULL \
                 WHERE consumer = $1 AND message_id = $2 AND locked_by = $3 AND status = 'received'"
            ),
            // Right after `arrive_held` commits, in a statement of its own (a new
            // snapshot): the held row, made due if it leads its key now. A mark
            // that finished the predecessor either committed before this snapshot
            // (seen here) or ran its `promote_next` after the held row committed
            // (seen there): one of the two makes the row due, without locks.
            release_if_head: format!(
                "UPDATE {t} SET next_attempt_at = now() \
                 WHERE consumer = $1 AND message_id = $2 AND status = 'received' \
                   AND next_attempt_at IS NULL AND {} \
                 RETURNING 1",
                head_of_key(t.as_str())
            ),
            // Inside a handler's transaction: the row is written as consumed at once
            // (attempt 1, with its consumed time, which retention goes by) and commits
            // with the handler's writes, or not at all.
            arrive_consumed: format!(
                "INSERT INTO {t} (consumer, message_id, {MESSAGE_COLUMNS}, status, attempts, \
                 last_attempt_at, consumed_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, 'consumed', 1, now(), now()) \
                 ON CONFLICT (consumer, message_id) DO NOTHING RETURNING 1"
            ),
            // A batch's rows in one statement, as arrive_consumed writes each (over
            // arrays, as the outbox's insert_many): the transaction's id and the ids
            // of those inserted come back; the others were recorded before
            // (duplicates). The batch's
            // transaction holds them until its handlers ran (see
            // inbox_batch_sealed in the migrations).
            arrive_consumed_many: format!(
                "WITH recorded AS (INSERT INTO {t} (consumer, message_id, {MESSAGE_COLUMNS}, status, \
                   attempts, last_attempt_at, consumed_at) \
                   SELECT $1, m.*, 'consumed', 1, now(), now() \
                   FROM unnest($2::uuid[], $3::text[], $4::text[], $5::text[], $6::jsonb[], \
                     $7::bytea[], $8::text[], $9::text[], $10::text[], $11::timestamptz[]) AS m \
                   ON CONFLICT (consumer, message_id) DO NOTHING RETURNING message_id) \
                 SELECT pg_current_xact_id()::text, ARRAY(SELECT message_id FROM recorded)"
            ),
            // The rows of a batch's deliveries whose handlers failed, taken back
            // before the batch commits (each failure is recorded after it).
            forget_consumed: format!(
                "DELETE FROM {t} WHERE consumer = $1 AND message_id = ANY($2) AND status = 'consumed'"
            ),
            status_of: format!("SELECT status FROM {t} WHERE consumer = $1 AND message_id = $2"),
            mark_consumed: format!(
                "UPDATE {t} SET status = 'consumed', consumed_at = now(), attempts = attempts + 1, \
                 last_attempt_at = now(), next_attempt_at = NULL, locked_by = NULL, locked_until = NULL \
                 WHERE consumer = $1 AND message_id = $2 AND locked_by = $3 AND status = ANY($4) \
                 RETURNING seq, ordering_key"
            ),
            mark_failed: format!(
                "UPDATE {t} SET status = CASE WHEN $5::bigint IS NULL THEN 'dead' ELSE 'consume_failed' END, \
                 attempts = attempts + 1, last_attempt_at = now(), last_error = $4, error_group = $7, \
                 next_attempt_at = now() + $5::bigint * interval '1 millisecond', \
                 locked_by = NULL, locked_until = NULL, {} \
                 WHERE consumer = $1 AND message_id = $2 AND locked_by = $3 AND status = ANY($6) \
                 RETURNING seq, ordering_key, status",
                append_failed_attempt("", "$4::text")
            ),
            claim_due: format!(
                "WITH picked AS (SELECT c.seq FROM {t} c WHERE c.consumer = $1 \
                   AND c.status IN ('received', 'consume_failed') AND c.next_attempt_at <= now() \
                   AND (c.locked_until IS NULL OR c.locked_until < now()) AND {} \
                   ORDER BY c.next_attempt_at, c.seq LIMIT $2 FOR UPDATE SKIP LOCKED) \
                 UPDATE {t} m SET locked_by = $3, locked_until = now() + $4 * interval '1 millisecond' \
                 FROM picked WHERE m.seq = picked.seq \
                 RETURNING m.seq, {returning}",
                head_of_key("c")
            ),
            // The next unfinished row of a key after row $3, made due if it is held.
            // When row $3 was not the key's head (an earlier one was reconsumed),
            // the row is made due early; the claim's head rule still holds it.
            promote_next: format!(
                "UPDATE {t} SET next_attempt_at = now() \
                 WHERE seq = {} AND status = 'received' AND next_attempt_at IS NULL",
                first_unfinished(&t, "e.seq", "$1", "$2", Some("$3"))
            ),
            // The safety net: every held row that is its key's head is made due. The
            // keys with held rows are walked one index probe each over inbox_held
            // (a loose index scan), and each one's head is read from inbox_ordered:
            // the cost follows the consumer's keys with held rows, not the rows.
            release_held: format!(
                "WITH RECURSIVE keys(k) AS ( \
                   (SELECT ordering_key FROM {t} WHERE consumer = $1 AND ordering_key IS NOT NULL \
                      AND status = 'received' AND next_attempt_at IS NULL ORDER BY ordering_key LIMIT 1) \
                   UNION ALL \
                   SELECT (SELECT ordering_key FROM {t} WHERE consumer = $1 AND ordering_key > keys.k \
                      AND status = 'received' AND next_attempt_at IS NULL ORDER BY ordering_key LIMIT 1) \
                   FROM keys WHERE keys.k IS NOT NULL), \
                 held_heads(seq) AS (SELECT h.seq FROM keys CROSS JOIN LATERAL {} h \
                   WHERE keys.k IS NOT NULL AND h.status = 'received' AND h.next_attempt_at IS NULL) \
                 UPDATE {t} SET next_attempt_at = now() \
                 WHERE seq IN (SELECT seq FROM held_heads) AND status = 'received' AND next_attempt_at IS NULL",
                first_unfinished(
                    &t,
                    "e.seq, e.status, e.next_attempt_at",
                    "$1",
                    "keys.k",
                    None
                )
            ),
            dead_letter: format!(
                "INSERT INTO {}.outbox_dead_letters (consumer, message_id, routing_key, headers, body, reason) \
                 VALUES ($1, $2, $3, $4, $5, $6)",
                schema.quoted()
            ),
            stats: format!(
                "SELECT \
                   count(*) FILTER (WHERE status = 'received'), \
                   count(*) FILTER (WHERE status = 'consumed'), \
                   count(*) FILTER (WHERE status = 'consume_failed'), \
                   count(*) FILTER (WHERE status = 'dead'), \
                   (SELECT count(*) FROM {}.outbox_dead_letters WHERE consumer = $1) \
                 FROM {t} WHERE consumer = $1",
                schema.quoted()
            ),
            get: format!(
                "SELECT {returning}{REPLAY_COLUMNS}{HISTORY_COLUMNS} FROM {t} WHERE consumer = $1 AND message_id = $2"
            ),
            list: format!(
                "SELECT {returning}{REPLAY_COLUMNS}{HISTORY_COLUMNS} FROM {t} WHERE consumer = $1 AND status = $2 ORDER BY seq LIMIT $3"
            ),
            // The original stays dead; the guard is in the statement, so a
            // reconsume or a second replay racing this one finds it replayed.
            replay_mark: format!(
                "UPDATE {t} SET replayed_as = $3 WHERE consumer = $1 AND message_id = $2 \
                 AND status = 'dead' AND replayed_as IS NULL AND ordering_key IS NULL"
            ),
            // Received and due now, as a reconsumed delivery: the consume sweep
            // runs the handler on it.
            replay_insert: format!(
                "INSERT INTO {t} (consumer, message_id, {MESSAGE_COLUMNS}, status, next_attempt_at, replayed_from) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, 'received', now(), $12)"
            ),
            // Only a row no one holds: not under a live lease (a worker's, or the
            // consume sweep's claim), and not locked by a transaction in progress (a
            // retry's, whose handler runs while it holds the row). SKIP LOCKED rather
            // than waiting: once a retry commits the row is consumed, and a plain
            // UPDATE that waited would re-check `status = ANY($3)` against that new
            // version and, with `consumed` among the sources, run the handler twice.
            reconsume: format!(
                "UPDATE {t} SET status = 'received', attempts = 0, next_attempt_at = now(), consumed_at = NULL, \
                 locked_by = NULL, locked_until = NULL \
                 WHERE seq = (SELECT seq FROM {t} WHERE consumer = $1 AND message_id = $2 \
                   AND status = ANY($3) AND (locked_until IS NULL OR locked_until < now()) \
                   AND replayed_as IS NULL FOR UPDATE SKIP LOCKED)"
            ),
            // One consumer's rows only: each consumer's rows are what make its own
            // redeliveries harmless, for as long as its own retention says. The
            // conditions are repeated outside the subquery: for a row changed by a
            // transaction that commits while the DELETE waits for its lock (an
            // operator's reconsume), PostgreSQL re-checks only the outer WHERE on the
            // new version, and `seq IN (...)` alone would still match it.
            // The subquery's range is written as a row comparison on
            // (consumer, consumed_at): only inbox_retention can serve it, so it reads
            // this consumer's old rows only. Written as `consumed_at < ...`, the
            // planner could walk inbox_consumed_at (consumed_at) across every
            // consumer's old rows, which it prefers whenever the heap follows
            // consumed_at. No ORDER BY: the index scan is oldest first anyway, and
            // the loop runs until no old row is left.
            retention: format!(
                "DELETE FROM {t} WHERE status = 'consumed' AND consumer = $3 \
                 AND consumed_at < now() - $1 * interval '1 millisecond' \
                 AND seq IN (SELECT seq FROM {t} WHERE status = 'consumed' AND consumer = $3 \
                 AND (consumer, consumed_at) < ($3, now() - $1 * interval '1 millisecond') \
                 LIMIT $2)"
            ),
        }
    }
}
