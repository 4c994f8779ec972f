//! Failed attempts limited per client address: ten in a burst, then one every six
//! seconds (a generic cell rate: each failure takes six seconds of allowance, ten
//! may be taken at once), so guessing tokens (through the dashboard's login form
//! or as the API's bearer token) is as slow as it is pointless, while a person who
//! mistypes is never in the way.
//!
//! Only a failed token counts: a login post that is no login at all (no form, no
//! nonce, another page's nonce), or an API request without a bearer token, is
//! refused before this is asked and costs nothing, so anonymous garbage cannot
//! lock a valid token out; a right token never counts either, nor (on the API) a
//! wrong bearer token the address sent among its last four (a script retrying
//! with a stale token guesses nothing new). While an address
//! has used its allowance, everything it tries is refused before the token is
//! looked at (a right one too: the answer must not tell a guess that hit). The
//! address is the TCP peer's, or behind a declared forwarder (or the dashboard's
//! trusted proxy) the one it forwarded for, so one client's guesses never lock
//! out another behind the same proxy.

use std::collections::HashMap;
use std::hash::BuildHasher as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Failed attempts a client address may make in a burst (and per minute after it).
pub(crate) const ATTEMPTS_PER_MINUTE: u32 = 10;

/// The allowance one failed attempt takes.
const PER_ATTEMPT: Duration = Duration::from_secs(60 / ATTEMPTS_PER_MINUTE as u64);

/// Addresses remembered before the idle ones are forgotten.
const REMEMBERED: usize = 10_000;

/// Wrong tokens remembered per address (as keyed hashes): one sent again is no
/// new guess and is not counted again.
const RECENT: usize = 4;

/// One address's allowance.
struct Bucket {
    /// When its allowance is whole again (the "theoretical arrival time" of the
    /// cell rate algorithm).
    full_at: Instant,
    /// Keyed hashes of its last wrong tokens (never the tokens).
    recent: [u64; RECENT],
    /// Where the next one goes in `recent`.
    next: usize,
}

/// What a look at the limit counts.
#[derive(Clone, Copy)]
enum Count {
    /// Nothing.
    No,
    /// A failure (a login's).
    #[cfg_attr(not(feature = "ui"), allow(dead_code))]
    Failure,
    /// A failure with this wrong token's hash, unless the address sent it lately.
    Token(u64),
}

pub(crate) struct FailureLimit {
    buckets: Mutex<HashMap<IpAddr, Bucket>>,
    /// Keys the hashes of wrong tokens (random per process).
    hasher: std::collections::hash_map::RandomState,
}

impl FailureLimit {
    pub(crate) fn new() -> Self {
        Self {
            buckets: Mutex::new(HashMap::new()),
            hasher: std::collections::hash_map::RandomState::new(),
        }
    }

    /// Whether `client` may try a token now: `Err` with the wait before it may,
    /// when its failed attempts used its allowance up. Counts nothing.
    pub(crate) fn check(&self, client: Option<IpAddr>) -> Result<(), Duration> {
        self.at(client, Instant::now(), Count::No)
    }

    /// Counts a failed attempt (a well-formed login or bearer token that is no
    /// token) of `client`.
    #[cfg_attr(not(feature = "ui"), allow(dead_code))] // The dashboard's logins.
    pub(crate) fn failed(&self, client: Option<IpAddr>) {
        // Asked after `check` allowed it: nothing to refuse any more.
        let _ = self.at(client, Instant::now(), Count::Failure);
    }

    /// Counts `token`, which is no token, as a failed attempt of `client`, unless
    /// `client` sent that same wrong token among its last few: a script retrying
    /// with a stale token guesses nothing new, and must not lock out the valid
    /// tokens of others at its address; every new guess counts.
    pub(crate) fn failed_token(&self, client: Option<IpAddr>, token: &[u8]) {
        let hash = self.hasher.hash_one(token);
        let _ = self.at(client, Instant::now(), Count::Token(hash));
    }

    /// `check` (and with `count`, the failure counted) at `now`. An unknown
    /// client (a server without connect info) is not limited: one bucket for all
    /// would let anyone lock everyone out. IPv6 clients count by their /64 (one
    /// host holds a whole /64). Past [`REMEMBERED`] addresses, those whose
    /// allowance is whole are forgotten; while still over it, new addresses share
    /// one bucket, so memory stays bounded.
    fn at(&self, client: Option<IpAddr>, now: Instant, count: Count) -> Result<(), Duration> {
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
        let mut buckets = self.buckets.lock().unwrap_or_else(PoisonError::into_inner);
        if !buckets.contains_key(&key) && buckets.len() >= REMEMBERED {
            buckets.retain(|_, b| b.full_at > now);
            if buckets.len() >= REMEMBERED {
                key = IpAddr::V4(Ipv4Addr::UNSPECIFIED);
            }
        }
        let whole = buckets.get(&key).map_or(now, |b| b.full_at.max(now));
        // One more failure fits while the allowance is short of whole by at most
        // the burst less one.
        let tolerance = PER_ATTEMPT * (ATTEMPTS_PER_MINUTE - 1);
        if let Some(next) = whole.checked_sub(tolerance)
            && next > now
        {
            return Err(next - now);
        }
        let token = match count {
            Count::No => return Ok(()),
            Count::Failure => None,
            Count::Token(hash) => Some(hash),
        };
        let bucket = buckets.entry(key).or_insert(Bucket {
            full_at: now,
            recent: [0; RECENT],
            next: 0,
        });
        if let Some(hash) = token {
            if bucket.recent.contains(&hash) {
                return Ok(());
            }
            bucket.recent[bucket.next] = hash;
            bucket.next = (bucket.next + 1) % RECENT;
        }
        bucket.full_at = whole + PER_ATTEMPT;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ten_failures_then_a_wait_per_address() {
        let limit = FailureLimit::new();
        let now = Instant::now();
        let (a, b): (IpAddr, IpAddr) = (
            "10.0.0.1".parse().expect("ip"),
            "10.0.0.2".parse().expect("ip"),
        );
        for n in 0..ATTEMPTS_PER_MINUTE {
            assert!(limit.at(Some(a), now, Count::No).is_ok(), "check {n}");
            assert!(
                limit.at(Some(a), now, Count::Failure).is_ok(),
                "failure {n}"
            );
        }
        let wait = limit.at(Some(a), now, Count::No).expect_err("one too many");
        assert_eq!(wait, PER_ATTEMPT);
        assert!(
            limit.at(Some(a), now + PER_ATTEMPT, Count::No).is_ok(),
            "one more after six seconds"
        );
        assert!(
            limit.at(Some(b), now, Count::No).is_ok(),
            "another address has its own"
        );
        // One IPv6 host holds a /64: its addresses share an allowance.
        for n in 0..ATTEMPTS_PER_MINUTE {
            let ip: IpAddr = format!("2001:db8::{n:x}").parse().expect("ip");
            assert!(
                limit.at(Some(ip), now, Count::Failure).is_ok(),
                "failure {n}"
            );
        }
        let other_host: IpAddr = "2001:db8::ffff".parse().expect("ip");
        assert!(
            limit.at(Some(other_host), now, Count::No).is_err(),
            "the same /64"
        );
        // No address known: not limited (one bucket for all would lock all out).
        for _ in 0..100 {
            limit.failed(None);
        }
        assert!(limit.check(None).is_ok());
    }

    #[test]
    fn a_wrong_token_sent_again_counts_once_and_new_guesses_each_count() {
        let limit = FailureLimit::new();
        let a: IpAddr = "10.0.0.1".parse().expect("ip");
        for _ in 0..100 {
            limit.failed_token(Some(a), b"Bearer stale-token");
        }
        assert!(
            limit.check(Some(a)).is_ok(),
            "one stale token is one failure"
        );
        for n in 0..ATTEMPTS_PER_MINUTE - 1 {
            limit.failed_token(Some(a), format!("Bearer guess-{n}").as_bytes());
        }
        assert!(limit.check(Some(a)).is_err(), "each new guess counted");
    }

    #[test]
    fn checks_alone_never_use_the_allowance() {
        let limit = FailureLimit::new();
        let a: IpAddr = "10.0.0.1".parse().expect("ip");
        for _ in 0..1_000 {
            assert!(limit.check(Some(a)).is_ok());
        }
    }
}
