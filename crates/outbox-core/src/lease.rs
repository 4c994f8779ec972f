//! How long a relay may keep publishing the rows of one claim.
//!
//! A claim's lease ends `ttl` after the database stamped it; from then on another
//! relay may claim and publish the same rows. The relay starts its clock before it
//! sends the claim, so its view of the end is never later than the database's. It
//! stops handing messages to the broker a safety margin before that end: a frame
//! already queued in the client still leaves, and a relay's clock may run a little
//! fast or be descheduled between a check and a write.

use std::time::Duration;

/// The longest safety margin kept before a lease ends.
pub const MAX_LEASE_MARGIN: Duration = Duration::from_secs(5);

/// The margin kept before a lease of `ttl` ends: a fifth of it, at most
/// [`MAX_LEASE_MARGIN`].
#[must_use]
pub fn lease_margin(ttl: Duration) -> Duration {
    (ttl / 5).min(MAX_LEASE_MARGIN)
}

/// Time left for publishing the rows of a claim with lease `ttl`, `elapsed` after
/// the claim was sent: zero once the margin before the lease's end is reached.
#[must_use]
pub fn publish_budget(ttl: Duration, elapsed: Duration) -> Duration {
    ttl.saturating_sub(lease_margin(ttl))
        .saturating_sub(elapsed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_budget_of_the_default_lease() {
        let ttl = Duration::from_secs(60);
        assert_eq!(publish_budget(ttl, Duration::ZERO), Duration::from_secs(55));
        assert_eq!(
            publish_budget(ttl, Duration::from_secs(50)),
            Duration::from_secs(5)
        );
        assert_eq!(publish_budget(ttl, Duration::from_secs(56)), Duration::ZERO);
    }

    proptest! {
        #[test]
        fn the_budget_always_ends_before_the_lease(ttl_ms in 0u64..10_000_000, elapsed_ms in 0u64..20_000_000) {
            let ttl = Duration::from_millis(ttl_ms);
            let elapsed = Duration::from_millis(elapsed_ms);
            let budget = publish_budget(ttl, elapsed);
            // Publishing stops at elapsed + budget, which leaves the margin unused.
            if !budget.is_zero() {
                prop_assert!(elapsed + budget + lease_margin(ttl) <= ttl);
            }
            prop_assert!(budget <= ttl);
            // More time gone never means more time left.
            prop_assert!(publish_budget(ttl, elapsed + Duration::from_millis(1)) <= budget);
        }
    }
}
