//! The publisher: pipelined confirms, returns as failures, reconnect.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Confirmation, Connection, ExchangeKind as LapinKind};
use outbox_core::Message;
use outbox_core::config::redact_url;
use outbox_ports::{PortError, PublishOutcome, Publisher};
use tokio::sync::{Mutex, MutexGuard};

use crate::convert::properties;
use crate::{connect, port};

/// Settings of the [`RabbitPublisher`].
#[derive(Clone)]
pub struct RabbitPublisherConfig {
    /// `amqp://user:password@host:port/vhost`.
    pub url: String,
    /// A confirm that does not come within this is a failure.
    pub confirm_timeout: Duration,
    /// Time allowed to connect.
    pub connect_timeout: Duration,
    /// Messages in flight (published, confirm outstanding) at most.
    pub max_in_flight: usize,
    /// Pause before reconnecting after a lost connection, doubled up to 30 s.
    pub reconnect_backoff: Duration,
    /// Connections (each with one confirm-mode channel) used for batches published
    /// at the same time; one batch holds one connection until its confirms are in.
    pub connections: usize,
}

impl fmt::Debug for RabbitPublisherConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RabbitPublisherConfig")
            .field("url", &redact_url(&self.url))
            .field("confirm_timeout", &self.confirm_timeout)
            .field("max_in_flight", &self.max_in_flight)
            .field("connections", &self.connections)
            .finish_non_exhaustive()
    }
}

impl RabbitPublisherConfig {
    /// Defaults for `url`: confirm timeout 30 s, 1,024 in flight.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            confirm_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
            max_in_flight: 1024,
            reconnect_backoff: Duration::from_millis(500),
            connections: 1,
        }
    }
}

struct Session {
    connection: Connection,
    channel: Channel,
    /// Exchanges seen to exist on this connection.
    exchanges: HashSet<String>,
}

impl Session {
    fn usable(&self) -> bool {
        self.connection.status().connected() && self.channel.status().connected()
    }
}

#[derive(Default)]
struct State {
    session: Option<Session>,
    /// Earliest time of the next connection attempt, after a failure.
    retry_at: Option<tokio::time::Instant>,
    backoff: Duration,
}

/// [`Publisher`] on RabbitMQ. `connections` connections with one confirm-mode
/// channel each; a batch takes a free one (or waits for one), so that many batches
/// can be published at once, each pipelined on its own channel.
pub struct RabbitPublisher {
    config: RabbitPublisherConfig,
    states: Vec<Mutex<State>>,
    next: AtomicUsize,
}

impl fmt::Debug for RabbitPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RabbitPublisher")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// Every message of a batch that was never sent (no connection, publishers
/// blocked, the channel failed before the first publish).
fn not_sent(n: usize, e: &PortError) -> Vec<PublishOutcome> {
    (0..n)
        .map(|_| PublishOutcome::NotSent(PortError::transient("publish", e.to_string())))
        .collect()
}

impl RabbitPublisher {
    /// A publisher; it connects on first use.
    #[must_use]
    pub fn new(config: RabbitPublisherConfig) -> Self {
        let states = (0..config.connections.max(1))
            .map(|_| Mutex::new(State::default()))
            .collect();
        Self {
            config,
            states,
            next: AtomicUsize::new(0),
        }
    }

    /// A free connection's state, or (all busy) the next one in turn once it is free.
    async fn take_state(&self) -> MutexGuard<'_, State> {
        for s in &self.states {
            if let Ok(guard) = s.try_lock() {
                return guard;
            }
        }
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.states.len();
        self.states[i].lock().await
    }

    async fn open(&self) -> Result<Session, PortError> {
        let connection = connect(&self.config.url, self.config.connect_timeout).await?;
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| port("open channel", "channel", "", &e))?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| port("enable confirms", "channel", "", &e))?;
        Ok(Session {
            connection,
            channel,
            exchanges: HashSet::new(),
        })
    }

    /// A usable session, reconnecting (with backoff between failed attempts).
    async fn ensure<'s>(&self, state: &'s mut State) -> Result<&'s mut Session, PortError> {
        if state.session.as_ref().is_some_and(Session::usable) {
            return state
                .session
                .as_mut()
                .ok_or_else(|| PortError::transient("publish", "no session"));
        }
        if state.session.take().is_some() {
            tracing::warn!(url = %redact_url(&self.config.url), "RabbitMQ connection lost; reconnecting");
        }
        if let Some(at) = state.retry_at {
            tokio::time::sleep_until(at).await;
        }
        match self.open().await {
            Ok(s) => {
                state.retry_at = None;
                state.backoff = Duration::ZERO;
                Ok(state.session.insert(s))
            }
            Err(e) => {
                state.backoff = (state.backoff * 2)
                    .max(self.config.reconnect_backoff)
                    .min(Duration::from_secs(30));
                state.retry_at = Some(tokio::time::Instant::now() + state.backoff);
                Err(e)
            }
        }
    }

    /// Which of `exchanges` exist, by passive declares on a throwaway channel (a
    /// failed passive declare closes its channel, so never on the publishing one).
    async fn check_exchanges(
        session: &mut Session,
        exchanges: HashSet<&str>,
    ) -> Result<HashMap<String, bool>, PortError> {
        let mut found = HashMap::new();
        for name in exchanges {
            if name.is_empty() || session.exchanges.contains(name) {
                found.insert(name.to_owned(), true);
                continue;
            }
            let probe = session
                .connection
                .create_channel()
                .await
                .map_err(|e| port("check exchange", "exchange", name, &e))?;
            let passive = ExchangeDeclareOptions {
                passive: true,
                ..ExchangeDeclareOptions::default()
            };
            match probe
                .exchange_declare(
                    name.into(),
                    LapinKind::Direct,
                    passive,
                    FieldTable::default(),
                )
                .await
            {
                Ok(()) => {
                    session.exchanges.insert(name.to_owned());
                    found.insert(name.to_owned(), true);
                    let _ = probe.close(200, "ok".into()).await;
                }
                Err(e) => match port("check exchange", "exchange", name, &e) {
                    PortError::NotFound { .. } => {
                        found.insert(name.to_owned(), false);
                    }
                    other => return Err(other),
                },
            }
        }
        Ok(found)
    }

    /// The failure of a publish or confirm that did not finish in time.
    fn stalled(&self, session: &Session) -> PortError {
        let why = if session.connection.status().blocked() {
            "the broker blocked publishing (memory or disk alarm); "
        } else {
            ""
        };
        PortError::transient(
            "confirm",
            format!("{why}no confirm within {:?}", self.config.confirm_timeout),
        )
    }

    async fn publish_window(
        &self,
        session: &Session,
        messages: &[&Message],
    ) -> (Vec<PublishOutcome>, bool) {
        // One deadline for the whole window: writing can stall too (a blocked
        // connection stops lapin's writes), not only the confirms.
        let deadline = tokio::time::Instant::now() + self.config.confirm_timeout;
        let mut pending = Vec::with_capacity(messages.len());
        let mut broken = false;
        for m in messages {
            if broken {
                pending.push(Err(PortError::transient("publish", "connection lost")));
                continue;
            }
            let sent = tokio::time::timeout_at(
                deadline,
                session.channel.basic_publish(
                    m.exchange.as_str().into(),
                    m.routing_key.as_str().into(),
                    BasicPublishOptions {
                        mandatory: true,
                        ..BasicPublishOptions::default()
                    },
                    &m.payload,
                    properties(m),
                ),
            )
            .await;
            match sent {
                Ok(Ok(confirm)) => pending.push(Ok(confirm)),
                Ok(Err(e)) => {
                    broken = true;
                    pending.push(Err(port("publish", "exchange", &m.exchange, &e)));
                }
                Err(_) => {
                    broken = true;
                    pending.push(Err(self.stalled(session)));
                }
            }
        }
        let mut outcomes = Vec::with_capacity(messages.len());
        for p in pending {
            let outcome = match p {
                Err(e) => PublishOutcome::Failed(e),
                Ok(confirm) => match tokio::time::timeout_at(deadline, confirm).await {
                    Ok(Ok(Confirmation::Ack(None))) => PublishOutcome::Confirmed,
                    Ok(Ok(Confirmation::Ack(Some(returned)))) => PublishOutcome::Unroutable(
                        format!("{} {}", returned.reply_code, returned.reply_text),
                    ),
                    Ok(Ok(Confirmation::Nack(_))) => {
                        PublishOutcome::Nacked("the broker refused the message".to_owned())
                    }
                    Ok(Ok(Confirmation::NotRequested)) => PublishOutcome::Failed(PortError::fatal(
                        "publish",
                        "publisher confirms are off on this channel",
                    )),
                    Ok(Err(e)) => {
                        broken = true;
                        PublishOutcome::Failed(port("confirm", "exchange", "", &e))
                    }
                    Err(_) => {
                        broken = true;
                        PublishOutcome::Failed(self.stalled(session))
                    }
                },
            };
            outcomes.push(outcome);
        }
        (outcomes, broken)
    }
}

#[async_trait]
impl Publisher for RabbitPublisher {
    async fn publish(&self, messages: &[Message]) -> Vec<PublishOutcome> {
        if messages.is_empty() {
            return Vec::new();
        }
        let mut state = self.take_state().await;
        let session = match self.ensure(&mut state).await {
            Ok(s) => s,
            Err(e) => return not_sent(messages.len(), &e),
        };
        if session.connection.status().blocked() {
            return not_sent(
                messages.len(),
                &PortError::transient(
                    "publish",
                    "the broker has blocked publishing (memory or disk alarm)",
                ),
            );
        }
        let names: HashSet<&str> = messages.iter().map(|m| m.exchange.as_str()).collect();
        let exists = match Self::check_exchanges(session, names).await {
            Ok(e) => e,
            Err(e) => {
                state.session = None;
                return not_sent(messages.len(), &e);
            }
        };
        let mut outcomes: Vec<Option<PublishOutcome>> = messages
            .iter()
            .map(|m| {
                (!exists.get(&m.exchange).copied().unwrap_or(false)).then(|| {
                    PublishOutcome::Failed(PortError::NotFound {
                        what: "exchange",
                        id: m.exchange.clone(),
                    })
                })
            })
            .collect();
        let to_send: Vec<(usize, &Message)> = messages
            .iter()
            .enumerate()
            .filter(|(i, _)| outcomes[*i].is_none())
            .collect();
        let mut lost = false;
        for window in to_send.chunks(self.config.max_in_flight.max(1)) {
            let refs: Vec<&Message> = window.iter().map(|(_, m)| *m).collect();
            let (results, broken) = if lost {
                // This window was never sent: the connection died under an earlier one.
                (
                    refs.iter()
                        .map(|_| {
                            PublishOutcome::NotSent(PortError::transient(
                                "publish",
                                "connection lost before this part of the batch was sent",
                            ))
                        })
                        .collect(),
                    true,
                )
            } else {
                self.publish_window(session, &refs).await
            };
            lost |= broken;
            for ((i, _), r) in window.iter().zip(results) {
                outcomes[*i] = Some(r);
            }
        }
        if lost {
            state.session = None;
        }
        outcomes
            .into_iter()
            .map(|o| {
                o.unwrap_or_else(|| {
                    PublishOutcome::Failed(PortError::fatal("publish", "no outcome"))
                })
            })
            .collect()
    }

    async fn check(&self) -> Result<(), PortError> {
        let mut state = self.take_state().await;
        self.ensure(&mut state).await.map(|_| ())
    }
}
