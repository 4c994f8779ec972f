//! The inbox on PostgreSQL.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use outbox_core::{Decision, Message, MessageId, Status, TransitionError};
use outbox_ports::{
    Arrival, ClaimedDelivery, DeadLetter, InboxConsumerPath, InboxRecord, InboxStats, InboxStore,
    Lease, PortError,
};
use sqlx::types::Json;
use sqlx::{PgConnection, PgPool, Postgres, Transaction};

use crate::PgSchema;
use crate::error::{port, refused_by_database};
use crate::rows::{
    ClaimedRow, MESSAGE_COLUMNS, MessageRow, Side, in_claim_order, millis, read_columns,
};
use crate::storable;

mod batch;
pub use batch::BatchDelivery;

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

#[derive(Debug)]
struct Sql {
    arrive: String,
    arrive_consumed: String,
    arrive_held: String,
    arrive_given_up: String,
    release_if_head: String,
    give_up_lease: String,
    status_of: String,
    mark_consumed: String,
    mark_failed: String,
    claim_due: String,
    promote_next: String,
    release_held: String,
    dead_letter: String,
    stats: String,
    get: String,
    list: String,
    reconsume: String,
    retention: String,
}

impl Sql {
    fn new(schema: &PgSchema) -> Self {
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
                "INSERT INTO {t} (consumer, message_id, {MESSAGE_COLUMNS}, ordering_key, status, last_attempt_at, last_error) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, 'dead', now(), $13) \
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
            status_of: format!("SELECT status FROM {t} WHERE consumer = $1 AND message_id = $2"),
            mark_consumed: format!(
                "UPDATE {t} SET status = 'consumed', consumed_at = now(), attempts = attempts + 1, \
                 last_attempt_at = now(), next_attempt_at = NULL, locked_by = NULL, locked_until = NULL \
                 WHERE consumer = $1 AND message_id = $2 AND locked_by = $3 AND status = ANY($4) \
                 RETURNING seq, ordering_key"
            ),
            mark_failed: format!(
                "UPDATE {t} SET status = CASE WHEN $5::bigint IS NULL THEN 'dead' ELSE 'consume_failed' END, \
                 attempts = attempts + 1, last_attempt_at = now(), last_error = $4, \
                 next_attempt_at = now() + $5::bigint * interval '1 millisecond', \
                 locked_by = NULL, locked_until = NULL \
                 WHERE consumer = $1 AND message_id = $2 AND locked_by = $3 AND status = ANY($6) \
                 RETURNING seq, ordering_key, status"
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
            get: format!("SELECT {returning} FROM {t} WHERE consumer = $1 AND message_id = $2"),
            list: format!(
                "SELECT {returning} FROM {t} WHERE consumer = $1 AND status = $2 ORDER BY seq LIMIT $3"
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
                   FOR UPDATE SKIP LOCKED)"
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

/// What [`PgInboxStore::consume_in_transaction`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConsumeOutcome {
    /// The handler ran and its writes committed together with the inbox row.
    Consumed,
    /// The message was recorded before (by this or another worker): nothing ran.
    Duplicate,
    /// The handler failed: its writes were rolled back and the failure stored for a
    /// retry.
    Failed(String),
    /// The handler failed and the delivery is stored as dead: the caller's `decide`
    /// said so (the retry budget is spent), or the handler ended the inbox
    /// transaction itself (a `COMMIT` or `ROLLBACK` of its own) before the row was
    /// committed, which makes it dead at once whatever the policy says, since what
    /// it wrote outside the transaction would be written again by a retry. (When the
    /// handler committed the row itself before failing, the row is consumed and the
    /// outcome is `Consumed`, with an error in the log.)
    Dead(String),
}

/// A handler that writes through the inbox's transaction.
pub type TxHandler<'h> = Box<
    dyn for<'c> FnOnce(
            &'c mut PgConnection,
        ) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send + 'c>>
        + Send
        + 'h,
>;

/// The savepoint a handler runs under. Releasing it fails when the transaction was
/// aborted, which is how a failed statement the handler ignored is caught: PostgreSQL
/// answers the COMMIT of an aborted transaction with a ROLLBACK and no error.
const HANDLER_SAVEPOINT: &str = "outbox_handler";

/// What a handler may have changed in its session, set back, in the inbox
/// transaction: before a handler runs (a connection is clean whatever used it
/// before), and after it returned `Ok`, before the COMMIT. A handler's `SET
/// synchronous_commit = off` (session-wide, not `SET LOCAL`) would otherwise make
/// this COMMIT, and every later one on the pooled connection, return before its WAL
/// is flushed: a delivery would be acknowledged to the broker on a commit a
/// PostgreSQL crash can still lose. `RESET ALL` sets every parameter back to the
/// session's default (the server's, database's, role's, or the connection URL's
/// `options`), so each COMMIT is made with the durability configured for the
/// connection. It rides in the round trip of the savepoint command it follows or
/// precedes (simple query protocol), so it costs no round trip. What it does not
/// set back: `SET ROLE` and `SET SESSION AUTHORIZATION` (PostgreSQL leaves them out
/// of `RESET ALL`), prepared statements, temporary tables, advisory locks. What it
/// does set back: settings a pool's `after_connect` hook `SET` on the connection;
/// give those in the URL (`options=-c search_path=app`), or with `ALTER ROLE` /
/// `ALTER DATABASE ... SET`, which are the session's defaults and kept.
const SESSION_RESET: &str = "RESET ALL";

/// How one run of a handler in the inbox transaction ended.
#[derive(Debug)]
enum Attempt {
    /// The handler returned `Ok` and the transaction committed.
    Committed,
    /// A failed attempt, rolled back: the handler's error, a transaction the handler
    /// left aborted, or a COMMIT the database refused (a deferred constraint, a
    /// serialization failure). Safe to retry.
    Failed(String),
    /// The handler ended the inbox transaction itself (a raw `COMMIT` or `ROLLBACK`,
    /// or released or rolled back past its savepoint): what it wrote after that was
    /// autocommitted, or its writes and the inbox row were committed before it
    /// returned. Never to retry: a retry would repeat those writes.
    Ended(String),
}

/// SQLSTATEs of `RELEASE` / `ROLLBACK TO SAVEPOINT` when the handler's savepoint is
/// gone: no transaction in progress (the handler sent `COMMIT` or `ROLLBACK`), or no
/// such savepoint (it released it, or ended the transaction and began another).
fn ended_by_handler(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db)
        if matches!(db.code().as_deref(), Some("25P01" | "3B001")))
}

/// The reason stored when the handler ended the inbox transaction itself.
fn ended_reason(returned: &str, why: &str) -> String {
    format!(
        "the handler ended the inbox transaction itself (a COMMIT or ROLLBACK of its own, \
         or its savepoint released or rolled back) and {returned}; what it wrote may have \
         taken effect outside the transaction, so it is not retried: {why}"
    )
}

/// Back to the handler's savepoint, which stays in place (for the next delivery of
/// a batch). Fails with 25P01/3B001 when the handler ended the transaction
/// ([`ended_by_handler`]).
async fn rollback_to_savepoint(conn: &mut PgConnection) -> Result<(), sqlx::Error> {
    sqlx::query(&format!("ROLLBACK TO SAVEPOINT {HANDLER_SAVEPOINT}"))
        .execute(conn)
        .await
        .map(|_| ())
}

/// Runs `handler` in `tx` and commits; see [`Attempt`]. `Err` is a database that
/// could not be reached, where the outcome of a COMMIT is unknown.
async fn run_and_commit(
    mut tx: Transaction<'_, Postgres>,
    handler: TxHandler<'_>,
) -> Result<Attempt, PortError> {
    batch::simple_query(
        &mut tx,
        &format!("{SESSION_RESET}; SAVEPOINT {HANDLER_SAVEPOINT}"),
    )
    .await
    .map_err(|e| port("savepoint", e))?;
    let failure = match handler(&mut tx).await {
        Err(error) => {
            // Back to the savepoint first: only this tells a transaction the handler
            // ended (it could have committed the inbox row with its writes) from one
            // it merely left aborted.
            let back = rollback_to_savepoint(&mut tx).await;
            match back {
                Ok(_) => Attempt::Failed(error),
                Err(e) if ended_by_handler(&e) => {
                    let why = refused_by_database(&e).unwrap_or_else(|| e.to_string());
                    Attempt::Ended(ended_reason(&format!("returned an error ({error})"), &why))
                }
                Err(e) => return Err(port("rollback to savepoint", e)),
            }
        }
        Ok(()) => {
            // The reset runs only if the release succeeded (a statement after a
            // failed one does not run), so the errors are the release's.
            let released = batch::simple_query(
                &mut tx,
                &format!("RELEASE SAVEPOINT {HANDLER_SAVEPOINT}; {SESSION_RESET}"),
            )
            .await;
            match released {
                Ok(_) => {
                    return match tx.commit().await {
                        Ok(()) => Ok(Attempt::Committed),
                        Err(e) => match refused_by_database(&e) {
                            Some(why) => Ok(Attempt::Failed(format!(
                                "the database refused the commit of the handler's transaction: {why}"
                            ))),
                            None => Err(port("commit", e)),
                        },
                    };
                }
                Err(e) => match refused_by_database(&e) {
                    Some(why) if ended_by_handler(&e) => {
                        Attempt::Ended(ended_reason("returned Ok", &why))
                    }
                    Some(why) => {
                        // Aborted: back to the savepoint, which is gone if the handler
                        // ended the transaction and began another, left aborted (then
                        // what it wrote between the two took effect).
                        let back = rollback_to_savepoint(&mut tx).await;
                        match back {
                            Err(back) if ended_by_handler(&back) => {
                                Attempt::Ended(ended_reason("returned Ok", &why))
                            }
                            _ => Attempt::Failed(aborted_reason(&e, &why)),
                        }
                    }
                    None => return Err(port("release savepoint", e)),
                },
            }
        }
    };
    if matches!(failure, Attempt::Ended(_)) {
        // Ended stays Ended whatever the clean-up does: an error here would be
        // taken for a store that could not be reached, and the delivery tried
        // again, repeating what the handler wrote outside the transaction.
        end_what_the_handler_left(tx).await;
        return Ok(failure);
    }
    tx.rollback().await.map_err(|e| port("rollback", e))?;
    Ok(failure)
}

/// After a handler ended the inbox transaction itself: ends whatever transaction
/// it left open (outside one, PostgreSQL answers `ROLLBACK` with a warning only),
/// then sets the session back ([`SESSION_RESET`]) outside any transaction. What
/// the handler `SET` after its own `COMMIT` was not undone by any rollback and
/// would otherwise go back into the pool with the connection, and the consumer's
/// own marks on it would be committed under the handler's `synchronous_commit`.
/// Neither statement fails on a working connection; on a broken one the pool
/// discards the connection, so a failure is logged and nothing else.
pub(super) async fn end_what_the_handler_left(mut tx: Transaction<'_, Postgres>) {
    let cleaned = async {
        batch::simple_query(&mut tx, "ROLLBACK").await?;
        batch::simple_query(&mut tx, SESSION_RESET).await
    }
    .await;
    if let Err(e) = cleaned {
        tracing::warn!(error = %e, "could not set the session back after a handler ended the inbox transaction");
    }
    // sqlx's own bookkeeping of the transaction: its ROLLBACK now only warns.
    if let Err(e) = tx.rollback().await {
        tracing::warn!(error = %e, "rollback after a handler ended the inbox transaction");
    }
}

/// The failure text when the handler returned `Ok` but its savepoint could not be
/// released, the transaction still being ours.
fn aborted_reason(e: &sqlx::Error, why: &str) -> String {
    let code = match e {
        sqlx::Error::Database(db) => db.code().map(std::borrow::Cow::into_owned),
        _ => None,
    };
    if code.as_deref() == Some("25P02") {
        format!(
            "the transaction was aborted by a statement the handler ignored \
             (the handler returned Ok after a statement failed): {why}"
        )
    } else {
        format!("the handler returned Ok but its savepoint could not be released: {why}")
    }
}

/// What a stored failure with `decision` is.
fn failure_outcome(error: String, decision: Decision) -> ConsumeOutcome {
    if decision == Decision::Dead {
        ConsumeOutcome::Dead(error)
    } else {
        ConsumeOutcome::Failed(error)
    }
}

/// [`InboxStore`] on PostgreSQL.
#[derive(Debug, Clone)]
pub struct PgInboxStore {
    pub(crate) pool: PgPool,
    /// The schema, for the operator's queries (built per call from the filter).
    pub(crate) schema: PgSchema,
    sql: std::sync::Arc<Sql>,
    /// When each consumer's held rows were last checked by `release_held`; shared
    /// by the store's clones.
    held_checked: std::sync::Arc<std::sync::Mutex<HashMap<String, Instant>>>,
    held_check_every: Duration,
}

/// How often a consumer's claims run the held-row safety net (see
/// [`PgInboxStore::with_held_check_every`]).
pub const HELD_CHECK_EVERY: Duration = Duration::from_secs(5);

fn bind_message<'q>(
    q: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    consumer: &'q str,
    m: &'q Message,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    q.bind(consumer)
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
}

impl PgInboxStore {
    /// A store on `pool` over the tables of `schema` (run [`crate::migrate`] first).
    #[must_use]
    pub fn new(pool: PgPool, schema: &PgSchema) -> Self {
        Self {
            pool,
            schema: schema.clone(),
            sql: std::sync::Arc::new(Sql::new(schema)),
            held_checked: std::sync::Arc::default(),
            held_check_every: HELD_CHECK_EVERY,
        }
    }

    /// How often a consumer's due claims also look for held rows (deliveries that
    /// wait behind an earlier one of their ordering key) whose predecessor has
    /// finished without making them due, which happens only when the process died
    /// between finishing a row and making its successor due. Default
    /// [`HELD_CHECK_EVERY`]; the check costs one index probe per key with
    /// unfinished deliveries.
    #[must_use]
    pub fn with_held_check_every(mut self, every: Duration) -> Self {
        self.held_check_every = every;
        self
    }

    /// The plan and row counts of a due claim for `consumer` (`EXPLAIN ANALYZE`),
    /// run in a transaction that is rolled back, so nothing stays claimed: for
    /// operators and tests checking that a claim reads only what it takes.
    ///
    /// # Errors
    /// A database error.
    pub async fn explain_analyze_claim_due(
        &self,
        consumer: &str,
        limit: u32,
    ) -> Result<String, PortError> {
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(|e| port("explain due claim", e))?;
        let lines: Vec<String> = sqlx::query_scalar(&format!(
            "EXPLAIN (ANALYZE, TIMING OFF, COSTS OFF) {}",
            self.sql.claim_due
        ))
        .bind(consumer)
        .bind(i64::from(limit))
        .bind("explain")
        .bind(0_i64)
        .fetch_all(&mut *tx)
        .await
        .map_err(|e| port("explain due claim", e))?;
        tx.rollback()
            .await
            .map_err(|e| port("explain due claim", e))?;
        Ok(lines.join("\n"))
    }

    /// The plan and row counts of the held-row safety net for `consumer` (`EXPLAIN
    /// ANALYZE`), in a transaction that is rolled back: for tests checking that it
    /// reads the keys with held rows, not every key.
    ///
    /// # Errors
    /// A database error.
    pub async fn explain_analyze_release_held(&self, consumer: &str) -> Result<String, PortError> {
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(|e| port("explain held check", e))?;
        let lines: Vec<String> = sqlx::query_scalar(&format!(
            "EXPLAIN (ANALYZE, TIMING OFF, COSTS OFF) {}",
            self.sql.release_held
        ))
        .bind(consumer)
        .fetch_all(&mut *tx)
        .await
        .map_err(|e| port("explain held check", e))?;
        tx.rollback()
            .await
            .map_err(|e| port("explain held check", e))?;
        Ok(lines.join("\n"))
    }

    /// The plan and row counts of [`InboxConsumerPath::hold_behind_key`]'s insert
    /// for `message` (`EXPLAIN ANALYZE`), in a transaction that is rolled back: for
    /// tests checking that the look for an unfinished predecessor is one probe.
    ///
    /// # Errors
    /// A database error.
    pub async fn explain_analyze_hold_behind_key(
        &self,
        consumer: &str,
        message: &Message,
    ) -> Result<String, PortError> {
        let stored = storable::message(message);
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(|e| port("explain hold", e))?;
        let explain = format!(
            "EXPLAIN (ANALYZE, TIMING OFF, COSTS OFF) {}",
            self.sql.arrive_held
        );
        let rows = bind_message(sqlx::query(&explain), consumer, &stored)
            .bind(&stored.ordering_key)
            .fetch_all(&mut *tx)
            .await
            .map_err(|e| port("explain hold", e))?;
        tx.rollback().await.map_err(|e| port("explain hold", e))?;
        let lines = rows
            .iter()
            .map(|r| sqlx::Row::try_get::<String, _>(r, 0))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| port("explain hold", e))?;
        Ok(lines.join("\n"))
    }

    /// Best effort, after a failed attempt on a row recorded under `lease` and not
    /// handled: the row is left without a lease, so a try again (or a
    /// redelivery) takes it over at once instead of waiting for the lease to run
    /// out. Nothing when the row has moved on (consumed, failed) or another
    /// holder has it.
    async fn give_up_lease(&self, consumer: &str, id: MessageId, lease: &Lease) {
        let cleared = sqlx::query(&self.sql.give_up_lease)
            .bind(consumer)
            .bind(id.as_uuid())
            .bind(&lease.holder)
            .execute(&self.pool)
            .await;
        if let Err(e) = cleared {
            tracing::debug!(consumer, message_id = %id, error = %e, "could not give up the lease of an unhandled delivery; it is retried once the lease runs out");
        }
    }

    /// After a keyed row finished (consumed or dead): its key's next row, if held,
    /// is due now. A failure here is only logged: the mark itself has committed,
    /// and the safety net in [`InboxConsumerPath::claim_due`] releases the row.
    async fn promote_next(&self, consumer: &str, key: &str, seq: i64) {
        let promoted = sqlx::query(&self.sql.promote_next)
            .bind(consumer)
            .bind(key)
            .bind(seq)
            .execute(&self.pool)
            .await;
        if let Err(e) = promoted {
            tracing::warn!(consumer, error = %e, "could not make the next delivery of an ordering key due; the consume sweep's check will");
        }
    }

    /// The safety net: held rows of `consumer` that lead their key are made due,
    /// at most once per `held_check_every`.
    async fn release_held_if_due(&self, consumer: &str) {
        {
            let mut checked = self
                .held_checked
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let now = Instant::now();
            match checked.get(consumer) {
                Some(at) if now.duration_since(*at) < self.held_check_every => return,
                _ => {
                    checked.insert(consumer.to_owned(), now);
                }
            }
        }
        // A failure is only logged: the claim that follows must not depend on it
        // (every other due delivery of the consumer would wait), and the next
        // check tries again.
        match sqlx::query(&self.sql.release_held)
            .bind(consumer)
            .execute(&self.pool)
            .await
        {
            Ok(done) if done.rows_affected() > 0 => {
                tracing::warn!(
                    consumer,
                    released = done.rows_affected(),
                    "held deliveries whose predecessor had finished were made due"
                );
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(consumer, error = %e, "could not check for held deliveries left behind; trying again at the next check");
            }
        }
    }

    /// Exactly once in effect: in one transaction, records `message` for `consumer`
    /// as consumed and runs `handler` with that transaction's connection. Both commit
    /// together, or neither does. A message recorded before is a
    /// [`ConsumeOutcome::Duplicate`] and the handler does not run. A failed attempt
    /// (the handler's error, a statement it ignored that left the transaction
    /// aborted, a refusal at COMMIT) rolls its writes back and stores the failure
    /// (attempt 1) for the consume sweep, under `lease`: a holder unique to this
    /// attempt, so no other worker's marks can land on the row. A handler that ended
    /// the transaction itself makes the row dead at once (see
    /// [`ConsumeOutcome::Failed`]).
    ///
    /// # Errors
    /// The database could not be reached (or the COMMIT's answer never came); then
    /// nothing is known to be recorded and the delivery should be returned to the
    /// broker (or tried again): a redelivery finds the row if the COMMIT did happen.
    /// A keyed message's row may be recorded, still unhandled: its lease is given
    /// up when the database answers, so the next try takes it over at once (else
    /// the consume sweep does once the lease runs out).
    pub async fn consume_in_transaction(
        &self,
        consumer: &str,
        message: &Message,
        lease: &Lease,
        decide: impl FnOnce(u32) -> Decision + Send,
        handler: TxHandler<'_>,
    ) -> Result<ConsumeOutcome, PortError> {
        if message.ordering_key.is_some() {
            // A keyed delivery must hold its key back while its handler runs, seen
            // by the other workers of this consumer (an arrival of the key's next
            // delivery is then held behind it). A row written inside the handler's
            // transaction would be invisible to them until it commits: so the row
            // is recorded under `lease` first, committed, and the handler runs as
            // a retry does, marking it consumed in its transaction.
            return match self.record_arrival(consumer, message, lease).await? {
                Arrival::New => {
                    let outcome = self
                        .retry_in_transaction(consumer, lease, message, 0, decide, handler)
                        .await;
                    if outcome.is_err() {
                        self.give_up_lease(consumer, message.id, lease).await;
                    }
                    outcome
                }
                Arrival::Duplicate(_) => Ok(ConsumeOutcome::Duplicate),
            };
        }
        let mut tx = self.pool.begin().await.map_err(|e| port("begin", e))?;
        let stored = storable::message(message);
        let inserted = bind_message(sqlx::query(&self.sql.arrive_consumed), consumer, &stored)
            .fetch_optional(&mut *tx)
            .await
            .map_err(|e| port("record arrival", e))?;
        if inserted.is_none() {
            tx.rollback().await.map_err(|e| port("rollback", e))?;
            return Ok(ConsumeOutcome::Duplicate);
        }
        let (error, decision) = match run_and_commit(tx, handler).await? {
            Attempt::Committed => return Ok(ConsumeOutcome::Consumed),
            Attempt::Failed(error) => (error, None),
            Attempt::Ended(error) => (error, Some(Decision::Dead)),
        };
        self.record_first_attempt_failed(consumer, message, lease, error, decision, decide)
            .await
    }

    /// After a first attempt whose transaction rolled back (or that the handler
    /// ended itself, `decision` then being `Some(Dead)`): the failure recorded under
    /// `lease`, unless the row is there already (a redelivery recorded meanwhile, or
    /// a handler that committed the row itself).
    async fn record_first_attempt_failed(
        &self,
        consumer: &str,
        message: &Message,
        lease: &Lease,
        error: String,
        decision: Option<Decision>,
        decide: impl FnOnce(u32) -> Decision + Send,
    ) -> Result<ConsumeOutcome, PortError> {
        let ended = decision.is_some();
        match self.record_arrival(consumer, message, lease).await? {
            Arrival::New => {
                let decision = decision.unwrap_or_else(|| decide(1));
                self.mark_consume_failed(consumer, message.id, lease, &error, decision)
                    .await?;
                if ended {
                    tracing::error!(consumer, message_id = %message.id, reason = %error, "handler ended the inbox transaction itself; the delivery is dead");
                }
                Ok(failure_outcome(error, decision))
            }
            Arrival::Duplicate(status) if ended => {
                Ok(self.ended_after_commit(consumer, message.id, status, &error))
            }
            Arrival::Duplicate(_) => Ok(ConsumeOutcome::Duplicate),
        }
    }

    /// A handler ended the inbox transaction and the row was found already recorded
    /// (as `status`): the handler committed it, with its writes, before failing, or
    /// (rarely) another worker recorded it meanwhile. A consumed row cannot become
    /// dead, so the outcome is reported as it stands, with an error in the log.
    fn ended_after_commit(
        &self,
        consumer: &str,
        id: MessageId,
        status: Status,
        reason: &str,
    ) -> ConsumeOutcome {
        tracing::error!(consumer, message_id = %id, %status, %reason, "handler ended the inbox transaction itself; the delivery stays as recorded, its writes may have taken effect");
        if status == Status::Consumed {
            ConsumeOutcome::Consumed
        } else {
            ConsumeOutcome::Duplicate
        }
    }

    /// Exactly once in effect for a consume retry: `message` was claimed by the sweep
    /// under `lease` (see [`InboxStore::claim_due`]). In one transaction the row is
    /// marked consumed (only if `lease` still holds it) and `handler` runs with that
    /// transaction's connection; both commit or neither. A failed attempt (as in
    /// [`Self::consume_in_transaction`]) rolls back and records the failure (`decide`
    /// gets the attempt number) under the lease; a handler that ended the
    /// transaction itself makes the row dead at once.
    ///
    /// # Errors
    /// The database could not be reached; the row stays claimed until the lease runs
    /// out.
    pub async fn retry_in_transaction(
        &self,
        consumer: &str,
        lease: &Lease,
        message: &Message,
        attempts_before: u32,
        decide: impl FnOnce(u32) -> Decision + Send,
        handler: TxHandler<'_>,
    ) -> Result<ConsumeOutcome, PortError> {
        let mut tx = self.pool.begin().await.map_err(|e| port("begin", e))?;
        let marked: Option<(i64, Option<String>)> = sqlx::query_as(&self.sql.mark_consumed)
            .bind(consumer)
            .bind(message.id.as_uuid())
            .bind(&lease.holder)
            .bind(Side::Inbox.sources_of(Status::Consumed))
            .fetch_optional(&mut *tx)
            .await
            .map_err(|e| port("mark consumed", e))?;
        let Some((seq, key)) = marked else {
            tx.rollback().await.map_err(|e| port("rollback", e))?;
            return Ok(ConsumeOutcome::Duplicate);
        };
        // After the commit, not inside it: an arrival of the key that waits on
        // this row's lock sees the row consumed once it commits, and one that was
        // held before is visible to a statement that starts after it.
        let promote = |status: Status| async move {
            if let (Some(key), Status::Consumed) = (key.as_deref(), status) {
                self.promote_next(consumer, key, seq).await;
            }
        };
        let (error, decision) = match run_and_commit(tx, handler).await? {
            Attempt::Committed => {
                promote(Status::Consumed).await;
                return Ok(ConsumeOutcome::Consumed);
            }
            Attempt::Failed(error) => {
                let decision = decide(attempts_before.saturating_add(1));
                (error, decision)
            }
            Attempt::Ended(error) => {
                let marked = self
                    .mark_consume_failed(consumer, message.id, lease, &error, Decision::Dead)
                    .await?;
                if marked {
                    tracing::error!(consumer, message_id = %message.id, reason = %error, "handler ended the inbox transaction itself; the delivery is dead");
                    return Ok(ConsumeOutcome::Dead(error));
                }
                // Not under our lease in a state that may die: the handler committed
                // the row as consumed (or the lease was lost meanwhile).
                let status = self
                    .status_of(consumer, message.id)
                    .await?
                    .unwrap_or(Status::Sent);
                promote(status).await;
                return Ok(self.ended_after_commit(consumer, message.id, status, &error));
            }
        };
        self.mark_consume_failed(consumer, message.id, lease, &error, decision)
            .await?;
        Ok(failure_outcome(error, decision))
    }

    /// Vacuums `outbox_inbox` when autovacuum is off for it and its dead rows pass
    /// autovacuum's threshold: every consumed delivery rewrites its row (see
    /// [`outbox_ports::OutboxRetention::reclaim_space`]). The table is shared by
    /// every consumer of the schema.
    ///
    /// # Errors
    /// A database error.
    pub async fn reclaim_space(&self) -> Result<outbox_ports::SpaceReclaim, PortError> {
        crate::vacuum::reclaim(&self.pool, &self.schema, "outbox_inbox").await
    }

    /// Retention: deletes `consumer`'s deliveries consumed more than `age` ago,
    /// `batch` per statement; returns how many. Failed, dead and in-progress rows are
    /// never deleted.
    ///
    /// # Errors
    /// A database error; what was deleted before it stays deleted.
    pub async fn delete_consumed_older_than(
        &self,
        consumer: &str,
        age: std::time::Duration,
        batch: u32,
    ) -> Result<u64, PortError> {
        let mut total = 0;
        loop {
            let n = self.delete_consumed_batch(consumer, age, batch).await?;
            total += n;
            if n < u64::from(batch.max(1)) {
                return Ok(total);
            }
        }
    }

    /// One statement of [`Self::delete_consumed_older_than`]: deletes at most `batch`
    /// rows and returns how many, so a caller can stop between batches.
    ///
    /// # Errors
    /// A database error.
    pub async fn delete_consumed_batch(
        &self,
        consumer: &str,
        age: std::time::Duration,
        batch: u32,
    ) -> Result<u64, PortError> {
        Ok(sqlx::query(&self.sql.retention)
            .bind(millis(age))
            .bind(i64::from(batch.max(1)))
            .bind(consumer)
            .execute(&self.pool)
            .await
            .map_err(|e| port("retention", e))?
            .rows_affected())
    }

    /// The plan PostgreSQL would use for one retention statement of `consumer`
    /// (`EXPLAIN`, nothing is deleted): for operators checking that retention stays
    /// on its index (`inbox_retention`) whatever other consumers keep.
    ///
    /// # Errors
    /// A database error.
    pub async fn explain_retention(
        &self,
        consumer: &str,
        age: std::time::Duration,
        batch: u32,
    ) -> Result<String, PortError> {
        let lines: Vec<String> = sqlx::query_scalar(&format!("EXPLAIN {}", self.sql.retention))
            .bind(millis(age))
            .bind(i64::from(batch.max(1)))
            .bind(consumer)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| port("explain retention", e))?;
        Ok(lines.join("\n"))
    }

    async fn status_of(&self, consumer: &str, id: MessageId) -> Result<Option<Status>, PortError> {
        sqlx::query_scalar::<_, String>(&self.sql.status_of)
            .bind(consumer)
            .bind(id.as_uuid())
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| port("read status", e))?
            .map(|s| {
                Side::Inbox
                    .status(&s)
                    .map_err(|e| PortError::fatal("read status", e))
            })
            .transpose()
    }
}

#[async_trait]
impl InboxConsumerPath for PgInboxStore {
    async fn record_arrival(
        &self,
        consumer: &str,
        message: &Message,
        lease: &Lease,
    ) -> Result<Arrival, PortError> {
        let stored = storable::message(message);
        let taken = bind_message(sqlx::query(&self.sql.arrive), consumer, &stored)
            .bind(&stored.ordering_key)
            .bind(&lease.holder)
            .bind(millis(lease.ttl))
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| port("record arrival", e))?;
        if taken.is_some() {
            return Ok(Arrival::New);
        }
        let status = self
            .status_of(consumer, message.id)
            .await?
            .unwrap_or(Status::Sent);
        Ok(Arrival::Duplicate(status))
    }

    async fn record_given_up(
        &self,
        consumer: &str,
        message: &Message,
        reason: &str,
    ) -> Result<bool, PortError> {
        let stored = storable::message(message);
        let inserted = bind_message(sqlx::query(&self.sql.arrive_given_up), consumer, &stored)
            .bind(&stored.ordering_key)
            .bind(storable::error_text(reason))
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| port("record a delivery the broker gave up on", e))?;
        Ok(inserted.is_some())
    }

    async fn hold_behind_key(&self, consumer: &str, message: &Message) -> Result<bool, PortError> {
        if message.ordering_key.is_none() {
            return Ok(false);
        }
        let stored = storable::message(message);
        let held = bind_message(sqlx::query(&self.sql.arrive_held), consumer, &stored)
            .bind(&stored.ordering_key)
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| port("hold behind its key", e))?;
        if held.is_none() {
            return Ok(false);
        }
        // Its predecessor may have finished since: then the row is due, and the
        // caller handles it now (record_arrival takes the recorded row over, as
        // it leads its key). Should this fail, the row stays held and the
        // safety net releases it.
        let released = sqlx::query(&self.sql.release_if_head)
            .bind(consumer)
            .bind(message.id.as_uuid())
            .fetch_optional(&self.pool)
            .await;
        match released {
            Ok(released) => Ok(released.is_none()),
            Err(e) => {
                tracing::warn!(consumer, message_id = %message.id, error = %e, "held a delivery but could not check its predecessor again; the consume sweep's check will");
                Ok(true)
            }
        }
    }

    async fn mark_consumed(
        &self,
        consumer: &str,
        id: MessageId,
        lease: &Lease,
    ) -> Result<bool, PortError> {
        let marked: Option<(i64, Option<String>)> = sqlx::query_as(&self.sql.mark_consumed)
            .bind(consumer)
            .bind(id.as_uuid())
            .bind(&lease.holder)
            .bind(Side::Inbox.sources_of(Status::Consumed))
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| port("mark consumed", e))?;
        let Some((seq, key)) = marked else {
            return Ok(false);
        };
        if let Some(key) = key {
            self.promote_next(consumer, &key, seq).await;
        }
        Ok(true)
    }

    async fn mark_consume_failed(
        &self,
        consumer: &str,
        id: MessageId,
        lease: &Lease,
        error: &str,
        decision: Decision,
    ) -> Result<bool, PortError> {
        let delay = match decision {
            Decision::RetryAfter(d) => Some(millis(d)),
            Decision::Dead => None,
        };
        let from: Vec<String> = Side::Inbox
            .sources_of(Status::ConsumeFailed)
            .into_iter()
            .filter(|s| Side::Inbox.sources_of(Status::Dead).contains(s))
            .collect();
        let marked: Option<(i64, Option<String>, String)> = sqlx::query_as(&self.sql.mark_failed)
            .bind(consumer)
            .bind(id.as_uuid())
            .bind(&lease.holder)
            .bind(storable::error_text(error))
            .bind(delay)
            .bind(from)
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| port("mark consume failed", e))?;
        let Some((seq, key, status)) = marked else {
            return Ok(false);
        };
        // A dead row no longer holds its key back; a failed one still does.
        if let (Some(key), true) = (key, status == Side::Inbox.name(Status::Dead)) {
            self.promote_next(consumer, &key, seq).await;
        }
        Ok(true)
    }

    async fn claim_due(
        &self,
        consumer: &str,
        lease: &Lease,
        limit: u32,
    ) -> Result<Vec<ClaimedDelivery>, PortError> {
        self.release_held_if_due(consumer).await;
        let rows: Vec<ClaimedRow> = sqlx::query_as(&self.sql.claim_due)
            .bind(consumer)
            .bind(i64::from(limit))
            .bind(&lease.holder)
            .bind(millis(lease.ttl))
            .fetch_all(&self.pool)
            .await
            .map_err(|e| port("claim due deliveries", e))?;
        Ok(in_claim_order(rows)
            .map(|(message, attempts)| ClaimedDelivery { message, attempts })
            .collect())
    }

    async fn record_dead_letter(
        &self,
        consumer: &str,
        letter: DeadLetter,
    ) -> Result<(), PortError> {
        sqlx::query(&self.sql.dead_letter)
            .bind(consumer)
            .bind(storable::opt_text(letter.message_id.as_deref()))
            .bind(storable::text(&letter.routing_key))
            .bind(Json(storable::headers(&letter.headers)))
            .bind(&letter.body)
            .bind(storable::error_text(&letter.reason))
            .execute(&self.pool)
            .await
            .map_err(|e| port("record dead letter", e))?;
        Ok(())
    }
}

#[async_trait]
impl InboxStore for PgInboxStore {
    async fn stats(&self, consumer: &str) -> Result<InboxStats, PortError> {
        let (received, consumed, consume_failed, dead, dead_letters): (i64, i64, i64, i64, i64) =
            sqlx::query_as(&self.sql.stats)
                .bind(consumer)
                .fetch_one(&self.pool)
                .await
                .map_err(|e| port("inbox stats", e))?;
        let n = |v: i64| u64::try_from(v).unwrap_or(0);
        Ok(InboxStats {
            received: n(received),
            consumed: n(consumed),
            consume_failed: n(consume_failed),
            dead: n(dead),
            dead_letters: n(dead_letters),
        })
    }

    async fn get(&self, consumer: &str, id: MessageId) -> Result<Option<InboxRecord>, PortError> {
        sqlx::query_as::<_, MessageRow>(&self.sql.get)
            .bind(consumer)
            .bind(id.as_uuid())
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| port("get delivery", e))?
            .map(|r| r.inbox_record(consumer))
            .transpose()
    }

    async fn list(
        &self,
        consumer: &str,
        status: Status,
        limit: u32,
    ) -> Result<Vec<InboxRecord>, PortError> {
        sqlx::query_as::<_, MessageRow>(&self.sql.list)
            .bind(consumer)
            .bind(Side::Inbox.name(status))
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await
            .map_err(|e| port("list deliveries", e))?
            .iter()
            .map(|r| r.inbox_record(consumer))
            .collect()
    }

    async fn reconsume(&self, consumer: &str, id: MessageId, again: bool) -> Result<(), PortError> {
        let sources = outbox_ports::reconsumable_from(again);
        let n = sqlx::query(&self.sql.reconsume)
            .bind(consumer)
            .bind(id.as_uuid())
            .bind(Side::Inbox.names(&sources))
            .execute(&self.pool)
            .await
            .map_err(|e| port("reconsume", e))?
            .rows_affected();
        if n == 1 {
            return Ok(());
        }
        // Nothing changed: say why, from the row as it is now. In a status the
        // reconsume takes, only a holder (a lease, a transaction's row lock) can
        // have kept it out; a holder that finished meanwhile shows as its outcome.
        match self.status_of(consumer, id).await? {
            None => Err(PortError::NotFound {
                what: "delivery",
                id: id.to_string(),
            }),
            Some(from) if sources.contains(&from) => Err(PortError::Busy {
                what: "delivery",
                id: id.to_string(),
                holder: "a worker or a consume retry is handling it",
            }),
            Some(from) => Err(TransitionError {
                from,
                to: Status::Sent,
            }
            .into()),
        }
    }
}
