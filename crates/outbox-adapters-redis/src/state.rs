//! The shared sweep state on Redis.

use std::time::Duration;

use async_trait::async_trait;
use deadpool_redis::redis::Script;
use outbox_core::SweepReport;
use outbox_ports::{PortError, StateWrite, SweepStateStore};

use crate::{RedisClient, port};

/// Writes the report unless the stored one carries a newer fencing token.
const SET_FENCED: &str = r#"
local current = redis.call('GET', KEYS[1])
if current then
  local stored = string.match(current, '"fencing_token":(%d+)')
  if stored and tonumber(stored) > tonumber(ARGV[2]) then return 0 end
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
return 1
"#;

/// [`SweepStateStore`] on Redis: the report as JSON (plus the writer's
/// `fencing_token`) under the state key, expiring after the state TTL.
#[derive(Debug, Clone)]
pub struct RedisSweepState {
    client: RedisClient,
}

impl RedisSweepState {
    /// A state store on `client`.
    #[must_use]
    pub const fn new(client: RedisClient) -> Self {
        Self { client }
    }
}

#[async_trait]
impl SweepStateStore for RedisSweepState {
    async fn get(&self, key: &str) -> Result<Option<SweepReport>, PortError> {
        let mut conn = self.client.conn("read sweep state").await?;
        let stored: Result<Option<String>, _> = deadpool_redis::redis::cmd("GET")
            .arg(key)
            .query_async(&mut conn)
            .await;
        let text = match stored {
            Ok(t) => t,
            Err(e) if e.code() == Some("WRONGTYPE") => {
                tracing::warn!(%key, "sweep state key holds another type; treating it as absent");
                return Ok(None);
            }
            Err(e) => return Err(port("read sweep state", &e)),
        };
        Ok(text.and_then(|t| match serde_json::from_str::<SweepReport>(&t) {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::warn!(%key, error = %e, "stored sweep state cannot be decoded; treating it as absent");
                None
            }
        }))
    }

    async fn set(
        &self,
        key: &str,
        report: &SweepReport,
        ttl: Duration,
        fencing_token: u64,
    ) -> Result<StateWrite, PortError> {
        let mut json = serde_json::to_value(report)
            .map_err(|e| PortError::fatal("encode sweep state", e.to_string()))?;
        if let Some(obj) = json.as_object_mut() {
            obj.insert("fencing_token".to_owned(), fencing_token.into());
        }
        let mut conn = self.client.conn("write sweep state").await?;
        let written: i64 = Script::new(SET_FENCED)
            .key(key)
            .arg(json.to_string())
            .arg(fencing_token)
            .arg(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1))
            .invoke_async(&mut conn)
            .await
            .map_err(|e| port("write sweep state", &e))?;
        Ok(if written == 1 {
            StateWrite::Written
        } else {
            StateWrite::Fenced
        })
    }
}
