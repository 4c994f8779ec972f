//! The broker's nodes: one URL, or several nodes of one RabbitMQ cluster, and which
//! of them the next connection tries first.
//!
//! A publisher or subscriber starts at a node chosen at random (so many processes
//! spread over the cluster), keeps to the node that answered, and after losing its
//! connection starts at the next one: a node that died is tried last instead of
//! first, where its connect could wait out the whole timeout (a host that stopped
//! answering refuses nothing). Each attempt has the connect timeout of its own,
//! within the caller's deadline.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use outbox_core::config::redact_url;
use outbox_ports::PortError;

use crate::{RabbitTls, connect_with_tls};

/// Where connections go: the URLs, and the index the next attempt starts at
/// (shared by clones).
#[derive(Clone)]
pub(crate) struct Nodes {
    urls: Arc<[String]>,
    next: Arc<AtomicUsize>,
}

impl Nodes {
    /// `first` and then `more`, starting at a random one of them.
    pub(crate) fn new(first: &str, more: &[String]) -> Self {
        let urls: Arc<[String]> = std::iter::once(first.to_owned())
            .chain(more.iter().cloned())
            .collect();
        let start = fastrand::usize(..urls.len());
        Self {
            urls,
            next: Arc::new(AtomicUsize::new(start)),
        }
    }

    /// The URLs, in their configured order.
    pub(crate) fn urls(&self) -> &[String] {
        &self.urls
    }

    /// The URL the next connection tries first, its password hidden (for logs).
    #[cfg(test)]
    pub(crate) fn current(&self) -> String {
        self.url_of(self.next.load(Ordering::Relaxed))
    }

    /// Node `at`'s URL, its password hidden (for logs).
    pub(crate) fn url_of(&self, at: usize) -> String {
        redact_url(&self.urls[at % self.urls.len()])
    }

    /// A connection to node `at` was lost: the next attempt starts at the following
    /// node. Only once for that node: several connections that lost the same node
    /// move the start once, not once each (which could bring it round to the node
    /// that was lost).
    pub(crate) fn lost(&self, at: usize) {
        let n = self.urls.len();
        if n > 1 {
            let _ = self.next.compare_exchange(
                at % n,
                (at + 1) % n,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
    }

    /// A connection to the first node that accepts one, and that node's index,
    /// trying each once in turn from the current one, each within `per_node` and all
    /// by `deadline` (when given). The node that accepted is the current one
    /// afterwards; when none did, the next attempt starts past those that failed (at
    /// the one the deadline cut short, if any).
    ///
    /// # Errors
    /// [`PortError::Transient`] naming every node tried and why it failed (URLs
    /// without passwords); [`PortError::OutOfTime`] when the deadline passed before
    /// a node could be tried.
    pub(crate) async fn connect(
        &self,
        tls: &RabbitTls,
        per_node: Duration,
        deadline: Option<Instant>,
    ) -> Result<(lapin::Connection, usize), PortError> {
        let n = self.urls.len();
        let start = self.next.load(Ordering::Relaxed) % n;
        let mut failures = Vec::new();
        let mut resume = (start + n) % n;
        for i in 0..n {
            let at = (start + i) % n;
            let timeout = match deadline {
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        resume = at;
                        break;
                    }
                    per_node.min(left)
                }
                None => per_node,
            };
            match connect_with_tls(&self.urls[at], tls, timeout).await {
                Ok(connection) => {
                    self.next.store(at, Ordering::Relaxed);
                    if i > 0 {
                        tracing::info!(node = %redact_url(&self.urls[at]), "connected to another RabbitMQ node");
                    }
                    return Ok((connection, at));
                }
                Err(e) => {
                    // Cut short by the deadline: this node had no fair try.
                    let cut = deadline.is_some_and(|d| Instant::now() >= d);
                    failures.push(e);
                    resume = if cut { at } else { (at + 1) % n };
                    if cut {
                        break;
                    }
                }
            }
        }
        self.next.store(resume, Ordering::Relaxed);
        if failures.is_empty() {
            return Err(PortError::OutOfTime {
                operation: "connect to RabbitMQ",
            });
        }
        if n == 1 {
            return Err(failures.remove(0));
        }
        let why: Vec<String> = failures
            .iter()
            .map(|e| match e {
                PortError::Transient { message, .. } => message.clone(),
                other => other.to_string(),
            })
            .collect();
        Err(PortError::transient(
            "connect to RabbitMQ",
            format!(
                "{} of {n} nodes tried, none connected: {}",
                why.len(),
                why.join("; ")
            ),
        ))
    }
}

/// `backoff` spread by up to a fifth either way, so that processes that lost the
/// same node do not all come back at the same instant.
pub(crate) fn jittered(backoff: Duration) -> Duration {
    backoff.mul_f64(0.8 + fastrand::f64() * 0.4)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_start_is_one_of_the_nodes_and_a_loss_moves_to_the_next() {
        let more = vec!["amqp://b".to_owned(), "amqp://c".to_owned()];
        for _ in 0..50 {
            let nodes = Nodes::new("amqp://a", &more);
            let first = nodes.current();
            assert!(["amqp://a", "amqp://b", "amqp://c"].contains(&first.as_str()));
            let at = nodes.next.load(Ordering::Relaxed);
            // Three connections lost the same node: the start moves once.
            for _ in 0..3 {
                nodes.lost(at);
            }
            assert_eq!(
                nodes.url_of(at + 1),
                nodes.current(),
                "a loss moves to the next node"
            );
        }
        let one = Nodes::new("amqp://a", &[]);
        one.lost(0);
        assert_eq!(one.current(), "amqp://a");
    }

    #[test]
    fn jitter_stays_within_a_fifth() {
        for _ in 0..1000 {
            let j = jittered(Duration::from_secs(10));
            assert!(
                j >= Duration::from_secs(8) && j <= Duration::from_secs(12),
                "{j:?}"
            );
        }
    }
}
