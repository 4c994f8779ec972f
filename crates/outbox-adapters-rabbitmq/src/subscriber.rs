//! The subscriber: manual acknowledgement, prefetch, reconnect after a broker restart.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt as _;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions,
};
use lapin::types::FieldTable;
use outbox_core::config::redact_url;
use outbox_ports::{Acker, Delivery, DeliveryStream, PortError, Subscriber};

use crate::convert::envelope;
use crate::nodes::{Nodes, jittered};
use crate::{RabbitTls, port};

static CONSUMER_SEQ: AtomicU64 = AtomicU64::new(0);

/// [`Subscriber`] on RabbitMQ: one connection and channel per subscription.
#[derive(Clone)]
pub struct RabbitSubscriber {
    nodes: Nodes,
    connect_timeout: Duration,
    reconnect_backoff: Duration,
    tls: RabbitTls,
}

impl fmt::Debug for RabbitSubscriber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RabbitSubscriber")
            .field(
                "urls",
                &self
                    .nodes
                    .urls()
                    .iter()
                    .map(|u| redact_url(u))
                    .collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

struct Open {
    /// The node it is connected to (an index of the subscriber's nodes).
    node: usize,
    _connection: lapin::Connection,
    channel: lapin::Channel,
    tag: String,
    consumer: lapin::Consumer,
}

impl RabbitSubscriber {
    /// A subscriber for `url`.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            nodes: Nodes::new(&url.into(), &[]),
            connect_timeout: Duration::from_secs(10),
            reconnect_backoff: Duration::from_millis(500),
            tls: RabbitTls::default(),
        }
    }

    /// The same subscriber also connecting to `urls`, other nodes of the same cluster:
    /// each subscription goes to one of them (a random one first, the next after a
    /// loss; see the crate's text).
    #[must_use]
    pub fn with_failover_urls(mut self, urls: &[String]) -> Self {
        self.nodes = Nodes::new(&self.nodes.urls()[0], urls);
        self
    }

    /// The same subscriber with the CA and client certificate of `tls`, for an
    /// `amqps://` URL.
    #[must_use]
    pub fn with_tls(mut self, tls: RabbitTls) -> Self {
        self.tls = tls;
        self
    }

    async fn open(&self, queue: &str, prefetch: u16) -> Result<Open, PortError> {
        let (connection, node) = self
            .nodes
            .connect(&self.tls, self.connect_timeout, None)
            .await?;
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| port("open channel", "channel", "", &e))?;
        channel
            .basic_qos(prefetch.max(1), BasicQosOptions::default())
            .await
            .map_err(|e| port("set prefetch", "queue", queue, &e))?;
        let tag = format!(
            "outbox-{}-{}",
            std::process::id(),
            CONSUMER_SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let consumer = channel
            .basic_consume(
                queue.into(),
                tag.as_str().into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| port("consume", "queue", queue, &e))?;
        Ok(Open {
            node,
            _connection: connection,
            channel,
            tag,
            consumer,
        })
    }
}

#[async_trait]
impl Subscriber for RabbitSubscriber {
    async fn subscribe(
        &self,
        queue: &str,
        prefetch: u16,
    ) -> Result<Box<dyn DeliveryStream>, PortError> {
        let open = self.open(queue, prefetch).await?;
        Ok(Box::new(RabbitDeliveryStream {
            subscriber: self.clone(),
            queue: queue.to_owned(),
            prefetch,
            open: Some(open),
            backoff: Duration::ZERO,
            cancelled: false,
        }))
    }
}

struct RabbitDeliveryStream {
    subscriber: RabbitSubscriber,
    queue: String,
    prefetch: u16,
    open: Option<Open>,
    backoff: Duration,
    /// Cancelled on purpose: the end of the consumer's deliveries ends the stream
    /// instead of a resubscription.
    cancelled: bool,
}

#[async_trait]
impl DeliveryStream for RabbitDeliveryStream {
    /// `basic.cancel`: the broker sends nothing more, and lapin hands out what it
    /// had received before the cancel's answer, then the end (it queues the end
    /// behind them). The channel stays open, so those can still be settled.
    async fn cancel(&mut self) -> Result<(), PortError> {
        self.cancelled = true;
        let Some(open) = self.open.as_ref() else {
            return Ok(());
        };
        open.channel
            .basic_cancel(open.tag.as_str().into(), BasicCancelOptions::default())
            .await
            .map_err(|e| port("cancel consumer", "queue", &self.queue, &e))
    }

    async fn next(&mut self) -> Option<Result<Delivery, PortError>> {
        loop {
            if self.cancelled && self.open.is_none() {
                return None;
            }
            if let Some(open) = self.open.as_mut() {
                match open.consumer.next().await {
                    Some(Ok(d)) => {
                        self.backoff = Duration::ZERO;
                        return Some(Ok(Delivery {
                            envelope: envelope(&d),
                            redelivered: d.redelivered,
                            acker: Box::new(RabbitAcker(d.acker)),
                        }));
                    }
                    Some(Err(e)) => {
                        tracing::warn!(queue = %self.queue, error = %e, "consumer lost its channel; reconnecting");
                    }
                    None if self.cancelled => return None,
                    None => {
                        tracing::warn!(queue = %self.queue, "consumer cancelled; resubscribing")
                    }
                }
                if self.cancelled {
                    // Lost while draining: the broker takes back what is unsettled.
                    if let Some(lost) = self.open.take() {
                        self.subscriber.nodes.lost(lost.node);
                    }
                    return None;
                }
                // Unacknowledged deliveries of the lost channel go back to the queue.
                if let Some(lost) = self.open.take() {
                    self.subscriber.nodes.lost(lost.node);
                }
            }
            self.backoff = (self.backoff * 2)
                .max(self.subscriber.reconnect_backoff)
                .min(Duration::from_secs(30));
            tokio::time::sleep(jittered(self.backoff)).await;
            match self.subscriber.open(&self.queue, self.prefetch).await {
                Ok(open) => {
                    tracing::info!(queue = %self.queue, "consumer resubscribed");
                    self.open = Some(open);
                }
                Err(e) => return Some(Err(e)),
            }
        }
    }
}

struct RabbitAcker(lapin::Acker);

#[async_trait]
impl Acker for RabbitAcker {
    async fn ack(&self) -> Result<(), PortError> {
        settled(
            self.0
                .ack(BasicAckOptions::default())
                .await
                .map_err(|e| port("ack", "delivery", "", &e))?,
        )
    }

    async fn nack(&self, requeue: bool) -> Result<(), PortError> {
        settled(
            self.0
                .nack(BasicNackOptions {
                    requeue,
                    multiple: false,
                })
                .await
                .map_err(|e| port("nack", "delivery", "", &e))?,
        )
    }
}

/// lapin answers `false` when the delivery's channel is gone: the broker has put it
/// back in the queue and will deliver it again (the inbox absorbs the duplicate).
fn settled(done: bool) -> Result<(), PortError> {
    if done {
        Ok(())
    } else {
        Err(PortError::transient(
            "settle delivery",
            "its channel is closed; the broker will redeliver it",
        ))
    }
}
