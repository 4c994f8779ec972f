//! A handler's failure and what it says about retrying: the input of a consumer's
//! retry decision, beside the attempt number and the retry policy.
//!
//! A handler chooses a class: retryable (the default: the consumer's policy, or
//! the message type's own, decides), permanent (dead at once, no more attempts:
//! a body that does not decode as its type, a version no handler accepts, a
//! business rule that will never pass), or retry after a delay the handler names
//! (still bounded by the policy's attempts, so no handler retries forever).

use std::fmt;
use std::time::Duration;

use crate::{Decision, RetryPolicy};

/// The longest delay a handler's [`FailureClass::RetryAfter`] is kept to: a
/// longer one (a mistaken `Duration::MAX`, a badly parsed `Retry-After`) is cut to
/// this, so that every store can write the due time.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(30 * 24 * 3600);

/// What a failure says about retrying.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailureClass {
    /// Try again after the policy's backoff, while its attempts last.
    Retryable,
    /// Never try again: dead after this attempt.
    Permanent,
    /// Try again after this delay (at most [`MAX_RETRY_AFTER`]), while the policy's
    /// attempts last.
    RetryAfter(Duration),
}

/// One failed handling: the reason stored as the delivery's last error, its class,
/// and the retry policy of the message's type when it has one of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandlerFailure {
    /// Stored as the delivery's `last_error`.
    pub reason: String,
    /// What it says about retrying.
    pub class: FailureClass,
    /// The message type's own policy (`None`: the consumer's).
    pub policy: Option<RetryPolicy>,
}

impl HandlerFailure {
    /// A failure the consumer's policy retries.
    #[must_use]
    pub fn retryable(reason: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
            class: FailureClass::Retryable,
            policy: None,
        }
    }

    /// A failure that is dead at once.
    #[must_use]
    pub fn permanent(reason: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
            class: FailureClass::Permanent,
            policy: None,
        }
    }

    /// Decided by `policy` instead of the consumer's.
    #[must_use]
    pub fn with_policy(mut self, policy: Option<RetryPolicy>) -> Self {
        self.policy = policy;
        self
    }

    /// The decision for this failure of attempt number `attempt` (1 = the first),
    /// `random` in `[0, 1)` for the backoff's jitter, `default` the consumer's
    /// policy (used unless the failure carries its type's own).
    #[must_use]
    pub fn decide(&self, attempt: u32, random: f64, default: &RetryPolicy) -> Decision {
        let policy = self.policy.as_ref().unwrap_or(default);
        match self.class {
            FailureClass::Permanent => Decision::Dead,
            FailureClass::Retryable => policy.decide(attempt, random),
            FailureClass::RetryAfter(delay) => match policy.decide(attempt, random) {
                Decision::Dead => Decision::Dead,
                Decision::RetryAfter(_) => Decision::RetryAfter(delay.min(MAX_RETRY_AFTER)),
            },
        }
    }
}

/// A retryable failure with this reason.
impl From<String> for HandlerFailure {
    fn from(reason: String) -> Self {
        Self::retryable(reason)
    }
}

/// A retryable failure with this reason.
impl From<&str> for HandlerFailure {
    fn from(reason: &str) -> Self {
        Self::retryable(reason)
    }
}

impl fmt::Display for HandlerFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn policy(max_attempts: u32) -> RetryPolicy {
        RetryPolicy {
            max_attempts,
            ..RetryPolicy::default()
        }
    }

    proptest! {
        #[test]
        fn each_class_decides_as_documented(
            attempt in 1u32..20,
            random in 0.0f64..1.0,
            max in 1u32..10,
            own in proptest::option::of(1u32..10),
            delay_ms in 0u64..100_000,
        ) {
            let default = policy(max);
            let own = own.map(policy);
            let effective = own.unwrap_or(default);
            let spent = attempt >= effective.max_attempts;
            let with = |class| HandlerFailure { reason: "x".into(), class, policy: own };

            prop_assert_eq!(with(FailureClass::Permanent).decide(attempt, random, &default), Decision::Dead);
            prop_assert_eq!(
                with(FailureClass::Retryable).decide(attempt, random, &default),
                effective.decide(attempt, random)
            );
            let delay = Duration::from_millis(delay_ms);
            prop_assert!(delay < MAX_RETRY_AFTER);
            let after = with(FailureClass::RetryAfter(delay)).decide(attempt, random, &default);
            if spent {
                prop_assert_eq!(after, Decision::Dead, "a named delay never outlives the budget");
            } else {
                prop_assert_eq!(after, Decision::RetryAfter(delay));
            }
        }
    }

    #[test]
    fn a_delay_no_store_can_write_is_cut_to_the_maximum() {
        let f = HandlerFailure {
            reason: "x".into(),
            class: FailureClass::RetryAfter(Duration::MAX),
            policy: None,
        };
        assert_eq!(
            f.decide(1, 0.5, &policy(3)),
            Decision::RetryAfter(MAX_RETRY_AFTER)
        );
    }

    #[test]
    fn a_type_policy_overrides_the_consumers() {
        let default = policy(5);
        let f = HandlerFailure::retryable("boom").with_policy(Some(policy(1)));
        assert_eq!(f.decide(1, 0.5, &default), Decision::Dead);
        assert!(matches!(
            HandlerFailure::retryable("boom").decide(1, 0.5, &default),
            Decision::RetryAfter(_)
        ));
        assert_eq!(
            HandlerFailure::permanent("bad body").to_string(),
            "bad body"
        );
    }
}
