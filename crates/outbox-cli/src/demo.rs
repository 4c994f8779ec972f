//! `outbox demo`: the whole flow on in-memory adapters, with injected faults that the
//! retry budget absorbs.
//!
//! Enqueue messages, run the dispatcher, the relay's publish-retry sweeper, a
//! consumer worker and its consume-retry sweeper, until every message is consumed
//! or dead; then count, from the stores themselves, what was sent, consumed, dead
//! and lost, and how often a handler's effect happened twice.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_adapters_memory::{
    ExchangeKind, MemoryBroker, MemoryInboxStore, MemoryLock, MemoryOutboxStore, MemorySweepState,
    MemoryThroughputLog,
};
use outbox_core::{MessageId, NewMessage, OutboxStatus, RetryPolicy, SweepConfig};
use outbox_ports::{Clock, InboxStore, OutboxStore, SystemClock, ThroughputKind};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use outbox_consumer::{ConsumerConfig, ConsumerWorker, HandlerError, HandlerRegistry, handler_fn};
use outbox_relay::{
    Dispatcher, DispatcherConfig, LeaseFactory, PublishRetryTask, RelayCounters, RetrySweeper,
    TallyRecorder, ThroughputRecorder,
};

const EXCHANGE: &str = "demo.orders";
/// The exchange of `--dead-publish`: never declared, so every publish to it fails.
const MISSING_EXCHANGE: &str = "demo.missing";
const QUEUE: &str = "demo.orders.created";
const CONSUMER: &str = "demo-billing";

/// What the demo injects and how long it may take.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Messages to enqueue.
    pub messages: u64,
    /// Publishes that fail as on a lost connection.
    pub publish_failures: u64,
    /// Publishes the broker nacks.
    pub nacks: u64,
    /// Publishes the broker returns as unroutable.
    pub returns: u64,
    /// Share of messages whose handler fails on the first attempt.
    pub handler_failure_rate: f64,
    /// Acknowledgements lost, so the broker delivers those messages twice.
    pub redeliveries: u64,
    /// Messages whose handler always fails: they end dead.
    pub poison: u64,
    /// Messages to an exchange that does not exist: their publishes fail until
    /// they end dead (the publish side's twin of `poison`).
    pub dead_publish: u64,
    /// Seed of the random choices, for a repeatable run.
    pub seed: u64,
    /// Give up after this long.
    pub timeout: Duration,
    /// Draw a progress bar on stderr.
    pub progress: bool,
}

impl DemoOptions {
    /// Why these options cannot run, naming the flag (a usage error).
    ///
    /// # Errors
    /// The first option out of range.
    pub fn check(&self) -> Result<(), String> {
        if self.messages == 0 {
            return Err("--messages must be at least 1".into());
        }
        if self.poison.saturating_add(self.dead_publish) > self.messages {
            return Err("--poison and --dead-publish together cannot exceed --messages".into());
        }
        if !(0.0..=1.0).contains(&self.handler_failure_rate) {
            return Err("--handler-failure-rate must be between 0 and 1".into());
        }
        Ok(())
    }
}

impl Default for DemoOptions {
    fn default() -> Self {
        Self {
            messages: 1000,
            publish_failures: 50,
            nacks: 20,
            returns: 10,
            handler_failure_rate: 0.05,
            redeliveries: 25,
            poison: 0,
            dead_publish: 0,
            seed: 7,
            timeout: Duration::from_secs(60),
            progress: true,
        }
    }
}

/// The counts at the end of the demo, all read from the stores and the broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DemoSummary {
    /// Messages enqueued.
    pub enqueued: u64,
    /// Outbox rows marked sent.
    pub sent: u64,
    /// Inbox rows consumed.
    pub consumed: u64,
    /// Dead on either side.
    pub dead: u64,
    /// Enqueued but neither consumed nor dead.
    pub lost: u64,
    /// Handler effects that happened more than once for one message.
    pub duplicate_effects: u64,
    /// Redeliveries the inbox recognised and skipped.
    pub duplicates_absorbed: u64,
    /// Failed publish attempts (retried or dead).
    pub publish_failures: u64,
    /// Failed handler attempts (retried or dead).
    pub consume_failures: u64,
    /// Sweeps completed by both sweepers.
    pub sweeps: u64,
}

impl std::fmt::Display for DemoSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "demo: {} enqueued, {} sent, {} consumed, {} dead, {} lost",
            self.enqueued, self.sent, self.consumed, self.dead, self.lost
        )
    }
}

/// The handler's side: which messages fail, and each message's effect count.
struct Effects {
    fail_once: Mutex<HashSet<MessageId>>,
    poison: HashSet<MessageId>,
    applied: Mutex<HashMap<MessageId, u32>>,
}

/// The demo's in-memory stores, kept after the flow (`outbox demo --serve`).
#[derive(Clone)]
pub struct DemoWorld {
    /// The outbox.
    pub outbox: Arc<MemoryOutboxStore>,
    /// The consumer's inbox.
    pub inbox: Arc<MemoryInboxStore>,
    /// The sweeps' lock.
    pub lock: Arc<MemoryLock>,
    /// The sweeps' last reports.
    pub state: Arc<MemorySweepState>,
    /// The clock every store reads.
    pub clock: Arc<dyn Clock>,
    /// The sweep state keys (relay's, consumer's).
    pub sweep_keys: Vec<String>,
    /// The sweep lock keys (relay's, consumer's).
    pub lock_keys: Vec<String>,
    /// Published, consumed and failed attempts per minute, as the flow records
    /// them (the overview's chart).
    pub throughput: Arc<MemoryThroughputLog>,
}

/// The demo's relay, consumer and sweeps, still running after the flow settled:
/// what an operator does on the dashboard (requeue, reconsume, publish now) is
/// carried out as it would be by `outbox run` and a consumer.
/// Dropped without [`DemoFlow::stop`] (an error on the way), it still cancels
/// every task; they then stop on their own.
pub struct DemoFlow {
    cancel: tokio_util::sync::DropGuard,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl DemoFlow {
    /// Stops every task and waits for each to finish what it holds.
    ///
    /// # Errors
    /// A task that panicked.
    pub async fn stop(self) -> anyhow::Result<()> {
        drop(self.cancel);
        for t in self.tasks {
            t.await?;
        }
        Ok(())
    }
}

/// Runs the demo.
///
/// # Errors
/// When the options are out of range, or enqueueing fails.
pub async fn run(opts: &DemoOptions) -> anyhow::Result<DemoSummary> {
    let (summary, _, flow) = run_keeping(opts).await?;
    flow.stop().await?;
    Ok(summary)
}

/// Runs the demo and hands back its stores as the flow left them, with the flow
/// still running (stop it with [`DemoFlow::stop`]).
///
/// # Errors
/// When the options are out of range, or enqueueing fails.
pub async fn run_keeping(opts: &DemoOptions) -> anyhow::Result<(DemoSummary, DemoWorld, DemoFlow)> {
    opts.check().map_err(anyhow::Error::msg)?;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let outbox = Arc::new(MemoryOutboxStore::new(Arc::clone(&clock)));
    let inbox = Arc::new(MemoryInboxStore::new(Arc::clone(&clock)).with_pauses(&outbox.pauses()));
    let broker = MemoryBroker::new();
    broker.declare_exchange(EXCHANGE, ExchangeKind::Topic);
    broker.declare_queue(QUEUE);
    broker.bind(QUEUE, EXCHANGE, "order.*");
    let lock = Arc::new(MemoryLock::new());
    let state = Arc::new(MemorySweepState::new(Arc::clone(&clock)));

    // Enqueue, choosing which messages misbehave.
    let mut rng = fastrand::Rng::with_seed(opts.seed);
    let mut fail_once = HashSet::new();
    let mut poison = HashSet::new();
    let mut batch = Vec::new();
    for n in 0..opts.messages {
        let now = clock.now();
        let id = MessageId::from_uuid(uuid::Uuid::now_v7());
        let payload = format!(
            r#"{{"order_id":{n},"amount_cents":{}}}"#,
            rng.u32(100..100_000)
        );
        // After the poison ones, those bound for an exchange nobody declared.
        let dead_publish = (opts.poison..opts.poison + opts.dead_publish).contains(&n);
        let exchange = if dead_publish {
            MISSING_EXCHANGE
        } else {
            EXCHANGE
        };
        let message = NewMessage::new(exchange, "order.created", payload.into_bytes())
            .with_type("order.created")
            .with_source("demo")
            .into_message(id, now);
        if n < opts.poison {
            poison.insert(id);
        } else if rng.f64() < opts.handler_failure_rate {
            fail_once.insert(id);
        }
        batch.push(message);
        if batch.len() == 100 {
            outbox.enqueue(std::mem::take(&mut batch)).await?;
        }
    }
    if !batch.is_empty() {
        outbox.enqueue(batch).await?;
    }
    let injected_handler_failures = fail_once.len();
    let effects = Arc::new(Effects {
        fail_once: Mutex::new(fail_once),
        poison,
        applied: Mutex::default(),
    });

    broker.fail_next_publishes(opts.publish_failures);
    broker.nack_next_publishes(opts.nacks);
    broker.return_next_publishes(opts.returns);
    broker.redeliver_next_acked(opts.redeliveries);

    // A budget the injected faults cannot exhaust; short intervals so the demo is quick.
    let retry = RetryPolicy {
        initial_backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(400),
        max_attempts: 6,
    };
    let sweep = |base: SweepConfig| SweepConfig {
        interval: Duration::from_millis(100),
        lock_wait: Duration::from_millis(50),
        ..base
    };
    let relay_sweep = sweep(SweepConfig::default());
    let consume_sweep = sweep(SweepConfig::for_consumer(CONSUMER));
    relay_sweep.validate("relay.sweep")?;
    consume_sweep.validate("consumer.sweep")?;
    let sweep_keys = vec![
        relay_sweep.state_key.clone(),
        consume_sweep.state_key.clone(),
    ];
    let lock_keys = vec![relay_sweep.lock_key.clone(), consume_sweep.lock_key.clone()];

    let cancel = CancellationToken::new();
    // Cancels every task below if this returns early with an error.
    let guard = cancel.clone().drop_guard();
    let relay_counters = Arc::new(RelayCounters::default());
    let instance = LeaseFactory::instance_id("demo-relay");
    let dispatcher = Dispatcher::new(
        outbox.clone(),
        Arc::new(broker.clone()),
        DispatcherConfig {
            batch_size: 100,
            idle_poll: Duration::from_millis(10),
            retry,
            ..DispatcherConfig::default()
        },
        &instance,
    )
    .with_counters(Arc::clone(&relay_counters));
    let publish_retry = PublishRetryTask::new(
        outbox.clone(),
        Arc::new(broker.clone()),
        retry,
        &instance,
        Duration::from_secs(30),
    )
    .with_counters(Arc::clone(&relay_counters));
    // Read only at the end, to count the sweeps: room for every one of a run.
    let (reports_tx, mut reports_rx) = mpsc::channel(1 << 20);
    let relay_sweeper = RetrySweeper::new(
        relay_sweep,
        lock.clone(),
        state.clone(),
        Arc::clone(&clock),
        Arc::new(publish_retry),
    )
    .with_reports(reports_tx.clone());

    let handler_effects = Arc::clone(&effects);
    let handlers = HandlerRegistry::new().on_type(
        "order.created",
        handler_fn(move |m| {
            let fx = Arc::clone(&handler_effects);
            async move {
                if fx.poison.contains(&m.id) {
                    return Err(HandlerError::from("poison message: always fails"));
                }
                if lock_ignoring_poison(&fx.fail_once).remove(&m.id) {
                    return Err(HandlerError::from("injected handler failure"));
                }
                *lock_ignoring_poison(&fx.applied).entry(m.id).or_default() += 1;
                Ok(())
            }
        }),
    );
    let consumer_config = ConsumerConfig {
        prefetch: 50,
        concurrency: 8,
        handler_timeout: Duration::from_secs(5),
        retry,
        ..ConsumerConfig::new(CONSUMER, QUEUE)
    };
    let worker = ConsumerWorker::new(
        inbox.clone(),
        Arc::new(broker.clone()),
        handlers,
        Arc::clone(&clock),
        consumer_config,
    );
    let consumer_counters = worker.counters();
    let consume_sweeper = RetrySweeper::new(
        consume_sweep,
        lock.clone(),
        state.clone(),
        Arc::clone(&clock),
        Arc::new(worker.retry_task()),
    )
    .with_reports(reports_tx);

    // The overview's chart, recorded as `outbox run` and a consumer record it,
    // every half second so a short demo shows.
    let throughput = Arc::new(MemoryThroughputLog::new(Arc::clone(&clock)));
    let every = Duration::from_millis(500);
    let recorders = [
        ThroughputRecorder::of_total(
            throughput.clone(),
            ThroughputKind::Published,
            Arc::clone(&relay_counters),
            |c| &c.published,
        ),
        ThroughputRecorder::of_total(
            throughput.clone(),
            ThroughputKind::PublishFailed,
            Arc::clone(&relay_counters),
            |c| &c.publish_failures,
        ),
        ThroughputRecorder::of_total(
            throughput.clone(),
            ThroughputKind::Consumed,
            Arc::clone(&consumer_counters),
            |c| &c.consumed,
        ),
        ThroughputRecorder::of_total(
            throughput.clone(),
            ThroughputKind::ConsumeFailed,
            Arc::clone(&consumer_counters),
            |c| &c.consume_failures,
        ),
        // The consumer's own chart.
        ThroughputRecorder::of_total(
            throughput.clone(),
            ThroughputKind::Consumed,
            Arc::clone(&consumer_counters),
            |c| &c.consumed,
        )
        .named(CONSUMER),
        ThroughputRecorder::of_total(
            throughput.clone(),
            ThroughputKind::ConsumeFailed,
            Arc::clone(&consumer_counters),
            |c| &c.consume_failures,
        )
        .named(CONSUMER),
    ];
    // Each exchange's own chart.
    let per_exchange = TallyRecorder::new(
        throughput.clone(),
        Arc::clone(&relay_counters.per_exchange),
        ThroughputKind::Published,
        ThroughputKind::PublishFailed,
    )
    .every(Duration::from_millis(500));
    let mut tasks = vec![
        tokio::spawn(dispatcher.run(cancel.clone())),
        tokio::spawn(relay_sweeper.run(cancel.clone())),
        tokio::spawn(worker.run(cancel.clone())),
        tokio::spawn(consume_sweeper.run(cancel.clone())),
    ];
    tasks.extend(
        recorders
            .into_iter()
            .map(|r| tokio::spawn(r.every(every).run(cancel.clone()))),
    );
    tasks.push(tokio::spawn(per_exchange.run(cancel.clone())));

    let bar = if opts.progress {
        indicatif::ProgressBar::new(opts.messages)
    } else {
        indicatif::ProgressBar::hidden()
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} [{elapsed}] {wide_bar} {pos}/{len} consumed or dead",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let started = tokio::time::Instant::now();
    loop {
        let settled = settled(&outbox, &inbox).await?;
        bar.set_position(settled);
        if settled >= opts.messages || started.elapsed() >= opts.timeout {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    bar.finish_and_clear();

    let stats = inbox.stats(CONSUMER).await?;
    let outbox_dead = outbox.count(OutboxStatus::Dead);
    let applied = lock_ignoring_poison(&effects.applied);
    let mut sweeps = 0;
    while reports_rx.try_recv().is_ok() {
        sweeps += 1;
    }
    let summary = DemoSummary {
        enqueued: opts.messages,
        sent: outbox.count(OutboxStatus::Sent),
        consumed: stats.consumed,
        dead: outbox_dead + stats.dead,
        lost: opts
            .messages
            .saturating_sub(stats.consumed + stats.dead + outbox_dead),
        duplicate_effects: applied
            .values()
            .map(|n| u64::from(n.saturating_sub(1)))
            .sum(),
        duplicates_absorbed: consumer_counters.duplicates.load(Ordering::Relaxed),
        publish_failures: relay_counters.publish_failures.load(Ordering::Relaxed),
        consume_failures: consumer_counters.consume_failures.load(Ordering::Relaxed),
        sweeps,
    };
    tracing::debug!(injected_handler_failures, "demo finished");
    let world = DemoWorld {
        outbox,
        inbox,
        lock,
        state,
        clock,
        sweep_keys,
        lock_keys,
        throughput,
    };
    Ok((
        summary,
        world,
        DemoFlow {
            cancel: guard,
            tasks,
        },
    ))
}

/// Messages that reached an end: consumed, or dead on either side.
async fn settled(outbox: &MemoryOutboxStore, inbox: &MemoryInboxStore) -> anyhow::Result<u64> {
    let s = inbox.stats(CONSUMER).await?;
    Ok(s.consumed + s.dead + outbox.count(OutboxStatus::Dead))
}

/// Locks a std mutex even if a panicking thread poisoned it (the data guarded in
/// the demo stays consistent across a panic).
pub(crate) fn lock_ignoring_poison<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
