//! Handlers: what a consumer runs for a message, and the registries that find the
//! handler of a message by type, routing key or fallback.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::Message;
use outbox_runtime::supervision::panic_text;
use tracing::Instrument as _;

/// What a handler returns on failure.
pub type HandlerError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Handles one message. Must tolerate being called again for the same message after
/// a failure (that is what a retry is).
#[async_trait]
pub trait Handler: Send + Sync {
    /// Handles `message`.
    ///
    /// # Errors
    /// Any error: the delivery is stored as failed and retried with backoff.
    async fn handle(&self, message: &Message) -> Result<(), HandlerError>;
}

type BoxFuture = Pin<Box<dyn Future<Output = Result<(), HandlerError>> + Send>>;

struct FnHandler<F>(F);

#[async_trait]
impl<F> Handler for FnHandler<F>
where
    F: Fn(Message) -> BoxFuture + Send + Sync,
{
    async fn handle(&self, message: &Message) -> Result<(), HandlerError> {
        (self.0)(message.clone()).await
    }
}

/// A handler from an async closure taking the message by value.
pub fn handler_fn<F, Fut>(f: F) -> Arc<dyn Handler>
where
    F: Fn(Message) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    Arc::new(FnHandler(move |m| Box::pin(f(m)) as BoxFuture))
}

/// Handlers by message type, by routing key, and a fallback. Lookup order: type,
/// then routing key, then fallback. `H` is the kind of handler: [`Handler`]
/// ([`HandlerRegistry`]) or a transactional one.
pub struct Handlers<H: ?Sized> {
    by_type: HashMap<String, Arc<H>>,
    by_routing_key: HashMap<String, Arc<H>>,
    fallback: Option<Arc<H>>,
}

/// Backend-neutral handlers.
pub type HandlerRegistry = Handlers<dyn Handler>;

impl<H: ?Sized> Default for Handlers<H> {
    fn default() -> Self {
        Self {
            by_type: HashMap::new(),
            by_routing_key: HashMap::new(),
            fallback: None,
        }
    }
}

impl<H: ?Sized> Clone for Handlers<H> {
    fn clone(&self) -> Self {
        Self {
            by_type: self.by_type.clone(),
            by_routing_key: self.by_routing_key.clone(),
            fallback: self.fallback.clone(),
        }
    }
}

impl<H: ?Sized> Handlers<H> {
    /// An empty registry.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Handles messages whose type is `message_type`.
    #[must_use]
    pub fn on_type(mut self, message_type: &str, handler: Arc<H>) -> Self {
        self.by_type.insert(message_type.to_owned(), handler);
        self
    }

    /// Handles messages routed with `routing_key`.
    #[must_use]
    pub fn on_routing_key(mut self, routing_key: &str, handler: Arc<H>) -> Self {
        self.by_routing_key.insert(routing_key.to_owned(), handler);
        self
    }

    /// Handles everything else.
    #[must_use]
    pub fn fallback(mut self, handler: Arc<H>) -> Self {
        self.fallback = Some(handler);
        self
    }

    /// The handler for `message`, if any.
    #[must_use]
    pub fn find(&self, message: &Message) -> Option<Arc<H>> {
        message
            .message_type
            .as_ref()
            .and_then(|t| self.by_type.get(t))
            .or_else(|| self.by_routing_key.get(&message.routing_key))
            .or(self.fallback.as_ref())
            .cloned()
    }
}

/// The failure text of a message no handler is registered for.
pub(crate) fn no_handler(message: &Message) -> String {
    format!(
        "no handler for message type {:?} or routing key {:?}",
        message.message_type, message.routing_key
    )
}

impl Handlers<dyn Handler> {
    /// Runs the handler for `message` in its own task, so that a panic or a timeout
    /// becomes an error message instead of taking the worker down.
    ///
    /// # Errors
    /// The failure as text: no handler, the handler's error, a panic, or a timeout.
    pub async fn run(&self, message: &Message, timeout: Duration) -> Result<(), String> {
        let Some(handler) = self.find(message) else {
            return Err(no_handler(message));
        };
        let owned = message.clone();
        // In the caller's span (with `otel`: the delivery's `process` span).
        let mut task = tokio::spawn(async move { handler.handle(&owned).await }.in_current_span());
        match tokio::time::timeout(timeout, &mut task).await {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(e))) => Err(e.to_string()),
            Ok(Err(join)) if join.is_panic() => Err(format!(
                "handler panicked: {}",
                panic_text(join.into_panic().as_ref())
            )),
            Ok(Err(join)) => Err(format!("handler task ended: {join}")),
            Err(_) => {
                task.abort();
                Err(format!("handler timed out after {timeout:?}"))
            }
        }
    }
}
