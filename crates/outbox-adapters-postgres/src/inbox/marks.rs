//! The consumer path's marks on a delivery it handled: consumed
//! ([`InboxConsumerPath::mark_consumed`]), or failed (due again after its delay) or
//! dead ([`InboxConsumerPath::mark_consume_failed`]).
//!
//! Each mark is fenced by the lease's holder and guarded by the statuses the core's
//! transition table allows it from. A keyed row that finished (consumed or dead;
//! a failed one still holds its key) makes its key's next held row due, in a
//! statement after the mark's commit; should that fail, the claims' safety net
//! ([`super::claim`]) makes the row due later.
//!
//! [`InboxConsumerPath::mark_consumed`]: outbox_ports::InboxConsumerPath::mark_consumed
//! [`InboxConsumerPath::mark_consume_failed`]: outbox_ports::InboxConsumerPath::mark_consume_failed

use outbox_core::{Decision, InboxStatus, MessageId};
use outbox_ports::{Lease, PortError};

use super::PgInboxStore;
use crate::error::port;
use crate::rows::{failure_sources, retry_delay_ms, sources_of};
use crate::storable;

impl PgInboxStore {
    /// [`outbox_ports::InboxConsumerPath::mark_consumed`].
    pub(super) async fn mark_consumed_row(
        &self,
        consumer: &str,
        id: MessageId,
        lease: &Lease,
    ) -> Result<bool, PortError> {
        let marked: Option<(i64, Option<String>)> =
            sqlx::query_as(sqlx::AssertSqlSafe(&*self.sql.mark_consumed))
                .bind(consumer)
                .bind(id.as_uuid())
                .bind(&lease.holder)
                .bind(sources_of(InboxStatus::Consumed))
                .fetch_optional(&self.pool)
                .await
                .map_err(|e| port("mark consumed", e))?;
        let Some((seq, key)) = marked else {
            return Ok(false);
        };
        if let Some(key) = key {
            self.promote_next(consumer, &key, seq).await;
        }
        Ok(true)
    }

    /// [`outbox_ports::InboxConsumerPath::mark_consume_failed`].
    pub(super) async fn mark_failed_row(
        &self,
        consumer: &str,
        id: MessageId,
        lease: &Lease,
        error: &str,
        decision: Decision,
    ) -> Result<bool, PortError> {
        let from = failure_sources::<InboxStatus>();
        let error = storable::error_text(error);
        // Of the text as stored, as the database's trigger would compute it.
        let group = outbox_core::failure_group::failure_group(&error);
        let marked: Option<(i64, Option<String>, String)> =
            sqlx::query_as(sqlx::AssertSqlSafe(&*self.sql.mark_failed))
                .bind(consumer)
                .bind(id.as_uuid())
                .bind(&lease.holder)
                .bind(error)
                .bind(retry_delay_ms(decision))
                .bind(from)
                .bind(group)
                .fetch_optional(&self.pool)
                .await
                .map_err(|e| port("mark consume failed", e))?;
        let Some((seq, key, status)) = marked else {
            return Ok(false);
        };
        // A dead row no longer holds its key back; a failed one still does.
        if let (Some(key), true) = (key, status == InboxStatus::Dead.as_str()) {
            self.promote_next(consumer, &key, seq).await;
        }
        Ok(true)
    }

    /// After a keyed row finished (consumed or dead): its key's next row, if held,
    /// is due now. A failure here is only logged: the mark itself has committed,
    /// and the safety net in [`outbox_ports::InboxConsumerPath::claim_due`] releases the row.
    pub(super) async fn promote_next(&self, consumer: &str, key: &str, seq: i64) {
        let promoted = sqlx::query(sqlx::AssertSqlSafe(&*self.sql.promote_next))
            .bind(consumer)
            .bind(key)
            .bind(seq)
            .execute(&self.pool)
            .await;
        if let Err(e) = promoted {
            tracing::warn!(consumer, error = %e, "could not make the next delivery of an ordering key due; the consume sweep's check will");
        }
    }
}
