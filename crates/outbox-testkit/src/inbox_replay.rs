//! The inbox's replay contract
//! ([`outbox_ports::InboxOperator::replay_delivery`]): a dead delivery replayed
//! once as a new one that the consume sweep takes, its original kept dead and
//! never run again beside it.

use outbox_core::{InboxStatus, MessageId};
use outbox_ports::PortError;

use crate::replay::{edited, refused};
use crate::{LONG_TTL, message, unique_key};

/// A dead delivery replays as a new received one, due now, that names it: the
/// consume sweep's claim takes the replay and never the original; the original
/// stays dead, and neither a reconsume nor a second replay runs it again (a bulk
/// reconsume passes it over). A delivery not dead, or unknown, is refused.
pub async fn a_dead_delivery_is_replayed_once_as_a_new_one(
    i: crate::inbox_operator::InboxUnderTest,
) {
    let consumer = unique_key("replay-consumer");
    let older = message("replay", "replay.key");
    crate::inbox_operator::put(
        &i,
        &consumer,
        std::slice::from_ref(&older),
        InboxStatus::Dead,
    )
    .await;
    let original = message("replay", "replay.key");
    crate::inbox_operator::put(
        &i,
        &consumer,
        std::slice::from_ref(&original),
        InboxStatus::Dead,
    )
    .await;
    let replay = edited(&original);
    i.operator
        .replay_delivery(&consumer, original.id, replay.clone())
        .await
        .expect("replay");

    let get = |id: MessageId| {
        let i = i.clone();
        let consumer = consumer.clone();
        async move { i.operator.get_delivery(&consumer, id).await.expect("get") }
    };
    let old = get(original.id).await.expect("kept");
    assert_eq!(old.status, InboxStatus::Dead);
    assert_eq!(old.replayed_as, Some(replay.id));
    let new = get(replay.id).await.expect("stored");
    assert_eq!(new.status, InboxStatus::Received);
    assert_eq!(new.replayed_from, Some(original.id));
    assert_eq!(new.message.payload, replay.payload);

    // The consume sweep takes the replay, due now, and not the original.
    let lease = outbox_ports::Lease::new(unique_key("replay"), LONG_TTL);
    let claimed: Vec<MessageId> = i
        .store
        .claim_due(&consumer, &lease, 100)
        .await
        .expect("claim")
        .iter()
        .map(|c| c.message.id)
        .collect();
    assert_eq!(claimed, vec![replay.id]);
    assert!(
        i.store
            .mark_consumed(&consumer, replay.id, &lease)
            .await
            .expect("consumed")
    );

    let again = refused(
        i.operator
            .replay_delivery(&consumer, original.id, edited(&original))
            .await,
        "a second replay",
    );
    assert!(again.contains("replayed already"), "{again}");
    let reconsume = refused(
        i.operator
            .reconsume_delivery(&consumer, original.id, false)
            .await,
        "a reconsume",
    );
    assert!(reconsume.contains(&replay.id.to_string()), "{reconsume}");
    let bulk = i
        .operator
        .reconsume_matching(
            &consumer,
            &outbox_ports::DeliveryFilter {
                status: Some(InboxStatus::Dead),
                ..outbox_ports::DeliveryFilter::default()
            },
            1,
        )
        .await
        .expect("bulk reconsume");
    assert_eq!(
        (bulk.matched, bulk.changed),
        (1, 1),
        "the replayed one passed over"
    );
    assert_eq!(
        get(older.id).await.map(|r| r.status),
        Some(InboxStatus::Received)
    );
    assert_eq!(
        get(original.id).await.map(|r| r.status),
        Some(InboxStatus::Dead)
    );

    let received = message("replay", "replay.key");
    crate::inbox_operator::put(
        &i,
        &consumer,
        std::slice::from_ref(&received),
        InboxStatus::Received,
    )
    .await;
    let why = refused(
        i.operator
            .replay_delivery(&consumer, received.id, edited(&received))
            .await,
        "not dead",
    );
    assert!(why.contains("only a dead delivery"), "{why}");
    let unknown = message("replay", "replay.key");
    assert!(matches!(
        i.operator
            .replay_delivery(&consumer, unknown.id, edited(&unknown))
            .await,
        Err(PortError::NotFound { .. })
    ));
}
