//! The cluster lock on PostgreSQL: one lease row per key, renewed while held.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use outbox_ports::renewal::{RenewalAnswer, RenewedLease};
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
/// acquisition, across restarts). While held, the lease is renewed by
/// [`outbox_ports::renewal`] (the loop the Redis lock shares): every third of its
/// TTL, sooner after a failure; the guard reports the lock lost when a renewal finds
/// the row taken, and, so that it never claims a lease another instance may already
/// hold, as soon as the last renewal that got through is older than the TTL minus a
/// quarter of it, counted from when that renewal was sent (the database's
/// `now() + ttl` comes later, so the lease lasts at least that long). `is_held`
/// reads the clock itself: a renewal stuck on a lock or a dead connection cannot
/// keep it true.
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
        sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(&*self.sql.acquire))
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
        sqlx::query_scalar(sqlx::AssertSqlSafe(&*self.sql.is_locked))
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

struct PgLockGuard {
    lock: PgLock,
    lease: Arc<Lease>,
    renewal: RenewedLease,
}

impl PgLockGuard {
    fn start(lock: PgLock, lease: Lease, sent: tokio::time::Instant) -> Self {
        let lease = Arc::new(lease);
        let (l, row) = (lock.clone(), Arc::clone(&lease));
        let renewal = RenewedLease::start(lease.key.clone(), lease.ttl, sent, move || {
            let (l, row) = (l.clone(), Arc::clone(&row));
            async move {
                let r = sqlx::query(sqlx::AssertSqlSafe(&*l.sql.renew))
                    .bind(&row.key)
                    .bind(&row.holder)
                    .bind(row.token)
                    .bind(millis(row.ttl))
                    .execute(&l.pool)
                    .await
                    .map_err(|e| port("renew lock", e))?;
                Ok(if r.rows_affected() == 1 {
                    RenewalAnswer::Renewed
                } else {
                    RenewalAnswer::Taken
                })
            }
        });
        Self {
            lock,
            lease,
            renewal,
        }
    }
}

#[async_trait]
impl LockGuard for PgLockGuard {
    fn fencing_token(&self) -> u64 {
        u64::try_from(self.lease.token).unwrap_or(0)
    }

    fn is_held(&self) -> bool {
        self.renewal.is_held()
    }

    async fn release(&self) -> Result<(), PortError> {
        self.renewal.stop();
        sqlx::query(sqlx::AssertSqlSafe(&*self.lock.sql.release))
            .bind(&self.lease.key)
            .bind(&self.lease.holder)
            .bind(self.lease.token)
            .execute(&self.lock.pool)
            .await
            .map_err(|e| port("release lock", e))?;
        Ok(())
    }
}
