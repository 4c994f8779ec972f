//! The consuming side: handlers, the inbox-deduplicating worker, and the consume
//! retry sweep task.
//!
//! A delivery is recorded in the inbox under a lease before its handler runs; a
//! redelivery of a message already recorded is acknowledged and skipped. A handler
//! error, panic or timeout is stored as a failure and retried by the consume sweep
//! (in this process, which owns the handlers) until it succeeds or is dead.
//!
//! The handler here gets no transaction, so with a backend-neutral inbox its effect
//! is at least once: a crash between the effect and the inbox mark repeats it. The
//! PostgreSQL inbox offers handlers that write in the inbox's own transaction, which
//! makes the effect exactly once.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::{BatchCounts, Decision, HandlerFailure, Message};
use outbox_ports::{
    Arrival, ClaimedDelivery, Clock, DeadLetter, Delivery, InboxConsumerPath, InboxRetention,
    Lease, PortError, Subscriber,
};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

pub use crate::config::ConsumerConfig;
pub use crate::counters::ConsumerCounters;
pub use crate::handler::{Handler, HandlerError, HandlerRegistry, Handlers, handler_fn};
use crate::lanes::Lanes;
use crate::layer::{self, HandlingLayer, HandlingOf};
pub use crate::outcome::{Failure, Handled, Unrecorded};
use outbox_runtime::{LeaseFactory, Random, SweepTask, sleep_or_cancel};

/// The longest pause between two tries of an unreachable inbox by a delivery in
/// hand (unless [`ConsumerConfig::store_error_backoff`] is longer).
pub const STORE_RETRY_MAX: Duration = Duration::from_secs(2);

/// Whether the inbox answers, as the deliveries in hand last found it: a delivery
/// that cannot be recorded closes the gate, one recorded opens it again. The
/// consuming loop takes no delivery while it is closed, so an outage holds at most
/// the deliveries already in hand (each retrying in place) instead of taking the
/// whole prefetch and returning it to the broker again and again.
#[derive(Debug)]
pub(crate) struct StoreGate {
    down: tokio::sync::watch::Sender<bool>,
}

impl Default for StoreGate {
    fn default() -> Self {
        Self {
            down: tokio::sync::watch::channel(false).0,
        }
    }
}

impl StoreGate {
    /// The inbox could not be reached. `true` when this closed the gate.
    pub(crate) fn close(&self) -> bool {
        self.down
            .send_if_modified(|down| !std::mem::replace(down, true))
    }

    /// The inbox answered. `true` when this opened the gate.
    pub(crate) fn open(&self) -> bool {
        self.down
            .send_if_modified(|down| std::mem::replace(down, false))
    }

    fn is_closed(&self) -> bool {
        *self.down.borrow()
    }

    /// Returns once the gate is open.
    async fn opened(&self) {
        let mut rx = self.down.subscribe();
        // The sender lives as long as `self`, so this cannot fail while borrowed.
        let _ = rx.wait_for(|down| !*down).await;
    }
}

/// Tries `attempt` until it succeeds, holding whatever it is for: after a failure,
/// the gate closes and the next try comes after a pause that doubles from
/// `config.store_error_backoff` up to [`STORE_RETRY_MAX`]. `None` when `cancel`
/// fired first (the caller then returns its delivery to the broker).
pub(crate) async fn until_stored<T, F, Fut>(
    config: &ConsumerConfig,
    gate: &StoreGate,
    cancel: &CancellationToken,
    what: &str,
    message_id: Option<&str>,
    mut attempt: F,
) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, PortError>>,
{
    let consumer = &config.name;
    let cap = STORE_RETRY_MAX.max(config.store_error_backoff);
    let mut pause = config.store_error_backoff;
    let mut failures = 0_u32;
    loop {
        match attempt().await {
            Ok(done) => {
                if gate.open() {
                    tracing::info!(%consumer, "inbox reachable again; taking deliveries");
                }
                return Some(done);
            }
            Err(error) => {
                failures = failures.saturating_add(1);
                if gate.close() {
                    tracing::warn!(%consumer, %error, "inbox unreachable; holding the deliveries in hand and taking no more until it answers");
                }
                if failures == 1 {
                    tracing::warn!(%consumer, ?message_id, %error, "cannot {what}; holding the delivery and trying again");
                } else {
                    tracing::debug!(%consumer, ?message_id, %error, failures, "cannot {what} yet; still holding the delivery");
                }
                if !sleep_or_cancel(pause, cancel).await {
                    return None;
                }
                pause = (pause * 2).min(cap);
            }
        }
    }
}

/// What one attempt needs to know: who consumes, the handler timeout, the retry
/// policy and its jitter.
#[derive(Clone, Copy)]
pub struct AttemptContext<'a> {
    /// The consumer's settings.
    pub config: &'a ConsumerConfig,
    random: Random,
}

impl AttemptContext<'_> {
    /// The retry decision for a retryable failure of attempt number `attempt`
    /// (1 = first), by the consumer's policy.
    #[must_use]
    pub fn decide(&self, attempt: u32) -> Decision {
        self.config.retry.decide(attempt, (self.random)())
    }

    /// The retry decision for `failure` of attempt number `attempt` (1 = first):
    /// its class and its type's policy (or the consumer's) decide.
    #[must_use]
    pub fn decide_failure(&self, attempt: u32, failure: &HandlerFailure) -> Decision {
        failure.decide(attempt, (self.random)(), &self.config.retry)
    }
}

/// How a consumer records a delivery and runs its handler: the one thing the
/// backend-neutral inbox ([`NeutralInbox`]) and the PostgreSQL transactional inbox
/// (`PgTxInbox`, feature `postgres`) do differently. Everything around it (the
/// consuming loop, decoding and dead letters, leases, counters, acknowledgement,
/// the retry sweep's batching, retention) is [`InboxWorker`]'s.
#[async_trait]
pub trait InboxPath: Send + Sync + 'static {
    /// The inbox: dead letters and the retry sweep's claims go there.
    fn inbox(&self) -> &dyn InboxConsumerPath;

    /// First handling of a delivered `message` under `lease`: record it, run its
    /// handler unless it is a duplicate, record the outcome.
    ///
    /// # Errors
    /// What could not be recorded, and whether the handler ran.
    async fn handle(
        &self,
        cx: AttemptContext<'_>,
        message: &Message,
        lease: &Lease,
    ) -> Result<Handled, Unrecorded>;

    /// A retry of `due`, claimed under `lease`: run its handler, record the outcome.
    ///
    /// # Errors
    /// What could not be recorded; the row is left to its lease.
    async fn retry(
        &self,
        cx: AttemptContext<'_>,
        due: &ClaimedDelivery,
        lease: &Lease,
    ) -> Result<Handled, Unrecorded>;

    /// The inbox's retention, if it has one: the worker runs its loop beside the
    /// consumer (`config.retention`: old consumed rows deleted, the table vacuumed
    /// when that falls to it).
    fn retention(&self) -> Option<Arc<dyn InboxRetention>> {
        None
    }
}

/// The backend-neutral inbox path: any [`InboxConsumerPath`], [`Handler`]s without a
/// transaction (at least once in effect).
pub struct NeutralInbox {
    inbox: Arc<dyn InboxConsumerPath>,
    handlers: HandlerRegistry,
    retention: Option<Arc<dyn InboxRetention>>,
}

impl NeutralInbox {
    /// Records in `inbox`, runs `handlers`.
    #[must_use]
    pub fn new(inbox: Arc<dyn InboxConsumerPath>, handlers: HandlerRegistry) -> Self {
        Self {
            inbox,
            handlers,
            retention: None,
        }
    }

    /// Records in `inbox`, runs `handlers`, and runs `config.retention` over the
    /// same store beside the consumer (what it records, it deletes when old).
    #[must_use]
    pub fn retained<S>(inbox: Arc<S>, handlers: HandlerRegistry) -> Self
    where
        S: InboxConsumerPath + InboxRetention + 'static,
    {
        let retention: Arc<dyn InboxRetention> = inbox.clone();
        Self::new(inbox, handlers).with_retention(retention)
    }

    /// Runs `config.retention` over `retention` beside the consumer. It must be
    /// the store this path records into (prefer [`Self::retained`], which cannot
    /// be given another): retention deletes the consumer's consumed rows
    /// wherever it is pointed.
    #[must_use]
    pub fn with_retention(mut self, retention: Arc<dyn InboxRetention>) -> Self {
        self.retention = Some(retention);
        self
    }

    /// Runs the handler on a delivery held by `lease` and records the outcome.
    async fn handle_recorded(
        &self,
        cx: AttemptContext<'_>,
        message: &Message,
        lease: &Lease,
        attempts_before: u32,
    ) -> Result<Handled, Unrecorded> {
        let name = &cx.config.name;
        let attempt = attempts_before.saturating_add(1);
        match self
            .handlers
            .run(message, attempt, cx.config.handler_timeout)
            .await
        {
            Ok(()) => match self.inbox.mark_consumed(name, message.id, lease).await {
                Ok(counted) => Ok(Handled::Consumed { counted }),
                Err(error) => Err(Unrecorded::Outcome {
                    error,
                    failure: None,
                }),
            },
            Err(failure) => {
                let decision = cx.decide_failure(attempt, &failure);
                let error = failure.reason;
                let dead = decision == Decision::Dead;
                if dead {
                    tracing::warn!(consumer = %name, message_id = %message.id, %error, "delivery is dead after its last attempt");
                } else {
                    tracing::debug!(consumer = %name, message_id = %message.id, %error, "handler failed; retry scheduled");
                }
                let marked = self
                    .inbox
                    .mark_consume_failed(name, message.id, lease, &error, decision)
                    .await;
                let failure = Failure { error, dead };
                match marked {
                    Ok(_) => Ok(Handled::Failed(failure)),
                    Err(error) => Err(Unrecorded::Outcome {
                        error,
                        failure: Some(failure),
                    }),
                }
            }
        }
    }
}

#[async_trait]
impl InboxPath for NeutralInbox {
    fn inbox(&self) -> &dyn InboxConsumerPath {
        &*self.inbox
    }

    fn retention(&self) -> Option<Arc<dyn InboxRetention>> {
        self.retention.clone()
    }

    async fn handle(
        &self,
        cx: AttemptContext<'_>,
        message: &Message,
        lease: &Lease,
    ) -> Result<Handled, Unrecorded> {
        let name = &cx.config.name;
        match self.inbox.record_arrival(name, message, lease).await {
            Err(e) => Err(Unrecorded::Nothing(e)),
            Ok(Arrival::Duplicate(status)) => {
                let status = status.as_str();
                tracing::debug!(consumer = %name, message_id = %message.id, status, "duplicate delivery skipped");
                Ok(Handled::Duplicate)
            }
            Ok(Arrival::New) => self.handle_recorded(cx, message, lease, 0).await,
        }
    }

    async fn retry(
        &self,
        cx: AttemptContext<'_>,
        due: &ClaimedDelivery,
        lease: &Lease,
    ) -> Result<Handled, Unrecorded> {
        self.handle_recorded(cx, &due.message, lease, due.attempts)
            .await
    }
}

/// What the worker, its delivery tasks and its retry task share.
struct Shared<P> {
    path: P,
    clock: Arc<dyn Clock>,
    config: ConsumerConfig,
    leases: LeaseFactory,
    random: Random,
    counters: Arc<ConsumerCounters>,
    /// Shut while the inbox does not answer: the consuming loop waits on it.
    gate: StoreGate,
    progress: Arc<outbox_runtime::stall::RelayProgress>,
    /// Around each handling (e.g. `process` spans).
    /// Behind a lock so the worker and a retry task taken from it earlier always
    /// share the same one (read once per handling).
    layer: std::sync::RwLock<Option<Arc<dyn HandlingLayer>>>,
}

impl<P: InboxPath> Shared<P> {
    /// The handling layer now.
    fn layer(&self) -> Option<Arc<dyn HandlingLayer>> {
        self.layer
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn cx(&self) -> AttemptContext<'_> {
        AttemptContext {
            config: &self.config,
            random: self.random,
        }
    }

    /// The message of `delivery` ([`decode_or_dead_letter`]: `None` when it was
    /// kept as a dead letter), stored without its key unless this consumer keeps
    /// order by key, so the inbox holds nothing back for it.
    async fn decode(&self, delivery: &Delivery, cancel: &CancellationToken) -> Option<Message> {
        let mut message = decode_or_dead_letter(
            self.path.inbox(),
            &self.config,
            &self.counters,
            &self.gate,
            cancel,
            self.clock.now(),
            delivery,
        )
        .await?;
        if !self.config.ordered_by_key {
            message.ordering_key = None;
        }
        Some(message)
    }

    fn count_failure(&self, failure: &Failure) {
        let c = &self.counters;
        c.consume_failures.fetch_add(1, Ordering::Relaxed);
        if failure.dead {
            c.dead.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn count(&self, handled: &Handled) {
        let c = &self.counters;
        match handled {
            Handled::Duplicate => {
                c.duplicates.fetch_add(1, Ordering::Relaxed);
            }
            Handled::Consumed { counted } => {
                if *counted {
                    c.consumed.fetch_add(1, Ordering::Relaxed);
                }
            }
            Handled::Failed(failure) => self.count_failure(failure),
        }
    }

    /// Handles one delivery and settles it. When the inbox cannot be reached, the
    /// delivery is held and tried again in place (see [`until_stored`]), never
    /// returned to the broker while the worker runs: each return counts against a
    /// quorum queue's delivery limit, and a key's delivery would come back behind
    /// the key's next ones. Once `cancel` fires, a delivery still held (or, with
    /// `ordered_by_key`, still waiting for its lane) goes back to the broker
    /// unhandled.
    async fn handle_delivery(&self, delivery: Delivery, cancel: &CancellationToken) {
        // In hand until this returns, whichever way: the stall watchdog's due work.
        let _held = self.progress.hold();
        let Some(message) = self.decode(&delivery, cancel).await else {
            return;
        };
        if message.ordering_key.is_some() && cancel.is_cancelled() {
            settle(&delivery, false, self.config.settle_timeout).await;
            return;
        }
        let id = message.id.to_string();
        let stored = until_stored(
            &self.config,
            &self.gate,
            cancel,
            "record the delivery in the inbox",
            Some(&id),
            || async {
                let tried = self.try_once(&message).await;
                self.progress.recorded(tried.is_ok());
                tried
            },
        )
        .await;
        settle(&delivery, stored.is_some(), self.config.settle_timeout).await;
    }

    /// Stores one delivery of the dead-letter queue (one the broker gave up on) as
    /// this consumer's dead inbox row and acknowledges it; its handler does not
    /// run. Held and tried again while the inbox cannot be reached, as
    /// [`Shared::handle_delivery`] does.
    /// `shard`: the settings of the shard whose dead-letter queue it came from.
    async fn handle_given_up(
        &self,
        shard: &ConsumerConfig,
        delivery: Delivery,
        cancel: &CancellationToken,
    ) {
        let name = &self.config.name;
        // Another queue's given-up delivery (a dead-letter queue shared with a
        // queue of another service): not this consumer's message. As an inbox row
        // it would be lost whenever this consumer holds the same id (the row is
        // there, so the delivery would be acknowledged and gone), and a reconsume
        // would run this consumer's handler on it. Kept raw as a dead letter
        // instead, its reason naming both queues.
        if let Some(d) = delivery
            .envelope
            .death
            .as_ref()
            .filter(|d| is_foreign(shard, d))
        {
            let reason = given_up_reason(shard, Some(d));
            tracing::warn!(consumer = %name, message_id = ?delivery.envelope.message_id, %reason, "a delivery another queue dead-lettered; kept as a dead letter");
            keep_as_dead_letter(
                self.path.inbox(),
                &self.config,
                &self.counters,
                &self.gate,
                cancel,
                &delivery,
                reason,
            )
            .await;
            return;
        }
        let Some(mut message) = self.decode(&delivery, cancel).await else {
            return;
        };
        let death = delivery.envelope.death.as_ref();
        let reason = given_up_reason(shard, death);
        // As it was published, not as it was dead-lettered (to the dead-letter
        // exchange, with the source queue's name as routing key): so a reconsume
        // finds its handler by routing key too.
        if let Some(d) = death {
            if !d.exchange.is_empty() {
                message.exchange.clone_from(&d.exchange);
            }
            if let Some(key) = d.routing_keys.first() {
                message.routing_key.clone_from(key);
            }
        }
        let id = message.id.to_string();
        let recorded = until_stored(
            &self.config,
            &self.gate,
            cancel,
            "record the delivery the broker gave up on",
            Some(&id),
            || self.path.inbox().record_given_up(name, &message, &reason),
        )
        .await;
        match recorded {
            Some(true) => {
                self.counters.dead.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(consumer = %name, message_id = %message.id, %reason, "stored as dead");
            }
            Some(false) => {
                tracing::info!(consumer = %name, message_id = %message.id, %reason, "the inbox holds this message already; left as it is");
            }
            None => {}
        }
        settle(&delivery, recorded.is_some(), self.config.settle_timeout).await;
    }

    /// One try at recording and handling `message` (held behind its key first, if
    /// it has one): `Ok` when the inbox holds it (handled, held, a duplicate, or
    /// handled with its outcome left to the sweep), so it may be acknowledged;
    /// `Err` when nothing was recorded.
    async fn try_once(&self, message: &Message) -> Result<(), PortError> {
        let name = &self.config.name;
        if message.ordering_key.is_some()
            && self.path.inbox().hold_behind_key(name, message).await?
        {
            tracing::debug!(consumer = %name, message_id = %message.id, "an earlier delivery of its key is unfinished; held for the consume sweep");
            self.counters
                .held_behind_key
                .fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        // A holder of this attempt's own: its marks cannot touch the row of another
        // worker handling the same message, nor theirs ours.
        let lease = self.leases.next();
        let handling = self.path.handle(self.cx(), message, &lease);
        let of = HandlingOf {
            config: &self.config,
            message,
            attempt: 1,
            retry: false,
        };
        let result = layer::run(self.layer().as_deref(), of, handling).await;
        match result {
            Ok(handled) => self.count(&handled),
            Err(Unrecorded::Nothing(e)) => return Err(e),
            Err(Unrecorded::Outcome { error, failure }) => {
                if let Some(f) = &failure {
                    self.count_failure(f);
                }
                // The row stays received under our lease; when it runs out, the
                // consume sweep takes it over. Acknowledging is safe: the inbox holds
                // the message.
                tracing::warn!(consumer = %name, message_id = %message.id, %error, "could not record the outcome; the consume sweep will retry it");
            }
        }
        Ok(())
    }
}

/// Whether the broker dead-lettered `death`'s delivery from another queue than
/// this consumer's (an `x-death` without a queue is taken as this one's).
fn is_foreign(config: &ConsumerConfig, death: &outbox_ports::Death) -> bool {
    !death.queue.is_empty() && death.queue != config.queue
}

/// Why a delivery of the dead-letter queue is dead. One the broker dead-lettered
/// from another queue than this consumer's (a dead-letter queue several queues
/// share) is still kept, visibly, as a dead letter: acknowledged without a record
/// it would be lost, and sent back it would come round forever. Its reason names
/// both queues.
fn given_up_reason(config: &ConsumerConfig, death: Option<&outbox_ports::Death>) -> String {
    match death {
        Some(d) if d.queue != config.queue => format!(
            "the broker dead-lettered this delivery from queue {:?}, not from this consumer's queue {:?} (is dead-letter queue {:?} shared?): {d}",
            d.queue,
            config.queue,
            delivery_queue(config)
        ),
        Some(d) => format!("the broker gave up on this delivery and dead-lettered it: {d}"),
        None => format!(
            "arrived on dead-letter queue {:?} without an x-death header",
            delivery_queue(config)
        ),
    }
}

/// The dead-letter queue a consumer drains, for messages.
fn delivery_queue(config: &ConsumerConfig) -> &str {
    config.dead_letter_queue.as_deref().unwrap_or_default()
}

/// Consumes a queue: inbox dedup, handler, failure recording, acknowledgement; with
/// an inbox that has retention, its retention loop beside. `P` is how a delivery is
/// recorded and handled: [`ConsumerWorker`] (backend-neutral) or `PgConsumerWorker`
/// (PostgreSQL, transactional handlers).
pub struct InboxWorker<P> {
    subscriber: Arc<dyn Subscriber>,
    shared: Arc<Shared<P>>,
    /// Where its consumed and failed totals go per minute (the dashboard's chart).
    throughput: Option<Arc<dyn outbox_ports::ThroughputLog>>,
}

/// The backend-neutral consumer worker: any [`InboxConsumerPath`], [`Handler`]s.
pub type ConsumerWorker = InboxWorker<NeutralInbox>;

impl ConsumerWorker {
    /// A worker for `config.queue`, recording in `inbox` as `config.name`.
    pub fn new(
        inbox: Arc<dyn InboxConsumerPath>,
        subscriber: Arc<dyn Subscriber>,
        handlers: HandlerRegistry,
        clock: Arc<dyn Clock>,
        config: ConsumerConfig,
    ) -> Self {
        Self::with_path(
            NeutralInbox::new(inbox, handlers),
            subscriber,
            clock,
            config,
        )
    }
}

impl<P: InboxPath> InboxWorker<P> {
    /// The consumer's name (its inbox rows, its sweep's keys).
    #[must_use]
    pub fn name(&self) -> &str {
        &self.shared.config.name
    }

    /// The consumer's settings.
    #[must_use]
    pub fn config(&self) -> &ConsumerConfig {
        &self.shared.config
    }

    /// A worker for `config.queue`, recording and handling through `path` as
    /// `config.name`.
    pub fn with_path(
        path: P,
        subscriber: Arc<dyn Subscriber>,
        clock: Arc<dyn Clock>,
        config: ConsumerConfig,
    ) -> Self {
        let leases = LeaseFactory::new(
            LeaseFactory::instance_id(&format!("consumer-{}", config.name)),
            config.lease_ttl(),
        );
        let config_name = config.name.clone();
        Self {
            subscriber,
            shared: Arc::new(Shared {
                path,
                clock,
                config,
                leases,
                random: outbox_runtime::default_random,
                counters: Arc::default(),
                gate: StoreGate::default(),
                progress: Arc::new(outbox_runtime::stall::RelayProgress::for_consumer(
                    &config_name,
                )),
                layer: std::sync::RwLock::new(layer::default_handling_layer()),
            }),
            throughput: None,
        }
    }

    /// Adds its consumed deliveries and failed handler attempts to `log` every few
    /// seconds while it runs (and once more as it stops): the per-minute totals the
    /// dashboard charts, shared with the relays that add their publishes.
    #[must_use]
    pub fn with_throughput(mut self, log: Arc<dyn outbox_ports::ThroughputLog>) -> Self {
        self.throughput = Some(log);
        self
    }

    /// Runs `layer` around each handling instead of the default one (`process`
    /// spans with the `otel` feature); `None`: no layer. The worker's retry task
    /// ([`retry_task`](Self::retry_task)) shares it, whenever it was taken.
    #[must_use]
    pub fn with_handling_layer(self, layer: Option<Arc<dyn HandlingLayer>>) -> Self {
        *self
            .shared
            .layer
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = layer;
        self
    }

    /// The worker's progress: while it runs, a watchdog finds it stalled when
    /// deliveries are in hand (or the inbox refuses them) and none has been
    /// recorded for `config.stall_after`, and clears by itself; served as `/readyz`
    /// by [`crate::http::serve_consumer_ready`].
    #[must_use]
    pub fn progress(&self) -> Arc<outbox_runtime::stall::RelayProgress> {
        Arc::clone(&self.shared.progress)
    }

    /// This worker's counters.
    #[must_use]
    pub fn counters(&self) -> Arc<ConsumerCounters> {
        Arc::clone(&self.shared.counters)
    }

    /// The consume retry task for this consumer's sweep, sharing handlers and
    /// counters.
    #[must_use]
    pub fn retry_task(&self) -> InboxRetryTask<P> {
        InboxRetryTask {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Consumes until `cancel` fires or the subscription ends, then stops taking
    /// deliveries and waits for those in hand (each bounded by the handler timeout).
    /// Deliveries not yet acknowledged go back to the broker. The inbox's retention
    /// (`config.retention`, if the inbox has one) runs alongside until then; a panic
    /// in it is logged as an error and it starts again after an interval.
    pub async fn run(self, cancel: CancellationToken) {
        let shared = Arc::clone(&self.shared);
        let config = &self.shared.config;
        let stop_retention = cancel.child_token();
        let retention = {
            let shared = Arc::clone(&self.shared);
            let stop = stop_retention.clone();
            let make = move || {
                let s = &shared;
                let store = s.path.retention()?;
                let run: crate::retention::RetentionLoop =
                    Box::pin(crate::retention::run_retention(
                        store,
                        s.config.name.clone(),
                        s.config.retention,
                        Arc::clone(&s.counters),
                        stop.clone(),
                    ));
                Some(run)
            };
            // Only spawned when the inbox has retention.
            make().map(|first| {
                tokio::spawn(crate::retention::supervise(
                    config.name.clone(),
                    config.retention.interval(),
                    first,
                    make,
                    stop_retention.clone(),
                ))
            })
        };
        // Until the loops below have handled what they hold, so the last counts
        // are added too.
        let stop_throughput = CancellationToken::new();
        let recorders: Vec<_> = self
            .throughput
            .iter()
            .flat_map(|log| {
                [
                    outbox_runtime::ThroughputRecorder::of_total(
                        Arc::clone(log),
                        outbox_ports::ThroughputKind::Consumed,
                        Arc::clone(&self.shared.counters),
                        |c| &c.consumed,
                    ),
                    outbox_runtime::ThroughputRecorder::of_total(
                        Arc::clone(log),
                        outbox_ports::ThroughputKind::ConsumeFailed,
                        Arc::clone(&self.shared.counters),
                        |c| &c.consume_failures,
                    ),
                    // The same under the consumer's name, for its own chart.
                    outbox_runtime::ThroughputRecorder::of_total(
                        Arc::clone(log),
                        outbox_ports::ThroughputKind::Consumed,
                        Arc::clone(&self.shared.counters),
                        |c| &c.consumed,
                    )
                    .named(config.name.clone()),
                    outbox_runtime::ThroughputRecorder::of_total(
                        Arc::clone(log),
                        outbox_ports::ThroughputKind::ConsumeFailed,
                        Arc::clone(&self.shared.counters),
                        |c| &c.consume_failures,
                    )
                    .named(config.name.clone()),
                ]
            })
            .map(|r| tokio::spawn(r.run(stop_throughput.clone())))
            .collect();
        let stop_watch = cancel.child_token();
        let watchdog = tokio::spawn(outbox_runtime::stall::watch(
            Arc::clone(&self.shared.progress),
            None,
            config.stall_after.max(Duration::from_millis(1)),
            stop_watch.clone(),
        ));
        // Whether an operator paused this consumer: every loop below (each shard
        // and its dead-letter queue) stops taking deliveries while it is.
        let stop_pause_watch = cancel.child_token();
        let (paused, pause_watch) = {
            let s = Arc::clone(&self.shared);
            let read = move || {
                let s = Arc::clone(&s);
                async move { s.path.inbox().consumer_paused(&s.config.name).await }
            };
            crate::pause::watch_paused(read, config.name.clone(), stop_pause_watch.clone()).await
        };
        let paused = &paused;
        let subscriber = &*self.subscriber;
        let gate = &self.shared.gate;
        let shards = config.per_shard();
        let loops = shards.iter().map(|shard| {
            let shared = Arc::clone(&shared);
            let cancel = &cancel;
            async move {
                let main = {
                    let shared = Arc::clone(&shared);
                    consume(subscriber, shard, gate, paused, cancel, move |d| {
                        let shared = Arc::clone(&shared);
                        let stop = cancel.clone();
                        async move { shared.handle_delivery(d, &stop).await }
                    })
                };
                // The dead-letter queue: what the broker gave up on. Its own loop,
                // sharing the gate (an unreachable inbox stops both), with a few
                // deliveries at a time: storing a dead row is one statement and runs
                // no handler.
                let given_up = shard.dead_letter_queue.as_ref().map(|queue| {
                    let dead_config = ConsumerConfig {
                        queue: queue.clone(),
                        prefetch: shard.prefetch.min(16),
                        concurrency: shard.concurrency.min(4),
                        ordered_by_key: false,
                        ..shard.clone()
                    };
                    let shard = Arc::new(shard.clone());
                    async move {
                        consume(subscriber, &dead_config, gate, paused, cancel, move |d| {
                            let shared = Arc::clone(&shared);
                            let shard = Arc::clone(&shard);
                            let stop = cancel.clone();
                            async move { shared.handle_given_up(&shard, d, &stop).await }
                        })
                        .await;
                    }
                });
                match given_up {
                    Some(given_up) => {
                        tokio::join!(main, given_up);
                    }
                    None => main.await,
                }
            }
        });
        futures::future::join_all(loops).await;
        // The subscription can end before the token fires; retention stops with the
        // worker either way: after the delete in hand, or at once during the
        // inbox's vacuum (dropped, its connection closes and the server ends it).
        stop_retention.cancel();
        stop_watch.cancel();
        stop_pause_watch.cancel();
        stop_throughput.cancel();
        for recorder in recorders {
            if let Err(e) = recorder.await {
                tracing::error!(consumer = %config.name, error = %e, "throughput recorder ended abnormally");
            }
        }
        if let Err(e) = pause_watch.await {
            tracing::error!(consumer = %config.name, error = %e, "pause watch ended abnormally");
        }
        if let Err(e) = watchdog.await {
            tracing::error!(consumer = %config.name, error = %e, "stall watchdog ended abnormally");
        }
        if let Some(retention) = retention
            && let Err(e) = retention.await
        {
            tracing::error!(consumer = %config.name, error = %e, "inbox retention task ended abnormally");
        }
    }
}

/// The consuming loop shared by the workers: subscribe (retrying), take deliveries
/// while fewer than `config.concurrency` are in hand, hand each to `handle` in a task
/// of its own; on cancellation stop taking and wait for those in hand.
///
/// While `paused` says so, it holds no subscription: a pause cancels the
/// subscription, handles what the broker had sent before (settled as usual, never
/// handed back), waits for every delivery in hand, and subscribes again once the
/// pause is lifted.
pub(crate) async fn consume<F, Fut>(
    subscriber: &dyn Subscriber,
    config: &ConsumerConfig,
    gate: &StoreGate,
    paused: &watch::Receiver<bool>,
    cancel: &CancellationToken,
    handle: F,
) where
    F: Fn(Delivery) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let name = &config.name;
    let mut paused = paused.clone();
    loop {
        // Read, then let go: the watch's guard must not be held across an await.
        let is_paused = *paused.borrow_and_update();
        if is_paused {
            tracing::info!(consumer = %name, queue = %config.queue, "consumer paused; taking no deliveries");
            tokio::select! {
                () = cancel.cancelled() => break,
                // The watch ends only with the worker.
                _ = async { paused.wait_for(|p| !*p).await.is_ok() } => {}
            }
            tracing::info!(consumer = %name, queue = %config.queue, "consumer resumed");
        }
        match subscription(subscriber, config, gate, &mut paused, cancel, &handle).await {
            Ended::Paused => {}
            Ended::Stopped => break,
        }
    }
    tracing::info!(consumer = %name, "consumer stopped");
}

/// Why a subscription was left.
enum Ended {
    /// The consumer was paused: what it had was handled.
    Paused,
    /// Cancelled, or the broker ended it.
    Stopped,
}

/// Failed attempts to subscribe: the pause before the next (1 s, doubling to
/// 5 s: a broker back from a restart is found again within seconds), and whether this failure says something the log has not said yet (a
/// missing queue would otherwise log the same ERROR every second, forever).
#[derive(Default)]
struct SubscribeRefusals {
    failed: u32,
    last_error: String,
    news: bool,
}

impl SubscribeRefusals {
    /// Records a failure with `error`; returns the pause before the next attempt.
    fn failed(&mut self, error: &str) -> Duration {
        self.news = self.failed == 0 || error != self.last_error;
        error.clone_into(&mut self.last_error);
        self.failed = self.failed.saturating_add(1);
        let doublings = (self.failed - 1).min(3);
        Duration::from_secs(1 << doublings).min(Duration::from_secs(5))
    }

    /// Whether the last failure is the first, or another error than the one before.
    const fn is_news(&self) -> bool {
        self.news
    }
}

/// One subscription of [`consume`], until it is cancelled, paused or ended.
async fn subscription<F, Fut>(
    subscriber: &dyn Subscriber,
    config: &ConsumerConfig,
    gate: &StoreGate,
    paused: &mut watch::Receiver<bool>,
    cancel: &CancellationToken,
    handle: &F,
) -> Ended
where
    F: Fn(Delivery) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let name = &config.name;
    let mut refusals = SubscribeRefusals::default();
    let mut stream = loop {
        // Paused meanwhile (the broker was away): no subscription at all.
        if *paused.borrow() {
            return Ended::Paused;
        }
        match subscriber.subscribe(&config.queue, config.prefetch).await {
            Ok(s) => {
                if refusals.failed > 0 {
                    tracing::info!(consumer = %name, queue = %config.queue, failed_attempts = refusals.failed, "subscribed after failed attempts");
                }
                break s;
            }
            Err(e) => {
                let pause = refusals.failed(&e.to_string());
                if refusals.is_news() {
                    tracing::error!(consumer = %name, queue = %config.queue, error = %e, retry_in = %outbox_core::duration::format(pause), "cannot subscribe; retrying with backoff (logged again when the error changes)");
                } else {
                    tracing::debug!(consumer = %name, queue = %config.queue, error = %e, "cannot subscribe; retrying");
                }
                if !sleep_or_cancel(pause, cancel).await {
                    return Ended::Stopped;
                }
            }
        }
    };
    // Subscribed just as a pause came: the pause arm below cancels at once.
    tracing::info!(consumer = %name, queue = %config.queue, "consumer started");
    let permits = Arc::new(Semaphore::new(config.concurrency.max(1)));
    let mut in_hand = JoinSet::new();
    let lanes = Lanes::default();
    // Paused: the subscription is cancelled and what it still hands out is taken
    // and handled until its end.
    let mut draining = false;
    let ended = loop {
        // A delivery of a key's lane takes its permit when its turn comes, so one
        // key's queue of deliveries never holds the permits other keys need (the
        // prefetch bounds how many wait); any other takes one before it is taken.
        let permit = if config.ordered_by_key {
            None
        } else {
            tokio::select! {
                () = cancel.cancelled() => break Ended::Stopped,
                p = Arc::clone(&permits).acquire_owned() => match p {
                    Ok(p) => Some(p),
                    Err(_) => break Ended::Stopped,
                },
            }
        };
        // While the inbox does not answer, the deliveries in hand wait for it and
        // nothing more is taken: the rest stays with the broker (or unacknowledged
        // in the prefetch), uncounted against any delivery limit.
        if gate.is_closed() {
            tokio::select! {
                () = cancel.cancelled() => break Ended::Stopped,
                () = gate.opened() => {}
            }
        }
        let next = tokio::select! {
            () = cancel.cancelled() => break Ended::Stopped,
            // A bool, not the watch's guard, which must not live across an await.
            _ = async { paused.wait_for(|p| *p).await.is_ok() }, if !draining => {
                draining = true;
                // Bounded, and given up on shutdown: on a half-open connection the
                // cancel's answer may never come (the stream then ends when the
                // connection is found dead, and the broker takes back what is
                // unsettled).
                tokio::select! {
                    () = cancel.cancelled() => break Ended::Stopped,
                    done = tokio::time::timeout(CANCEL_TIMEOUT, stream.cancel()) => match done {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => tracing::warn!(consumer = %name, queue = %config.queue, error = %e, "cancelling the subscription for a pause failed"),
                        Err(_) => {
                            tracing::warn!(consumer = %name, queue = %config.queue, "no answer to the subscription's cancel within 5s; leaving it");
                            break Ended::Paused;
                        }
                    },
                }
                continue;
            }
            d = stream.next() => d,
        };
        match next {
            None if draining => break Ended::Paused,
            None => {
                tracing::info!(consumer = %name, "subscription ended");
                break Ended::Stopped;
            }
            Some(Err(e)) => {
                tracing::warn!(consumer = %name, error = %e, "delivery stream error");
                if !sleep_or_cancel(Duration::from_secs(1), cancel).await {
                    break Ended::Stopped;
                }
            }
            Some(Ok(delivery)) => {
                let turn = match &delivery.envelope.ordering_key {
                    Some(key) if config.ordered_by_key => Some(lanes.join(key)),
                    _ => None,
                };
                let permit = match permit {
                    Some(p) => Some(p),
                    // Ordered, without a key: a permit before it is handed on.
                    None if turn.is_none() => tokio::select! {
                        () = cancel.cancelled() => {
                            drop(delivery);
                            break Ended::Stopped;
                        }
                        p = Arc::clone(&permits).acquire_owned() => match p {
                            Ok(p) => Some(p),
                            Err(_) => break Ended::Stopped,
                        },
                    },
                    None => None,
                };
                let job = handle(delivery);
                let permits = Arc::clone(&permits);
                in_hand.spawn(async move {
                    let mut turn = turn;
                    if let Some(t) = &mut turn {
                        t.wait().await;
                    }
                    let permit = match permit {
                        Some(p) => Some(p),
                        None => permits.acquire_owned().await.ok(),
                    };
                    job.await;
                    drop(permit);
                    // Dropping the turn lets the key's next delivery go.
                    drop(turn);
                });
            }
        }
        while in_hand.try_join_next().is_some() {}
    };
    // The deliveries in hand are settled before the subscription's channel is
    // closed (dropping the stream closes it): closed first, their acks would fail
    // and the broker would deliver them again.
    while in_hand.join_next().await.is_some() {}
    drop(stream);
    ended
}

/// How long a pause waits for the broker to answer the subscription's cancel.
const CANCEL_TIMEOUT: Duration = Duration::from_secs(5);

/// The message of a delivery; an undecodable or oversized one is kept as a dead
/// letter and acknowledged, and `None` comes back. While the dead letter cannot be
/// stored, the delivery is held and tried again (see [`until_stored`]); it goes back
/// to the broker only when `cancel` fires first.
pub(crate) async fn decode_or_dead_letter(
    inbox: &dyn InboxConsumerPath,
    config: &ConsumerConfig,
    counters: &ConsumerCounters,
    gate: &StoreGate,
    cancel: &CancellationToken,
    now: outbox_core::Timestamp,
    delivery: &Delivery,
) -> Option<Message> {
    let env = &delivery.envelope;
    let consumer = &config.name;
    let decoded = if env.body.len() > config.max_payload_bytes {
        Err(format!(
            "payload of {} bytes is over this consumer's limit of {} bytes",
            env.body.len(),
            config.max_payload_bytes
        ))
    } else {
        env.to_message(now).map_err(|e| e.to_string())
    };
    match decoded {
        Ok(m) => Some(m),
        Err(reason) => {
            // Dead-lettered by the broker too: the letter says so.
            let reason = match &env.death {
                Some(death) => format!("{reason}; dead-lettered by the broker: {death}"),
                None => reason,
            };
            tracing::warn!(%consumer, message_id = ?env.message_id, %reason, "delivery kept as a dead letter");
            keep_as_dead_letter(inbox, config, counters, gate, cancel, delivery, reason).await;
            None
        }
    }
}

/// Keeps `delivery` raw (body, headers) as a dead letter of this consumer with
/// `reason`, then acknowledges it; while the inbox cannot be reached it is held
/// and tried again, and returned to the broker if the worker stops first.
async fn keep_as_dead_letter(
    inbox: &dyn InboxConsumerPath,
    config: &ConsumerConfig,
    counters: &ConsumerCounters,
    gate: &StoreGate,
    cancel: &CancellationToken,
    delivery: &Delivery,
    reason: String,
) {
    let env = &delivery.envelope;
    let letter = DeadLetter {
        message_id: env.message_id.clone(),
        routing_key: env.routing_key.clone(),
        headers: env.headers.clone(),
        body: env.body.clone(),
        reason,
    };
    let kept = until_stored(
        config,
        gate,
        cancel,
        "keep the dead letter",
        env.message_id.as_deref(),
        || inbox.record_dead_letter(&config.name, letter.clone()),
    )
    .await;
    if kept.is_some() {
        counters.dead_letters.fetch_add(1, Ordering::Relaxed);
    }
    settle(delivery, kept.is_some(), config.settle_timeout).await;
}

/// Acknowledges (`true`) or returns (`false`) a delivery, waiting at most
/// `timeout`. A failure only means the broker delivers it again, which the inbox
/// absorbs.
pub(crate) async fn settle(delivery: &Delivery, ack: bool, timeout: Duration) {
    let settling = async {
        if ack {
            delivery.acker.ack().await
        } else {
            delivery.acker.nack(true).await
        }
    };
    match tokio::time::timeout(timeout, settling).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "could not settle a delivery; the broker will redeliver it");
        }
        Err(_) => tracing::warn!(
            ?timeout,
            "the broker did not answer an ack or nack in time; the delivery will be redelivered"
        ),
    }
}

/// A consumer's retry sweep work: run the handler again for failed deliveries whose
/// next attempt is due, and for received ones whose worker vanished. `P` as in
/// [`InboxWorker`].
pub struct InboxRetryTask<P> {
    shared: Arc<Shared<P>>,
}

/// The backend-neutral consume retry task.
pub type ConsumeRetryTask = InboxRetryTask<NeutralInbox>;

#[async_trait]
impl<P: InboxPath> SweepTask for InboxRetryTask<P> {
    fn name(&self) -> &'static str {
        "consume-retry"
    }

    fn subject(&self) -> Option<&str> {
        Some(&self.shared.config.name)
    }

    async fn run_batch(&self, limit: u32) -> Result<BatchCounts, PortError> {
        self.run_batch_while_held(limit, &|| true).await
    }

    async fn run_batch_while_held(
        &self,
        limit: u32,
        held: &(dyn Fn() -> bool + Send + Sync),
    ) -> Result<BatchCounts, PortError> {
        let s = &self.shared;
        let mut counts = BatchCounts::default();
        // A paused consumer runs no handler, its retries included: asked before
        // the batch and again each PAUSE_POLL within it.
        let paused = async || s.path.inbox().consumer_paused(&s.config.name).await;
        if paused().await? {
            return Ok(counts);
        }
        let mut asked = std::time::Instant::now();
        // One claim per row, each under a lease of its own taken just before its
        // handler runs: a lease on a whole batch would run out for the rows at its end
        // while the first ones are handled, and a redelivery or another sweep would run
        // the same handler at the same time. Each handler may take up to its timeout,
        // so the sweep's lock is checked before every claim: once it is lost, another
        // instance sweeps, and this one stops claiming.
        while counts.claimed < u64::from(limit) && held() {
            if asked.elapsed() >= crate::pause::PAUSE_POLL {
                if paused().await? {
                    break;
                }
                asked = std::time::Instant::now();
            }
            let lease = s.leases.next();
            let Some(c) = s
                .path
                .inbox()
                .claim_due(&s.config.name, &lease, 1)
                .await?
                .pop()
            else {
                break;
            };
            counts.claimed += 1;
            let retrying = s.path.retry(s.cx(), &c, &lease);
            // With tracing, a retry (also a reconsume) starts a new trace linked to
            // the stored one.
            let of = HandlingOf {
                config: &s.config,
                message: &c.message,
                attempt: c.attempts.saturating_add(1),
                retry: true,
            };
            let result = layer::run(s.layer().as_deref(), of, retrying).await;
            match result {
                Ok(handled) => {
                    s.count(&handled);
                    match handled {
                        Handled::Consumed { .. } => counts.consume_retried += 1,
                        Handled::Failed(_) => counts.consume_failed += 1,
                        Handled::Duplicate => {}
                    }
                }
                Err(unrecorded) => {
                    let error = match unrecorded {
                        Unrecorded::Nothing(error) => error,
                        Unrecorded::Outcome { error, failure } => {
                            if let Some(f) = &failure {
                                s.count_failure(f);
                            }
                            error
                        }
                    };
                    // One row must not end the sweep: this one stays claimed until its
                    // lease runs out, then a later sweep takes it again.
                    tracing::warn!(consumer = %s.config.name, message_id = %c.message.id, %error, "consume retry could not be recorded; left to its lease");
                }
            }
        }
        Ok(counts)
    }
}

#[cfg(test)]
mod tests {
    use outbox_ports::Death;

    use super::{ConsumerConfig, SubscribeRefusals, given_up_reason};

    #[test]
    fn a_refused_subscription_backs_off_and_is_news_only_when_its_error_changes() {
        let mut r = SubscribeRefusals::default();
        let pauses: Vec<u64> = (0..8)
            .map(|_| {
                let pause = r.failed("NOT_FOUND - no queue 'billing'").as_secs();
                assert_eq!(r.is_news(), pause == 1, "only the first is news");
                pause
            })
            .collect();
        assert_eq!(pauses, [1, 2, 4, 5, 5, 5, 5, 5]);
        r.failed("connection refused");
        assert!(r.is_news(), "another error is news");
        r.failed("connection refused");
        assert!(!r.is_news());
    }

    fn death(queue: &str) -> Death {
        Death {
            reason: "delivery_limit".to_owned(),
            count: 1,
            queue: queue.to_owned(),
            exchange: "orders".to_owned(),
            routing_keys: vec!["order.created".to_owned()],
            delivery_count: Some(20),
        }
    }

    #[test]
    fn a_delivery_dead_lettered_from_another_queue_says_so() {
        let mut config = ConsumerConfig::new("billing", "billing.orders");
        config.dead_letter_queue = Some("shared.dlq".to_owned());
        let own = given_up_reason(&config, Some(&death("billing.orders")));
        assert!(own.starts_with("the broker gave up"), "{own}");
        assert!(!own.contains("not from this consumer's queue"), "{own}");
        let other = given_up_reason(&config, Some(&death("shipping.orders")));
        assert!(
            other
                .contains("\"shipping.orders\", not from this consumer's queue \"billing.orders\"")
                && other.contains("\"shared.dlq\" shared"),
            "{other}"
        );
        let none = given_up_reason(&config, None);
        assert!(none.contains("without an x-death header"), "{none}");
    }

    #[test]
    fn each_shard_drains_its_own_dead_letter_queue_and_owns_what_its_queue_gave_up() {
        let config = ConsumerConfig {
            shards: 3,
            dead_letter_queue: Some("billing.dead".to_owned()),
            ..ConsumerConfig::new("billing", "billing")
        };
        let shards = config.per_shard();
        let queues: Vec<(&str, Option<&str>, u16)> = shards
            .iter()
            .map(|c| (c.queue.as_str(), c.dead_letter_queue.as_deref(), c.shards))
            .collect();
        assert_eq!(
            queues,
            vec![
                ("billing.shard-0", Some("billing.dead.shard-0"), 1),
                ("billing.shard-1", Some("billing.dead.shard-1"), 1),
                ("billing.shard-2", Some("billing.dead.shard-2"), 1),
            ]
        );
        assert!(shards.iter().all(|c| c.name == "billing"), "one inbox name");
        let own = given_up_reason(&shards[1], Some(&death("billing.shard-1")));
        assert!(own.starts_with("the broker gave up"), "{own}");
        let next = given_up_reason(&shards[1], Some(&death("billing.shard-2")));
        assert!(next.contains("not from this consumer's queue"), "{next}");
        let one = ConsumerConfig::new("billing", "billing");
        assert_eq!(one.per_shard()[0].queue, "billing");
    }
}
