//! When a failed attempt is tried again: exponential backoff with jitter and a cap,
//! then `Dead` once the attempt budget is spent.
//!
//! The delay is a pure function of the attempt number and a random input in `[0, 1)`
//! that the caller draws, so tests can pin it and proptest can sweep it.
//!
//! The delay is the earliest time a retry may happen. Retries are made by the retry
//! sweep, which runs once per sweep interval, so the effective delay is never below
//! the sweep interval: the interval is the floor under the backoff.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::ConfigError;

/// What to do after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Try again no sooner than this long after now.
    RetryAfter(Duration),
    /// The budget is spent: park the message as dead.
    Dead,
}

/// Exponential backoff with "equal jitter": attempt `n` waits between half and all of
/// `min(max_backoff, initial_backoff * 2^(n-1))`. Half the delay is certain, so the
/// backoff still grows; the random half spreads retries of a burst of failures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetryPolicy {
    /// Delay bound of the first retry.
    #[serde(with = "crate::duration")]
    pub initial_backoff: Duration,
    /// Upper bound of any delay.
    #[serde(with = "crate::duration")]
    pub max_backoff: Duration,
    /// Attempts in all (the first one included) before a message is dead.
    pub max_attempts: u32,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(15 * 60),
            max_attempts: 10,
        }
    }
}

impl RetryPolicy {
    /// Checks the policy.
    ///
    /// # Errors
    /// [`ConfigError`] naming the field (under `prefix`) that is out of range.
    pub fn validate(&self, prefix: &str) -> Result<(), ConfigError> {
        if self.initial_backoff.is_zero() {
            return Err(ConfigError::new(
                prefix,
                "initial_backoff",
                "must be greater than zero",
            ));
        }
        if self.max_backoff < self.initial_backoff {
            return Err(ConfigError::new(
                prefix,
                "max_backoff",
                format!(
                    "must be at least initial_backoff ({})",
                    crate::duration::format(self.initial_backoff)
                ),
            ));
        }
        if self.max_attempts == 0 {
            return Err(ConfigError::new(
                prefix,
                "max_attempts",
                "must be at least 1",
            ));
        }
        Ok(())
    }

    /// The delay before the retry that follows failed attempt number `attempt`
    /// (1-based). `random` is taken from `[0, 1]`; values outside (or NaN) are clamped.
    #[must_use]
    pub fn backoff(&self, attempt: u32, random: f64) -> Duration {
        let exponent = attempt.saturating_sub(1).min(63);
        let factor = 1u64 << exponent;
        let base = u32::try_from(factor)
            .ok()
            .and_then(|f| self.initial_backoff.checked_mul(f))
            .map_or(self.max_backoff, |d| d.min(self.max_backoff));
        let r = if random.is_nan() {
            0.0
        } else {
            random.clamp(0.0, 1.0)
        };
        let half = base / 2;
        (half + (base - half).mul_f64(r)).min(self.max_backoff)
    }

    /// What follows the failure of attempt number `attempts_made` (1-based; the
    /// failed attempt included).
    #[must_use]
    pub fn decide(&self, attempts_made: u32, random: f64) -> Decision {
        if attempts_made >= self.max_attempts {
            Decision::Dead
        } else {
            Decision::RetryAfter(self.backoff(attempts_made, random))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn policy() -> RetryPolicy {
        RetryPolicy {
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(60),
            max_attempts: 5,
        }
    }

    #[test]
    fn doubles_until_the_cap() {
        let p = policy();
        let full: Vec<_> = (1..=8).map(|a| p.backoff(a, 1.0).as_secs()).collect();
        assert_eq!(full, [1, 2, 4, 8, 16, 32, 60, 60]);
        let least: Vec<_> = (1..=8).map(|a| p.backoff(a, 0.0).as_millis()).collect();
        assert_eq!(least, [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000]);
    }

    #[test]
    fn dead_after_the_budget() {
        let p = policy();
        assert!(matches!(p.decide(4, 0.5), Decision::RetryAfter(_)));
        assert_eq!(p.decide(5, 0.5), Decision::Dead);
        assert_eq!(p.decide(u32::MAX, 0.5), Decision::Dead);
    }

    #[test]
    fn validation_names_fields() {
        let mut p = policy();
        p.max_attempts = 0;
        let e = p.validate("relay.retry").expect_err("zero attempts");
        assert_eq!(e.field, "relay.retry.max_attempts");
        p = policy();
        p.max_backoff = Duration::from_millis(10);
        assert_eq!(
            p.validate("retry").expect_err("cap").field,
            "retry.max_backoff"
        );
        assert!(RetryPolicy::default().validate("retry").is_ok());
    }

    proptest! {
        #[test]
        fn backoff_never_exceeds_the_cap_and_never_drops_below_half_base(
            initial_ms in 1u64..100_000,
            extra_ms in 0u64..10_000_000,
            attempt in 0u32..200,
            random in proptest::num::f64::ANY,
        ) {
            let p = RetryPolicy {
                initial_backoff: Duration::from_millis(initial_ms),
                max_backoff: Duration::from_millis(initial_ms + extra_ms),
                max_attempts: 10,
            };
            let d = p.backoff(attempt, random);
            prop_assert!(d <= p.max_backoff);
            prop_assert!(d >= p.initial_backoff / 2);
        }

        #[test]
        fn backoff_grows_with_attempts_for_the_same_draw(
            attempt in 1u32..100, random in 0.0f64..=1.0,
        ) {
            let p = policy();
            prop_assert!(p.backoff(attempt + 1, random) >= p.backoff(attempt, random));
        }

        #[test]
        fn dead_exactly_when_the_budget_is_spent(max in 1u32..50, made in 0u32..100, r in 0.0f64..1.0) {
            let p = RetryPolicy { max_attempts: max, ..policy() };
            prop_assert_eq!(p.decide(made, r) == Decision::Dead, made >= max);
        }
    }
}
