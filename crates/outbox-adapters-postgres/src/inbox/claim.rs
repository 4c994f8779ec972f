//! The consume sweep's claim of due deliveries
//! ([`InboxConsumerPath::claim_due`]): received or failed rows of one consumer
//! whose next attempt is due, at their key's head, picked `FOR UPDATE SKIP LOCKED`
//! by next attempt time and leased to the claim's holder until the database's
//! `now()` plus the lease's time to live, in claim order.
//!
//! Before it, at most once per [`super::HELD_CHECK_EVERY`] (per consumer, shared by
//! the store's clones), the safety net: held rows that lead their key are made due.
//! That happens only when a process died between finishing a row and making its
//! successor due; its cost follows the consumer's keys with held rows.
//!
//! [`InboxConsumerPath::claim_due`]: outbox_ports::InboxConsumerPath::claim_due

use std::time::Instant;

use outbox_ports::{ClaimedDelivery, Lease, PortError};

use super::PgInboxStore;
use crate::error::port;
use crate::rows::{ClaimedRow, in_claim_order, millis};

impl PgInboxStore {
    /// [`outbox_ports::InboxConsumerPath::claim_due`].
    pub(super) async fn claim_due_rows(
        &self,
        consumer: &str,
        lease: &Lease,
        limit: u32,
    ) -> Result<Vec<ClaimedDelivery>, PortError> {
        self.release_held_if_due(consumer).await;
        let rows: Vec<ClaimedRow> = sqlx::query_as(sqlx::AssertSqlSafe(&*self.sql.claim_due))
            .bind(consumer)
            .bind(i64::from(limit))
            .bind(&lease.holder)
            .bind(millis(lease.ttl))
            .fetch_all(&self.pool)
            .await
            .map_err(|e| port("claim due deliveries", e))?;
        Ok(in_claim_order(rows)
            .map(|(message, attempts)| ClaimedDelivery { message, attempts })
            .collect())
    }

    /// The safety net: held rows of `consumer` that lead their key are made due,
    /// at most once per `held_check_every`.
    async fn release_held_if_due(&self, consumer: &str) {
        {
            let mut checked = self
                .held_checked
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let now = Instant::now();
            match checked.get(consumer) {
                Some(at) if now.duration_since(*at) < self.held_check_every => return,
                _ => {
                    checked.insert(consumer.to_owned(), now);
                }
            }
        }
        // A failure is only logged: the claim that follows must not depend on it
        // (every other due delivery of the consumer would wait), and the next
        // check tries again.
        match sqlx::query(sqlx::AssertSqlSafe(&*self.sql.release_held))
            .bind(consumer)
            .execute(&self.pool)
            .await
        {
            Ok(done) if done.rows_affected() > 0 => {
                tracing::warn!(
                    consumer,
                    released = done.rows_affected(),
                    "held deliveries whose predecessor had finished were made due"
                );
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(consumer, error = %e, "could not check for held deliveries left behind; trying again at the next check");
            }
        }
    }
}
