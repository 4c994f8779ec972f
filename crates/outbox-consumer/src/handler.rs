//! Handlers: what a consumer runs for a message, and the registries that find the
//! handler of a message by type, routing key or fallback.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::event::version_of;
use outbox_core::{ConfigError, HandlerFailure, Message, RetryPolicy};
use outbox_runtime::supervision::panic_text;
use tracing::Instrument as _;

pub use crate::handler_error::{HandlerError, HandlerResult};

/// Handles one message. Must tolerate being called again for the same message after
/// a failure (that is what a retry is).
#[async_trait]
pub trait Handler: Send + Sync {
    /// Handles `message`.
    ///
    /// # Errors
    /// Any error: the delivery is stored as failed and, unless the error says it is
    /// permanent, retried with backoff.
    async fn handle(&self, message: &Message) -> Result<(), HandlerError>;

    /// Handles `message` at attempt number `attempt` (1 for the first): what the
    /// consumer calls. By default [`Self::handle`]; typed handlers pass the number
    /// on in their context.
    ///
    /// # Errors
    /// As [`Self::handle`].
    async fn handle_attempt(&self, message: &Message, attempt: u32) -> Result<(), HandlerError> {
        let _ = attempt;
        self.handle(message).await
    }
}

#[async_trait]
impl<H: Handler + ?Sized> Handler for Arc<H> {
    async fn handle(&self, message: &Message) -> Result<(), HandlerError> {
        (**self).handle(message).await
    }

    async fn handle_attempt(&self, message: &Message, attempt: u32) -> Result<(), HandlerError> {
        (**self).handle_attempt(message, attempt).await
    }
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

/// Handlers by message type and version (typed handlers, see [`crate::typed`]), by
/// type, by routing key, and a fallback. Lookup order: a typed handler of the
/// message's type and version, then by type, then routing key, then fallback. A
/// message of a type with typed handlers but of a version none of them accepts is
/// a permanent failure. `H` is the kind of handler: [`Handler`]
/// ([`HandlerRegistry`]) or a transactional one.
pub struct Handlers<H: ?Sized> {
    by_version: HashMap<String, BTreeMap<u32, Arc<H>>>,
    by_type: HashMap<String, Arc<H>>,
    by_routing_key: HashMap<String, Arc<H>>,
    fallback: Option<Arc<H>>,
    policies: HashMap<String, RetryPolicy>,
    /// Registrations that replaced an earlier one ([`Handlers::check`] refuses
    /// them).
    duplicates: Vec<String>,
}

/// Backend-neutral handlers.
pub type HandlerRegistry = Handlers<dyn Handler>;

impl<H: ?Sized> Default for Handlers<H> {
    fn default() -> Self {
        Self {
            by_version: HashMap::new(),
            by_type: HashMap::new(),
            by_routing_key: HashMap::new(),
            fallback: None,
            policies: HashMap::new(),
            duplicates: Vec::new(),
        }
    }
}

impl<H: ?Sized> Clone for Handlers<H> {
    fn clone(&self) -> Self {
        Self {
            by_version: self.by_version.clone(),
            by_type: self.by_type.clone(),
            by_routing_key: self.by_routing_key.clone(),
            fallback: self.fallback.clone(),
            policies: self.policies.clone(),
            duplicates: self.duplicates.clone(),
        }
    }
}

impl<H: ?Sized> Handlers<H> {
    /// An empty registry.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Handles messages of `message_type` whose version is `version` (header
    /// `outbox-version`, 1 when absent). What typed registration (`on::<E>`) uses.
    #[must_use]
    pub fn on_version(mut self, message_type: &str, version: u32, handler: Arc<H>) -> Self {
        if self
            .by_version
            .entry(message_type.to_owned())
            .or_default()
            .insert(version, handler)
            .is_some()
        {
            self.duplicates
                .push(format!("type {message_type:?} version {version}"));
        }
        self
    }

    /// Failures of messages of `message_type` are retried by `policy` instead of
    /// the consumer's (`max_attempts`, backoff).
    ///
    /// # Errors
    /// A [`ConfigError`] naming the setting when `policy` is not valid (no attempt,
    /// a zero backoff, a maximum under the initial one).
    pub fn retry_policy(
        mut self,
        message_type: &str,
        policy: RetryPolicy,
    ) -> Result<Self, ConfigError> {
        policy.validate(&format!("retry policy of {message_type}"))?;
        self.policies.insert(message_type.to_owned(), policy);
        Ok(self)
    }

    /// Handles messages whose type is `message_type`.
    #[must_use]
    pub fn on_type(mut self, message_type: &str, handler: Arc<H>) -> Self {
        if self
            .by_type
            .insert(message_type.to_owned(), handler)
            .is_some()
        {
            self.duplicates.push(format!("type {message_type:?}"));
        }
        self
    }

    /// Handles messages routed with `routing_key`.
    #[must_use]
    pub fn on_routing_key(mut self, routing_key: &str, handler: Arc<H>) -> Self {
        if self
            .by_routing_key
            .insert(routing_key.to_owned(), handler)
            .is_some()
        {
            self.duplicates.push(format!("routing key {routing_key:?}"));
        }
        self
    }

    /// Handles everything else.
    #[must_use]
    pub fn fallback(mut self, handler: Arc<H>) -> Self {
        if self.fallback.replace(handler).is_some() {
            self.duplicates.push("the fallback".to_owned());
        }
        self
    }

    /// Checks that no registration replaced an earlier one: two handlers for one
    /// (type, version), type, routing key or fallback are a mistake (the first
    /// would never run), refused when a service is built.
    ///
    /// # Errors
    /// A [`ConfigError`] naming each twice-registered key.
    pub fn check(&self, consumer: &str) -> Result<(), ConfigError> {
        if self.duplicates.is_empty() {
            return Ok(());
        }
        Err(ConfigError::new(
            &format!("consumer {consumer:?}"),
            "handlers",
            format!(
                "registered twice: {}; keep one handler each",
                self.duplicates.join(", ")
            ),
        ))
    }

    /// Whether no handler is registered at all.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.by_version.is_empty()
            && self.by_type.is_empty()
            && self.by_routing_key.is_empty()
            && self.fallback.is_none()
    }

    /// The handler for `message`, if any.
    #[must_use]
    pub fn find(&self, message: &Message) -> Option<Arc<H>> {
        self.resolve(message).ok()
    }

    /// The retry policy of `message`'s type, when it has its own.
    #[must_use]
    pub fn policy_for(&self, message: &Message) -> Option<RetryPolicy> {
        message
            .message_type
            .as_ref()
            .and_then(|t| self.policies.get(t))
            .copied()
    }

    /// The handler for `message`, or why there is none: no handler at all (a
    /// retryable failure: a handler may be deployed before the retries run out), or
    /// a version of a typed message no handler accepts (permanent).
    ///
    /// # Errors
    /// The failure to record, with the type's retry policy.
    pub fn resolve(&self, message: &Message) -> Result<Arc<H>, HandlerFailure> {
        let policy = self.policy_for(message);
        let typed = message
            .message_type
            .as_ref()
            .and_then(|t| self.by_version.get(t).map(|v| (t, v)));
        if let Some((message_type, versions)) = typed {
            let version = version_of(message);
            return match version.and_then(|v| versions.get(&v)) {
                Some(h) => Ok(h.clone()),
                None => {
                    let accepted: Vec<String> = versions.keys().map(u32::to_string).collect();
                    let found = message
                        .headers
                        .get(outbox_core::event::VERSION_HEADER)
                        .map_or_else(|| "1 (no header)".to_owned(), |v| format!("{v:?}"));
                    Err(HandlerFailure::permanent(format!(
                        "no handler accepts version {found} of {message_type}; handled versions: {}",
                        accepted.join(", ")
                    ))
                    .with_policy(policy))
                }
            };
        }
        message
            .message_type
            .as_ref()
            .and_then(|t| self.by_type.get(t))
            .or_else(|| self.by_routing_key.get(&message.routing_key))
            .or(self.fallback.as_ref())
            .cloned()
            .ok_or_else(|| HandlerFailure::retryable(no_handler(message)).with_policy(policy))
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
    /// Runs the handler for `message` (attempt number `attempt`, 1 for the first)
    /// in its own task, so that a panic or a timeout becomes a failure instead of
    /// taking the worker down.
    ///
    /// # Errors
    /// The failure to record: no handler, the handler's error (with its class), a
    /// panic or a timeout (retryable), with the type's retry policy.
    pub async fn run(
        &self,
        message: &Message,
        attempt: u32,
        timeout: Duration,
    ) -> Result<(), HandlerFailure> {
        let handler = self.resolve(message)?;
        let policy = self.policy_for(message);
        let owned = message.clone();
        // In the caller's span (with `otel`: the delivery's `process` span).
        let mut task = tokio::spawn(
            async move { handler.handle_attempt(&owned, attempt).await }.in_current_span(),
        );
        let failure = match tokio::time::timeout(timeout, &mut task).await {
            Ok(Ok(Ok(()))) => return Ok(()),
            Ok(Ok(Err(e))) => e.into_failure(),
            Ok(Err(join)) if join.is_panic() => HandlerFailure::retryable(format!(
                "handler panicked: {}",
                panic_text(join.into_panic().as_ref())
            )),
            Ok(Err(join)) => HandlerFailure::retryable(format!("handler task ended: {join}")),
            Err(_) => {
                task.abort();
                HandlerFailure::retryable(format!("handler timed out after {timeout:?}"))
            }
        };
        Err(failure.with_policy(policy))
    }
}
