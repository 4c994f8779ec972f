//! The lock and state keys of the retry sweeps, derived the same way by the
//! embedded relay, `outbox run` and every consumer: instances of one sweep share
//! its keys, and two sweeps never do.

use outbox_core::{RetryPolicy, SweepConfig};

/// The relay's publish-retry sweep over the tables of `schema`:
/// `outbox.<schema>.retry.run-lock` and `outbox.<schema>.retry.last-state`, with
/// the other settings of `base`.
#[must_use]
pub fn relay_sweep(schema: &str, base: SweepConfig) -> SweepConfig {
    SweepConfig {
        lock_key: format!("outbox.{schema}.retry.run-lock"),
        state_key: format!("outbox.{schema}.retry.last-state"),
        ..base
    }
}

/// The consume-retry sweep of consumer `name`
/// ([`SweepConfig::for_consumer_retrying`], what `ConsumerBuilder` uses too): run
/// as often as `retry`'s first backoff (at least every second, at most every
/// minute), so a delivery that failed is retried about when its policy says, not
/// at the next minute.
#[must_use]
pub fn consumer_sweep(name: &str, retry: &RetryPolicy) -> SweepConfig {
    SweepConfig::for_consumer_retrying(name, retry)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn relay_keys_name_the_schema_and_stay_valid() {
        let c = relay_sweep("shop", SweepConfig::default());
        assert_eq!(c.lock_key, "outbox.shop.retry.run-lock");
        assert_eq!(c.state_key, "outbox.shop.retry.last-state");
        assert!(c.validate("sweep").is_ok());
    }

    #[test]
    fn a_consumer_sweeps_at_its_first_backoff() {
        let retry = RetryPolicy {
            initial_backoff: Duration::from_secs(2),
            ..RetryPolicy::default()
        };
        let c = consumer_sweep("billing", &retry);
        assert_eq!(c.interval, Duration::from_secs(2));
        assert_eq!(c.lock_key, "outbox.consume-retry.billing.run-lock");
        assert!(c.validate("sweep").is_ok());
        let slow = RetryPolicy {
            initial_backoff: Duration::from_secs(600),
            max_backoff: Duration::from_secs(600),
            ..RetryPolicy::default()
        };
        assert_eq!(consumer_sweep("b", &slow).interval, Duration::from_secs(60));
        let fast = RetryPolicy {
            initial_backoff: Duration::from_millis(10),
            ..RetryPolicy::default()
        };
        assert_eq!(consumer_sweep("b", &fast).interval, Duration::from_secs(1));
    }
}
