//! A delivery's arrival: recorded and taken under the worker's lease
//! ([`InboxConsumerPath::record_arrival`]), or held behind an unfinished earlier
//! delivery of its ordering key ([`InboxConsumerPath::hold_behind_key`]).
//!
//! The inbox row is the deduplication: a (consumer, message id) recorded before is
//! a duplicate, told with its status. A row received before whose lease ran out is
//! taken over, unless it waits behind its key. A held row has no next attempt time
//! (no claim walks it) and is made due when its predecessor finishes, or right
//! after the hold when the predecessor finished meanwhile, or by the claims' safety
//! net.
//!
//! [`InboxConsumerPath::record_arrival`]: outbox_ports::InboxConsumerPath::record_arrival
//! [`InboxConsumerPath::hold_behind_key`]: outbox_ports::InboxConsumerPath::hold_behind_key

use outbox_core::{InboxStatus, Message, MessageId};
use outbox_ports::{Arrival, Lease, PortError};
use sqlx::Postgres;
use sqlx::postgres::PgArguments;
use sqlx::query::Query;

use super::PgInboxStore;
use crate::error::port;
use crate::rows::{bind_message_columns, millis};
use crate::storable;

/// Statement `sql` with the values every insert of a delivery starts with:
/// `consumer`, then the message's id and columns
/// ([`bind_message_columns`]).
pub(super) fn bind_delivery<'q>(
    sql: &'q str,
    consumer: &'q str,
    m: &'q Message,
) -> Query<'q, Postgres, PgArguments> {
    bind_message_columns(sqlx::query(sqlx::AssertSqlSafe(sql)).bind(consumer), m)
}

impl PgInboxStore {
    /// [`outbox_ports::InboxConsumerPath::record_arrival`].
    pub(super) async fn arrive(
        &self,
        consumer: &str,
        message: &Message,
        lease: &Lease,
    ) -> Result<Arrival, PortError> {
        let stored = storable::message(message);
        let taken = bind_delivery(&self.sql.arrive, consumer, &stored)
            .bind(&stored.ordering_key)
            .bind(&lease.holder)
            .bind(millis(lease.ttl))
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| port("record arrival", e))?;
        if taken.is_some() {
            return Ok(Arrival::New);
        }
        let status = self
            .status_of(consumer, message.id)
            .await?
            .unwrap_or(InboxStatus::Received);
        Ok(Arrival::Duplicate(status))
    }

    /// [`outbox_ports::InboxConsumerPath::hold_behind_key`].
    pub(super) async fn hold(&self, consumer: &str, message: &Message) -> Result<bool, PortError> {
        if message.ordering_key.is_none() {
            return Ok(false);
        }
        let stored = storable::message(message);
        let held = bind_delivery(&self.sql.arrive_held, consumer, &stored)
            .bind(&stored.ordering_key)
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| port("hold behind its key", e))?;
        if held.is_none() {
            return Ok(false);
        }
        // Its predecessor may have finished since: then the row is due, and the
        // caller handles it now (record_arrival takes the recorded row over, as
        // it leads its key). Should this fail, the row stays held and the
        // safety net releases it.
        let released = sqlx::query(sqlx::AssertSqlSafe(&*self.sql.release_if_head))
            .bind(consumer)
            .bind(message.id.as_uuid())
            .fetch_optional(&self.pool)
            .await;
        match released {
            Ok(released) => Ok(released.is_none()),
            Err(e) => {
                tracing::warn!(consumer, message_id = %message.id, error = %e, "held a delivery but could not check its predecessor again; the consume sweep's check will");
                Ok(true)
            }
        }
    }

    /// Best effort, after a failed attempt on a row recorded under `lease` and not
    /// handled: the row is left without a lease, so a try again (or a
    /// redelivery) takes it over at once instead of waiting for the lease to run
    /// out. Nothing when the row has moved on (consumed, failed) or another
    /// holder has it.
    pub(super) async fn give_up_lease(&self, consumer: &str, id: MessageId, lease: &Lease) {
        let cleared = sqlx::query(sqlx::AssertSqlSafe(&*self.sql.give_up_lease))
            .bind(consumer)
            .bind(id.as_uuid())
            .bind(&lease.holder)
            .execute(&self.pool)
            .await;
        if let Err(e) = cleared {
            tracing::debug!(consumer, message_id = %id, error = %e, "could not give up the lease of an unhandled delivery; it is retried once the lease runs out");
        }
    }
}
