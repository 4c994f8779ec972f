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
    sqlx::query_scalar(&format!(
        "SELECT next_attempt_at IS NULL FROM {t} WHERE message_id = $1"
    ))
    .bind(id.as_uuid())
    .fetch_one(pool)
    .await
    .expect("read held row")
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
        sqlx::query(&format!(
            "UPDATE {t} SET next_attempt_at = now() WHERE message_id = $1"
        ))
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
        sqlx::query(&format!(
            "UPDATE {t} SET status = 'consumed', consumed_at = now(), next_attempt_at = NULL, \
             locked_by = NULL, locked_until = NULL WHERE message_id = $1"
        ))
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

/// A delivery arriving while its predecessor is being marked finished: the
/// arrival waits for the mark, and is then not held (its predecessor is done).
/// Had it been held, nothing would make it due: the mark's follow-up ran before
/// the held row existed.
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
        inbox.record_arrival(&c, &a, &lease()).await.expect("a");

        // The mark of a, open: its row is locked and still 'sent' to others.
        let mut marking = pool.begin().await.expect("begin");
        sqlx::query(&format!(
            "UPDATE {t} SET status = 'consumed', consumed_at = now(), next_attempt_at = NULL, \
             locked_by = NULL, locked_until = NULL WHERE message_id = $1"
        ))
        .bind(a.id.as_uuid())
        .execute(&mut *marking)
        .await
        .expect("mark a");
        let arriving = {
            let inbox = inbox.clone();
            let (c, b) = (c.clone(), b.clone());
            tokio::spawn(async move { inbox.hold_behind_key(&c, &b).await })
        };
        tokio::time::sleep(Duration::from_millis(500)).await;
        marking.commit().await.expect("commit mark");
        let held = arriving.await.expect("join").expect("hold");
        assert!(
            !held,
            "a finished before b could be held behind it: b is handled at once"
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
        sqlx::query(&format!(
            "INSERT INTO {t} (consumer, message_id, exchange, routing_key, headers, payload, \
               created_at, ordering_key, status, next_attempt_at) \
             SELECT $1, gen_random_uuid(), 'held', 'k', '{{}}'::jsonb, '\\x00'::bytea, now(), $2, 'sent', NULL \
             FROM generate_series(1, 50000)"
        ))
        .bind(&c)
        .bind(&key)
        .execute(&pool)
        .await
        .expect("fill held");
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
        sqlx::query(&format!("VACUUM ANALYZE {t}"))
            .execute(&pool)
            .await
            .expect("vacuum");

        let plan = inbox
            .explain_analyze_claim_due(&c, 1)
            .await
            .expect("explain");
        eprintln!("{plan}");
        let visited = common::rows_visited(&plan);
        assert!(
            visited < 100,
            "a claim of one due row visited {visited} rows with 50,000 held behind a key:\n{plan}"
        );
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
