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
    /// `delivery_limit` on a classic queue, which has none.
    #[error(
        "queue {queue}: delivery_limit is for quorum queues only (a classic queue has no delivery limit)"
    )]
    DeliveryLimitOnClassic {
        /// The queue.
        queue: String,
    },
    /// A `delivery_limit` of 0: the broker would give up on every message.
    #[error("queue {queue}: delivery_limit must be at least 1")]
    ZeroDeliveryLimit {
        /// The queue.
        queue: String,
    },
    /// A delivery limit without a dead-letter exchange and queue: the broker would
    /// drop every message that reaches it, without a trace.
    #[error(
        "queue {queue}: a delivery_limit needs dead_letter_exchange and dead_letter_queue, so that what the broker gives up on is kept and drained into the consumer's dead letters (missing: {missing})"
    )]
    DeliveryLimitWithoutDeadLetters {
        /// The queue.
        queue: String,
        /// The setting missing.
        missing: &'static str,
    },
    /// A dead-letter queue without a dead-letter exchange to route to it.
    #[error("queue {queue}: dead_letter_queue needs dead_letter_exchange")]
    DeadLetterQueueWithoutExchange {
        /// The queue.
        queue: String,
    },
    /// A dead-letter queue named as the queue itself.
    #[error("queue {queue}: dead_letter_queue must be another queue")]
    DeadLetterQueueIsItself {
        /// The queue.
        queue: String,
    },
    /// Two queues dead-lettering into one dead-letter queue: the consumer draining
    /// it would keep another queue's given-up deliveries as its own dead letters,
    /// and a reconsume would run the wrong handler.
    #[error(
        "queue {queue}: dead_letter_queue {dead_letter_queue} is also queue {other}'s; give each queue a dead-letter queue of its own"
    )]
    SharedDeadLetterQueue {
        /// The queue.
        queue: String,
        /// The other queue with the same dead-letter queue.
        other: String,
        /// The dead-letter queue both name.
        dead_letter_queue: String,
    },
    /// With a delivery limit, dead-lettering is at least once, which RabbitMQ
    /// allows only with `overflow = reject-publish`.
    #[error(
        "queue {queue}: a delivery_limit dead-letters at least once, which needs overflow reject-publish (or none), not {overflow}"
    )]
    DeliveryLimitNeedsRejectPublish {
        /// The queue.
        queue: String,
        /// The overflow given.
        overflow: &'static str,
    },
}

impl TopologyError {
    /// The queue setting at fault, as `[[topology.queues]]` names it.
    #[must_use]
    pub const fn field(&self) -> &'static str {
        match self {
            Self::MaxLengthWithoutOverflow { .. } | Self::NegativeMaxLength { .. } => "max_length",
            Self::DeliveryLimitOnClassic { .. } | Self::ZeroDeliveryLimit { .. } => {
                "delivery_limit"
            }
            Self::DeliveryLimitWithoutDeadLetters { missing, .. } => missing,
            Self::DeadLetterQueueWithoutExchange { .. } => "dead_letter_exchange",
            Self::DeadLetterQueueIsItself { .. } | Self::SharedDeadLetterQueue { .. } => {
                "dead_letter_queue"
            }
            Self::DeliveryLimitNeedsRejectPublish { .. } => "overflow",
        }
    }
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
    /// Where rejected or expired messages go (`x-dead-letter-exchange`). With a
    /// `dead_letter_queue`, declared as a direct exchange and routed to it by this
    /// queue's name (`x-dead-letter-routing-key`), so several queues can share it.
    pub dead_letter_exchange: Option<String>,
    /// The queue dead-lettered messages land in, declared (durable, classic: a
    /// classic queue has no delivery limit of its own, also on RabbitMQ 4, whose
    /// quorum queues default to 20) and bound to `dead_letter_exchange`. A
    /// consumer drains it into its own dead letters
    /// (`ConsumerConfig::dead_letter_queue` in outbox-consumer).
    pub dead_letter_queue: Option<String>,
    /// `x-delivery-limit` (quorum only): how many times a delivery may be returned
    /// before the broker gives up on it and dead-letters it. Requires
    /// `dead_letter_exchange` and `dead_letter_queue`, and makes dead-lettering at
    /// least once (`x-dead-letter-strategy`), so nothing past the limit is dropped.
    pub delivery_limit: Option<u32>,
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
        let queue = self.name.clone();
        match (self.max_length, self.overflow) {
            (Some(n), _) if n < 0 => {
                return Err(TopologyError::NegativeMaxLength {
                    queue,
                    max_length: n,
                });
            }
            (Some(_), None) => return Err(TopologyError::MaxLengthWithoutOverflow { queue }),
            _ => {}
        }
        if let Some(dlq) = &self.dead_letter_queue {
            if self.dead_letter_exchange.is_none() {
                return Err(TopologyError::DeadLetterQueueWithoutExchange { queue });
            }
            if *dlq == self.name {
                return Err(TopologyError::DeadLetterQueueIsItself { queue });
            }
        }
        if let Some(limit) = self.delivery_limit {
            if self.queue_type != QueueType::Quorum {
                return Err(TopologyError::DeliveryLimitOnClassic { queue });
            }
            if limit == 0 {
                return Err(TopologyError::ZeroDeliveryLimit { queue });
            }
            if self.dead_letter_exchange.is_none() {
                return Err(TopologyError::DeliveryLimitWithoutDeadLetters {
                    queue,
                    missing: "dead_letter_exchange",
                });
            }
            if self.dead_letter_queue.is_none() {
                return Err(TopologyError::DeliveryLimitWithoutDeadLetters {
                    queue,
                    missing: "dead_letter_queue",
                });
            }
            if let Some(o) = self.overflow
                && o != Overflow::RejectPublish
            {
                return Err(TopologyError::DeliveryLimitNeedsRejectPublish {
                    queue,
                    overflow: o.as_str(),
                });
            }
        }
        Ok(())
    }

    /// The queue arguments of this spec.
    fn arguments(&self) -> FieldTable {
        let mut args = FieldTable::default();
        if self.queue_type == QueueType::Quorum {
            args.insert(
                "x-queue-type".into(),
                AMQPValue::LongString("quorum".into()),
            );
        }
        if let Some(dlx) = &self.dead_letter_exchange {
            args.insert(
                ShortString::from("x-dead-letter-exchange"),
                AMQPValue::LongString(dlx.as_str().into()),
            );
            if self.dead_letter_queue.is_some() {
                args.insert(
                    ShortString::from("x-dead-letter-routing-key"),
                    AMQPValue::LongString(self.name.as_str().into()),
                );
            }
        }
        if let Some(n) = self.max_length {
            args.insert("x-max-length".into(), AMQPValue::LongLongInt(n));
        }
        let mut overflow = self.overflow;
        if let Some(limit) = self.delivery_limit {
            args.insert(
                "x-delivery-limit".into(),
                AMQPValue::LongLongInt(i64::from(limit)),
            );
            // At most once (the default) drops a dead-lettered message the
            // dead-letter queue does not confirm; at least once keeps it in this
            // queue until it does. RabbitMQ allows it only with reject-publish,
            // which without a max_length never refuses anything.
            args.insert(
                "x-dead-letter-strategy".into(),
                AMQPValue::LongString("at-least-once".into()),
            );
            overflow = Some(Overflow::RejectPublish);
        }
        if let Some(o) = overflow {
            args.insert(
                "x-overflow".into(),
                AMQPValue::LongString(o.as_str().into()),
            );
        }
        args
    }

    /// A durable classic queue.
    pub fn durable(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            queue_type: QueueType::Classic,
            durable: true,
            dead_letter_exchange: None,
            dead_letter_queue: None,
            delivery_limit: None,
            max_length: None,
            overflow: None,
        }
    }

    /// A quorum queue whose deliveries the broker gives up on after `limit`
    /// returns, dead-lettering them through `dead_letter_exchange` into
    /// `dead_letter_queue`.
    pub fn quorum_with_limit(
        name: impl Into<String>,
        limit: u32,
        dead_letter_exchange: impl Into<String>,
        dead_letter_queue: impl Into<String>,
    ) -> Self {
        Self {
            queue_type: QueueType::Quorum,
            dead_letter_exchange: Some(dead_letter_exchange.into()),
            dead_letter_queue: Some(dead_letter_queue.into()),
            delivery_limit: Some(limit),
            ..Self::durable(name)
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
        self.queues.iter().try_for_each(QueueSpec::validate)?;
        for (i, q) in self.queues.iter().enumerate() {
            let Some(dlq) = &q.dead_letter_queue else {
                continue;
            };
            if let Some(other) = self.queues[..i]
                .iter()
                .find(|o| o.dead_letter_queue.as_ref() == Some(dlq))
            {
                return Err(TopologyError::SharedDeadLetterQueue {
                    queue: q.name.clone(),
                    other: other.name.clone(),
                    dead_letter_queue: dlq.clone(),
                });
            }
        }
        Ok(())
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
        let mut channel = connection
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
            // The dead-letter exchange and queue first: a queue with a delivery
            // limit must never dead-letter into nothing.
            if let (Some(dlx), Some(dlq)) = (&q.dead_letter_exchange, &q.dead_letter_queue) {
                channel
                    .exchange_declare(
                        dlx.as_str().into(),
                        lapin::ExchangeKind::Direct,
                        ExchangeDeclareOptions {
                            durable: true,
                            ..ExchangeDeclareOptions::default()
                        },
                        FieldTable::default(),
                    )
                    .await
                    .map_err(|e| port("declare exchange", "exchange", dlx, &e))?;
                let declared = channel
                    .queue_declare(
                        dlq.as_str().into(),
                        QueueDeclareOptions {
                            durable: true,
                            ..QueueDeclareOptions::default()
                        },
                        FieldTable::default(),
                    )
                    .await;
                match declared {
                    Ok(_) => {
                        channel
                            .queue_bind(
                                dlq.as_str().into(),
                                dlx.as_str().into(),
                                q.name.as_str().into(),
                                QueueBindOptions::default(),
                                FieldTable::default(),
                            )
                            .await
                            .map_err(|e| port("bind queue", "exchange", dlx, &e))?;
                    }
                    // A classic queue whose node is down on a cluster: it exists
                    // (declared before, with its binding), and refusing to go on
                    // would keep a relay from reconnecting to the other nodes until
                    // that one is back. The refusal closed the channel.
                    Err(e) if home_node_down(&e) => {
                        tracing::warn!(queue = %dlq, error = %e, "the dead-letter queue's node is down; it stays as declared before");
                        channel = connection
                            .create_channel()
                            .await
                            .map_err(|e| port("open channel", "channel", "", &e))?;
                    }
                    Err(e) => return Err(port("declare queue", "queue", dlq, &e)),
                }
            }
            let args = q.arguments();
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

/// Whether `e` is RabbitMQ refusing a classic queue whose home node is down
/// (`404 NOT_FOUND - home node '...' of durable queue '...' ... is down or
/// inaccessible`).
fn home_node_down(e: &lapin::Error) -> bool {
    let lapin::ErrorKind::ProtocolError(amqp) = e.kind() else {
        return false;
    };
    amqp.get_id() == 404 && amqp.get_message().as_str().contains("home node")
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
    fn two_queues_may_not_share_a_dead_letter_queue() {
        let billing = QueueSpec::quorum_with_limit("billing", 3, "dlx", "dead");
        let shipping = QueueSpec::quorum_with_limit("shipping", 3, "dlx", "dead");
        let shared = Topology {
            queues: vec![billing.clone(), shipping.clone()],
            ..Topology::default()
        };
        let err = shared
            .validate()
            .expect_err("one dead-letter queue for two");
        assert_eq!(
            err,
            TopologyError::SharedDeadLetterQueue {
                queue: "shipping".into(),
                other: "billing".into(),
                dead_letter_queue: "dead".into(),
            }
        );
        assert_eq!(err.field(), "dead_letter_queue");
        let own = Topology {
            queues: vec![
                billing,
                QueueSpec::quorum_with_limit("shipping", 3, "dlx", "shipping.dead"),
            ],
            ..Topology::default()
        };
        assert_eq!(
            own.validate(),
            Ok(()),
            "one exchange, two dead-letter queues"
        );
    }

    #[test]
    fn a_delivery_limit_is_quorum_only_and_needs_its_dead_letters() {
        let limited = QueueSpec::quorum_with_limit("billing", 3, "billing.dlx", "billing.dead");
        assert_eq!(limited.validate(), Ok(()));
        let args = limited.arguments();
        let arg = |k: &str| args.inner().get(k).cloned();
        assert_eq!(arg("x-delivery-limit"), Some(AMQPValue::LongLongInt(3)));
        assert_eq!(
            arg("x-dead-letter-routing-key"),
            Some(AMQPValue::LongString("billing".into()))
        );
        assert_eq!(
            arg("x-dead-letter-strategy"),
            Some(AMQPValue::LongString("at-least-once".into()))
        );
        assert_eq!(
            arg("x-overflow"),
            Some(AMQPValue::LongString("reject-publish".into()))
        );
        let cases = [
            (
                QueueSpec {
                    queue_type: QueueType::Classic,
                    ..limited.clone()
                },
                "delivery_limit",
            ),
            (
                QueueSpec {
                    delivery_limit: Some(0),
                    ..limited.clone()
                },
                "delivery_limit",
            ),
            (
                QueueSpec {
                    dead_letter_exchange: None,
                    ..limited.clone()
                },
                "dead_letter_exchange",
            ),
            (
                QueueSpec {
                    dead_letter_queue: None,
                    ..limited.clone()
                },
                "dead_letter_queue",
            ),
            (
                QueueSpec {
                    dead_letter_queue: Some("billing".into()),
                    ..limited.clone()
                },
                "dead_letter_queue",
            ),
            (
                QueueSpec {
                    max_length: Some(10),
                    overflow: Some(Overflow::DropHead),
                    ..limited.clone()
                },
                "overflow",
            ),
        ];
        for (spec, field) in cases {
            let err = spec.validate().expect_err(field);
            assert_eq!(err.field(), field, "{err}");
            let text = err.to_string();
            assert!(
                text.contains("billing") && text.contains(field),
                "names the queue and the setting: {text}"
            );
        }
        let classic = QueueSpec {
            delivery_limit: Some(3),
            ..QueueSpec::durable("plain")
        };
        assert!(matches!(
            classic.validate(),
            Err(TopologyError::DeliveryLimitOnClassic { .. })
        ));
        assert!(
            QueueSpec::durable("plain")
                .arguments()
                .inner()
                .get("x-delivery-limit")
                .is_none()
        );
    }

    #[test]
    fn overflow_modes_have_their_broker_names() {
        assert_eq!(Overflow::RejectPublish.as_str(), "reject-publish");
        assert_eq!(Overflow::RejectPublishDlx.as_str(), "reject-publish-dlx");
        assert_eq!(Overflow::DropHead.as_str(), "drop-head");
    }
}
