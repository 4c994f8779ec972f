//! The [`InboxOperator`] contract: deliveries by consumer, reconsume in bulk with
//! its cap and status guards, dead letters, per-minute counts.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use outbox_core::{Decision, Headers, InboxStatus, Message, MessageId, Timestamp};
use outbox_ports::{
    DeadLetter, DeliveryFilter, InboxOperator, InboxStore, Lease, PREVIEW_BYTES, PageCursor,
    PortError,
};

use crate::{LONG_TTL, message, unique_key};

/// One inbox seen through both ports: the consumer's (to put deliveries in a
/// status) and the operator's (under test).
#[derive(Clone)]
pub struct InboxUnderTest {
    /// The consumer's port.
    pub store: Arc<dyn InboxStore>,
    /// The operator's port of the same inbox.
    pub operator: Arc<dyn InboxOperator>,
}

fn lease() -> Lease {
    Lease::new(unique_key("op"), LONG_TTL)
}

/// Records `messages` for `consumer` and brings them to `status`  through the consumer's path.
pub(crate) async fn put(
    i: &InboxUnderTest,
    consumer: &str,
    messages: &[Message],
    status: InboxStatus,
) {
    for m in messages {
        let l = lease();
        i.store
            .record_arrival(consumer, m, &l)
            .await
            .expect("arrive");
        let marked = match status {
            InboxStatus::Received => true,
            InboxStatus::Consumed => i
                .store
                .mark_consumed(consumer, m.id, &l)
                .await
                .expect("mark"),
            InboxStatus::ConsumeFailed | InboxStatus::Dead => {
                let decision = if status == InboxStatus::Dead {
                    Decision::Dead
                } else {
                    Decision::RetryAfter(Duration::from_secs(3600))
                };
                i.store
                    .mark_consume_failed(consumer, m.id, &l, "handler said no", decision)
                    .await
                    .expect("mark")
            }
        };
        assert!(marked);
    }
}

fn msgs(n: usize) -> Vec<Message> {
    (0..n).map(|_| message("inbox-op", "k")).collect()
}

fn ids(ms: &[Message]) -> Vec<MessageId> {
    ms.iter().map(|m| m.id).collect()
}

async fn status_of(i: &InboxUnderTest, consumer: &str, id: MessageId) -> Option<InboxStatus> {
    i.operator
        .get_delivery(consumer, id)
        .await
        .expect("get")
        .map(|r| r.status)
}

async fn all_deliveries(
    i: &InboxUnderTest,
    consumer: &str,
    filter: &DeliveryFilter,
    limit: u32,
) -> Vec<MessageId> {
    let mut seen = Vec::new();
    let mut after: Option<PageCursor> = None;
    for _ in 0..1_000 {
        let page = i
            .operator
            .list_deliveries(consumer, filter, after, limit)
            .await
            .expect("list");
        assert!(page.items.len() <= limit as usize);
        seen.extend(page.items.iter().map(|s| s.id));
        match page.next {
            Some(next) => after = Some(next),
            None => return seen,
        }
    }
    panic!("the pages never end");
}

/// A consumer's deliveries, newest first across pages, only its own; filters by
/// status and `q` narrow them.
pub async fn deliveries_page_newest_first_per_consumer(i: InboxUnderTest) {
    let (a, b) = (unique_key("a"), unique_key("b"));
    let consumed = msgs(4);
    let mut dead = msgs(3);
    let corr = unique_key("corr");
    dead[1].correlation_id = Some(corr.clone());
    put(&i, &a, &consumed, InboxStatus::Consumed).await;
    put(&i, &a, &dead, InboxStatus::Dead).await;
    put(&i, &b, &msgs(2), InboxStatus::Consumed).await;
    let all = DeliveryFilter::default();
    let expected: Vec<MessageId> = ids(&consumed).into_iter().chain(ids(&dead)).rev().collect();
    assert_eq!(all_deliveries(&i, &a, &all, 3).await, expected);
    assert_eq!(all_deliveries(&i, &a, &all, 1000).await, expected);
    // Each item says when it was received, and the page follows that time.
    let page = i
        .operator
        .list_deliveries(&a, &all, None, 1000)
        .await
        .expect("list");
    let received: Vec<_> = page.items.iter().map(|d| d.received_at).collect();
    assert!(received.iter().all(Option::is_some), "{received:?}");
    assert!(
        received.windows(2).all(|w| w[0] >= w[1]),
        "newest first by arrival: {received:?}"
    );
    let only_dead = DeliveryFilter {
        status: Some(InboxStatus::Dead),
        ..DeliveryFilter::default()
    };
    assert_eq!(
        all_deliveries(&i, &a, &only_dead, 2).await,
        ids(&dead).into_iter().rev().collect::<Vec<_>>()
    );
    let by_corr = DeliveryFilter {
        q: Some(corr),
        ..DeliveryFilter::default()
    };
    assert_eq!(all_deliveries(&i, &a, &by_corr, 10).await, vec![dead[1].id]);
    let by_id = DeliveryFilter {
        q: Some(consumed[0].id.to_string()),
        ..DeliveryFilter::default()
    };
    assert_eq!(
        all_deliveries(&i, &a, &by_id, 10).await,
        vec![consumed[0].id]
    );
    assert!(all_deliveries(&i, &b, &by_id, 10).await.is_empty());
    assert_eq!(
        i.operator
            .count_deliveries(&a, &all, 100)
            .await
            .expect("count"),
        7
    );
    assert_eq!(
        i.operator
            .count_deliveries(&a, &all, 5)
            .await
            .expect("count"),
        5
    );
    let page = i
        .operator
        .list_deliveries(&a, &all, None, 0)
        .await
        .expect("limit 0");
    assert_eq!(page.items.len(), 1, "limit is clamped to at least 1");
    assert_eq!(page.items[0].status, InboxStatus::Dead);
    assert_eq!(page.items[0].attempts, 1);
    assert!(page.items[0].payload_size > 0);
}

/// Bulk reconsume: failed and dead deliveries back to in progress, at most `max`,
/// newest first; consumed ones only when the filter asks for them; a delivery in
/// progress never; a second run changes nothing more.
pub async fn bulk_reconsume_honours_max_and_status(i: InboxUnderTest) {
    let c = unique_key("reconsume");
    let consumed = msgs(2);
    let dead = msgs(3);
    let failed = msgs(1);
    let received = msgs(1);
    put(&i, &c, &consumed, InboxStatus::Consumed).await;
    put(&i, &c, &dead, InboxStatus::Dead).await;
    put(&i, &c, &failed, InboxStatus::ConsumeFailed).await;
    put(&i, &c, &received, InboxStatus::Received).await;
    let other = unique_key("other");
    put(&i, &other, &dead, InboxStatus::Dead).await;
    let all = DeliveryFilter::default();
    // Newest first: in progress, failed, dead[2], dead[1] | dead[0], consumed.
    let r = i
        .operator
        .reconsume_matching(&c, &all, 4)
        .await
        .expect("reconsume");
    assert_eq!((r.matched, r.changed), (4, 3));
    assert_eq!(
        status_of(&i, &c, failed[0].id).await,
        Some(InboxStatus::Received)
    );
    assert_eq!(
        status_of(&i, &c, dead[1].id).await,
        Some(InboxStatus::Received)
    );
    assert_eq!(
        status_of(&i, &c, dead[0].id).await,
        Some(InboxStatus::Dead),
        "beyond max"
    );
    assert_eq!(
        status_of(&i, &other, dead[1].id).await,
        Some(InboxStatus::Dead),
        "other consumer"
    );
    let rec = i
        .operator
        .get_delivery(&c, dead[1].id)
        .await
        .expect("get")
        .expect("row");
    assert_eq!(rec.consume.attempts, 0, "a fresh retry budget");

    let r = i
        .operator
        .reconsume_matching(&c, &all, 100)
        .await
        .expect("rest");
    assert_eq!(
        (r.matched, r.changed),
        (7, 1),
        "dead[0]; consumed ones stay"
    );
    assert_eq!(
        status_of(&i, &c, consumed[0].id).await,
        Some(InboxStatus::Consumed)
    );
    let r = i
        .operator
        .reconsume_matching(&c, &all, 100)
        .await
        .expect("again");
    assert_eq!(r.changed, 0, "nothing changes twice");

    let only_consumed = DeliveryFilter {
        status: Some(InboxStatus::Consumed),
        ..DeliveryFilter::default()
    };
    let r = i
        .operator
        .reconsume_matching(&c, &only_consumed, 100)
        .await
        .expect("consumed");
    assert_eq!((r.matched, r.changed), (2, 2));
    // Every reconsumed delivery is claimed by the consume sweep exactly once.
    let claimed: Vec<MessageId> = i
        .store
        .claim_due(&c, &lease(), 1000)
        .await
        .expect("claim")
        .into_iter()
        .map(|d| d.message.id)
        .collect();
    let unique: HashSet<MessageId> = claimed.iter().copied().collect();
    assert_eq!(claimed.len(), unique.len());
    for m in consumed.iter().chain(&dead).chain(&failed) {
        assert!(unique.contains(&m.id), "{} due after reconsume", m.id);
    }
}

/// The consume side of one message for every consumer that received it.
pub async fn deliveries_of_a_message_cover_every_consumer(i: InboxUnderTest) {
    let (a, b) = (unique_key("a"), unique_key("b"));
    let m = msgs(1);
    put(&i, &a, &m, InboxStatus::Consumed).await;
    put(&i, &b, &m, InboxStatus::Dead).await;
    let mut found = i.operator.deliveries_of(m[0].id).await.expect("of");
    found.sort_by(|x, y| x.consumer.cmp(&y.consumer));
    let mut expected = vec![(a, InboxStatus::Consumed), (b, InboxStatus::Dead)];
    expected.sort_by(|x, y| x.0.cmp(&y.0));
    assert_eq!(
        found
            .iter()
            .map(|r| (r.consumer.clone(), r.status))
            .collect::<Vec<_>>(),
        expected
    );
    assert_eq!(found[0].message, m[0]);
    assert!(
        i.operator
            .deliveries_of(msgs(1)[0].id)
            .await
            .expect("none")
            .is_empty()
    );
}

fn letter(n: usize) -> DeadLetter {
    let mut headers = Headers::new();
    headers.insert("x-n".into(), n.to_string());
    DeadLetter {
        message_id: n.is_multiple_of(2).then(|| format!("raw-{n}")),
        routing_key: "dl.key".into(),
        headers,
        body: vec![0xff, u8::try_from(n % 256).unwrap_or(0)],
        reason: format!("undecodable {n}"),
    }
}

/// Consumers are listed with their counts, also one with only dead letters; dead
/// letters are listed newest first, read and deleted one by one.
pub async fn consumers_and_dead_letters(i: InboxUnderTest) {
    let (a, b) = (unique_key("a"), unique_key("b"));
    put(&i, &a, &msgs(2), InboxStatus::Consumed).await;
    for n in 0..5 {
        i.store
            .record_dead_letter(&a, letter(n))
            .await
            .expect("letter");
    }
    // A body larger than a preview: lists carry its start and its size only.
    let mut big = letter(9);
    big.body = vec![b'x'; PREVIEW_BYTES + 100];
    i.store.record_dead_letter(&b, big).await.expect("letter");
    put(&i, &a, &msgs(3), InboxStatus::Dead).await;
    let consumers = i.operator.consumers().await.expect("consumers");
    let of = |name: &str| consumers.iter().find(|c| c.name == name);
    let sa = of(&a).expect("a listed");
    assert_eq!((sa.stats.dead, sa.stats.dead_letters), (3, 5));
    if sa.consumed_counted {
        assert_eq!(sa.stats.consumed, 2);
    } else {
        assert_eq!(sa.stats.consumed, 0, "an uncounted total says nothing");
    }
    assert_eq!(of(&b).expect("b listed").stats.dead_letters, 1);

    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = i
            .operator
            .list_dead_letters(Some(a.clone()), after, 2)
            .await
            .expect("list");
        seen.extend(page.items);
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    assert_eq!(
        seen.iter().map(|l| l.reason.clone()).collect::<Vec<_>>(),
        (0..5)
            .rev()
            .map(|n| format!("undecodable {n}"))
            .collect::<Vec<_>>(),
        "newest first, each once"
    );
    assert!(seen.iter().all(|l| l.consumer == a));
    assert_eq!(seen[0].body, letter(4).body);
    assert_eq!(seen[0].headers, letter(4).headers);
    assert_eq!(seen[0].message_id.as_deref(), Some("raw-4"));
    assert_eq!(seen[1].message_id, None);
    assert!(seen[0].received_at <= Timestamp::now_utc());
    let everyone = i
        .operator
        .list_dead_letters(None, None, 100)
        .await
        .expect("all");
    assert_eq!(everyone.items.len(), 6);
    assert_eq!(everyone.items[0].consumer, b);
    let listed_big = &everyone.items[0];
    assert_eq!(listed_big.body_size, (PREVIEW_BYTES + 100) as u64);
    assert_eq!(
        listed_big.body.len(),
        PREVIEW_BYTES,
        "a list carries a preview"
    );
    let whole = i
        .operator
        .get_dead_letter(listed_big.id)
        .await
        .expect("get")
        .expect("there");
    assert_eq!(
        whole.body.len(),
        PREVIEW_BYTES + 100,
        "get returns it whole"
    );
    assert_eq!(whole.body_size, (PREVIEW_BYTES + 100) as u64);
    assert_eq!(seen[0].body_size, letter(4).body.len() as u64);

    let target = seen[2].clone();
    assert_eq!(
        i.operator
            .get_dead_letter(target.id)
            .await
            .expect("get")
            .as_ref(),
        Some(&target)
    );
    i.operator
        .delete_dead_letter(target.id)
        .await
        .expect("delete");
    assert!(
        i.operator
            .get_dead_letter(target.id)
            .await
            .expect("gone")
            .is_none()
    );
    assert!(matches!(
        i.operator.delete_dead_letter(target.id).await,
        Err(PortError::NotFound { .. })
    ));
    assert_eq!(i.store.stats(&a).await.expect("stats").dead_letters, 4);
    assert!(
        i.operator
            .get_dead_letter(u64::MAX)
            .await
            .expect("unknown")
            .is_none()
    );
}

/// Deliveries marked consumed are counted in their minute, over all consumers.
pub async fn consumed_per_minute_counts_consumed_deliveries(i: InboxUnderTest) {
    let total = |i: InboxUnderTest| async move {
        i.operator
            .consumed_per_minute(Duration::from_secs(3600))
            .await
            .expect("per minute")
            .iter()
            .map(|m| m.count)
            .sum::<u64>()
    };
    let before = total(i.clone()).await;
    put(&i, &unique_key("a"), &msgs(2), InboxStatus::Consumed).await;
    put(&i, &unique_key("b"), &msgs(1), InboxStatus::Consumed).await;
    put(&i, &unique_key("b"), &msgs(2), InboxStatus::Dead).await;
    assert_eq!(total(i.clone()).await - before, 3);
}

/// Failed and dead deliveries are grouped per consumer and failure group (never
/// the received or consumed ones), texts that differ in values only in one
/// group, each counted exactly.
pub async fn failures_are_grouped_per_consumer_exactly(i: InboxUnderTest) {
    let (a, b) = (unique_key("fail-a"), unique_key("fail-b"));
    put(&i, &a, &msgs(2), InboxStatus::Consumed).await;
    put(&i, &a, &msgs(1), InboxStatus::Received).await;
    let cases = [
        (
            "row 17 of \"invoices\" is locked",
            Decision::RetryAfter(Duration::from_secs(3600)),
        ),
        ("row 42 of \"invoices\" is locked", Decision::Dead),
        ("handler timed out", Decision::Dead),
    ];
    for (error, decision) in cases {
        let m = message("inbox-op", "k");
        let l = lease();
        i.store.record_arrival(&a, &m, &l).await.expect("arrive");
        assert!(
            i.store
                .mark_consume_failed(&a, m.id, &l, error, decision)
                .await
                .expect("mark")
        );
    }
    put(&i, &b, &msgs(2), InboxStatus::Dead).await;

    let all = i.operator.failure_groups().await.expect("groups");
    let mine: Vec<(String, String, u64)> = all
        .iter()
        .filter(|g| g.place == a || g.place == b)
        .map(|g| (g.place.clone(), g.error.clone(), g.count))
        .collect();
    assert_eq!(
        mine,
        vec![
            (a.clone(), "row <n> of \"…\" is locked".into(), 2),
            (b.clone(), "handler said no".into(), 2),
            (a.clone(), "handler timed out".into(), 1),
        ]
    );
    let groups: Vec<_> = all.into_iter().filter(|g| g.place == a).collect();
    assert!(groups[0].oldest.is_some() && groups[0].oldest <= groups[0].newest);
}
