//! The relay's claims: pending rows ([`OutboxRelayPath::claim_pending`]), failed
//! rows due for a retry ([`OutboxRelayPath::claim_due_retries`]), what an idle relay
//! asks before it sleeps (`pending_claimable`, `next_due_in`), and the clearing of
//! leases a vanished relay left behind (`recover_expired_leases`). While an
//! exchange is paused, each claim first lists the exchanges not paused and then
//! reads only their rows ([`super::paused`]).
//!
//! A claim is one statement: the rows are picked `FOR UPDATE SKIP LOCKED` (so
//! relays never wait on each other) and leased to the claim's holder until the
//! database's `now()` plus the lease's time to live, and the leased rows are
//! returned. A claim rewrites a row in place (no index covers the lease columns),
//! and its picks read partial indexes of unsent rows only (see [`super::sql`]).
//! Rows come back in claim order (`seq`), decoded one by one: a row that cannot
//! be decoded never fails the claim, it is made dead at once under the same lease.
//!
//! Keyed rows are taken at their key's head only, the keys walked from a cursor
//! that each claim moves past the keys it took, so successive claims take turns
//! over the keys instead of always favouring the first ones.
//!
//! [`OutboxRelayPath::claim_pending`]: outbox_ports::OutboxRelayPath::claim_pending
//! [`OutboxRelayPath::claim_due_retries`]: outbox_ports::OutboxRelayPath::claim_due_retries

use std::time::Duration;

use outbox_core::{Decision, MessageId};
use outbox_ports::{ClaimedMessage, Lease, PortError, PublishFailure};

use super::PgOutboxStore;

/// Per pick of a claim, the exchanges not paused that have rows in its index,
/// read while some exchange is paused ([`PgOutboxStore::live_exchanges`]).
#[derive(Debug, Default)]
pub(super) struct LiveExchanges {
    /// Of unkeyed rows due now.
    pub(super) now: Vec<String>,
    /// Of unkeyed delayed rows.
    pub(super) due: Vec<String>,
    /// Of keyed pending rows.
    pub(super) keyed: Vec<String>,
    /// Of failed rows.
    pub(super) failed: Vec<String>,
}
use super::sql::RECOVER_WINDOW;
use crate::error::port;
use crate::rows::{ClaimedRow, decode_in_claim_order, millis};

/// Where a key cursor standing at `cursor` goes after a claim took `keys`: to
/// the greatest one after it, or (the walk wrapped around) the greatest one
/// before it, or back to the start (empty) when none was taken.
fn next_cursor<'k>(cursor: &str, keys: impl Iterator<Item = &'k String> + Clone) -> String {
    let after = keys.clone().filter(|k| k.as_str() > cursor).max();
    after.or_else(|| keys.max()).cloned().unwrap_or_default()
}

impl PgOutboxStore {
    /// Claims up to `limit` pending rows under `lease`, keyed ones from the key
    /// cursor, and moves the cursor past the keys taken; in the form for
    /// whether an exchange is paused (see [`super::paused`]).
    pub(super) async fn claim_pending_rows(
        &self,
        lease: &Lease,
        limit: u32,
    ) -> Result<Vec<ClaimedMessage>, PortError> {
        match self.live_exchanges().await? {
            None => {
                let cursor = Some(self.key_cursor());
                let claimed = self
                    .claim(&self.sql.claim_pending, lease, limit, cursor, &[])
                    .await?;
                self.advance_key_cursor(&claimed);
                Ok(claimed)
            }
            Some(live) => {
                let sql = &self.sql.claim_pending_paused;
                let lists = self.paused_claim_lists(live);
                let claimed = self.claim(sql, lease, limit, None, &lists).await?;
                self.advance_exchange_key_cursors(&lists[0], &claimed);
                Ok(claimed)
            }
        }
    }

    /// The parameters after the lease of a pending claim while an exchange is
    /// paused, in their order: the exchanges with keyed rows, the key cursor of
    /// each, the exchanges with immediate rows, with delayed rows.
    pub(super) fn paused_claim_lists(&self, live: LiveExchanges) -> [Vec<String>; 4] {
        let cursors = {
            let by_exchange = self
                .exchange_key_cursors
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            live.keyed
                .iter()
                .map(|x| by_exchange.get(x).cloned().unwrap_or_default())
                .collect()
        };
        [live.keyed, cursors, live.now, live.due]
    }

    /// Moves each listed exchange's key cursor past the keys the claim took of
    /// that exchange, by [`next_cursor`]'s rule; forgets the cursors of
    /// exchanges no longer listed.
    fn advance_exchange_key_cursors(&self, listed: &[String], claimed: &[ClaimedMessage]) {
        let mut by_exchange = self
            .exchange_key_cursors
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        by_exchange.retain(|x, _| listed.contains(x));
        for x in listed {
            let keys = claimed
                .iter()
                .filter(|c| c.message.exchange == *x)
                .filter_map(|c| c.message.ordering_key.as_ref());
            let cursor = by_exchange.get(x).map_or("", String::as_str);
            let next = next_cursor(cursor, keys);
            if next.is_empty() {
                by_exchange.remove(x);
            } else {
                by_exchange.insert(x.clone(), next);
            }
        }
    }

    /// Claims up to `limit` failed rows whose next attempt is due, under `lease`;
    /// in the form for whether an exchange is paused.
    pub(super) async fn claim_retry_rows(
        &self,
        lease: &Lease,
        limit: u32,
    ) -> Result<Vec<ClaimedMessage>, PortError> {
        match self.live_exchanges().await? {
            None => {
                self.claim(&self.sql.claim_retries, lease, limit, None, &[])
                    .await
            }
            Some(live) => {
                let sql = &self.sql.claim_retries_paused;
                self.claim(sql, lease, limit, None, &[live.failed]).await
            }
        }
    }

    /// `None` while no exchange is paused; else, per pick, the exchanges not
    /// paused that have rows in its index.
    pub(super) async fn live_exchanges(&self) -> Result<Option<LiveExchanges>, PortError> {
        type Lists = (bool, Vec<String>, Vec<String>, Vec<String>, Vec<String>);
        let (paused, now, due, keyed, failed): Lists =
            sqlx::query_as(sqlx::AssertSqlSafe(&*self.sql.live_exchanges))
                .fetch_one(&self.pool)
                .await
                .map_err(|e| port("read pauses", e))?;
        Ok(paused.then_some(LiveExchanges {
            now,
            due,
            keyed,
            failed,
        }))
    }

    /// The key cursor's value for the next claim.
    pub(super) fn key_cursor(&self) -> String {
        self.key_cursor
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Moves the key cursor past the keys a claim took: to the greatest one after
    /// where it stood, or (the walk wrapped around) the greatest one before it, or
    /// back to the start when the claim took no keyed row.
    fn advance_key_cursor(&self, claimed: &[ClaimedMessage]) {
        let mut cursor = self
            .key_cursor
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let keys = claimed
            .iter()
            .filter_map(|c| c.message.ordering_key.as_ref());
        *cursor = next_cursor(&cursor, keys);
    }

    /// Runs claim statement `sql`; `cursor` is its fourth parameter, if it has
    /// one, and `lists` (of exchanges) the parameters after it.
    async fn claim(
        &self,
        sql: &str,
        lease: &Lease,
        limit: u32,
        cursor: Option<String>,
        lists: &[Vec<String>],
    ) -> Result<Vec<ClaimedMessage>, PortError> {
        let mut query = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(i64::from(limit))
            .bind(&lease.holder)
            .bind(millis(lease.ttl));
        if let Some(c) = cursor {
            query = query.bind(c);
        }
        for list in lists {
            query = query.bind(list);
        }
        let rows: Vec<ClaimedRow> = query
            .fetch_all(&self.pool)
            .await
            .map_err(|e| port("claim", e))?;
        let (good, bad) = decode_in_claim_order(rows);
        if !bad.is_empty() {
            self.bury_undecodable(lease, bad).await;
        }
        Ok(good
            .into_iter()
            .map(|(message, attempts, requeued)| ClaimedMessage {
                message,
                attempts,
                requeued,
            })
            .collect())
    }

    /// Marks claimed rows that cannot be decoded (written through plain SQL before
    /// the table's constraints existed) dead at once, under the claim's lease, with
    /// why: no retry can make them readable. If the mark fails, the rows stay
    /// leased, come back when the lease runs out and are tried again; the decoded
    /// rows of the claim flow either way.
    async fn bury_undecodable(&self, lease: &Lease, bad: Vec<(MessageId, String)>) {
        let failures: Vec<PublishFailure> = bad
            .into_iter()
            .map(|(id, why)| {
                tracing::warn!(message_id = %id, reason = %why, "claimed row cannot be decoded; dead at once");
                PublishFailure {
                    id,
                    error: format!("cannot be decoded: {why}"),
                    decision: Decision::Dead,
                }
            })
            .collect();
        if let Err(e) = self.mark_failures(lease, &failures).await {
            tracing::warn!(error = %e, rows = failures.len(), "marking undecodable rows dead failed; they come back when their lease runs out");
        }
    }

    /// The time left until the next delayed row is due, by the database's clock.
    pub(super) async fn next_due(&self) -> Result<Option<Duration>, PortError> {
        let micros: Option<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(&*self.sql.next_due))
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| port("next due", e))?;
        Ok(micros.map(|us| Duration::from_micros(u64::try_from(us).unwrap_or(0))))
    }

    /// Whether a claim of pending rows would take anything now.
    pub(super) async fn claimable(&self) -> Result<Option<bool>, PortError> {
        sqlx::query_scalar(sqlx::AssertSqlSafe(&*self.sql.claimable))
            .fetch_one(&self.pool)
            .await
            .map(Some)
            .map_err(|e| port("look for claimable messages", e))
    }

    /// Clears the leases that ran out at the front of each claim's order (the
    /// first [`RECOVER_WINDOW`] rows of each pick); returns how many.
    pub(super) async fn recover_leases(&self) -> Result<u64, PortError> {
        Ok(sqlx::query(sqlx::AssertSqlSafe(&*self.sql.recover))
            .bind(RECOVER_WINDOW)
            .execute(&self.pool)
            .await
            .map_err(|e| port("recover leases", e))?
            .rows_affected())
    }
}
