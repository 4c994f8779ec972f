//! SQL fragments of the outbox's ordering keys: a key's head, the walk over the
//! keys, the blocked keys. Kept apart from the statements that paste them in
//! ([`super::sql`]), because the rule they carry is one rule for every statement:
//! a keyed message is taken only while no earlier message of its key is unsent.
//!
//! How a key's head is read, everywhere: [`first_blocking`], a scalar subquery on
//! the closed range `>= key AND <= key` ordered by `(ordering_key, seq)`, never
//! `= key ORDER BY seq` and never inside `EXISTS` (either lets the planner walk
//! every row of a large key). The keys themselves are walked one index probe each
//! over `outbox_ordered` (a loose index scan, [`key_walk`]), so the cost of a claim,
//! a count or a page follows the keys visited, never the rows queued behind heads.

use outbox_core::OutboxStatus;
use outbox_ports::DeadHead;

use super::paused::{DUE, KEYED, NOW, any_exchange_paused, not_paused};
use crate::rows::readable_time;

/// A row `c` of table `t` (quoted) that is its ordering key's head: no key, or no
/// earlier row of its key still unsent (in flight, delayed, failing, or dead unless
/// `dead_head` skips them); one probe of outbox_ordered. For a row `c` in a
/// blocking status itself (a failed one), written as "its key's first such row is
/// `c`" ([`first_blocking`]), where a NOT EXISTS over a key holding most of the
/// table could be planned as a sequential scan expecting an early match.
pub(super) fn head_condition(t: &str, dead_head: DeadHead) -> String {
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
pub(super) fn first_blocking(t: &str, dead_head: DeadHead, columns: &str, key: &str) -> String {
    let blocking = blocking_list(dead_head);
    format!(
        "(SELECT {columns} FROM {t} e WHERE e.ordering_key >= {key} AND e.ordering_key <= {key} \
           AND e.status IN ({blocking}) ORDER BY e.ordering_key, e.seq LIMIT 1)"
    )
}

/// The statuses (quoted, comma-separated) of an earlier message that hold a keyed
/// one back.
pub(super) fn blocking_list(dead_head: DeadHead) -> String {
    quoted(dead_head.blocking())
}

/// `statuses` as an SQL list of literals: `'a', 'b'`.
fn quoted(statuses: &[OutboxStatus]) -> String {
    statuses
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
pub(super) fn keyed_heads(t: &str, dead_head: DeadHead, cursor: Option<&str>) -> String {
    format!(
        "{}, \
         heads(seq) AS (SELECT h.seq FROM keys CROSS JOIN LATERAL {} h \
           WHERE h.status = 'pending' \
           AND (h.not_before IS NULL OR h.not_before <= now()) \
           AND (h.locked_until IS NULL OR h.locked_until < now()) AND {})",
        key_walk(t, dead_head, cursor),
        first_blocking(
            t,
            dead_head,
            "e.seq, e.status, e.not_before, e.locked_until, e.exchange",
            "keys.k"
        ),
        not_paused(t, "h.exchange")
    )
}

/// A CTE `name(seq)` for a claim while an exchange is paused: the heads
/// [`keyed_heads`] gives, of the exchanges in `exchanges` (a `text[]`
/// expression: a parameter, or an array of a walk's exchanges) only. Per
/// exchange, the keys that have a pending row of that exchange are walked from
/// that exchange's own cursor (the same place of `cursors`, a `text[]`
/// parameter; without, from the start), wrapping around as [`key_walk`] does,
/// over outbox_keyed_by_exchange, one probe a key, so the keys of a paused
/// exchange are never visited; a key's head is taken when it is a row of that
/// exchange (so a key is taken through one exchange only), and at most `limit`
/// (a parameter or a number) heads an exchange, merged oldest first. A cursor
/// an exchange: with one shared by all, an exchange whose keys sort below
/// another's would start from its first keys at every claim.
pub(super) fn keyed_heads_by_exchange(
    t: &str,
    dead_head: DeadHead,
    name: &str,
    limit: &str,
    (exchanges, cursors): (&str, Option<&str>),
) -> String {
    let (from, cursor) = match cursors {
        Some(c) => (
            format!("unnest({exchanges}::text[], {c}::text[]) w(x, cursor)"),
            "w.cursor",
        ),
        None => (format!("unnest({exchanges}::text[]) w(x)"), "''"),
    };
    let next_key = |cond: &str| {
        format!(
            "(SELECT ordering_key FROM {t} WHERE exchange >= w.x AND exchange <= w.x \
               AND ordering_key IS NOT NULL AND {cond} AND status = 'pending' \
               ORDER BY exchange, ordering_key LIMIT 1)"
        )
    };
    let walk = |walk: &str, first: &str, upto: &str| {
        format!(
            "{walk}(k) AS ({} UNION ALL SELECT {} FROM {walk} WHERE {walk}.k IS NOT NULL)",
            next_key(first),
            next_key(&format!("ordering_key > {walk}.k{upto}"))
        )
    };
    let after = walk("after_cursor", &format!("ordering_key > {cursor}"), "");
    let before = walk(
        "upto_cursor",
        &format!("ordering_key <= {cursor}"),
        &format!(" AND ordering_key <= {cursor}"),
    );
    let head = first_blocking(
        t,
        dead_head,
        "e.seq, e.status, e.not_before, e.locked_until, e.exchange",
        "keys.k",
    );
    let live = not_paused(t, "w.x");
    format!(
        "{name}(seq) AS (SELECT p.seq FROM {from} CROSS JOIN LATERAL \
           (SELECT h.seq FROM (WITH RECURSIVE {after}, {before} \
               SELECT k FROM after_cursor WHERE k IS NOT NULL \
               UNION ALL SELECT k FROM upto_cursor WHERE k IS NOT NULL) keys \
             CROSS JOIN LATERAL {head} h \
             WHERE h.status = 'pending' AND h.exchange = w.x \
             AND (h.not_before IS NULL OR h.not_before <= now()) \
             AND (h.locked_until IS NULL OR h.locked_until < now()) LIMIT {limit}) p \
         WHERE {live} ORDER BY p.seq LIMIT {limit})"
    )
}

/// CTEs of table `t` (quoted) ending in `keys(k)`: every ordering key with an
/// unsent row, one index probe each over outbox_ordered (see [`keyed_heads`]).
pub(super) fn key_walk(t: &str, dead_head: DeadHead, cursor: Option<&str>) -> String {
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
pub(super) fn stuck_list(dead_head: DeadHead) -> String {
    quoted(dead_head.stuck())
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
pub(super) fn blocked_keys(t: &str, dead_head: DeadHead, cursor: Option<&str>) -> String {
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
/// row pending and not leased that is due, its key's head and of an exchange not
/// paused, exactly what the claim's three picks look for (so an idle relay is
/// never told there is work the claim will not take); the unkeyed picks in the
/// form for whether an exchange is paused (see [`super::paused`]), so a paused
/// backlog is not read by the check that each commit into it starts.
pub(crate) fn claimable_pending_exists(t: &str, dead_head: DeadHead) -> String {
    let keyed = keyed_heads_by_exchange(
        t,
        dead_head,
        "heads_by_exchange",
        "1",
        (&KEYED.live(t), None),
    );
    format!(
        "WITH RECURSIVE {}, {}, {}, {}, {keyed} \
         SELECT {} OR {} OR CASE WHEN {} THEN EXISTS (SELECT 1 FROM heads_by_exchange) \
           ELSE EXISTS (SELECT 1 FROM heads) END",
        keyed_heads(t, dead_head, None),
        NOW.exchange_walk(t),
        DUE.exchange_walk(t),
        KEYED.exchange_walk(t),
        NOW.any(t),
        DUE.any(t),
        any_exchange_paused(t),
    )
}
