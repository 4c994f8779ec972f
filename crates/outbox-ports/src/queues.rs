//! What the broker holds: the depth of the queues the consumers read, so an
//! operator sees a backlog that has left the outbox but not yet been consumed.

use async_trait::async_trait;

use crate::PortError;

/// One queue as the broker reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueDepth {
    /// The queue.
    pub queue: String,
    /// Messages ready in it; `None` when the broker could not say (the queue
    /// does not exist, or its node is down).
    pub messages: Option<u64>,
    /// Consumers reading it; `None` as `messages`.
    pub consumers: Option<u64>,
}

/// The depth of a configured set of queues.
#[cfg_attr(feature = "mocks", mockall::automock)]
#[async_trait]
pub trait QueueDepths: Send + Sync {
    /// Each configured queue's depth, in the configured order (one the broker
    /// cannot report has `None`s).
    ///
    /// # Errors
    /// [`PortError::Transient`] when the broker cannot be reached.
    async fn queue_depths(&self) -> Result<Vec<QueueDepth>, PortError>;
}
