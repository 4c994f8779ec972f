//! [`Service::memory`]: every port in memory, for demos and tests.

use std::sync::Arc;

use outbox_adapters_memory::{
    MemoryBroker, MemoryInboxStore, MemoryLock, MemoryOutboxStore, MemorySweepState,
};
use outbox_consumer::{ConsumerBuilder, ConsumerConfig, ConsumerWorker, HandlerRegistry};
use outbox_core::SweepConfig;
use outbox_ports::{Clock, SystemClock};
use outbox_relay::{DispatcherConfig, RelayBuilder};
use outbox_runtime::LeaseFactory;
use tokio_util::sync::CancellationToken;

use crate::running::check_consumers;
use crate::{Service, ServiceError, keys};

/// What a running in-memory service offers the application.
pub struct Memory {
    outbox: Arc<MemoryOutboxStore>,
    inbox: Arc<MemoryInboxStore>,
    broker: MemoryBroker,
}

impl Service<Memory> {
    /// A service on the in-memory adapters: outbox, inbox, broker, lock and sweep
    /// state, nothing kept when the process ends.
    pub fn memory() -> MemoryServiceBuilder {
        MemoryServiceBuilder {
            broker: MemoryBroker::new(),
            relay: None,
            consumers: Vec::new(),
            instance: None,
        }
    }

    /// The producer (`enqueue_event(&event)`, from the prelude's
    /// `EnqueueEvents`).
    #[must_use]
    pub fn producer(&self) -> &MemoryOutboxStore {
        &self.backend.outbox
    }

    /// The consumers' inbox (`stats("billing")` counts what a consumer did).
    #[must_use]
    pub fn inbox(&self) -> &MemoryInboxStore {
        &self.backend.inbox
    }

    /// The broker.
    #[must_use]
    pub const fn broker(&self) -> &MemoryBroker {
        &self.backend.broker
    }
}

/// Builds a [`Service`] in memory; see [`Service::memory`].
#[must_use = "a builder does nothing until built"]
pub struct MemoryServiceBuilder {
    broker: MemoryBroker,
    relay: Option<DispatcherConfig>,
    consumers: Vec<(ConsumerConfig, HandlerRegistry)>,
    instance: Option<String>,
}

impl MemoryServiceBuilder {
    /// The broker, with its exchanges, queues and bindings declared
    /// (`declare_exchange`, `declare_queue`, `bind`).
    pub fn broker(mut self, broker: MemoryBroker) -> Self {
        self.broker = broker;
        self
    }

    /// Runs the relay, with default settings.
    pub fn relay(self) -> Self {
        self.relay_with(DispatcherConfig::default())
    }

    /// Runs the relay with these settings.
    pub fn relay_with(mut self, config: DispatcherConfig) -> Self {
        self.relay = Some(config);
        self
    }

    /// A consumer named `name` reading the queue of the same name, with the
    /// handlers `handlers` adds to an empty registry.
    pub fn consumer(
        self,
        name: &str,
        handlers: impl FnOnce(HandlerRegistry) -> HandlerRegistry,
    ) -> Self {
        self.consumer_with(ConsumerConfig::new(name, name), handlers)
    }

    /// A consumer with every setting of `config`.
    pub fn consumer_with(
        mut self,
        config: ConsumerConfig,
        handlers: impl FnOnce(HandlerRegistry) -> HandlerRegistry,
    ) -> Self {
        self.consumers
            .push((config, handlers(HandlerRegistry::new())));
        self
    }

    /// This instance's name, in leases and locks.
    pub fn instance(mut self, instance: impl Into<String>) -> Self {
        self.instance = Some(instance.into());
        self
    }

    /// Checks the settings and starts the relay and the consumers.
    ///
    /// # Errors
    /// [`ServiceError`]: two consumers of one name, a consumer without handlers,
    /// a handler registered twice, a retry policy out of range.
    #[allow(clippy::unused_async)] // the same shape as the PostgreSQL builder's
    pub async fn build(self) -> Result<Service<Memory>, ServiceError> {
        check_consumers(
            self.consumers
                .iter()
                .map(|(c, h)| (c, h.is_empty(), h.check(&c.name))),
        )?;
        if let Some(config) = &self.relay {
            config.retry.validate("relay.retry")?;
        }
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let outbox = Arc::new(MemoryOutboxStore::new(clock.clone()));
        let inbox = Arc::new(MemoryInboxStore::new(clock.clone()).with_pauses(&outbox.pauses()));
        let lock = Arc::new(MemoryLock::new());
        let state = Arc::new(MemorySweepState::new(clock.clone()));
        let instance = self
            .instance
            .unwrap_or_else(|| LeaseFactory::instance_id("service"));
        let cancel = CancellationToken::new();
        let relay = self.relay.map(|dispatch| {
            RelayBuilder::new(
                outbox.clone(),
                Arc::new(self.broker.clone()),
                lock.clone(),
                state.clone(),
            )
            .dispatch(dispatch)
            .sweep(keys::relay_sweep("memory", SweepConfig::default()))
            .instance(instance)
            .start(&cancel)
        });
        let consumers = self
            .consumers
            .into_iter()
            .map(|(config, handlers)| {
                let sweep = keys::consumer_sweep(&config.name, &config.retry);
                let name = config.name.clone();
                let worker = ConsumerWorker::new(
                    inbox.clone(),
                    Arc::new(self.broker.clone()),
                    handlers,
                    clock.clone(),
                    config,
                );
                let handles = ConsumerBuilder::new(worker, lock.clone(), state.clone())
                    .sweep(sweep)
                    .start(&cancel);
                (name, handles)
            })
            .collect();
        Ok(Service {
            backend: Memory {
                outbox,
                inbox,
                broker: self.broker,
            },
            cancel,
            relay,
            consumers,
        })
    }
}
