//! A lane's map as [`PARTS`] dashmaps with unequal shares of the keys, so that their tables
//! double at different key counts ("staggered").
//!
//! A hashbrown table (each [`DashMap`] shard is one) keeps at most 7/8 of its buckets full
//! and doubles its bucket count when it would go beyond. With every table the same size, as
//! when keys spread evenly over shards, all of them double at the same key count, and the
//! bytes per key swing by a factor of two with the number of keys: from `8/7 x` the bucket
//! size just before a doubling to `16/7 x` just after (19.4 to 38.9 bytes for the 16-byte
//! entries of an IP key). Here part `i` of 8 takes a share of the keys close to
//! `2^(i/8) / sum_j 2^(j/8)` (from 23/256 to 42/256), so the parts' doublings are spread
//! evenly over each doubling of the total: at any key count, some parts have just doubled
//! and others are nearly full. For 16-byte entries the tables then cost between 25.5 and
//! 30.1 bytes per key at every key count from 100,000 up (computed from hashbrown's growth
//! rule; measured 26.8 at 10M keys and 29.5 at 1M, the `memory_scale` bench), instead of
//! 19.4 to 38.9.
//!
//! A key's part is a function of the key and a per-map random seed (a multiply-shift of the
//! key's compact form), computed before the dashmap's own hash: a few instructions. One
//! key always goes to the same part, so it always meets its own state.

use std::hash::{BuildHasher, Hash};
use std::sync::OnceLock;

use dashmap::DashMap;

use super::compact::Wide;

/// The number of parts.
pub(super) const PARTS: usize = 8;

/// Each part's share of the 256 routing slots: `256 x 2^(i/8) / sum_j 2^(j/8)`, rounded so
/// that they add up to 256.
const SHARES: [u8; PARTS] = [23, 25, 28, 30, 33, 36, 39, 42];

/// Routing slot (the top byte of the mixed key) to part.
pub(super) const PART_OF_SLOT: [u8; 256] = {
    let mut table = [0u8; 256];
    let (mut part, mut slot) = (0, 0);
    while part < PARTS {
        let mut n = 0;
        while n < SHARES[part] {
            table[slot] = part as u8;
            slot += 1;
            n += 1;
        }
        part += 1;
    }
    table
};

/// A 64-bit odd constant (2^64 / golden ratio) for the multiply-shift.
const MIX: u64 = 0x9E37_79B9_7F4A_7C15;

/// A compact key form that can be routed to a part: one word that depends on every bit.
pub(super) trait Route {
    fn word(&self) -> u64;
}

impl Route for u64 {
    #[inline(always)]
    fn word(&self) -> u64 {
        *self
    }
}

impl Route for Wide {
    #[inline(always)]
    fn word(&self) -> u64 {
        self.0.wrapping_mul(MIX) ^ self.1
    }
}

/// Dashmap shards per part: dashmap's default for the whole map (4 x the CPUs, a power of
/// two) spread over the parts, at least 2 (dashmap's minimum).
pub(super) fn shards_per_part() -> usize {
    static SHARDS: OnceLock<usize> = OnceLock::new();
    *SHARDS.get_or_init(|| {
        let cpus = std::thread::available_parallelism().map_or(1, usize::from);
        ((cpus * 4).next_power_of_two() / PARTS).max(2)
    })
}

/// One lane's key map in [`PARTS`] dashmaps (see the module docs).
pub(super) struct Staggered<Q, S, H> {
    parts: [DashMap<Q, S, H>; PARTS],
    seed: u64,
}

impl<Q: Hash + Eq + Route, S, H: BuildHasher + Clone> Staggered<Q, S, H> {
    pub(super) fn with_hasher(hasher: &H) -> Self {
        let shards = shards_per_part();
        Self {
            parts: std::array::from_fn(|_| {
                DashMap::with_hasher_and_shard_amount(hasher.clone(), shards)
            }),
            // Random per process with the default hasher (foldhash's random state).
            seed: hasher.hash_one(MIX),
        }
    }

    /// The part that holds `key`.
    #[inline(always)]
    pub(super) fn part(&self, key: &Q) -> &DashMap<Q, S, H> {
        let slot = ((key.word() ^ self.seed).wrapping_mul(MIX) >> 56) as usize;
        // `slot < 256` and every entry of the table is below PARTS.
        &self.parts[usize::from(PART_OF_SLOT[slot]) % PARTS]
    }

    /// The parts, for whole-map operations (length, sweeps).
    pub(super) fn parts(&self) -> &[DashMap<Q, S, H>] {
        &self.parts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_routing_table_gives_each_part_its_share() {
        assert_eq!(SHARES.iter().map(|&n| usize::from(n)).sum::<usize>(), 256);
        for (part, &share) in SHARES.iter().enumerate() {
            let slots = PART_OF_SLOT
                .iter()
                .filter(|&&p| usize::from(p) == part)
                .count();
            assert_eq!(slots, usize::from(share));
            // Within a rounding of the geometric share.
            #[allow(clippy::cast_precision_loss)]
            let ideal = 256.0 * 2f64.powf(part as f64 / 8.0) / 11.0506;
            assert!(
                (f64::from(share) - ideal).abs() < 1.0,
                "part {part}: {share} vs {ideal}"
            );
        }
    }

    #[test]
    fn keys_spread_over_the_parts_by_their_shares() {
        let map: Staggered<u64, u64, foldhash::fast::RandomState> =
            Staggered::with_hasher(&foldhash::fast::RandomState::default());
        let n = 256_000u64;
        for ip in 0..n {
            map.part(&ip).insert(ip, ip);
        }
        // Each key went to exactly one part, the one routing finds it in.
        assert_eq!(map.parts().iter().map(DashMap::len).sum::<usize>(), 256_000);
        for ip in (0..n).step_by(97) {
            assert_eq!(map.part(&ip).get(&ip).map(|v| *v), Some(ip));
        }
        for (part, &share) in map.parts().iter().zip(&SHARES) {
            let expected = f64::from(share) * 1_000.0;
            #[allow(clippy::cast_precision_loss)]
            let got = part.len() as f64;
            assert!(
                (got - expected).abs() < expected * 0.05,
                "{got} keys, expected {expected}"
            );
        }
    }

    /// Table bytes per key of 16-byte entries (17 bytes per bucket with the control byte),
    /// from the tables' capacities (7/8 of their buckets).
    fn table_bytes_per_key<'a>(
        parts: impl Iterator<Item = &'a DashMap<u64, u64, foldhash::fast::FixedState>>,
    ) -> f64 {
        let (mut buckets, mut keys) = (0usize, 0usize);
        for part in parts {
            buckets += part.capacity() / 7 * 8;
            keys += part.len();
        }
        #[allow(clippy::cast_precision_loss)]
        let per_key = (17 * buckets) as f64 / keys as f64;
        per_key
    }

    #[test]
    fn staggered_tables_stay_under_the_stated_bytes_per_key_at_every_count() {
        // 100k to 300k keys, looked at every 5k: more than one doubling of every part. The
        // same keys in one dashmap with as many shards swing up to 38.9 bytes per key. A
        // fixed seed, so every run measures the same tables (with a random one the worst
        // count moves by a few tenths of a byte from run to run).
        let hasher = foldhash::fast::FixedState::with_seed(0x7261_7465_6b65_6570);
        let staggered: Staggered<u64, u64, _> = Staggered::with_hasher(&hasher);
        let single = DashMap::with_hasher_and_shard_amount(hasher, PARTS * shards_per_part());
        let (mut worst, mut single_worst) = (0f64, 0f64);
        for key in 0..300_000u64 {
            staggered.part(&key).insert(key, key);
            single.insert(key, key);
            if key >= 100_000 && key % 5_000 == 0 {
                worst = worst.max(table_bytes_per_key(staggered.parts().iter()));
                single_worst = single_worst.max(table_bytes_per_key(std::iter::once(&single)));
            }
        }
        assert!(worst <= 30.2, "staggered: up to {worst:.1} bytes per key");
        assert!(
            single_worst > 34.0,
            "one dashmap: up to {single_worst:.1} bytes per key"
        );
    }

    #[test]
    fn wide_keys_route_by_both_words() {
        let map: Staggered<Wide, u8, foldhash::fast::RandomState> =
            Staggered::with_hasher(&foldhash::fast::RandomState::default());
        // Keys differing only in one word still spread over several parts.
        let mut used = [false; PARTS];
        for i in 0..4_096u64 {
            for key in [Wide(i, 0), Wide(0, i)] {
                let part = map.part(&key);
                let index = map.parts().iter().position(|p| std::ptr::eq(p, part));
                used[index.unwrap_or(0)] = true;
            }
        }
        assert!(used.iter().all(|&u| u), "{used:?}");
    }
}
