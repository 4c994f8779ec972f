//! Consuming with the PostgreSQL inbox, exactly once in effect: each handler writes
//! through the inbox row's own transaction (`&mut PgConnection`), so its effect and
//! the row commit together or not at all. A redelivery finds the row and the handler
//! does not run; a failure rolls the handler's writes back and is stored for the
//! consume sweep ([`PgConsumeRetryTask`]), which retries in a transaction too.

use std::future::Future;
use std::marker::PhantomData;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::FutureExt as _;
use outbox_adapters_postgres::{ConsumeOutcome, PgConnection, PgInboxStore, PgOutbox, TxHandler};
use outbox_core::event::decode;
use outbox_core::{Event, HandlerFailure, Message};
use outbox_ports::{ClaimedDelivery, Clock, InboxConsumerPath, InboxRetention, Lease, Subscriber};

use crate::HandlerError;
use crate::pg_batch::GroupCommit;
use crate::typed::Context;
use crate::worker::{
    AttemptContext, ConsumerConfig, Failure, Handled, Handlers, InboxPath, InboxRetryTask,
    InboxWorker, Unrecorded,
};
use outbox_runtime::supervision::panic_text;

/// Handles one message with the inbox transaction's connection: its writes commit
/// with the inbox row.
#[async_trait]
pub trait PgHandler: Send + Sync {
    /// Handles `message`, writing through `conn` only.
    ///
    /// # Errors
    /// Any error: the transaction rolls back and the delivery is retried later.
    async fn handle(&self, conn: &mut PgConnection, message: &Message) -> Result<(), HandlerError>;

    /// Handles `message` at attempt number `attempt` (1 for the first): what the
    /// consumer calls. By default [`Self::handle`]; typed handlers pass the number
    /// on in their context.
    ///
    /// # Errors
    /// As [`Self::handle`].
    async fn handle_attempt(
        &self,
        conn: &mut PgConnection,
        message: &Message,
        attempt: u32,
    ) -> Result<(), HandlerError> {
        let _ = attempt;
        self.handle(conn, message).await
    }

    /// Handles `message` in the context `cx` (its attempt number, and the outbox
    /// its follow-ups go to): what the consumer calls. By default
    /// [`Self::handle_attempt`]; typed handlers pass `cx` on.
    ///
    /// # Errors
    /// As [`Self::handle`].
    async fn handle_in(
        &self,
        conn: &mut PgConnection,
        message: &Message,
        cx: Context,
    ) -> Result<(), HandlerError> {
        self.handle_attempt(conn, message, cx.attempt).await
    }
}

#[async_trait]
impl<H: PgHandler + ?Sized> PgHandler for Arc<H> {
    async fn handle(&self, conn: &mut PgConnection, message: &Message) -> Result<(), HandlerError> {
        (**self).handle(conn, message).await
    }

    async fn handle_attempt(
        &self,
        conn: &mut PgConnection,
        message: &Message,
        attempt: u32,
    ) -> Result<(), HandlerError> {
        (**self).handle_attempt(conn, message, attempt).await
    }

    async fn handle_in(
        &self,
        conn: &mut PgConnection,
        message: &Message,
        cx: Context,
    ) -> Result<(), HandlerError> {
        (**self).handle_in(conn, message, cx).await
    }
}

/// Transactional handlers by type, routing key, fallback.
pub type PgHandlerRegistry = Handlers<dyn PgHandler>;

/// The PostgreSQL transactional inbox path: [`PgInboxStore::consume_in_transaction`]
/// and [`PgInboxStore::retry_in_transaction`] with [`PgHandler`]s, plus the inbox's
/// retention.
pub struct PgTxInbox {
    inbox: PgInboxStore,
    handlers: PgHandlerRegistry,
    /// Where typed handlers' follow-ups go ([`Context::publish`]).
    producer: PgOutbox,
    /// First deliveries without an ordering key, gathered into shared transactions;
    /// `None`: one transaction each.
    batches: Option<GroupCommit>,
}

impl PgTxInbox {
    /// Records in `inbox`, runs `handlers` in its transactions, one transaction per
    /// delivery.
    #[must_use]
    pub fn new(inbox: PgInboxStore, handlers: PgHandlerRegistry) -> Self {
        Self {
            producer: PgOutbox::new(inbox.schema().clone()),
            inbox,
            handlers,
            batches: None,
        }
    }

    /// Typed handlers' follow-ups ([`Context::publish`]) are enqueued by
    /// `producer` (default: the inbox's schema, no exchange mapping).
    #[must_use]
    pub fn with_producer(mut self, producer: PgOutbox) -> Self {
        self.producer = producer;
        self
    }

    /// Gathers first deliveries without an ordering key into shared transactions as
    /// `config` says ([`ConsumerConfig::inbox_batch`]; 1 keeps one transaction per
    /// delivery).
    #[must_use]
    pub fn batched(mut self, config: &ConsumerConfig) -> Self {
        self.batches = (config.inbox_batch > 1).then(|| {
            GroupCommit::new(
                config.concurrency.div_ceil(config.inbox_batch),
                config.inbox_batch,
            )
        });
        self
    }

    /// The handler for `message` (attempt number `attempt`) as the inbox's
    /// transactional callback: panics and timeouts become retryable failures, a
    /// missing handler or a version none accepts a failure of its own (see
    /// [`Handlers::resolve`]); every failure carries the type's retry policy.
    fn tx_handler(&self, message: &Message, attempt: u32, timeout: Duration) -> TxHandler<'static> {
        let handler = self.handlers.resolve(message);
        let policy = self.handlers.policy_for(message);
        let m = message.clone();
        let mut cx = Context::of(message, attempt);
        cx.outbox = Some(self.producer.clone());
        Box::new(move |conn: &mut PgConnection| {
            Box::pin(async move {
                let h = handler?;
                let run = AssertUnwindSafe(h.handle_in(conn, &m, cx)).catch_unwind();
                let failure = match tokio::time::timeout(timeout, run).await {
                    Ok(Ok(Ok(()))) => return Ok(()),
                    Ok(Ok(Err(e))) => e.into_failure(),
                    Ok(Err(panic)) => HandlerFailure::retryable(format!(
                        "handler panicked: {}",
                        panic_text(&*panic)
                    )),
                    Err(_) => {
                        HandlerFailure::retryable(format!("handler timed out after {timeout:?}"))
                    }
                };
                Err(failure.with_policy(policy))
            })
        })
    }
}

impl PgTxInbox {
    /// The decision for `failure` of `message`'s attempt number `attempt`: a
    /// failure without a policy (made by the inbox, not the handler's registry) gets
    /// the message type's own.
    fn decide(
        &self,
        cx: AttemptContext<'_>,
        message: &Message,
        attempt: u32,
        failure: &HandlerFailure,
    ) -> outbox_core::Decision {
        if failure.policy.is_none()
            && let Some(policy) = self.handlers.policy_for(message)
        {
            let failure = failure.clone().with_policy(Some(policy));
            return cx.decide_failure(attempt, &failure);
        }
        cx.decide_failure(attempt, failure)
    }
}

/// The outcome of a transaction, as the worker counts it.
fn handled(outcome: ConsumeOutcome) -> Handled {
    match outcome {
        ConsumeOutcome::Consumed => Handled::Consumed { counted: true },
        ConsumeOutcome::Duplicate => Handled::Duplicate,
        ConsumeOutcome::Failed(error) => Handled::Failed(Failure { error, dead: false }),
        ConsumeOutcome::Dead(error) => Handled::Failed(Failure { error, dead: true }),
    }
}

#[async_trait]
impl InboxPath for PgTxInbox {
    fn inbox(&self) -> &dyn InboxConsumerPath {
        &self.inbox
    }

    async fn handle(
        &self,
        cx: AttemptContext<'_>,
        message: &Message,
        lease: &Lease,
    ) -> Result<Handled, Unrecorded> {
        let name = &cx.config.name;
        // Failures the inbox makes itself (a refused COMMIT, a transaction left
        // aborted) are decided by the message type's policy too.
        let decide_for =
            |m: &Message, attempt, failure: &HandlerFailure| self.decide(cx, m, attempt, failure);
        let decide = |attempt, failure: &HandlerFailure| decide_for(message, attempt, failure);
        let timeout = cx.config.handler_timeout;
        let outcome = match &self.batches {
            Some(batches) if message.ordering_key.is_none() => {
                let handler_for = |m: &Message| self.tx_handler(m, 1, timeout);
                batches
                    .consume(
                        &self.inbox,
                        name,
                        message.clone(),
                        lease.clone(),
                        &decide_for,
                        &handler_for,
                    )
                    .await
            }
            _ => {
                self.inbox
                    .consume_in_transaction(
                        name,
                        message,
                        lease,
                        decide,
                        self.tx_handler(message, 1, timeout),
                    )
                    .await
            }
        }
        .map_err(Unrecorded::Nothing)?;
        match &outcome {
            ConsumeOutcome::Failed(error) => {
                tracing::warn!(consumer = %name, message_id = %message.id, %error, "handler failed; stored for a retry");
            }
            ConsumeOutcome::Dead(error) => {
                tracing::warn!(consumer = %name, message_id = %message.id, %error, "handler failed; the delivery is dead");
            }
            ConsumeOutcome::Consumed | ConsumeOutcome::Duplicate => {}
        }
        Ok(handled(outcome))
    }

    async fn retry(
        &self,
        cx: AttemptContext<'_>,
        due: &ClaimedDelivery,
        lease: &Lease,
    ) -> Result<Handled, Unrecorded> {
        let name = &cx.config.name;
        let decide =
            |attempt, failure: &HandlerFailure| self.decide(cx, &due.message, attempt, failure);
        let attempt = due.attempts.saturating_add(1);
        let outcome = self
            .inbox
            .retry_in_transaction(
                name,
                lease,
                &due.message,
                due.attempts,
                decide,
                self.tx_handler(&due.message, attempt, cx.config.handler_timeout),
            )
            .await
            .map_err(Unrecorded::Nothing)?;
        if let ConsumeOutcome::Failed(error) | ConsumeOutcome::Dead(error) = &outcome {
            tracing::debug!(consumer = %name, message_id = %due.message.id, %error, "consume retry failed");
        }
        Ok(handled(outcome))
    }

    fn retention(&self) -> Option<Arc<dyn InboxRetention>> {
        Some(Arc::new(self.inbox.clone()))
    }
}

/// Consumes a queue into the PostgreSQL inbox with transactional handlers, and
/// runs the inbox retention of `config.retention` alongside.
pub type PgConsumerWorker = InboxWorker<PgTxInbox>;

impl PgConsumerWorker {
    /// A worker for `config.queue`, recording in `inbox` as `config.name`.
    pub fn new(
        inbox: PgInboxStore,
        subscriber: Arc<dyn Subscriber>,
        handlers: PgHandlerRegistry,
        clock: Arc<dyn Clock>,
        config: ConsumerConfig,
    ) -> Self {
        let path = PgTxInbox::new(inbox, handlers).batched(&config);
        Self::with_path(path, subscriber, clock, config)
    }
}

/// The consume sweep's work with transactional handlers: each due delivery is
/// retried in a transaction that also marks it consumed.
pub type PgConsumeRetryTask = InboxRetryTask<PgTxInbox>;

/// Handles decoded values of `E` with the inbox transaction's connection: its
/// writes, and any message it enqueues through the same connection (see
/// [`Context::follow_up`]), commit with the inbox row, exactly once in effect.
#[async_trait]
pub trait PgEventHandler<E: Event>: Send + Sync + 'static {
    /// Handles `event`, writing through `conn` only.
    ///
    /// # Errors
    /// A [`HandlerError`]: the transaction rolls back; retried unless it says
    /// otherwise.
    async fn handle(
        &self,
        conn: &mut PgConnection,
        event: E,
        cx: Context,
    ) -> Result<(), HandlerError>;
}

/// Decodes, then calls the typed transactional handler.
struct PgTyped<E, H> {
    handler: H,
    event: PhantomData<fn() -> E>,
}

#[async_trait]
impl<E: Event, H: PgEventHandler<E>> PgHandler for PgTyped<E, H> {
    async fn handle(&self, conn: &mut PgConnection, message: &Message) -> Result<(), HandlerError> {
        self.handle_attempt(conn, message, 1).await
    }

    async fn handle_attempt(
        &self,
        conn: &mut PgConnection,
        message: &Message,
        attempt: u32,
    ) -> Result<(), HandlerError> {
        self.handle_in(conn, message, Context::of(message, attempt))
            .await
    }

    async fn handle_in(
        &self,
        conn: &mut PgConnection,
        message: &Message,
        cx: Context,
    ) -> Result<(), HandlerError> {
        let event = decode::<E>(message).map_err(HandlerError::permanent)?;
        self.handler.handle(conn, event, cx).await
    }
}

#[async_trait]
impl<E: Event, H: PgEventHandler<E> + ?Sized> PgEventHandler<E> for Arc<H> {
    async fn handle(
        &self,
        conn: &mut PgConnection,
        event: E,
        cx: Context,
    ) -> Result<(), HandlerError> {
        (**self).handle(conn, event, cx).await
    }
}

/// An `async fn` (or an async closure that captures nothing) taking the inbox
/// transaction's connection, the decoded event and its context: what
/// [`PgHandlerRegistry::on_fn`] takes. Implemented for every such function; a
/// handler with state of its own is a struct implementing [`PgEventHandler`].
pub trait PgEventFn<'c, E>: Send + Sync + 'static {
    /// The future the function returns.
    type Future: Future<Output = Result<(), HandlerError>> + Send + 'c;

    /// Calls the function.
    fn call(&self, conn: &'c mut PgConnection, event: E, cx: Context) -> Self::Future;
}

impl<'c, E, F, Fut> PgEventFn<'c, E> for F
where
    E: 'c,
    F: Fn(&'c mut PgConnection, E, Context) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'c,
{
    type Future = Fut;

    fn call(&self, conn: &'c mut PgConnection, event: E, cx: Context) -> Fut {
        self(conn, event, cx)
    }
}

/// A [`PgEventFn`] as a [`PgEventHandler`].
struct PgFn<F>(F);

#[async_trait]
impl<E: Event, F> PgEventHandler<E> for PgFn<F>
where
    F: for<'c> PgEventFn<'c, E>,
{
    async fn handle(
        &self,
        conn: &mut PgConnection,
        event: E,
        cx: Context,
    ) -> Result<(), HandlerError> {
        self.0.call(conn, event, cx).await
    }
}

impl Handlers<dyn PgHandler> {
    /// Handles messages of type `E::TYPE` and version `E::VERSION`, decoded into
    /// `E`, in the inbox's transaction (a second handler for that type and version
    /// replaces the first, and [`Handlers::check`] refuses the registry).
    #[must_use]
    pub fn on<E: Event>(self, handler: impl PgEventHandler<E>) -> Self {
        let typed: Arc<dyn PgHandler> = Arc::new(PgTyped {
            handler,
            event: PhantomData::<fn() -> E>,
        });
        self.on_version(E::TYPE, E::VERSION, typed)
    }

    /// As [`Self::on`], with an `async fn` (or a capture-free async closure):
    ///
    /// ```
    /// # use outbox_consumer::{Context, HandlerError, PgHandlerRegistry};
    /// # use outbox_adapters_postgres::PgConnection;
    /// # #[derive(serde::Serialize, serde::Deserialize)]
    /// # struct OrderCreated { order_id: i64 }
    /// # impl outbox_core::Event for OrderCreated {
    /// #     const TYPE: &'static str = "order.created";
    /// #     const EXCHANGE: &'static str = "orders";
    /// # }
    /// async fn bill(conn: &mut PgConnection, order: OrderCreated, cx: Context) -> Result<(), HandlerError> {
    ///     outbox_adapters_postgres::sqlx::query("INSERT INTO invoices (order_id) VALUES ($1)")
    ///         .bind(order.order_id)
    ///         .execute(&mut *conn)
    ///         .await?;
    ///     Ok(())
    /// }
    /// let handlers = PgHandlerRegistry::new().on_fn(bill);
    /// # let _ = handlers;
    /// ```
    #[must_use]
    pub fn on_fn<E: Event, F>(self, handler: F) -> Self
    where
        F: for<'c> PgEventFn<'c, E>,
    {
        self.on::<E>(PgFn(handler))
    }
}

impl Context {
    /// Publishes `event` as a follow-up of this message (see
    /// [`Self::follow_up`]) through `conn`, the inbox transaction's connection:
    /// it is enqueued in the outbox of the consumer's schema (with the service's
    /// exchange mapping) and exists only if the handling commits. Exactly once in
    /// effect with the message handled.
    ///
    /// # Errors
    /// A permanent [`HandlerError`] when `event` cannot become a message or the
    /// context is not a PostgreSQL consumer's; the store's error otherwise
    /// (retryable).
    pub async fn publish<E: Event>(
        &self,
        conn: &mut PgConnection,
        event: &E,
    ) -> Result<outbox_core::MessageId, HandlerError> {
        let Some(producer) = &self.outbox else {
            return Err(HandlerError::permanent(
                "Context::publish outside a PostgreSQL consumer: no outbox to enqueue into",
            ));
        };
        let message = self.follow_up(event).map_err(HandlerError::permanent)?;
        // A message over a limit is permanent too; a store error is retryable.
        producer
            .enqueue(conn, message)
            .await
            .map_err(HandlerError::from_port)
    }
}
