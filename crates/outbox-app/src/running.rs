//! A running service: its relay and consumers under one cancellation token, and
//! the graceful stop of all of them.

use std::future::Future;
use std::sync::Arc;

use outbox_consumer::ConsumerHandles;
use outbox_relay::RelayHandles;
use outbox_runtime::ServiceHealth;
use tokio_util::sync::CancellationToken;

use crate::ServiceError;

/// A service started by a builder ([`Service::postgres`], [`Service::memory`]):
/// `B` holds what the backend offers the application (its producer, pool or
/// broker). Dropped without [`Self::stop`] or [`Self::run`], it still cancels its
/// tasks, which then finish what they hold in the background, unawaited.
pub struct Service<B> {
    pub(crate) backend: B,
    pub(crate) cancel: CancellationToken,
    pub(crate) relay: Option<RelayHandles>,
    pub(crate) consumers: Vec<(String, ConsumerHandles)>,
}

impl<B> Service<B> {
    /// The token that stops the service when cancelled (as [`Self::run_until`]'s
    /// future ending does).
    #[must_use]
    pub fn cancel_token(&self) -> CancellationToken {
        self.cancel.clone()
    }

    /// The backend: its producer and stores.
    #[must_use]
    pub const fn backend(&self) -> &B {
        &self.backend
    }

    /// `None` while every task runs; otherwise what stopped first.
    #[must_use]
    pub fn failure(&self) -> Option<String> {
        self.healths()
            .find_map(|(what, h)| h.failure().map(|f| format!("{what}: {f}")))
    }

    fn healths(&self) -> impl Iterator<Item = (String, Arc<ServiceHealth>)> + '_ {
        let relay = self
            .relay
            .iter()
            .map(|r| ("relay".to_owned(), Arc::clone(&r.health)));
        let consumers = self
            .consumers
            .iter()
            .map(|(name, c)| (format!("consumer {name}"), Arc::clone(&c.health)));
        relay.chain(consumers)
    }

    /// Runs until `shutdown` completes (or a task fails), then stops gracefully:
    /// the relay finishes the batches it holds, each consumer the deliveries in
    /// hand. What it waits for is logged at INFO.
    ///
    /// # Errors
    /// [`ServiceError::Failed`] when a task panicked or stopped on its own (the
    /// rest was still stopped gracefully): exit non-zero, so a supervisor restarts
    /// the process.
    pub async fn run_until(self, shutdown: impl Future<Output = ()>) -> Result<(), ServiceError> {
        let healths: Vec<(String, Arc<ServiceHealth>)> = self.healths().collect();
        let first_failure = || {
            healths
                .iter()
                .find_map(|(what, h)| h.failure().map(|f| format!("{what}: {f}")))
        };
        let any_failed = async {
            let waits: Vec<_> = healths.iter().map(|(_, h)| Box::pin(h.failed())).collect();
            // select_all refuses an empty list: nothing that can fail never does.
            if waits.is_empty() {
                std::future::pending::<()>().await;
            }
            futures::future::select_all(waits).await;
        };
        tokio::select! {
            () = shutdown => {}
            () = any_failed => {}
            () = self.cancel.cancelled() => {}
        }
        self.stop().await;
        // Read after the drain: a task that panicked while finishing what it held
        // fails the run too.
        first_failure().map_or(Ok(()), |f| Err(ServiceError::Failed(f)))
    }

    /// Runs until the process gets Ctrl-C (SIGINT) or SIGTERM, then stops
    /// gracefully (see [`Self::run_until`]).
    ///
    /// # Errors
    /// As [`Self::run_until`].
    pub async fn run(self) -> Result<(), ServiceError> {
        self.run_until(shutdown_signal()).await
    }

    /// Stops every task and waits for them.
    pub async fn stop(mut self) {
        let cancel = self.cancel.clone();
        let relay = self.relay.take();
        let consumers = std::mem::take(&mut self.consumers);
        let waiting: Vec<String> = relay
            .iter()
            .map(|_| "the relay (batches in flight)".to_owned())
            .chain(
                consumers
                    .iter()
                    .map(|(name, _)| format!("consumer {name} (deliveries in hand)")),
            )
            .collect();
        tracing::info!(waiting_for = %waiting.join(", "), "service stopping");
        cancel.cancel();
        if let Some(relay) = relay {
            relay.join().await;
            tracing::info!("relay stopped");
        }
        for (name, consumer) in consumers {
            consumer.join().await;
            tracing::info!(consumer = %name, "consumer stopped");
        }
        tracing::info!("service stopped");
    }
}

/// Refuses two consumers of one name, a consumer without handlers, and handlers
/// registered twice.
#[cfg(any(feature = "memory", all(feature = "postgres", feature = "rabbitmq")))]
pub(crate) fn check_consumers<'a>(
    consumers: impl Iterator<
        Item = (
            &'a outbox_consumer::ConsumerConfig,
            bool,
            Result<(), outbox_core::ConfigError>,
        ),
    >,
) -> Result<(), ServiceError> {
    let mut names = std::collections::HashSet::new();
    for (config, empty, handlers) in consumers {
        handlers?;
        if empty {
            return Err(ServiceError::Missing(format!(
                "consumer {:?} has no handler: register one with .on::<Event>(..) or .on_fn(..)",
                config.name
            )));
        }
        config
            .retry
            .validate(&format!("consumer {:?} retry", config.name))?;
        // The name makes the sweep's lock and state keys: a name no key can hold
        // is refused here, not at the first sweep.
        outbox_core::SweepConfig::for_consumer_retrying(&config.name, &config.retry)
            .validate(&format!("consumer {:?} sweep", config.name))?;
        if !names.insert(config.name.clone()) {
            return Err(ServiceError::Missing(format!(
                "two consumers are named {:?}: each needs a name of its own (its inbox rows and retry sweep)",
                config.name
            )));
        }
    }
    Ok(())
}

impl<B> Drop for Service<B> {
    fn drop(&mut self) {
        // Stopped already (stop, run) or not: either way nothing may run on
        // unowned.
        self.cancel.cancel();
    }
}

/// Resolves on Ctrl-C (SIGINT), or SIGTERM on Unix, logging which: what
/// [`Service::run`] and `outbox run` stop on.
pub async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = interrupt => tracing::info!("SIGINT: shutting down"),
        () = terminate => tracing::info!("SIGTERM: shutting down"),
    }
}
