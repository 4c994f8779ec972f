//! The outbox's SQL text: every statement of [`super::PgOutboxStore`] and the
//! inserts of [`super::PgOutbox`], built once per store from the validated,
//! quoted schema (and the store's [`DeadHead`]), so no statement is assembled
//! from input at run time. The fragments of ordering keys come from
//! [`super::keys`]; why each statement is written as it is stands next to it.
//!
//! Every claim and sweep is served by a partial index of an unsent status, so
//! its cost follows the rows it can take; lease, expiry and due times are the
//! database's `now()`; every status change is guarded by `status = ANY($n)` from
//! the core's transition table, bound by the caller (`rows::sources_of`).

use outbox_ports::DeadHead;

use super::keys::{
    blocked_keys, blocking_list, claimable_pending_exists, first_blocking, head_condition,
    key_walk, keyed_heads, keyed_heads_by_exchange, stuck_list,
};
use super::paused::{self, not_paused};
use crate::PgSchema;
use crate::rows::{
    HISTORY_COLUMNS, LEASE_FREE, MESSAGE_COLUMNS, REPLAY_COLUMNS, append_failed_attempt,
    outbox_extra_columns, read_columns, readable_time,
};

/// The insert of several messages in one statement, over arrays (`unnest`): the
/// id and [`MESSAGE_COLUMNS`], then the due time and the ordering key.
pub(super) fn insert_many(schema: &PgSchema) -> String {
    format!(
        "INSERT INTO {}.outbox_messages (id, {MESSAGE_COLUMNS}, not_before, ordering_key) \
         SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::jsonb[], \
         $6::bytea[], $7::text[], $8::text[], $9::text[], $10::timestamptz[], $11::timestamptz[], \
         $12::text[])",
        schema.quoted()
    )
}

/// The insert of one message, the common case in a business transaction: a plain
/// VALUES insert, cheaper to plan and run than unnest over one-element arrays.
pub(super) fn insert_one(schema: &PgSchema) -> String {
    format!(
        "INSERT INTO {}.outbox_messages (id, {MESSAGE_COLUMNS}, not_before, ordering_key) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
        schema.quoted()
    )
}

/// How many rows at the front of each claim's order the clearing of expired leases
/// reads ([`OutboxRelayPath::recover_expired_leases`]): a relay's claims are at most
/// a few batches, and they sit there.
pub(super) const RECOVER_WINDOW: i64 = 10_000;

/// Statements of the store, built once with the validated, quoted schema.
#[derive(Debug)]
pub(super) struct Sql {
    pub(super) claim_pending: String,
    pub(super) claim_pending_paused: String,
    pub(super) claim_retries: String,
    pub(super) claim_retries_paused: String,
    pub(super) live_exchanges: String,
    pub(super) next_due: String,
    pub(super) claimable: String,
    pub(super) mark_sent: String,
    pub(super) mark_failed: String,
    pub(super) release: String,
    pub(super) recover: String,
    pub(super) stats: String,
    pub(super) count: String,
    pub(super) get: String,
    pub(super) list: String,
    pub(super) requeue: String,
    pub(super) replay_mark: String,
    pub(super) replay_link: String,
    pub(super) status_of: String,
    pub(super) status_and_replay: String,
    pub(super) delete: String,
    pub(super) retention: String,
    pub(super) blocked_first: String,
    pub(super) blocked_after: String,
    pub(super) head_of_key: String,
}

impl Sql {
    pub(super) fn new(schema: &PgSchema, dead_head: DeadHead) -> Self {
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
        // An exchange paused by an operator: its rows are passed over by every pick.
        let free = not_paused(&t, "c.exchange");
        let claim_retries = format!(
            "WITH picked AS (SELECT c.seq FROM {t} c WHERE c.status = 'publish_failed' \
               AND c.next_attempt_at <= now() AND {lease_free} AND {free} AND {head} \
               ORDER BY c.next_attempt_at, c.seq LIMIT $1 FOR UPDATE SKIP LOCKED) \
             UPDATE {t} m SET locked_by = $2, locked_until = now() + $3 * interval '1 millisecond' \
             FROM picked WHERE m.seq = picked.seq \
             RETURNING m.seq, {returning}"
        );
        // While an exchange is paused (see `paused`): the same pick, of the failed
        // rows of the exchanges listed in $4 only, read exchange by exchange.
        let retry_rows =
            format!("c.status = 'publish_failed' AND c.next_attempt_at <= now() AND {head}");
        let claim_retries_paused = format!(
            "WITH picked AS ({}) \
             UPDATE {t} m SET locked_by = $2, locked_until = now() + $3 * interval '1 millisecond' \
             WHERE m.seq = ANY (ARRAY(SELECT seq FROM picked)) \
             RETURNING m.seq, {returning}",
            paused::failed(&retry_rows).per_exchange(&t, "$4")
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
               AND c.not_before IS NULL AND c.ordering_key IS NULL AND {lease_free} AND {free} \
               ORDER BY c.seq LIMIT $1 FOR UPDATE SKIP LOCKED), \
             due_rows AS (SELECT c.seq FROM {t} c WHERE c.status = 'pending' AND c.ordering_key IS NULL \
               AND c.not_before IS NOT NULL AND c.not_before <= now() AND {lease_free} AND {free} \
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
        // While an exchange is paused (see `paused`): the picks of the exchanges
        // listed in $4 (keyed, with their key cursors in $5), $6 (immediate) and
        // $7 (delayed) only, read exchange by exchange. The update finds the picked rows
        // by primary key whatever the statistics say (a large unsent backlog, as
        // a long pause leaves, could otherwise be joined by a scan of the table).
        let claim_pending_paused = format!(
            "WITH RECURSIVE {}, \
             now_rows AS ({}), \
             due_rows AS ({}), \
             keyed_rows AS (SELECT c.seq FROM {t} c WHERE c.seq IN (SELECT seq FROM heads LIMIT $1) \
               AND c.status = 'pending' AND {lease_free} FOR UPDATE SKIP LOCKED), \
             picked AS (SELECT seq FROM now_rows UNION ALL SELECT seq FROM due_rows \
               UNION ALL SELECT seq FROM keyed_rows ORDER BY seq LIMIT $1) \
             UPDATE {t} m SET locked_by = $2, locked_until = now() + $3 * interval '1 millisecond' \
             WHERE m.seq = ANY (ARRAY(SELECT seq FROM picked)) \
             RETURNING m.seq, {returning}",
            keyed_heads_by_exchange(&t, dead_head, "heads", "$1", ("$4", Some("$5"))),
            paused::NOW.per_exchange(&t, "$6"),
            paused::DUE.per_exchange(&t, "$7"),
        );
        Self {
            claim_pending_paused,
            claim_retries_paused,
            live_exchanges: paused::live_exchanges(&t),
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
                   error_group = f.error_group, \
                   next_attempt_at = now() + f.delay_ms * interval '1 millisecond', \
                   locked_by = NULL, locked_until = NULL, {} \
                 FROM unnest($1::uuid[], $2::text[], $3::bigint[], $6::text[]) \
                   AS f(id, error, delay_ms, error_group) \
                 WHERE m.id = f.id AND m.locked_by = $4 AND m.status = ANY($5)",
                append_failed_attempt("m.", "f.error")
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
            get: format!(
                "SELECT {returning}{REPLAY_COLUMNS}{HISTORY_COLUMNS} FROM {t} WHERE id = $1"
            ),
            list: format!(
                "SELECT {returning}{REPLAY_COLUMNS}{HISTORY_COLUMNS} FROM {t} WHERE status = $1 ORDER BY seq LIMIT $2"
            ),
            // Never a row under a relay's live lease: it may be on its way to the
            // broker, and clearing the lease would fence off the relay's mark and
            // publish it twice. A mark that commits while this waits for the row
            // is re-checked here: a row sent meanwhile stays sent.
            requeue: format!(
                "UPDATE {t} SET status = 'pending', attempts = 0, next_attempt_at = NULL, \
                 sent_at = NULL, locked_by = NULL, locked_until = NULL \
                 WHERE id = $1 AND status = ANY($2) AND (locked_until IS NULL OR locked_until < now()) \
                 AND replayed_as IS NULL"
            ),
            // The original stays dead; the guard is in the statement, so a requeue
            // or a second replay racing this one finds it replayed.
            replay_mark: format!(
                "UPDATE {t} SET replayed_as = $2 WHERE id = $1 AND status = 'dead' \
                 AND replayed_as IS NULL AND ordering_key IS NULL"
            ),
            replay_link: format!("UPDATE {t} SET replayed_from = $1 WHERE id = $2"),
            status_of: format!("SELECT status FROM {t} WHERE id = $1"),
            status_and_replay: format!("SELECT status, replayed_as FROM {t} WHERE id = $1"),
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
