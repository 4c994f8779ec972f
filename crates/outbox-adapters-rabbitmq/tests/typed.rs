//! Typed messages through RabbitMQ: arbitrary values, made messages by
//! `to_new_message`, published with confirms, received by the subscriber and
//! decoded, come back equal, with their type, version header, content type and
//! correlation id intact.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use common::Names;
use outbox_adapters_rabbitmq::{
    QueueSpec, RabbitPublisher, RabbitPublisherConfig, RabbitSubscriber,
};
use outbox_core::event::{VERSION_HEADER, decode, to_new_message};
use outbox_core::{Event, Message, MessageId, Timestamp};
use outbox_ports::{PublishOutcome, Publisher, Subscriber};
use proptest::prelude::*;
use proptest::strategy::ValueTree as _;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Anything {
    id: u64,
    amount: i64,
    name: String,
    note: Option<String>,
    tags: Vec<String>,
    flags: BTreeMap<String, bool>,
}

impl Event for Anything {
    const TYPE: &'static str = "anything.happened";
    const VERSION: u32 = 3;
    const EXCHANGE: &'static str = "unused";
}

fn anything() -> impl Strategy<Value = Anything> {
    (
        any::<u64>(),
        any::<i64>(),
        ".{0,40}",
        proptest::option::of(".{0,20}"),
        proptest::collection::vec(".{0,10}", 0..5),
        proptest::collection::btree_map(".{0,8}", any::<bool>(), 0..4),
    )
        .prop_map(|(id, amount, name, note, tags, flags)| Anything {
            id,
            amount,
            name,
            note,
            tags,
            flags,
        })
}

#[tokio::test]
async fn arbitrary_values_cross_the_broker_and_decode_equal() {
    let Some(conn) = common::connection().await else {
        return;
    };
    let names = Names::new("typed");
    names
        .topology(QueueSpec::durable(&names.queue))
        .declare(&conn)
        .await
        .expect("declare");
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let sent: Vec<Anything> = (0..200)
        .map(|_| anything().new_tree(&mut runner).expect("value").current())
        .collect();
    let messages: Vec<Message> = sent
        .iter()
        .map(|v| {
            let mut m = to_new_message(v)
                .expect("encodes")
                .with_correlation_id(format!("c-{}", v.id))
                .into_message(outbox_testkit::message("k", "k").id, Timestamp::now_utc());
            m.exchange.clone_from(&names.exchange);
            m
        })
        .collect();
    let publisher = RabbitPublisher::new(RabbitPublisherConfig::new(common::url()));
    assert!(
        publisher
            .publish(&messages)
            .await
            .iter()
            .all(PublishOutcome::is_confirmed)
    );
    let expected: HashMap<MessageId, &Anything> =
        messages.iter().map(|m| m.id).zip(&sent).collect();
    let sub = RabbitSubscriber::new(common::url());
    let mut stream = sub.subscribe(&names.queue, 50).await.expect("subscribe");
    let mut seen = 0;
    while seen < sent.len() {
        let d = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("a delivery in time")
            .expect("open")
            .expect("delivery");
        let m = d
            .envelope
            .to_message(Timestamp::now_utc())
            .expect("a message");
        let value: Anything = decode(&m).expect("decodes");
        assert_eq!(Some(&&value), expected.get(&m.id), "{m:?}");
        assert_eq!(m.message_type.as_deref(), Some(Anything::TYPE));
        assert_eq!(m.headers.get(VERSION_HEADER).map(String::as_str), Some("3"));
        assert_eq!(m.content_type, "application/json");
        assert_eq!(m.correlation_id, Some(format!("c-{}", value.id)));
        d.acker.ack().await.expect("ack");
        seen += 1;
    }
    drop(stream);
    names.delete(&conn).await;
}
