//! The inbox store contract.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::{Decision, InboxStatus, TransitionError};
use outbox_ports::{
    Arrival, DeadLetter, InboxOperator, InboxRetention, InboxStore, Lease, PortError,
};

use crate::{LONG_TTL, SHORT_TTL, message, unique_key};

/// What a case drives (the store, its retention) and checks (the operator's reads
/// of the same inbox): every adapter's inbox store is all three.
pub trait InboxSubject: InboxStore + InboxOperator + InboxRetention {}

impl<T: InboxStore + InboxOperator + InboxRetention + ?Sized> InboxSubject for T {}

fn lease() -> Lease {
    Lease::new(unique_key("worker"), LONG_TTL)
}

fn consumer() -> String {
    unique_key("consumer")
}

/// The first arrival is new; every later one is a duplicate, whatever its status.
pub async fn first_arrival_is_new_and_the_next_a_duplicate(inbox: Arc<dyn InboxSubject>) {
    let c = consumer();
    let m = message("contract", "k");
    let l = lease();
    assert_eq!(
        inbox.record_arrival(&c, &m, &l).await.expect("first"),
        Arrival::New
    );
    assert_eq!(
        inbox
            .record_arrival(&c, &m, &lease())
            .await
            .expect("while handled"),
        Arrival::Duplicate(InboxStatus::Received)
    );
    assert!(inbox.mark_consumed(&c, m.id, &l).await.expect("consumed"));
    assert_eq!(
        inbox
            .record_arrival(&c, &m, &lease())
            .await
            .expect("redelivery"),
        Arrival::Duplicate(InboxStatus::Consumed)
    );
    let rec = inbox
        .get_delivery(&c, m.id)
        .await
        .expect("get")
        .expect("row");
    assert_eq!(rec.status, InboxStatus::Consumed);
    assert_eq!(rec.consume.attempts, 1);
    assert!(rec.consume.completed_at.is_some());
    assert_eq!(rec.message, m);
    assert_eq!(inbox.stats(&c).await.expect("stats").consumed, 1);
}

/// A delivery the broker gave up on (its delivery limit) becomes a dead row with
/// the broker's reason, which can be reconsumed; one the inbox holds already is
/// left as it is.
pub async fn a_delivery_the_broker_gave_up_on_is_dead_unless_held_already(
    inbox: Arc<dyn InboxSubject>,
) {
    let c = consumer();
    let given_up = message("contract", "k");
    let reason = "x-death reason \"delivery_limit\", count 1";
    assert!(
        inbox
            .record_given_up(&c, &given_up, reason)
            .await
            .expect("new")
    );
    let rec = inbox
        .get_delivery(&c, given_up.id)
        .await
        .expect("get")
        .expect("row");
    assert_eq!(rec.status, InboxStatus::Dead);
    assert_eq!(rec.consume.last_error.as_deref(), Some(reason));
    assert_eq!(rec.consume.attempts, 0, "no handler ran");
    assert_eq!(rec.message, given_up);
    assert_eq!(inbox.stats(&c).await.expect("stats").dead, 1);
    assert!(
        !inbox
            .record_given_up(&c, &given_up, "again")
            .await
            .expect("twice"),
        "a second copy changes nothing"
    );
    assert!(
        inbox
            .claim_due(&c, &lease(), 10)
            .await
            .expect("claim")
            .is_empty(),
        "a dead row is not retried by itself"
    );
    inbox
        .reconsume_delivery(&c, given_up.id, false)
        .await
        .expect("reconsume");
    let claimed = inbox.claim_due(&c, &lease(), 10).await.expect("claim");
    assert_eq!(claimed.len(), 1, "reconsumed, it is handled again");

    let consumed = message("contract", "k");
    let l = lease();
    inbox
        .record_arrival(&c, &consumed, &l)
        .await
        .expect("arrival");
    assert!(
        inbox
            .mark_consumed(&c, consumed.id, &l)
            .await
            .expect("consumed")
    );
    assert!(
        !inbox
            .record_given_up(&c, &consumed, reason)
            .await
            .expect("consumed before")
    );
    let rec = inbox
        .get_delivery(&c, consumed.id)
        .await
        .expect("get")
        .expect("row");
    assert_eq!(
        rec.status,
        InboxStatus::Consumed,
        "the consumed row is left as it is"
    );
}

/// Two consumers of one message each get it once.
pub async fn consumers_are_isolated(inbox: Arc<dyn InboxSubject>) {
    let m = message("contract", "k");
    let (a, b) = (consumer(), consumer());
    assert_eq!(
        inbox.record_arrival(&a, &m, &lease()).await.expect("a"),
        Arrival::New
    );
    assert_eq!(
        inbox.record_arrival(&b, &m, &lease()).await.expect("b"),
        Arrival::New
    );
}

/// A failure is stored with its error and claimed by the sweep only when due.
pub async fn a_failed_delivery_is_claimed_when_due(inbox: Arc<dyn InboxSubject>) {
    let c = consumer();
    let m = message("contract", "k");
    let l = lease();
    inbox.record_arrival(&c, &m, &l).await.expect("arrive");
    let decision = Decision::RetryAfter(Duration::from_millis(400));
    assert!(
        inbox
            .mark_consume_failed(&c, m.id, &l, "handler blew up", decision)
            .await
            .expect("fail")
    );
    let rec = inbox
        .get_delivery(&c, m.id)
        .await
        .expect("get")
        .expect("row");
    assert_eq!(rec.status, InboxStatus::ConsumeFailed);
    assert_eq!(rec.consume.last_error.as_deref(), Some("handler blew up"));
    assert_eq!(
        inbox
            .record_arrival(&c, &m, &lease())
            .await
            .expect("redelivery"),
        Arrival::Duplicate(InboxStatus::ConsumeFailed),
        "a redelivery does not bypass the backoff"
    );
    assert!(
        inbox
            .claim_due(&c, &lease(), 10)
            .await
            .expect("early")
            .is_empty()
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    let sweep = lease();
    let due = inbox.claim_due(&c, &sweep, 10).await.expect("due");
    assert_eq!(due.len(), 1);
    assert_eq!(due[0].message, m);
    assert_eq!(due[0].attempts, 1);
    assert!(
        inbox
            .claim_due(&c, &lease(), 10)
            .await
            .expect("leased")
            .is_empty()
    );
    assert!(
        inbox
            .mark_consumed(&c, m.id, &sweep)
            .await
            .expect("consumed")
    );
    assert_eq!(
        inbox
            .get_delivery(&c, m.id)
            .await
            .expect("get")
            .expect("row")
            .consume
            .attempts,
        2
    );
}

/// After a `Dead` decision the delivery is listed as dead and never claimed.
pub async fn dead_after_the_last_failure(inbox: Arc<dyn InboxSubject>) {
    let c = consumer();
    let m = message("contract", "k");
    let l = lease();
    inbox.record_arrival(&c, &m, &l).await.expect("arrive");
    inbox
        .mark_consume_failed(&c, m.id, &l, "poison", Decision::Dead)
        .await
        .expect("dead");
    let dead = inbox
        .oldest_deliveries(&c, InboxStatus::Dead, 10)
        .await
        .expect("list");
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].consume.last_error.as_deref(), Some("poison"));
    assert!(
        inbox
            .claim_due(&c, &lease(), 10)
            .await
            .expect("claim")
            .is_empty()
    );
    assert_eq!(inbox.stats(&c).await.expect("stats").dead, 1);
}

/// A worker that recorded an arrival and vanished: the sweep, or the broker's
/// redelivery, takes the delivery over once the lease runs out.
pub async fn an_abandoned_arrival_is_claimed_after_its_lease(inbox: Arc<dyn InboxSubject>) {
    let c = consumer();
    let (m1, m2) = (message("contract", "k"), message("contract", "k"));
    let gone = Lease::new(unique_key("gone"), SHORT_TTL);
    inbox.record_arrival(&c, &m1, &gone).await.expect("arrive");
    inbox.record_arrival(&c, &m2, &gone).await.expect("arrive");
    assert!(
        inbox
            .claim_due(&c, &lease(), 10)
            .await
            .expect("live")
            .is_empty()
    );
    tokio::time::sleep(SHORT_TTL * 2).await;
    let sweep = lease();
    let due = inbox.claim_due(&c, &sweep, 1).await.expect("claim");
    assert_eq!(due.len(), 1);
    assert_eq!(due[0].message.id, m1.id);
    assert_eq!(
        inbox
            .record_arrival(&c, &m2, &lease())
            .await
            .expect("redelivery"),
        Arrival::New,
        "a redelivery may take over an abandoned arrival"
    );
    assert!(
        !inbox.mark_consumed(&c, m1.id, &gone).await.expect("late"),
        "fenced"
    );
    assert!(inbox.mark_consumed(&c, m1.id, &sweep).await.expect("sweep"));
}

/// Marks by anyone but the holder change nothing.
pub async fn marks_are_fenced_by_the_lease_holder(inbox: Arc<dyn InboxSubject>) {
    let c = consumer();
    let m = message("contract", "k");
    let l = lease();
    inbox.record_arrival(&c, &m, &l).await.expect("arrive");
    let other = lease();
    assert!(!inbox.mark_consumed(&c, m.id, &other).await.expect("other"));
    assert!(
        !inbox
            .mark_consume_failed(&c, m.id, &other, "x", Decision::Dead)
            .await
            .expect("other")
    );
    assert_eq!(
        inbox
            .get_delivery(&c, m.id)
            .await
            .expect("get")
            .expect("row")
            .status,
        InboxStatus::Received
    );
}

/// Reconsume brings a consumed delivery back for the sweep; unknown ids are an
/// error.
pub async fn reconsume_brings_a_consumed_delivery_back(inbox: Arc<dyn InboxSubject>) {
    let c = consumer();
    let m = message("contract", "k");
    let l = lease();
    inbox.record_arrival(&c, &m, &l).await.expect("arrive");
    inbox.mark_consumed(&c, m.id, &l).await.expect("consumed");
    inbox
        .reconsume_delivery(&c, m.id, true)
        .await
        .expect("reconsume");
    let due = inbox.claim_due(&c, &lease(), 10).await.expect("claim");
    assert_eq!(due.len(), 1);
    assert_eq!(due[0].attempts, 0, "fresh budget");
    let unknown = message("contract", "k").id;
    assert!(matches!(
        inbox.reconsume_delivery(&c, unknown, false).await,
        Err(PortError::NotFound { .. })
    ));
}

/// A single reconsume changes a delivery only from the status the operator acted
/// on: a consumed one only with `again`, and never one a worker or a retry holds
/// (its live lease), so a retry that consumes it meanwhile is not run twice.
pub async fn reconsume_takes_only_the_status_acted_on(inbox: Arc<dyn InboxSubject>) {
    let c = consumer();
    let m = message("contract", "k");
    let worker = lease();
    inbox.record_arrival(&c, &m, &worker).await.expect("arrive");
    let err = inbox
        .reconsume_delivery(&c, m.id, true)
        .await
        .expect_err("in progress");
    assert!(matches!(err, PortError::IllegalTransition(_)), "{err}");
    inbox
        .mark_consume_failed(
            &c,
            m.id,
            &worker,
            "boom",
            Decision::RetryAfter(Duration::ZERO),
        )
        .await
        .expect("failed");
    // The consume sweep claims the failed delivery: its retry holds it.
    let sweep = lease();
    let due = inbox.claim_due(&c, &sweep, 10).await.expect("claim");
    assert_eq!(due.len(), 1);
    for again in [false, true] {
        let err = inbox
            .reconsume_delivery(&c, m.id, again)
            .await
            .expect_err("held by the retry");
        assert!(
            matches!(err, PortError::Busy { .. }),
            "again={again}: {err}"
        );
    }
    assert!(inbox.mark_consumed(&c, m.id, &sweep).await.expect("retry"));
    // The operator acted on a failed delivery; it is consumed now.
    let err = inbox
        .reconsume_delivery(&c, m.id, false)
        .await
        .expect_err("consumed meanwhile");
    assert!(
        matches!(
            err,
            PortError::IllegalTransition(TransitionError::Inbox {
                from: InboxStatus::Consumed,
                ..
            })
        ),
        "{err}"
    );
    assert!(
        inbox
            .claim_due(&c, &lease(), 10)
            .await
            .expect("claim")
            .is_empty(),
        "nothing to run again"
    );
    // Asked for explicitly, a consumed delivery runs once more.
    inbox
        .reconsume_delivery(&c, m.id, true)
        .await
        .expect("again");
    assert_eq!(
        inbox
            .claim_due(&c, &lease(), 10)
            .await
            .expect("claim")
            .len(),
        1
    );
}

/// Undecodable deliveries are kept with their body and reason.
pub async fn dead_letters_are_kept(inbox: Arc<dyn InboxSubject>) {
    let c = consumer();
    let letter = DeadLetter {
        message_id: None,
        routing_key: "k".into(),
        headers: [("h".to_owned(), "v".to_owned())].into(),
        body: b"\xff\xfe not a message".to_vec(),
        reason: "delivery has no message id".into(),
    };
    inbox.record_dead_letter(&c, letter).await.expect("keep");
    assert_eq!(inbox.stats(&c).await.expect("stats").dead_letters, 1);
}

fn keyed(key: &str) -> outbox_core::Message {
    let mut m = message("contract", "k");
    m.ordering_key = Some(key.to_owned());
    m
}

fn ids(claimed: &[outbox_ports::ClaimedDelivery]) -> Vec<outbox_core::MessageId> {
    claimed.iter().map(|c| c.message.id).collect()
}

/// A consumer that keeps order by key: a delivery arriving while an earlier one of
/// its key is unfinished is held (recorded, not handed out); the sweep hands the
/// key's deliveries out one after another, in arrival order; other keys, other
/// consumers and messages without a key are not held.
pub async fn keyed_deliveries_wait_behind_an_unfinished_one(inbox: Arc<dyn InboxSubject>) {
    let c = consumer();
    let key = unique_key("key");
    let (a, b, d) = (keyed(&key), keyed(&key), keyed(&key));
    let other = keyed(&unique_key("other"));
    let worker = lease();
    assert!(
        !inbox.hold_behind_key(&c, &a).await.expect("first"),
        "nothing earlier: not held"
    );
    assert!(
        inbox.get_delivery(&c, a.id).await.expect("get").is_none(),
        "not held, not recorded"
    );
    assert_eq!(
        inbox.record_arrival(&c, &a, &worker).await.expect("a"),
        Arrival::New
    );
    assert!(
        inbox.hold_behind_key(&c, &b).await.expect("b"),
        "a is being handled"
    );
    assert!(inbox.hold_behind_key(&c, &d).await.expect("d"));
    assert!(
        !inbox.hold_behind_key(&c, &other).await.expect("other key"),
        "another key is not held"
    );
    assert!(
        !inbox
            .hold_behind_key(&consumer(), &keyed(&key))
            .await
            .expect("other consumer"),
        "another consumer is not held"
    );
    assert!(
        !inbox
            .hold_behind_key(&c, &message("contract", "k"))
            .await
            .expect("no key"),
        "a message without a key is not held"
    );
    assert!(
        !inbox.hold_behind_key(&c, &b).await.expect("again"),
        "a redelivery of a held one is left to record_arrival"
    );
    let held = inbox
        .get_delivery(&c, b.id)
        .await
        .expect("get")
        .expect("held row");
    assert_eq!(held.status, InboxStatus::Received);
    assert_eq!(held.message.ordering_key.as_deref(), Some(key.as_str()));
    assert_eq!(
        held.consume.next_attempt_at, None,
        "a held delivery has no due time of its own: it waits for its key, not a clock"
    );
    assert!(
        inbox
            .claim_due(&c, &lease(), 10)
            .await
            .expect("claim")
            .is_empty(),
        "b and d wait while a is handled"
    );
    assert_eq!(
        inbox
            .record_arrival(&c, &b, &lease())
            .await
            .expect("redelivered b"),
        Arrival::Duplicate(InboxStatus::Received),
        "a redelivery of a held one is not taken over while a is unfinished"
    );
    // a fails: its retry comes first; b and d still wait, also once a is due.
    let decision = Decision::RetryAfter(Duration::from_millis(200));
    assert!(
        inbox
            .mark_consume_failed(&c, a.id, &worker, "boom", decision)
            .await
            .expect("fail a")
    );
    assert!(
        inbox
            .claim_due(&c, &lease(), 10)
            .await
            .expect("claim")
            .is_empty(),
        "a is not due yet and b and d wait behind it"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let sweep = lease();
    let due = inbox.claim_due(&c, &sweep, 10).await.expect("claim a");
    assert_eq!(ids(&due), vec![a.id], "only the head of the key");
    assert!(inbox.mark_consumed(&c, a.id, &sweep).await.expect("a done"));
    let sweep = lease();
    let due = inbox.claim_due(&c, &sweep, 10).await.expect("claim b");
    assert_eq!(ids(&due), vec![b.id], "then b, alone");
    assert_eq!(due[0].message.ordering_key.as_deref(), Some(key.as_str()));
    assert!(inbox.mark_consumed(&c, b.id, &sweep).await.expect("b done"));
    assert_eq!(
        inbox
            .record_arrival(&c, &d, &lease())
            .await
            .expect("redelivered d"),
        Arrival::New,
        "the head of its key may be taken over by a redelivery"
    );
}

/// A dead delivery does not hold its key back.
pub async fn a_dead_delivery_does_not_hold_its_key(inbox: Arc<dyn InboxSubject>) {
    let c = consumer();
    let key = unique_key("key");
    let (a, b) = (keyed(&key), keyed(&key));
    let worker = lease();
    inbox.record_arrival(&c, &a, &worker).await.expect("a");
    assert!(inbox.hold_behind_key(&c, &b).await.expect("b held"));
    assert!(
        inbox
            .mark_consume_failed(&c, a.id, &worker, "poison", Decision::Dead)
            .await
            .expect("dead")
    );
    let due = inbox.claim_due(&c, &lease(), 10).await.expect("claim");
    assert_eq!(ids(&due), vec![b.id]);
    assert!(
        inbox
            .hold_behind_key(&c, &keyed(&key))
            .await
            .expect("later"),
        "b is claimed by the sweep, unfinished: a later one is held behind it"
    );
}

/// Retention deletes one consumer's deliveries consumed longer ago than the age,
/// oldest first, a batch at a time; never a younger one, one in another status,
/// or another consumer's.
pub async fn retention_deletes_only_old_consumed_deliveries(inbox: Arc<dyn InboxSubject>) {
    let (c, other) = (consumer(), consumer());
    let l = lease();
    let ms: Vec<_> = (0..5).map(|_| message("contract", "k")).collect();
    for m in &ms {
        inbox.record_arrival(&c, m, &l).await.expect("arrive");
    }
    let theirs = message("contract", "k");
    inbox
        .record_arrival(&other, &theirs, &l)
        .await
        .expect("arrive");
    inbox
        .mark_consumed(&c, ms[0].id, &l)
        .await
        .expect("consumed");
    inbox
        .mark_consumed(&c, ms[1].id, &l)
        .await
        .expect("consumed");
    inbox
        .mark_consumed(&other, theirs.id, &l)
        .await
        .expect("consumed");
    inbox
        .mark_consume_failed(&c, ms[2].id, &l, "e", Decision::Dead)
        .await
        .expect("dead");
    inbox
        .mark_consume_failed(
            &c,
            ms[3].id,
            &l,
            "e",
            Decision::RetryAfter(Duration::from_secs(60)),
        )
        .await
        .expect("failed");
    tokio::time::sleep(Duration::from_millis(700)).await;
    // Consumed just now: younger than the age (ms[4] stays received).
    let young = message("contract", "k");
    inbox.record_arrival(&c, &young, &l).await.expect("arrive");
    inbox
        .mark_consumed(&c, young.id, &l)
        .await
        .expect("consumed");
    let age = Duration::from_millis(500);
    assert_eq!(
        inbox
            .delete_consumed_batch(&c, age, 1)
            .await
            .expect("batch"),
        1
    );
    assert!(
        inbox
            .get_delivery(&c, ms[0].id)
            .await
            .expect("get")
            .is_none(),
        "the oldest goes first"
    );
    assert_eq!(
        inbox
            .delete_consumed_batch(&c, age, 10)
            .await
            .expect("batch"),
        1
    );
    assert_eq!(
        inbox
            .delete_consumed_batch(&c, age, 10)
            .await
            .expect("batch"),
        0
    );
    for (consumer, id, status) in [
        (&c, ms[2].id, InboxStatus::Dead),
        (&c, ms[3].id, InboxStatus::ConsumeFailed),
        (&c, ms[4].id, InboxStatus::Received),
        (&c, young.id, InboxStatus::Consumed),
        (&other, theirs.id, InboxStatus::Consumed),
    ] {
        assert_eq!(
            inbox
                .get_delivery(consumer, id)
                .await
                .expect("get")
                .map(|r| r.status),
            Some(status),
            "retention removed a {status} delivery"
        );
    }
}
