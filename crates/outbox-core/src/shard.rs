//! Which shard of a sharded stream a message goes to, and what a shard is called.
//!
//! One stream (an exchange and the queues bound to it) can be split over `n`
//! shards, each an exchange and queues of its own, so that it is not capped by one
//! queue process. A message's shard is a pure function of its ordering key (or, for
//! a message without one, of its id), so every message of one key takes the same
//! shard, whichever relay publishes it and after any restart, and the key's order
//! holds within that shard's queue.
//!
//! The function is fixed: FNV-1a (64-bit) of the key's bytes, then the jump
//! consistent hash of Lamping and Veach ("A Fast, Minimal Memory, Consistent Hash
//! Algorithm", 2014). Going from `n` to `n + 1` shards moves only the keys that the
//! new shard takes (about one in `n + 1`), never a key between two old shards.
//! Changing it would move keys between shards under a running system, so the
//! values are pinned by a test.

use crate::Message;

/// The largest number of shards a stream may have.
pub const MAX_SHARDS: u16 = 256;

/// The name of shard `index` of the exchange or queue `name`: `orders.shard-0`.
#[must_use]
pub fn shard_name(name: &str, index: u16) -> String {
    format!("{name}.shard-{index}")
}

/// The shard, in `0..shards`, of a message with this ordering key or id bytes.
/// `shards` of 0 or 1 is one shard: always 0.
#[must_use]
pub fn shard_of_key(key: &[u8], shards: u16) -> u16 {
    if shards <= 1 {
        return 0;
    }
    let bucket = jump(fnv1a64(key), i64::from(shards));
    // `jump` returns a value in `0..shards`, which fits.
    u16::try_from(bucket).unwrap_or(0)
}

/// The shard, in `0..shards`, of `message`: by its ordering key when it has one (so
/// a key's messages keep their order), by its id otherwise (spread evenly).
#[must_use]
pub fn shard_of(message: &Message, shards: u16) -> u16 {
    match &message.ordering_key {
        Some(key) => shard_of_key(key.as_bytes(), shards),
        None => shard_of_key(message.id.as_uuid().as_bytes(), shards),
    }
}

fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// Jump consistent hash: the bucket in `0..buckets` of `key`.
fn jump(mut key: u64, buckets: i64) -> i64 {
    let mut b: i64 = -1;
    let mut j: i64 = 0;
    while j < buckets {
        b = j;
        key = key.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1);
        // The algorithm's own arithmetic: (b + 1) * 2^31 / ((key >> 33) + 1).
        #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation)]
        let next = ((b + 1) as f64 * ((1_i64 << 31) as f64 / ((key >> 33) + 1) as f64)) as i64;
        j = next;
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn one_shard_or_none_is_shard_zero() {
        assert_eq!(shard_of_key(b"customer-7", 0), 0);
        assert_eq!(shard_of_key(b"customer-7", 1), 0);
    }

    /// The values a running system relies on: a release that changed them would
    /// move keys between shards, and a key's messages published before and after
    /// an upgrade would be consumed from two queues, out of order.
    #[test]
    fn the_function_is_pinned() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        // Jump hash's published reference values (key, buckets) -> bucket.
        assert_eq!(jump(0, 1), 0);
        assert_eq!(jump(1, 10), 6);
        let pinned: Vec<u16> = ["customer-1", "customer-2", "customer-3", "order-42", ""]
            .iter()
            .map(|k| shard_of_key(k.as_bytes(), 4))
            .collect();
        assert_eq!(pinned, PINNED_4);
    }

    const PINNED_4: [u16; 5] = [0, 3, 2, 0, 1];

    #[test]
    fn keys_spread_evenly_over_shards() {
        let mut counts = [0_u32; 4];
        for i in 0..40_000 {
            counts[usize::from(shard_of_key(format!("customer-{i}").as_bytes(), 4))] += 1;
        }
        for c in counts {
            assert!((9_000..11_000).contains(&c), "uneven: {counts:?}");
        }
    }

    proptest! {
        #[test]
        fn a_shard_is_in_range_and_the_same_every_time(key in proptest::collection::vec(any::<u8>(), 0..64), shards in 0_u16..=MAX_SHARDS) {
            let s = shard_of_key(&key, shards);
            prop_assert!(s < shards.max(1));
            prop_assert_eq!(s, shard_of_key(&key, shards));
        }

        /// Consistency: one more shard moves a key only onto the new shard.
        #[test]
        fn one_more_shard_moves_keys_only_to_it(key in proptest::collection::vec(any::<u8>(), 0..64), shards in 1_u16..MAX_SHARDS) {
            let before = shard_of_key(&key, shards);
            let after = shard_of_key(&key, shards + 1);
            prop_assert!(after == before || after == shards, "{before} -> {after} of {}", shards + 1);
        }
    }
}
