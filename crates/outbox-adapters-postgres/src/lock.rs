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
}

/// [`DistributedLock`] on PostgreSQL. Acquisition takes the key's row if it is free
/// or its lease ran out, with a fencing token from a sequence (so it grows on every
/// acquisition, across restarts). While held, the lease is renewed every third of its
/// TTL; if a renewal finds the row taken, or no renewal succeeds for a whole TTL, the
/// guard reports the lock lost.
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
            if let Some(token) = self.try_take(key, &holder, ttl).await? {
                return Ok(Some(Box::new(PgLockGuard::start(
                    self.clone(),
                    key.to_owned(),
                    holder,
                    token,
                    ttl,
                ))));
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            tokio::time::sleep((deadline - now).min(Duration::from_millis(50))).await;
        }
    }
}

struct PgLockGuard {
    lock: PgLock,
    key: String,
    holder: String,
    token: i64,
    held: Arc<AtomicBool>,
    renewal: tokio::task::JoinHandle<()>,
}

impl PgLockGuard {
    fn start(lock: PgLock, key: String, holder: String, token: i64, ttl: Duration) -> Self {
        let held = Arc::new(AtomicBool::new(true));
        let renewal = tokio::spawn(renew(
            lock.clone(),
            key.clone(),
            holder.clone(),
            token,
            ttl,
            Arc::clone(&held),
        ));
        Self {
            lock,
            key,
            holder,
            token,
            held,
            renewal,
        }
    }
}

/// Renews the lease every third of its TTL until it is lost or the guard goes.
async fn renew(
    lock: PgLock,
    key: String,
    holder: String,
    token: i64,
    ttl: Duration,
    held: Arc<AtomicBool>,
) {
    let mut last_ok = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(ttl / 3).await;
        let result = sqlx::query(&lock.sql.renew)
            .bind(&key)
            .bind(&holder)
            .bind(token)
            .bind(millis(ttl))
            .execute(&lock.pool)
            .await;
        match result {
            Ok(r) if r.rows_affected() == 1 => last_ok = tokio::time::Instant::now(),
            Ok(_) => {
                tracing::warn!(%key, "lock lease lost: another holder took it");
                held.store(false, Ordering::SeqCst);
                return;
            }
            Err(e) if last_ok.elapsed() >= ttl => {
                tracing::warn!(%key, error = %e, "lock lease lost: no renewal succeeded within its TTL");
                held.store(false, Ordering::SeqCst);
                return;
            }
            Err(e) => tracing::warn!(%key, error = %e, "lock renewal failed; retrying"),
        }
    }
}

#[async_trait]
impl LockGuard for PgLockGuard {
    fn fencing_token(&self) -> u64 {
        u64::try_from(self.token).unwrap_or(0)
    }

    fn is_held(&self) -> bool {
        self.held.load(Ordering::SeqCst)
    }

    async fn release(&self) -> Result<(), PortError> {
        self.renewal.abort();
        self.held.store(false, Ordering::SeqCst);
        sqlx::query(&self.lock.sql.release)
            .bind(&self.key)
            .bind(&self.holder)
            .bind(self.token)
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
