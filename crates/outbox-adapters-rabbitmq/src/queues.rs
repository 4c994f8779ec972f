//! [`QueueDepths`] on RabbitMQ: a passive `queue.declare` per queue, which
//! answers its ready messages and consumers without creating or changing it.

use std::time::Duration;

use async_trait::async_trait;
use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use outbox_ports::{PortError, QueueDepth, QueueDepths};
use tokio::sync::Mutex;

use crate::RabbitTls;

/// How long a connection attempt may take before the depths are unknown.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// How long one read of every queue may take (a half-open connection or a
/// quorum queue without a leader would otherwise hold the overview until the
/// heartbeat gives up); past it the connection is dropped and reopened next time.
const READ_TIMEOUT: Duration = Duration::from_secs(3);

/// The depths of `queues` on the cluster at `urls`, over one connection of its
/// own (opened at the first read, opened again after a failure).
pub struct RabbitQueueDepths {
    urls: Vec<String>,
    tls: RabbitTls,
    queues: Vec<String>,
    connection: Mutex<Option<lapin::Connection>>,
}

impl RabbitQueueDepths {
    /// Depths of `queues` on the nodes `urls` (one cluster).
    #[must_use]
    pub fn new(urls: Vec<String>, tls: RabbitTls, queues: Vec<String>) -> Self {
        Self {
            urls,
            tls,
            queues,
            connection: Mutex::new(None),
        }
    }
}

impl std::fmt::Debug for RabbitQueueDepths {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URLs may hold passwords.
        f.debug_struct("RabbitQueueDepths")
            .field("queues", &self.queues)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl QueueDepths for RabbitQueueDepths {
    async fn queue_depths(&self) -> Result<Vec<QueueDepth>, PortError> {
        // One read at a time (one connection); a caller that waits longer than a
        // read may take is told the broker is slow rather than kept waiting.
        let Ok(mut held) = tokio::time::timeout(READ_TIMEOUT, self.connection.lock()).await else {
            return Err(PortError::transient(
                "queue depths",
                format!("another read is still waiting for the broker after {READ_TIMEOUT:?}"),
            ));
        };
        match tokio::time::timeout(READ_TIMEOUT, Self::read(&mut held, self)).await {
            Ok(read) => read,
            Err(_) => {
                *held = None;
                Err(PortError::transient(
                    "queue depths",
                    format!("the broker did not answer within {READ_TIMEOUT:?}"),
                ))
            }
        }
    }
}

impl RabbitQueueDepths {
    /// Every configured queue's depth over `held` (connected first if needed).
    async fn read(
        held: &mut Option<lapin::Connection>,
        this: &Self,
    ) -> Result<Vec<QueueDepth>, PortError> {
        let queues = &this.queues;
        if !held.as_ref().is_some_and(|c| c.status().connected()) {
            *held = Some(crate::connect_any(&this.urls, &this.tls, CONNECT_TIMEOUT).await?);
        }
        let Some(connection) = held.as_ref() else {
            return Err(PortError::transient("queue depths", "no connection"));
        };
        let mut channel = None;
        let mut depths = Vec::with_capacity(queues.len());
        for queue in queues {
            if channel.is_none() {
                match connection.create_channel().await {
                    Ok(c) => channel = Some(c),
                    Err(e) => {
                        *held = None;
                        return Err(PortError::transient("queue depths", e.to_string()));
                    }
                }
            }
            let Some(ch) = channel.as_ref() else { break };
            let declared = ch
                .queue_declare(
                    queue.as_str().into(),
                    QueueDeclareOptions {
                        passive: true,
                        ..QueueDeclareOptions::default()
                    },
                    FieldTable::default(),
                )
                .await;
            match declared {
                Ok(q) => depths.push(QueueDepth {
                    queue: queue.clone(),
                    messages: Some(u64::from(q.message_count())),
                    consumers: Some(u64::from(q.consumer_count())),
                }),
                Err(_) => {
                    // A missing queue (404) or a down home node closes the
                    // channel: that queue is unknown, the next gets a new one.
                    channel = None;
                    depths.push(QueueDepth {
                        queue: queue.clone(),
                        messages: None,
                        consumers: None,
                    });
                }
            }
        }
        if let Some(ch) = channel {
            let _ = ch.close(200, "depths read".into()).await;
        }
        Ok(depths)
    }
}
