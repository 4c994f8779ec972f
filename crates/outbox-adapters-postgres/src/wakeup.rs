//! Waking an idle relay when a message commits.
//!
//! A NOTIFY in every producer transaction halves insert throughput (NOTIFY takes a
//! global lock through commit; measured with pgbench, 16 clients: 2,380 tps plain,
//! 1,180 tps with a NOTIFY trigger). So producers notify only while some relay has
//! declared itself idle: a statement-level trigger checks the small
//! `outbox_relay_idle` table and notifies only if a live row is there. A busy relay
//! is never idle, so under load producers pay one index probe and no NOTIFY.
//!
//! Protocol, in [`PgWakeup::wait`]: declare idle, then look for work once more (a
//! message committed between the relay's last claim and its declaration did not
//! notify), then wait for a notification or the timeout, then withdraw the
//! declaration. The timeout is the poll fallback: a notification is lost when the
//! listening connection drops, and a producer whose INSERT ran just before the
//! declaration but committed just after the re-check does not notify.

use std::time::Duration;

use outbox_ports::{DeadHead, PortError};
use sqlx::PgPool;
use sqlx::postgres::PgListener;

use crate::PgSchema;
use crate::error::port;
use crate::rows::millis;

/// Why [`PgWakeup::wait`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// Work was already there when the relay declared itself idle.
    WorkPending,
    /// A producer committed.
    Notified,
    /// Nothing within the timeout (look anyway: this is the poll fallback).
    TimedOut,
    /// The listening connection was lost and re-established; notifications may have
    /// been missed, so look for work.
    Reconnected,
}

/// An idle relay's wait for commits.
pub struct PgWakeup {
    listener: PgListener,
    pool: PgPool,
    relay: String,
    declare: String,
    withdraw: String,
    has_work: String,
}

impl PgWakeup {
    /// Listens on `schema`'s wake-up channel as `relay` (unique per relay process).
    ///
    /// # Errors
    /// A database error when the listening connection cannot be opened.
    pub async fn connect(pool: &PgPool, schema: &PgSchema, relay: &str) -> Result<Self, PortError> {
        let mut listener = PgListener::connect_with(pool)
            .await
            .map_err(|e| port("listen", e))?;
        listener
            .listen(&schema.wakeup_channel())
            .await
            .map_err(|e| port("listen", e))?;
        let idle = format!("{}.outbox_relay_idle", schema.quoted());
        let messages = format!("{}.outbox_messages", schema.quoted());
        Ok(Self {
            listener,
            pool: pool.clone(),
            relay: relay.to_owned(),
            declare: format!(
                "INSERT INTO {idle} (relay, expires_at) VALUES ($1, now() + $2 * interval '1 millisecond') \
                 ON CONFLICT (relay) DO UPDATE SET expires_at = EXCLUDED.expires_at"
            ),
            withdraw: format!("DELETE FROM {idle} WHERE relay = $1"),
            has_work: crate::outbox::claimable_pending_exists(&messages, DeadHead::default()),
        })
    }

    /// What a dead message does to its ordering key, as the relay's store says
    /// (default [`DeadHead::Block`]): the look for work counts only what a claim
    /// would take, so an idle relay is not woken (and does not spin) for delayed
    /// messages still waiting or keyed ones held back.
    #[must_use]
    pub fn with_dead_head(mut self, schema: &PgSchema, dead_head: DeadHead) -> Self {
        let messages = format!("{}.outbox_messages", schema.quoted());
        self.has_work = crate::outbox::claimable_pending_exists(&messages, dead_head);
        self
    }

    /// Waits until a producer commits, or `timeout` passes (see the module docs).
    ///
    /// # Errors
    /// A database error from declaring or withdrawing idleness; the caller should
    /// then fall back to polling.
    pub async fn wait(&mut self, timeout: Duration) -> Result<Wake, PortError> {
        // Outlives the wait a little, so a crashed relay's row expires by itself.
        let declared_for = timeout + Duration::from_secs(5);
        sqlx::query(sqlx::AssertSqlSafe(&*self.declare))
            .bind(&self.relay)
            .bind(millis(declared_for))
            .execute(&self.pool)
            .await
            .map_err(|e| port("declare idle", e))?;
        let pending: bool = sqlx::query_scalar(sqlx::AssertSqlSafe(&*self.has_work))
            .fetch_one(&self.pool)
            .await
            .map_err(|e| port("look for work", e))?;
        let wake = if pending {
            Wake::WorkPending
        } else {
            match tokio::time::timeout(timeout, self.listener.try_recv()).await {
                Err(_) => Wake::TimedOut,
                Ok(Ok(Some(_))) => Wake::Notified,
                Ok(Ok(None)) => Wake::Reconnected,
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "wake-up listener failed; polling instead");
                    Wake::Reconnected
                }
            }
        };
        sqlx::query(sqlx::AssertSqlSafe(&*self.withdraw))
            .bind(&self.relay)
            .execute(&self.pool)
            .await
            .map_err(|e| port("withdraw idle", e))?;
        // Notifications that arrived meanwhile are for this same wake-up.
        while self.listener.next_buffered().is_some() {}
        Ok(wake)
    }
}
