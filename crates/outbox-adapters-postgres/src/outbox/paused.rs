//! SQL fragments of the claims' picks while an exchange is paused (issue 47).
//!
//! A pick walks a partial index in its order (seq, due time, next attempt) and
//! passes over the rows of a paused exchange where it meets them, so a paused
//! backlog at the front of that order is read by every claim of every other
//! exchange (100,000 paused rows cost a claim about 23 ms here) and by every idle
//! relay's work check, which each commit into the paused exchange starts. So
//! while an exchange is paused the store claims in another form:
//! - [`live_exchanges`] walks the exchanges that have rows in each pick's index,
//!   one index probe each (a loose index scan over an index on `(exchange, ...)`
//!   with the pick's predicate, migration 20261221000001), and lists those not
//!   paused; it reads one row of `outbox_pauses` and nothing more while no
//!   exchange is paused, which is how the store learns which form to run;
//! - the claim then reads, for each listed exchange that is still not paused, up
//!   to its limit of that exchange's rows in the pick's order
//!   ([`Pick::per_exchange`]): the paused rows are never visited, and a claim
//!   reads at most its limit a live exchange.
//!
//! Both forms obey the pauses in their own statement, so a pause or resume
//! committed between the two statements costs at most one claim of a slower or
//! narrower form, never a paused row sent. The claim's usual form is a separate
//! statement, not a branch of one: the planner adds up the estimates of both
//! branches, and the per-exchange form, priced at a guessed number of exchanges
//! times the limit, would push every claim's estimate over `jit_above_cost`.

use crate::rows::LEASE_FREE;

/// `outbox_pauses` beside table `t` (the quoted `"schema".outbox_messages`).
fn pauses_of(t: &str) -> String {
    let schema = t
        .strip_suffix(".outbox_messages")
        .unwrap_or_else(|| unreachable!("the claims read a schema's outbox_messages: {t}"));
    format!("{schema}.outbox_pauses")
}

/// The exchange column `exchange` names no paused exchange (table outbox_pauses
/// beside table `t`, the quoted `"schema".outbox_messages`). The pauses are read
/// once per statement (an uncorrelated subquery: an init plan), and a row of a
/// paused exchange is passed over where the claim's pick reads it, so the picks
/// keep their index order and a paused keyed head still holds its key back.
pub(super) fn not_paused(t: &str, exchange: &str) -> String {
    let pauses = pauses_of(t);
    format!("{exchange} <> ALL (ARRAY(SELECT p.name FROM {pauses} p WHERE p.kind = 'exchange'))")
}

/// True while some exchange is paused (read once per statement, an init plan).
pub(super) fn any_exchange_paused(t: &str) -> String {
    format!(
        "EXISTS (SELECT 1 FROM {} p WHERE p.kind = 'exchange')",
        pauses_of(t)
    )
}

/// One pick over the rows of table `t` (quoted) that meet `rows` (conditions on
/// a row `c`, the predicate of the pick's partial indexes), ordered by `order`
/// (columns of `c`, the pick's index order after the exchange).
pub(super) struct Pick<'a> {
    /// The name of the CTE walking this pick's exchanges (unique in a statement).
    pub(super) walk: &'a str,
    /// The rows the pick may take, as conditions on `c` (first the index
    /// predicate, then any further condition such as a due time).
    pub(super) rows: &'a str,
    /// The index predicate alone, as conditions on unqualified columns: the
    /// exchange walk reads only that index.
    pub(super) predicate: &'a str,
    /// The pick's order within one exchange, columns of `c` (`c.seq`, or
    /// `c.not_before, c.seq`).
    pub(super) order: &'a [&'a str],
    /// Whether the pick takes only rows due now, by a time that is the second
    /// column of its index by exchange.
    pub(super) due_only: bool,
}

impl Pick<'_> {
    /// Row `c`'s exchange is `w.x`. For a pick of due rows, an equality, so the
    /// scan of the index by exchange stops at the exchange's first row still to
    /// come (after a range on the first column, or a row comparison, the bound
    /// on the due time is only checked row by row, and the scan reads every
    /// later delayed or failed row of the exchange: `tests/pause_scale.rs`
    /// counts its pages). Otherwise the closed range `>= x AND <= x`, as the keys
    /// are written (see `keys::first_blocking`: with an equality the planner may
    /// price a walk of the pick's own index in order below the probe, and that
    /// walk passes over the paused rows again); both are ordered by `(exchange,
    /// order)`, which only the index by exchange gives without a sort.
    fn of_exchange(&self) -> &'static str {
        if self.due_only {
            "c.exchange = w.x"
        } else {
            "c.exchange >= w.x AND c.exchange <= w.x"
        }
    }

    /// The CTE (for a `WITH RECURSIVE`) walking the exchanges that have rows in
    /// the pick's index, in order, one probe each; it yields a single NULL when
    /// no exchange is paused, so it costs nothing then.
    pub(super) fn exchange_walk(&self, t: &str) -> String {
        let (walk, predicate) = (self.walk, self.predicate);
        let paused = any_exchange_paused(t);
        format!(
            "{walk}(x) AS ((SELECT exchange FROM {t} WHERE {predicate} AND {paused} \
               ORDER BY exchange LIMIT 1) \
             UNION ALL SELECT (SELECT exchange FROM {t} WHERE {predicate} \
               AND exchange > {walk}.x ORDER BY exchange LIMIT 1) \
             FROM {walk} WHERE {walk}.x IS NOT NULL)"
        )
    }

    /// The exchanges the walk found that are not paused, as an array.
    pub(super) fn live(&self, t: &str) -> String {
        let walk = self.walk;
        let live = not_paused(t, "w.x");
        format!("ARRAY(SELECT w.x FROM {walk} w WHERE w.x IS NOT NULL AND {live})")
    }

    /// A statement's pick of `seq`: up to `$1` rows of the exchanges in
    /// `exchanges` (a `text[]` parameter, those [`Self::live`] found) that are not
    /// paused now, each exchange's rows ([`Self::of_exchange`]) locked `FOR
    /// UPDATE SKIP LOCKED` in the pick's order.
    pub(super) fn per_exchange(&self, t: &str, exchanges: &str) -> String {
        let rows = self.rows;
        let of_exchange = self.of_exchange();
        let inner = self.order.join(", ");
        let outer = self
            .order
            .iter()
            .map(|c| c.replacen("c.", "p.", 1))
            .collect::<Vec<_>>()
            .join(", ");
        let live = not_paused(t, "w.x");
        format!(
            "SELECT p.seq FROM unnest({exchanges}::text[]) w(x) CROSS JOIN LATERAL \
               (SELECT {inner} FROM {t} c \
               WHERE {of_exchange} AND {rows} AND {LEASE_FREE} \
               ORDER BY c.exchange, {inner} LIMIT $1 FOR UPDATE SKIP LOCKED) p \
             WHERE {live} ORDER BY {outer} LIMIT $1"
        )
    }

    /// Whether this pick would take a row now, in one form or the other: the
    /// pick's index walked in order while no exchange is paused, else the
    /// exchanges walked ([`Self::exchange_walk`], which must be among the
    /// statement's CTEs) and one row looked for in each not paused (no lock: an
    /// idle relay's work check).
    pub(super) fn any(&self, t: &str) -> String {
        let (walk, rows) = (self.walk, self.rows);
        let of_exchange = self.of_exchange();
        let live = not_paused(t, "w.x");
        let paused = any_exchange_paused(t);
        format!(
            "EXISTS (SELECT 1 FROM {t} c WHERE {rows} AND {LEASE_FREE} AND NOT {paused}) \
             OR EXISTS (SELECT 1 FROM {walk} w CROSS JOIN LATERAL (SELECT 1 FROM {t} c \
               WHERE {of_exchange} AND {rows} AND {LEASE_FREE} \
               LIMIT 1) p WHERE w.x IS NOT NULL AND {live})"
        )
    }
}

/// Unkeyed rows due now: the pick over outbox_pending_unkeyed by seq, or
/// outbox_pending_by_exchange while an exchange is paused.
pub(super) const NOW: Pick<'static> = Pick {
    walk: "exchanges_now",
    rows: "c.status = 'pending' AND c.not_before IS NULL AND c.ordering_key IS NULL",
    predicate: "status = 'pending' AND not_before IS NULL AND ordering_key IS NULL",
    order: &["c.seq"],
    due_only: false,
};

/// Unkeyed delayed rows whose time has come: by due time over
/// outbox_scheduled_unkeyed, or outbox_scheduled_by_exchange while paused.
pub(super) const DUE: Pick<'static> = Pick {
    walk: "exchanges_due",
    rows: "c.status = 'pending' AND c.not_before IS NOT NULL AND c.ordering_key IS NULL \
           AND c.not_before <= now()",
    predicate: "status = 'pending' AND not_before IS NOT NULL AND ordering_key IS NULL",
    order: &["c.not_before", "c.seq"],
    due_only: true,
};

/// Keyed rows: only their exchange walk is used (the keys of each exchange are
/// walked by `keys::keyed_heads_by_exchange`), over outbox_keyed_by_exchange.
pub(super) const KEYED: Pick<'static> = Pick {
    walk: "exchanges_keyed",
    rows: "c.status = 'pending' AND c.ordering_key IS NOT NULL",
    predicate: "status = 'pending' AND ordering_key IS NOT NULL",
    order: &["c.seq"],
    due_only: false,
};

/// Failed rows due for a retry that meet `rows` (conditions on `c`: the status,
/// the due time and the key-head rule): by next attempt over outbox_retry_due,
/// or outbox_retry_by_exchange while an exchange is paused.
pub(super) fn failed(rows: &str) -> Pick<'_> {
    Pick {
        walk: "exchanges_failed",
        rows,
        predicate: "status = 'publish_failed'",
        order: &["c.next_attempt_at", "c.seq"],
        due_only: true,
    }
}

/// The statement listing, per pick, the exchanges not paused that have rows in
/// the pick's index, and whether any exchange is paused: `(paused, now, due,
/// keyed, failed)`. While none is, the walks stop at their first probe's one-time
/// filter and the lists are empty.
pub(super) fn live_exchanges(t: &str) -> String {
    let failed = failed("");
    format!(
        "WITH RECURSIVE {}, {}, {}, {} SELECT {}, {}, {}, {}, {}",
        NOW.exchange_walk(t),
        DUE.exchange_walk(t),
        KEYED.exchange_walk(t),
        failed.exchange_walk(t),
        any_exchange_paused(t),
        NOW.live(t),
        DUE.live(t),
        KEYED.live(t),
        failed.live(t)
    )
}
