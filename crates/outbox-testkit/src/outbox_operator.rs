//! The [`OutboxOperator`] contract: keyset pages, the filter, bulk actions with
//! their cap and status guards, per-minute counts.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use outbox_core::{Decision, Message, MessageId, OutboxStatus, Timestamp, TransitionError};
use outbox_ports::{
    BLOCKED_WAITING_CAP, Lease, MAX_PAGE_LIMIT, MessageFilter, OutboxOperator, OutboxStore,
    PREVIEW_BYTES, PageCursor, PortError, PublishFailure,
};

use crate::{LONG_TTL, message, unique_key};

/// One outbox seen through both ports: the relay's (to put rows in a status) and
/// the operator's (under test).
#[derive(Clone)]
pub struct OutboxUnderTest {
    /// The relay's port.
    pub store: Arc<dyn OutboxStore>,
    /// The operator's port of the same outbox.
    pub operator: Arc<dyn OutboxOperator>,
}

fn lease() -> Lease {
    Lease::new(unique_key("op"), LONG_TTL)
}

/// Messages to an exchange of this case's own (so filters by it see only them).
fn batch(exchange: &str, n: usize) -> Vec<Message> {
    (0..n).map(|_| message(exchange, "op.key")).collect()
}

fn by_exchange(exchange: &str) -> MessageFilter {
    MessageFilter {
        exchange: Some(exchange.to_owned()),
        ..MessageFilter::default()
    }
}

/// Enqueues `messages` and brings them to `status` (`Pending`, `Sent`,
/// `PublishFailed`, `Dead`) through the relay's own path; other pending rows the
/// claim takes are given back untouched.
pub(crate) async fn put(
    o: &OutboxUnderTest,
    messages: Vec<Message>,
    status: OutboxStatus,
) -> Vec<MessageId> {
    let ids: Vec<MessageId> = messages.iter().map(|m| m.id).collect();
    o.store.enqueue(messages).await.expect("enqueue");
    if status == OutboxStatus::Pending {
        return ids;
    }
    let l = lease();
    let claimed = o.store.claim_pending(&l, 100_000).await.expect("claim");
    let others: Vec<MessageId> = claimed
        .iter()
        .map(|c| c.message.id)
        .filter(|id| !ids.contains(id))
        .collect();
    o.store.release(&l, &others).await.expect("release");
    let marked = match status {
        OutboxStatus::Sent => o.store.mark_sent(&l, &ids).await.expect("sent"),
        OutboxStatus::PublishFailed | OutboxStatus::Dead => {
            let decision = if status == OutboxStatus::Dead {
                Decision::Dead
            } else {
                Decision::RetryAfter(Duration::from_secs(3600))
            };
            let failures: Vec<PublishFailure> = ids
                .iter()
                .map(|id| PublishFailure {
                    id: *id,
                    error: "broker said no".into(),
                    decision,
                })
                .collect();
            o.store
                .mark_publish_failed(&l, &failures)
                .await
                .expect("failed")
        }
        other => panic!("put: {other} is not an outbox status"),
    };
    assert_eq!(marked, ids.len() as u64, "every row brought to {status}");
    ids
}

async fn status_of(o: &OutboxUnderTest, id: MessageId) -> Option<OutboxStatus> {
    o.operator
        .get_message(id)
        .await
        .expect("get")
        .map(|r| r.status)
}

/// Every page of `filter` with `limit`, walking the cursors.
async fn all_pages(
    o: &OutboxUnderTest,
    filter: &MessageFilter,
    limit: u32,
) -> (Vec<MessageId>, usize) {
    let mut ids = Vec::new();
    let mut pages = 0;
    let mut after: Option<PageCursor> = None;
    loop {
        let page = o
            .operator
            .list_messages(filter, after, limit)
            .await
            .expect("list");
        pages += 1;
        assert!(page.items.len() <= limit as usize);
        ids.extend(page.items.iter().map(|s| s.id));
        match page.next {
            Some(next) => {
                assert_eq!(
                    page.items.len(),
                    limit as usize,
                    "only a full page has a next"
                );
                after = Some(next);
            }
            None => return (ids, pages),
        }
        assert!(pages < 1_000, "the pages never end");
    }
}

/// Pages walk everything once, newest first, no duplicate and no gap, and the last
/// page says so; a row added meanwhile does not shift the later pages.
pub async fn pages_are_keyset_newest_first(o: OutboxUnderTest) {
    let ex = unique_key("pages");
    let ids = put(&o, batch(&ex, 25), OutboxStatus::Pending).await;
    let newest_first: Vec<MessageId> = ids.iter().rev().copied().collect();
    let (seen, pages) = all_pages(&o, &by_exchange(&ex), 10).await;
    assert_eq!(seen, newest_first);
    assert_eq!(pages, 3);
    let (seen, pages) = all_pages(&o, &by_exchange(&ex), 5).await;
    assert_eq!(seen.len(), 25);
    assert_eq!(
        pages, 5,
        "a last page that is full still ends with next = None"
    );
    // Continuing from a cursor after a newer row arrived: nothing repeated or lost.
    let first = o
        .operator
        .list_messages(&by_exchange(&ex), None, 10)
        .await
        .expect("first");
    put(&o, batch(&ex, 3), OutboxStatus::Pending).await;
    let second = o
        .operator
        .list_messages(&by_exchange(&ex), first.next, 10)
        .await
        .expect("second");
    assert_eq!(
        second.items.iter().map(|s| s.id).collect::<Vec<_>>(),
        newest_first[10..20]
    );
    let unique: HashSet<MessageId> = seen.into_iter().collect();
    assert_eq!(unique.len(), 25);
}

/// `limit` is clamped to 1..=1,000; list items carry a preview, never the payload.
pub async fn limit_is_bounded_and_items_carry_a_preview(o: OutboxUnderTest) {
    let ex = unique_key("limit");
    put(
        &o,
        batch(&ex, MAX_PAGE_LIMIT as usize + 1),
        OutboxStatus::Pending,
    )
    .await;
    let f = by_exchange(&ex);
    let huge = o
        .operator
        .list_messages(&f, None, u32::MAX)
        .await
        .expect("huge");
    assert_eq!(huge.items.len(), MAX_PAGE_LIMIT as usize);
    assert!(huge.next.is_some());
    let zero = o.operator.list_messages(&f, None, 0).await.expect("zero");
    assert_eq!(zero.items.len(), 1);

    let mut big = message(&ex, "big");
    big.payload = vec![b'x'; 1000];
    put(&o, vec![big.clone()], OutboxStatus::Pending).await;
    let page = o
        .operator
        .list_messages(
            &MessageFilter {
                q: Some(big.id.to_string()),
                ..MessageFilter::default()
            },
            None,
            10,
        )
        .await
        .expect("list");
    assert_eq!(page.items.len(), 1);
    assert_eq!(page.items[0].payload_size, 1000);
    assert_eq!(page.items[0].payload_preview, vec![b'x'; PREVIEW_BYTES]);
    assert_eq!(page.items[0].message_type.as_deref(), Some("test.message"));
    assert_eq!(page.items[0].received_at, None, "received is a delivery's");
}

/// Each filter field narrows to exactly the rows it names.
pub async fn each_filter_field_narrows(o: OutboxUnderTest) {
    let ex = unique_key("filter");
    let other_ex = unique_key("filter-other");
    // Whole seconds: a store may keep microseconds only.
    let base = Timestamp::from_unix_timestamp(Timestamp::now_utc().unix_timestamp() - 7200)
        .expect("a valid time");
    let mut plain = batch(&ex, 3);
    for (i, m) in plain.iter_mut().enumerate() {
        m.created_at = base + time::Duration::minutes(10 * i as i64);
    }
    let mut keyed = message(&ex, "other.key");
    keyed.message_type = Some("other.type".into());
    keyed.created_at = base + time::Duration::minutes(60);
    let plain_ids = put(&o, plain, OutboxStatus::Pending).await;
    let keyed_id = put(&o, vec![keyed], OutboxStatus::Pending).await[0];
    let dead = put(&o, batch(&ex, 2), OutboxStatus::Dead).await;
    let sent = put(&o, batch(&ex, 1), OutboxStatus::Sent).await;
    put(&o, batch(&other_ex, 2), OutboxStatus::Dead).await;

    let ids = |f: MessageFilter| {
        let o = o.clone();
        async move {
            let set: HashSet<MessageId> = all_pages(&o, &f, 100).await.0.into_iter().collect();
            set
        }
    };
    let within = |f: MessageFilter| MessageFilter {
        exchange: Some(ex.clone()),
        ..f
    };
    assert_eq!(ids(by_exchange(&ex)).await.len(), 7);
    assert_eq!(
        ids(within(MessageFilter {
            status: Some(OutboxStatus::Dead),
            ..MessageFilter::default()
        }))
        .await,
        dead.iter().copied().collect()
    );
    assert_eq!(
        ids(within(MessageFilter {
            status: Some(OutboxStatus::Sent),
            ..MessageFilter::default()
        }))
        .await,
        sent.iter().copied().collect()
    );
    assert_eq!(
        ids(within(MessageFilter {
            routing_key: Some("other.key".into()),
            ..MessageFilter::default()
        }))
        .await,
        HashSet::from([keyed_id])
    );
    assert_eq!(
        ids(within(MessageFilter {
            message_type: Some("other.type".into()),
            ..MessageFilter::default()
        }))
        .await,
        HashSet::from([keyed_id])
    );
    // created_after is inclusive, created_before exclusive.
    assert_eq!(
        ids(within(MessageFilter {
            created_after: Some(base + time::Duration::minutes(10)),
            created_before: Some(base + time::Duration::minutes(60)),
            ..MessageFilter::default()
        }))
        .await,
        HashSet::from([plain_ids[1], plain_ids[2]])
    );
    // Everything in this case's exchanges has a status: a status-only filter sees
    // the other exchange's dead rows too.
    let all_dead = ids(MessageFilter {
        status: Some(OutboxStatus::Dead),
        ..MessageFilter::default()
    })
    .await;
    assert!(all_dead.len() >= 4);
    assert!(dead.iter().all(|id| all_dead.contains(id)));
}

/// `q` is a message id or a correlation id, exactly; anything else matches nothing
/// and is no error.
pub async fn q_finds_by_id_and_by_correlation_id(o: OutboxUnderTest) {
    let ex = unique_key("q");
    let corr = unique_key("corr");
    let mut with_corr = batch(&ex, 2);
    for m in &mut with_corr {
        m.correlation_id = Some(corr.clone());
    }
    let corr_ids = put(&o, with_corr, OutboxStatus::Pending).await;
    let lone = put(&o, batch(&ex, 1), OutboxStatus::Dead).await[0];
    let q = |q: &str| MessageFilter {
        q: Some(q.to_owned()),
        ..MessageFilter::default()
    };
    let found = |f: MessageFilter| {
        let o = o.clone();
        async move { all_pages(&o, &f, 50).await.0 }
    };
    assert_eq!(found(q(&lone.to_string())).await, vec![lone]);
    assert_eq!(
        found(q(&corr)).await,
        corr_ids.iter().rev().copied().collect::<Vec<_>>()
    );
    assert!(
        found(q(&corr[..corr.len() - 1])).await.is_empty(),
        "exact only"
    );
    assert!(found(q("not a uuid ' OR 1=1 --")).await.is_empty());
    assert!(
        found(MessageFilter {
            status: Some(OutboxStatus::Pending),
            ..q(&lone.to_string())
        })
        .await
        .is_empty(),
        "q narrows with the other fields"
    );
    let got = o
        .operator
        .get_message(lone)
        .await
        .expect("get")
        .expect("found");
    assert_eq!(got.status, OutboxStatus::Dead);
}

/// Bulk requeue: at most `max` matched, newest first; only dead and failed rows
/// change, each once; a second run changes nothing more.
pub async fn bulk_requeue_honours_max_and_status(o: OutboxUnderTest) {
    let ex = unique_key("requeue");
    let f = by_exchange(&ex);
    let old_dead = put(&o, batch(&ex, 3), OutboxStatus::Dead).await;
    let failed = put(&o, batch(&ex, 1), OutboxStatus::PublishFailed).await;
    let sent = put(&o, batch(&ex, 1), OutboxStatus::Sent).await;
    let pending = put(&o, batch(&ex, 2), OutboxStatus::Pending).await;
    // Newest first: 2 pending, sent, failed, dead[2] | dead[1], dead[0].
    assert_eq!(o.operator.count_messages(&f, 100).await.expect("count"), 7);
    assert_eq!(o.operator.count_messages(&f, 4).await.expect("count"), 4);
    let r = o.operator.requeue_matching(&f, 5).await.expect("requeue");
    assert_eq!((r.matched, r.changed), (5, 2));
    assert_eq!(status_of(&o, failed[0]).await, Some(OutboxStatus::Pending));
    assert_eq!(
        status_of(&o, old_dead[2]).await,
        Some(OutboxStatus::Pending)
    );
    assert_eq!(
        status_of(&o, old_dead[1]).await,
        Some(OutboxStatus::Dead),
        "beyond max"
    );
    assert_eq!(status_of(&o, sent[0]).await, Some(OutboxStatus::Sent));
    let rec = o
        .operator
        .get_message(old_dead[2])
        .await
        .expect("get")
        .expect("row");
    assert_eq!(rec.publish.attempts, 0, "a fresh retry budget");

    let dead_only = MessageFilter {
        status: Some(OutboxStatus::Dead),
        ..f.clone()
    };
    let r = o
        .operator
        .requeue_matching(&dead_only, 100)
        .await
        .expect("requeue");
    assert_eq!((r.matched, r.changed), (2, 2));
    let r = o
        .operator
        .requeue_matching(&dead_only, 100)
        .await
        .expect("again");
    assert_eq!((r.matched, r.changed), (0, 0), "nothing changes twice");
    // The requeued rows are claimable exactly once each.
    let l = lease();
    let claimed: HashSet<MessageId> = o
        .store
        .claim_pending(&l, 100_000)
        .await
        .expect("claim")
        .into_iter()
        .map(|c| c.message.id)
        .collect();
    for id in old_dead.iter().chain(&failed).chain(&pending) {
        assert!(claimed.contains(id), "{id} claimable after requeue");
    }
    assert!(!claimed.contains(&sent[0]));
    let r = o.operator.requeue_matching(&f, 0).await.expect("max 0");
    assert_eq!((r.matched, r.changed), (0, 0));
}

/// Bulk delete: dead rows only, unless forced; forced, also pending and failed
/// ones, but never one under a live lease and never a sent one.
pub async fn bulk_delete_honours_force_and_leases(o: OutboxUnderTest) {
    let ex = unique_key("delete");
    let f = by_exchange(&ex);
    let sent = put(&o, batch(&ex, 1), OutboxStatus::Sent).await;
    let dead = put(&o, batch(&ex, 2), OutboxStatus::Dead).await;
    let failed = put(&o, batch(&ex, 1), OutboxStatus::PublishFailed).await;
    let held = put(&o, batch(&ex, 1), OutboxStatus::Pending).await;
    let relay = lease();
    let claimed = o.store.claim_pending(&relay, 100_000).await.expect("claim");
    let others: Vec<MessageId> = claimed
        .iter()
        .map(|c| c.message.id)
        .filter(|id| *id != held[0])
        .collect();
    o.store.release(&relay, &others).await.expect("release");
    let pending = put(&o, batch(&ex, 2), OutboxStatus::Pending).await;

    let r = o
        .operator
        .delete_matching(&f, 100, false)
        .await
        .expect("delete");
    assert_eq!((r.matched, r.changed), (7, 2), "only the dead ones");
    for id in &dead {
        assert_eq!(status_of(&o, *id).await, None);
    }
    assert_eq!(status_of(&o, pending[0]).await, Some(OutboxStatus::Pending));

    let r = o
        .operator
        .delete_matching(&f, 1, true)
        .await
        .expect("forced, max 1");
    assert_eq!((r.matched, r.changed), (1, 1));
    assert_eq!(status_of(&o, pending[1]).await, None, "newest first");
    assert_eq!(status_of(&o, pending[0]).await, Some(OutboxStatus::Pending));

    let r = o
        .operator
        .delete_matching(&f, 100, true)
        .await
        .expect("forced");
    assert_eq!((r.matched, r.changed), (4, 2));
    assert_eq!(status_of(&o, pending[0]).await, None);
    assert_eq!(status_of(&o, failed[0]).await, None);
    assert_eq!(
        status_of(&o, held[0]).await,
        Some(OutboxStatus::Pending),
        "a row a relay holds is not deleted, even forced"
    );
    assert_eq!(
        status_of(&o, sent[0]).await,
        Some(OutboxStatus::Sent),
        "retention's job"
    );
    // The relay that held it can still mark it.
    assert_eq!(o.store.mark_sent(&relay, &held).await.expect("mark"), 1);
}

/// The single actions: the same guards, with errors saying why.
pub async fn single_actions_are_guarded(o: OutboxUnderTest) {
    let ex = unique_key("single");
    let pending = put(&o, batch(&ex, 1), OutboxStatus::Pending).await[0];
    let sent = put(&o, batch(&ex, 1), OutboxStatus::Sent).await[0];
    let dead = put(&o, batch(&ex, 1), OutboxStatus::Dead).await[0];
    assert!(matches!(
        o.operator.delete_message(pending, false).await,
        Err(PortError::NotDeletable(_))
    ));
    assert!(matches!(
        o.operator.delete_message(sent, true).await,
        Err(PortError::NotDeletable(_))
    ));
    assert!(matches!(
        o.operator.requeue_message(pending).await,
        Err(PortError::IllegalTransition(_))
    ));
    let unknown = message(&ex, "k").id;
    assert!(matches!(
        o.operator.delete_message(unknown, true).await,
        Err(PortError::NotFound { .. })
    ));
    assert!(
        o.operator
            .get_message(unknown)
            .await
            .expect("get")
            .is_none()
    );
    o.operator.requeue_message(dead).await.expect("requeue");
    assert_eq!(status_of(&o, dead).await, Some(OutboxStatus::Pending));
    // Held by a relay: refused even forced, and left as it is.
    let relay = lease();
    let claimed = o.store.claim_pending(&relay, 100_000).await.expect("claim");
    assert!(claimed.iter().any(|c| c.message.id == pending));
    let refused = o.operator.delete_message(pending, true).await;
    assert!(refused.is_err(), "deleted a row under a live lease");
    assert_eq!(status_of(&o, pending).await, Some(OutboxStatus::Pending));
    let ids: Vec<MessageId> = claimed.iter().map(|c| c.message.id).collect();
    o.store.release(&relay, &ids).await.expect("release");
    o.operator
        .delete_message(pending, true)
        .await
        .expect("forced once released");
    assert_eq!(status_of(&o, pending).await, None);
}

/// Messages marked sent are counted in the minute they were sent.
pub async fn published_per_minute_counts_sent_messages(o: OutboxUnderTest) {
    let before: u64 = o
        .operator
        .published_per_minute(Duration::from_secs(3600))
        .await
        .expect("before")
        .iter()
        .map(|m| m.count)
        .sum();
    let ex = unique_key("per-minute");
    put(&o, batch(&ex, 3), OutboxStatus::Sent).await;
    put(&o, batch(&ex, 2), OutboxStatus::Dead).await;
    let minutes = o
        .operator
        .published_per_minute(Duration::from_secs(3600))
        .await
        .expect("after");
    let after: u64 = minutes.iter().map(|m| m.count).sum();
    assert_eq!(after - before, 3);
    let now = Timestamp::now_utc();
    for w in minutes.windows(2) {
        assert!(w[0].minute < w[1].minute, "oldest minute first");
    }
    for m in &minutes {
        assert_eq!(m.minute.second(), 0);
        assert!(m.minute <= now && m.minute > now - time::Duration::minutes(62));
    }
}

/// Failing and dead messages are grouped per exchange and failure group (never
/// the sent or pending ones), texts that differ in values only in one group,
/// every group counted exactly (also one whose every text differs), the
/// largest first.
pub async fn failures_are_grouped_per_exchange_exactly(o: OutboxUnderTest) {
    let (a, b) = (unique_key("fail-a"), unique_key("fail-b"));
    put(&o, batch(&a, 2), OutboxStatus::Sent).await;
    put(&o, batch(&a, 2), OutboxStatus::Pending).await;
    // Exchange a: three texts of one group (two failing, one dead), one other,
    // and 40 dead whose texts all differ (a size per message) in a third.
    let mut texts: Vec<(String, Decision)> = vec![
        (
            "refused message 17 by \"billing-1\"".into(),
            Decision::RetryAfter(Duration::from_secs(3600)),
        ),
        (
            "refused message 17 by \"billing-1\"".into(),
            Decision::RetryAfter(Duration::from_secs(3600)),
        ),
        ("refused message 23 by \"billing-2\"".into(), Decision::Dead),
        ("timeout after 30s".into(), Decision::Dead),
    ];
    for n in 0..40 {
        texts.push((
            format!(
                "PRECONDITION_FAILED - message size {} is larger than max",
                1_000 + n
            ),
            Decision::Dead,
        ));
    }
    let msgs = batch(&a, texts.len());
    let failures: Vec<PublishFailure> = msgs
        .iter()
        .zip(texts)
        .map(|(m, (error, decision))| PublishFailure {
            id: m.id,
            error,
            decision,
        })
        .collect();
    o.store.enqueue(msgs.clone()).await.expect("enqueue");
    let l = lease();
    let claimed = o.store.claim_pending(&l, 100_000).await.expect("claim");
    let others: Vec<MessageId> = claimed
        .iter()
        .map(|c| c.message.id)
        .filter(|id| !msgs.iter().any(|m| m.id == *id))
        .collect();
    o.store.release(&l, &others).await.expect("release");
    let marked = o
        .store
        .mark_publish_failed(&l, &failures)
        .await
        .expect("failed");
    assert_eq!(marked, 44);
    // Exchange b: the same group as none of a's, counted apart.
    put(&o, batch(&b, 1), OutboxStatus::Dead).await;

    let all = o.operator.failure_groups().await.expect("groups");
    for w in all.windows(2) {
        assert!(w[0].count >= w[1].count, "the largest first");
    }
    let mine: Vec<(String, String, u64)> = all
        .iter()
        .filter(|g| g.place == a || g.place == b)
        .map(|g| (g.place.clone(), g.error.clone(), g.count))
        .collect();
    assert_eq!(
        mine,
        vec![
            (
                a.clone(),
                "PRECONDITION_FAILED - message size <n> is larger than max".into(),
                40
            ),
            (a.clone(), "refused message <n> by \"…\"".into(), 3),
            (a.clone(), "timeout after <n>s".into(), 1),
            (b.clone(), "broker said no".into(), 1),
        ],
        "every group, counted exactly"
    );
    let refused = all
        .iter()
        .find(|g| g.place == a && g.count == 3)
        .expect("the refused group");
    assert_eq!(refused.example, "refused message 17 by \"billing-1\"");
    for g in all.iter().filter(|g| g.place == a) {
        assert!(g.oldest.is_some() && g.oldest <= g.newest, "{g:?}");
        assert!(
            g.newest
                .is_some_and(|n| n <= Timestamp::now_utc() + time::Duration::seconds(5)),
            "{g:?}"
        );
    }
}

/// "Publish now": a delayed message shows its due time in pages, and once made due
/// the next claim takes it; a message that is no longer pending is refused, an
/// unknown one not found.
pub async fn publish_now_makes_a_delayed_message_due(o: OutboxUnderTest) {
    let exchange = unique_key("later");
    let mut delayed = message(&exchange, "op.key");
    let due = Timestamp::now_utc() + time::Duration::hours(1);
    delayed.not_before = Some(due.replace_nanosecond(0).unwrap_or(due));
    let id = delayed.id;
    o.store
        .enqueue(vec![delayed.clone()])
        .await
        .expect("enqueue");
    let page = o
        .operator
        .list_messages(&by_exchange(&exchange), None, 10)
        .await
        .expect("list");
    assert_eq!(page.items.len(), 1);
    assert_eq!(page.items[0].status, OutboxStatus::Pending);
    assert_eq!(
        page.items[0].due_at, delayed.not_before,
        "the page shows the due time"
    );
    let l = lease();
    let claimed = o.store.claim_pending(&l, 100_000).await.expect("claim");
    assert!(claimed.iter().all(|c| c.message.id != id), "not due yet");
    let others: Vec<MessageId> = claimed.iter().map(|c| c.message.id).collect();
    o.store.release(&l, &others).await.expect("release");

    o.operator.publish_now(id).await.expect("publish now");
    let record = o
        .operator
        .get_message(id)
        .await
        .expect("get")
        .expect("there");
    assert_eq!(
        (record.status, record.message.not_before),
        (OutboxStatus::Pending, None)
    );
    let claimed = o.store.claim_pending(&l, 100_000).await.expect("claim");
    assert!(claimed.iter().any(|c| c.message.id == id), "due at once");
    o.store.mark_sent(&l, &[id]).await.expect("sent");
    let others: Vec<MessageId> = claimed
        .iter()
        .map(|c| c.message.id)
        .filter(|m| *m != id)
        .collect();
    o.store.release(&l, &others).await.expect("release");

    assert!(matches!(
        o.operator.publish_now(id).await,
        Err(PortError::IllegalTransition(TransitionError::Outbox {
            from: OutboxStatus::Sent,
            ..
        }))
    ));
    assert!(matches!(
        o.operator
            .publish_now(MessageId::from_uuid(uuid::Uuid::now_v7()))
            .await,
        Err(PortError::NotFound { .. })
    ));
}

/// Blocked keys are listed in key order: keys whose head is failing, or dead
/// (with the default [`outbox_ports::DeadHead::Block`] only), each with its head
/// and the count waiting behind it (capped at [`BLOCKED_WAITING_CAP`]); a key whose
/// head is pending or in flight is not, nor an unkeyed failing message; pages
/// continue after a key; `limit` is clamped; the stats count the same keys.
/// `skip`: the store under test was built with [`outbox_ports::DeadHead::Skip`].
pub async fn blocked_keys_list_failing_and_dead_heads(o: OutboxUnderTest, skip: bool) {
    // One prefix, keys told apart by their last letter: ordered alike by bytes and
    // by any collation.
    let p = unique_key("blocked");
    let key = |c: &str| format!("{p}-{c}");
    let keyed = |k: &str| {
        let mut m = message("blocked", "blocked.key");
        m.ordering_key = Some(key(k));
        m
    };
    let (a, b, c, d, e, g) = (
        (0..3).map(|_| keyed("a")).collect::<Vec<_>>(), // failing head, 2 behind
        (0..2).map(|_| keyed("b")).collect::<Vec<_>>(), // dead head, 1 behind
        (0..2).map(|_| keyed("c")).collect::<Vec<_>>(), // pending head (released)
        (0..2).map(|_| keyed("d")).collect::<Vec<_>>(), // head in flight
        vec![keyed("e")],                               // failing head, none behind
        (0..BLOCKED_WAITING_CAP + 2)
            .map(|_| keyed("g"))
            .collect::<Vec<_>>(), // failing head, more than the cap behind
    );
    let unkeyed = message("blocked", "blocked.unkeyed");
    let all: Vec<Message> = [&a, &b, &c, &d, &e, &g]
        .into_iter()
        .flatten()
        .cloned()
        .chain([unkeyed.clone()])
        .collect();
    o.store.enqueue(all).await.expect("enqueue");
    let l = lease();
    let claimed: Vec<MessageId> = o
        .store
        .claim_pending(&l, 100)
        .await
        .expect("claim")
        .iter()
        .map(|c| c.message.id)
        .collect();
    assert_eq!(
        claimed,
        [
            a[0].id, b[0].id, c[0].id, d[0].id, e[0].id, g[0].id, unkeyed.id
        ],
        "each key's head and the unkeyed message"
    );
    let fail = |id: MessageId, decision: Decision| PublishFailure {
        id,
        error: "broker said no".into(),
        decision,
    };
    let retry = Decision::RetryAfter(Duration::from_secs(3600));
    o.store
        .mark_publish_failed(
            &l,
            &[
                fail(a[0].id, retry),
                fail(b[0].id, Decision::Dead),
                fail(e[0].id, retry),
                fail(g[0].id, retry),
                fail(unkeyed.id, retry),
            ],
        )
        .await
        .expect("failed");
    o.store.release(&l, &[c[0].id]).await.expect("release");
    // d's head stays claimed (in flight).

    let listed =
        |page: &[outbox_ports::BlockedKey]| page.iter().map(|k| k.key.clone()).collect::<Vec<_>>();
    let expected: Vec<String> = if skip {
        vec![key("a"), key("e"), key("g")]
    } else {
        vec![key("a"), key("b"), key("e"), key("g")]
    };
    let page = o.operator.blocked_keys(None, 100).await.expect("blocked");
    assert_eq!(
        listed(&page),
        expected,
        "failing heads, and a dead head unless skipped; never a pending or in-flight head"
    );
    assert_eq!(
        o.store.stats().await.expect("stats").blocked_keys,
        expected.len() as u64,
        "the stats count the keys listed"
    );
    // The head of each key, whatever holds it, and what waits behind it.
    let head = |k: &str| {
        let operator = Arc::clone(&o.operator);
        let k = key(k);
        async move { operator.head_of_key(&k).await.expect("head of key") }
    };
    let head_a = head("a").await.expect("a has a head");
    assert_eq!(
        (head_a.head, head_a.waiting, head_a.waiting_capped),
        (a[0].id, 2, false)
    );
    let head_b = head("b").await;
    if skip {
        assert_eq!(
            head_b.map(|h| (h.head, h.waiting)),
            Some((b[1].id, 0)),
            "skipped: the dead head holds nothing, the next one leads"
        );
    } else {
        assert_eq!(head_b.map(|h| (h.head, h.waiting)), Some((b[0].id, 1)));
    }
    let head_c = head("c").await.expect("c has a head");
    assert_eq!(
        (head_c.head, head_c.waiting),
        (c[0].id, 1),
        "a pending head"
    );
    let head_g = head("g").await.expect("g has a head");
    assert_eq!(
        (head_g.waiting, head_g.waiting_capped),
        (BLOCKED_WAITING_CAP, true)
    );
    assert!(head("none").await.is_none(), "a key with no messages");
    let a_item = &page[0];
    assert_eq!(a_item.head, a[0].id);
    assert_eq!(a_item.status, OutboxStatus::PublishFailed);
    assert_eq!(a_item.attempts, 1);
    assert_eq!(a_item.last_error.as_deref(), Some("broker said no"));
    assert!(
        a_item.next_attempt_at.is_some(),
        "a failing head's retry time"
    );
    assert_eq!((a_item.waiting, a_item.waiting_capped), (2, false));
    if !skip {
        let b_item = &page[1];
        assert_eq!(
            (b_item.head, b_item.status, b_item.waiting),
            (b[0].id, OutboxStatus::Dead, 1)
        );
    }
    let e_item = page.iter().find(|k| k.key == key("e")).expect("e");
    assert_eq!((e_item.head, e_item.waiting), (e[0].id, 0));
    let g_item = page.iter().find(|k| k.key == key("g")).expect("g");
    assert_eq!(
        (g_item.waiting, g_item.waiting_capped),
        (BLOCKED_WAITING_CAP, true),
        "the waiting count stops at the cap and says so"
    );

    // Pages of one and of two, continuing after the previous page's last key.
    for size in [1_u32, 2] {
        let mut seen = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let page = o
                .operator
                .blocked_keys(after.clone(), size)
                .await
                .expect("page");
            assert!(page.len() <= size as usize);
            seen.extend(listed(&page));
            match page.last() {
                Some(last) if page.len() == size as usize => after = Some(last.key.clone()),
                _ => break,
            }
            assert!(seen.len() <= expected.len(), "the pages never end");
        }
        assert_eq!(seen, expected, "pages of {size}");
    }
    assert_eq!(
        listed(
            &o.operator
                .blocked_keys(Some(key("c")), 100)
                .await
                .expect("after c")
        ),
        [key("e"), key("g")],
        "after a key that is not blocked itself"
    );
    assert_eq!(
        o.operator.blocked_keys(None, 0).await.expect("zero").len(),
        1,
        "limit 0 is clamped to 1"
    );

    // A requeued head is pending: its key moves on and is no longer listed.
    o.operator.requeue_message(a[0].id).await.expect("requeue");
    let after_requeue = listed(&o.operator.blocked_keys(None, 100).await.expect("blocked"));
    assert!(!after_requeue.contains(&key("a")), "{after_requeue:?}");
    assert_eq!(after_requeue.len(), expected.len() - 1);
    assert_eq!(
        o.store.stats().await.expect("stats").blocked_keys,
        after_requeue.len() as u64
    );
}

/// [`blocked_keys_list_failing_and_dead_heads`] on a store with the default
/// [`outbox_ports::DeadHead::Block`].
pub async fn blocked_keys_are_listed_in_key_order(o: OutboxUnderTest) {
    blocked_keys_list_failing_and_dead_heads(o, false).await;
}

/// A filter by failure group counts and requeues the messages whose last error
/// is in that group, and no other.
pub async fn a_filter_by_error_group_takes_those_only(o: OutboxUnderTest) {
    let exchange = unique_key("errors");
    let messages = batch(&exchange, 3);
    let ids: Vec<MessageId> = messages.iter().map(|m| m.id).collect();
    o.store.enqueue(messages).await.expect("enqueue");
    let l = lease();
    let claimed = o.store.claim_pending(&l, 100_000).await.expect("claim");
    let others: Vec<MessageId> = claimed
        .iter()
        .map(|c| c.message.id)
        .filter(|id| !ids.contains(id))
        .collect();
    o.store.release(&l, &others).await.expect("release");
    let errors = ["order 1 rejected", "order 2 rejected", "order 1 rejected!"];
    let failures: Vec<PublishFailure> = ids
        .iter()
        .zip(errors)
        .map(|(id, error)| PublishFailure {
            id: *id,
            error: error.into(),
            decision: Decision::Dead,
        })
        .collect();
    assert_eq!(
        o.store
            .mark_publish_failed(&l, &failures)
            .await
            .expect("failed"),
        3
    );
    let filter = MessageFilter {
        exchange: Some(exchange.clone()),
        status: Some(OutboxStatus::Dead),
        error_group: Some("order <n> rejected".into()),
        ..MessageFilter::default()
    };
    assert_eq!(
        o.operator
            .count_messages(&filter, 100)
            .await
            .expect("count"),
        2
    );
    let done = o
        .operator
        .requeue_matching(&filter, 100)
        .await
        .expect("requeue");
    assert_eq!((done.matched, done.changed), (2, 2));
    assert_eq!(status_of(&o, ids[0]).await, Some(OutboxStatus::Pending));
    assert_eq!(status_of(&o, ids[1]).await, Some(OutboxStatus::Pending));
    assert_eq!(
        status_of(&o, ids[2]).await,
        Some(OutboxStatus::Dead),
        "a text that only starts like the group's is in another"
    );
}

/// Each exchange with an unsent or dead message is counted by status, with its
/// oldest unsent message's time; a delayed message not yet due waits for
/// nothing; sent messages are not counted and an exchange with only sent ones is
/// not listed.
pub async fn exchanges_are_counted_by_status(o: OutboxUnderTest) {
    let (a, b, c) = (
        unique_key("per-ex-a"),
        unique_key("per-ex-b"),
        unique_key("per-ex-c"),
    );
    let started = Timestamp::now_utc() - time::Duration::seconds(5);
    put(&o, batch(&a, 3), OutboxStatus::Pending).await;
    put(&o, batch(&a, 2), OutboxStatus::PublishFailed).await;
    put(&o, batch(&a, 4), OutboxStatus::Dead).await;
    put(&o, batch(&a, 5), OutboxStatus::Sent).await;
    put(&o, batch(&b, 1), OutboxStatus::Dead).await;
    put(&o, batch(&c, 2), OutboxStatus::Sent).await;
    let mut later = message(&b, "op.key");
    later.not_before = Some(Timestamp::now_utc() + time::Duration::hours(1));
    put(&o, vec![later], OutboxStatus::Pending).await;
    let all = o.operator.exchange_counts().await.expect("counts");
    for w in all.windows(2) {
        assert!(w[0].exchange < w[1].exchange, "by name");
    }
    let of = |name: &str| all.iter().find(|e| e.exchange == name).cloned();
    let ea = of(&a).expect("a is listed");
    assert_eq!(
        (ea.pending, ea.publish_failed, ea.dead),
        (3, 2, 4),
        "{ea:?}"
    );
    let oldest = ea.oldest_unsent_at.expect("a has unsent messages");
    assert!(oldest >= started && oldest <= Timestamp::now_utc() + time::Duration::seconds(5));
    let eb = of(&b).expect("b is listed");
    assert_eq!(
        (eb.pending, eb.publish_failed, eb.dead),
        (1, 0, 1),
        "{eb:?}"
    );
    assert_eq!(
        eb.oldest_unsent_at, None,
        "a delayed message not yet due waits for nothing, a dead one neither"
    );
    assert!(of(&c).is_none(), "only sent messages: not listed");
}

/// A list oldest first walks up from the first message, its cursor continuing
/// upwards; newest first walks down; both see every message once.
pub async fn lists_go_oldest_first_when_asked(o: OutboxUnderTest) {
    let exchange = unique_key("order");
    let ids = put(&o, batch(&exchange, 5), OutboxStatus::Pending).await;
    let walk = async |oldest_first: bool| {
        let filter = MessageFilter {
            exchange: Some(exchange.clone()),
            oldest_first,
            ..MessageFilter::default()
        };
        let mut seen = Vec::new();
        let mut after = None;
        loop {
            let page = o
                .operator
                .list_messages(&filter, after, 2)
                .await
                .expect("page");
            seen.extend(page.items.iter().map(|m| m.id));
            match page.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        seen
    };
    assert_eq!(walk(true).await, ids, "oldest first, pages of two");
    let mut newest = ids.clone();
    newest.reverse();
    assert_eq!(walk(false).await, newest, "newest first");
}
