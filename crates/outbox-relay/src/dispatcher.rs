//! The relay: moves committed messages from the outbox to the broker.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::dispatch::{ClaimTaken, DispatchMachine, DispatchStep, PublishedBatch};
use outbox_core::lease::publish_budget;
use outbox_core::{BatchCounts, Decision, MessageId, RetryPolicy};
use outbox_ports::{
    ClaimedMessage, Lease, OutboxRelayPath, PortError, PublishFailure, PublishOutcome, Publisher,
};
use tokio_util::sync::CancellationToken;

use crate::layer::PublishLayer;
use outbox_runtime::{LeaseFactory, NamedTally, Random, SweepTask, sleep_or_cancel};

/// What publishing one claimed batch did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PublishCounts {
    /// Rows claimed.
    pub claimed: u64,
    /// Confirmed and marked sent.
    pub sent: u64,
    /// Failed and scheduled for a retry.
    pub failed: u64,
    /// Failed for the last time: dead.
    pub dead: u64,
    /// Outcomes not recorded because another claimer holds the row now.
    pub fenced: u64,
    /// Never sent (the broker unreachable or blocking, or the lease's publish budget
    /// ran out): given back untouched, no attempt spent.
    pub unsent: u64,
    /// Of `unsent`, those given back because the publish budget ran out while the
    /// batch was being published, not because the broker could not be reached.
    pub unsent_out_of_time: u64,
}

impl PublishCounts {
    /// Whether messages came back unsent because the broker could not be reached
    /// (rather than only because the batch ran out of its lease's time).
    #[must_use]
    pub const fn broker_unavailable(&self) -> bool {
        self.unsent > self.unsent_out_of_time
    }
}

/// Totals of a relay, for metrics and the demo. Shared by the dispatcher and the
/// publish-retry sweep.
#[derive(Debug, Default)]
pub struct RelayCounters {
    /// Messages marked sent.
    pub published: AtomicU64,
    /// Publish attempts that failed.
    pub publish_failures: AtomicU64,
    /// Messages that went dead.
    pub dead: AtomicU64,
    /// Messages given back unsent because the broker could not be reached.
    pub deferred: AtomicU64,
    /// Per exchange, publishes confirmed and attempts failed since the throughput
    /// recorder last took them (each exchange's chart).
    pub per_exchange: Arc<NamedTally>,
}

impl RelayCounters {
    fn add(&self, c: &PublishCounts) {
        self.published.fetch_add(c.sent, Ordering::Relaxed);
        self.publish_failures
            .fetch_add(c.failed + c.dead, Ordering::Relaxed);
        self.dead.fetch_add(c.dead, Ordering::Relaxed);
        self.deferred.fetch_add(c.unsent, Ordering::Relaxed);
    }
}

/// The outcomes of a published batch, classified and ready to be recorded.
#[derive(Debug)]
pub struct Published {
    lease: Lease,
    sent: Vec<MessageId>,
    failures: Vec<PublishFailure>,
    unsent: Vec<MessageId>,
    counts: PublishCounts,
    /// `(exchange, confirmed, failed attempts)`, an entry an exchange.
    per_exchange: Vec<(String, u64, u64)>,
}

impl Published {
    /// Adds the batch's per-exchange counts to `tally` (once its outcomes are
    /// recorded, as its totals are).
    fn tally_into(per_exchange: &[(String, u64, u64)], tally: &NamedTally) {
        tally.add_all(per_exchange.iter().map(|(e, s, f)| (e.as_str(), *s, *f)));
    }
}

/// Counts one outcome under its exchange: the entries are few (a batch mostly
/// goes to one or two exchanges), so a look from the newest is cheaper than a map.
fn tally(per_exchange: &mut Vec<(String, u64, u64)>, exchange: &str, sent: u64, failed: u64) {
    if let Some(e) = per_exchange.iter_mut().rev().find(|e| e.0 == exchange) {
        e.1 += sent;
        e.2 += failed;
    } else {
        per_exchange.push((exchange.to_owned(), sent, failed));
    }
}

/// Publishes claimed messages within `budget` (what is left of the lease, see
/// [`outbox_core::lease::publish_budget`]) and classifies each outcome: confirmed;
/// never sent (given back, no attempt); permanent (AMQP cannot carry it: dead at
/// once); or failed with the retry policy's decision (retry later, or dead).
pub async fn publish_batch(
    publisher: &dyn Publisher,
    layer: Option<&dyn PublishLayer>,
    lease: Lease,
    claimed: Vec<ClaimedMessage>,
    policy: &RetryPolicy,
    random: Random,
    budget: Duration,
) -> Published {
    let mut counts = PublishCounts {
        claimed: claimed.len() as u64,
        ..PublishCounts::default()
    };
    if claimed.is_empty() {
        return Published {
            lease,
            sent: Vec::new(),
            failures: Vec::new(),
            unsent: Vec::new(),
            counts,
            per_exchange: Vec::new(),
        };
    }
    let mut failures = Vec::new();
    let mut per_exchange = Vec::new();
    // What AMQP cannot carry never reaches the publisher (a client library may
    // panic on it) and is dead at once: no retry can change it.
    let (publishable, unpublishable): (Vec<_>, Vec<_>) = claimed
        .into_iter()
        .partition(|c| c.message.check_amqp().is_ok());
    for c in unpublishable {
        let why = c
            .message
            .check_amqp()
            .err()
            .map_or_else(String::new, |e| e.to_string());
        tally(&mut per_exchange, &c.message.exchange, 0, 1);
        failures.push(permanent_failure(c.message.id, &why, &mut counts));
    }
    let requeued: Vec<bool> = match layer {
        Some(_) => publishable.iter().map(|c| c.requeued).collect(),
        None => Vec::new(),
    };
    let (mut messages, attempts): (Vec<_>, Vec<_>) = publishable
        .into_iter()
        .map(|c| (c.message, c.attempts))
        .unzip();
    // E.g. each message published under a `send` span continuing its stored trace,
    // the span's context in the headers that go to the broker.
    let after = layer.map(|l| {
        l.before_publish(&mut crate::layer::outgoing(
            &mut messages,
            &attempts,
            &requeued,
        ))
    });
    let outcomes = match after {
        // Checked again: a layer's headers may break AMQP's limits.
        Some(_) => publish_checked(publisher, &messages, budget).await,
        None if messages.is_empty() => Vec::new(),
        None => publisher.publish_within(&messages, budget).await,
    };
    if let Some(after) = after {
        after(&outcomes);
    }
    let mut sent: Vec<MessageId> = Vec::with_capacity(messages.len());
    let mut unsent = Vec::new();
    // Failed publishes per exchange (how many, the first error): said once per
    // exchange and interval (`failure_log`), not a line per message.
    let mut failing: std::collections::BTreeMap<&str, (u64, String)> =
        std::collections::BTreeMap::new();
    for (i, message) in messages.iter().enumerate() {
        let confirmed = matches!(outcomes.get(i), Some(o) if o.is_confirmed());
        let attempted = !matches!(outcomes.get(i), Some(PublishOutcome::NotSent(_)));
        if attempted {
            tally(
                &mut per_exchange,
                &message.exchange,
                u64::from(confirmed),
                u64::from(!confirmed),
            );
        }
        match outcomes.get(i) {
            Some(o) if o.is_confirmed() => sent.push(message.id),
            // Nothing reached the broker: no attempt is spent on a broker outage.
            Some(PublishOutcome::NotSent(why)) => {
                counts.unsent += 1;
                // Given back for lack of time: a slow batch, not a broker outage.
                if matches!(why, PortError::OutOfTime { .. }) {
                    counts.unsent_out_of_time += 1;
                }
                unsent.push(message.id);
            }
            Some(PublishOutcome::Rejected(why)) => {
                failures.push(permanent_failure(message.id, why, &mut counts));
            }
            other => {
                let error = other.map_or_else(
                    || "publisher returned no outcome".to_owned(),
                    ToString::to_string,
                );
                let decision = policy.decide(attempts[i].saturating_add(1), random());
                if decision == Decision::Dead {
                    tracing::warn!(message_id = %message.id, %error, "message is dead after its last publish attempt");
                    counts.dead += 1;
                } else {
                    tracing::debug!(message_id = %message.id, %error, "publish failed; retry scheduled");
                    counts.failed += 1;
                    failing
                        .entry(message.exchange.as_str())
                        .or_insert_with(|| (0, error.clone()))
                        .0 += 1;
                }
                failures.push(PublishFailure {
                    id: message.id,
                    error,
                    decision,
                });
            }
        }
    }
    for (exchange, (n, error)) in failing {
        crate::failure_log::publishes_failed(exchange, n, &error);
    }
    Published {
        lease,
        sent,
        failures,
        unsent,
        counts,
        per_exchange,
    }
}

/// Publishes `messages` after a layer changed their headers: one whose headers
/// now break AMQP's limits never reaches the publisher (a client library may
/// panic on it) and is rejected (dead at once, the reason naming the layer); the
/// outcomes come back in the batch's order, as many as the publisher gave.
async fn publish_checked(
    publisher: &dyn Publisher,
    messages: &[outbox_core::Message],
    budget: Duration,
) -> Vec<PublishOutcome> {
    let broken: Vec<Option<String>> = messages
        .iter()
        .map(|m| {
            m.check_amqp()
                .err()
                .map(|e| format!("headers added by a publish layer: {e}"))
        })
        .collect();
    if broken.iter().all(Option::is_none) {
        return if messages.is_empty() {
            Vec::new()
        } else {
            publisher.publish_within(messages, budget).await
        };
    }
    // Rare: only then are the good ones copied out.
    let good: Vec<outbox_core::Message> = messages
        .iter()
        .zip(&broken)
        .filter(|(_, b)| b.is_none())
        .map(|(m, _)| m.clone())
        .collect();
    let mut published = if good.is_empty() {
        Vec::new()
    } else {
        publisher.publish_within(&good, budget).await
    }
    .into_iter();
    let mut outcomes = Vec::with_capacity(messages.len());
    for b in broken {
        match b {
            Some(why) => outcomes.push(PublishOutcome::Rejected(why)),
            None => match published.next() {
                Some(o) => outcomes.push(o),
                // Too few outcomes: the rest count as "no outcome".
                None => break,
            },
        }
    }
    outcomes
}

/// The failure of a message that can never be published: dead at once, `why`
/// naming the field.
fn permanent_failure(id: MessageId, why: &str, counts: &mut PublishCounts) -> PublishFailure {
    tracing::warn!(message_id = %id, reason = %why, "message cannot be published; dead at once");
    counts.dead += 1;
    PublishFailure {
        id,
        error: format!("cannot be published: {why}"),
        decision: Decision::Dead,
    }
}

/// Records a published batch's outcomes: confirmed ones sent in one mark, the
/// failed ones failed or dead in another, and the never-sent ones given back
/// untouched (no attempt counted).
///
/// # Errors
/// A [`PortError`] from marking. The rows then stay claimed until the lease runs out
/// and are published again (a duplicate the inbox absorbs), never lost.
pub async fn record(store: &dyn OutboxRelayPath, p: Published) -> Result<PublishCounts, PortError> {
    record_retrying(store, p, None).await
}

/// Runs `step` until it succeeds, fails for good, or (after a last try) `retry`'s
/// token fires; without `retry`, once. A retryable failure (a statement or lock
/// timeout, a lost connection) is tried again after `retry`'s pause: the rows stay
/// claimed meanwhile, and a mark is fenced by its lease holder, so a late one can
/// never overwrite another claimer's outcome. The pause does not grow: each try is
/// bounded by the store's own statement and lock timeouts, and a mark should land
/// as soon as the lock it waits on is gone, before its lease runs out and the rows
/// are published again.
async fn retrying<T, F, Fut>(
    what: &'static str,
    retry: Option<(&CancellationToken, Duration)>,
    mut step: F,
) -> Result<T, PortError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, PortError>>,
{
    let Some((cancel, pause)) = retry else {
        return step().await;
    };
    loop {
        match step().await {
            Err(e) if e.is_retryable() && !cancel.is_cancelled() => {
                tracing::warn!(error = %e, ?pause, "{what} failed; trying again (the rows stay claimed, no attempt is spent)");
                if !sleep_or_cancel(pause, cancel).await {
                    // Stopping: one last try, then the rows come back when their
                    // lease runs out.
                    return step().await;
                }
            }
            other => return other,
        }
    }
}

/// As [`record`]; with `retry`, each of its marks is tried again while the store
/// refuses it for a retryable reason, until the token fires (see [`retrying`]):
/// the dispatcher's way, so that a mark held up by another session's lock lands
/// once the lock is gone instead of leaving its rows to be published again.
///
/// # Errors
/// As [`record`].
pub async fn record_retrying(
    store: &dyn OutboxRelayPath,
    p: Published,
    retry: Option<(&CancellationToken, Duration)>,
) -> Result<PublishCounts, PortError> {
    let mut counts = p.counts;
    if counts.claimed == 0 {
        return Ok(counts);
    }
    let marked_sent = retrying("marking a batch sent", retry, || {
        store.mark_sent(&p.lease, &p.sent)
    })
    .await?;
    counts.sent = marked_sent;
    let marked_failed = if p.failures.is_empty() {
        0
    } else {
        retrying("marking failed publishes", retry, || {
            store.mark_publish_failed(&p.lease, &p.failures)
        })
        .await?
    };
    let released = if p.unsent.is_empty() {
        0
    } else {
        retrying("giving back unsent messages", retry, || {
            store.release(&p.lease, &p.unsent)
        })
        .await?
    };
    counts.fenced = (p.sent.len() as u64 - marked_sent)
        + (p.failures.len() as u64 - marked_failed)
        + (p.unsent.len() as u64 - released);
    if counts.fenced > 0 {
        tracing::warn!(
            fenced = counts.fenced,
            holder = %p.lease.holder,
            "outcomes not recorded: the lease ran out and another claimer holds these rows"
        );
    }
    Ok(counts)
}

/// [`publish_batch`] then [`record`], for rows claimed under `lease` just now (the
/// budget is the whole lease less its margin).
///
/// # Errors
/// As [`record`].
pub async fn publish_claimed(
    store: &dyn OutboxRelayPath,
    publisher: &dyn Publisher,
    lease: &Lease,
    claimed: Vec<ClaimedMessage>,
    policy: &RetryPolicy,
    random: Random,
) -> Result<PublishCounts, PortError> {
    let budget = publish_budget(lease.ttl, Duration::ZERO);
    let layer = crate::default_publish_layer();
    let published = publish_batch(
        publisher,
        layer.as_deref(),
        lease.clone(),
        claimed,
        policy,
        random,
        budget,
    )
    .await;
    record(store, published).await
}

/// Wakes an idle dispatcher when new messages may be there (e.g. PostgreSQL
/// notifications). Without one the dispatcher polls.
#[async_trait]
pub trait Wakeup: Send {
    /// Returns when work may be waiting, or after `timeout` at the latest.
    async fn wait(&mut self, timeout: Duration);
}

/// How long an idle dispatcher waits before claiming again: `idle_poll`, or less
/// when a delayed message falls due sooner (a timer for the next due time, so a
/// delayed message goes out within milliseconds of it, not only at the next poll;
/// see [`outbox_core::dispatch::idle_wait`]).
/// The time left comes from the store, by its clock: the relay's own clock is never
/// read, so a relay whose clock runs ahead of the database's does not claim in a
/// loop, nor one behind it publish late.
pub async fn idle_wait(store: &dyn OutboxRelayPath, idle_poll: Duration) -> Duration {
    let next_due = match store.next_due_in().await {
        Ok(next_due) => next_due,
        Err(e) => {
            tracing::debug!(error = %e, "next due time unknown; polling");
            None
        }
    };
    outbox_core::dispatch::idle_wait(next_due, idle_poll)
}

pub use outbox_core::dispatch::{MAX_OUTAGE_PAUSE, MIN_DUE_WAIT};

/// Settings of the [`Dispatcher`]: one type, one set of defaults, for embedders
/// and for `outbox run`, whose `[dispatch]` section it is (`batch_size`,
/// `lease_ttl`, `idle_poll`, `pipelines`; `retry` comes from `[retry]`, and
/// `error_backoff` is not a setting of the file).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DispatcherConfig {
    /// Messages claimed and published per batch.
    pub batch_size: u32,
    /// How long a claim lasts before other relays may take the rows.
    #[serde(with = "outbox_core::duration")]
    pub lease_ttl: Duration,
    /// Pause when nothing is pending, before looking again (a commit wakes the
    /// relay sooner with a wake-up source, e.g. `PgWakeupSource`).
    #[serde(with = "outbox_core::duration")]
    pub idle_poll: Duration,
    /// Pause after a store error.
    #[serde(skip)]
    pub error_backoff: Duration,
    /// When failed publishes are retried, and when they are dead.
    #[serde(skip)]
    pub retry: RetryPolicy,
    /// Dispatch loops run by [`crate::RelayBuilder`], each claiming and publishing
    /// its own batches (give the publisher as many connections).
    pub pipelines: usize,
}

impl Default for DispatcherConfig {
    /// `outbox run`'s defaults: 500 messages a batch, a 60 s lease, a 1 s poll when
    /// idle (with a wake-up source, new messages are claimed within about a
    /// millisecond anyway).
    fn default() -> Self {
        Self {
            batch_size: 500,
            lease_ttl: Duration::from_secs(60),
            idle_poll: Duration::from_secs(1),
            error_backoff: Duration::from_secs(1),
            retry: RetryPolicy::default(),
            pipelines: 1,
        }
    }
}

/// Which rows a relay batch claims.
#[derive(Debug, Clone, Copy)]
enum Claim {
    /// New messages (the dispatcher).
    Pending,
    /// Failed ones whose next attempt is due (the retry sweep).
    DueRetries,
}

/// What the dispatcher and the publish-retry task share: claim, publish, mark.
struct Relay {
    store: Arc<dyn OutboxRelayPath>,
    publisher: Arc<dyn Publisher>,
    /// Around each batch handed to the publisher (e.g. `send` spans).
    layer: Option<Arc<dyn PublishLayer>>,
    leases: LeaseFactory,
    policy: RetryPolicy,
    random: Random,
    counters: Arc<RelayCounters>,
    /// What the stall watchdog reads (the dispatcher's claims and marks).
    progress: Arc<outbox_runtime::stall::RelayProgress>,
}

impl Relay {
    fn new(
        store: Arc<dyn OutboxRelayPath>,
        publisher: Arc<dyn Publisher>,
        policy: RetryPolicy,
        instance: &str,
        lease_ttl: Duration,
    ) -> Self {
        Self {
            store,
            publisher,
            layer: crate::default_publish_layer(),
            leases: LeaseFactory::new(instance, lease_ttl),
            policy,
            random: outbox_runtime::default_random,
            counters: Arc::default(),
            progress: Arc::default(),
        }
    }

    async fn batch(&self, claim: Claim, limit: u32) -> Result<PublishCounts, PortError> {
        let lease = self.leases.next();
        // Before the claim is sent: the lease ends no earlier than this plus its ttl.
        let claimed_at = tokio::time::Instant::now();
        let claimed = match claim {
            Claim::Pending => self.store.claim_pending(&lease, limit).await?,
            Claim::DueRetries => self.store.claim_due_retries(&lease, limit).await?,
        };
        let budget = publish_budget(lease.ttl, claimed_at.elapsed());
        let mut published = publish_batch(
            &*self.publisher,
            self.layer.as_deref(),
            lease,
            claimed,
            &self.policy,
            self.random,
            budget,
        )
        .await;
        let per_exchange = std::mem::take(&mut published.per_exchange);
        let counts = record(&*self.store, published).await?;
        self.counters.add(&counts);
        Published::tally_into(&per_exchange, &self.counters.per_exchange);
        Ok(counts)
    }
}

/// A batch claimed by the dispatcher, not yet published.
struct ClaimedBatch {
    lease: Lease,
    /// Before the claim was sent: the lease ends no earlier than this plus its ttl.
    claimed_at: tokio::time::Instant,
    claimed: Vec<ClaimedMessage>,
}

impl ClaimedBatch {
    async fn claim(relay: &Relay, limit: u32) -> Result<Self, PortError> {
        let lease = relay.leases.next();
        let claimed_at = tokio::time::Instant::now();
        let claimed = relay.store.claim_pending(&lease, limit).await;
        relay
            .progress
            .claimed(claimed.as_ref().map(|c| !c.is_empty()).map_err(|_| ()));
        let claimed = claimed?;
        Ok(Self {
            lease,
            claimed_at,
            claimed,
        })
    }

    /// What the dispatch machine needs to know of it.
    fn taken(&self) -> ClaimTaken {
        ClaimTaken {
            rows: self.claimed.len(),
            claimed_at: self.claimed_at.into_std(),
        }
    }

    /// Gives the rows back untouched (no attempt spent). If the store cannot be
    /// reached they come back when the lease runs out.
    async fn give_back(self, relay: &Relay) {
        if self.claimed.is_empty() {
            return;
        }
        let ids: Vec<MessageId> = self.claimed.iter().map(|c| c.message.id).collect();
        if let Err(e) = relay.store.release(&self.lease, &ids).await {
            tracing::warn!(error = %e, "giving back a batch claimed ahead failed; its rows come back when their lease runs out");
        }
        relay.progress.let_go();
    }
}

/// The relay's fast path for new messages: claim pending, publish, mark; again. The
/// next batch is claimed while one is published (after the previous one's mark,
/// which runs meanwhile too), so the broker is not left idle while a claim runs.
/// When the next
/// batch is what the mark releases (the next messages of ordering keys whose heads
/// it marks sent), the claims are halved so that two batches hold different keys
/// and overlap again, or, with very few keys, the mark is finished first, with
/// full batches (see [`outbox_core::dispatch::ClaimOverlap`]).
pub struct Dispatcher {
    relay: Relay,
    config: DispatcherConfig,
    wakeup: Option<Box<dyn Wakeup>>,
}

impl Dispatcher {
    /// A dispatcher for `instance` (its lease holder prefix).
    pub fn new(
        store: Arc<dyn OutboxRelayPath>,
        publisher: Arc<dyn Publisher>,
        config: DispatcherConfig,
        instance: &str,
    ) -> Self {
        Self {
            relay: Relay::new(store, publisher, config.retry, instance, config.lease_ttl),
            config,
            wakeup: None,
        }
    }

    /// Sleeps on `wakeup` instead of polling when nothing is pending.
    #[must_use]
    pub fn with_wakeup(mut self, wakeup: Box<dyn Wakeup>) -> Self {
        self.wakeup = Some(wakeup);
        self
    }

    /// Shares `counters` (e.g. with the publish-retry sweep and metrics).
    #[must_use]
    pub fn with_counters(mut self, counters: Arc<RelayCounters>) -> Self {
        self.relay.counters = counters;
        self
    }

    /// Runs `layer` around each batch it publishes instead of the default one
    /// (`send` spans with the `otel` feature); `None`: no layer.
    #[must_use]
    pub fn with_publish_layer(mut self, layer: Option<Arc<dyn PublishLayer>>) -> Self {
        self.relay.layer = layer;
        self
    }

    /// Reports its claims and marks to `progress` (read by the stall watchdog,
    /// [`outbox_runtime::stall::watch`]).
    #[must_use]
    pub fn with_progress(mut self, progress: Arc<outbox_runtime::stall::RelayProgress>) -> Self {
        self.relay.progress = progress;
        self
    }

    /// One batch: claim, publish, mark.
    ///
    /// # Errors
    /// A [`PortError`] of the store; nothing is lost (see [`publish_claimed`]).
    pub async fn run_once(&self) -> Result<PublishCounts, PortError> {
        self.relay
            .batch(Claim::Pending, self.config.batch_size)
            .await
    }

    /// Runs until `cancel` fires. A batch in flight is finished (its confirms awaited
    /// and marked) before returning, and one claimed ahead is given back untouched;
    /// nothing is left half done. What to do next is
    /// [`DispatchMachine`](outbox_core::dispatch::DispatchMachine)'s decision; this
    /// loop only carries it out.
    pub async fn run(mut self, cancel: CancellationToken) {
        tracing::info!(batch_size = self.config.batch_size, "dispatcher started");
        let relay = Arc::new(self.relay);
        let mut machine = DispatchMachine::new(
            self.config.batch_size,
            self.config.lease_ttl,
            self.config.error_backoff,
        );
        // The batch claimed and not yet published: the one just claimed, or the
        // one claimed ahead while the previous batch was published (never both).
        // Empty claims are not kept: nothing to publish or give back.
        let mut unpublished: Option<ClaimedBatch> = None;
        // The mark in flight (at most one).
        let mut marking: Option<tokio::task::JoinHandle<Result<PublishCounts, PortError>>> = None;
        loop {
            if cancel.is_cancelled() {
                machine.stop();
            }
            match machine.step(tokio::time::Instant::now().into_std()) {
                DispatchStep::Claim { limit, .. } => {
                    match ClaimedBatch::claim(&relay, limit).await {
                        Ok(batch) => {
                            machine.claimed(batch.taken());
                            unpublished = (!batch.claimed.is_empty()).then_some(batch);
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "claim failed; retrying");
                            machine.claim_failed();
                        }
                    }
                }
                DispatchStep::Publish {
                    budget,
                    claim_ahead,
                } => {
                    let Some(batch) = unpublished.take() else {
                        unreachable!("the dispatch machine publishes only a batch with rows")
                    };
                    let (mark, published, ahead) = Self::publish(
                        &relay,
                        batch,
                        budget,
                        claim_ahead,
                        marking.take(),
                        &cancel,
                        self.config.error_backoff,
                    )
                    .await;
                    marking = Some(mark);
                    if published.broker_unavailable {
                        tracing::warn!(
                            unsent = published.unsent,
                            "the broker cannot be reached; messages given back without spending an attempt"
                        );
                    } else if published.unsent > 0 {
                        tracing::info!(
                            unsent = published.unsent,
                            "the lease's publish budget ran out; the rest of the batch is given back without spending an attempt"
                        );
                    } else if published.unsent == 0 && machine.in_outage() {
                        tracing::info!("the broker takes messages again");
                    }
                    machine.published(published, ahead.as_ref().map(ClaimedBatch::taken));
                    unpublished = ahead.filter(|a| !a.claimed.is_empty());
                }
                DispatchStep::FinishMark => {
                    if let Some(previous) = marking.take() {
                        Self::finish_mark(&relay, previous).await;
                    }
                    machine.mark_finished();
                }
                DispatchStep::GiveBack => {
                    if let Some(batch) = unpublished.take() {
                        batch.give_back(&relay).await;
                    }
                    machine.gave_back();
                }
                DispatchStep::Idle => {
                    let wait = idle_wait(&*relay.store, self.config.idle_poll).await;
                    let keep_going = match self.wakeup.as_mut() {
                        Some(w) => tokio::select! {
                            () = cancel.cancelled() => false,
                            () = w.wait(wait) => true,
                        },
                        None => sleep_or_cancel(wait, &cancel).await,
                    };
                    if keep_going {
                        machine.waited();
                    } else {
                        machine.stop();
                    }
                }
                DispatchStep::Pause(pause) => {
                    tracing::debug!(?pause, "pausing before claiming again");
                    if sleep_or_cancel(pause, &cancel).await {
                        machine.waited();
                    } else {
                        machine.stop();
                    }
                }
                // Nothing held, nothing in flight.
                DispatchStep::Done => break,
            }
        }
        // The machine stops only with nothing held; these are belts and braces.
        if let Some(batch) = unpublished.take() {
            batch.give_back(&relay).await;
        }
        if let Some(previous) = marking.take() {
            Self::finish_mark(&relay, previous).await;
        }
        tracing::info!("dispatcher stopped");
    }

    /// Publishes `batch` within `budget`. Meanwhile the previous batch's mark is
    /// finished (at most one mark in flight, so a failing store slows the loop down
    /// instead of piling up) and, with `claim_ahead`, the next batch is claimed: the
    /// broker is not left idle while a claim runs. Claimed while this batch is in
    /// flight, the next one never holds a later message of a key whose message is
    /// in this one (that key's head is leased until this batch is marked). Returns
    /// this batch's mark, started as soon as it is published and the previous
    /// mark is finished (not after the claim ahead: confirmed rows are marked
    /// without delay), how it came out, and the batch claimed ahead.
    async fn publish(
        relay: &Arc<Relay>,
        batch: ClaimedBatch,
        budget: Duration,
        claim_ahead: Option<u32>,
        previous: Option<tokio::task::JoinHandle<Result<PublishCounts, PortError>>>,
        cancel: &CancellationToken,
        error_backoff: Duration,
    ) -> (
        tokio::task::JoinHandle<Result<PublishCounts, PortError>>,
        PublishedBatch,
        Option<ClaimedBatch>,
    ) {
        let (previous_marked, previous_mark_finished) = tokio::sync::oneshot::channel::<()>();
        let ((mark, published), ahead) = tokio::join!(
            async {
                let mut published = publish_batch(
                    &*relay.publisher,
                    relay.layer.as_deref(),
                    batch.lease,
                    batch.claimed,
                    &relay.policy,
                    relay.random,
                    budget,
                )
                .await;
                let _ = previous_mark_finished.await;
                let outcome = PublishedBatch {
                    unsent: published.counts.unsent,
                    broker_unavailable: published.counts.broker_unavailable(),
                };
                let r = Arc::clone(relay);
                let c = cancel.clone();
                let mark = tokio::spawn(async move {
                    let per_exchange = std::mem::take(&mut published.per_exchange);
                    let counts =
                        record_retrying(&*r.store, published, Some((&c, error_backoff))).await?;
                    // Counted with the totals, once the outcomes are recorded.
                    Published::tally_into(&per_exchange, &r.counters.per_exchange);
                    Ok(counts)
                });
                (mark, outcome)
            },
            async {
                if let Some(previous) = previous {
                    Self::finish_mark(relay, previous).await;
                }
                let _ = previous_marked.send(());
                let limit = claim_ahead?;
                // A stop asked for meanwhile: no new batch.
                if cancel.is_cancelled() {
                    return None;
                }
                match ClaimedBatch::claim(relay, limit).await {
                    Ok(b) => Some(b),
                    Err(e) => {
                        tracing::warn!(error = %e, "claiming ahead failed; claiming again after this batch");
                        None
                    }
                }
            }
        );
        (mark, published, ahead)
    }

    async fn finish_mark(
        relay: &Relay,
        task: tokio::task::JoinHandle<Result<PublishCounts, PortError>>,
    ) {
        let result = task.await;
        // Marked or given up: the batch is no longer held, either way.
        relay.progress.let_go();
        match result {
            Ok(Ok(counts)) => {
                relay.progress.completed();
                relay.counters.add(&counts);
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "marking a batch failed; its rows come back when their lease runs out")
            }
            // A panic while marking is a defect, not a store error: carried on into
            // the dispatcher's own task, so the relay's supervision sees it (readiness
            // fails, `outbox run` exits non-zero) instead of a log line nobody reads.
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => tracing::error!(error = %e, "marking task ended abnormally"),
        }
    }
}

/// The relay's retry sweep work: publish `PublishFailed` messages whose next attempt
/// is due.
pub struct PublishRetryTask {
    relay: Relay,
}

impl PublishRetryTask {
    /// A task claiming under leases of `lease_ttl` for `instance`.
    pub fn new(
        store: Arc<dyn OutboxRelayPath>,
        publisher: Arc<dyn Publisher>,
        policy: RetryPolicy,
        instance: &str,
        lease_ttl: Duration,
    ) -> Self {
        Self {
            relay: Relay::new(store, publisher, policy, instance, lease_ttl),
        }
    }

    /// Shares `counters` with the dispatcher.
    #[must_use]
    pub fn with_counters(mut self, counters: Arc<RelayCounters>) -> Self {
        self.relay.counters = counters;
        self
    }

    /// As [`Dispatcher::with_publish_layer`].
    #[must_use]
    pub fn with_publish_layer(mut self, layer: Option<Arc<dyn PublishLayer>>) -> Self {
        self.relay.layer = layer;
        self
    }
}

#[async_trait]
impl SweepTask for PublishRetryTask {
    fn name(&self) -> &'static str {
        "publish-retry"
    }

    async fn before_sweep(&self) -> Result<(), PortError> {
        let recovered = self.relay.store.recover_expired_leases().await?;
        if recovered > 0 {
            tracing::info!(recovered, "cleared expired leases of vanished relays");
        }
        Ok(())
    }

    async fn run_batch(&self, limit: u32) -> Result<BatchCounts, PortError> {
        let c = self.relay.batch(Claim::DueRetries, limit).await?;
        if c.broker_unavailable() {
            // Given back untouched: ending the sweep here keeps it from claiming the
            // same rows again until the next interval.
            return Err(PortError::transient(
                "publish retry",
                format!(
                    "the broker cannot be reached; {} messages given back without spending an attempt",
                    c.unsent - c.unsent_out_of_time
                ),
            ));
        }
        Ok(BatchCounts {
            claimed: c.claimed,
            publish_retried: c.sent,
            publish_failed: c.failed + c.dead,
            ..BatchCounts::default()
        })
    }
}
