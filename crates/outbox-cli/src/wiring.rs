//! Adapters from configuration.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use outbox_adapters_memory::{
    MemoryAuditLog, MemoryBroker, MemoryInboxStore, MemoryLock, MemoryOutboxStore,
    MemorySweepState, MemoryThroughputLog,
};
use outbox_adapters_postgres::{
    PgAuditLog, PgInboxStore, PgLock, PgOutboxStore, PgPauses, PgPool, PgSchema, PgSweepState,
    PgThroughputLog,
};
use outbox_adapters_rabbitmq::{RabbitPublisher, RabbitPublisherConfig};
use outbox_adapters_redis::{RedisClient, RedisLock, RedisSweepState};
use outbox_admin::AdminPorts;
use outbox_ports::{
    DistributedLock, OutboxStore, Publisher, SweepStateStore, SystemClock, ThroughputLog,
};

use crate::config::{CoordinationKind, PublisherKind, RelayConfig, StoreKind};
use outbox_relay::dispatcher::Wakeup;
/// Kept here too, where it was first public.
pub use outbox_relay::pg_wakeup::PgWakeupSource;

/// The adapters a configuration asks for.
pub struct Wired {
    /// Outbox store.
    pub store: Arc<dyn OutboxStore>,
    /// The operator's side of the same stores, for the admin API and commands (the
    /// relay's pool with PostgreSQL; with the memory store its own inbox and audit
    /// log, both empty).
    pub admin: AdminPorts,
    /// Publisher.
    pub publisher: Arc<dyn Publisher>,
    /// Cluster lock.
    pub lock: Arc<dyn DistributedLock>,
    /// Sweep state.
    pub state: Arc<dyn SweepStateStore>,
    /// The per-minute totals the relay adds to and the admin API's charts read (in
    /// the store's database; in memory with the memory store).
    pub throughput: Arc<dyn ThroughputLog>,
    /// PostgreSQL wake-up, when the store is PostgreSQL.
    pub wakeup: Option<Box<dyn Wakeup>>,
    /// The PostgreSQL pool and schema, if any.
    pub postgres: Option<(PgPool, PgSchema)>,
}

/// What the chosen store brings: the outbox, its operator's side, the wake-up and
/// the per-minute totals.
struct StoreSide {
    store: Arc<dyn OutboxStore>,
    admin: AdminPorts,
    wakeup: Option<Box<dyn Wakeup>>,
    throughput: Arc<dyn ThroughputLog>,
}

/// How long the first connection to PostgreSQL may take: a refused one says so at
/// once, one that nothing answers is given up after this.
pub const POSTGRES_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Opens the PostgreSQL pool of `cfg`, if an adapter needs it.
///
/// # Errors
/// An invalid URL or schema, or an unreachable server.
pub async fn postgres(cfg: &RelayConfig) -> anyhow::Result<Option<(PgPool, PgSchema)>> {
    let Some(pg) = &cfg.postgres else {
        return Ok(None);
    };
    let schema = PgSchema::new(&pg.schema)?;
    let pool = outbox_adapters_postgres::connect_bounded(
        &pg.url,
        pg.max_connections,
        POSTGRES_CONNECT_TIMEOUT,
        &pg.session_bounds(),
    )
    .await?;
    Ok(Some((pool, schema)))
}

/// Runs the migrations when `postgres.migrate_on_start` asks for them, then
/// checks the schema has every migration this build needs.
///
/// # Errors
/// Failed migrations; a schema behind this build (naming `outbox migrate`).
pub async fn migrate_if_asked(
    cfg: &RelayConfig,
    postgres: Option<&(PgPool, PgSchema)>,
) -> anyhow::Result<()> {
    if let (Some((pool, schema)), Some(pg)) = (postgres, &cfg.postgres) {
        if pg.migrate_on_start {
            outbox_adapters_postgres::migrate(pool, schema).await?;
        }
        outbox_adapters_postgres::check_current(pool, schema).await?;
    }
    Ok(())
}

/// Builds every adapter of `cfg`; nothing is written yet (see [`migrate_if_asked`]).
///
/// # Errors
/// A missing section (validation prevents it), an unreachable PostgreSQL.
pub async fn wire(cfg: &RelayConfig, instance: &str) -> anyhow::Result<Wired> {
    let postgres = postgres(cfg).await?;
    let pg = || postgres.clone().context("postgres section missing");
    let redis = || -> anyhow::Result<RedisClient> {
        let r = cfg.redis.as_ref().context("redis section missing")?;
        Ok(r.client(8, Duration::from_secs(2))?)
    };
    let memory_clock = Arc::new(SystemClock);
    let StoreSide {
        store,
        admin,
        wakeup,
        throughput,
    } = match cfg.adapters.store {
        StoreKind::Memory => {
            let outbox = Arc::new(
                MemoryOutboxStore::new(memory_clock.clone())
                    .with_dead_head(cfg.ordering.dead_head()),
            );
            let inbox =
                Arc::new(MemoryInboxStore::new(memory_clock.clone()).with_pauses(&outbox.pauses()));
            StoreSide {
                store: outbox.clone(),
                admin: AdminPorts {
                    outbox: outbox.clone(),
                    inbox: inbox.clone(),
                    audit: Arc::new(MemoryAuditLog::new(memory_clock.clone())),
                    pauses: Arc::new(outbox.pauses()),
                    outbox_store: outbox,
                },
                wakeup: None,
                throughput: Arc::new(MemoryThroughputLog::new(memory_clock.clone())),
            }
        }
        StoreKind::Postgres => {
            let (pool, schema) = pg()?;
            let wake = PgWakeupSource::new(pool.clone(), schema.clone(), instance)
                .with_dead_head(cfg.ordering.dead_head());
            StoreSide {
                store: Arc::new(
                    PgOutboxStore::new(pool.clone(), schema.clone())
                        .with_dead_head(cfg.ordering.dead_head()),
                ),
                admin: postgres_admin_ports(pool.clone(), &schema, cfg.ordering.dead_head()),
                wakeup: Some(Box::new(wake)),
                throughput: Arc::new(PgThroughputLog::new(pool, &schema)),
            }
        }
    };
    let publisher: Arc<dyn Publisher> = match cfg.adapters.publisher {
        PublisherKind::Memory => Arc::new(MemoryBroker::new()),
        PublisherKind::Rabbitmq => {
            let r = cfg.rabbitmq.as_ref().context("rabbitmq section missing")?;
            // The configured topology again on every (re)connect: an exchange a
            // broker restart or an operator removed is back before publishing.
            let nodes = r.nodes();
            let (first, more) = nodes.split_first().context("no RabbitMQ URL")?;
            let publisher = RabbitPublisher::new(RabbitPublisherConfig {
                failover_urls: more.to_vec(),
                confirm_timeout: r.confirm_timeout,
                max_in_flight: r.max_in_flight,
                connections: cfg.dispatch.pipelines,
                tls: r.tls()?,
                ..RabbitPublisherConfig::new(first)
            });
            Arc::new(if cfg.topology.is_empty() {
                publisher
            } else {
                publisher.with_topology(cfg.topology.to_topology()?)
            })
        }
    };
    let lock: Arc<dyn DistributedLock> = match cfg.adapters.lock {
        CoordinationKind::Memory => Arc::new(MemoryLock::new()),
        CoordinationKind::Postgres => {
            let (pool, schema) = pg()?;
            Arc::new(PgLock::new(pool, &schema, instance))
        }
        CoordinationKind::Redis => Arc::new(RedisLock::new(redis()?, instance)),
    };
    let state: Arc<dyn SweepStateStore> = match cfg.adapters.sweep_state {
        CoordinationKind::Memory => Arc::new(MemorySweepState::new(memory_clock)),
        CoordinationKind::Postgres => {
            let (pool, schema) = pg()?;
            Arc::new(PgSweepState::new(pool, &schema))
        }
        CoordinationKind::Redis => Arc::new(RedisSweepState::new(redis()?)),
    };
    Ok(Wired {
        store,
        admin,
        throughput,
        publisher,
        lock,
        state,
        wakeup,
        postgres,
    })
}

/// The operator's ports over the PostgreSQL stores of `schema`, sharing `pool`;
/// `dead_head` (`ordering.on_dead`) says which keys count and list as blocked.
#[must_use]
pub fn postgres_admin_ports(
    pool: PgPool,
    schema: &PgSchema,
    dead_head: outbox_ports::DeadHead,
) -> AdminPorts {
    let outbox =
        Arc::new(PgOutboxStore::new(pool.clone(), schema.clone()).with_dead_head(dead_head));
    let inbox = Arc::new(PgInboxStore::new(pool.clone(), schema));
    AdminPorts {
        outbox: outbox.clone(),
        inbox: inbox.clone(),
        audit: Arc::new(PgAuditLog::new(pool.clone(), schema)),
        pauses: Arc::new(PgPauses::new(pool, schema)),
        outbox_store: outbox,
    }
}
