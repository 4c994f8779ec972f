//! Login attempts limited per client address (governor's keyed rate limiter):
//! ten a minute, then one every six seconds, so guessing tokens through the login
//! form is as slow as it is pointless, while a person who mistypes is never in
//! the way. The address is the TCP peer's (behind a proxy, every client shares
//! the proxy's bucket).

use std::net::{IpAddr, Ipv4Addr};
use std::num::NonZeroU32;
use std::time::Duration;

use governor::clock::{Clock as _, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

/// Attempts a client address may make in a burst (and per minute after it).
pub(crate) const LOGIN_ATTEMPTS_PER_MINUTE: u32 = 10;

/// Addresses remembered before the idle ones are forgotten.
const REMEMBERED: usize = 10_000;

pub(crate) struct LoginLimit {
    limiter: DefaultKeyedRateLimiter<IpAddr>,
    clock: DefaultClock,
}

impl LoginLimit {
    pub(crate) fn new() -> Self {
        let per_minute = NonZeroU32::new(LOGIN_ATTEMPTS_PER_MINUTE).unwrap_or(NonZeroU32::MIN);
        let clock = DefaultClock::default();
        Self {
            limiter: RateLimiter::keyed(Quota::per_minute(per_minute)),
            clock,
        }
    }

    /// Counts an attempt from `peer` (unknown: one bucket for all): `Err` with the
    /// wait before the next one may be made when it is one too many.
    pub(crate) fn attempt(&self, peer: Option<IpAddr>) -> Result<(), Duration> {
        if self.limiter.len() > REMEMBERED {
            self.limiter.retain_recent();
        }
        let key = peer.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
        self.limiter
            .check_key(&key)
            .map_err(|not_until| not_until.wait_time_from(self.clock.now()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ten_attempts_then_a_wait_per_address() {
        let limit = LoginLimit::new();
        let (a, b): (IpAddr, IpAddr) = (
            "10.0.0.1".parse().expect("ip"),
            "10.0.0.2".parse().expect("ip"),
        );
        for n in 0..LOGIN_ATTEMPTS_PER_MINUTE {
            assert!(limit.attempt(Some(a)).is_ok(), "attempt {n}");
        }
        let wait = limit.attempt(Some(a)).expect_err("one too many");
        assert!(
            wait > Duration::ZERO && wait <= Duration::from_secs(6),
            "{wait:?}"
        );
        assert!(
            limit.attempt(Some(b)).is_ok(),
            "another address has its own"
        );
    }
}
