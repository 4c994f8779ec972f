//! Why a service could not be built or stopped badly.

use outbox_core::ConfigError;
use outbox_ports::PortError;

/// What building or running a [`crate::Service`] can fail with; each says what to
/// change.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServiceError {
    /// A setting out of range, or handlers registered twice.
    #[error("invalid service configuration: {0}")]
    Config(#[from] ConfigError),
    /// Something the builder needs was not given.
    #[error("{0}")]
    Missing(String),
    /// PostgreSQL: unreachable, a bad URL or schema, a failed migration.
    #[cfg(feature = "postgres")]
    #[error(transparent)]
    Postgres(#[from] outbox_adapters_postgres::PgConfigError),
    /// The broker: unreachable, or refused the topology.
    #[error("broker: {0}")]
    Broker(#[from] PortError),
    /// The topology is not valid.
    #[cfg(feature = "rabbitmq")]
    #[error(transparent)]
    Topology(#[from] outbox_adapters_rabbitmq::TopologyError),
    /// A task of the service panicked or stopped before shutdown; the others were
    /// stopped gracefully.
    #[error("the service stopped: {0}")]
    Failed(String),
}
