//! The dispatcher's wake-up from PostgreSQL commits.

use std::time::Duration;

use async_trait::async_trait;
use outbox_adapters_postgres::{PgPool, PgSchema, PgWakeup};

use crate::dispatcher::Wakeup;

/// [`Wakeup`] over [`PgWakeup`]: listens on the schema's channel, reconnecting when
/// the listener fails (then it sleeps the timeout, which doubles as a rescan).
pub struct PgWakeupSource {
    pool: PgPool,
    schema: PgSchema,
    relay: String,
    dead_head: outbox_ports::DeadHead,
    inner: Option<PgWakeup>,
}

impl PgWakeupSource {
    /// A wake-up source for relay `relay`.
    #[must_use]
    pub fn new(pool: PgPool, schema: PgSchema, relay: &str) -> Self {
        Self {
            pool,
            schema,
            relay: relay.to_owned(),
            dead_head: outbox_ports::DeadHead::default(),
            inner: None,
        }
    }

    /// The store's rule for dead messages of an ordering key (default block), so
    /// the wake-up looks for exactly the work a claim would take.
    #[must_use]
    pub fn with_dead_head(mut self, dead_head: outbox_ports::DeadHead) -> Self {
        self.dead_head = dead_head;
        self
    }
}

#[async_trait]
impl Wakeup for PgWakeupSource {
    async fn wait(&mut self, timeout: Duration) {
        if self.inner.is_none() {
            match PgWakeup::connect(&self.pool, &self.schema, &self.relay).await {
                Ok(w) => self.inner = Some(w.with_dead_head(&self.schema, self.dead_head)),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot listen for commits; polling");
                    tokio::time::sleep(timeout).await;
                    return;
                }
            }
        }
        if let Some(w) = self.inner.as_mut() {
            match w.wait(timeout).await {
                Ok(wake) => tracing::trace!(?wake, "dispatcher woken"),
                Err(e) => {
                    tracing::warn!(error = %e, "wake-up failed; reconnecting the listener");
                    self.inner = None;
                    tokio::time::sleep(timeout.min(Duration::from_secs(1))).await;
                }
            }
        }
    }
}
