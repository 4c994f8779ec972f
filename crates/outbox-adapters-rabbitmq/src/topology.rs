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

/// What a queue at its `max_length` does with the next message (`x-overflow`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Overflow {
    /// Refuse the publish: the broker nacks it, so the relay keeps the message and
    /// retries it. The safe choice for an outbox.
    RejectPublish,
    /// As `RejectPublish`, and the refused message is also dead-lettered.
    RejectPublishDlx,
    /// Drop the oldest message in the queue, which the broker already confirmed:
    /// that message is lost without a trace. Only for data you can afford to lose.
    DropHead,
}

impl Overflow {
    /// The `x-overflow` value.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::RejectPublish => "reject-publish",
            Self::RejectPublishDlx => "reject-publish-dlx",
            Self::DropHead => "drop-head",
        }
    }
}

/// Queue settings that would lose messages, or that the broker would refuse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TopologyError {
    /// `max_length` without `overflow`: RabbitMQ would drop the oldest messages
    /// (`drop-head`), already confirmed, without a trace.
    #[error(
        "queue {queue}: max_length needs an explicit overflow (reject-publish or reject-publish-dlx; drop-head only if losing the oldest confirmed messages is acceptable)"
    )]
    MaxLengthWithoutOverflow {
        /// The queue.
        queue: String,
    },
    /// A negative `max_length`.
    #[error("queue {queue}: max_length must not be negative (got {max_length})")]
    NegativeMaxLength {
        /// The queue.
        queue: String,
        /// What was given.
        max_length: i64,
    },
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
    /// `x-max-length`. Requires `overflow`: RabbitMQ's default (drop-head) would
    /// drop confirmed messages.
    pub max_length: Option<i64>,
    /// `x-overflow`: what a full queue does (required with `max_length`).
    pub overflow: Option<Overflow>,
}

impl QueueSpec {
    /// Checks settings that would lose messages (a length cap with RabbitMQ's
    /// default drop-head) or that the broker would refuse.
    ///
    /// # Errors
    /// [`TopologyError`] naming the queue and the field.
    pub fn validate(&self) -> Result<(), TopologyError> {
        match (self.max_length, self.overflow) {
            (Some(n), _) if n < 0 => Err(TopologyError::NegativeMaxLength {
                queue: self.name.clone(),
                max_length: n,
            }),
            (Some(_), None) => Err(TopologyError::MaxLengthWithoutOverflow {
                queue: self.name.clone(),
            }),
            _ => Ok(()),
        }
    }

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
    /// Checks every queue (see [`QueueSpec::validate`]).
    ///
    /// # Errors
    /// The first [`TopologyError`].
    pub fn validate(&self) -> Result<(), TopologyError> {
        self.queues.iter().try_for_each(QueueSpec::validate)
    }

    /// Declares everything (idempotent: declaring what exists with the same settings
    /// changes nothing), after [`Topology::validate`]: nothing is declared when a
    /// setting is refused.
    ///
    /// # Errors
    /// A fatal [`PortError`] for a refused setting; the first declaration the broker
    /// refuses (e.g. an existing queue with other settings), or a connection failure.
    pub async fn declare(&self, connection: &lapin::Connection) -> Result<(), PortError> {
        self.validate()
            .map_err(|e| PortError::fatal("declare topology", e.to_string()))?;
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
            if let Some(o) = q.overflow {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn capped(max_length: i64, overflow: Option<Overflow>) -> QueueSpec {
        QueueSpec {
            max_length: Some(max_length),
            overflow,
            ..QueueSpec::durable("orders")
        }
    }

    #[test]
    fn a_length_cap_needs_an_explicit_overflow_mode() {
        let err = capped(5, None)
            .validate()
            .expect_err("drop-head by default");
        assert_eq!(
            err,
            TopologyError::MaxLengthWithoutOverflow {
                queue: "orders".into()
            }
        );
        let text = err.to_string();
        assert!(
            text.contains("orders") && text.contains("overflow"),
            "{text}"
        );
        for o in [
            Overflow::RejectPublish,
            Overflow::RejectPublishDlx,
            Overflow::DropHead,
        ] {
            assert_eq!(
                capped(5, Some(o)).validate(),
                Ok(()),
                "{o:?} chosen explicitly"
            );
        }
        assert!(matches!(
            capped(-1, Some(Overflow::RejectPublish)).validate(),
            Err(TopologyError::NegativeMaxLength { max_length: -1, .. })
        ));
        assert_eq!(QueueSpec::durable("plain").validate(), Ok(()));
        let topology = Topology {
            queues: vec![QueueSpec::durable("a"), capped(1, None)],
            ..Topology::default()
        };
        assert!(
            topology.validate().is_err(),
            "one bad queue refuses the whole topology"
        );
    }

    #[test]
    fn overflow_modes_have_their_broker_names() {
        assert_eq!(Overflow::RejectPublish.as_str(), "reject-publish");
        assert_eq!(Overflow::RejectPublishDlx.as_str(), "reject-publish-dlx");
        assert_eq!(Overflow::DropHead.as_str(), "drop-head");
    }
}
