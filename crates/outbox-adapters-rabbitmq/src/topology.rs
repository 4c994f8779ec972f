//! Exchanges, queues and bindings from configuration, declared idempotently.

use std::collections::HashSet;

use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use outbox_core::shard::shard_name;
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
    /// 1: one exchange named `name`. `n > 1`: a sharded exchange, declared as `n`
    /// exchanges of this kind named by [`outbox_core::shard::shard_name`]
    /// (`orders.shard-0`, ...), none named `name` itself; the relay publishes each
    /// message for `name` to one of them, chosen by its ordering key
    /// ([`outbox_core::shard::shard_of`]). See [`QueueSpec::shards`] for the
    /// queues bound to it.
    pub shards: u16,
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
    /// A shard count of 0, or over [`outbox_core::shard::MAX_SHARDS`].
    #[error(
        "{name}: shards must be between 1 and {max} (got {shards})",
        max = outbox_core::shard::MAX_SHARDS
    )]
    ShardsOutOfRange {
        /// The exchange or queue.
        name: String,
        /// What was given.
        shards: u16,
    },
    /// A sharded queue bound to an exchange with another number of shards (or to
    /// one this topology does not declare): a shard would receive another
    /// shard's keys, or none.
    #[error(
        "queue {queue} has {queue_shards} shards but is bound to exchange {exchange} of {exchange_shards}; a sharded queue binds to a sharded exchange of the same count (declared in this topology)"
    )]
    ShardsMismatch {
        /// The queue.
        queue: String,
        /// Its shards.
        queue_shards: u16,
        /// The exchange it is bound to.
        exchange: String,
        /// The exchange's shards (1 when this topology does not declare it).
        exchange_shards: u16,
    },
    /// Two exchanges, or two queues, declared under one name once the shards are
    /// written out (`billing.shard-0` beside a queue of 2 shards named `billing`).
    #[error(
        "{what} {name} is declared twice once the shards are written out (a shard is named as another {what})"
    )]
    DuplicateName {
        /// `exchange` or `queue`.
        what: &'static str,
        /// The name.
        name: String,
    },
    /// A name over AMQP's 255 bytes once a shard's suffix is added.
    #[error("{name}: longer than 255 bytes (a shard's name)")]
    NameTooLong {
        /// The name.
        name: String,
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
            Self::ShardsOutOfRange { .. } | Self::ShardsMismatch { .. } => "shards",
            Self::DuplicateName { .. } | Self::NameTooLong { .. } => "name",
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
    /// 1: one queue named `name`. `n > 1`: a sharded queue, declared as `n`
    /// queues `name.shard-0`, ... with these settings (each with a dead-letter
    /// queue of its own, `dead_letter_queue.shard-i`), shard `i` bound to shard `i`
    /// of a sharded exchange with as many shards, so that a key's messages reach
    /// one queue in order. A consumer with `ConsumerConfig::shards` of the same
    /// count consumes them all, a worker each. A queue of one shard bound to a
    /// sharded exchange is bound to every shard: it gets the whole stream.
    pub shards: u16,
}

impl QueueSpec {
    /// Checks settings that would lose messages (a length cap with RabbitMQ's
    /// default drop-head) or that the broker would refuse.
    ///
    /// # Errors
    /// [`TopologyError`] naming the queue and the field.
    pub fn validate(&self) -> Result<(), TopologyError> {
        let queue = self.name.clone();
        check_shards(&self.name, self.shards)?;
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
            shards: 1,
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
        for x in &self.exchanges {
            check_shards(&x.name, x.shards)?;
        }
        self.queues.iter().try_for_each(QueueSpec::validate)?;
        for b in &self.bindings {
            let queue_shards = self
                .queues
                .iter()
                .find(|q| q.name == b.queue)
                .map_or(1, |q| q.shards);
            let exchange_shards = self.exchange_shards(&b.exchange);
            if queue_shards > 1 && queue_shards != exchange_shards {
                return Err(TopologyError::ShardsMismatch {
                    queue: b.queue.clone(),
                    queue_shards,
                    exchange: b.exchange.clone(),
                    exchange_shards,
                });
            }
        }
        no_shared_dead_letter_queue(&self.queues)?;
        if self.is_sharded() {
            self.validate_shard_names()?;
        }
        Ok(())
    }

    /// Whether any exchange or queue has more than one shard.
    fn is_sharded(&self) -> bool {
        self.exchanges.iter().any(|x| x.shards > 1) || self.queues.iter().any(|q| q.shards > 1)
    }

    /// The names the shards are declared under: each a valid AMQP name, none
    /// another exchange's or queue's (a shard named as a queue declared beside it
    /// would be shared by both), no dead-letter queue shared.
    fn validate_shard_names(&self) -> Result<(), TopologyError> {
        let plain = self.expanded();
        let mut exchanges = HashSet::new();
        for x in &plain.exchanges {
            check_name_length(&x.name)?;
            if !exchanges.insert(x.name.as_str()) {
                return Err(TopologyError::DuplicateName {
                    what: "exchange",
                    name: x.name.clone(),
                });
            }
        }
        let mut queues = HashSet::new();
        for q in &plain.queues {
            for name in std::iter::once(&q.name).chain(q.dead_letter_queue.as_ref()) {
                check_name_length(name)?;
            }
            if !queues.insert(q.name.as_str()) {
                return Err(TopologyError::DuplicateName {
                    what: "queue",
                    name: q.name.clone(),
                });
            }
        }
        for q in &plain.queues {
            if let Some(dlq) = q.dead_letter_queue.as_deref()
                && queues.contains(dlq)
            {
                return Err(TopologyError::DuplicateName {
                    what: "queue",
                    name: dlq.to_owned(),
                });
            }
        }
        no_shared_dead_letter_queue(&plain.queues)?;
        Ok(())
    }

    /// How many shards exchange `name` has (1 when it is not sharded or not
    /// declared here).
    #[must_use]
    pub fn exchange_shards(&self, name: &str) -> u16 {
        self.exchanges
            .iter()
            .find(|x| x.name == name)
            .map_or(1, |x| x.shards.max(1))
    }

    /// This topology with every sharded exchange and queue written out as its
    /// shards (see [`ExchangeSpec::shards`], [`QueueSpec::shards`]): what is
    /// declared on the broker. Call it on a validated topology.
    #[must_use]
    pub fn expanded(&self) -> Self {
        let sharded = |name: &str, shards: u16| -> Vec<String> {
            if shards <= 1 {
                vec![name.to_owned()]
            } else {
                (0..shards).map(|i| shard_name(name, i)).collect()
            }
        };
        let mut out = Self::default();
        for x in &self.exchanges {
            for name in sharded(&x.name, x.shards) {
                out.exchanges.push(ExchangeSpec {
                    name,
                    shards: 1,
                    ..x.clone()
                });
            }
        }
        for q in &self.queues {
            for (i, name) in sharded(&q.name, q.shards).into_iter().enumerate() {
                let dead_letter_queue = q.dead_letter_queue.as_ref().map(|d| {
                    if q.shards > 1 {
                        shard_name(d, u16::try_from(i).unwrap_or(0))
                    } else {
                        d.clone()
                    }
                });
                out.queues.push(QueueSpec {
                    name,
                    dead_letter_queue,
                    shards: 1,
                    ..q.clone()
                });
            }
        }
        for b in &self.bindings {
            let queue_shards = self
                .queues
                .iter()
                .find(|q| q.name == b.queue)
                .map_or(1, |q| q.shards.max(1));
            let exchanges = sharded(&b.exchange, self.exchange_shards(&b.exchange));
            let queues = sharded(&b.queue, queue_shards);
            if queue_shards > 1 {
                // Shard i to shard i (validation made the counts equal).
                for (queue, exchange) in queues.into_iter().zip(exchanges) {
                    out.bindings.push(BindingSpec {
                        queue,
                        exchange,
                        routing_key: b.routing_key.clone(),
                    });
                }
            } else {
                // One queue bound to every shard: the whole stream.
                for exchange in exchanges {
                    out.bindings.push(BindingSpec {
                        queue: b.queue.clone(),
                        exchange,
                        routing_key: b.routing_key.clone(),
                    });
                }
            }
        }
        out
    }

    /// Declares everything (idempotent: declaring what exists with the same settings
    /// changes nothing), after [`Topology::validate`]: nothing is declared when a
    /// setting is refused.
    ///
    /// A classic queue whose home node is down (on a cluster) is passed over, with
    /// its bindings, and named in the [`Declared`] returned: it exists (declared
    /// before, with its bindings), and refusing to go on would stop every exchange's
    /// publishing until that one node is back. Only that queue's routes wait
    /// meanwhile: RabbitMQ (3.8 and later) nacks a message routed to it, a failed
    /// attempt retried with the retry policy.
    ///
    /// # Errors
    /// A fatal [`PortError`] for a refused setting; the first declaration the broker
    /// refuses (e.g. an existing queue with other settings), or a connection failure.
    pub async fn declare(&self, connection: &lapin::Connection) -> Result<Declared, PortError> {
        self.validate()
            .map_err(|e| PortError::fatal("declare topology", e.to_string()))?;
        let plain = self.expanded();
        let mut declared = Declared::default();
        let mut channel = connection
            .create_channel()
            .await
            .map_err(|e| port("open channel", "channel", "", &e))?;
        for x in &plain.exchanges {
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
        for q in &plain.queues {
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
                let dlq_declared = channel
                    .queue_declare(
                        dlq.as_str().into(),
                        QueueDeclareOptions {
                            durable: true,
                            ..QueueDeclareOptions::default()
                        },
                        FieldTable::default(),
                    )
                    .await;
                match dlq_declared {
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
                        declared.unavailable_queues.push(dlq.clone());
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
            match channel
                .queue_declare(q.name.as_str().into(), options, args)
                .await
            {
                Ok(_) => {}
                // As for the dead-letter queue above: passed over, with its
                // bindings; the refusal closed the channel.
                Err(e) if home_node_down(&e) => {
                    tracing::warn!(queue = %q.name, error = %e, "the queue's home node is down; it and its bindings stay as declared before, and nothing reaches it until the node is back");
                    declared.unavailable_queues.push(q.name.clone());
                    channel = connection
                        .create_channel()
                        .await
                        .map_err(|e| port("open channel", "channel", "", &e))?;
                }
                Err(e) => return Err(port("declare queue", "queue", &q.name, &e)),
            }
        }
        for b in &plain.bindings {
            if declared.unavailable_queues.contains(&b.queue) {
                continue;
            }
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
        Ok(declared)
    }
}

impl Topology {
    /// Nothing to declare yet; add with [`Self::exchange`], [`Self::queue`] and
    /// [`Self::bind`].
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// A durable exchange `name` of `kind`.
    #[must_use]
    pub fn exchange(mut self, name: impl Into<String>, kind: ExchangeKind) -> Self {
        self.exchanges.push(ExchangeSpec {
            name: name.into(),
            kind,
            durable: true,
            shards: 1,
        });
        self
    }

    /// A durable classic queue `name` ([`QueueSpec::durable`]); for a quorum
    /// queue or a dead-letter queue, [`Self::queue_spec`].
    #[must_use]
    pub fn queue(self, name: impl Into<String>) -> Self {
        self.queue_spec(QueueSpec::durable(name))
    }

    /// A queue with every setting of `spec`.
    #[must_use]
    pub fn queue_spec(mut self, spec: QueueSpec) -> Self {
        self.queues.push(spec);
        self
    }

    /// Binds `queue` to `exchange` with `routing_key` (a pattern on a topic
    /// exchange: `order.*`).
    #[must_use]
    pub fn bind(
        mut self,
        queue: impl Into<String>,
        exchange: impl Into<String>,
        routing_key: impl Into<String>,
    ) -> Self {
        self.bindings.push(BindingSpec {
            queue: queue.into(),
            exchange: exchange.into(),
            routing_key: routing_key.into(),
        });
        self
    }

    /// Deletes what [`Self::declare`] declares: the queues (with the messages in
    /// them), their dead-letter queues and the dead-letter exchanges declared with
    /// them, and the exchanges, shards included. For tests and teardown; what is
    /// already gone is passed over.
    ///
    /// # Errors
    /// A connection or channel failure, or a deletion the broker refuses.
    pub async fn delete(&self, connection: &lapin::Connection) -> Result<(), PortError> {
        let plain = self.expanded();
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| port("open channel", "channel", "", &e))?;
        for q in &plain.queues {
            let dead_letters = q.dead_letter_queue.iter().chain(std::iter::once(&q.name));
            for name in dead_letters {
                channel
                    .queue_delete(
                        name.as_str().into(),
                        lapin::options::QueueDeleteOptions::default(),
                    )
                    .await
                    .map_err(|e| port("delete queue", "queue", name, &e))?;
            }
        }
        // Only the dead-letter exchanges `declare` declares (those with a
        // dead-letter queue); one named alone is someone else's.
        let dead_letter_exchanges = plain
            .queues
            .iter()
            .filter(|q| q.dead_letter_queue.is_some())
            .filter_map(|q| q.dead_letter_exchange.as_ref());
        for name in plain
            .exchanges
            .iter()
            .map(|x| &x.name)
            .chain(dead_letter_exchanges)
        {
            channel
                .exchange_delete(
                    name.as_str().into(),
                    lapin::options::ExchangeDeleteOptions::default(),
                )
                .await
                .map_err(|e| port("delete exchange", "exchange", name, &e))?;
        }
        let _ = channel.close(200, "deleted".into()).await;
        Ok(())
    }
}

/// What [`Topology::declare`] could not declare and passed over.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Declared {
    /// Classic queues (a dead-letter queue, or one of the topology's) whose home
    /// node is down: they keep what was declared before, and receive nothing until
    /// that node is back.
    pub unavailable_queues: Vec<String>,
}

/// No dead-letter queue named by two of `queues`.
fn no_shared_dead_letter_queue(queues: &[QueueSpec]) -> Result<(), TopologyError> {
    for (i, q) in queues.iter().enumerate() {
        let Some(dlq) = &q.dead_letter_queue else {
            continue;
        };
        if let Some(other) = queues[..i]
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

/// A name AMQP can carry (a short string: at most 255 bytes).
fn check_name_length(name: &str) -> Result<(), TopologyError> {
    if name.len() > 255 {
        return Err(TopologyError::NameTooLong {
            name: name.to_owned(),
        });
    }
    Ok(())
}

/// A shard count in `1..=MAX_SHARDS`.
fn check_shards(name: &str, shards: u16) -> Result<(), TopologyError> {
    if (1..=outbox_core::shard::MAX_SHARDS).contains(&shards) {
        Ok(())
    } else {
        Err(TopologyError::ShardsOutOfRange {
            name: name.to_owned(),
            shards,
        })
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

    fn sharded_topology() -> Topology {
        Topology {
            exchanges: vec![ExchangeSpec {
                name: "orders".into(),
                kind: ExchangeKind::Topic,
                durable: true,
                shards: 3,
            }],
            queues: vec![
                QueueSpec {
                    shards: 3,
                    ..QueueSpec::quorum_with_limit("billing", 5, "dlx", "billing.dead")
                },
                QueueSpec::durable("audit"),
            ],
            bindings: vec![
                BindingSpec {
                    queue: "billing".into(),
                    exchange: "orders".into(),
                    routing_key: "order.#".into(),
                },
                BindingSpec {
                    queue: "audit".into(),
                    exchange: "orders".into(),
                    routing_key: "#".into(),
                },
            ],
        }
    }

    #[test]
    fn a_sharded_topology_is_declared_as_its_shards() {
        let t = sharded_topology();
        t.validate().expect("valid");
        let plain = t.expanded();
        let names = |v: Vec<&str>| v.into_iter().map(str::to_owned).collect::<Vec<_>>();
        assert_eq!(
            plain
                .exchanges
                .iter()
                .map(|x| x.name.clone())
                .collect::<Vec<_>>(),
            names(vec!["orders.shard-0", "orders.shard-1", "orders.shard-2"])
        );
        assert!(
            plain
                .exchanges
                .iter()
                .all(|x| x.kind == ExchangeKind::Topic && x.shards == 1)
        );
        let queues: Vec<(String, Option<String>)> = plain
            .queues
            .iter()
            .map(|q| (q.name.clone(), q.dead_letter_queue.clone()))
            .collect();
        assert_eq!(
            queues,
            vec![
                (
                    "billing.shard-0".into(),
                    Some("billing.dead.shard-0".into())
                ),
                (
                    "billing.shard-1".into(),
                    Some("billing.dead.shard-1".into())
                ),
                (
                    "billing.shard-2".into(),
                    Some("billing.dead.shard-2".into())
                ),
                ("audit".into(), None),
            ]
        );
        // Each shard queue keeps the settings, and dead-letters under its own name.
        let first = &plain.queues[0];
        assert_eq!(
            (first.queue_type, first.delivery_limit),
            (QueueType::Quorum, Some(5))
        );
        assert_eq!(
            first.arguments().inner().get("x-dead-letter-routing-key"),
            Some(&AMQPValue::LongString("billing.shard-0".into()))
        );
        let bindings: Vec<(&str, &str)> = plain
            .bindings
            .iter()
            .map(|b| (b.queue.as_str(), b.exchange.as_str()))
            .collect();
        assert_eq!(
            bindings,
            vec![
                ("billing.shard-0", "orders.shard-0"),
                ("billing.shard-1", "orders.shard-1"),
                ("billing.shard-2", "orders.shard-2"),
                // One queue of one shard gets the whole stream.
                ("audit", "orders.shard-0"),
                ("audit", "orders.shard-1"),
                ("audit", "orders.shard-2"),
            ]
        );
        plain.validate().expect("the expansion is valid");
        assert_eq!(plain.expanded(), plain, "expanding twice changes nothing");
    }

    #[test]
    fn shard_counts_must_agree() {
        let mut t = sharded_topology();
        t.queues[0].shards = 2;
        assert!(matches!(
            t.validate(),
            Err(TopologyError::ShardsMismatch {
                queue_shards: 2,
                exchange_shards: 3,
                ..
            })
        ));
        // Bound to an exchange that is not sharded (or not declared here).
        let mut t = sharded_topology();
        t.bindings[0].exchange = "elsewhere".into();
        assert!(matches!(
            t.validate(),
            Err(TopologyError::ShardsMismatch {
                exchange_shards: 1,
                ..
            })
        ));
        for shards in [0, outbox_core::shard::MAX_SHARDS + 1] {
            let mut t = sharded_topology();
            t.exchanges[0].shards = shards;
            assert!(matches!(
                t.validate(),
                Err(TopologyError::ShardsOutOfRange { .. })
            ));
            let mut t = sharded_topology();
            t.queues[1].shards = shards;
            assert!(matches!(
                t.validate(),
                Err(TopologyError::ShardsOutOfRange { .. })
            ));
        }
    }

    #[test]
    fn a_shard_named_as_another_queue_or_too_long_is_refused() {
        // A queue named as a shard of another.
        let mut t = sharded_topology();
        t.queues.push(QueueSpec::durable("billing.shard-1"));
        assert!(
            matches!(
                t.validate(),
                Err(TopologyError::DuplicateName { what: "queue", .. })
            ),
            "{:?}",
            t.validate()
        );
        // A dead-letter queue named as one shard's dead-letter queue.
        let mut t = sharded_topology();
        t.queues.push(QueueSpec {
            dead_letter_exchange: Some("dlx".into()),
            dead_letter_queue: Some("billing.dead.shard-0".into()),
            ..QueueSpec::durable("other")
        });
        assert!(
            matches!(
                t.validate(),
                Err(TopologyError::SharedDeadLetterQueue { .. })
            ),
            "{:?}",
            t.validate()
        );
        // An exchange named as a shard.
        let mut t = sharded_topology();
        t.exchanges.push(ExchangeSpec {
            name: "orders.shard-2".into(),
            kind: ExchangeKind::Topic,
            durable: true,
            shards: 1,
        });
        assert!(matches!(
            t.validate(),
            Err(TopologyError::DuplicateName {
                what: "exchange",
                ..
            })
        ));
        // 250 bytes fit; with ".shard-2" they do not.
        let mut t = sharded_topology();
        t.exchanges[0].name = "x".repeat(250);
        t.bindings
            .iter_mut()
            .for_each(|b| b.exchange = "x".repeat(250));
        assert!(matches!(
            t.validate(),
            Err(TopologyError::NameTooLong { .. })
        ));
        // Unsharded, the same names are not checked here (as before).
        let plain = Topology {
            queues: vec![QueueSpec::durable("a"), QueueSpec::durable("a")],
            ..Topology::default()
        };
        assert!(plain.validate().is_ok());
    }
}
