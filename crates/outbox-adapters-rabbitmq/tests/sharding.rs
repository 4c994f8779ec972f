//! A sharded exchange against the real broker: the relay's publisher puts each
//! key's messages on one shard, in order, and a queue of one shard sees them all.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use lapin::options::{ExchangeDeleteOptions, QueueDeleteOptions};
use outbox_adapters_rabbitmq::{
    BindingSpec, ExchangeKind, ExchangeSpec, QueueSpec, RabbitPublisher, RabbitPublisherConfig,
    RabbitSubscriber, Topology,
};
use outbox_core::shard::{shard_name, shard_of, shard_of_key};
use outbox_core::{Message, NewMessage, Timestamp};
use outbox_ports::{EXCHANGE_HEADER, Envelope, PublishOutcome, Publisher, Subscriber};

const SHARDS: u16 = 4;
const KEYS: usize = 8;
const PER_KEY: usize = 25;
const UNKEYED: usize = 60;

fn topology(exchange: &str, queue: &str, audit: &str) -> Topology {
    Topology {
        exchanges: vec![ExchangeSpec {
            name: exchange.to_owned(),
            kind: ExchangeKind::Topic,
            durable: true,
            shards: SHARDS,
        }],
        queues: vec![
            QueueSpec {
                shards: SHARDS,
                ..QueueSpec::durable(queue)
            },
            QueueSpec::durable(audit),
        ],
        bindings: [queue, audit]
            .into_iter()
            .map(|q| BindingSpec {
                queue: q.to_owned(),
                exchange: exchange.to_owned(),
                routing_key: "order.#".into(),
            })
            .collect(),
    }
}

fn messages(exchange: &str) -> Vec<Message> {
    let mut out = Vec::new();
    // Keys interleaved, as a relay's batch holds them.
    for seq in 0..PER_KEY {
        for k in 0..KEYS {
            let m = NewMessage::new(exchange, "order.created", b"{}".to_vec())
                .with_ordering_key(format!("customer-{k}"))
                .with_header("seq", seq.to_string());
            out.push(m.into_message(outbox_testkit::message("x", "k").id, Timestamp::now_utc()));
        }
    }
    for i in 0..UNKEYED {
        let m = NewMessage::new(exchange, "order.created", b"{}".to_vec())
            .with_header("seq", i.to_string());
        out.push(m.into_message(outbox_testkit::message("x", "k").id, Timestamp::now_utc()));
    }
    out
}

/// Every delivery of `queue` until `want` came, acknowledged.
async fn drain(sub: &RabbitSubscriber, queue: &str, want: usize) -> Vec<Envelope> {
    let mut stream = sub.subscribe(queue, 100).await.expect("subscribe");
    let mut got = Vec::new();
    while got.len() < want {
        match tokio::time::timeout(Duration::from_secs(3), stream.next()).await {
            Ok(Some(Ok(d))) => {
                d.acker.ack().await.expect("ack");
                got.push(d.envelope);
            }
            // Nothing more within 3 s: this queue has what it has.
            Err(_) => break,
            other => panic!("stream ended: {:?}", other.map(|o| o.map(|_| ()))),
        }
    }
    got
}

#[tokio::test]
async fn each_key_goes_to_one_shard_in_order_and_an_unsharded_queue_gets_the_stream() {
    with_broker!(|conn| {
        let names = common::Names::new("sharded");
        let audit = format!("{}.audit", names.queue);
        let topology = topology(&names.exchange, &names.queue, &audit);
        let publisher = RabbitPublisher::new(RabbitPublisherConfig::new(common::url()))
            .with_topology(topology.clone());
        let sent = messages(&names.exchange);
        let outcomes = publisher.publish(&sent).await;
        assert!(
            outcomes.iter().all(PublishOutcome::is_confirmed),
            "{outcomes:?}"
        );

        let sub = RabbitSubscriber::new(common::url());
        let mut total = 0;
        let mut key_shard: HashMap<String, u16> = HashMap::new();
        let mut unkeyed_per_shard = BTreeMap::new();
        for shard in 0..SHARDS {
            let queue = shard_name(&names.queue, shard);
            let want = sent.iter().filter(|m| shard_of(m, SHARDS) == shard).count();
            let got = drain(&sub, &queue, want).await;
            assert_eq!(got.len(), want, "shard {shard}");
            assert_eq!(
                common::depth(&conn, &queue).await,
                0,
                "nothing more on shard {shard}"
            );
            total += got.len();
            let mut last_seq: HashMap<String, usize> = HashMap::new();
            for env in &got {
                assert_eq!(env.exchange, names.exchange, "the exchange written for");
                assert!(!env.headers.contains_key(EXCHANGE_HEADER), "{env:?}");
                let seq: usize = env.headers["seq"].parse().expect("seq");
                match &env.ordering_key {
                    Some(key) => {
                        assert_eq!(shard, shard_of_key(key.as_bytes(), SHARDS), "{key}");
                        let before = key_shard.insert(key.clone(), shard);
                        assert!(before.is_none_or(|b| b == shard), "{key} on two shards");
                        let prev = last_seq.insert(key.clone(), seq);
                        assert!(
                            prev.is_none_or(|p| p + 1 == seq),
                            "{key}: {prev:?} then {seq}"
                        );
                    }
                    None => *unkeyed_per_shard.entry(shard).or_insert(0) += 1,
                }
            }
            for (key, last) in last_seq {
                assert_eq!(last, PER_KEY - 1, "{key} complete on shard {shard}");
            }
        }
        assert_eq!(total, sent.len(), "every message on exactly one shard");
        assert_eq!(key_shard.len(), KEYS);
        assert!(
            unkeyed_per_shard.len() > 1,
            "messages without a key spread by id: {unkeyed_per_shard:?}"
        );
        let whole = drain(&sub, &audit, sent.len()).await;
        assert_eq!(
            whole.len(),
            sent.len(),
            "the unsharded queue got the stream"
        );

        let ch = conn.create_channel().await.expect("channel");
        for q in topology.expanded().queues {
            let _ = ch
                .queue_delete(q.name.as_str().into(), QueueDeleteOptions::default())
                .await;
        }
        for x in topology.expanded().exchanges {
            let _ = ch
                .exchange_delete(x.name.as_str().into(), ExchangeDeleteOptions::default())
                .await;
        }
    });
}

#[tokio::test]
async fn a_missing_shard_exchange_fails_its_messages_naming_the_shard() {
    with_broker!(|conn| {
        let names = common::Names::new("sharded-missing");
        // The publisher knows the exchange is sharded, but nothing declared it.
        let declared = Topology {
            exchanges: vec![ExchangeSpec {
                name: names.exchange.clone(),
                kind: ExchangeKind::Topic,
                durable: true,
                shards: SHARDS,
            }],
            ..Topology::default()
        };
        let publisher = RabbitPublisher::new(RabbitPublisherConfig::new(common::url()))
            .with_topology(declared.clone());
        let ch = conn.create_channel().await.expect("channel");
        // The topology was declared on connect: take one shard away.
        let probe = publisher.publish(&messages(&names.exchange)[..1]).await;
        assert!(probe[0].is_confirmed() || matches!(probe[0], PublishOutcome::Unroutable(_)));
        let gone = shard_name(&names.exchange, 2);
        ch.exchange_delete(gone.as_str().into(), ExchangeDeleteOptions::default())
            .await
            .expect("delete a shard");
        let batch = messages(&names.exchange);
        let outcomes = publisher.publish(&batch).await;
        let mut failed = 0;
        for (m, o) in batch.iter().zip(&outcomes) {
            if let PublishOutcome::Failed(e) = o {
                // Only a message of the missing shard spends an attempt, and its
                // error names the shard.
                assert_eq!(shard_of(m, SHARDS), 2, "{e}");
                assert!(e.to_string().contains(&gone), "{e}");
                failed += 1;
            }
        }
        assert!(failed > 0, "{outcomes:?}");
        for x in declared.expanded().exchanges {
            let _ = ch
                .exchange_delete(x.name.as_str().into(), ExchangeDeleteOptions::default())
                .await;
        }
    });
}
