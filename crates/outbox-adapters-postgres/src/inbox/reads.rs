//! The inbox's reads: a consumer's counts by status and its dead letters
//! ([`InboxStore::stats`]), and a delivery's status, which the consumer path reads
//! to say why nothing changed.
//!
//! [`InboxStore::stats`]: outbox_ports::InboxStore::stats

use outbox_core::{InboxStatus, MessageId};
use outbox_ports::{InboxStats, PortError};

use super::PgInboxStore;
use crate::error::port;
use crate::rows::{count, stored_status};

impl PgInboxStore {
    /// [`outbox_ports::InboxStore::stats`].
    pub(super) async fn read_stats(&self, consumer: &str) -> Result<InboxStats, PortError> {
        let (received, consumed, consume_failed, dead, dead_letters): (i64, i64, i64, i64, i64) =
            sqlx::query_as(sqlx::AssertSqlSafe(&*self.sql.stats))
                .bind(consumer)
                .fetch_one(&self.pool)
                .await
                .map_err(|e| port("inbox stats", e))?;
        Ok(InboxStats {
            received: count(received),
            consumed: count(consumed),
            consume_failed: count(consume_failed),
            dead: count(dead),
            dead_letters: count(dead_letters),
        })
    }

    /// The status of `consumer`'s delivery `id`, if recorded.
    pub(super) async fn status_of(
        &self,
        consumer: &str,
        id: MessageId,
    ) -> Result<Option<InboxStatus>, PortError> {
        sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(&*self.sql.status_of))
            .bind(consumer)
            .bind(id.as_uuid())
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| port("read status", e))?
            .map(|s| stored_status(&s).map_err(|e| PortError::fatal("read status", e)))
            .transpose()
    }
}
