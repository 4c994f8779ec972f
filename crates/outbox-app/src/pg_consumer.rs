//! Consuming with the PostgreSQL inbox, exactly once in effect: each handler writes
//! through the inbox row's own transaction (`&mut PgConnection`), so its effect and
//! the row commit together or not at all. A redelivery finds the row and the handler
//! does not run; a failure rolls the handler's writes back and is stored for the
//! consume sweep ([`PgConsumeRetryTask`]), which retries in a transaction too.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use async_trait::async_trait;
use futures::FutureExt as _;
use outbox_adapters_postgres::{ConsumeOutcome, PgConnection, PgInboxStore, TxHandler};
use outbox_core::{BatchCounts, Decision, Message};
use outbox_ports::{Clock, Delivery, InboxStore, PortError, Subscriber};
use tokio_util::sync::CancellationToken;

use crate::consumer::{
    ConsumerConfig, ConsumerCounters, Handlers, consume, decode_or_dead_letter, no_handler,
    panic_text, settle,
};
use crate::consumer_retention::run_retention;
use crate::{HandlerError, LeaseFactory, Random, SweepTask};

/// Handles one message with the inbox transaction's connection: its writes commit
/// with the inbox row.
#[async_trait]
pub trait PgHandler: Send + Sync {
    /// Handles `message`, writing through `conn` only.
    ///
    /// # Errors
    /// Any error: the transaction rolls back and the delivery is retried later.
    async fn handle(&self, conn: &mut PgConnection, message: &Message) -> Result<(), HandlerError>;
}

/// Transactional handlers by type, routing key, fallback.
pub type PgHandlerRegistry = Handlers<dyn PgHandler>;

struct PgShared {
    inbox: PgInboxStore,
    handlers: PgHandlerRegistry,
    clock: Arc<dyn Clock>,
    config: ConsumerConfig,
    leases: LeaseFactory,
    random: Random,
    counters: Arc<ConsumerCounters>,
}

impl PgShared {
    /// The handler for `message` as the inbox's transactional callback: panics and
    /// timeouts become errors, a missing handler is an error.
    fn tx_handler(&self, message: &Message) -> TxHandler<'static> {
        let handler = self.handlers.find(message);
        let timeout = self.config.handler_timeout;
        let m = message.clone();
        Box::new(move |conn: &mut PgConnection| {
            Box::pin(async move {
                let Some(h) = handler else {
                    return Err(no_handler(&m));
                };
                let run = AssertUnwindSafe(h.handle(conn, &m)).catch_unwind();
                match tokio::time::timeout(timeout, run).await {
                    Ok(Ok(Ok(()))) => Ok(()),
                    Ok(Ok(Err(e))) => Err(e.to_string()),
                    Ok(Err(panic)) => Err(format!("handler panicked: {}", panic_text(&*panic))),
                    Err(_) => Err(format!("handler timed out after {timeout:?}")),
                }
            })
        })
    }

    fn decide(&self) -> impl FnOnce(u32) -> Decision + Send + use<> {
        let policy = self.config.retry;
        let random = self.random;
        move |attempt| policy.decide(attempt, random())
    }

    fn count(&self, outcome: &ConsumeOutcome, dead: bool) {
        let c = &self.counters;
        match outcome {
            ConsumeOutcome::Consumed => c.consumed.fetch_add(1, Ordering::Relaxed),
            ConsumeOutcome::Duplicate => c.duplicates.fetch_add(1, Ordering::Relaxed),
            ConsumeOutcome::Failed(_) => {
                if dead {
                    c.dead.fetch_add(1, Ordering::Relaxed);
                }
                c.consume_failures.fetch_add(1, Ordering::Relaxed)
            }
        };
    }

    async fn handle_delivery(&self, delivery: Delivery) {
        let name = &self.config.name;
        let Some(message) = decode_or_dead_letter(
            &self.inbox,
            &self.config,
            &self.counters,
            self.clock.now(),
            &delivery,
        )
        .await
        else {
            return;
        };
        let went_dead = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = Arc::clone(&went_dead);
        let decide = self.decide();
        let decide = move |attempt| {
            let d = decide(attempt);
            flag.store(d == Decision::Dead, Ordering::Relaxed);
            d
        };
        // A holder of this attempt's own: a failure is recorded under it, so marks of
        // another worker handling the same message cannot touch this row, nor ours
        // theirs.
        let lease = self.leases.next();
        match self
            .inbox
            .consume_in_transaction(name, &message, &lease, decide, self.tx_handler(&message))
            .await
        {
            Ok(outcome) => {
                if let ConsumeOutcome::Failed(error) = &outcome {
                    tracing::warn!(consumer = %name, message_id = %message.id, %error, "handler failed; stored for a retry");
                }
                self.count(&outcome, went_dead.load(Ordering::Relaxed));
                settle(&delivery, true, self.config.settle_timeout).await;
            }
            Err(e) => {
                tracing::warn!(consumer = %name, message_id = %message.id, error = %e, "inbox unavailable; returning the delivery to the broker");
                tokio::time::sleep(self.config.store_error_backoff).await;
                settle(&delivery, false, self.config.settle_timeout).await;
            }
        }
    }
}

/// Consumes a queue into the PostgreSQL inbox with transactional handlers.
pub struct PgConsumerWorker {
    subscriber: Arc<dyn Subscriber>,
    shared: Arc<PgShared>,
}

impl PgConsumerWorker {
    /// A worker for `config.queue`, recording in `inbox` as `config.name`.
    pub fn new(
        inbox: PgInboxStore,
        subscriber: Arc<dyn Subscriber>,
        handlers: PgHandlerRegistry,
        clock: Arc<dyn Clock>,
        config: ConsumerConfig,
    ) -> Self {
        let leases = LeaseFactory::new(
            LeaseFactory::instance_id(&format!("consumer-{}", config.name)),
            config.lease_ttl(),
        );
        Self {
            subscriber,
            shared: Arc::new(PgShared {
                inbox,
                handlers,
                clock,
                config,
                leases,
                random: crate::default_random,
                counters: Arc::default(),
            }),
        }
    }

    /// This worker's counters.
    #[must_use]
    pub fn counters(&self) -> Arc<ConsumerCounters> {
        Arc::clone(&self.shared.counters)
    }

    /// The consume retry task for this consumer's sweep.
    #[must_use]
    pub fn retry_task(&self) -> PgConsumeRetryTask {
        PgConsumeRetryTask {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Consumes until `cancel` fires (see [`crate::ConsumerWorker::run`]), and runs
    /// the inbox retention of `config.retention` alongside until then.
    pub async fn run(self, cancel: CancellationToken) {
        let shared = Arc::clone(&self.shared);
        let stop_retention = cancel.child_token();
        let retention = tokio::spawn(run_retention(
            self.shared.inbox.clone(),
            self.shared.config.name.clone(),
            self.shared.config.retention,
            Arc::clone(&self.shared.counters),
            stop_retention.clone(),
        ));
        consume(&*self.subscriber, &self.shared.config, &cancel, move |d| {
            let shared = Arc::clone(&shared);
            async move { shared.handle_delivery(d).await }
        })
        .await;
        // The subscription can end before the token fires; retention stops with the
        // worker either way, after the delete statement in hand.
        stop_retention.cancel();
        if let Err(e) = retention.await {
            tracing::error!(consumer = %self.shared.config.name, error = %e, "inbox retention task ended abnormally");
        }
    }
}

/// The consume sweep's work with transactional handlers: each due delivery is
/// retried in a transaction that also marks it consumed.
pub struct PgConsumeRetryTask {
    shared: Arc<PgShared>,
}

#[async_trait]
impl SweepTask for PgConsumeRetryTask {
    fn name(&self) -> &'static str {
        "consume-retry"
    }

    async fn run_batch(&self, limit: u32) -> Result<BatchCounts, PortError> {
        let s = &self.shared;
        let mut counts = BatchCounts::default();
        // One claim per row, each under a lease of its own taken just before its
        // handler runs: a lease on a whole batch would run out for the rows at its end
        // while the first ones are handled, and another sweep would take them.
        while counts.claimed < u64::from(limit) {
            let lease = s.leases.next();
            let Some(c) = s.inbox.claim_due(&s.config.name, &lease, 1).await?.pop() else {
                break;
            };
            counts.claimed += 1;
            let went_dead = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let flag = Arc::clone(&went_dead);
            let decide = s.decide();
            let decide = move |attempt| {
                let d = decide(attempt);
                flag.store(d == Decision::Dead, Ordering::Relaxed);
                d
            };
            let retried = s
                .inbox
                .retry_in_transaction(
                    &s.config.name,
                    &lease,
                    &c.message,
                    c.attempts,
                    decide,
                    s.tx_handler(&c.message),
                )
                .await;
            let outcome = match retried {
                Ok(outcome) => outcome,
                Err(e) => {
                    // One row must not end the sweep: this one stays claimed until its
                    // lease runs out, then a later sweep takes it again.
                    tracing::warn!(consumer = %s.config.name, message_id = %c.message.id, error = %e, "consume retry could not be recorded; left to its lease");
                    continue;
                }
            };
            if let ConsumeOutcome::Failed(error) = &outcome {
                tracing::debug!(consumer = %s.config.name, message_id = %c.message.id, %error, "consume retry failed");
            }
            s.count(&outcome, went_dead.load(Ordering::Relaxed));
            match outcome {
                ConsumeOutcome::Consumed => counts.consume_retried += 1,
                ConsumeOutcome::Failed(_) => counts.consume_failed += 1,
                ConsumeOutcome::Duplicate => {}
            }
        }
        Ok(counts)
    }
}
