//! The outbox store contract.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use outbox_core::{Decision, MessageId, OutboxStatus, TransitionError};
use outbox_ports::{Lease, OutboxOperator, OutboxStore, PortError, PublishFailure};

use crate::{LONG_TTL, SHORT_TTL, message, messages};

/// What a case drives (the store) and checks (the operator's reads of the same
/// outbox): every adapter's outbox store is both.
pub trait OutboxSubject: OutboxStore + OutboxOperator {}

impl<T: OutboxStore + OutboxOperator + ?Sized> OutboxSubject for T {}

fn lease(name: &str) -> Lease {
    Lease::new(format!("{name}-{}", crate::unique_key("lease")), LONG_TTL)
}

fn ids(claimed: &[outbox_ports::ClaimedMessage]) -> Vec<MessageId> {
    claimed.iter().map(|c| c.message.id).collect()
}

/// Claims come in enqueue order, carry the message intact, and never repeat.
pub async fn claims_pending_in_enqueue_order(store: Arc<dyn OutboxSubject>) {
    let msgs = messages(5);
    let expected: Vec<_> = msgs.iter().map(|m| m.id).collect();
    store.enqueue(msgs.clone()).await.expect("enqueue");
    let l = lease("a");
    let first = store.claim_pending(&l, 3).await.expect("claim");
    assert_eq!(ids(&first), expected[..3]);
    assert_eq!(first[0].message, msgs[0], "message stored intact");
    assert!(first.iter().all(|c| c.attempts == 0));
    let rest = store.claim_pending(&l, 10).await.expect("claim");
    assert_eq!(ids(&rest), expected[3..]);
    assert!(store.claim_pending(&l, 10).await.expect("claim").is_empty());
}

/// A delayed message stays pending (counted as scheduled, not as waiting) and is
/// not claimed before its due time; then it is claimed like any other. One whose
/// due time has passed already is claimed at once.
pub async fn a_delayed_message_is_claimed_only_once_due(store: Arc<dyn OutboxSubject>) {
    let before = store.stats().await.expect("stats");
    let now = time::OffsetDateTime::now_utc();
    let due = now + time::Duration::milliseconds(1500);
    let mut later = message("contract", "later");
    later.not_before = Some(due.replace_nanosecond(0).unwrap_or(due));
    let mut past = message("contract", "past");
    let long_ago = now - time::Duration::seconds(60);
    past.not_before = Some(long_ago.replace_nanosecond(0).unwrap_or(long_ago));
    let at_once = message("contract", "now");
    store
        .enqueue(vec![later.clone(), past.clone(), at_once.clone()])
        .await
        .expect("enqueue");
    let stats = store.stats().await.expect("stats");
    assert_eq!(stats.pending - before.pending, 3);
    assert_eq!(
        stats.scheduled - before.scheduled,
        2,
        "delayed ones are scheduled"
    );
    assert_time_left(
        &*store,
        &later,
        "the earliest due time still to come (the overdue one is the claim's)",
    )
    .await;
    let l = lease("delayed");
    let first = store.claim_pending(&l, 10).await.expect("claim");
    let mut got = ids(&first);
    got.sort();
    let mut want = vec![past.id, at_once.id];
    want.sort();
    assert_eq!(
        got, want,
        "the overdue and the immediate one, not the delayed one"
    );
    let claimed_past = first
        .iter()
        .find(|c| c.message.id == past.id)
        .expect("past");
    assert_eq!(
        claimed_past.message.not_before, past.not_before,
        "stored intact"
    );
    assert_time_left(&*store, &later, "after the claim").await;
    tokio::time::sleep(Duration::from_millis(1700)).await;
    let second = store.claim_pending(&l, 10).await.expect("claim");
    assert_eq!(ids(&second), vec![later.id], "due now");
    assert_eq!(second[0].message, later);
    assert!(store.claim_pending(&l, 10).await.expect("claim").is_empty());
}

/// The store's time left until `later` falls due matches its due time (the
/// store's clock is this machine's here), to well within the margin a relay adds.
async fn assert_time_left(store: &dyn OutboxStore, later: &outbox_core::Message, why: &str) {
    let left = store
        .next_due_in()
        .await
        .expect("next due")
        .unwrap_or_else(|| panic!("{why}: a due time to come"));
    let due = later.not_before.expect("delayed");
    let expected =
        Duration::try_from(due - time::OffsetDateTime::now_utc()).unwrap_or(Duration::ZERO);
    assert!(
        left.abs_diff(expected) < Duration::from_millis(250),
        "{why}: {left:?} left, {expected:?} by this clock"
    );
}

/// A row under a live lease is invisible to other claimers.
pub async fn a_leased_row_is_not_claimed_twice(store: Arc<dyn OutboxSubject>) {
    store.enqueue(messages(3)).await.expect("enqueue");
    assert_eq!(
        store.claim_pending(&lease("a"), 10).await.expect("a").len(),
        3
    );
    assert!(
        store
            .claim_pending(&lease("b"), 10)
            .await
            .expect("b")
            .is_empty()
    );
    assert!(
        store
            .claim_due_retries(&lease("b"), 10)
            .await
            .expect("b")
            .is_empty()
    );
}

/// Only the holder's marks apply; a mark records the attempt and the sent time.
pub async fn marks_are_fenced_by_the_lease_holder(store: Arc<dyn OutboxSubject>) {
    let m = message("contract", "k");
    store.enqueue(vec![m.clone()]).await.expect("enqueue");
    let holder = lease("holder");
    store.claim_pending(&holder, 1).await.expect("claim");
    let other = lease("other");
    assert_eq!(store.mark_sent(&other, &[m.id]).await.expect("mark"), 0);
    let failure = PublishFailure {
        id: m.id,
        error: "x".into(),
        decision: Decision::Dead,
    };
    assert_eq!(
        store
            .mark_publish_failed(&other, &[failure])
            .await
            .expect("mark"),
        0
    );
    assert_eq!(
        store
            .get_message(m.id)
            .await
            .expect("get")
            .expect("row")
            .status,
        OutboxStatus::Pending
    );
    assert_eq!(store.mark_sent(&holder, &[m.id]).await.expect("mark"), 1);
    let rec = store.get_message(m.id).await.expect("get").expect("row");
    assert_eq!(rec.status, OutboxStatus::Sent);
    assert_eq!(rec.publish.attempts, 1);
    assert!(rec.publish.completed_at.is_some());
    // Marked rows are no longer held: a second mark changes nothing.
    assert_eq!(store.mark_sent(&holder, &[m.id]).await.expect("mark"), 0);
    assert!(
        store
            .claim_pending(&other, 10)
            .await
            .expect("claim")
            .is_empty()
    );
}

/// A failed publish is stored with its error and comes back only when due.
pub async fn a_failed_publish_waits_for_its_backoff(store: Arc<dyn OutboxSubject>) {
    let m = message("contract", "k");
    store.enqueue(vec![m.clone()]).await.expect("enqueue");
    let l = lease("a");
    store.claim_pending(&l, 1).await.expect("claim");
    let failure = PublishFailure {
        id: m.id,
        error: "broker said no".into(),
        decision: Decision::RetryAfter(Duration::from_millis(400)),
    };
    assert_eq!(
        store
            .mark_publish_failed(&l, &[failure])
            .await
            .expect("mark"),
        1
    );
    let rec = store.get_message(m.id).await.expect("get").expect("row");
    assert_eq!(rec.status, OutboxStatus::PublishFailed);
    assert_eq!(rec.publish.attempts, 1);
    assert_eq!(rec.publish.last_error.as_deref(), Some("broker said no"));
    assert!(rec.publish.next_attempt_at.is_some());
    assert!(
        store
            .claim_due_retries(&lease("b"), 10)
            .await
            .expect("early")
            .is_empty()
    );
    assert!(
        store
            .claim_pending(&lease("b"), 10)
            .await
            .expect("pending")
            .is_empty()
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    let due = store.claim_due_retries(&lease("b"), 10).await.expect("due");
    assert_eq!(ids(&due), [m.id]);
    assert_eq!(due[0].attempts, 1);
}

/// `Dead` is listed, and requeue makes it pending with a fresh budget; other
/// statuses and unknown ids are refused.
pub async fn dead_messages_can_be_requeued(store: Arc<dyn OutboxSubject>) {
    let m = message("contract", "k");
    store.enqueue(vec![m.clone()]).await.expect("enqueue");
    let l = lease("a");
    store.claim_pending(&l, 1).await.expect("claim");
    let failure = PublishFailure {
        id: m.id,
        error: "poison".into(),
        decision: Decision::Dead,
    };
    store
        .mark_publish_failed(&l, &[failure])
        .await
        .expect("mark");
    let dead = store
        .oldest_messages(OutboxStatus::Dead, 10)
        .await
        .expect("list");
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].message.id, m.id);
    assert_eq!(dead[0].publish.last_error.as_deref(), Some("poison"));
    let fresh = message("contract", "fresh");
    store.enqueue(vec![fresh.clone()]).await.expect("enqueue");
    store.requeue_message(m.id).await.expect("requeue");
    let again = store.claim_pending(&lease("b"), 10).await.expect("claim");
    assert_eq!(ids(&again), [m.id, fresh.id]);
    assert_eq!(again[0].attempts, 0);
    assert!(again[0].requeued, "a claim says it was requeued");
    assert!(!again[1].requeued, "a first publish is not a requeue");
    let err = store
        .requeue_message(m.id)
        .await
        .expect_err("pending cannot be requeued");
    assert!(matches!(err, PortError::IllegalTransition(_)), "{err}");
    let unknown = message("contract", "k").id;
    let err = store.requeue_message(unknown).await.expect_err("unknown");
    assert!(matches!(err, PortError::NotFound { .. }), "{err}");
}

/// A requeue never takes a message a relay holds (its live lease: it may be on its
/// way to the broker), nor one that was sent meanwhile.
pub async fn requeue_refuses_a_message_a_relay_holds(store: Arc<dyn OutboxSubject>) {
    let m = message("contract", "k");
    store.enqueue(vec![m.clone()]).await.expect("enqueue");
    let first = lease("a");
    store.claim_pending(&first, 1).await.expect("claim");
    let failure = PublishFailure {
        id: m.id,
        error: "nack".into(),
        decision: Decision::RetryAfter(Duration::ZERO),
    };
    store
        .mark_publish_failed(&first, &[failure])
        .await
        .expect("mark");
    // The retry claims it: publish_failed, under a live lease.
    let retry = lease("b");
    assert_eq!(
        ids(&store
            .claim_due_retries(&retry, 10)
            .await
            .expect("retry claim")),
        [m.id]
    );
    let err = store
        .requeue_message(m.id)
        .await
        .expect_err("held by the relay");
    assert!(matches!(err, PortError::Busy { .. }), "{err}");
    assert_eq!(store.mark_sent(&retry, &[m.id]).await.expect("sent"), 1);
    let err = store
        .requeue_message(m.id)
        .await
        .expect_err("sent meanwhile");
    assert!(
        matches!(
            err,
            PortError::IllegalTransition(TransitionError::Outbox {
                from: OutboxStatus::Sent,
                ..
            })
        ),
        "{err}"
    );
    assert!(
        store
            .claim_pending(&lease("c"), 10)
            .await
            .expect("claim")
            .is_empty(),
        "a sent message is not published again"
    );
}

/// Rows of a claimer that vanished come back after its lease; its late marks are
/// fenced off.
pub async fn an_expired_lease_brings_rows_back(store: Arc<dyn OutboxSubject>) {
    store.enqueue(messages(2)).await.expect("enqueue");
    let gone = Lease::new(crate::unique_key("gone"), SHORT_TTL);
    let taken = store.claim_pending(&gone, 10).await.expect("claim");
    assert_eq!(taken.len(), 2);
    tokio::time::sleep(SHORT_TTL * 2).await;
    let next = lease("next");
    let again = store.claim_pending(&next, 1).await.expect("reclaim");
    assert_eq!(ids(&again), ids(&taken)[..1]);
    assert_eq!(
        store
            .mark_sent(&gone, &ids(&taken))
            .await
            .expect("late mark"),
        1,
        "the row nobody reclaimed may still be marked by its holder"
    );
    assert_eq!(
        store
            .get_message(again[0].message.id)
            .await
            .expect("get")
            .expect("row")
            .status,
        OutboxStatus::Pending,
        "the reclaimed row is not marked by the old holder"
    );
    let stale = Lease::new(crate::unique_key("stale"), SHORT_TTL);
    store.enqueue(messages(1)).await.expect("enqueue");
    assert_eq!(
        store.claim_pending(&stale, 10).await.expect("claim").len(),
        1
    );
    tokio::time::sleep(SHORT_TTL * 2).await;
    assert!(store.recover_expired_leases().await.expect("recover") >= 1);
}

/// Released rows are claimable again and no attempt is counted.
pub async fn release_returns_rows_unchanged(store: Arc<dyn OutboxSubject>) {
    let msgs = messages(2);
    store.enqueue(msgs.clone()).await.expect("enqueue");
    let l = lease("a");
    let taken = store.claim_pending(&l, 10).await.expect("claim");
    assert_eq!(
        store
            .release(&lease("other"), &ids(&taken))
            .await
            .expect("release"),
        0
    );
    assert_eq!(store.release(&l, &ids(&taken)).await.expect("release"), 2);
    let again = store.claim_pending(&lease("b"), 10).await.expect("claim");
    assert_eq!(ids(&again), ids(&taken));
    assert!(again.iter().all(|c| c.attempts == 0));
}

/// Stats count each unsent status and the oldest unsent message.
pub async fn stats_count_by_status(store: Arc<dyn OutboxSubject>) {
    let msgs = messages(4);
    store.enqueue(msgs.clone()).await.expect("enqueue");
    let l = lease("a");
    store.claim_pending(&l, 3).await.expect("claim");
    store.mark_sent(&l, &[msgs[0].id]).await.expect("sent");
    let fail = |id, decision| PublishFailure {
        id,
        error: "e".into(),
        decision,
    };
    store
        .mark_publish_failed(
            &l,
            &[
                fail(msgs[1].id, Decision::RetryAfter(Duration::from_secs(60))),
                fail(msgs[2].id, Decision::Dead),
            ],
        )
        .await
        .expect("failed");
    let s = store.stats().await.expect("stats");
    assert_eq!((s.pending, s.publish_failed, s.dead), (1, 1, 1));
    let sent = store
        .oldest_messages(OutboxStatus::Sent, 10)
        .await
        .expect("list");
    assert_eq!(sent.len(), 1);
    let oldest = s.oldest_unsent_at.expect("oldest");
    assert!(oldest <= msgs[3].created_at);
}

/// A batch with one message over the limits stores none of them.
pub async fn an_invalid_message_stores_nothing(store: Arc<dyn OutboxSubject>) {
    let good = message("contract", "k");
    let mut huge = message("contract", "k");
    huge.payload = vec![b'x'; 2 << 20];
    let err = store
        .enqueue(vec![good.clone(), huge])
        .await
        .expect_err("oversized payload");
    assert!(matches!(err, PortError::InvalidMessage(_)), "{err}");
    assert!(store.get_message(good.id).await.expect("get").is_none());
    let mut long = message("contract", "k");
    long.routing_key = "k".repeat(300);
    assert!(matches!(
        store.enqueue(vec![long]).await,
        Err(PortError::InvalidMessage(_))
    ));
    assert_eq!(store.stats().await.expect("stats").pending, 0);
}

/// Only a dead message may be deleted, and the guard is the delete itself: a
/// pending, failed or sent message stays (an operator's `delete` racing a `requeue`
/// must not remove a message that is about to be published). Unknown ids are an
/// error.
pub async fn only_dead_messages_are_deleted(store: Arc<dyn OutboxSubject>) {
    let msgs = messages(4);
    store.enqueue(msgs.clone()).await.expect("enqueue");
    let (pending, sent, failed, dead) = (msgs[0].id, msgs[1].id, msgs[2].id, msgs[3].id);
    let l = lease("a");
    store.claim_pending(&l, 3).await.expect("claim");
    // msgs[0] is claimed but stays pending, so a leased row is covered too.
    store.mark_sent(&l, &[sent]).await.expect("sent");
    let fail = |id, decision| PublishFailure {
        id,
        error: "e".into(),
        decision,
    };
    store
        .mark_publish_failed(
            &l,
            &[fail(failed, Decision::RetryAfter(Duration::from_secs(60)))],
        )
        .await
        .expect("failed");
    store.claim_pending(&l, 1).await.expect("claim");
    store
        .mark_publish_failed(&l, &[fail(dead, Decision::Dead)])
        .await
        .expect("dead");
    for (id, status) in [
        (pending, OutboxStatus::Pending),
        (sent, OutboxStatus::Sent),
        (failed, OutboxStatus::PublishFailed),
    ] {
        let err = store
            .delete_message(id, false)
            .await
            .expect_err("not dead: refused");
        assert!(
            matches!(err, PortError::NotDeletable(ref e) if e.status == status),
            "{status}: {err}"
        );
        assert_eq!(
            store.get_message(id).await.expect("get").map(|r| r.status),
            Some(status),
            "a {status} message was deleted"
        );
    }
    store
        .delete_message(dead, false)
        .await
        .expect("delete dead");
    assert!(store.get_message(dead).await.expect("get").is_none());
    assert!(matches!(
        store.delete_message(dead, false).await,
        Err(PortError::NotFound { .. })
    ));
    // Requeued, a dead message is pending again and no longer deletable.
    let m = message("contract", "k");
    store.enqueue(vec![m.clone()]).await.expect("enqueue");
    store.claim_pending(&l, 1).await.expect("claim");
    store
        .mark_publish_failed(&l, &[fail(m.id, Decision::Dead)])
        .await
        .expect("dead");
    store.requeue_message(m.id).await.expect("requeue");
    assert!(matches!(
        store.delete_message(m.id, false).await,
        Err(PortError::NotDeletable(_))
    ));
    assert_eq!(
        store
            .get_message(m.id)
            .await
            .expect("get")
            .map(|r| r.status),
        Some(OutboxStatus::Pending)
    );
}

/// Retention deletes only `Sent` messages older than the age, oldest first, at most
/// `limit` per call; pending, failed, dead and recently sent messages stay.
pub async fn retention_deletes_only_old_sent_messages(store: Arc<dyn OutboxSubject>) {
    let msgs = messages(6);
    store.enqueue(msgs.clone()).await.expect("enqueue");
    let l = lease("a");
    store.claim_pending(&l, 5).await.expect("claim");
    store
        .mark_sent(&l, &[msgs[0].id, msgs[1].id])
        .await
        .expect("sent");
    let fail = |id, decision| PublishFailure {
        id,
        error: "e".into(),
        decision,
    };
    store
        .mark_publish_failed(
            &l,
            &[
                fail(msgs[2].id, Decision::RetryAfter(Duration::from_secs(60))),
                fail(msgs[3].id, Decision::Dead),
            ],
        )
        .await
        .expect("failed");
    tokio::time::sleep(Duration::from_millis(700)).await;
    // Sent just now: younger than the age.
    store.mark_sent(&l, &[msgs[4].id]).await.expect("sent");
    let age = Duration::from_millis(500);
    assert_eq!(store.delete_sent_batch(age, 1).await.expect("batch"), 1);
    assert!(
        store.get_message(msgs[0].id).await.expect("get").is_none(),
        "the oldest goes first"
    );
    assert_eq!(store.delete_sent_batch(age, 10).await.expect("batch"), 1);
    assert_eq!(store.delete_sent_batch(age, 10).await.expect("batch"), 0);
    for (m, status) in [
        (&msgs[2], OutboxStatus::PublishFailed),
        (&msgs[3], OutboxStatus::Dead),
        (&msgs[4], OutboxStatus::Sent),
        (&msgs[5], OutboxStatus::Pending),
    ] {
        assert_eq!(
            store
                .get_message(m.id)
                .await
                .expect("get")
                .map(|r| r.status),
            Some(status),
            "retention removed a {status} message"
        );
    }
}

/// Four claimers racing over the same rows take each row exactly once.
pub async fn concurrent_claimers_take_each_row_once(store: Arc<dyn OutboxSubject>) {
    let msgs = messages(400);
    let all: HashSet<_> = msgs.iter().map(|m| m.id).collect();
    store.enqueue(msgs).await.expect("enqueue");
    let mut tasks = Vec::new();
    for i in 0..4 {
        let store = Arc::clone(&store);
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let l = lease(&format!("claimer{i}"));
                let batch = store.claim_pending(&l, 7).await.expect("claim");
                if batch.is_empty() {
                    return mine;
                }
                let got = ids(&batch);
                assert_eq!(
                    store.mark_sent(&l, &got).await.expect("mark"),
                    got.len() as u64
                );
                mine.extend(got);
                tokio::task::yield_now().await;
            }
        }));
    }
    let mut seen = Vec::new();
    for t in tasks {
        seen.extend(t.await.expect("task"));
    }
    let unique: HashSet<_> = seen.iter().copied().collect();
    assert_eq!(seen.len(), unique.len(), "a row was claimed twice");
    assert_eq!(unique, all, "a row was never claimed");
}

fn keyed(exchange: &str, key: &str) -> outbox_core::Message {
    let mut m = message(exchange, "ordered");
    m.ordering_key = Some(key.to_owned());
    m
}

fn failure(id: MessageId, decision: Decision) -> PublishFailure {
    PublishFailure {
        id,
        error: "broker said no".into(),
        decision,
    }
}

/// Per-key ordering: a keyed message is claimed only when no earlier message of its
/// key is still unsent: not while one is in flight (claimed), failing and waiting
/// for its retry, delayed, or dead; other keys and unkeyed messages flow meanwhile.
pub async fn keyed_messages_are_claimed_one_at_a_time_in_order(store: Arc<dyn OutboxSubject>) {
    let (a, b, c) = (
        crate::unique_key("a"),
        crate::unique_key("b"),
        crate::unique_key("c"),
    );
    let a1 = keyed("contract", &a);
    let a2 = keyed("contract", &a);
    let a3 = keyed("contract", &a);
    let b1 = keyed("contract", &b);
    let b2 = keyed("contract", &b);
    let free = message("contract", "free");
    let mut c1 = keyed("contract", &c);
    let later = time::OffsetDateTime::now_utc() + time::Duration::hours(1);
    c1.not_before = Some(later.replace_nanosecond(0).unwrap_or(later));
    let c2 = keyed("contract", &c);
    store
        .enqueue(vec![
            a1.clone(),
            b1.clone(),
            a2.clone(),
            free.clone(),
            b2.clone(),
            a3.clone(),
            c1.clone(),
            c2.clone(),
        ])
        .await
        .expect("enqueue");
    let l = lease("ordered");
    let first = store.claim_pending(&l, 100).await.expect("claim");
    assert_eq!(
        ids(&first),
        [a1.id, b1.id, free.id],
        "each key's head and the unkeyed one; a delayed head holds its key back"
    );
    assert!(
        store
            .claim_pending(&lease("other"), 100)
            .await
            .expect("claim")
            .is_empty(),
        "nothing behind a head in flight"
    );
    store.mark_sent(&l, &[a1.id, free.id]).await.expect("sent");
    store
        .mark_publish_failed(
            &l,
            &[failure(
                b1.id,
                Decision::RetryAfter(Duration::from_secs(3600)),
            )],
        )
        .await
        .expect("failed");
    assert_eq!(
        ids(&store.claim_pending(&l, 100).await.expect("claim")),
        [a2.id],
        "a's next; b2 waits behind the failing b1"
    );
    assert_eq!(
        store.stats().await.expect("stats").blocked_keys,
        1,
        "b is held back by its failing message"
    );
    store.mark_sent(&l, &[a2.id]).await.expect("sent");
    assert_eq!(
        ids(&store.claim_pending(&l, 100).await.expect("claim")),
        [a3.id]
    );
    store.release(&l, &[a3.id]).await.expect("release");
    assert_eq!(
        ids(&store.claim_pending(&l, 100).await.expect("claim")),
        [a3.id],
        "a released head is the head again"
    );
    store.mark_sent(&l, &[a3.id]).await.expect("sent");

    assert!(
        store
            .claim_pending(&l, 100)
            .await
            .expect("claim")
            .is_empty(),
        "b2 stays behind b1's pending retry, c2 behind the delayed c1"
    );
}

/// With [`outbox_ports::DeadHead::Skip`] a dead message no longer holds its key
/// back; with the default it does until an operator deletes or requeues it.
pub async fn a_dead_head_blocks_its_key_unless_skipped(store: Arc<dyn OutboxSubject>, skip: bool) {
    let k = crate::unique_key("k");
    let (k1, k2, k3) = (
        keyed("contract", &k),
        keyed("contract", &k),
        keyed("contract", &k),
    );
    store
        .enqueue(vec![k1.clone(), k2.clone(), k3.clone()])
        .await
        .expect("enqueue");
    let l = lease("dead-head");
    assert_eq!(
        ids(&store.claim_pending(&l, 100).await.expect("claim")),
        [k1.id]
    );
    store
        .mark_publish_failed(&l, &[failure(k1.id, Decision::Dead)])
        .await
        .expect("dead");
    let next = store.claim_pending(&l, 100).await.expect("claim");
    assert_eq!(
        store.stats().await.expect("stats").blocked_keys,
        u64::from(!skip),
        "a dead head blocks its key unless skipped"
    );
    if skip {
        assert_eq!(ids(&next), [k2.id], "skipped: the key moves on");
    } else {
        assert!(next.is_empty(), "blocked behind the dead head");
        // The two waiting behind the dead head are unsent: an age alert sees them.
        let oldest = store
            .stats()
            .await
            .expect("stats")
            .oldest_unsent_at
            .expect("messages waiting behind a dead head are unsent");
        let off = (oldest - k2.created_at).abs();
        assert!(
            off < time::Duration::milliseconds(1),
            "the oldest unsent is the first one waiting: {oldest} against {}",
            k2.created_at
        );
        store
            .delete_message(k1.id, false)
            .await
            .expect("delete the dead head");
        assert_eq!(
            ids(&store.claim_pending(&l, 100).await.expect("claim")),
            [k2.id],
            "deleting the dead head unblocks its key"
        );
    }
}

/// A small deterministic generator (xorshift64*): the interleavings below are
/// reproducible from their seed.
struct Steps(u64);

impl Steps {
    fn next(&mut self, below: u64) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D) % below.max(1)
    }
}

/// Per-key order under interleaved relays, one run of 300 random steps for each
/// seed of `seeds`: three relays claim (pending or due retries) and settle what
/// they hold (sent, failed and due again at once, or released) in random order.
/// After every claim: no key has two messages held at once, and the message a
/// relay got is the next unsent one of its key. At the end, one relay drains the
/// rest; every key's messages were sent once each, in order.
pub async fn keyed_order_holds_under_interleaved_relays(
    store: Arc<dyn OutboxSubject>,
    seeds: std::ops::Range<u64>,
) {
    use std::collections::HashMap;
    const KEYS: usize = 4;
    const PER_KEY: usize = 6;
    for seed in seeds {
        let tag = crate::unique_key("il");
        let mut batch = Vec::new();
        for n in 0..PER_KEY {
            for k in 0..KEYS {
                let mut m = message("contract", "k");
                m.ordering_key = Some(format!("{tag}-{k}"));
                m.payload = format!("{k}:{n}").into_bytes();
                batch.push(m);
            }
            if n % 2 == 0 {
                batch.push(message("contract", "unkeyed"));
            }
        }
        let unkeyed = batch.iter().filter(|m| m.ordering_key.is_none()).count();
        store.enqueue(batch).await.expect("enqueue");
        let place = |m: &outbox_core::Message| -> Option<(usize, usize)> {
            m.ordering_key.as_ref()?;
            let text = String::from_utf8(m.payload.clone()).ok()?;
            let (k, n) = text.split_once(':')?;
            Some((k.parse().ok()?, n.parse().ok()?))
        };
        let relays: Vec<Lease> = (0..3).map(|r| lease(&format!("relay{r}"))).collect();
        let mut held: Vec<Vec<outbox_ports::ClaimedMessage>> = vec![Vec::new(); 3];
        let mut sent: HashMap<usize, Vec<usize>> = HashMap::new();
        let mut unkeyed_sent = 0;
        let mut rng = Steps(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let check = |held: &[Vec<outbox_ports::ClaimedMessage>],
                     sent: &HashMap<usize, Vec<usize>>,
                     got: &outbox_ports::ClaimedMessage| {
            let Some((k, n)) = place(&got.message) else {
                return;
            };
            let done = sent.get(&k).map_or(0, Vec::len);
            assert_eq!(
                n, done,
                "seed {seed}: key {k} handed out #{n} with {done} sent"
            );
            let holding = held
                .iter()
                .flatten()
                .filter(|c| place(&c.message).is_some_and(|(hk, _)| hk == k))
                .count();
            assert_eq!(holding, 0, "seed {seed}: key {k} held twice");
        };
        for _ in 0..300 {
            let r = rng.next(3) as usize;
            match rng.next(10) {
                0..=4 => {
                    let limit = 1 + rng.next(4) as u32;
                    let got = if rng.next(10) < 8 {
                        store.claim_pending(&relays[r], limit).await
                    } else {
                        store.claim_due_retries(&relays[r], limit).await
                    }
                    .expect("claim");
                    for c in got {
                        check(&held, &sent, &c);
                        held[r].push(c);
                    }
                }
                _ => {
                    if held[r].is_empty() {
                        continue;
                    }
                    let i = rng.next(held[r].len() as u64) as usize;
                    let c = held[r].remove(i);
                    let id = [c.message.id];
                    match rng.next(4) {
                        0 | 1 => {
                            let n = store.mark_sent(&relays[r], &id).await.expect("mark");
                            assert_eq!(n, 1, "seed {seed}: a held message is marked");
                            match place(&c.message) {
                                Some((k, n)) => sent.entry(k).or_default().push(n),
                                None => unkeyed_sent += 1,
                            }
                        }
                        2 => {
                            let f = PublishFailure {
                                id: c.message.id,
                                error: "interleaved failure".to_owned(),
                                decision: Decision::RetryAfter(Duration::ZERO),
                            };
                            store
                                .mark_publish_failed(&relays[r], &[f])
                                .await
                                .expect("fail");
                        }
                        _ => {
                            store.release(&relays[r], &id).await.expect("release");
                        }
                    }
                }
            }
        }
        // What is still held goes back; one relay drains the rest.
        for (r, h) in held.iter().enumerate() {
            let ids: Vec<MessageId> = h.iter().map(|c| c.message.id).collect();
            store.release(&relays[r], &ids).await.expect("release");
        }
        let drain = lease("drain");
        for _ in 0..(KEYS * PER_KEY + unkeyed) * 2 {
            let mut got = store.claim_pending(&drain, 100).await.expect("claim");
            got.extend(store.claim_due_retries(&drain, 100).await.expect("retries"));
            if got.is_empty() {
                break;
            }
            for c in &got {
                match place(&c.message) {
                    Some((k, n)) => sent.entry(k).or_default().push(n),
                    None => unkeyed_sent += 1,
                }
            }
            let ids: Vec<MessageId> = got.iter().map(|c| c.message.id).collect();
            store.mark_sent(&drain, &ids).await.expect("mark");
        }
        let in_order: Vec<usize> = (0..PER_KEY).collect();
        for k in 0..KEYS {
            assert_eq!(
                sent.get(&k),
                Some(&in_order),
                "seed {seed}: key {k} sent out of order or not once each"
            );
        }
        assert_eq!(unkeyed_sent, unkeyed, "seed {seed}: unkeyed sent once each");
    }
}

/// [`keyed_order_holds_under_interleaved_relays`] over 10 seeds, as a contract case (each seed adds its rows to the same table).
pub async fn keyed_order_holds_under_interleaved_relays_10_seeds(store: Arc<dyn OutboxSubject>) {
    keyed_order_holds_under_interleaved_relays(store, 0..10).await;
}
