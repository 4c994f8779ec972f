//! The attempt history contract: every failed publish or handler attempt is kept
//! on its record (number, time, error), the newest
//! [`FAILED_ATTEMPTS_KEPT`](outbox_core::FAILED_ATTEMPTS_KEPT), oldest first; a
//! success adds nothing, an operator's requeue keeps what was, and the rows of one
//! batch mark keep their own.

use std::time::Duration;

use outbox_core::{Decision, FAILED_ATTEMPTS_KEPT, FailedAttempt, MessageId, OutboxStatus};
use outbox_ports::{Lease, PublishFailure};

use crate::inbox_operator::InboxUnderTest;
use crate::outbox_operator::OutboxUnderTest;
use crate::{LONG_TTL, message, unique_key};

const RETRY_NOW: Decision = Decision::RetryAfter(Duration::ZERO);

fn shown(history: &[FailedAttempt]) -> Vec<(u32, String)> {
    history
        .iter()
        .map(|a| (a.attempt, a.error.clone()))
        .collect()
}

fn numbered(attempts: std::ops::RangeInclusive<u32>, label: &str) -> Vec<(u32, String)> {
    attempts.map(|n| (n, format!("{label} {n}"))).collect()
}

async fn outbox_history(o: &OutboxUnderTest, id: MessageId) -> outbox_ports::OutboxRecord {
    o.operator
        .get_message(id)
        .await
        .expect("get")
        .expect("the message is stored")
}

/// Twelve failed publishes of one message, and one of another in the same batch
/// mark: each keeps its own, the first the newest ten, numbered, timed, in order.
pub async fn failed_publishes_are_kept_newest_ten(o: OutboxUnderTest) {
    let exchange = unique_key("history");
    let (a, b) = (message(&exchange, "k"), message(&exchange, "k"));
    let (a_id, b_id) = (a.id, b.id);
    o.store.enqueue(vec![a, b]).await.expect("enqueue");
    let rounds = u32::try_from(FAILED_ATTEMPTS_KEPT).expect("small") + 2;
    for n in 1..=rounds {
        let lease = Lease::new(unique_key("history"), LONG_TTL);
        let claimed = if n == 1 {
            o.store.claim_pending(&lease, 100).await
        } else {
            o.store.claim_due_retries(&lease, 100).await
        }
        .expect("claim");
        let ids: Vec<MessageId> = claimed.iter().map(|c| c.message.id).collect();
        assert!(ids.contains(&a_id), "round {n}: {ids:?}");
        let mut failures = vec![PublishFailure {
            id: a_id,
            error: format!("no route {n}"),
            decision: if n == rounds {
                Decision::Dead
            } else {
                RETRY_NOW
            },
        }];
        if n == 1 {
            failures.push(PublishFailure {
                id: b_id,
                error: "other error".into(),
                decision: Decision::RetryAfter(Duration::from_secs(3600)),
            });
        }
        let others: Vec<MessageId> = ids
            .iter()
            .copied()
            .filter(|id| *id != a_id && *id != b_id)
            .collect();
        o.store.release(&lease, &others).await.expect("release");
        let marked = o
            .store
            .mark_publish_failed(&lease, &failures)
            .await
            .expect("mark failed");
        assert_eq!(marked, failures.len() as u64, "round {n}");
    }
    let record = outbox_history(&o, a_id).await;
    assert_eq!(record.status, OutboxStatus::Dead);
    let kept = &record.publish.failed_attempts;
    assert_eq!(shown(kept), numbered(3..=rounds, "no route"));
    assert!(
        kept.windows(2).all(|w| w[0].at <= w[1].at),
        "oldest first: {kept:?}"
    );
    assert_eq!(
        kept.last().map(|a| a.at),
        record.publish.last_attempt_at,
        "the newest attempt's time is the last attempt's"
    );
    let other = outbox_history(&o, b_id).await;
    assert_eq!(
        shown(&other.publish.failed_attempts),
        [(1, "other error".to_owned())]
    );

    // A requeue keeps the history; the success that follows adds nothing to it.
    o.operator.requeue_message(a_id).await.expect("requeue");
    let lease = Lease::new(unique_key("history"), LONG_TTL);
    let claimed = o.store.claim_pending(&lease, 100).await.expect("claim");
    assert!(claimed.iter().any(|c| c.message.id == a_id));
    o.store.mark_sent(&lease, &[a_id]).await.expect("sent");
    let sent = outbox_history(&o, a_id).await;
    assert_eq!(sent.status, OutboxStatus::Sent);
    assert_eq!(
        shown(&sent.publish.failed_attempts),
        numbered(3..=rounds, "no route")
    );
}

/// Twelve failed handler attempts of one delivery: the newest ten, numbered, timed,
/// in order; another consumer's delivery of the same message keeps its own.
pub async fn failed_handler_attempts_are_kept_newest_ten(i: InboxUnderTest) {
    let (consumer, other) = (unique_key("history"), unique_key("history-other"));
    let m = message("history", "k");
    let first = Lease::new(unique_key("history"), LONG_TTL);
    i.store
        .record_arrival(&consumer, &m, &first)
        .await
        .expect("arrive");
    i.store
        .record_arrival(&other, &m, &first)
        .await
        .expect("arrive");
    assert!(
        i.store
            .mark_consume_failed(&other, m.id, &first, "other error", Decision::Dead)
            .await
            .expect("mark")
    );
    let rounds = u32::try_from(FAILED_ATTEMPTS_KEPT).expect("small") + 2;
    let mut lease = first;
    for n in 1..=rounds {
        if n > 1 {
            lease = Lease::new(unique_key("history"), LONG_TTL);
            let claimed = i
                .store
                .claim_due(&consumer, &lease, 10)
                .await
                .expect("claim");
            assert_eq!(claimed.len(), 1, "round {n}");
            assert_eq!(claimed[0].attempts, n - 1, "round {n}");
        }
        let decision = if n == rounds {
            Decision::Dead
        } else {
            RETRY_NOW
        };
        assert!(
            i.store
                .mark_consume_failed(
                    &consumer,
                    m.id,
                    &lease,
                    &format!("cannot bill {n}"),
                    decision
                )
                .await
                .expect("mark"),
            "round {n}"
        );
    }
    let record = i
        .operator
        .get_delivery(&consumer, m.id)
        .await
        .expect("get")
        .expect("stored");
    let kept = &record.consume.failed_attempts;
    assert_eq!(shown(kept), numbered(3..=rounds, "cannot bill"));
    assert!(kept.windows(2).all(|w| w[0].at <= w[1].at), "{kept:?}");
    assert_eq!(kept.last().map(|a| a.at), record.consume.last_attempt_at);
    let theirs = i
        .operator
        .get_delivery(&other, m.id)
        .await
        .expect("get")
        .expect("stored");
    assert_eq!(
        shown(&theirs.consume.failed_attempts),
        [(1, "other error".to_owned())]
    );
    // A message's deliveries, every consumer's side: each with its own history.
    let sides = i.operator.deliveries_of(m.id).await.expect("deliveries of");
    assert_eq!(sides.len(), 2);
    for side in &sides {
        let want = if side.consumer == consumer {
            numbered(3..=rounds, "cannot bill")
        } else {
            vec![(1, "other error".to_owned())]
        };
        assert_eq!(
            shown(&side.consume.failed_attempts),
            want,
            "{}",
            side.consumer
        );
    }
}
