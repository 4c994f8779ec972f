//! [`Service::postgres`]: the outbox and inbox in PostgreSQL, RabbitMQ as the
//! broker, transactional handlers.

use std::sync::Arc;
use std::time::Duration;

use outbox_adapters_postgres::{PgDatabase, PgOutbox, PgPool, PgSchema};
use outbox_adapters_rabbitmq::{
    RabbitPublisher, RabbitPublisherConfig, RabbitSubscriber, Topology,
};
use outbox_consumer::{ConsumerBuilder, ConsumerConfig, InboxWorker, PgHandlerRegistry, PgTxInbox};
use outbox_core::SweepConfig;
use outbox_ports::{Clock, Subscriber, SystemClock};
use outbox_relay::{DispatcherConfig, PgWakeupSource, RelayBuilder};
use outbox_runtime::LeaseFactory;
use tokio_util::sync::CancellationToken;

use crate::running::check_consumers;
use crate::{Service, ServiceError, keys};

/// How long the first connection to PostgreSQL may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections of a pool the builder opens from a URL.
const POOL_SIZE: u32 = 10;

/// What a PostgreSQL service runs on: a pool of yours, or a URL to open one.
#[derive(Clone)]
pub enum PgSource {
    /// A pool the application already has (its transactions enqueue).
    Pool(PgPool),
    /// A URL: the builder opens a pool of 10 connections.
    Url(String),
}

impl std::fmt::Debug for PgSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Pool(_) => f.write_str("PgSource::Pool"),
            // The URL may hold a password.
            Self::Url(url) => write!(
                f,
                "PgSource::Url({})",
                outbox_adapters_postgres::redact_url(url)
            ),
        }
    }
}

impl From<PgPool> for PgSource {
    fn from(pool: PgPool) -> Self {
        Self::Pool(pool)
    }
}

impl From<&PgPool> for PgSource {
    fn from(pool: &PgPool) -> Self {
        Self::Pool(pool.clone())
    }
}

impl From<&str> for PgSource {
    fn from(url: &str) -> Self {
        Self::Url(url.to_owned())
    }
}

impl From<String> for PgSource {
    fn from(url: String) -> Self {
        Self::Url(url)
    }
}

/// What a running PostgreSQL service offers the application.
pub struct Postgres {
    database: PgDatabase,
    producer: PgOutbox,
}

impl Service<Postgres> {
    /// A service on PostgreSQL (`pool_or_url`) and RabbitMQ
    /// ([`PgServiceBuilder::rabbitmq`]).
    pub fn postgres(pool_or_url: impl Into<PgSource>) -> PgServiceBuilder {
        PgServiceBuilder {
            source: pool_or_url.into(),
            schema: "outbox".to_owned(),
            migrate: true,
            brokers: Vec::new(),
            topology: None,
            relay: None,
            consumers: Vec::new(),
            producer: Producer::default(),
            instance: None,
        }
    }

    /// The producer: enqueue in your own transactions,
    /// `service.producer().enqueue(&mut *tx, &event)`.
    #[must_use]
    pub const fn producer(&self) -> &PgOutbox {
        &self.backend.producer
    }

    /// The pool the service runs on.
    #[must_use]
    pub const fn pool(&self) -> &PgPool {
        self.backend.database.pool()
    }

    /// Every store of the schema (the relay's store, the inbox, the pauses).
    #[must_use]
    pub const fn database(&self) -> &PgDatabase {
        &self.backend.database
    }
}

/// The producer's exchange mapping, applied to the application's messages and
/// the handlers' follow-ups alike.
#[derive(Default)]
struct Producer {
    prefix: Option<String>,
    exchanges: Vec<(String, String)>,
}

/// Builds a [`Service`] on PostgreSQL and RabbitMQ; see [`Service::postgres`].
#[must_use = "a builder does nothing until built"]
pub struct PgServiceBuilder {
    source: PgSource,
    schema: String,
    migrate: bool,
    brokers: Vec<String>,
    topology: Option<Topology>,
    relay: Option<DispatcherConfig>,
    consumers: Vec<(ConsumerConfig, PgHandlerRegistry)>,
    producer: Producer,
    instance: Option<String>,
}

impl PgServiceBuilder {
    /// The schema of the outbox's tables (default `outbox`; a plain lowercase
    /// identifier).
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }

    /// Whether `build` creates or updates the tables (default: yes). Off, it
    /// checks that the schema has every migration this build needs.
    pub const fn migrate(mut self, migrate: bool) -> Self {
        self.migrate = migrate;
        self
    }

    /// The broker's address (`amqp://user:password@host:5672/vhost`, or
    /// `amqps://`). Call it again for each further node of a cluster.
    pub fn rabbitmq(mut self, url: impl Into<String>) -> Self {
        self.brokers.push(url.into());
        self
    }

    /// Exchanges, queues and bindings to declare at build and again on every
    /// reconnection of the relay.
    pub fn topology(mut self, topology: Topology) -> Self {
        self.topology = Some(topology);
        self
    }

    /// Runs the relay in this process, with default settings: it publishes what
    /// the producer commits (woken by the commit) and retries failures.
    pub fn relay(self) -> Self {
        self.relay_with(DispatcherConfig::default())
    }

    /// Runs the relay with these settings (batch, retry policy, pipelines).
    pub fn relay_with(mut self, config: DispatcherConfig) -> Self {
        self.relay = Some(config);
        self
    }

    /// Every message the producer enqueues (and every follow-up a handler
    /// publishes) goes to `prefix` + its exchange: `"staging."` sends an event of
    /// exchange `orders` to `staging.orders`.
    pub fn exchange_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.producer.prefix = Some(prefix.into());
        self
    }

    /// Messages for exchange `from` go to `to` instead.
    pub fn map_exchange(mut self, from: impl Into<String>, to: impl Into<String>) -> Self {
        self.producer.exchanges.push((from.into(), to.into()));
        self
    }

    /// A consumer named `name` (its inbox rows, its retry sweep) reading the queue
    /// of the same name, with the handlers `handlers` adds to an empty registry.
    pub fn consumer(
        self,
        name: &str,
        handlers: impl FnOnce(PgHandlerRegistry) -> PgHandlerRegistry,
    ) -> Self {
        self.consumer_with(ConsumerConfig::new(name, name), handlers)
    }

    /// A consumer with every setting of `config` (its queue, concurrency, retry
    /// policy, ordering).
    pub fn consumer_with(
        mut self,
        config: ConsumerConfig,
        handlers: impl FnOnce(PgHandlerRegistry) -> PgHandlerRegistry,
    ) -> Self {
        self.consumers
            .push((config, handlers(PgHandlerRegistry::new())));
        self
    }

    /// This instance's name, in leases and locks (default: host and process id).
    pub fn instance(mut self, instance: impl Into<String>) -> Self {
        self.instance = Some(instance.into());
        self
    }

    /// Checks the settings, connects, migrates (unless told not to), declares the
    /// topology and starts the relay and the consumers.
    ///
    /// # Errors
    /// [`ServiceError`] saying what to change: an invalid schema or setting, two
    /// consumers of one name, a handler registered twice, no broker address,
    /// PostgreSQL or RabbitMQ unreachable, a topology the broker refuses.
    pub async fn build(self) -> Result<Service<Postgres>, ServiceError> {
        let schema = PgSchema::new(&self.schema)?;
        let (first, more) = self.brokers.split_first().ok_or_else(|| {
            ServiceError::Missing(
                "no broker: add .rabbitmq(\"amqp://guest:guest@127.0.0.1:5672/%2f\")".to_owned(),
            )
        })?;
        check_consumers(
            self.consumers
                .iter()
                .map(|(c, h)| (c, h.is_empty(), h.check(&c.name))),
        )?;
        if let Some(config) = &self.relay {
            config.retry.validate("relay.retry")?;
        }
        if let Some(topology) = &self.topology {
            topology.validate()?;
        }
        let pool = match self.source {
            PgSource::Pool(pool) => pool,
            PgSource::Url(url) => {
                outbox_adapters_postgres::connect(&url, POOL_SIZE, CONNECT_TIMEOUT).await?
            }
        };
        let database = PgDatabase::new(pool.clone(), schema.clone());
        if self.migrate {
            database.migrate().await?;
        }
        outbox_adapters_postgres::check_current(&pool, &schema).await?;
        if let Some(topology) = &self.topology {
            let connection = outbox_adapters_rabbitmq::connect(first, CONNECT_TIMEOUT).await?;
            topology.declare(&connection).await?;
            let _ = connection.close(200, "declared".into()).await;
        }
        let mut producer = database.producer();
        if let Some(prefix) = self.producer.prefix {
            producer = producer.with_exchange_prefix(prefix);
        }
        for (from, to) in self.producer.exchanges {
            producer = producer.with_exchange(from, to);
        }
        let instance = self
            .instance
            .unwrap_or_else(|| LeaseFactory::instance_id("service"));
        let cancel = CancellationToken::new();
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let relay = self.relay.map(|dispatch| {
            let publisher = RabbitPublisher::new(RabbitPublisherConfig {
                failover_urls: more.to_vec(),
                ..RabbitPublisherConfig::new(first)
            });
            let publisher = match &self.topology {
                Some(t) => publisher.with_topology(t.clone()),
                None => publisher,
            };
            let sweep = keys::relay_sweep(schema.as_str(), SweepConfig::default());
            RelayBuilder::new(
                Arc::new(database.relay_store()),
                Arc::new(publisher),
                Arc::new(database.lock(&instance)),
                Arc::new(database.sweep_state()),
            )
            .dispatch(dispatch)
            .sweep(sweep)
            .wakeup(Box::new(PgWakeupSource::new(
                pool.clone(),
                schema.clone(),
                &instance,
            )))
            .throughput(Arc::new(database.throughput()))
            .instance(instance.clone())
            .start(&cancel)
        });
        let subscriber: Arc<dyn Subscriber> =
            Arc::new(RabbitSubscriber::new(first.clone()).with_failover_urls(more));
        let consumers = self
            .consumers
            .into_iter()
            .map(|(config, handlers)| {
                let sweep = keys::consumer_sweep(&config.name, &config.retry);
                let path = PgTxInbox::new(database.inbox(), handlers)
                    .batched(&config)
                    .with_producer(producer.clone());
                let name = config.name.clone();
                let worker =
                    InboxWorker::with_path(path, Arc::clone(&subscriber), clock.clone(), config)
                        .with_throughput(Arc::new(database.throughput()));
                let handles = ConsumerBuilder::new(
                    worker,
                    Arc::new(database.lock(&instance)),
                    Arc::new(database.sweep_state()),
                )
                .sweep(sweep)
                .start(&cancel);
                (name, handles)
            })
            .collect();
        Ok(Service {
            backend: Postgres { database, producer },
            cancel,
            relay,
            consumers,
        })
    }
}
