//! Typed handlers: `registry.on::<OrderCreated>(handler)` registers a handler that
//! receives the decoded value and a [`Context`]. Each (type, version) has at most
//! one handler; a type may have several versions (a handler for v1 can convert to
//! v2 with `From` and share the v2 code).
//!
//! A body that does not decode as its registered type, and a version of a known
//! type that no handler accepts, are permanent failures: the delivery is dead after
//! that one attempt, with a reason naming the Rust type and the serde error (the
//! raw body stays for operators). A handler's own error is retryable unless it says
//! otherwise ([`HandlerError::permanent`], [`HandlerError::retry_after`]).

use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;

use async_trait::async_trait;
use outbox_core::event::{DEFAULT_VERSION, decode, version_of};
use outbox_core::{Event, EventError, Headers, Message, MessageId, NewMessage};

use crate::handler::{Handler, Handlers};
use crate::handler_error::HandlerError;

pub use outbox_core::message::CAUSATION_HEADER;

/// What a typed handler knows of the message besides its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Context {
    /// The message's id.
    pub message_id: MessageId,
    /// Its type name.
    pub message_type: String,
    /// Its version (1 when it carries none).
    pub version: u32,
    /// This attempt's number, 1 for the first.
    pub attempt: u32,
    /// Its correlation id, if it has one.
    pub correlation_id: Option<String>,
    /// The message whose handling published it, if any (header
    /// [`CAUSATION_HEADER`]).
    pub causation_id: Option<String>,
    /// Every header, the trace context (`traceparent`, `tracestate`) included.
    pub headers: Headers,
    /// The outbox a transactional handler's follow-ups go to (`Context::publish`),
    /// set by the PostgreSQL consumer.
    #[cfg(feature = "postgres")]
    pub(crate) outbox: Option<outbox_adapters_postgres::PgOutbox>,
}

impl Context {
    /// The context of `message` at attempt number `attempt`.
    #[must_use]
    pub fn of(message: &Message, attempt: u32) -> Self {
        Self {
            message_id: message.id,
            message_type: message.message_type.clone().unwrap_or_default(),
            version: version_of(message).unwrap_or(DEFAULT_VERSION),
            attempt,
            correlation_id: message.correlation_id.clone(),
            causation_id: message.causation_id().map(str::to_owned),
            headers: message.headers.clone(),
            #[cfg(feature = "postgres")]
            outbox: None,
        }
    }

    /// The W3C trace context the message carries (`traceparent`), if any.
    #[must_use]
    pub fn traceparent(&self) -> Option<&str> {
        self.headers.get("traceparent").map(String::as_str)
    }

    /// `event` as a message published while handling this one: it keeps this
    /// message's correlation id (this message's id when it has none) and names this
    /// message as its cause. Enqueue it through the inbox's own transaction (a
    /// `PgHandler` with the outbox in the same database) and "consume one, publish
    /// the next" is exactly once in effect.
    ///
    /// # Errors
    /// [`EventError`] when `event` cannot be encoded or breaks a limit.
    pub fn follow_up<E: Event>(&self, event: &E) -> Result<NewMessage, EventError> {
        let message = outbox_core::event::to_new_message(event)?;
        Ok(self.caused(message))
    }

    /// `message` marked as published while handling this one (see
    /// [`Self::follow_up`]).
    #[must_use]
    pub fn caused(&self, message: NewMessage) -> NewMessage {
        message.caused_by_id(self.message_id, self.correlation_id.as_deref())
    }
}

/// Handles decoded values of `E`, with no transaction (at least once in effect:
/// must tolerate a second call for the same message).
#[async_trait]
pub trait EventHandler<E: Event>: Send + Sync + 'static {
    /// Handles `event`.
    ///
    /// # Errors
    /// A [`HandlerError`]: retryable unless it says otherwise.
    async fn handle(&self, event: E, cx: Context) -> Result<(), HandlerError>;
}

#[async_trait]
impl<E, F, Fut> EventHandler<E> for F
where
    E: Event,
    F: Fn(E, Context) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    async fn handle(&self, event: E, cx: Context) -> Result<(), HandlerError> {
        self(event, cx).await
    }
}

#[async_trait]
impl<E: Event, H: EventHandler<E> + ?Sized> EventHandler<E> for Arc<H> {
    async fn handle(&self, event: E, cx: Context) -> Result<(), HandlerError> {
        (**self).handle(event, cx).await
    }
}

/// Decodes, then calls the typed handler.
struct Typed<E, H> {
    handler: H,
    event: PhantomData<fn() -> E>,
}

#[async_trait]
impl<E: Event, H: EventHandler<E>> Handler for Typed<E, H> {
    async fn handle(&self, message: &Message) -> Result<(), HandlerError> {
        self.handle_attempt(message, 1).await
    }

    async fn handle_attempt(&self, message: &Message, attempt: u32) -> Result<(), HandlerError> {
        let event = decode::<E>(message).map_err(HandlerError::permanent)?;
        self.handler
            .handle(event, Context::of(message, attempt))
            .await
    }
}

impl Handlers<dyn Handler> {
    /// Handles messages of type `E::TYPE` and version `E::VERSION`, decoded into
    /// `E` (a second handler for that type and version replaces the first, and
    /// [`Handlers::check`] refuses the registry).
    #[must_use]
    pub fn on<E: Event>(self, handler: impl EventHandler<E>) -> Self {
        let typed: Arc<dyn Handler> = Arc::new(Typed {
            handler,
            event: PhantomData::<fn() -> E>,
        });
        self.on_version(E::TYPE, E::VERSION, typed)
    }
}
