//! Deliveries held behind an earlier one of their ordering key (consume side):
//! they stay out of the due range, so a claim never walks them; each is made due
//! when its predecessor finishes, and a safety net releases one whose
//! predecessor finished without doing so. A held row is never lost: it is either
//! made due or its arrival is not held at all.

mod common;

use std::time::Duration;

use outbox_adapters_postgres::PgInboxStore;
use outbox_core::{Decision, Message, MessageId};
use outbox_ports::Lease;
use outbox_ports::prelude::*;
use outbox_testkit::{message, unique_key};

fn keyed(key: &str) -> Message {
    let mut m = message("held", "k");
    m.ordering_key = Some(key.to_owned());
    m
}

fn lease() -> Lease {
    Lease::new(unique_key("worker"), Duration::from_secs(60))
}

async fn claim_one(inbox: &PgInboxStore, consumer: &str) -> Option<MessageId> {
    inbox
        .claim_due(consumer, &lease(), 1)
        .await
        .expect("claim")
        .pop()
        .map(|c| c.message.id)
}

async fn held_without_due_time(pool: &sqlx::PgPool, t: &str, id: MessageId) -> bool {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT next_attempt_at IS NULL FROM {t} WHERE message_id = $1"
    )))
    .bind(id.as_uuid())
    .fetch_one(pool)
    .await
    .expect("read held row")
}

/// `n` deliveries of `consumer` and `key` in table `t`, as `hold_behind_key`
/// writes them (checked by the tests that hold one), in one statement.
async fn fill_held(pool: &sqlx::PgPool, t: &str, consumer: &str, key: &str, n: i64) {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {t} (consumer, message_id, exchange, routing_key, headers, payload, \
           created_at, ordering_key, status, next_attempt_at) \
         SELECT $1, gen_random_uuid(), 'held', 'k', '{{}}'::jsonb, '\\x00'::bytea, now(), $2, 'received', NULL \
         FROM generate_series(1, $3)"
    )))
    .bind(consumer)
    .bind(key)
    .bind(n)
    .execute(pool)
    .await
    .expect("fill held rows");
}

/// Until some backend of this database waits on a lock in an INSERT (the held
/// arrival, at the test's gate).
async fn waiting_on_a_lock(pool: &sqlx::PgPool) {
    for _ in 0..500 {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND wait_event_type = 'Lock' AND query LIKE 'INSERT INTO%'",
        )
        .fetch_one(pool)
        .await
        .expect("pg_stat_activity");
        if waiting > 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the arrival never waited for the mark's lock");
}

fn ok_after(
    done: tokio::sync::oneshot::Receiver<()>,
) -> outbox_adapters_postgres::TxHandler<'static> {
    Box::new(move |_conn: &mut sqlx::PgConnection| {
        Box::pin(async move {
            let _ = done.await;
            Ok(())
        })
    })
}

/// The safety net is kept out of the way (it would release the rows itself), so
/// only the finishing marks can make the held rows due here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finishing_a_delivery_makes_the_next_of_its_key_due() {
    with_db!(|pool, schema| {
        let inbox = PgInboxStore::new(pool.clone(), &schema)
            .with_held_check_every(Duration::from_secs(3600));
        let t = format!("{}.outbox_inbox", schema.quoted());
        let c = unique_key("consumer");
        let key = unique_key("key");
        let (a, b, d, e) = (keyed(&key), keyed(&key), keyed(&key), keyed(&key));
        // The first claim runs the (empty) safety net; it is not run again.
        assert_eq!(claim_one(&inbox, &c).await, None);

        let worker = lease();
        inbox.record_arrival(&c, &a, &worker).await.expect("a");
        for m in [&b, &d, &e] {
            assert!(inbox.hold_behind_key(&c, m).await.expect("hold"));
            assert!(
                held_without_due_time(&pool, &t, m.id).await,
                "a held row is outside the due range"
            );
        }
        assert_eq!(claim_one(&inbox, &c).await, None, "a is being handled");

        // Consumed: b is due at once.
        assert!(
            inbox
                .mark_consumed(&c, a.id, &worker)
                .await
                .expect("a done")
        );
        let w = lease();
        let claimed = inbox.claim_due(&c, &w, 1).await.expect("claim b").pop();
        assert_eq!(claimed.map(|x| x.message.id), Some(b.id));
        assert_eq!(claim_one(&inbox, &c).await, None, "d waits behind b");

        // Failed with a retry: still unfinished, d still waits.
        let retry = Decision::RetryAfter(Duration::from_secs(3600));
        assert!(
            inbox
                .mark_consume_failed(&c, b.id, &w, "boom", retry)
                .await
                .expect("b failed")
        );
        assert_eq!(claim_one(&inbox, &c).await, None, "d waits behind failed b");
        assert!(held_without_due_time(&pool, &t, d.id).await);

        // Dead: no longer holds its key; d is due at once.
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE {t} SET next_attempt_at = now() WHERE message_id = $1"
        )))
        .bind(b.id.as_uuid())
        .execute(&pool)
        .await
        .expect("b due now");
        let w = lease();
        let again = inbox
            .claim_due(&c, &w, 1)
            .await
            .expect("claim b again")
            .pop();
        assert_eq!(again.map(|x| x.message.id), Some(b.id));
        assert!(
            inbox
                .mark_consume_failed(&c, b.id, &w, "poison", Decision::Dead)
                .await
                .expect("b dead")
        );
        let w = lease();
        let claimed = inbox.claim_due(&c, &w, 1).await.expect("claim d").pop();
        assert_eq!(claimed.map(|x| x.message.id), Some(d.id));
        assert!(inbox.mark_consumed(&c, d.id, &w).await.expect("d done"));
        assert_eq!(claim_one(&inbox, &c).await, Some(e.id), "then e");
    });
}

/// A held row whose predecessor finished without making it due (the process died
/// between the two statements) is released by the safety net.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_safety_net_releases_a_held_head() {
    with_db!(|pool, schema| {
        let t = format!("{}.outbox_inbox", schema.quoted());
        let c = unique_key("consumer");
        let key = unique_key("key");
        let (a, b, d) = (keyed(&key), keyed(&key), keyed(&key));
        let slow = PgInboxStore::new(pool.clone(), &schema)
            .with_held_check_every(Duration::from_secs(3600));
        assert_eq!(claim_one(&slow, &c).await, None, "the net ran once");
        let worker = lease();
        slow.record_arrival(&c, &a, &worker).await.expect("a");
        assert!(slow.hold_behind_key(&c, &b).await.expect("hold b"));
        assert!(slow.hold_behind_key(&c, &d).await.expect("hold d"));
        // a finishes behind the store's back: nothing makes b due.
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE {t} SET status = 'consumed', consumed_at = now(), next_attempt_at = NULL, \
             locked_by = NULL, locked_until = NULL WHERE message_id = $1"
        )))
        .bind(a.id.as_uuid())
        .execute(&pool)
        .await
        .expect("finish a");
        assert_eq!(
            claim_one(&slow, &c).await,
            None,
            "b is stranded until the net runs"
        );

        let net = PgInboxStore::new(pool.clone(), &schema).with_held_check_every(Duration::ZERO);
        let w = lease();
        let claimed = net.claim_due(&c, &w, 1).await.expect("claim").pop();
        assert_eq!(claimed.map(|x| x.message.id), Some(b.id), "released");
        assert!(
            held_without_due_time(&pool, &t, d.id).await,
            "only the key's head is released"
        );
        assert_eq!(claim_one(&net, &c).await, None, "d waits behind b");
    });
}

/// A delivery held while its predecessor's mark commits and makes the key's next
/// row due before the held row exists: the arrival's own check, a statement
/// after its insert, sees the predecessor finished and hands the delivery back
/// to be handled at once. Had it stayed held, nothing would make it due (the
/// mark's follow-up ran before the held row existed). A trigger of this test's
/// schema pauses the held insert after its snapshot was taken, on an advisory
/// lock the test holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_arrival_racing_its_predecessors_mark_is_not_stranded() {
    with_db!(|pool, schema| {
        let inbox = PgInboxStore::new(pool.clone(), &schema)
            .with_held_check_every(Duration::from_secs(3600));
        let t = format!("{}.outbox_inbox", schema.quoted());
        let c = unique_key("consumer");
        let key = unique_key("key");
        let (a, b) = (keyed(&key), keyed(&key));
        assert_eq!(claim_one(&inbox, &c).await, None);
        let worker = lease();
        inbox.record_arrival(&c, &a, &worker).await.expect("a");

        let gate: i64 = 0x6f75_7462_6f78 + i64::from(std::process::id());
        let pause = format!("{}.pause_held_insert", schema.quoted());
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "CREATE FUNCTION {pause}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
               PERFORM pg_advisory_lock({gate}); PERFORM pg_advisory_unlock({gate}); RETURN NEW; END $$"
        )))
        .execute(&pool)
        .await
        .expect("trigger function");
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "CREATE TRIGGER pause_held BEFORE INSERT ON {t} FOR EACH ROW \
             WHEN (NEW.next_attempt_at IS NULL) EXECUTE FUNCTION {pause}()"
        )))
        .execute(&pool)
        .await
        .expect("trigger");
        let mut gatekeeper = pool.acquire().await.expect("connection");
        sqlx::query("SELECT pg_advisory_lock($1)")
            .bind(gate)
            .execute(&mut *gatekeeper)
            .await
            .expect("close the gate");

        // b's insert has seen a unfinished, and waits at the gate.
        let arriving = {
            let (inbox, c, b) = (inbox.clone(), c.clone(), b.clone());
            tokio::spawn(async move { inbox.hold_behind_key(&c, &b).await })
        };
        waiting_on_a_lock(&pool).await;
        // a is consumed, and its follow-up finds no held row to make due.
        assert!(
            inbox
                .mark_consumed(&c, a.id, &worker)
                .await
                .expect("a done")
        );
        sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(gate)
            .execute(&mut *gatekeeper)
            .await
            .expect("open the gate");
        let held = arriving.await.expect("join").expect("hold");
        assert!(
            !held,
            "a finished before b's hold completed: b is handled at once, not left held"
        );
        assert_eq!(
            inbox.record_arrival(&c, &b, &lease()).await.expect("b"),
            outbox_ports::Arrival::New,
            "the recorded row is taken over, as it leads its key"
        );
    });
}

/// Rows held behind a failing head are never visited by a claim: with 50,000 of
/// them queued behind one key, a claim of the other keys' due rows reads about
/// what it takes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_does_not_walk_the_rows_held_behind_a_key() {
    with_db!(|pool, schema| {
        let inbox = PgInboxStore::new(pool.clone(), &schema);
        let t = format!("{}.outbox_inbox", schema.quoted());
        let c = unique_key("consumer");
        let key = unique_key("key");
        let head = keyed(&key);
        let worker = lease();
        inbox
            .record_arrival(&c, &head, &worker)
            .await
            .expect("head");
        assert!(
            inbox
                .mark_consume_failed(
                    &c,
                    head.id,
                    &worker,
                    "boom",
                    Decision::RetryAfter(Duration::from_secs(3600))
                )
                .await
                .expect("head failed")
        );
        // The shape hold_behind_key writes (checked by the tests above), in bulk.
        let one_held = keyed(&key);
        assert!(inbox.hold_behind_key(&c, &one_held).await.expect("hold"));
        assert!(held_without_due_time(&pool, &t, one_held.id).await);
        fill_held(&pool, &t, &c, &key, 50_000).await;
        // Ten deliveries of other keys and none, due now.
        for n in 0..10 {
            let m = if n % 2 == 0 {
                keyed(&unique_key("other"))
            } else {
                message("held", "k")
            };
            let l = lease();
            inbox.record_arrival(&c, &m, &l).await.expect("other");
            inbox
                .mark_consume_failed(&c, m.id, &l, "once", Decision::RetryAfter(Duration::ZERO))
                .await
                .expect("other failed");
        }
        sqlx::query(sqlx::AssertSqlSafe(format!("VACUUM ANALYZE {t}")))
            .execute(&pool)
            .await
            .expect("vacuum");

        // On both sides of the tie between the inbox_ordered probe and a walk of
        // the primary key (which reads all 50,001 rows of the held key).
        for (planner, p) in common::planners(&pool).await {
            let store = PgInboxStore::new(p, &schema);
            let plan = store
                .explain_analyze_claim_due(&c, 1)
                .await
                .expect("explain");
            eprintln!("{planner}:\n{plan}");
            let visited = common::rows_visited(&plan);
            assert!(
                visited < 100,
                "{planner}: a claim of one due row visited {visited} rows with 50,000 held behind a key:\n{plan}"
            );
        }
        let mut taken = 0;
        while claim_one(&inbox, &c).await.is_some() {
            taken += 1;
        }
        assert_eq!(
            taken, 10,
            "the other keys' deliveries, and none of the held"
        );
    });
}

/// The transactional path (PgConsumerWorker): a keyed delivery holds its key back
/// while its handler runs, seen by other workers; and a retry that succeeds makes
/// the next held delivery of its key due at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_transactional_path_holds_and_promotes() {
    with_db!(|pool, schema| {
        let inbox = PgInboxStore::new(pool.clone(), &schema)
            .with_held_check_every(Duration::from_secs(3600));
        let c = unique_key("consumer");
        let key = unique_key("key");
        let (a, b, d) = (keyed(&key), keyed(&key), keyed(&key));
        assert_eq!(claim_one(&inbox, &c).await, None);

        // a's handler runs (and waits) in its transaction.
        let (finish_a, a_done) = tokio::sync::oneshot::channel();
        let running = {
            let (inbox, c, a) = (inbox.clone(), c.clone(), a.clone());
            tokio::spawn(async move {
                inbox
                    .consume_in_transaction(
                        &c,
                        &a,
                        &lease(),
                        |_, _| Decision::RetryAfter(Duration::ZERO),
                        ok_after(a_done),
                    )
                    .await
            })
        };
        let mut seen = false;
        for _ in 0..500 {
            if inbox.get_delivery(&c, a.id).await.expect("get a").is_some() {
                seen = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(
            seen,
            "a keyed delivery is recorded before its handler's transaction commits"
        );
        assert!(
            inbox.hold_behind_key(&c, &b).await.expect("hold b"),
            "b is held behind a while a's handler runs"
        );
        assert!(inbox.hold_behind_key(&c, &d).await.expect("hold d"));
        finish_a.send(()).expect("a's handler");
        assert_eq!(
            running.await.expect("join").expect("consume a"),
            outbox_adapters_postgres::ConsumeOutcome::Consumed
        );

        // b is due (a's commit promoted it); its retry succeeds and promotes d.
        let w = lease();
        let due = inbox.claim_due(&c, &w, 1).await.expect("claim b").pop();
        let due = due.expect("b is due once a is consumed");
        assert_eq!(due.message.id, b.id);
        let (finish_b, b_done) = tokio::sync::oneshot::channel();
        finish_b.send(()).expect("b's handler");
        let outcome = inbox
            .retry_in_transaction(
                &c,
                &w,
                &due.message,
                due.attempts,
                |_, _| Decision::RetryAfter(Duration::ZERO),
                ok_after(b_done),
            )
            .await
            .expect("retry b");
        assert_eq!(outcome, outbox_adapters_postgres::ConsumeOutcome::Consumed);
        assert_eq!(claim_one(&inbox, &c).await, Some(d.id), "d is due at once");
    });
}

/// The safety net reads the keys that have held rows: with 20,000 keys each
/// with a delivery in progress and one key with held rows, it visits about that
/// one key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_safety_net_costs_the_keys_with_held_rows() {
    with_db!(|pool, schema| {
        let inbox = PgInboxStore::new(pool.clone(), &schema);
        let t = format!("{}.outbox_inbox", schema.quoted());
        let c = unique_key("consumer");
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {t} (consumer, message_id, exchange, routing_key, headers, payload, \
               created_at, ordering_key, status, next_attempt_at, locked_by, locked_until) \
             SELECT $1, gen_random_uuid(), 'held', 'k', '{{}}'::jsonb, '\\x00'::bytea, now(), \
               'busy' || i, 'received', now(), 'w', now() + interval '1 hour' \
             FROM generate_series(1, 20000) i"
        )))
        .bind(&c)
        .execute(&pool)
        .await
        .expect("fill in progress");
        let key = unique_key("key");
        let (a, b) = (keyed(&key), keyed(&key));
        let worker = lease();
        inbox.record_arrival(&c, &a, &worker).await.expect("a");
        assert!(inbox.hold_behind_key(&c, &b).await.expect("hold b"));
        sqlx::query(sqlx::AssertSqlSafe(format!("VACUUM ANALYZE {t}")))
            .execute(&pool)
            .await
            .expect("vacuum");
        for (planner, p) in common::planners(&pool).await {
            let store = PgInboxStore::new(p, &schema);
            let plan = store
                .explain_analyze_release_held(&c)
                .await
                .expect("explain");
            eprintln!("{planner}:\n{plan}");
            let visited = common::rows_visited(&plan);
            assert!(
                visited < 100,
                "{planner}: the safety net visited {visited} rows for one key with held rows:\n{plan}"
            );
        }
    });
}

/// A held row taken over by a redelivery (its predecessor finished, nobody made
/// it due yet) gets a next attempt time: should that attempt end unrecorded, the
/// sweep's claim finds it once the lease runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_row_taken_over_is_due_for_the_sweep() {
    with_db!(|pool, schema| {
        let inbox = PgInboxStore::new(pool.clone(), &schema)
            .with_held_check_every(Duration::from_secs(3600));
        let t = format!("{}.outbox_inbox", schema.quoted());
        let c = unique_key("consumer");
        let key = unique_key("key");
        let (a, b) = (keyed(&key), keyed(&key));
        // The first claim runs the safety net, which would release b itself.
        assert_eq!(claim_one(&inbox, &c).await, None);
        inbox.record_arrival(&c, &a, &lease()).await.expect("a");
        assert!(inbox.hold_behind_key(&c, &b).await.expect("hold b"));
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE {t} SET status = 'consumed', consumed_at = now(), next_attempt_at = NULL, \
             locked_by = NULL, locked_until = NULL WHERE message_id = $1"
        )))
        .bind(a.id.as_uuid())
        .execute(&pool)
        .await
        .expect("finish a behind the store's back");
        let short = Lease::new(unique_key("worker"), Duration::from_millis(200));
        assert_eq!(
            inbox.record_arrival(&c, &b, &short).await.expect("b again"),
            outbox_ports::Arrival::New,
            "a redelivery of b takes it over, as it leads its key"
        );
        assert!(!held_without_due_time(&pool, &t, b.id).await);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            claim_one(&inbox, &c).await,
            Some(b.id),
            "its worker vanished: the sweep claims it"
        );
    });
}

/// The transactional path records a keyed delivery before its handler runs; when
/// the attempt then fails without an answer from the database, the row's lease
/// is given up, so the next try takes it over at once instead of finding it
/// busy (and the key waiting) until the lease runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_attempt_lost_with_its_connection_gives_its_lease_up() {
    with_db!(|pool, schema| {
        let inbox = PgInboxStore::new(pool.clone(), &schema);
        let c = unique_key("consumer");
        let a = keyed(&unique_key("key"));
        let cut: outbox_adapters_postgres::TxHandler<'static> =
            Box::new(|conn: &mut sqlx::PgConnection| {
                Box::pin(async move {
                    sqlx::query("SELECT pg_terminate_backend(pg_backend_pid())")
                        .execute(&mut *conn)
                        .await
                        .map_err(|e| e.to_string())?;
                    Ok(())
                })
            });
        let attempt = inbox
            .consume_in_transaction(
                &c,
                &a,
                &lease(),
                |_, _| Decision::RetryAfter(Duration::ZERO),
                cut,
            )
            .await;
        assert!(attempt.is_err(), "the connection was cut: {attempt:?}");
        assert_eq!(
            inbox.record_arrival(&c, &a, &lease()).await.expect("again"),
            outbox_ports::Arrival::New,
            "the next try takes the recorded row over at once"
        );
    });
}

/// The held arrival's look for an unfinished predecessor is one probe of
/// inbox_ordered, even when the consumer and the key's value each match half the
/// table (another consumer's 50,000 deliveries of the key come first in seq
/// order): a look written as EXISTS loses its ORDER BY and LIMIT, and is planned
/// as a sequential scan expecting an early match.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_arrival_looks_for_its_predecessor_with_one_probe() {
    with_db!(|pool, schema| {
        let inbox = PgInboxStore::new(pool.clone(), &schema);
        let t = format!("{}.outbox_inbox", schema.quoted());
        let key = unique_key("key");
        let other = unique_key("other-consumer");
        fill_held(&pool, &t, &other, &key, 50_000).await;
        // This consumer's own backlog of the key, after them: its head and 50,000
        // held behind it, so the consumer and the key each match half the table.
        let c = unique_key("consumer");
        let head = keyed(&key);
        inbox
            .record_arrival(&c, &head, &lease())
            .await
            .expect("head");
        fill_held(&pool, &t, &c, &key, 50_000).await;
        sqlx::query(sqlx::AssertSqlSafe(format!("VACUUM ANALYZE {t}")))
            .execute(&pool)
            .await
            .expect("vacuum");

        let next = keyed(&key);
        for (planner, p) in common::planners(&pool).await {
            let store = PgInboxStore::new(p, &schema);
            let plan = store
                .explain_analyze_hold_behind_key(&c, &next)
                .await
                .expect("explain");
            eprintln!("{planner}:\n{plan}");
            let visited = common::rows_visited(&plan);
            assert!(
                visited < 100,
                "{planner}: a held arrival visited {visited} rows to find its predecessor:\n{plan}"
            );
        }
        assert!(
            inbox.hold_behind_key(&c, &next).await.expect("hold"),
            "held behind its unfinished head"
        );
        assert!(held_without_due_time(&pool, &t, next.id).await);
        assert!(
            !inbox
                .hold_behind_key(&unique_key("consumer"), &keyed(&key))
                .await
                .expect("no predecessor"),
            "another consumer's deliveries of the key hold nothing back"
        );
    });
}
