//! A consumer's settings.

use std::time::Duration;

use outbox_core::RetryPolicy;
use outbox_core::shard::shard_name;

use crate::retention::ConsumerRetention;

/// Settings of a consumer.
#[derive(Debug, Clone)]
pub struct ConsumerConfig {
    /// The consumer's name: its inbox rows and its sweep keys are its own.
    pub name: String,
    /// The queue to consume.
    pub queue: String,
    /// Unacknowledged deliveries the broker may send ahead. Default: 128.
    pub prefetch: u16,
    /// Deliveries in hand at once (handled, or waiting for their inbox batch).
    /// Default: 64.
    pub concurrency: usize,
    /// With the PostgreSQL inbox ([`crate::PgConsumerWorker`]): the most first
    /// deliveries recorded and handled in one inbox transaction. Deliveries without
    /// an ordering key that wait while the consumer's transactions are busy are
    /// gathered and committed together, each handler under a savepoint of its own
    /// (a failure rolls back its own writes only); up to
    /// `concurrency / inbox_batch` (rounded up) transactions run at once, each
    /// running its handlers one after another. So handlers that mostly wait on
    /// something other than this database (a remote call) run fewer at a time:
    /// for those, set 1, one transaction per delivery, `concurrency` at once.
    /// Keyed deliveries and retries always have a transaction each. At most 32 (each
    /// delivery's savepoint is a subtransaction, of which PostgreSQL keeps 64 a
    /// transaction in shared memory). Default: 16, so 4 transactions of up to 16
    /// deliveries: under load a batch takes what waits, at low load a delivery
    /// finds a free transaction and is handled at once, alone.
    pub inbox_batch: usize,
    /// Keep order by key: deliveries with an ordering key (the
    /// [`outbox_ports::ORDERING_KEY_HEADER`] the relay sets from
    /// `NewMessage::with_ordering_key`) are handled one after another per key, in
    /// the order they arrive (a lane per key; other keys and deliveries without a
    /// key run concurrently, up to `concurrency`). A delivery that arrives while an
    /// earlier one of its key is unfinished in the inbox (failed and waiting for its
    /// retry, or being handled by the sweep) is recorded and acknowledged without
    /// running its handler; the consume sweep runs it once every earlier one of its
    /// key is consumed or dead. So a failure holds back its own key only. Order
    /// holds within one consuming process; with several processes on one queue, use
    /// a single-active-consumer queue (or a sharded exchange and shard queues of
    /// its own for each process, see [`Self::shards`]) so that one key reaches one
    /// process. Default: off.
    pub ordered_by_key: bool,
    /// Longest a handler may run before it counts as failed.
    pub handler_timeout: Duration,
    /// When failed deliveries are retried, and when they are dead.
    pub retry: RetryPolicy,
    /// First pause before a delivery in hand tries the inbox again when it cannot
    /// be reached; the pause doubles up to [`STORE_RETRY_MAX`] (or this, if
    /// longer). Meanwhile the delivery stays in hand, unacknowledged, and the
    /// consumer takes no more: returning it would count against a quorum queue's
    /// delivery limit each time, and the broker drops or dead-letters a message
    /// past it. Deliveries go back to the broker only when the consumer stops.
    pub store_error_backoff: Duration,
    /// Largest body handled; a larger delivery is kept as a dead letter (with its
    /// message id) instead of reaching a handler.
    pub max_payload_bytes: usize,
    /// Longest wait for the broker to take an ack or nack. A connection that dies
    /// under an ack can leave it unanswered; without a bound, the delivery's slot
    /// (and a clean shutdown) would wait forever. The broker redelivers it.
    pub settle_timeout: Duration,
    /// Deleting old consumed inbox rows; run by [`crate::PgConsumerWorker`], and by
    /// a backend-neutral worker whose inbox has retention
    /// ([`crate::NeutralInbox::retained`]).
    pub retention: ConsumerRetention,
    /// The queue the broker dead-letters `queue`'s deliveries into when it gives
    /// up on them (a quorum queue's delivery limit: the topology's
    /// `dead_letter_queue`). The worker drains it beside `queue`: each delivery is
    /// stored as this consumer's dead inbox row, its last error naming the
    /// broker's `x-death` reason and count (or kept as a dead letter when it cannot
    /// be decoded), so nothing the broker gives up on vanishes and an operator can
    /// reconsume it. Default: none.
    pub dead_letter_queue: Option<String>,
    /// The worker counts as stalled (see [`InboxWorker::progress`]) once deliveries
    /// are in hand, or the inbox refuses them, and none has been recorded for this
    /// long. Keep it above `handler_timeout`: a handler's own time counts.
    pub stall_after: Duration,
    /// 1: consume `queue`. `n > 1`: `queue` is a sharded queue (the RabbitMQ
    /// topology's `QueueSpec::shards`): consume its `n` shards `queue.shard-0`, ...
    /// with a worker loop each (its own `prefetch`, `concurrency` and, with
    /// `ordered_by_key`, lanes: a key's messages all come through one shard), all
    /// recording in this consumer's inbox under `name` and drained by one consume
    /// sweep. With a `dead_letter_queue`, shard `i` drains `dead_letter_queue.shard-i`.
    /// Default: 1.
    pub shards: u16,
}

impl ConsumerConfig {
    /// Defaults for consumer `name` on `queue`.
    pub fn new(name: impl Into<String>, queue: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            queue: queue.into(),
            prefetch: 128,
            concurrency: 64,
            inbox_batch: 16,
            ordered_by_key: false,
            handler_timeout: Duration::from_secs(30),
            retry: RetryPolicy::default(),
            store_error_backoff: Duration::from_secs(1),
            max_payload_bytes: outbox_core::message::DEFAULT_MAX_PAYLOAD_BYTES,
            settle_timeout: Duration::from_secs(10),
            retention: ConsumerRetention::default(),
            dead_letter_queue: None,
            stall_after: outbox_runtime::stall::DEFAULT_STALL_AFTER,
            shards: 1,
        }
    }

    /// The settings of each shard's worker loop: this one when there is one shard;
    /// otherwise one per shard, its `queue` (and `dead_letter_queue`) that shard's.
    #[must_use]
    pub fn per_shard(&self) -> Vec<Self> {
        if self.shards <= 1 {
            return vec![self.clone()];
        }
        (0..self.shards)
            .map(|i| Self {
                queue: shard_name(&self.queue, i),
                dead_letter_queue: self.dead_letter_queue.as_ref().map(|d| shard_name(d, i)),
                shards: 1,
                ..self.clone()
            })
            .collect()
    }

    /// The inbox lease of one handling: the handler timeout plus a margin, so a live
    /// worker never loses its delivery to the sweep.
    #[must_use]
    pub fn lease_ttl(&self) -> Duration {
        self.handler_timeout + Duration::from_secs(10)
    }
}
