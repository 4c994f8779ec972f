//! The publisher: pipelined confirms, returns as failures, reconnect.

use std::borrow::Cow;
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
use outbox_core::shard::{shard_name, shard_of};
use outbox_ports::{NO_PUBLISH_DEADLINE, PortError, PublishOutcome, Publisher};
use tokio::sync::{Mutex, MutexGuard};
use tokio::time::{Instant, timeout_at};

use crate::convert::properties;
use crate::nodes::{Nodes, jittered};
use crate::{RabbitTls, Topology, port};

/// Settings of the [`RabbitPublisher`].
#[derive(Clone)]
pub struct RabbitPublisherConfig {
    /// `amqp://user:password@host:port/vhost`.
    pub url: String,
    /// Other nodes of the same cluster: each connection goes to one of `url` and
    /// these (a random one first, the next after a loss; see the crate's text).
    pub failover_urls: Vec<String>,
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
    /// CA and client certificate for an `amqps://` URL (default: the system's roots).
    pub tls: RabbitTls,
}

impl fmt::Debug for RabbitPublisherConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RabbitPublisherConfig")
            .field("url", &redact_url(&self.url))
            .field(
                "failover_urls",
                &self
                    .failover_urls
                    .iter()
                    .map(|u| redact_url(u))
                    .collect::<Vec<_>>(),
            )
            .field("confirm_timeout", &self.confirm_timeout)
            .field("max_in_flight", &self.max_in_flight)
            .field("connections", &self.connections)
            .field("tls", &self.tls)
            .finish_non_exhaustive()
    }
}

impl RabbitPublisherConfig {
    /// Defaults for `url`: confirm timeout 30 s, 1,024 in flight.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            failover_urls: Vec::new(),
            confirm_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
            max_in_flight: 1024,
            reconnect_backoff: Duration::from_millis(500),
            connections: 1,
            tls: RabbitTls::default(),
        }
    }
}

struct Session {
    /// The node it is connected to (an index of the publisher's nodes).
    node: usize,
    connection: Connection,
    channel: Channel,
    /// Exchanges seen to exist on this connection.
    exchanges: HashSet<String>,
    /// A publish on `channel` was nacked: the next batch opens a new channel first
    /// (see [`RabbitPublisher::replace_channel`]).
    nacked: bool,
    /// The topology's declaration passed over a queue (its home node down): when
    /// to declare it again on this connection (see
    /// [`RabbitPublisher::with_redeclare_every`]).
    redeclare_at: Option<Instant>,
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
    retry_at: Option<Instant>,
    backoff: Duration,
}

/// [`Publisher`] on RabbitMQ. `connections` connections with one confirm-mode
/// channel each; a batch takes a free one (or waits for one), so that many batches
/// can be published at once, each pipelined on its own channel.
pub struct RabbitPublisher {
    config: RabbitPublisherConfig,
    nodes: Nodes,
    states: Vec<Mutex<State>>,
    next: AtomicUsize,
    /// Declared on every connection opened (see [`RabbitPublisher::with_topology`]).
    topology: Option<Topology>,
    /// The topology's sharded exchanges and their shard counts.
    shards: HashMap<String, u16>,
    /// Queues the last topology declaration passed over (their home node down).
    unavailable_queues: std::sync::Mutex<Vec<String>>,
    /// See [`RabbitPublisher::with_redeclare_every`].
    redeclare_every: Duration,
}

impl fmt::Debug for RabbitPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RabbitPublisher")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// Why a session could not be opened.
struct OpenFailure {
    error: PortError,
    /// The batch's budget ran out first: nothing is known about the broker.
    by_budget: bool,
}

/// A message that was never handed to the broker, and why.
fn not_sent(why: impl Into<NotSentWhy>) -> PublishOutcome {
    PublishOutcome::NotSent(match why.into() {
        NotSentWhy::Error(e) => e,
        NotSentWhy::Text(t) => PortError::transient("publish", t),
    })
}

/// Why a message was not handed over: an error (its kind kept, so the relay can
/// tell a batch out of time from a broker out of reach), or a plain reason.
enum NotSentWhy {
    Error(PortError),
    Text(String),
}

impl From<PortError> for NotSentWhy {
    fn from(e: PortError) -> Self {
        Self::Error(e)
    }
}

impl From<&PortError> for NotSentWhy {
    fn from(e: &PortError) -> Self {
        Self::Error(e.again())
    }
}

impl From<&str> for NotSentWhy {
    fn from(t: &str) -> Self {
        Self::Text(t.to_owned())
    }
}

/// Whether `basic_publish` failed its own first check (the channel is not
/// connected), which returns before any frame is queued: lapin names the
/// operation in the state error of that check only.
fn refused_before_sending(e: &lapin::Error) -> bool {
    matches!(
        e.kind(),
        lapin::ErrorKind::InvalidChannelState(_, "basic.publish")
    )
}

/// What the broker refused when it closed the channel for one `basic.publish`.
/// Every later frame on that channel is discarded and every confirm outstanding on
/// it fails with the same error, whatever its message: only the messages the
/// refusal is about were at fault.
#[derive(Debug, PartialEq, Eq)]
enum Refusal {
    /// `404 NOT_FOUND - no exchange 'x' in vhost 'v'` (the only NOT_FOUND a
    /// `basic.publish` raises): `Some(x)`, or `None` when the text does not say.
    MissingExchange(Option<String>),
    /// `403 ACCESS_REFUSED - access to exchange 'x' in vhost 'v' refused for user
    /// 'u'` (no write permission on it), `write access to topic 'k' in exchange
    /// 'x' ...` (a topic permission), or `cannot publish to internal exchange 'x'
    /// ...`: `Some(x)`, or `None` when the text does not say.
    Forbidden(Option<String>),
    /// `406 PRECONDITION_FAILED - message size N is larger than configured max
    /// size M`: bodies over `M` bytes.
    LargerThan(usize),
}

/// The exchange named in `'...' in vhost` after `marker`, if the text says.
fn named_exchange(text: &str, marker: &str) -> Option<String> {
    text.split_once(marker)
        .and_then(|(_, rest)| rest.split_once("' in vhost"))
        .map(|(name, _)| name.to_owned())
}

/// The refusal `e` stands for, if it is the broker closing the channel for a
/// publish (see [`Refusal`]).
fn refusal(e: &lapin::Error) -> Option<Refusal> {
    let lapin::ErrorKind::ProtocolError(amqp) = e.kind() else {
        return None;
    };
    refusal_of(amqp.get_id(), amqp.get_message().as_str())
}

fn refusal_of(code: u16, text: &str) -> Option<Refusal> {
    match code {
        404 => Some(Refusal::MissingExchange(named_exchange(
            text,
            "no exchange '",
        ))),
        403 => Some(Refusal::Forbidden(
            named_exchange(text, "access to exchange '")
                .or_else(|| named_exchange(text, "internal exchange '"))
                // A topic permission: `write access to topic 'k' in exchange 'x'
                // in vhost 'v' refused for user 'u'`.
                .or_else(|| named_exchange(text, " in exchange '")),
        )),
        406 => text
            .split_once("larger than configured max size ")
            .and_then(|(_, rest)| {
                rest.split(|c: char| !c.is_ascii_digit())
                    .next()?
                    .parse()
                    .ok()
            })
            .map(Refusal::LargerThan),
        _ => None,
    }
}

/// Whether `refusal` is about `message`, published to `target`; `None` for a
/// missing exchange not named (see [`after_handover`]).
fn at_fault(refusal: &Refusal, message: &Message, target: &str) -> Option<bool> {
    match refusal {
        Refusal::MissingExchange(Some(name)) | Refusal::Forbidden(Some(name)) => {
            Some(name == target)
        }
        Refusal::MissingExchange(None) => None,
        Refusal::Forbidden(None) => Some(true),
        Refusal::LargerThan(max) => Some(message.payload.len() > *max),
    }
}

/// Whether `why`, the refusal that closed the channel `window` went out on, costs
/// `message` an attempt (see [`after_handover`]).
fn spends_an_attempt(
    why: &Refusal,
    window: &[(&Message, &str)],
    (message, target): (&Message, &str),
) -> bool {
    match at_fault(why, message, target) {
        Some(true) => true,
        // The passive checks of the next batch find a missing exchange.
        Some(false) if matches!(why, Refusal::MissingExchange(_)) => false,
        Some(false) => !window
            .iter()
            .any(|&(m, t)| at_fault(why, m, t) == Some(true)),
        None => false,
    }
}

/// The outcome of a message of `window` whose publish or confirm failed with `e`
/// after it was handed over. A channel closed for another message's refusal
/// ([`Refusal`]) did not refuse this one: `NotSent`, no attempt spent (it may have
/// been routed before the close: a duplicate the inbox absorbs), and for a missing
/// exchange the next batch checks its exchange afresh. Only a message the refusal
/// is about (its exchange named, or its body over the size named) spends an
/// attempt; so does every message when the broker's text does not say which (a
/// 403 without a name), or when a 403 or 406 fits none of the window's (a text
/// this code misreads: excusing them all would send the culprit again and again
/// without ever spending its attempts). A missing exchange spends an attempt only
/// for a message it names (the next batch's passive checks find it). Any other
/// error: `failed`.
fn after_handover(
    window: &[(&Message, &str)],
    (message, target): (&Message, &str),
    e: &lapin::Error,
    failed: PortError,
) -> PublishOutcome {
    let Some(why) = refusal(e) else {
        return PublishOutcome::Failed(failed);
    };
    match (spends_an_attempt(&why, window, (message, target)), why) {
        (true, Refusal::MissingExchange(Some(name))) => {
            PublishOutcome::Failed(PortError::NotFound {
                what: "exchange",
                id: name,
            })
        }
        (true, _) => PublishOutcome::Failed(failed),
        (false, _) => not_sent(PortError::transient(
            "publish",
            format!(
                "the broker closed the channel for another message's refusal ({e}); this message, for exchange {target:?}, is sent again"
            ),
        )),
    }
}

/// A message's confirm as it came in, before returns are matched.
enum Settled {
    /// Acked: `Confirmed`, unless the broker returned it (see [`Returns`]).
    Acked,
    /// Nacked: its confirm completed (and took a waiting return, if any).
    Nacked(PublishOutcome),
    /// Its outcome, whatever was returned; its confirm never completed (failed,
    /// timed out, or the message was never handed over).
    Decided(PublishOutcome),
}

/// The `basic.return`s of one window, matched by the returned message's own
/// `message_id`, never by the confirm lapin attached them to.
///
/// A return carries no delivery tag. RabbitMQ sends it before the ack of its
/// message, and lapin hands each waiting return to the next confirm it completes,
/// in whatever order: with acks coalesced (`multiple`) below the oldest
/// unconfirmed tag, that is often another message's confirm (frames captured from
/// RabbitMQ 3.10: `return 833`, then `ack 790 multiple` took it, then a bare
/// `ack 833`). Each return precedes its own message's ack or nack, and each
/// completed confirm takes the oldest waiting return, if any. So every returned
/// message whose confirm completed made one completion while its return waited:
/// returns handed out are at least as many as the returned messages that
/// completed. A return still waiting for a message acked bare therefore means
/// that a return handed out names a message whose confirm never completed (it
/// failed or timed out). Only then can a bare ack hide a return; the outcomes
/// below check exactly that.
#[derive(Default)]
struct Returns {
    /// Each return: the returned message's id, and the broker's reason.
    returned: Vec<(Option<String>, String)>,
}

impl Returns {
    fn take(&mut self, returned: Option<lapin::message::BasicReturnMessage>) {
        if let Some(r) = returned {
            let id = r
                .properties
                .message_id()
                .as_ref()
                .map(|s| s.as_str().to_owned());
            self.returned
                .push((id, format!("{} {}", r.reply_code, r.reply_text)));
        }
    }

    /// Each message's outcome, and how many returns named no message of `ids`.
    ///
    /// An acked message the broker returned is `Unroutable`. An acked message not
    /// seen returned is `Confirmed` only when that proves it was routed: when a
    /// return named no message of the window (never expected: every message
    /// carries its id), it is a failed attempt; when a return named a message
    /// whose confirm never completed, a return for it may still wait (see
    /// [`Returns`]): it is sent again (`NotSent`, a duplicate the inbox absorbs).
    /// Never marked sent while no queue may have it.
    fn outcomes(self, ids: &[String], settled: Vec<Settled>) -> (Vec<PublishOutcome>, usize) {
        let known: HashSet<&str> = ids.iter().map(String::as_str).collect();
        let uncompleted: HashSet<&str> = ids
            .iter()
            .zip(&settled)
            .filter(|(_, s)| matches!(s, Settled::Decided(_)))
            .map(|(id, _)| id.as_str())
            .collect();
        let incomplete = self
            .returned
            .iter()
            .any(|(id, _)| id.as_deref().is_some_and(|id| uncompleted.contains(id)));
        let mut by_id: HashMap<String, String> = HashMap::new();
        let mut unmatched = 0;
        for (id, why) in self.returned {
            match id {
                Some(id) if known.contains(id.as_str()) => {
                    by_id.insert(id, why);
                }
                _ => unmatched += 1,
            }
        }
        let outcomes = ids
            .iter()
            .zip(settled)
            .map(|(id, s)| match s {
                Settled::Decided(outcome) | Settled::Nacked(outcome) => outcome,
                Settled::Acked => match by_id.get(id) {
                    Some(why) => PublishOutcome::Unroutable(why.clone()),
                    None if unmatched > 0 => PublishOutcome::Failed(PortError::transient(
                        "confirm",
                        "the broker returned a message of this window that names no message of it; none can be told routed",
                    )),
                    None if incomplete => not_sent(
                        "acked while a return of its window named a message whose confirm failed: a return for this one may be unread; sent again",
                    ),
                    None => PublishOutcome::Confirmed,
                },
            })
            .collect();
        (outcomes, unmatched)
    }
}

/// The longest [`RabbitPublisher::check`] waits for its round trip on an open
/// connection before it drops the connection: under the 5 s a relay's `/readyz`
/// gives each check.
const CHECK_ROUND_TRIP: Duration = Duration::from_secs(4);

/// The error of a wait that the batch's budget cut short.
const fn out_of_time(operation: &'static str) -> PortError {
    PortError::OutOfTime { operation }
}

/// `now + budget`, or (a budget too large to add) a year from now.
fn deadline_after(budget: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(budget)
        .unwrap_or_else(|| now + NO_PUBLISH_DEADLINE)
}

impl RabbitPublisher {
    /// A publisher; it connects on first use.
    #[must_use]
    pub fn new(config: RabbitPublisherConfig) -> Self {
        let states = (0..config.connections.max(1))
            .map(|_| Mutex::new(State::default()))
            .collect();
        Self {
            nodes: Nodes::new(&config.url, &config.failover_urls),
            config,
            states,
            next: AtomicUsize::new(0),
            topology: None,
            shards: HashMap::new(),
            unavailable_queues: std::sync::Mutex::default(),
            redeclare_every: Duration::from_secs(10),
        }
    }

    /// Declares `topology` on every connection this publisher opens, the first and
    /// each after a lost one, before anything is published on it: an exchange the
    /// broker lost in a restart (a non-durable one) or an operator deleted is there
    /// again once the relay reconnects, instead of every message for it spending its
    /// attempts until dead. A declaration the broker refuses fails the connection
    /// (the batch is not sent; tried again after the reconnect backoff).
    ///
    /// A message for a sharded exchange of `topology` ([`crate::ExchangeSpec::shards`])
    /// is published to one of its shards, chosen by
    /// [`outbox_core::shard::shard_of`], with the header
    /// [`outbox_ports::EXCHANGE_HEADER`] naming the exchange it was written for.
    #[must_use]
    pub fn with_topology(mut self, topology: Topology) -> Self {
        self.shards = topology
            .exchanges
            .iter()
            .filter(|x| x.shards > 1)
            .map(|x| (x.name.clone(), x.shards))
            .collect();
        self.topology =
            (!topology.exchanges.is_empty() || !topology.queues.is_empty()).then_some(topology);
        self
    }

    /// The exchange `m` is published to: its own, or one shard of it.
    fn target<'m>(&self, m: &'m Message) -> Cow<'m, str> {
        match self.shards.get(&m.exchange) {
            Some(&n) => Cow::Owned(shard_name(&m.exchange, shard_of(m, n))),
            None => Cow::Borrowed(m.exchange.as_str()),
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

    /// Connects, opens the channel and enables confirms, each bounded by `deadline`.
    /// On failure, also whether the batch's budget cut the attempt short (rather
    /// than the broker failing it or its own `connect_timeout` running out).
    async fn open(&self, deadline: Instant) -> Result<Session, OpenFailure> {
        let (connection, node) = self
            .nodes
            .connect(
                &self.config.tls,
                self.config.connect_timeout,
                Some(deadline.into_std()),
            )
            .await
            .map_err(|error| OpenFailure {
                // Ended by the budget: no verdict on the broker. A refusal comes
                // back before the deadline.
                by_budget: Instant::now() >= deadline,
                error,
            })?;
        let budget = |operation| OpenFailure {
            error: out_of_time(operation),
            by_budget: true,
        };
        let broker = |operation, e: lapin::Error| OpenFailure {
            error: port(operation, "channel", "", &e),
            by_budget: false,
        };
        let channel = timeout_at(deadline, connection.create_channel())
            .await
            .map_err(|_| budget("open channel"))?
            .map_err(|e| broker("open channel", e))?;
        timeout_at(
            deadline,
            channel.confirm_select(ConfirmSelectOptions::default()),
        )
        .await
        .map_err(|_| budget("enable confirms"))?
        .map_err(|e| broker("enable confirms", e))?;
        let mut exchanges = HashSet::new();
        let mut redeclare_at = None;
        if let Some(topology) = &self.topology {
            match timeout_at(deadline, topology.declare(&connection)).await {
                Err(_) => return Err(budget("declare topology")),
                Ok(Err(error)) => {
                    return Err(OpenFailure {
                        error,
                        by_budget: false,
                    });
                }
                // Declared just now: no passive check needed for these.
                // (a sharded exchange's shards, not its own name, which is not declared).
                Ok(Ok(declared)) => {
                    exchanges.extend(topology.expanded().exchanges.into_iter().map(|x| x.name));
                    redeclare_at = self.passed_over(declared);
                }
            }
        }
        Ok(Session {
            node,
            connection,
            channel,
            exchanges,
            nacked: false,
            redeclare_at,
        })
    }

    /// Records what a declaration passed over; when to declare again, if anything.
    fn passed_over(&self, declared: crate::Declared) -> Option<Instant> {
        let again = (!declared.unavailable_queues.is_empty())
            .then(|| Instant::now() + self.redeclare_every);
        *self
            .unavailable_queues
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = declared.unavailable_queues;
        again
    }

    /// Declares the topology again on `session`'s connection when a queue was
    /// passed over and its time has come: once the queue's node is back, the queue
    /// and its bindings are there again (a binding added meanwhile too) without
    /// waiting for a new connection, and readiness no longer reports it. Bounded
    /// by `deadline` and a few seconds; a failure leaves the batch alone.
    async fn redeclare_if_due(&self, session: &mut Session, deadline: Instant) {
        let (Some(at), Some(topology)) = (session.redeclare_at, &self.topology) else {
            return;
        };
        if Instant::now() < at {
            return;
        }
        let bound = deadline.min(Instant::now() + Duration::from_secs(5));
        session.redeclare_at = match timeout_at(bound, topology.declare(&session.connection)).await
        {
            Ok(Ok(declared)) => self.passed_over(declared),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "declaring the topology again failed; tried again later");
                Some(Instant::now() + self.redeclare_every)
            }
            Err(_) => Some(Instant::now() + self.redeclare_every),
        };
    }

    /// How often a connection declares its topology again while a queue of it was
    /// passed over (its home node down; see [`Topology::declare`]): 10 s unless set.
    #[must_use]
    pub fn with_redeclare_every(mut self, every: Duration) -> Self {
        self.redeclare_every = every;
        self
    }

    /// Replaces the channel of a session that had a publish nacked, at the start of
    /// the next batch, within its `deadline`. RabbitMQ 3.10 nacks every publish of a
    /// channel to a quorum queue when that channel's first publish to it came while
    /// the queue had no leader (the leader's node had just died, the election not
    /// over), for as long as the channel lives: 17.5 s in the chaos scenario
    /// `cluster_node_kill`, until the dead node returned, while a channel opened
    /// after the election published normally. A nack for another reason (a full
    /// queue refusing publishes) costs a new channel a batch. The old channel
    /// closes as it is dropped (lapin closes a channel whose last handle goes).
    async fn replace_channel(&self, state: &mut State, deadline: Instant) -> Result<(), PortError> {
        let Some(session) = state.session.as_mut() else {
            return Ok(());
        };
        let fresh = async {
            let channel = session.connection.create_channel().await?;
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await?;
            Ok::<_, lapin::Error>(channel)
        };
        let failed = match timeout_at(deadline, fresh).await {
            Ok(Ok(channel)) => {
                session.channel = channel;
                session.nacked = false;
                tracing::debug!(node = %self.nodes.url_of(session.node), "a publish was nacked; this batch publishes on a new channel");
                return Ok(());
            }
            Ok(Err(e)) => port("open channel", "channel", "", &e),
            Err(_) => out_of_time("open channel"),
        };
        if session.connection.status().connected() {
            // Out of time, or the broker refused the channel: the next batch
            // connects again, to the same node first.
            state.session = None;
        } else {
            self.drop_session(state);
        }
        Err(failed)
    }

    /// Drops a session that broke while publishing; the next connection starts at
    /// the node after its own.
    fn drop_session(&self, state: &mut State) {
        if let Some(broken) = state.session.take() {
            tracing::warn!(node = %self.nodes.url_of(broken.node), "RabbitMQ session broken while publishing; the next batch reconnects");
            self.nodes.lost(broken.node);
        }
    }

    /// A usable session, reconnecting (with backoff between failed attempts), by
    /// `deadline`: a backoff ending later is not waited for. Only the broker's
    /// failures set the backoff: a batch whose budget is spent, or runs out while
    /// connecting, says nothing about the broker, and the next batch may try at once.
    async fn ensure<'s>(
        &self,
        state: &'s mut State,
        deadline: Instant,
    ) -> Result<&'s mut Session, PortError> {
        if state.session.as_ref().is_some_and(Session::usable) {
            return state
                .session
                .as_mut()
                .ok_or_else(|| PortError::transient("publish", "no session"));
        }
        if let Some(lost) = state.session.take() {
            tracing::warn!(node = %self.nodes.url_of(lost.node), "RabbitMQ connection lost; reconnecting");
            self.nodes.lost(lost.node);
        }
        if let Some(at) = state.retry_at {
            if at >= deadline {
                return Err(PortError::transient(
                    "connect to RabbitMQ",
                    "waiting before the next reconnect; the batch's time runs out first",
                ));
            }
            tokio::time::sleep_until(at).await;
        }
        if Instant::now() >= deadline {
            return Err(out_of_time("connect to RabbitMQ"));
        }
        match self.open(deadline).await {
            Ok(s) => {
                state.retry_at = None;
                state.backoff = Duration::ZERO;
                Ok(state.session.insert(s))
            }
            Err(OpenFailure {
                error,
                by_budget: true,
            }) => Err(error),
            Err(OpenFailure { error, .. }) => {
                state.backoff = (state.backoff * 2)
                    .max(self.config.reconnect_backoff)
                    .min(Duration::from_secs(30));
                state.retry_at = Some(Instant::now() + jittered(state.backoff));
                Err(error)
            }
        }
    }

    /// Which of `exchanges` exist, by passive declares on a throwaway channel (a
    /// failed passive declare closes its channel, so never on the publishing one).
    async fn check_exchanges(
        session: &mut Session,
        exchanges: HashSet<&str>,
        deadline: Instant,
    ) -> Result<HashMap<String, bool>, PortError> {
        let mut found = HashMap::new();
        for name in exchanges {
            if name.is_empty() || session.exchanges.contains(name) {
                found.insert(name.to_owned(), true);
                continue;
            }
            let probe = timeout_at(deadline, session.connection.create_channel())
                .await
                .map_err(|_| out_of_time("check exchange"))?
                .map_err(|e| port("check exchange", "exchange", name, &e))?;
            let passive = ExchangeDeclareOptions {
                passive: true,
                ..ExchangeDeclareOptions::default()
            };
            let declared = timeout_at(
                deadline,
                probe.exchange_declare(
                    name.into(),
                    LapinKind::Direct,
                    passive,
                    FieldTable::default(),
                ),
            )
            .await
            .map_err(|_| out_of_time("check exchange"))?;
            match declared {
                Ok(()) => {
                    session.exchanges.insert(name.to_owned());
                    found.insert(name.to_owned(), true);
                    // Closing is a courtesy; it must not hold the batch up.
                    let _ = timeout_at(deadline, probe.close(200, "ok".into())).await;
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

    /// Publishes one window and awaits its confirms, all by the earlier of the
    /// confirm timeout and the batch's `deadline`. A message whose turn comes after
    /// the deadline, or after the connection broke, is never handed over:
    /// `NotSent`. Returns the outcomes and whether the session is unusable.
    async fn publish_window(
        &self,
        session: &Session,
        messages: &[(&Message, &str)],
        deadline: Instant,
    ) -> (Vec<PublishOutcome>, bool) {
        // One deadline for the whole window: writing can stall too (a blocked
        // connection stops lapin's writes), not only the confirms.
        let window_deadline = (Instant::now() + self.config.confirm_timeout).min(deadline);
        let mut pending = Vec::with_capacity(messages.len());
        let mut broken = false;
        for &(m, target) in messages {
            if broken {
                pending.push(Err(not_sent(
                    "the connection broke before this message was sent",
                )));
                continue;
            }
            if Instant::now() >= deadline {
                pending.push(Err(not_sent(out_of_time("publish"))));
                continue;
            }
            let props = match properties(m, target != m.exchange) {
                Ok(p) => p,
                Err(e) => {
                    pending.push(Err(PublishOutcome::Rejected(e.to_string())));
                    continue;
                }
            };
            let sent = timeout_at(
                window_deadline,
                session.channel.basic_publish(
                    target.into(),
                    m.routing_key.as_str().into(),
                    BasicPublishOptions {
                        mandatory: true,
                        ..BasicPublishOptions::default()
                    },
                    &m.payload,
                    props,
                ),
            )
            .await;
            match sent {
                Ok(Ok(confirm)) => pending.push(Ok(confirm)),
                // lapin's check before it queues anything: the channel was already
                // closed, so this message was never handed over.
                Ok(Err(e)) if refused_before_sending(&e) => {
                    broken = true;
                    pending.push(Err(not_sent(port("publish", "exchange", target, &e))));
                }
                // It may have been written before the error: an attempt, unless the
                // channel was closed for another message's exchange.
                Ok(Err(e)) => {
                    broken = true;
                    let failed = port("publish", "exchange", target, &e);
                    pending.push(Err(after_handover(messages, (m, target), &e, failed)));
                }
                Err(_) => {
                    broken = true;
                    pending.push(Err(PublishOutcome::Failed(self.stalled(session))));
                }
            }
        }
        // First every confirm, then the outcomes: a return rides on whichever
        // confirm lapin completes next (see `Returns`), often another message's.
        let mut returns = Returns::default();
        let mut settled = Vec::with_capacity(messages.len());
        for (&(m, target), p) in messages.iter().zip(pending) {
            let settled_one = match p {
                Err(outcome) => Settled::Decided(outcome),
                Ok(confirm) => match timeout_at(window_deadline, confirm).await {
                    Ok(Ok(Confirmation::Ack(returned))) => {
                        returns.take(returned);
                        Settled::Acked
                    }
                    Ok(Ok(Confirmation::Nack(returned))) => {
                        returns.take(returned);
                        Settled::Nacked(PublishOutcome::Nacked(
                            "the broker refused the message".to_owned(),
                        ))
                    }
                    Ok(Ok(Confirmation::NotRequested)) => Settled::Decided(PublishOutcome::Failed(
                        PortError::fatal("publish", "publisher confirms are off on this channel"),
                    )),
                    Ok(Err(e)) => {
                        broken = true;
                        Settled::Decided(after_handover(
                            messages,
                            (m, target),
                            &e,
                            port("confirm", "exchange", "", &e),
                        ))
                    }
                    // Handed over, unconfirmed: it may be with the broker. An attempt,
                    // retried later. The session goes: a late confirm must not be
                    // taken for another message's.
                    Err(_) => {
                        broken = true;
                        Settled::Decided(PublishOutcome::Failed(self.stalled(session)))
                    }
                },
            };
            settled.push(settled_one);
        }
        let ids: Vec<String> = messages.iter().map(|(m, _)| m.id.to_string()).collect();
        let (outcomes, unmatched) = returns.outcomes(&ids, settled);
        if unmatched > 0 {
            tracing::error!(
                unmatched,
                "the broker returned messages whose id is not in the window; every acked message of the window counts as a failed attempt"
            );
        }
        (outcomes, broken)
    }
}

#[async_trait]
impl Publisher for RabbitPublisher {
    async fn publish_within(&self, messages: &[Message], budget: Duration) -> Vec<PublishOutcome> {
        let deadline = deadline_after(budget);
        // Permanent first, before any client call: lapin panics on a short string
        // over 255 bytes.
        let mut outcomes: Vec<Option<PublishOutcome>> = messages
            .iter()
            .map(|m| {
                m.check_amqp()
                    .err()
                    .map(|e| PublishOutcome::Rejected(e.to_string()))
            })
            .collect();
        let publishable: Vec<usize> = (0..messages.len())
            .filter(|i| outcomes[*i].is_none())
            .collect();
        if publishable.is_empty() {
            return outcomes.into_iter().flatten().collect();
        }
        // Every message not decided below was never handed over.
        let finish = |outcomes: Vec<Option<PublishOutcome>>, why: &PortError| {
            outcomes
                .into_iter()
                .map(|o| o.unwrap_or_else(|| not_sent(why)))
                .collect::<Vec<_>>()
        };
        let Ok(mut state) = timeout_at(deadline, self.take_state()).await else {
            return finish(outcomes, &out_of_time("publish"));
        };
        if state.session.as_ref().is_some_and(|s| s.nacked)
            && let Err(e) = self.replace_channel(&mut state, deadline).await
        {
            return finish(outcomes, &e);
        }
        let session = match self.ensure(&mut state, deadline).await {
            Ok(s) => s,
            Err(e) => return finish(outcomes, &e),
        };
        self.redeclare_if_due(session, deadline).await;
        if session.connection.status().blocked() {
            return finish(
                outcomes,
                &PortError::transient(
                    "publish",
                    "the broker has blocked publishing (memory or disk alarm)",
                ),
            );
        }
        let targets: Vec<Cow<'_, str>> = messages.iter().map(|m| self.target(m)).collect();
        let names: HashSet<&str> = publishable.iter().map(|i| &*targets[*i]).collect();
        let exists = match Self::check_exchanges(session, names, deadline).await {
            Ok(e) => e,
            Err(e) => {
                self.drop_session(&mut state);
                return finish(outcomes, &e);
            }
        };
        for i in &publishable {
            let target = &*targets[*i];
            if !exists.get(target).copied().unwrap_or(false) {
                outcomes[*i] = Some(PublishOutcome::Failed(PortError::NotFound {
                    what: "exchange",
                    id: target.to_owned(),
                }));
            }
        }
        let to_send: Vec<(usize, (&Message, &str))> = publishable
            .into_iter()
            .filter(|i| outcomes[*i].is_none())
            .map(|i| (i, (&messages[i], &*targets[i])))
            .collect();
        let mut lost = false;
        for window in to_send.chunks(self.config.max_in_flight.max(1)) {
            let refs: Vec<(&Message, &str)> = window.iter().map(|(_, m)| *m).collect();
            let (results, broken) = if lost {
                // This window was never sent: the connection died under an earlier one.
                (
                    refs.iter()
                        .map(|_| not_sent("connection lost before this part of the batch was sent"))
                        .collect(),
                    true,
                )
            } else {
                self.publish_window(session, &refs, deadline).await
            };
            lost |= broken;
            for ((i, _), r) in window.iter().zip(results) {
                outcomes[*i] = Some(r);
            }
        }
        if lost {
            self.drop_session(&mut state);
        } else if outcomes
            .iter()
            .any(|o| matches!(o, Some(PublishOutcome::Nacked(_))))
            && let Some(session) = state.session.as_mut()
        {
            session.nacked = true;
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

    fn degraded(&self) -> Vec<String> {
        self.unavailable_queues
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .map(|q| {
                format!("queue {q:?} unavailable: its home node is down; nothing routed to it arrives until that node is back")
            })
            .collect()
    }

    async fn check(&self) -> Result<(), PortError> {
        let mut state = self.take_state().await;
        let deadline = Instant::now() + self.config.connect_timeout + Duration::from_secs(1);
        let session = self.ensure(&mut state, deadline).await?;
        // A round trip on the connection: a half-open one (a partition, a dead
        // middlebox) still reads as connected until heartbeats give up on it, while
        // nothing it sends arrives. Bounded by the confirm timeout (how long a
        // publish may wait for the broker's answer too), and by CHECK_ROUND_TRIP,
        // so that the connection is dropped within the time a readiness probe waits
        // for its answer (an alarm blocks publishes, not opening a channel).
        let probe = async {
            let channel = session.connection.create_channel().await?;
            channel.close(200, "readiness probe".into()).await
        };
        let bound = self.config.confirm_timeout.min(CHECK_ROUND_TRIP);
        match tokio::time::timeout(bound, probe).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => {
                self.drop_session(&mut state);
                Err(port("check", "channel", "", &e))
            }
            Err(_) => {
                // The next batch or check connects again.
                self.drop_session(&mut state);
                Err(PortError::transient(
                    "check",
                    format!("the broker did not answer within {bound:?} on an open connection"),
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use outbox_core::{MessageId, Timestamp};

    use super::*;

    #[test]
    fn a_refusal_costs_an_attempt_only_to_the_messages_it_is_about() {
        let at = Timestamp::now_utc();
        let msg = |x: &str, size: usize| {
            outbox_core::NewMessage::new(x, "k", vec![0; size])
                .into_message(MessageId::from_uuid(uuid_of(size)), at)
        };
        let (small, big, other) = (msg("a", 10), msg("a", 500), msg("b", 10));
        let window = [(&small, "a"), (&big, "a"), (&other, "b")];
        let spends = |why: &Refusal| -> Vec<bool> {
            window
                .iter()
                .map(|&w| spends_an_attempt(why, &window, w))
                .collect()
        };
        assert_eq!(spends(&Refusal::LargerThan(100)), [false, true, false]);
        assert_eq!(
            spends(&Refusal::Forbidden(Some("b".into()))),
            [false, false, true]
        );
        assert_eq!(spends(&Refusal::Forbidden(None)), [true, true, true]);
        // A refusal that fits none of the window's: none is excused, or the
        // culprit would be sent again and again without spending its attempts.
        assert_eq!(spends(&Refusal::LargerThan(1_000)), [true, true, true]);
        assert_eq!(
            spends(&Refusal::Forbidden(Some("c".into()))),
            [true, true, true]
        );
        assert_eq!(
            spends(&Refusal::MissingExchange(Some("a".into()))),
            [true, true, false]
        );
        assert_eq!(
            spends(&Refusal::MissingExchange(Some("c".into()))),
            [false, false, false]
        );
        assert_eq!(
            spends(&Refusal::MissingExchange(None)),
            [false, false, false]
        );
    }

    fn uuid_of(n: usize) -> uuid::Uuid {
        uuid::Uuid::from_u128(n as u128 + 1)
    }

    #[test]
    fn a_channel_refusal_names_what_it_refused() {
        let user = "for user 'u'";
        assert_eq!(
            refusal_of(404, "NOT_FOUND - no exchange 'a.b' in vhost '/'"),
            Some(Refusal::MissingExchange(Some("a.b".into())))
        );
        assert_eq!(
            refusal_of(
                403,
                &format!("ACCESS_REFUSED - access to exchange 'x' in vhost '/' refused {user}")
            ),
            Some(Refusal::Forbidden(Some("x".into())))
        );
        assert_eq!(
            refusal_of(
                403,
                "ACCESS_REFUSED - cannot publish to internal exchange 'amq.rabbitmq.trace' in vhost '/'"
            ),
            Some(Refusal::Forbidden(Some("amq.rabbitmq.trace".into())))
        );
        assert_eq!(
            refusal_of(
                403,
                &format!(
                    "ACCESS_REFUSED - write access to topic 'a.b' in exchange 'x.y' in vhost '/' refused {user}"
                )
            ),
            Some(Refusal::Forbidden(Some("x.y".into())))
        );
        assert_eq!(
            refusal_of(403, "ACCESS_REFUSED - something else"),
            Some(Refusal::Forbidden(None))
        );
        assert_eq!(
            refusal_of(
                406,
                "PRECONDITION_FAILED - message size 200000 is larger than configured max size 131072"
            ),
            Some(Refusal::LargerThan(131_072))
        );
        assert_eq!(refusal_of(406, "PRECONDITION_FAILED - other"), None);
        assert_eq!(refusal_of(320, "CONNECTION_FORCED"), None);
    }

    fn ids(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("m{i}")).collect()
    }

    fn acked(n: usize) -> Vec<Settled> {
        (0..n).map(|_| Settled::Acked).collect()
    }

    fn kinds(outcomes: &[PublishOutcome]) -> Vec<&'static str> {
        outcomes
            .iter()
            .map(|o| match o {
                PublishOutcome::Confirmed => "confirmed",
                PublishOutcome::Unroutable(_) => "unroutable",
                PublishOutcome::NotSent(_) => "not sent",
                PublishOutcome::Failed(_) => "failed",
                PublishOutcome::Nacked(_) => "nacked",
                _ => "other",
            })
            .collect()
    }

    #[test]
    fn a_return_counts_for_the_message_it_names_not_the_confirm_that_carried_it() {
        // m2's return came attached to m0's confirm; m2 itself was acked bare.
        let returns = Returns {
            returned: vec![(Some("m2".into()), "312 NO_ROUTE".into())],
        };
        let (outcomes, unmatched) = returns.outcomes(&ids(3), acked(3));
        assert_eq!(kinds(&outcomes), ["confirmed", "confirmed", "unroutable"]);
        assert_eq!(unmatched, 0);
    }

    #[test]
    fn a_nacked_message_stays_nacked_and_its_return_still_counts_for_another() {
        let returns = Returns {
            returned: vec![(Some("m0".into()), "312 NO_ROUTE".into())],
        };
        let settled = vec![
            Settled::Acked,
            Settled::Nacked(PublishOutcome::Nacked("refused".into())),
        ];
        let (outcomes, _) = returns.outcomes(&ids(2), settled);
        assert_eq!(kinds(&outcomes), ["unroutable", "nacked"]);
    }

    #[test]
    fn a_return_naming_no_message_of_the_window_leaves_none_confirmed() {
        for id in [None, Some("elsewhere".to_owned())] {
            let returns = Returns {
                returned: vec![(id, "312 NO_ROUTE".into())],
            };
            let (outcomes, unmatched) = returns.outcomes(&ids(2), acked(2));
            assert_eq!(kinds(&outcomes), ["failed", "failed"]);
            assert_eq!(unmatched, 1);
        }
    }

    #[test]
    fn a_bare_ack_is_trusted_unless_a_return_named_a_message_whose_confirm_failed() {
        let failed =
            || Settled::Decided(PublishOutcome::Failed(PortError::transient("confirm", "x")));
        // m2's return was handed to m0's confirm while m2's own confirm failed:
        // m1's return may still wait, so m1 is sent again.
        let returns = Returns {
            returned: vec![(Some("m2".into()), "312 NO_ROUTE".into())],
        };
        let (outcomes, _) =
            returns.outcomes(&ids(3), vec![Settled::Acked, Settled::Acked, failed()]);
        assert_eq!(kinds(&outcomes), ["not sent", "not sent", "failed"]);
        // A failed confirm alone, or returns of completed messages only, leave
        // the bare acks trusted: every return has been handed out.
        let returns = Returns {
            returned: vec![(Some("m1".into()), "312 NO_ROUTE".into())],
        };
        let (outcomes, _) =
            returns.outcomes(&ids(3), vec![Settled::Acked, Settled::Acked, failed()]);
        assert_eq!(kinds(&outcomes), ["confirmed", "unroutable", "failed"]);
    }
}
