//! The cluster lock on PostgreSQL: one lease row per key, renewed while held.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use outbox_ports::{DistributedLock, LockGuard, PortError};
use sqlx::PgPool;

use crate::PgSchema;
use crate::error::port;
use crate::rows::millis;

#[derive(Debug)]
struct Sql {
    acquire: String,
    renew: String,
    release: String,
    is_locked: String,
}

/// [`DistributedLock`] on PostgreSQL. Acquisition takes the key's row if it is free
/// or its lease ran out, with a fencing token from a sequence (so it grows on every
/// acquisition, across restarts). While held, the lease is renewed every third of its
/// TTL, and a failed renewal is tried again after a twelfth of it (at most 1 s). The
/// guard reports the lock lost when a renewal finds the row taken, and, so
/// that it never claims a lease another instance may already hold, as soon as the
/// last renewal that got through is older than the TTL minus a quarter of it,
/// counted from when that renewal was sent (the database's `now() + ttl` comes
/// later, so the lease lasts at least that long). `is_held` reads the clock itself:
/// a renewal stuck on a lock or a dead connection cannot keep it true.
#[derive(Debug, Clone)]
pub struct PgLock {
    pool: PgPool,
    sql: Arc<Sql>,
    instance: String,
    seq: Arc<AtomicU64>,
}

impl PgLock {
    /// A lock over the tables of `schema`; `instance` names this process in the lock
    /// row (for operators).
    #[must_use]
    pub fn new(pool: PgPool, schema: &PgSchema, instance: &str) -> Self {
        let t = format!("{}.outbox_locks", schema.quoted());
        let seq = format!("{}.outbox_fencing_tokens", schema.quoted());
        Self {
            pool,
            sql: Arc::new(Sql {
                acquire: format!(
                    "INSERT INTO {t} (key, holder, token, expires_at) \
                     VALUES ($1, $2, nextval('{seq}'), now() + $3 * interval '1 millisecond') \
                     ON CONFLICT (key) DO UPDATE SET holder = EXCLUDED.holder, token = EXCLUDED.token, \
                       expires_at = EXCLUDED.expires_at WHERE {t}.expires_at < now() \
                     RETURNING token"
                ),
                renew: format!(
                    "UPDATE {t} SET expires_at = now() + $4 * interval '1 millisecond' \
                     WHERE key = $1 AND holder = $2 AND token = $3"
                ),
                release: format!("DELETE FROM {t} WHERE key = $1 AND holder = $2 AND token = $3"),
                is_locked: format!(
                    "SELECT EXISTS (SELECT 1 FROM {t} WHERE key = $1 AND expires_at >= now())"
                ),
            }),
            instance: instance.to_owned(),
            seq: Arc::default(),
        }
    }

    async fn try_take(
        &self,
        key: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<i64>, PortError> {
        sqlx::query_scalar::<_, i64>(&self.sql.acquire)
            .bind(key)
            .bind(holder)
            .bind(millis(ttl))
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| port("acquire lock", e))
    }
}

#[async_trait]
impl DistributedLock for PgLock {
    async fn acquire(
        &self,
        key: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Option<Box<dyn LockGuard>>, PortError> {
        let holder = format!(
            "{}#{}",
            self.instance,
            self.seq.fetch_add(1, Ordering::Relaxed)
        );
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let sent = tokio::time::Instant::now();
            if let Some(token) = self.try_take(key, &holder, ttl).await? {
                return Ok(Some(Box::new(PgLockGuard::start(
                    self.clone(),
                    Lease {
                        key: key.to_owned(),
                        holder,
                        token,
                        ttl,
                    },
                    sent,
                ))));
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            tokio::time::sleep((deadline - now).min(Duration::from_millis(50))).await;
        }
    }

    async fn is_locked(&self, key: &str) -> Result<bool, PortError> {
        sqlx::query_scalar(&self.sql.is_locked)
            .bind(key)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| port("read lock", e))
    }
}

/// Which lease row a guard holds.
struct Lease {
    key: String,
    holder: String,
    token: i64,
    ttl: Duration,
}

/// Until when this process may count on its lease, from its own clock: the send
/// time of the last acquisition or renewal that got through, plus the TTL, minus a
/// quarter of the TTL for clock-rate differences and for the step a caller takes
/// between checking `is_held` and acting on it.
struct Validity {
    origin: tokio::time::Instant,
    ttl: Duration,
    /// Milliseconds after `origin`; only ever grows.
    until_ms: AtomicU64,
}

impl Validity {
    fn new(sent: tokio::time::Instant, ttl: Duration) -> Self {
        let v = Self {
            origin: sent,
            ttl,
            until_ms: AtomicU64::new(0),
        };
        v.extend_from(sent);
        v
    }

    /// A renewal sent at `sent` got through.
    fn extend_from(&self, sent: tokio::time::Instant) {
        let usable = self.ttl.saturating_sub(self.ttl / 4);
        let until = sent.saturating_duration_since(self.origin) + usable;
        let ms = u64::try_from(until.as_millis()).unwrap_or(u64::MAX);
        self.until_ms.fetch_max(ms, Ordering::SeqCst);
    }

    /// Time left before the claim must be given up (zero once it is).
    fn remaining(&self) -> Duration {
        let until = self.origin + Duration::from_millis(self.until_ms.load(Ordering::SeqCst));
        until.saturating_duration_since(tokio::time::Instant::now())
    }
}

struct PgLockGuard {
    lock: PgLock,
    lease: Arc<Lease>,
    held: Arc<AtomicBool>,
    validity: Arc<Validity>,
    renewal: tokio::task::JoinHandle<()>,
}

impl PgLockGuard {
    fn start(lock: PgLock, lease: Lease, sent: tokio::time::Instant) -> Self {
        let held = Arc::new(AtomicBool::new(true));
        let validity = Arc::new(Validity::new(sent, lease.ttl));
        let lease = Arc::new(lease);
        let renewal = tokio::spawn(renew(
            lock.clone(),
            Arc::clone(&lease),
            Arc::clone(&held),
            Arc::clone(&validity),
        ));
        Self {
            lock,
            lease,
            held,
            validity,
            renewal,
        }
    }
}

/// How long after a failed renewal the next is tried: a twelfth of the TTL, at most a
/// second. Waiting the usual third would leave only a twelfth of the TTL for the
/// next one before the claim must be given up, so two short blips would lose it.
fn retry_after_failure(ttl: Duration) -> Duration {
    (ttl / 12).min(Duration::from_secs(1))
}

/// Renews the lease every third of its TTL until it is lost or the guard goes; after
/// a renewal that failed, again sooner ([`retry_after_failure`]). A renewal is given
/// only the time left before the claim must be given up; one that has not got
/// through by then loses the lock for good. Only a renewal that got through extends
/// the claim, from its own send time.
async fn renew(lock: PgLock, lease: Arc<Lease>, held: Arc<AtomicBool>, validity: Arc<Validity>) {
    let key = &lease.key;
    let lost = |why: &str| {
        held.store(false, Ordering::SeqCst);
        tracing::warn!(%key, "lock lease lost: {why}");
    };
    let mut pause = lease.ttl / 3;
    loop {
        tokio::time::sleep(pause).await;
        pause = lease.ttl / 3;
        let sent = tokio::time::Instant::now();
        let left = validity.remaining();
        if left.is_zero() {
            return lost("no renewal got through before the lease could run out");
        }
        let renewal = sqlx::query(&lock.sql.renew)
            .bind(key)
            .bind(&lease.holder)
            .bind(lease.token)
            .bind(millis(lease.ttl))
            .execute(&lock.pool);
        match tokio::time::timeout(left, renewal).await {
            Err(_) => return lost("no renewal got through before the lease could run out"),
            // Through, but after the claim was given up: it stays given up.
            Ok(Ok(_)) if validity.remaining().is_zero() => {
                return lost("the renewal got through too late");
            }
            Ok(Ok(r)) if r.rows_affected() == 1 => validity.extend_from(sent),
            Ok(Ok(_)) => return lost("another holder took it"),
            Ok(Err(e)) => {
                pause = retry_after_failure(lease.ttl);
                tracing::warn!(%key, error = %e, retry_in = ?pause, "lock renewal failed; retrying");
            }
        }
    }
}

#[async_trait]
impl LockGuard for PgLockGuard {
    fn fencing_token(&self) -> u64 {
        u64::try_from(self.lease.token).unwrap_or(0)
    }

    fn is_held(&self) -> bool {
        self.held.load(Ordering::SeqCst) && !self.validity.remaining().is_zero()
    }

    async fn release(&self) -> Result<(), PortError> {
        self.renewal.abort();
        self.held.store(false, Ordering::SeqCst);
        sqlx::query(&self.lock.sql.release)
            .bind(&self.lease.key)
            .bind(&self.lease.holder)
            .bind(self.lease.token)
            .execute(&self.lock.pool)
            .await
            .map_err(|e| port("release lock", e))?;
        Ok(())
    }
}

impl Drop for PgLockGuard {
    // Without an async drop the row cannot be deleted here: stop renewing and let the
    // lease run out.
    fn drop(&mut self) {
        self.renewal.abort();
    }
}
