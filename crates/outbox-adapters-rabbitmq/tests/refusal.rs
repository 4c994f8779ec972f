//! A publish the broker refuses by closing the channel (403 ACCESS_REFUSED: no
//! write permission on one exchange; 406 PRECONDITION_FAILED: a body over the
//! broker's `max_message_size`) must cost an attempt only to the messages it was
//! about: the window's other messages, whose confirms fail with the same
//! channel error, are sent again without spending one.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{Names, depth};
use outbox_adapters_rabbitmq::{QueueSpec, RabbitPublisher, RabbitPublisherConfig};
use outbox_core::{Message, MessageId, NewMessage, Timestamp};
use outbox_ports::{PublishOutcome, Publisher};

fn rabbitmqctl(args: &[&str]) -> Result<(), String> {
    let out = Command::new("rabbitmqctl")
        .args(args)
        .output()
        .map_err(|e| format!("rabbitmqctl {}: {e}", args[0]))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "rabbitmqctl {}: {}",
            args[0],
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// A broker user of this test's own, deleted when dropped (also on a failure).
struct TestUser {
    name: String,
}

impl TestUser {
    /// A user that may configure and read everything and write everything but
    /// `forbidden`.
    fn writing_all_but(forbidden: &str) -> Self {
        let name = outbox_testkit::unique_key("refusal-user");
        rabbitmqctl(&["add_user", &name, "refusal-pass"]).expect("add the test user");
        let user = Self { name };
        let write = format!("^(?!{}$).*", forbidden.replace('.', "\\."));
        rabbitmqctl(&["set_permissions", "-p", "/", &user.name, ".*", &write, ".*"])
            .expect("set the test user's permissions");
        user
    }

    fn url(&self) -> String {
        let base = common::url();
        let host = base.rsplit_once('@').map_or(base.as_str(), |(_, h)| h);
        format!("amqp://{}:refusal-pass@{host}", self.name)
    }
}

impl Drop for TestUser {
    fn drop(&mut self) {
        if let Err(e) = rabbitmqctl(&["delete_user", &self.name]) {
            eprintln!("could not delete the test user {}: {e}", self.name);
        }
    }
}

/// The broker's `max_message_size`, set for a test and put back as it was when
/// dropped (also on a failure). Only this file's tests run beside it, and their
/// bodies are far below the limit set.
struct MaxMessageSize {
    was: String,
}

impl MaxMessageSize {
    fn set(bytes: usize) -> Self {
        let out = Command::new("rabbitmqctl")
            .args(["eval", "application:get_env(rabbit, max_message_size)."])
            .output()
            .expect("rabbitmqctl eval");
        let text = String::from_utf8_lossy(&out.stdout);
        let was = text
            .trim()
            .strip_prefix("{ok,")
            .and_then(|t| t.strip_suffix('}'))
            .unwrap_or_else(|| panic!("max_message_size unreadable: {text}"))
            .to_owned();
        let guard = Self { was };
        rabbitmqctl(&[
            "eval",
            &format!("application:set_env(rabbit, max_message_size, {bytes})."),
        ])
        .expect("set max_message_size");
        guard
    }
}

impl Drop for MaxMessageSize {
    fn drop(&mut self) {
        let put_back = format!(
            "application:set_env(rabbit, max_message_size, {}).",
            self.was
        );
        if let Err(e) = rabbitmqctl(&["eval", &put_back]) {
            eprintln!("could not put max_message_size back to {}: {e}", self.was);
        }
    }
}

fn messages(exchange: &str, n: usize) -> Vec<Message> {
    sized(exchange, n, 32)
}

fn sized(exchange: &str, n: usize, size: usize) -> Vec<Message> {
    (0..n)
        .map(|i| {
            NewMessage::new(exchange, "order.created", vec![b'x'; size])
                .with_header("seq", i.to_string())
                .into_message(
                    MessageId::from_uuid(*outbox_testkit::message("k", "k").id.as_uuid()),
                    Timestamp::now_utc(),
                )
        })
        .collect()
}

#[tokio::test]
async fn a_refused_exchange_spends_attempts_only_on_its_own_messages() {
    with_broker!(|conn| {
        let (refused, allowed) = (Names::new("no-write"), Names::new("may-write"));
        for n in [&refused, &allowed] {
            n.topology(QueueSpec::durable(&n.queue))
                .declare(&conn)
                .await
                .expect("declare");
        }
        let user = TestUser::writing_all_but(&refused.exchange);
        let p = RabbitPublisher::new(RabbitPublisherConfig::new(user.url()));
        // The refused exchange's messages among the allowed one's, in one window.
        let mut batch = Vec::new();
        for (a, b) in messages(&allowed.exchange, 60)
            .into_iter()
            .zip(messages(&refused.exchange, 60))
        {
            batch.push(a);
            batch.push(b);
        }
        let mut pending = batch.clone();
        let mut spent_on_allowed = Vec::new();
        let mut refused_seen = false;
        let mut last = Vec::new();
        // Batches until every allowed message is confirmed; a refused message is
        // given up once it has spent an attempt (as max_attempts = 1 would). A
        // message after the refused one may never be handed over (the close can
        // arrive while the window is still being written): given back, as the
        // relay would, so each batch spends at least the first culprit's attempt.
        for round in 0..200 {
            if pending.iter().all(|m| m.exchange == refused.exchange) {
                break;
            }
            let outcomes = p.publish_within(&pending, Duration::from_secs(30)).await;
            let mut again = Vec::new();
            for (m, o) in pending.iter().zip(&outcomes) {
                let own_fault = m.exchange == refused.exchange;
                match o {
                    PublishOutcome::Confirmed => {
                        assert!(!own_fault, "round {round}: a refused message confirmed");
                    }
                    PublishOutcome::NotSent(why) => {
                        last.push(format!("round {round}: {why}"));
                        again.push(m.clone());
                    }
                    other if own_fault => {
                        refused_seen = true;
                        assert!(
                            other.to_string().contains("403")
                                || other.to_string().contains("ACCESS_REFUSED"),
                            "round {round}: the refusal is named: {other}"
                        );
                    }
                    other => spent_on_allowed.push(format!("round {round}: {other}")),
                }
            }
            pending = again;
        }
        assert!(refused_seen, "the broker refused the forbidden exchange");
        assert!(
            spent_on_allowed.is_empty(),
            "{} allowed messages spent an attempt for another exchange's refusal: {:?}",
            spent_on_allowed.len(),
            &spent_on_allowed[..spent_on_allowed.len().min(5)]
        );
        assert!(
            pending.iter().all(|m| m.exchange == refused.exchange),
            "every allowed message confirmed within 200 batches; {} left, the last given back: {:?}",
            pending.len(),
            last.iter().rev().take(3).collect::<Vec<_>>()
        );
        assert!(depth(&conn, &allowed.queue).await >= 60);
        drop(user);
        refused.delete(&conn).await;
        allowed.delete(&conn).await;
    });
}

#[tokio::test]
async fn a_body_over_the_brokers_limit_spends_attempts_only_on_itself() {
    with_broker!(|conn| {
        let names = Names::new("oversize");
        names
            .topology(QueueSpec::durable(&names.queue))
            .declare(&conn)
            .await
            .expect("declare");
        let limit = MaxMessageSize::set(100_000);
        let p = RabbitPublisher::new(RabbitPublisherConfig::new(common::url()));
        let mut batch = Vec::new();
        for (a, b) in
            messages(&names.exchange, 40)
                .into_iter()
                .zip(sized(&names.exchange, 40, 150_000))
        {
            batch.push(a);
            batch.push(b);
        }
        let mut pending = batch;
        let mut spent_on_small = Vec::new();
        let mut refused_seen = false;
        // As above: until every small message is confirmed.
        for round in 0..200 {
            if pending.iter().all(|m| m.payload.len() > 100_000) {
                break;
            }
            let outcomes = p.publish_within(&pending, Duration::from_secs(30)).await;
            let mut again = Vec::new();
            for (m, o) in pending.iter().zip(&outcomes) {
                let own_fault = m.payload.len() > 100_000;
                match o {
                    PublishOutcome::Confirmed => {
                        assert!(!own_fault, "round {round}: an oversized message confirmed");
                    }
                    PublishOutcome::NotSent(_) => again.push(m.clone()),
                    other if own_fault => {
                        refused_seen = true;
                        assert!(other.to_string().contains("max size"), "{other}");
                    }
                    other => spent_on_small.push(format!("round {round}: {other}")),
                }
            }
            pending = again;
        }
        drop(limit);
        assert!(refused_seen, "the broker refused the oversized bodies");
        assert!(
            spent_on_small.is_empty(),
            "{} small messages spent an attempt for another message's size: {:?}",
            spent_on_small.len(),
            &spent_on_small[..spent_on_small.len().min(5)]
        );
        assert!(
            pending.iter().all(|m| m.payload.len() > 100_000),
            "every small message confirmed within 200 batches"
        );
        names.delete(&conn).await;
    });
}
