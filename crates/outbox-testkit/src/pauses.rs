//! The [`PauseStore`] contract, with what a pause does to the outbox's claims and
//! to the inbox's pause check of the same store: a paused exchange's messages are
//! never claimed (first publishes and retries alike), a paused keyed head holds
//! its key's later messages back, and a resume lets everything flow again in order.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::{Decision, Message, MessageId};
use outbox_ports::{InboxConsumerPath, Lease, PauseKind, PauseStore, PublishFailure};

use crate::outbox::OutboxSubject;
use crate::{LONG_TTL, message, unique_key};

/// One store's outbox, inbox and pauses, sharing what they keep.
pub struct PausesUnderTest {
    /// The outbox (relay's and operator's ports).
    pub outbox: Arc<dyn OutboxSubject>,
    /// The inbox's consumer path.
    pub inbox: Arc<dyn InboxConsumerPath>,
    /// The pauses.
    pub pauses: Arc<dyn PauseStore>,
}

fn lease() -> Lease {
    Lease::new(unique_key("relay"), LONG_TTL)
}

fn ids(claimed: &[outbox_ports::ClaimedMessage]) -> Vec<MessageId> {
    claimed.iter().map(|c| c.message.id).collect()
}

fn keyed(exchange: &str, key: &str) -> Message {
    let mut m = message(exchange, "ordered");
    m.ordering_key = Some(key.to_owned());
    m
}

/// A pause and a resume say whether they changed anything; the list shows what is
/// in force, with who paused it; names a pause cannot hold are refused.
pub async fn pause_and_resume_say_whether_they_changed_anything(t: PausesUnderTest) {
    let exchange = unique_key("orders");
    let consumer = unique_key("billing");
    let p = &t.pauses;
    assert!(
        p.pause(PauseKind::Exchange, &exchange, "ana")
            .await
            .expect("pause")
    );
    assert!(
        !p.pause(PauseKind::Exchange, &exchange, "bo")
            .await
            .expect("pause again"),
        "a second pause of the same exchange changed nothing"
    );
    assert!(
        p.pause(PauseKind::Consumer, &consumer, "bo")
            .await
            .expect("pause")
    );
    // The same name as the other kind is another pause.
    assert!(
        p.pause(PauseKind::Consumer, &exchange, "bo")
            .await
            .expect("pause")
    );
    let listed = p.pauses().await.expect("list");
    let find = |kind, name: &str| listed.iter().find(|x| x.kind == kind && x.name == name);
    let e = find(PauseKind::Exchange, &exchange).expect("the exchange's pause is listed");
    assert_eq!(e.by, "ana", "the first pause's author is kept");
    assert!(e.since.is_some());
    assert!(find(PauseKind::Consumer, &consumer).is_some());
    assert!(
        p.resume(PauseKind::Exchange, &exchange)
            .await
            .expect("resume")
    );
    assert!(
        !p.resume(PauseKind::Exchange, &exchange)
            .await
            .expect("resume again")
    );
    let listed = p.pauses().await.expect("list");
    assert!(
        !listed
            .iter()
            .any(|x| x.kind == PauseKind::Exchange && x.name == exchange)
    );
    assert!(
        listed
            .iter()
            .any(|x| x.kind == PauseKind::Consumer && x.name == exchange)
    );
    for bad in [String::new(), "a\u{7}b".to_owned(), "x".repeat(256)] {
        assert!(
            p.pause(PauseKind::Exchange, &bad, "ana").await.is_err(),
            "{bad:?} was paused"
        );
    }
}

/// Claims pass over a paused exchange's messages, pending, due after a delay and
/// failed alike, while every other exchange flows; an idle relay is not told they
/// are due; once resumed they are claimed, in order.
pub async fn claims_pass_over_a_paused_exchange_until_it_is_resumed(t: PausesUnderTest) {
    let held = unique_key("held");
    let flowing = unique_key("flowing");
    let first = message(&held, "a");
    let other = message(&flowing, "b");
    let second = message(&held, "c");
    let mut delayed = message(&held, "d");
    delayed.not_before = Some(delayed.created_at);
    let failing = message(&held, "e");
    let o = &t.outbox;
    // One of the held exchange fails first and waits for its retry (due at once).
    o.enqueue(vec![failing.clone()]).await.expect("enqueue");
    let l = lease();
    assert_eq!(
        ids(&o.claim_pending(&l, 10).await.expect("claim")),
        vec![failing.id]
    );
    let retry = PublishFailure {
        id: failing.id,
        error: "unroutable".into(),
        decision: Decision::RetryAfter(Duration::ZERO),
    };
    assert_eq!(o.mark_publish_failed(&l, &[retry]).await.expect("fail"), 1);
    t.pauses
        .pause(PauseKind::Exchange, &held, "ana")
        .await
        .expect("pause");
    o.enqueue(vec![
        first.clone(),
        other.clone(),
        second.clone(),
        delayed.clone(),
    ])
    .await
    .expect("enqueue");
    let l = lease();
    let claimed = o.claim_pending(&l, 100).await.expect("claim");
    assert_eq!(
        ids(&claimed),
        vec![other.id],
        "only the exchange not paused flows"
    );
    assert_eq!(o.mark_sent(&l, &[other.id]).await.expect("sent"), 1);
    assert!(
        o.claim_due_retries(&l, 100)
            .await
            .expect("retries")
            .is_empty(),
        "a paused exchange's failed message was claimed for its retry"
    );
    assert_ne!(
        o.pending_claimable().await.expect("claimable"),
        Some(true),
        "an idle relay was told a paused exchange's messages are due"
    );
    assert!(o.claim_pending(&l, 100).await.expect("claim").is_empty());
    t.pauses
        .resume(PauseKind::Exchange, &held)
        .await
        .expect("resume");
    assert_ne!(o.pending_claimable().await.expect("claimable"), Some(false));
    let claimed = o.claim_pending(&l, 100).await.expect("claim");
    assert_eq!(
        ids(&claimed),
        vec![first.id, second.id, delayed.id],
        "resumed, the exchange's messages are claimed in their order"
    );
    assert_eq!(
        ids(&o.claim_due_retries(&l, 100).await.expect("retries")),
        vec![failing.id]
    );
}

/// A paused exchange's keyed message holds its key's later messages back, whatever
/// their exchange, so the key's order is kept; other keys flow.
pub async fn a_paused_keyed_head_holds_its_key_back(t: PausesUnderTest) {
    let held = unique_key("held");
    let flowing = unique_key("flowing");
    let key = unique_key("customer");
    let other_key = unique_key("customer");
    let head = keyed(&held, &key);
    let behind = keyed(&flowing, &key);
    let elsewhere = keyed(&flowing, &other_key);
    let o = &t.outbox;
    t.pauses
        .pause(PauseKind::Exchange, &held, "ana")
        .await
        .expect("pause");
    o.enqueue(vec![head.clone(), behind.clone(), elsewhere.clone()])
        .await
        .expect("enqueue");
    let l = lease();
    let claimed = o.claim_pending(&l, 100).await.expect("claim");
    assert_eq!(
        ids(&claimed),
        vec![elsewhere.id],
        "a message behind a paused head was claimed out of order"
    );
    assert_eq!(o.mark_sent(&l, &[elsewhere.id]).await.expect("sent"), 1);
    t.pauses
        .resume(PauseKind::Exchange, &held)
        .await
        .expect("resume");
    assert_eq!(
        ids(&o.claim_pending(&l, 100).await.expect("claim")),
        vec![head.id]
    );
    assert_eq!(o.mark_sent(&l, &[head.id]).await.expect("sent"), 1);
    assert_eq!(
        ids(&o.claim_pending(&l, 100).await.expect("claim")),
        vec![behind.id]
    );
}

/// The inbox tells a consumer it is paused exactly while a pause of its name (as a
/// consumer) is in force.
pub async fn the_inbox_tells_a_consumer_it_is_paused(t: PausesUnderTest) {
    let consumer = unique_key("billing");
    let i = &t.inbox;
    assert!(!i.consumer_paused(&consumer).await.expect("read"));
    // An exchange of the same name is not the consumer.
    t.pauses
        .pause(PauseKind::Exchange, &consumer, "ana")
        .await
        .expect("pause");
    assert!(!i.consumer_paused(&consumer).await.expect("read"));
    t.pauses
        .pause(PauseKind::Consumer, &consumer, "ana")
        .await
        .expect("pause");
    assert!(i.consumer_paused(&consumer).await.expect("read"));
    assert!(
        !i.consumer_paused(&unique_key("shipping"))
            .await
            .expect("read")
    );
    t.pauses
        .resume(PauseKind::Consumer, &consumer)
        .await
        .expect("resume");
    assert!(!i.consumer_paused(&consumer).await.expect("read"));
}
