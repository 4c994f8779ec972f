//! The relay's marks on the rows it claimed: sent ([`OutboxRelayPath::mark_sent`]),
//! failed or dead ([`OutboxRelayPath::mark_publish_failed`]), or handed back
//! unpublished ([`OutboxRelayPath::release`]).
//!
//! Each is one statement over the whole batch (`id = ANY($1)`, or `unnest` of the
//! failures), fenced by the claim's holder (`locked_by = $n`): a relay whose lease
//! ran out and whose rows another relay claimed marks nothing. Every status change
//! is guarded by the statuses the core's transition table allows it from
//! (`status = ANY($n)`), and clears the lease in the same update.
//!
//! [`OutboxRelayPath::mark_sent`]: outbox_ports::OutboxRelayPath::mark_sent
//! [`OutboxRelayPath::mark_publish_failed`]: outbox_ports::OutboxRelayPath::mark_publish_failed
//! [`OutboxRelayPath::release`]: outbox_ports::OutboxRelayPath::release

use outbox_core::{MessageId, OutboxStatus};
use outbox_ports::{Lease, PortError, PublishFailure};

use super::PgOutboxStore;
use crate::error::port;
use crate::rows::{failure_sources, retry_delay_ms, sources_of, uuids};

impl PgOutboxStore {
    /// Marks the rows `ids` that `lease` holds sent; returns how many.
    pub(super) async fn mark_sent_rows(
        &self,
        lease: &Lease,
        ids: &[MessageId],
    ) -> Result<u64, PortError> {
        if ids.is_empty() {
            return Ok(0);
        }
        Ok(sqlx::query(sqlx::AssertSqlSafe(&*self.sql.mark_sent))
            .bind(uuids(ids))
            .bind(&lease.holder)
            .bind(sources_of(OutboxStatus::Sent))
            .execute(&self.pool)
            .await
            .map_err(|e| port("mark sent", e))?
            .rows_affected())
    }

    /// Marks the rows of `failures` that `lease` holds failed (due again after
    /// their delay) or dead, with their errors; returns how many.
    pub(super) async fn mark_failures(
        &self,
        lease: &Lease,
        failures: &[PublishFailure],
    ) -> Result<u64, PortError> {
        if failures.is_empty() {
            return Ok(0);
        }
        let delays: Vec<Option<i64>> = failures
            .iter()
            .map(|f| retry_delay_ms(f.decision))
            .collect();
        let errors: Vec<String> = failures
            .iter()
            .map(|f| crate::storable::error_text(&f.error))
            .collect();
        // Of the text as stored, as the database's trigger would compute it.
        let groups: Vec<String> = errors
            .iter()
            .map(|e| outbox_core::failure_group::failure_group(e))
            .collect();
        Ok(sqlx::query(sqlx::AssertSqlSafe(&*self.sql.mark_failed))
            .bind(failures.iter().map(|f| *f.id.as_uuid()).collect::<Vec<_>>())
            .bind(errors)
            .bind(delays)
            .bind(&lease.holder)
            .bind(failure_sources::<OutboxStatus>())
            .bind(groups)
            .execute(&self.pool)
            .await
            .map_err(|e| port("mark publish failed", e))?
            .rows_affected())
    }

    /// Clears the lease of the rows `ids` that `lease` holds, unmarked; returns how
    /// many.
    pub(super) async fn release_rows(
        &self,
        lease: &Lease,
        ids: &[MessageId],
    ) -> Result<u64, PortError> {
        Ok(sqlx::query(sqlx::AssertSqlSafe(&*self.sql.release))
            .bind(uuids(ids))
            .bind(&lease.holder)
            .execute(&self.pool)
            .await
            .map_err(|e| port("release", e))?
            .rows_affected())
    }
}
