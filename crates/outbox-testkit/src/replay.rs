//! The replay contract ([`outbox_ports::OutboxOperator::replay_message`]): a dead message
//! replayed once as a new one, its original kept dead and never run a second time
//! beside it (no requeue, no second replay), and every refusal changing nothing.

use outbox_core::{Message, MessageId, OutboxStatus};
use outbox_ports::{MessageFilter, PortError};

use crate::outbox_operator::{OutboxUnderTest, put};
use crate::{LONG_TTL, message, unique_key};

/// What an operator's edit makes of `original`: a new id, the payload and one
/// header changed, the rest as it was.
pub(crate) fn edited(original: &Message) -> Message {
    let mut replay = message(&original.exchange, &original.routing_key);
    replay.message_type.clone_from(&original.message_type);
    replay.correlation_id.clone_from(&original.correlation_id);
    replay.payload = br#"{"edited":true}"#.to_vec();
    replay.headers = original.headers.clone();
    replay
        .headers
        .insert("x-fixed".to_owned(), "yes".to_owned());
    replay
}

async fn record(o: &OutboxUnderTest, id: MessageId) -> Option<outbox_ports::OutboxRecord> {
    o.operator.get_message(id).await.expect("get")
}

pub(crate) fn refused(result: Result<(), PortError>, what: &str) -> String {
    match result {
        Err(PortError::Refused { reason, .. }) => reason,
        other => panic!("{what}: expected a refusal, got {other:?}"),
    }
}

/// A dead message replays as a new pending one that names it; the original stays
/// dead and names its replay; the replay is claimed once; a second replay, a
/// requeue and a bulk requeue of the original are refused or pass it over.
pub async fn a_dead_message_is_replayed_once_as_a_new_one(o: OutboxUnderTest) {
    let exchange = unique_key("replay");
    let older = put(
        &o,
        vec![message(&exchange, "replay.key")],
        OutboxStatus::Dead,
    )
    .await[0];
    let original = message(&exchange, "replay.key");
    let id = put(&o, vec![original.clone()], OutboxStatus::Dead).await[0];
    let replay = edited(&original);
    o.operator
        .replay_message(id, replay.clone())
        .await
        .expect("replay");

    let old = record(&o, id).await.expect("the original is kept");
    assert_eq!(old.status, OutboxStatus::Dead, "the original stays dead");
    assert_eq!(old.replayed_as, Some(replay.id));
    assert_eq!(
        old.message.payload, original.payload,
        "the original unchanged"
    );
    let new = record(&o, replay.id).await.expect("the replay is stored");
    assert_eq!(new.status, OutboxStatus::Pending);
    assert_eq!(new.replayed_from, Some(id));
    assert_eq!(new.replayed_as, None);
    assert_eq!(new.message.payload, replay.payload);
    assert_eq!(
        new.message.headers.get("x-fixed").map(String::as_str),
        Some("yes")
    );
    assert_eq!(new.message.exchange, exchange);

    // The replay is published like any message: one claim takes it, once.
    let lease = outbox_ports::Lease::new(unique_key("replay"), LONG_TTL);
    let claimed = o.store.claim_pending(&lease, 100_000).await.expect("claim");
    let ours: Vec<MessageId> = claimed
        .iter()
        .map(|c| c.message.id)
        .filter(|m| *m == replay.id || *m == id)
        .collect();
    assert_eq!(
        ours,
        vec![replay.id],
        "the replay, not the original, is claimed"
    );
    let others: Vec<MessageId> = claimed
        .iter()
        .map(|c| c.message.id)
        .filter(|m| *m != replay.id)
        .collect();
    o.store.release(&lease, &others).await.expect("release");
    o.store.mark_sent(&lease, &[replay.id]).await.expect("sent");

    // Never a second run of the original beside its replay.
    let again = refused(
        o.operator.replay_message(id, edited(&original)).await,
        "a second replay",
    );
    assert!(again.contains("replayed already"), "{again}");
    let requeue = refused(o.operator.requeue_message(id).await, "a requeue");
    assert!(requeue.contains(&replay.id.to_string()), "{requeue}");
    let bulk = o
        .operator
        .requeue_matching(
            &MessageFilter {
                exchange: Some(exchange),
                status: Some(OutboxStatus::Dead),
                ..MessageFilter::default()
            },
            1,
        )
        .await
        .expect("bulk requeue");
    // Newest first, max 1: the replayed original is passed over, not taken as
    // the one row of the batch (which would change nothing and stop there).
    assert_eq!(
        (bulk.matched, bulk.changed),
        (1, 1),
        "a bulk requeue passes a replayed original over"
    );
    assert_eq!(
        record(&o, older).await.map(|r| r.status),
        Some(OutboxStatus::Pending)
    );
    assert_eq!(
        record(&o, id).await.map(|r| r.status),
        Some(OutboxStatus::Dead)
    );
}

/// Only a dead message without an ordering key is replayed; each refusal says why
/// and stores nothing (neither the replay nor a mark on the original).
pub async fn only_a_dead_unkeyed_message_is_replayed(o: OutboxUnderTest) {
    let exchange = unique_key("replay");
    for status in [
        OutboxStatus::Pending,
        OutboxStatus::PublishFailed,
        OutboxStatus::Sent,
    ] {
        let original = message(&exchange, "replay.key");
        let id = put(&o, vec![original.clone()], status).await[0];
        let replay = edited(&original);
        let why = refused(
            o.operator.replay_message(id, replay.clone()).await,
            "not dead",
        );
        assert!(why.contains("only a dead message"), "{why}");
        assert!(record(&o, replay.id).await.is_none(), "nothing stored");
        assert_eq!(record(&o, id).await.and_then(|r| r.replayed_as), None);
    }

    let mut keyed = message(&exchange, "replay.key");
    keyed.ordering_key = Some(unique_key("replay.order"));
    let id = put(&o, vec![keyed.clone()], OutboxStatus::Dead).await[0];
    let replay = edited(&keyed);
    let why = refused(o.operator.replay_message(id, replay.clone()).await, "keyed");
    assert!(why.contains("ordering key"), "{why}");
    assert!(record(&o, replay.id).await.is_none());

    let unknown = message(&exchange, "replay.key");
    assert!(matches!(
        o.operator
            .replay_message(unknown.id, edited(&unknown))
            .await,
        Err(PortError::NotFound { .. })
    ));

    // A replay that breaks a limit is refused before the original is marked.
    let original = message(&exchange, "replay.key");
    let id = put(&o, vec![original.clone()], OutboxStatus::Dead).await[0];
    let mut broken = edited(&original);
    broken.routing_key = "r".repeat(300);
    assert!(matches!(
        o.operator.replay_message(id, broken.clone()).await,
        Err(PortError::InvalidMessage(_))
    ));
    assert!(record(&o, broken.id).await.is_none());
    let kept = record(&o, id).await.expect("kept");
    assert_eq!(kept.replayed_as, None, "the original is not marked");
    o.operator
        .replay_message(id, edited(&original))
        .await
        .expect("a good replay afterwards");
}
