//! The cluster lock on Redis.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use deadpool_redis::redis::Script;
use outbox_ports::renewal::{RenewalAnswer, RenewedLease};
use outbox_ports::{DistributedLock, LockGuard, PortError};

use crate::{RedisClient, port};

/// Takes the lock if free and returns a fencing token: microseconds of the server's
/// clock, or one more than the last token handed out for this key if that is larger.
/// TIME keeps growing across a restart that loses every key; the stored last token
/// keeps tokens growing within one server life even if the clock steps back.
const ACQUIRE: &str = r"
if redis.call('EXISTS', KEYS[1]) == 1 then return false end
local t = redis.call('TIME')
local token = tonumber(t[1]) * 1000000 + tonumber(t[2])
local last = tonumber(redis.call('GET', KEYS[2]) or '0')
if token <= last then token = last + 1 end
redis.call('SET', KEYS[2], string.format('%.0f', token))
redis.call('SET', KEYS[1], ARGV[1] .. '/' .. string.format('%.0f', token), 'PX', ARGV[2])
return token
";

/// Extends the lease only if the value is still ours.
const RENEW: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
";

/// Deletes the key only if the value is still ours.
const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
";

/// [`DistributedLock`] on Redis: `SET NX PX` with a fencing token, renewed by
/// [`outbox_ports::renewal`] (the loop the PostgreSQL lock shares): the guard gives
/// the lease up when a renewal finds the key taken, or before the TTL can have run
/// out on the server, counted from the send time of the last renewal that got
/// through, also while a renewal hangs on a dead connection.
#[derive(Debug, Clone)]
pub struct RedisLock {
    client: RedisClient,
    instance: String,
    seq: Arc<AtomicU64>,
}

impl RedisLock {
    /// A lock on `client`; `instance` names this process in lock values.
    #[must_use]
    pub fn new(client: RedisClient, instance: &str) -> Self {
        Self {
            client,
            instance: instance.to_owned(),
            seq: Arc::default(),
        }
    }
}

fn fence_key(key: &str) -> String {
    format!("{key}:fencing-token")
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

#[async_trait]
impl DistributedLock for RedisLock {
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
        let script = Script::new(ACQUIRE);
        loop {
            let sent = tokio::time::Instant::now();
            let mut conn = self.client.conn("acquire lock").await?;
            let token: Option<u64> = script
                .key(key)
                .key(fence_key(key))
                .arg(&holder)
                .arg(millis(ttl))
                .invoke_async(&mut conn)
                .await
                .map_err(|e| port("acquire lock", &e))?;
            drop(conn);
            if let Some(token) = token {
                return Ok(Some(Box::new(RedisLockGuard::start(
                    self.client.clone(),
                    key.to_owned(),
                    format!("{holder}/{token}"),
                    token,
                    ttl,
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
        let mut conn = self.client.conn("read lock").await?;
        // The key lives exactly as long as the lease (SET ... PX ttl).
        let exists: bool = deadpool_redis::redis::cmd("EXISTS")
            .arg(key)
            .query_async(&mut conn)
            .await
            .map_err(|e| port("read lock", &e))?;
        Ok(exists)
    }
}

struct RedisLockGuard {
    client: RedisClient,
    key: String,
    value: String,
    token: u64,
    renewal: RenewedLease,
}

impl RedisLockGuard {
    fn start(
        client: RedisClient,
        key: String,
        value: String,
        token: u64,
        ttl: Duration,
        sent: tokio::time::Instant,
    ) -> Self {
        let (c, k, v) = (client.clone(), key.clone(), value.clone());
        let renewal = RenewedLease::start(key.clone(), ttl, sent, move || {
            let (c, k, v) = (c.clone(), k.clone(), v.clone());
            async move {
                let mut conn = c.conn("renew lock").await?;
                let extended: i64 = Script::new(RENEW)
                    .key(&k)
                    .arg(&v)
                    .arg(millis(ttl))
                    .invoke_async(&mut conn)
                    .await
                    .map_err(|e| port("renew lock", &e))?;
                Ok(if extended == 1 {
                    RenewalAnswer::Renewed
                } else {
                    RenewalAnswer::Taken
                })
            }
        });
        Self {
            client,
            key,
            value,
            token,
            renewal,
        }
    }
}

#[async_trait]
impl LockGuard for RedisLockGuard {
    fn fencing_token(&self) -> u64 {
        self.token
    }

    fn is_held(&self) -> bool {
        self.renewal.is_held()
    }

    async fn release(&self) -> Result<(), PortError> {
        self.renewal.stop();
        let mut conn = self.client.conn("release lock").await?;
        let _: i64 = Script::new(RELEASE)
            .key(&self.key)
            .arg(&self.value)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| port("release lock", &e))?;
        Ok(())
    }
}
