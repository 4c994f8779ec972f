//! A message broker in memory, with RabbitMQ's routing rules for direct, topic and
//! fanout exchanges, the default exchange, manual acknowledgement and prefetch.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::Message;
use outbox_ports::{
    Acker, Delivery, DeliveryStream, Envelope, PortError, PublishOutcome, Publisher, Subscriber,
};
use tokio::sync::Notify;

use crate::{FaultCounter, lock};

/// How an exchange routes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExchangeKind {
    /// Routing key equals binding key.
    Direct,
    /// Dotted words; `*` matches one word, `#` zero or more.
    Topic,
    /// Every bound queue.
    Fanout,
}

#[derive(Debug, Clone)]
struct Queued {
    envelope: Envelope,
    redelivered: bool,
}

#[derive(Debug, Default)]
struct QueueState {
    ready: VecDeque<Queued>,
    unacked: HashMap<u64, Queued>,
}

#[derive(Debug, Default)]
struct State {
    exchanges: HashMap<String, ExchangeKind>,
    /// (exchange, queue, binding key)
    bindings: Vec<(String, String, String)>,
    queues: HashMap<String, QueueState>,
    next_tag: u64,
    closed: bool,
    confirmed: u64,
}

impl State {
    fn route(&self, exchange: &str, routing_key: &str) -> Result<Vec<String>, PortError> {
        if exchange.is_empty() {
            return Ok(self
                .queues
                .contains_key(routing_key)
                .then(|| routing_key.to_owned())
                .into_iter()
                .collect());
        }
        let kind = *self
            .exchanges
            .get(exchange)
            .ok_or_else(|| PortError::NotFound {
                what: "exchange",
                id: exchange.to_owned(),
            })?;
        let mut queues: Vec<String> = self
            .bindings
            .iter()
            .filter(|(ex, _, key)| {
                ex == exchange
                    && match kind {
                        ExchangeKind::Direct => key == routing_key,
                        ExchangeKind::Topic => topic_matches(key, routing_key),
                        ExchangeKind::Fanout => true,
                    }
            })
            .map(|(_, q, _)| q.clone())
            .collect();
        queues.sort();
        queues.dedup();
        Ok(queues)
    }
}

/// Whether a topic binding key (`order.*`, `#.created`) matches a routing key.
fn topic_matches(pattern: &str, key: &str) -> bool {
    fn go(p: &[&str], k: &[&str]) -> bool {
        match (p.first(), k.first()) {
            (None, None) => true,
            (Some(&"#"), _) => go(&p[1..], k) || (!k.is_empty() && go(p, &k[1..])),
            (Some(&"*"), Some(_)) => go(&p[1..], &k[1..]),
            (Some(w), Some(x)) if w == x => go(&p[1..], &k[1..]),
            _ => false,
        }
    }
    let p: Vec<&str> = pattern.split('.').collect();
    let k: Vec<&str> = key.split('.').collect();
    go(&p, &k)
}

/// A broker in memory: [`Publisher`] and [`Subscriber`] over the same exchanges and
/// queues. Clones share the broker.
#[derive(Clone, Default)]
pub struct MemoryBroker {
    state: Arc<Mutex<State>>,
    /// Woken whenever a delivery may have become available.
    changed: Arc<Notify>,
    fail_next: Arc<FaultCounter>,
    nack_next: Arc<FaultCounter>,
    return_next: Arc<FaultCounter>,
    redeliver_next: Arc<FaultCounter>,
    hang_next: Arc<FaultCounter>,
    unreachable: Arc<AtomicBool>,
    /// How long handing one message to the broker takes (fault injection).
    publish_delay: Arc<Mutex<Duration>>,
}

impl MemoryBroker {
    /// A broker with no exchanges or queues.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Declares an exchange (idempotent).
    pub fn declare_exchange(&self, name: &str, kind: ExchangeKind) {
        lock(&self.state).exchanges.insert(name.to_owned(), kind);
    }

    /// Declares a queue (idempotent).
    pub fn declare_queue(&self, name: &str) {
        lock(&self.state).queues.entry(name.to_owned()).or_default();
    }

    /// Binds `queue` to `exchange` with `key`.
    pub fn bind(&self, queue: &str, exchange: &str, key: &str) {
        lock(&self.state)
            .bindings
            .push((exchange.to_owned(), queue.to_owned(), key.to_owned()));
    }

    /// Fault injection: the next `n` published messages fail (as on a lost
    /// connection).
    pub fn fail_next_publishes(&self, n: u64) {
        self.fail_next.arm(n);
    }

    /// Fault injection: the broker nacks the next `n` published messages.
    pub fn nack_next_publishes(&self, n: u64) {
        self.nack_next.arm(n);
    }

    /// Fault injection: the broker returns the next `n` published messages as
    /// unroutable.
    pub fn return_next_publishes(&self, n: u64) {
        self.return_next.arm(n);
    }

    /// Fault injection: the next `n` acknowledged deliveries are delivered once more,
    /// as a broker does when an acknowledgement is lost.
    pub fn redeliver_next_acked(&self, n: u64) {
        self.redeliver_next.arm(n);
    }

    /// Fault injection: the next `n` acknowledgements never complete, as when the
    /// connection dies under an ack in flight. Dropping such an ack returns the
    /// delivery to the queue (the channel is gone, the broker delivers it again).
    pub fn hang_next_acks(&self, n: u64) {
        self.hang_next.arm(n);
    }

    /// Fault injection: while `true`, every publish is [`PublishOutcome::NotSent`]
    /// and `check` errs.
    pub fn set_unreachable(&self, down: bool) {
        self.unreachable.store(down, Ordering::SeqCst);
    }

    /// Fault injection: handing each message to the broker takes `delay` (a slow
    /// network), so a batch can outlast its budget. A message whose turn would end
    /// after the budget is not handed over: [`PublishOutcome::NotSent`].
    pub fn set_publish_delay(&self, delay: Duration) {
        *lock(&self.publish_delay) = delay;
    }

    /// Messages confirmed so far.
    #[must_use]
    pub fn confirmed(&self) -> u64 {
        lock(&self.state).confirmed
    }

    /// Ready and unacknowledged deliveries of `queue`.
    #[must_use]
    pub fn queue_depth(&self, queue: &str) -> (usize, usize) {
        lock(&self.state)
            .queues
            .get(queue)
            .map_or((0, 0), |q| (q.ready.len(), q.unacked.len()))
    }

    /// Ends every subscription (their streams return `None`).
    pub fn close(&self) {
        lock(&self.state).closed = true;
        self.changed.notify_waiters();
    }

    /// Publishes a raw envelope, as a foreign publisher could (e.g. without a message
    /// id), bypassing fault injection.
    pub fn publish_envelope(&self, envelope: Envelope) -> PublishOutcome {
        let outcome = self.route_envelope(envelope);
        self.changed.notify_waiters();
        outcome
    }

    fn publish_one(&self, message: &Message) -> PublishOutcome {
        // As a real client would refuse to encode it: AMQP cannot carry it.
        if let Err(e) = message.check_amqp() {
            return PublishOutcome::Rejected(e.to_string());
        }
        if self.unreachable.load(Ordering::SeqCst) {
            return PublishOutcome::NotSent(PortError::transient(
                "publish",
                "broker unreachable (injected fault)",
            ));
        }
        if self.fail_next.take() {
            return PublishOutcome::Failed(PortError::transient(
                "publish",
                "publish failed (injected fault)",
            ));
        }
        if self.nack_next.take() {
            return PublishOutcome::Nacked("injected fault".to_owned());
        }
        if self.return_next.take() {
            return PublishOutcome::Unroutable("NO_ROUTE (injected fault)".to_owned());
        }
        self.route_envelope(Envelope::of(message))
    }

    fn route_envelope(&self, envelope: Envelope) -> PublishOutcome {
        let mut st = lock(&self.state);
        let queues = match st.route(&envelope.exchange, &envelope.routing_key) {
            Ok(q) => q,
            Err(e) => return PublishOutcome::Failed(e),
        };
        if queues.is_empty() {
            return PublishOutcome::Unroutable(format!(
                "NO_ROUTE: no queue bound to {:?} for {:?}",
                envelope.exchange, envelope.routing_key
            ));
        }
        for q in queues {
            if let Some(queue) = st.queues.get_mut(&q) {
                queue.ready.push_back(Queued {
                    envelope: envelope.clone(),
                    redelivered: false,
                });
            }
        }
        st.confirmed += 1;
        PublishOutcome::Confirmed
    }

    fn settle(&self, queue: &str, tag: u64, requeue: bool) {
        let mut st = lock(&self.state);
        if let Some(q) = st.queues.get_mut(queue)
            && let Some(mut item) = q.unacked.remove(&tag)
            && requeue
        {
            item.redelivered = true;
            q.ready.push_front(item);
        }
        drop(st);
        self.changed.notify_waiters();
    }
}

#[async_trait]
impl Publisher for MemoryBroker {
    async fn publish_within(&self, messages: &[Message], budget: Duration) -> Vec<PublishOutcome> {
        let start = tokio::time::Instant::now();
        let delay = *lock(&self.publish_delay);
        let mut outcomes = Vec::with_capacity(messages.len());
        for m in messages {
            // Never hand a message over after the budget: its lease may be gone.
            if start.elapsed() + delay > budget {
                outcomes.push(PublishOutcome::NotSent(PortError::OutOfTime {
                    operation: "publish",
                }));
                continue;
            }
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            outcomes.push(self.publish_one(m));
            self.changed.notify_waiters();
        }
        outcomes
    }

    async fn check(&self) -> Result<(), PortError> {
        if self.unreachable.load(Ordering::SeqCst) {
            Err(PortError::transient(
                "check broker",
                "unreachable (injected fault)",
            ))
        } else {
            Ok(())
        }
    }
}

#[async_trait]
impl Subscriber for MemoryBroker {
    async fn subscribe(
        &self,
        queue: &str,
        prefetch: u16,
    ) -> Result<Box<dyn DeliveryStream>, PortError> {
        if !lock(&self.state).queues.contains_key(queue) {
            return Err(PortError::NotFound {
                what: "queue",
                id: queue.to_owned(),
            });
        }
        Ok(Box::new(MemoryDeliveryStream {
            broker: self.clone(),
            queue: queue.to_owned(),
            prefetch: usize::from(prefetch.max(1)),
            in_flight: Arc::default(),
            cancelled: false,
        }))
    }
}

struct MemoryDeliveryStream {
    broker: MemoryBroker,
    queue: String,
    prefetch: usize,
    in_flight: Arc<AtomicUsize>,
    /// Cancelled: nothing more is taken from the queue (nothing is sent ahead of
    /// `next` here, so nothing is left to hand out).
    cancelled: bool,
}

#[async_trait]
impl DeliveryStream for MemoryDeliveryStream {
    async fn cancel(&mut self) -> Result<(), PortError> {
        self.cancelled = true;
        Ok(())
    }

    async fn next(&mut self) -> Option<Result<Delivery, PortError>> {
        loop {
            if self.cancelled {
                return None;
            }
            let changed = self.broker.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let mut st = lock(&self.broker.state);
                if st.closed {
                    return None;
                }
                if self.in_flight.load(Ordering::SeqCst) < self.prefetch {
                    st.next_tag += 1;
                    let tag = st.next_tag;
                    let Some(q) = st.queues.get_mut(&self.queue) else {
                        return Some(Err(PortError::NotFound {
                            what: "queue",
                            id: self.queue.clone(),
                        }));
                    };
                    if let Some(item) = q.ready.pop_front() {
                        q.unacked.insert(tag, item.clone());
                        self.in_flight.fetch_add(1, Ordering::SeqCst);
                        return Some(Ok(Delivery {
                            envelope: item.envelope,
                            redelivered: item.redelivered,
                            acker: Box::new(MemoryAcker {
                                broker: self.broker.clone(),
                                queue: self.queue.clone(),
                                tag,
                                settled: AtomicBool::new(false),
                                in_flight: Arc::clone(&self.in_flight),
                            }),
                        }));
                    }
                }
            }
            changed.await;
        }
    }
}

struct MemoryAcker {
    broker: MemoryBroker,
    queue: String,
    tag: u64,
    settled: AtomicBool,
    in_flight: Arc<AtomicUsize>,
}

impl MemoryAcker {
    fn finish(&self, requeue: bool) -> bool {
        if self.settled.swap(true, Ordering::SeqCst) {
            return false;
        }
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.broker.settle(&self.queue, self.tag, requeue);
        true
    }
}

#[async_trait]
impl Acker for MemoryAcker {
    async fn ack(&self) -> Result<(), PortError> {
        if self.broker.hang_next.take() {
            std::future::pending::<()>().await;
        }
        // A redelivery fault: the ack is "lost", so the broker delivers it again.
        let lost = self.broker.redeliver_next.take();
        self.finish(lost);
        Ok(())
    }

    async fn nack(&self, requeue: bool) -> Result<(), PortError> {
        self.finish(requeue);
        Ok(())
    }
}

impl Drop for MemoryAcker {
    // As when a channel closes: an unsettled delivery goes back to the queue.
    fn drop(&mut self) {
        self.finish(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_patterns() {
        assert!(topic_matches("order.*", "order.created"));
        assert!(!topic_matches("order.*", "order.created.v2"));
        assert!(topic_matches("order.#", "order.created.v2"));
        assert!(topic_matches("order.#", "order"));
        assert!(topic_matches("#", "anything.at.all"));
        assert!(topic_matches("*.created", "invoice.created"));
        assert!(!topic_matches("*.created", "created"));
        assert!(topic_matches("a.#.z", "a.b.c.z"));
    }
}
