//! Test harness: the broker at `OUTBOX_TEST_AMQP_URL` (default: the local one) and
//! names of their own per test.

#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use lapin::options::{ExchangeDeleteOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use outbox_adapters_rabbitmq::{
    BindingSpec, ExchangeKind, ExchangeSpec, QueueSpec, Topology, connect,
};
use outbox_core::config::redact_url;

pub const DEFAULT_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

pub fn url() -> String {
    outbox_testkit::services::TestUrls::from_env().amqp
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// A connection, or `None` outside CI (the test then says it is skipped). In CI an
/// unreachable broker fails the test, naming the URL tried.
pub async fn connection() -> Option<lapin::Connection> {
    let url = url();
    match connect(&url, Duration::from_secs(5)).await {
        Ok(c) => Some(c),
        Err(e) if in_ci() => panic!(
            "RabbitMQ is required in CI and unreachable at {} (set OUTBOX_TEST_AMQP_URL): {e}",
            redact_url(&url)
        ),
        Err(e) => {
            eprintln!(
                "SKIPPED (not in CI): RabbitMQ unreachable at {} (set OUTBOX_TEST_AMQP_URL): {e}",
                redact_url(&url)
            );
            None
        }
    }
}

/// One exchange and one queue bound with `#`, named for this test.
pub struct Names {
    pub exchange: String,
    pub queue: String,
}

impl Names {
    pub fn new(test: &str) -> Self {
        let id = outbox_testkit::unique_key(test);
        Self {
            exchange: format!("outbox-test.{id}.x"),
            queue: format!("outbox-test.{id}.q"),
        }
    }

    pub fn topology(&self, queue: QueueSpec) -> Topology {
        Topology {
            exchanges: vec![ExchangeSpec {
                name: self.exchange.clone(),
                kind: ExchangeKind::Topic,
                durable: true,
                shards: 1,
            }],
            bindings: vec![BindingSpec {
                queue: queue.name.clone(),
                exchange: self.exchange.clone(),
                routing_key: "#".into(),
            }],
            queues: vec![queue],
        }
    }

    pub async fn delete(&self, conn: &lapin::Connection) {
        if let Ok(ch) = conn.create_channel().await {
            let _ = ch
                .queue_delete(self.queue.as_str().into(), QueueDeleteOptions::default())
                .await;
            let _ = ch
                .exchange_delete(
                    self.exchange.as_str().into(),
                    ExchangeDeleteOptions::default(),
                )
                .await;
        }
    }
}

/// Messages ready in `queue` (passive declare).
pub async fn depth(conn: &lapin::Connection, queue: &str) -> u32 {
    let ch = conn.create_channel().await.expect("channel");
    let q = ch
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("passive declare");
    q.message_count()
}

/// Runs `$body` with a connection, or reports the skip.
#[macro_export]
macro_rules! with_broker {
    (|$conn:ident| $body:block) => {{
        let Some($conn) = common::connection().await else {
            return;
        };
        $body
    }};
}
