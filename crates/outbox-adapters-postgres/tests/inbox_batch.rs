//! Several deliveries in one inbox transaction
//! (`PgInboxStore::consume_batch_in_transaction`): each is exactly once in effect
//! and none is lost, whatever its batch-mates' handlers do (fail, ignore a failed
//! statement, commit or roll back the transaction themselves, break a deferred
//! constraint at COMMIT), and a batch of good deliveries commits as one
//! transaction.

mod common;

use outbox_ports::InboxOperator as _;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_adapters_postgres::{
    BatchDelivery, ConsumeOutcome, PgInboxStore, PgPool, PgSchema, TxHandler,
};
use outbox_core::{Decision, HandlerFailure, InboxStatus, Message, MessageId};
use outbox_ports::Lease;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;

/// What a delivery's handler does (by its payload).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Writes its effect, returns Ok.
    Good,
    /// Writes its effect, returns an error.
    Fails,
    /// Writes its effect, ignores a failed statement, returns Ok.
    Swallows,
    /// Writes its effect, sends COMMIT itself, returns Ok.
    Commits,
    /// Sends ROLLBACK itself, then writes its effect (autocommitted), returns Ok.
    RollsBack,
    /// Writes its effect and twice a row under a deferred unique constraint: the
    /// COMMIT is refused.
    Deferred,
    /// Sends ROLLBACK itself, writes its effect (autocommitted), sends BEGIN,
    /// ignores a failed statement, returns Ok: the transaction it leaves is
    /// aborted and the worker's savepoint is gone.
    Restarts,
    /// Consumed before the batch: its handler must not run.
    Redelivered,
    /// Has an ordering key (handled in a transaction of its own).
    Keyed,
}

impl Kind {
    const ALL: [Self; 9] = [
        Self::Good,
        Self::Fails,
        Self::Swallows,
        Self::Commits,
        Self::RollsBack,
        Self::Restarts,
        Self::Deferred,
        Self::Redelivered,
        Self::Keyed,
    ];

    fn payload(self) -> Vec<u8> {
        format!("{self:?}").into_bytes()
    }

    fn of(m: &Message) -> Self {
        Self::ALL
            .into_iter()
            .find(|k| k.payload() == m.payload)
            .expect("a kind's payload")
    }
}

#[derive(Clone)]
struct Handlers {
    schema: PgSchema,
    calls: Arc<Mutex<HashMap<MessageId, u32>>>,
}

impl Handlers {
    fn calls(&self, id: MessageId) -> u32 {
        self.calls
            .lock()
            .expect("calls")
            .get(&id)
            .copied()
            .unwrap_or(0)
    }

    fn handler_for(&self, m: &Message) -> TxHandler<'static> {
        let kind = Kind::of(m);
        let id = *m.id.as_uuid();
        let (calls, message_id) = (Arc::clone(&self.calls), m.id);
        let effects = format!("INSERT INTO {}.effects VALUES ($1)", self.schema.quoted());
        let deferred = format!(
            "INSERT INTO {}.deferred_unique VALUES ($1)",
            self.schema.quoted()
        );
        Box::new(move |conn: &mut sqlx::PgConnection| {
            Box::pin(async move {
                *calls.lock().expect("calls").entry(message_id).or_default() += 1;
                let err = |e: sqlx::Error| e.to_string();
                if matches!(kind, Kind::RollsBack | Kind::Restarts) {
                    sqlx::query("ROLLBACK")
                        .execute(&mut *conn)
                        .await
                        .map_err(err)?;
                }
                sqlx::query(sqlx::AssertSqlSafe(effects))
                    .bind(id)
                    .execute(&mut *conn)
                    .await
                    .map_err(err)?;
                match kind {
                    Kind::Fails => return Err("downstream refused".into()),
                    Kind::Swallows => {
                        // The handler bug under test: the error is ignored.
                        let _ignored = sqlx::query("SELECT 1 / 0").execute(&mut *conn).await;
                    }
                    Kind::Commits => {
                        sqlx::query("COMMIT")
                            .execute(&mut *conn)
                            .await
                            .map_err(err)?;
                    }
                    Kind::Deferred => {
                        for _ in 0..2 {
                            sqlx::query(sqlx::AssertSqlSafe(&*deferred))
                                .bind(id)
                                .execute(&mut *conn)
                                .await
                                .map_err(err)?;
                        }
                    }
                    Kind::Restarts => {
                        sqlx::query("BEGIN")
                            .execute(&mut *conn)
                            .await
                            .map_err(err)?;
                        let _ignored = sqlx::query("SELECT 1 / 0").execute(&mut *conn).await;
                    }
                    Kind::Redelivered => panic!("a redelivery must not reach its handler"),
                    Kind::Good | Kind::RollsBack | Kind::Keyed => {}
                }
                Ok(())
            })
        })
    }
}

async fn setup(pool: &PgPool, schema: &PgSchema) -> (PgInboxStore, Handlers) {
    for ddl in [
        format!(
            "CREATE TABLE {}.effects (message_id uuid NOT NULL)",
            schema.quoted()
        ),
        format!(
            "CREATE TABLE {}.deferred_unique (message_id uuid, \
             CONSTRAINT deferred_unique_id UNIQUE (message_id) DEFERRABLE INITIALLY DEFERRED)",
            schema.quoted()
        ),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(ddl))
            .execute(pool)
            .await
            .expect("table");
    }
    let handlers = Handlers {
        schema: schema.clone(),
        calls: Arc::default(),
    };
    (PgInboxStore::new(pool.clone(), schema), handlers)
}

const CONSUMER: &str = "billing";

fn lease() -> Lease {
    Lease::new(outbox_testkit::unique_key("batch"), Duration::from_secs(60))
}

fn message(kind: Kind) -> Message {
    let mut m = outbox_testkit::message("orders", "order.created");
    m.payload = kind.payload();
    if kind == Kind::Keyed {
        m.ordering_key = Some(format!("key-{}", m.id));
    }
    m
}

fn retry(_message: &Message, _attempt: u32, _failure: &HandlerFailure) -> Decision {
    Decision::RetryAfter(Duration::from_secs(60))
}

async fn effects_of(pool: &PgPool, schema: &PgSchema, id: MessageId) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {}.effects WHERE message_id = $1",
        schema.quoted()
    )))
    .bind(id.as_uuid())
    .fetch_one(pool)
    .await
    .expect("effects")
}

/// When the transaction that wrote a delivery's inbox row started (`now()`, the
/// same for every statement of a transaction; not `xmin`, which inside a savepoint
/// is the subtransaction's).
async fn written_at(pool: &PgPool, schema: &PgSchema, id: MessageId) -> String {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT received_at::text FROM {}.outbox_inbox WHERE consumer = $1 AND message_id = $2",
        schema.quoted()
    )))
    .bind(CONSUMER)
    .bind(id.as_uuid())
    .fetch_one(pool)
    .await
    .expect("received_at")
}

/// One batch of `msgs` (with `leases`), handlers from `handler_for`.
async fn consume_with(
    inbox: &PgInboxStore,
    msgs: &[Message],
    leases: &[Lease],
    handler_for: &(dyn Fn(&Message) -> TxHandler<'static> + Send + Sync),
) -> Vec<Result<ConsumeOutcome, outbox_ports::PortError>> {
    let deliveries: Vec<BatchDelivery<'_>> = msgs
        .iter()
        .zip(leases)
        .map(|(message, lease)| BatchDelivery { message, lease })
        .collect();
    inbox
        .consume_batch_in_transaction(CONSUMER, &deliveries, &retry, handler_for)
        .await
}

/// One batch of `msgs` with the [`Handlers`] by kind.
async fn consume(
    inbox: &PgInboxStore,
    handlers: &Handlers,
    msgs: &[Message],
    leases: &[Lease],
) -> Vec<Result<ConsumeOutcome, outbox_ports::PortError>> {
    let h = handlers.clone();
    consume_with(inbox, msgs, leases, &move |m: &Message| h.handler_for(m)).await
}

/// Runs one batch of `kinds` and checks each delivery's outcome, inbox row,
/// effects and handler runs.
async fn check_batch(
    pool: &PgPool,
    schema: &PgSchema,
    inbox: &PgInboxStore,
    h: &Handlers,
    kinds: &[Kind],
) {
    let msgs: Vec<Message> = kinds.iter().map(|&k| message(k)).collect();
    let leases: Vec<Lease> = msgs.iter().map(|_| lease()).collect();
    for m in msgs.iter().filter(|m| Kind::of(m) == Kind::Redelivered) {
        // Consumed before, without an effect of its own.
        let none: TxHandler<'static> =
            Box::new(|_c: &mut sqlx::PgConnection| Box::pin(async { Ok(()) }));
        let first = inbox
            .consume_in_transaction(CONSUMER, m, &lease(), |n, f: &_| retry(m, n, f), none)
            .await
            .expect("first delivery");
        assert_eq!(first, ConsumeOutcome::Consumed);
    }
    let outcomes = consume(inbox, h, &msgs, &leases).await;
    assert_eq!(outcomes.len(), kinds.len());
    for (n, (m, outcome)) in msgs.iter().zip(&outcomes).enumerate() {
        let kind = Kind::of(m);
        let at = format!("{kind:?} at {n} of {kinds:?}: {outcome:?}");
        let outcome = outcome.as_ref().unwrap_or_else(|e| panic!("{at}: {e}"));
        let row = inbox
            .get_delivery(CONSUMER, m.id)
            .await
            .expect("get")
            .unwrap_or_else(|| panic!("{at}: no inbox row, the delivery is lost"));
        let effects = effects_of(pool, schema, m.id).await;
        let calls = h.calls(m.id);
        match kind {
            Kind::Good | Kind::Keyed => {
                assert!(
                    matches!(
                        outcome,
                        ConsumeOutcome::Consumed | ConsumeOutcome::Duplicate
                    ),
                    "{at}"
                );
                assert_eq!(row.status, InboxStatus::Consumed, "{at}");
                assert_eq!(effects, 1, "{at}: effects");
            }
            Kind::Fails | Kind::Swallows | Kind::Deferred => {
                let ConsumeOutcome::Failed(error) = outcome else {
                    panic!("{at}");
                };
                let expected = match kind {
                    Kind::Fails => "downstream refused",
                    Kind::Swallows => "aborted by a statement the handler ignored",
                    _ => "deferred_unique_id",
                };
                assert!(error.contains(expected), "{at}");
                assert_eq!(row.status, InboxStatus::ConsumeFailed, "{at}");
                assert_eq!(row.consume.attempts, 1, "{at}");
                assert_eq!(effects, 0, "{at}: its writes were rolled back");
            }
            Kind::Commits => {
                // In a batch its COMMIT is refused (inbox_batch_sealed): nothing it
                // wrote stands, and it is dead. Handled singly (alone, or after an
                // earlier delivery ended the batch) its COMMIT commits its row.
                let unkeyed: Vec<Kind> = kinds
                    .iter()
                    .copied()
                    .filter(|k| *k != Kind::Keyed)
                    .collect();
                let ended_before = kinds[..n]
                    .iter()
                    .any(|k| matches!(k, Kind::Commits | Kind::RollsBack | Kind::Restarts));
                if unkeyed.len() > 1 && !ended_before {
                    assert!(matches!(outcome, ConsumeOutcome::Dead(_)), "{at}");
                }
                if matches!(outcome, ConsumeOutcome::Dead(_)) {
                    assert_eq!(row.status, InboxStatus::Dead, "{at}");
                    assert_eq!(effects, 0, "{at}: its refused COMMIT wrote nothing");
                } else {
                    assert_eq!(*outcome, ConsumeOutcome::Consumed, "{at}");
                    assert_eq!(row.status, InboxStatus::Consumed, "{at}");
                    assert_eq!(effects, 1, "{at}: effects");
                }
                assert_eq!(
                    calls, 1,
                    "{at}: a handler that ended the transaction runs once"
                );
            }
            Kind::RollsBack | Kind::Restarts => {
                assert!(matches!(outcome, ConsumeOutcome::Dead(_)), "{at}");
                assert_eq!(row.status, InboxStatus::Dead, "{at}");
                assert_eq!(effects, 1, "{at}: its write outside the transaction");
                assert_eq!(
                    calls, 1,
                    "{at}: a handler that ended the transaction runs once"
                );
            }
            Kind::Redelivered => {
                assert_eq!(*outcome, ConsumeOutcome::Duplicate, "{at}");
                assert_eq!(row.status, InboxStatus::Consumed, "{at}");
                assert_eq!(calls, 0, "{at}");
                assert_eq!(effects, 0, "{at}");
            }
        }
    }
    let deferred: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {}.deferred_unique",
        schema.quoted()
    )))
    .fetch_one(pool)
    .await
    .expect("deferred");
    assert_eq!(deferred, 0, "{kinds:?}: a refused COMMIT's rows stand");
    // Nothing forced the batch apart: its good deliveries committed as one.
    let apart = [
        Kind::Commits,
        Kind::RollsBack,
        Kind::Restarts,
        Kind::Deferred,
    ];
    if !kinds.iter().any(|k| apart.contains(k)) {
        let mut xmins = std::collections::BTreeSet::new();
        for m in msgs.iter().filter(|m| Kind::of(m) == Kind::Good) {
            xmins.insert(written_at(pool, schema, m.id).await);
        }
        assert!(
            xmins.len() <= 1,
            "{kinds:?}: good deliveries in {} transactions",
            xmins.len()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_delivery_of_a_batch_is_exactly_once_in_effect_whatever_its_batch_mates_do() {
    with_db!(|pool, schema| {
        let (inbox, h) = setup(&pool, &schema).await;
        // Every pair in both orders, so each kind meets each other before and after.
        for a in Kind::ALL {
            for b in Kind::ALL {
                check_batch(&pool, &schema, &inbox, &h, &[a, b]).await;
            }
        }
        let mut runner = TestRunner::deterministic();
        let kinds = proptest::collection::vec(proptest::sample::select(Kind::ALL.to_vec()), 1..=7);
        for _ in 0..150 {
            let batch = kinds.new_tree(&mut runner).expect("kinds").current();
            check_batch(&pool, &schema, &inbox, &h, &batch).await;
        }
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP SCHEMA {} CASCADE",
            schema.quoted()
        )))
        .execute(&pool)
        .await
        .expect("drop");
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_good_deliveries_is_one_transaction() {
    with_db!(|pool, schema| {
        let (inbox, h) = setup(&pool, &schema).await;
        let msgs: Vec<Message> = (0..8).map(|_| message(Kind::Good)).collect();
        let leases: Vec<Lease> = msgs.iter().map(|_| lease()).collect();
        let outcomes = consume(&inbox, &h, &msgs, &leases).await;
        assert!(
            outcomes
                .iter()
                .all(|o| matches!(o, Ok(ConsumeOutcome::Consumed))),
            "{outcomes:?}"
        );
        let mut xmins = std::collections::BTreeSet::new();
        for m in &msgs {
            xmins.insert(written_at(&pool, &schema, m.id).await);
            assert_eq!(effects_of(&pool, &schema, m.id).await, 1);
        }
        assert_eq!(xmins.len(), 1, "8 deliveries, {} transactions", xmins.len());
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_message_twice_in_a_batch_runs_once() {
    with_db!(|pool, schema| {
        let (inbox, h) = setup(&pool, &schema).await;
        let m = message(Kind::Good);
        let msgs = [m.clone(), m.clone()];
        let leases = [lease(), lease()];
        let outcomes = consume(&inbox, &h, &msgs, &leases).await;
        assert!(
            matches!(outcomes[0], Ok(ConsumeOutcome::Consumed)),
            "{outcomes:?}"
        );
        assert!(
            matches!(outcomes[1], Ok(ConsumeOutcome::Duplicate)),
            "{outcomes:?}"
        );
        assert_eq!(effects_of(&pool, &schema, m.id).await, 1);
        assert_eq!(h.calls(m.id), 1);
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_batches_racing_over_the_same_messages_apply_each_once() {
    with_db!(|pool, schema| {
        let (inbox, h) = setup(&pool, &schema).await;
        // In opposite orders, so each batch may wait on a row the other inserted
        // (a deadlock PostgreSQL breaks by failing one insert).
        let msgs: Vec<Message> = (0..6).map(|_| message(Kind::Good)).collect();
        let reversed: Vec<Message> = msgs.iter().rev().cloned().collect();
        let leases: Vec<Lease> = msgs.iter().map(|_| lease()).collect();
        let (a, b) = tokio::join!(
            consume(&inbox, &h, &msgs, &leases),
            consume(&inbox, &h, &reversed, &leases)
        );
        let b: Vec<_> = b.into_iter().rev().collect();
        for (n, m) in msgs.iter().enumerate() {
            let both = [&a[n], &b[n]];
            let consumed = both
                .iter()
                .filter(|o| matches!(o, Ok(ConsumeOutcome::Consumed)))
                .count();
            assert_eq!(consumed, 1, "message {n}: {both:?}");
            assert!(
                both.iter().all(|o| matches!(
                    o,
                    Ok(ConsumeOutcome::Consumed | ConsumeOutcome::Duplicate) | Err(_)
                )),
                "{both:?}"
            );
            assert_eq!(effects_of(&pool, &schema, m.id).await, 1, "message {n}");
        }
    });
}

/// A handler by run: the first fails, the later ones send ROLLBACK themselves and
/// write their effect outside the transaction (autocommitted).
fn fails_then_rolls_back(
    schema: &PgSchema,
    runs: Arc<Mutex<u32>>,
    m: &Message,
) -> TxHandler<'static> {
    let effects = format!("INSERT INTO {}.effects VALUES ($1)", schema.quoted());
    let id = *m.id.as_uuid();
    Box::new(move |conn: &mut sqlx::PgConnection| {
        Box::pin(async move {
            let run = {
                let mut r = runs.lock().expect("runs");
                *r += 1;
                *r
            };
            if run == 1 {
                return Err("not yet".into());
            }
            let err = |e: sqlx::Error| e.to_string();
            sqlx::query("ROLLBACK")
                .execute(&mut *conn)
                .await
                .map_err(err)?;
            sqlx::query(sqlx::AssertSqlSafe(effects))
                .bind(id)
                .execute(&mut *conn)
                .await
                .map_err(err)?;
            Ok(())
        })
    })
}

/// Found in review: one message twice in a batch, the first copy's handler fails
/// (rolled back to its savepoint, no row), the second's ends the transaction and
/// writes outside it. Handled singly in batch order, the first copy found no row
/// and ran the handler a third time, writing outside the transaction again. Since
/// the batch records its rows in one statement, the second copy is a duplicate of
/// the first and its handler never runs: the failure is recorded once, for retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_of_a_message_in_the_same_batch_never_runs_its_handler() {
    with_db!(|pool, schema| {
        let (inbox, _h) = setup(&pool, &schema).await;
        let m = message(Kind::Good);
        let msgs = [m.clone(), m.clone()];
        let leases = [lease(), lease()];
        let runs = Arc::new(Mutex::new(0_u32));
        let (s, r) = (schema.clone(), Arc::clone(&runs));
        let outcomes = consume_with(&inbox, &msgs, &leases, &move |m: &Message| {
            fails_then_rolls_back(&s, Arc::clone(&r), m)
        })
        .await;
        assert!(
            matches!(
                outcomes.as_slice(),
                [Ok(ConsumeOutcome::Failed(_)), Ok(ConsumeOutcome::Duplicate)]
            ),
            "{outcomes:?}"
        );
        let row = inbox
            .get_delivery(CONSUMER, m.id)
            .await
            .expect("get")
            .expect("row");
        assert_eq!(row.status, InboxStatus::ConsumeFailed, "{outcomes:?}");
        assert_eq!(*runs.lock().expect("runs"), 1, "{outcomes:?}");
        assert_eq!(effects_of(&pool, &schema, m.id).await, 0, "{outcomes:?}");
    });
}

/// The batch's rows are inserted before its handlers run: a handler's own COMMIT
/// must not commit the rows of the deliveries after it, whose handlers have not
/// run (they would be found consumed, their effects never written: lost).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handlers_own_commit_never_records_its_batch_mates_unhandled() {
    with_db!(|pool, schema| {
        let (inbox, h) = setup(&pool, &schema).await;
        let kinds = [Kind::Good, Kind::Commits, Kind::Good, Kind::Good];
        let msgs: Vec<Message> = kinds.iter().map(|&k| message(k)).collect();
        let leases: Vec<Lease> = msgs.iter().map(|_| lease()).collect();
        let outcomes = consume(&inbox, &h, &msgs, &leases).await;
        for (m, outcome) in msgs.iter().zip(&outcomes) {
            if Kind::of(m) == Kind::Good {
                assert!(
                    matches!(outcome, Ok(ConsumeOutcome::Consumed)),
                    "{outcomes:?}"
                );
                assert_eq!(effects_of(&pool, &schema, m.id).await, 1, "{outcomes:?}");
            }
        }
    });
}

/// Found in review: a store on a schema not migrated since the batch's COMMIT check
/// came would batch unguarded; it handles each delivery in a transaction of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_commit_check_a_batch_is_handled_one_transaction_each() {
    with_db!(|pool, schema| {
        let (_inbox, h) = setup(&pool, &schema).await;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP TRIGGER inbox_batch_sealed ON {}.outbox_inbox",
            schema.quoted()
        )))
        .execute(&pool)
        .await
        .expect("drop the check");
        let inbox = PgInboxStore::new(pool.clone(), &schema);
        let kinds = [Kind::Good, Kind::Commits, Kind::Good, Kind::Good];
        let msgs: Vec<Message> = kinds.iter().map(|&k| message(k)).collect();
        let leases: Vec<Lease> = msgs.iter().map(|_| lease()).collect();
        let outcomes = consume(&inbox, &h, &msgs, &leases).await;
        for (m, outcome) in msgs.iter().zip(&outcomes) {
            if Kind::of(m) == Kind::Good {
                assert!(
                    matches!(outcome, Ok(ConsumeOutcome::Consumed)),
                    "{outcomes:?}"
                );
                assert_eq!(effects_of(&pool, &schema, m.id).await, 1, "{outcomes:?}");
            }
        }
    });
}

/// Found in review: a handler whose COMMIT is refused (which rolls the batch's rows
/// and its batch-mates' writes back), and which then begins a transaction and takes
/// a savepoint of the worker's name itself: the worker's release succeeds there,
/// and without the seal's check of the transaction the later handlers' writes
/// committed without inbox rows and every delivery was acknowledged as consumed,
/// the earlier ones without their writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_reopens_the_transaction_never_costs_its_batch_mates_their_writes() {
    with_db!(|pool, schema| {
        let (inbox, h) = setup(&pool, &schema).await;
        let msgs: Vec<Message> = (0..3).map(|_| message(Kind::Good)).collect();
        let leases: Vec<Lease> = msgs.iter().map(|_| lease()).collect();
        let reopens = msgs[1].id;
        let outcomes = consume_with(&inbox, &msgs, &leases, &move |m: &Message| {
            if m.id != reopens {
                return h.handler_for(m);
            }
            Box::new(|conn: &mut sqlx::PgConnection| {
                Box::pin(async move {
                    let _refused = sqlx::query("COMMIT").execute(&mut *conn).await;
                    for sql in ["BEGIN", "SAVEPOINT outbox_handler"] {
                        sqlx::query(sql)
                            .execute(&mut *conn)
                            .await
                            .map_err(|e| e.to_string())?;
                    }
                    Ok(())
                })
            })
        })
        .await;
        for (n, m) in msgs.iter().enumerate() {
            let row = inbox.get_delivery(CONSUMER, m.id).await.expect("get");
            if n == 1 {
                continue;
            }
            assert!(
                matches!(outcomes[n], Ok(ConsumeOutcome::Consumed)),
                "{n}: {outcomes:?}"
            );
            assert_eq!(
                row.map(|r| r.status),
                Some(InboxStatus::Consumed),
                "{n}: {outcomes:?}"
            );
            assert_eq!(
                effects_of(&pool, &schema, m.id).await,
                1,
                "{n}: {outcomes:?}"
            );
        }
    });
}

/// Found in review: a `SET LOCAL` survives its savepoint's release, so one
/// handler's `synchronous_commit = off` would decide whether the batch's COMMIT,
/// which all its deliveries are acknowledged after, waits for the WAL flush.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_handlers_synchronous_commit_does_not_reach_its_batch_mates() {
    with_db!(|pool, schema| {
        let (inbox, _h) = setup(&pool, &schema).await;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "CREATE TABLE {}.seen (message_id uuid, setting text)",
            schema.quoted()
        )))
        .execute(&pool)
        .await
        .expect("table");
        let default: String = sqlx::query_scalar("SELECT current_setting('synchronous_commit')")
            .fetch_one(&pool)
            .await
            .expect("setting");
        let msgs: Vec<Message> = (0..3).map(|_| message(Kind::Good)).collect();
        let leases: Vec<Lease> = msgs.iter().map(|_| lease()).collect();
        let first = msgs[0].id;
        let seen = format!(
            "INSERT INTO {}.seen VALUES ($1, current_setting('synchronous_commit'))",
            schema.quoted()
        );
        let outcomes = consume_with(&inbox, &msgs, &leases, &move |m: &Message| {
            let (seen, id, sets) = (seen.clone(), *m.id.as_uuid(), m.id == first);
            Box::new(move |conn: &mut sqlx::PgConnection| {
                Box::pin(async move {
                    let err = |e: sqlx::Error| e.to_string();
                    if sets {
                        sqlx::query("SET LOCAL synchronous_commit = off")
                            .execute(&mut *conn)
                            .await
                            .map_err(err)?;
                    }
                    sqlx::query(sqlx::AssertSqlSafe(seen))
                        .bind(id)
                        .execute(&mut *conn)
                        .await
                        .map_err(err)?;
                    Ok(())
                })
            })
        })
        .await;
        assert!(
            outcomes
                .iter()
                .all(|o| matches!(o, Ok(ConsumeOutcome::Consumed))),
            "{outcomes:?}"
        );
        for m in &msgs[1..] {
            let saw: String = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                "SELECT setting FROM {}.seen WHERE message_id = $1",
                schema.quoted()
            )))
            .bind(m.id.as_uuid())
            .fetch_one(&pool)
            .await
            .expect("seen");
            assert_eq!(
                saw, default,
                "a batch-mate's SET LOCAL reached this handler"
            );
        }
    });
}
