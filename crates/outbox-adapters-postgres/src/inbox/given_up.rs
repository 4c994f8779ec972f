//! What the broker gave up on: a delivery it will not redeliver recorded dead at
//! once ([`InboxConsumerPath::record_given_up`]), unless the inbox holds the message
//! already; and a delivery that cannot even be read as a message kept as a dead
//! letter ([`InboxConsumerPath::record_dead_letter`]), with its raw body and why.
//! Neither has a next attempt time, so no claim takes it; a dead row holds no key
//! back. Texts are stored as PostgreSQL can hold them (see [`crate::storable`]).
//!
//! [`InboxConsumerPath::record_given_up`]: outbox_ports::InboxConsumerPath::record_given_up
//! [`InboxConsumerPath::record_dead_letter`]: outbox_ports::InboxConsumerPath::record_dead_letter

use outbox_core::Message;
use outbox_ports::{DeadLetter, PortError};
use sqlx::types::Json;

use super::PgInboxStore;
use super::arrival::bind_delivery;
use crate::error::port;
use crate::storable;

impl PgInboxStore {
    /// [`outbox_ports::InboxConsumerPath::record_given_up`].
    pub(super) async fn record_broker_gave_up(
        &self,
        consumer: &str,
        message: &Message,
        reason: &str,
    ) -> Result<bool, PortError> {
        let stored = storable::message(message);
        let reason = storable::error_text(reason);
        let group = outbox_core::failure_group::failure_group(&reason);
        let inserted = bind_delivery(&self.sql.arrive_given_up, consumer, &stored)
            .bind(&stored.ordering_key)
            .bind(reason)
            .bind(group)
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| port("record a delivery the broker gave up on", e))?;
        Ok(inserted.is_some())
    }

    /// [`outbox_ports::InboxConsumerPath::record_dead_letter`].
    pub(super) async fn store_dead_letter(
        &self,
        consumer: &str,
        letter: DeadLetter,
    ) -> Result<(), PortError> {
        sqlx::query(sqlx::AssertSqlSafe(&*self.sql.dead_letter))
            .bind(consumer)
            .bind(storable::opt_text(letter.message_id.as_deref()))
            .bind(storable::text(&letter.routing_key))
            .bind(Json(storable::headers(&letter.headers)))
            .bind(&letter.body)
            .bind(storable::error_text(&letter.reason))
            .execute(&self.pool)
            .await
            .map_err(|e| port("record dead letter", e))?;
        Ok(())
    }
}
