//! Exchanges, queues and bindings from configuration, declared idempotently.

use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use outbox_ports::PortError;

use crate::port;

/// How an exchange routes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExchangeKind {
    /// Routing key equals binding key.
    Direct,
    /// Dotted patterns with `*` and `#`.
    Topic,
    /// Every bound queue.
    Fanout,
    /// Matches on headers.
    Headers,
}

/// An exchange to declare.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExchangeSpec {
    /// Name.
    pub name: String,
    /// Kind.
    pub kind: ExchangeKind,
    /// Survives a broker restart.
    pub durable: bool,
}

/// Classic or quorum queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueType {
    /// A classic queue.
    Classic,
    /// A replicated quorum queue (always durable).
    Quorum,
}

/// A queue to declare.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueSpec {
    /// Name.
    pub name: String,
    /// Classic or quorum.
    pub queue_type: QueueType,
    /// Survives a broker restart.
    pub durable: bool,
    /// Where rejected or expired messages go.
    pub dead_letter_exchange: Option<String>,
    /// `x-max-length`.
    pub max_length: Option<i64>,
    /// `x-overflow` (`drop-head`, `reject-publish`, `reject-publish-dlx`).
    pub overflow: Option<String>,
}

impl QueueSpec {
    /// A durable classic queue.
    pub fn durable(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            queue_type: QueueType::Classic,
            durable: true,
            dead_letter_exchange: None,
            max_length: None,
            overflow: None,
        }
    }
}

/// A binding of a queue to an exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindingSpec {
    /// The queue.
    pub queue: String,
    /// The exchange.
    pub exchange: String,
    /// The binding key.
    pub routing_key: String,
}

/// Everything to declare at start.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Topology {
    /// Exchanges.
    pub exchanges: Vec<ExchangeSpec>,
    /// Queues.
    pub queues: Vec<QueueSpec>,
    /// Bindings.
    pub bindings: Vec<BindingSpec>,
}

impl Topology {
    /// Declares everything (idempotent: declaring what exists with the same settings
    /// changes nothing).
    ///
    /// # Errors
    /// The first declaration the broker refuses (e.g. an existing queue with other
    /// settings), or a connection failure.
    pub async fn declare(&self, connection: &lapin::Connection) -> Result<(), PortError> {
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| port("open channel", "channel", "", &e))?;
        for x in &self.exchanges {
            let kind = match x.kind {
                ExchangeKind::Direct => lapin::ExchangeKind::Direct,
                ExchangeKind::Topic => lapin::ExchangeKind::Topic,
                ExchangeKind::Fanout => lapin::ExchangeKind::Fanout,
                ExchangeKind::Headers => lapin::ExchangeKind::Headers,
            };
            let options = ExchangeDeclareOptions {
                durable: x.durable,
                ..ExchangeDeclareOptions::default()
            };
            channel
                .exchange_declare(x.name.as_str().into(), kind, options, FieldTable::default())
                .await
                .map_err(|e| port("declare exchange", "exchange", &x.name, &e))?;
        }
        for q in &self.queues {
            let mut args = FieldTable::default();
            if q.queue_type == QueueType::Quorum {
                args.insert(
                    "x-queue-type".into(),
                    AMQPValue::LongString("quorum".into()),
                );
            }
            if let Some(dlx) = &q.dead_letter_exchange {
                args.insert(
                    ShortString::from("x-dead-letter-exchange"),
                    AMQPValue::LongString(dlx.as_str().into()),
                );
            }
            if let Some(n) = q.max_length {
                args.insert("x-max-length".into(), AMQPValue::LongLongInt(n));
            }
            if let Some(o) = &q.overflow {
                args.insert(
                    "x-overflow".into(),
                    AMQPValue::LongString(o.as_str().into()),
                );
            }
            let options = QueueDeclareOptions {
                durable: q.durable || q.queue_type == QueueType::Quorum,
                ..QueueDeclareOptions::default()
            };
            channel
                .queue_declare(q.name.as_str().into(), options, args)
                .await
                .map_err(|e| port("declare queue", "queue", &q.name, &e))?;
        }
        for b in &self.bindings {
            channel
                .queue_bind(
                    b.queue.as_str().into(),
                    b.exchange.as_str().into(),
                    b.routing_key.as_str().into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map_err(|e| port("bind queue", "exchange", &b.exchange, &e))?;
        }
        let _ = channel.close(200, "declared".into()).await;
        Ok(())
    }
}
