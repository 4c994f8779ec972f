//! Login attempts limited per client address (governor's keyed rate limiter):
//! ten a minute, then one every six seconds, so guessing tokens through the login
//! form is as slow as it is pointless, while a person who mistypes is never in
//! the way. The address is the TCP peer's, or behind the trusted proxy the one it
//! forwarded for.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
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

    /// Counts an attempt from `client`: `Err` with the wait before the next one may
    /// be made when it is one too many. An unknown client (a server without
    /// connect info) is not limited: one bucket for all would let anyone lock
    /// everyone out. IPv6 clients count by their /64 (one host holds a whole /64).
    /// Past [`REMEMBERED`] addresses, idle ones are forgotten; while still over it,
    /// new addresses share one bucket, so memory stays bounded.
    pub(crate) fn attempt(&self, client: Option<IpAddr>) -> Result<(), Duration> {
        let Some(client) = client else {
            return Ok(());
        };
        let mut key = match client {
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => IpAddr::V4(v4),
                None => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
            },
            v4 => v4,
        };
        if self.limiter.len() > REMEMBERED {
            self.limiter.retain_recent();
            if self.limiter.len() > REMEMBERED {
                key = IpAddr::V4(Ipv4Addr::UNSPECIFIED);
            }
        }
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
        // One IPv6 host holds a /64: its addresses share an allowance.
        for n in 0..LOGIN_ATTEMPTS_PER_MINUTE {
            let ip: IpAddr = format!("2001:db8::{n:x}").parse().expect("ip");
            assert!(limit.attempt(Some(ip)).is_ok(), "attempt {n}");
        }
        let other_host: IpAddr = "2001:db8::ffff".parse().expect("ip");
        assert!(limit.attempt(Some(other_host)).is_err(), "the same /64");
        // No address known: not limited (one bucket for all would lock all out).
        for _ in 0..100 {
            assert!(limit.attempt(None).is_ok());
        }
    }
}
