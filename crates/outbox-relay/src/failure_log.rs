//! Failed publishes said once per exchange and interval. A message whose publish
//! fails is retried with backoff and its error stored on the row, which is logged
//! at debug level only: an exchange that does not exist (or refuses every
//! message) would otherwise go unsaid for the minutes its retries take, or, at a
//! line per message, drown the log. The first failures of an exchange are said at
//! once, then at most one line per [`EVERY`] with how many failed meanwhile.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

/// At most one line per exchange this often.
pub(crate) const EVERY: Duration = Duration::from_secs(60);

/// The most exchanges remembered: past it, those not said within [`EVERY`] are
/// forgotten (producers writing ever new exchange names cannot grow it for good).
const MAX_EXCHANGES: usize = 1_000;

#[derive(Debug, Default)]
struct Entry {
    said_at: Option<Instant>,
    unsaid: u64,
}

/// When to say an exchange's failures: a pure record of what was said when.
#[derive(Debug, Default)]
pub(crate) struct FailureLog {
    exchanges: HashMap<String, Entry>,
}

impl FailureLog {
    /// `failed` more failures of `exchange` at `now`: how many to say now (those
    /// since the last line), or `None` while its last line is younger than
    /// [`EVERY`].
    pub(crate) fn note(&mut self, exchange: &str, failed: u64, now: Instant) -> Option<u64> {
        if self.exchanges.len() >= MAX_EXCHANGES && !self.exchanges.contains_key(exchange) {
            self.exchanges
                .retain(|_, e| e.said_at.is_some_and(|t| now.duration_since(t) < EVERY));
            if self.exchanges.len() >= MAX_EXCHANGES {
                // Every one said within the minute: a further exchange is not said
                // (nor remembered) until room frees; its errors are on its rows.
                return None;
            }
        }
        let entry = self.exchanges.entry(exchange.to_owned()).or_default();
        entry.unsaid += failed;
        match entry.said_at {
            Some(t) if now.duration_since(t) < EVERY => None,
            _ => {
                entry.said_at = Some(now);
                Some(std::mem::take(&mut entry.unsaid))
            }
        }
    }
}

static LOG: LazyLock<Mutex<FailureLog>> = LazyLock::new(Mutex::default);

/// Says (at warn level) that `failed` publishes to `exchange` failed with
/// `error`, unless this exchange was said within [`EVERY`]; then the count waits
/// for its next line.
pub(crate) fn publishes_failed(exchange: &str, failed: u64, error: &str) {
    let said = LOG
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .note(exchange, failed, Instant::now());
    if let Some(n) = said {
        tracing::warn!(
            exchange,
            failed = n,
            %error,
            "publishes to this exchange are failing; they are retried with backoff (said at most once a minute per exchange; each message's error is on its row)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exchange_is_said_at_once_then_once_an_interval_with_what_it_gathered() {
        let mut log = FailureLog::default();
        let t0 = Instant::now();
        assert_eq!(
            log.note("orders", 30, t0),
            Some(30),
            "the first failures at once"
        );
        assert_eq!(log.note("orders", 5, t0 + Duration::from_secs(10)), None);
        assert_eq!(log.note("orders", 7, t0 + Duration::from_secs(59)), None);
        assert_eq!(
            log.note("billing", 1, t0 + Duration::from_secs(59)),
            Some(1),
            "another exchange is its own"
        );
        assert_eq!(
            log.note("orders", 1, t0 + EVERY),
            Some(13),
            "the next line counts what was not said"
        );
        assert_eq!(
            log.note("orders", 2, t0 + EVERY + Duration::from_secs(1)),
            None
        );
    }

    #[test]
    fn ever_new_exchange_names_do_not_grow_it_for_good() {
        let mut log = FailureLog::default();
        let t0 = Instant::now();
        for i in 0..MAX_EXCHANGES {
            log.note(&format!("x{i}"), 1, t0);
        }
        assert_eq!(
            log.note("crowded", 1, t0 + Duration::from_secs(1)),
            None,
            "full within the minute: not said, not remembered"
        );
        assert_eq!(log.exchanges.len(), MAX_EXCHANGES);
        let later = t0 + EVERY + Duration::from_secs(1);
        assert_eq!(log.note("fresh", 1, later), Some(1));
        assert!(log.exchanges.len() <= 2, "{}", log.exchanges.len());
    }
}
