//! `[[topology.exchanges]]`, `[[topology.queues]]`, `[[topology.bindings]]`: the
//! RabbitMQ topology a relay declares at start, so a deployment needs no code.
//! Declaring is idempotent; a declaration that conflicts with what exists (another
//! kind, other arguments) fails start-up with the broker's reply naming it.
//!
//! ```toml
//! [[topology.exchanges]]
//! name = "orders"
//! kind = "topic"            # direct | topic | fanout | headers; default topic
//! shards = 1                # > 1: declared as orders.shard-0 ...; the relay publishes
//!                           # each message to one, by its ordering key
//!
//! [[topology.queues]]
//! name = "billing"
//! type = "quorum"           # classic | quorum; default classic
//! dead_letter_exchange = "orders.dlx"
//! max_length = 100000
//! overflow = "reject-publish"   # required with max_length
//! # Quorum only: after 20 returns the broker gives up on a delivery and
//! # dead-letters it into dead_letter_queue (both required with a limit), which
//! # the consumer drains into its dead inbox rows.
//! delivery_limit = 20
//! dead_letter_queue = "billing.dead"
//! shards = 1                # > 1: billing.shard-0 ..., bound shard to shard
//!
//! [[topology.bindings]]
//! queue = "billing"
//! exchange = "orders"
//! routing_key = "order.*"
//! ```

use outbox_adapters_rabbitmq::{
    BindingSpec, ExchangeKind, ExchangeSpec, Overflow, QueueSpec, QueueType, Topology,
    TopologyError,
};
use outbox_core::config::ConfigError;
use outbox_core::shard::shard_name;
use serde::Deserialize;

/// The topology section.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopologyConfig {
    /// Exchanges to declare.
    #[serde(default)]
    pub exchanges: Vec<ExchangeConfig>,
    /// Queues to declare.
    #[serde(default)]
    pub queues: Vec<QueueConfig>,
    /// Bindings to declare, after the exchanges and queues.
    #[serde(default)]
    pub bindings: Vec<BindingConfig>,
}

/// An exchange's routing kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExchangeKindConfig {
    /// Routing key equals binding key.
    Direct,
    /// Dotted patterns with `*` and `#`.
    #[default]
    Topic,
    /// Every bound queue.
    Fanout,
    /// Matches on headers.
    Headers,
}

/// `[[topology.exchanges]]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExchangeConfig {
    /// Name.
    pub name: String,
    /// Routing kind (default topic).
    #[serde(default)]
    pub kind: ExchangeKindConfig,
    /// Survives a broker restart (default true).
    #[serde(default = "yes")]
    pub durable: bool,
    /// Shards (default 1): more than 1 declares `name.shard-0`, ... instead of
    /// `name`, and the relay publishes each message for `name` to one of them by
    /// its ordering key (docs/cluster.md, "Sharding").
    #[serde(default = "one")]
    pub shards: u16,
}

/// Classic or quorum.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QueueTypeConfig {
    /// A classic queue.
    #[default]
    Classic,
    /// A replicated quorum queue (always durable).
    Quorum,
}

/// What a full queue does with the next message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OverflowConfig {
    /// The broker nacks the publish; the relay keeps the message and retries it.
    RejectPublish,
    /// As `reject-publish`, and the refused message is dead-lettered too.
    RejectPublishDlx,
    /// Drops the oldest (already confirmed) message: it is lost.
    DropHead,
}

/// `[[topology.queues]]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueConfig {
    /// Name.
    pub name: String,
    /// Classic or quorum (default classic).
    #[serde(default, rename = "type")]
    pub queue_type: QueueTypeConfig,
    /// Survives a broker restart (default true; quorum queues always do).
    #[serde(default = "yes")]
    pub durable: bool,
    /// Where rejected or expired messages go.
    #[serde(default)]
    pub dead_letter_exchange: Option<String>,
    /// The queue dead-lettered messages go to, declared and bound to
    /// `dead_letter_exchange` (required with `delivery_limit`).
    #[serde(default)]
    pub dead_letter_queue: Option<String>,
    /// `x-delivery-limit`, quorum queues only: returns before the broker gives up
    /// on a delivery and dead-letters it (needs `dead_letter_exchange` and
    /// `dead_letter_queue`).
    #[serde(default)]
    pub delivery_limit: Option<u32>,
    /// `x-max-length` (needs `overflow`).
    #[serde(default)]
    pub max_length: Option<i64>,
    /// `x-overflow`: required with `max_length`.
    #[serde(default)]
    pub overflow: Option<OverflowConfig>,
    /// Shards (default 1): more than 1 declares `name.shard-0`, ..., each bound to
    /// the same shard of a sharded exchange with as many shards.
    #[serde(default = "one")]
    pub shards: u16,
}

/// `[[topology.bindings]]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BindingConfig {
    /// The queue.
    pub queue: String,
    /// The exchange.
    pub exchange: String,
    /// The binding key (default empty, as fanout exchanges use).
    #[serde(default)]
    pub routing_key: String,
}

const fn yes() -> bool {
    true
}

const fn one() -> u16 {
    1
}

/// `name`, and when sharded its longest shard name too, checked as a name.
fn check_sharded_name(field: &str, what: &str, name: &str, shards: u16) -> Result<(), ConfigError> {
    check_name(field, what, name)?;
    if shards > 1 {
        check_name(field, what, &shard_name(name, shards - 1))?;
    }
    Ok(())
}

/// AMQP names are short strings: at most 255 bytes.
const MAX_NAME: usize = 255;

fn check_name(field: &str, what: &str, name: &str) -> Result<(), ConfigError> {
    if name.is_empty() {
        return Err(ConfigError::new(
            "topology",
            field,
            format!("{what} name must not be empty"),
        ));
    }
    if name.len() > MAX_NAME {
        return Err(ConfigError::new(
            "topology",
            field,
            format!("{what} name {name:?} is longer than {MAX_NAME} bytes"),
        ));
    }
    if name.chars().any(char::is_control) {
        return Err(ConfigError::new(
            "topology",
            field,
            format!("{what} name {name:?} holds a control character"),
        ));
    }
    Ok(())
}

impl TopologyConfig {
    /// Whether there is anything to declare.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.exchanges.is_empty() && self.queues.is_empty() && self.bindings.is_empty()
    }

    /// The topology to declare, with every name and setting checked.
    ///
    /// # Errors
    /// [`ConfigError`] naming the entry (`topology.queues[1].max_length`, ...).
    pub fn to_topology(&self) -> Result<Topology, ConfigError> {
        let mut exchanges = Vec::with_capacity(self.exchanges.len());
        for (i, x) in self.exchanges.iter().enumerate() {
            let field = format!("exchanges[{i}].name");
            check_sharded_name(&field, "exchange", &x.name, x.shards)?;
            if x.name.starts_with("amq.") {
                return Err(ConfigError::new(
                    "topology",
                    &field,
                    format!(
                        "{:?}: names starting with amq. are reserved by the broker",
                        x.name
                    ),
                ));
            }
            exchanges.push(ExchangeSpec {
                name: x.name.clone(),
                kind: match x.kind {
                    ExchangeKindConfig::Direct => ExchangeKind::Direct,
                    ExchangeKindConfig::Topic => ExchangeKind::Topic,
                    ExchangeKindConfig::Fanout => ExchangeKind::Fanout,
                    ExchangeKindConfig::Headers => ExchangeKind::Headers,
                },
                durable: x.durable,
                shards: x.shards,
            });
        }
        let mut queues = Vec::with_capacity(self.queues.len());
        for (i, q) in self.queues.iter().enumerate() {
            check_sharded_name(&format!("queues[{i}].name"), "queue", &q.name, q.shards)?;
            if let Some(dlx) = &q.dead_letter_exchange {
                check_name(
                    &format!("queues[{i}].dead_letter_exchange"),
                    "exchange",
                    dlx,
                )?;
            }
            if let Some(dlq) = &q.dead_letter_queue {
                check_sharded_name(
                    &format!("queues[{i}].dead_letter_queue"),
                    "queue",
                    dlq,
                    q.shards,
                )?;
            }
            let spec = QueueSpec {
                name: q.name.clone(),
                queue_type: match q.queue_type {
                    QueueTypeConfig::Classic => QueueType::Classic,
                    QueueTypeConfig::Quorum => QueueType::Quorum,
                },
                durable: q.durable,
                dead_letter_exchange: q.dead_letter_exchange.clone(),
                dead_letter_queue: q.dead_letter_queue.clone(),
                delivery_limit: q.delivery_limit,
                max_length: q.max_length,
                overflow: q.overflow.map(|o| match o {
                    OverflowConfig::RejectPublish => Overflow::RejectPublish,
                    OverflowConfig::RejectPublishDlx => Overflow::RejectPublishDlx,
                    OverflowConfig::DropHead => Overflow::DropHead,
                }),
                shards: q.shards,
            };
            spec.validate().map_err(|e| {
                ConfigError::new("topology", &format!("queues[{i}].{}", e.field()), e)
            })?;
            queues.push(spec);
        }
        let mut bindings = Vec::with_capacity(self.bindings.len());
        for (i, b) in self.bindings.iter().enumerate() {
            check_name(&format!("bindings[{i}].queue"), "queue", &b.queue)?;
            check_name(&format!("bindings[{i}].exchange"), "exchange", &b.exchange)?;
            if b.routing_key.len() > MAX_NAME {
                return Err(ConfigError::new(
                    "topology",
                    &format!("bindings[{i}].routing_key"),
                    format!("longer than {MAX_NAME} bytes"),
                ));
            }
            bindings.push(BindingSpec {
                queue: b.queue.clone(),
                exchange: b.exchange.clone(),
                routing_key: b.routing_key.clone(),
            });
        }
        let topology = Topology {
            exchanges,
            queues,
            bindings,
        };
        // What only the queues together can break (a dead-letter queue two of
        // them name), at load, not first at declare.
        topology.validate().map_err(|e| {
            if let TopologyError::ShardsOutOfRange { name, .. } = &e
                && let Some(i) = topology.exchanges.iter().position(|x| &x.name == name)
            {
                return ConfigError::new("topology", &format!("exchanges[{i}].shards"), e);
            }
            // A name clash once the shards are written out: the last entry whose
            // name (or a shard of it) it is.
            if let TopologyError::DuplicateName { what, name } = &e {
                let of = |base: &str| name.starts_with(base);
                let found = if *what == "exchange" {
                    topology
                        .exchanges
                        .iter()
                        .rposition(|x| of(&x.name))
                        .map(|i| format!("exchanges[{i}].name"))
                } else {
                    topology
                        .queues
                        .iter()
                        .rposition(|q| of(&q.name))
                        .map(|i| format!("queues[{i}].name"))
                };
                if let Some(field) = found {
                    return ConfigError::new("topology", &field, e);
                }
            }
            let queue = match &e {
                TopologyError::SharedDeadLetterQueue { queue, .. }
                | TopologyError::ShardsMismatch { queue, .. } => Some(queue),
                _ => None,
            };
            let i = queue
                .and_then(|name| topology.queues.iter().rposition(|q| &q.name == name))
                .unwrap_or_default();
            ConfigError::new("topology", &format!("queues[{i}].{}", e.field()), e)
        })?;
        Ok(topology)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<TopologyConfig, String> {
        #[derive(Deserialize)]
        struct Doc {
            topology: TopologyConfig,
        }
        toml_parse(text).map(|d: Doc| d.topology)
    }

    fn toml_parse<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, String> {
        config::Config::builder()
            .add_source(config::File::from_str(text, config::FileFormat::Toml))
            .build()
            .and_then(config::Config::try_deserialize)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn a_full_topology_with_defaults() {
        let t = parse(
            r#"
[[topology.exchanges]]
name = "orders"
[[topology.exchanges]]
name = "audit"
kind = "fanout"
durable = false
[[topology.queues]]
name = "billing"
type = "quorum"
dead_letter_exchange = "orders.dlx"
max_length = 10
overflow = "reject-publish"
[[topology.bindings]]
queue = "billing"
exchange = "orders"
routing_key = "order.*"
"#,
        )
        .expect("parses")
        .to_topology()
        .expect("valid");
        assert_eq!(t.exchanges[0].kind, ExchangeKind::Topic);
        assert!(t.exchanges[0].durable);
        assert_eq!(t.exchanges[1].kind, ExchangeKind::Fanout);
        assert!(!t.exchanges[1].durable);
        assert_eq!(t.queues[0].queue_type, QueueType::Quorum);
        assert_eq!(t.queues[0].overflow, Some(Overflow::RejectPublish));
        assert_eq!(t.queues[0].max_length, Some(10));
        assert_eq!(t.bindings[0].routing_key, "order.*");
        let limited = parse(
            "[[topology.queues]]\nname = \"q\"\ntype = \"quorum\"\ndelivery_limit = 3\ndead_letter_exchange = \"q.dlx\"\ndead_letter_queue = \"q.dead\"",
        )
        .expect("parses")
        .to_topology()
        .expect("valid");
        assert_eq!(limited.queues[0].delivery_limit, Some(3));
        assert_eq!(
            limited.queues[0].dead_letter_queue.as_deref(),
            Some("q.dead")
        );
        assert_eq!((t.exchanges[0].shards, t.queues[0].shards), (1, 1));
        let sharded = parse(
            "[[topology.exchanges]]\nname = \"orders\"\nshards = 4\n[[topology.queues]]\nname = \"billing\"\ntype = \"quorum\"\nshards = 4\n[[topology.bindings]]\nqueue = \"billing\"\nexchange = \"orders\"\nrouting_key = \"#\"",
        )
        .expect("parses")
        .to_topology()
        .expect("valid");
        assert_eq!(
            (sharded.exchanges[0].shards, sharded.queues[0].shards),
            (4, 4)
        );
    }

    #[test]
    fn bad_entries_are_refused_naming_them() {
        let cases = [
            (
                "[[topology.exchanges]]\nname = \"\"",
                "topology.exchanges[0].name",
            ),
            (
                "[[topology.exchanges]]\nname = \"amq.topic\"",
                "topology.exchanges[0].name",
            ),
            (
                "[[topology.queues]]\nname = \"a\"\n[[topology.queues]]\nname = \"b\"\nmax_length = 5",
                "topology.queues[1].max_length",
            ),
            (
                "[[topology.bindings]]\nqueue = \"q\"\nexchange = \"\"",
                "topology.bindings[0].exchange",
            ),
            (
                "[[topology.queues]]\nname = \"q\"\ndelivery_limit = 3\ndead_letter_exchange = \"x\"\ndead_letter_queue = \"d\"",
                "topology.queues[0].delivery_limit",
            ),
            (
                "[[topology.queues]]\nname = \"q\"\ntype = \"quorum\"\ndelivery_limit = 3",
                "topology.queues[0].dead_letter_exchange",
            ),
            (
                "[[topology.queues]]\nname = \"q\"\ntype = \"quorum\"\ndelivery_limit = 3\ndead_letter_exchange = \"x\"",
                "topology.queues[0].dead_letter_queue",
            ),
            (
                "[[topology.queues]]\nname = \"q\"\ntype = \"quorum\"\ndelivery_limit = 0\ndead_letter_exchange = \"x\"\ndead_letter_queue = \"d\"",
                "topology.queues[0].delivery_limit",
            ),
            (
                "[[topology.queues]]\nname = \"q\"\ndead_letter_queue = \"\"",
                "topology.queues[0].dead_letter_queue",
            ),
            (
                "[[topology.queues]]\nname = \"a\"\ndead_letter_exchange = \"x\"\ndead_letter_queue = \"d\"\n[[topology.queues]]\nname = \"b\"\ndead_letter_exchange = \"x\"\ndead_letter_queue = \"d\"",
                "topology.queues[1].dead_letter_queue",
            ),
            (
                "[[topology.exchanges]]\nname = \"x\"\nshards = 0",
                "topology.exchanges[0].shards",
            ),
            (
                "[[topology.queues]]\nname = \"q\"\nshards = 2\n[[topology.queues]]\nname = \"q.shard-1\"",
                "topology.queues[1].name",
            ),
            (
                "[[topology.queues]]\nname = \"q\"\nshards = 300",
                "topology.queues[0].shards",
            ),
            (
                "[[topology.exchanges]]\nname = \"x\"\nshards = 4\n[[topology.queues]]\nname = \"q\"\nshards = 2\n[[topology.bindings]]\nqueue = \"q\"\nexchange = \"x\"",
                "topology.queues[0].shards",
            ),
        ];
        for (text, field) in cases {
            let err = parse(text).expect("parses").to_topology().expect_err(text);
            assert!(err.to_string().contains(field), "{text}: {err}");
        }
        let long = format!("[[topology.queues]]\nname = \"{}\"", "q".repeat(256));
        assert!(parse(&long).expect("parses").to_topology().is_err());
        // A name that fits, but not with its shards' suffix.
        let long = format!(
            "[[topology.queues]]\nname = \"{}\"\nshards = 4",
            "q".repeat(250)
        );
        let err = parse(&long)
            .expect("parses")
            .to_topology()
            .expect_err("too long");
        assert!(err.to_string().contains(".shard-3"), "{err}");
        // Unknown keys and values are refused by the parser, naming them.
        for text in [
            "[[topology.exchanges]]\nname = \"x\"\nkind = \"round-robin\"",
            "[[topology.queues]]\nname = \"q\"\noverflow = \"drop-tail\"",
            "[[topology.queues]]\nname = \"q\"\nttl = 5",
        ] {
            assert!(parse(text).is_err(), "{text}");
        }
    }
}
