//! A lane's map that keeps its keys and states in dense slabs, with a hash table of 4-byte
//! slot numbers beside them ("slab lane"), for key forms too large to sit in a hash table's
//! buckets cheaply.
//!
//! A hashbrown table keeps between 7/16 and 7/8 of its buckets full, so every byte of an
//! entry costs 1.1 to 2.3 bytes per key. Here a shard's table holds only the slot number of
//! each key (a `u32`: 4 bytes and a control byte per bucket); the key's form and its state
//! are in two slabs of fixed-size chunks ([`CHUNK`] slots each), filled in order, which cost
//! their size per key and at most one partly filled chunk per shard. A 28-byte form with an
//! 8-byte state then costs 36 bytes plus 5 bytes per bucket, instead of 41 bytes per bucket.
//!
//! The shards are [`PARTS`] groups of [`shards_per_part`] shards, the groups taking unequal
//! shares of the keys as in `staggered`, so the tables' doublings are spread over each
//! doubling of the key count. A key's shard and its place in the shard's table come from one
//! hash of its form: bits 48..56 pick the group, bits 40..48 the shard in it, and hashbrown
//! uses the low bits and the top seven. The table compares the full forms of keys with equal
//! hashes, so distinct keys never share a slot, whatever the hasher.
//!
//! A key that goes (a sweep, a reset) frees its slot: its state is taken out, and the slot
//! is reused before any new one. The slabs never shrink: they hold at most as many slots as
//! the shard ever held keys at once.

use std::hash::{BuildHasher, Hash};
use std::ops::Deref;
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use hashbrown::HashTable;

use super::staggered::{PART_OF_SLOT, PARTS, shards_per_part};

/// Slots per chunk of a slab (a power of two). A shard holds at most one partly filled
/// chunk of each slab.
pub(super) const CHUNK: usize = 256;

/// One lane's map in slabs (see the module docs).
pub(super) struct Slab<Q, S, H> {
    shards: Box<[RwLock<Shard<Q, S>>]>,
    /// `log2` of the shards per group.
    sub_bits: u32,
    hasher: H,
}

/// One shard: the table of slot numbers and the two slabs it indexes.
struct Shard<Q, S> {
    index: HashTable<u32>,
    forms: Vec<Vec<Q>>,
    states: Vec<Vec<S>>,
    /// Slots filled so far (held or free).
    slots: usize,
    /// Slots whose key went, reused first.
    free: Vec<u32>,
}

/// A held key's state, read under its shard's read lock (like a dashmap `Ref`).
pub(super) struct Held<'a, Q, S> {
    shard: RwLockReadGuard<'a, Shard<Q, S>>,
    slot: u32,
}

impl<Q, S> Deref for Held<'_, Q, S> {
    type Target = S;

    fn deref(&self) -> &S {
        // The slot was found in the table under this guard, and slots are only freed or
        // made under the write lock: it is filled while the guard lives.
        let (chunk, at) = place(self.slot);
        &self.shard.states[chunk][at]
    }
}

/// The chunk and the position in it of `slot`.
#[inline(always)]
fn place(slot: u32) -> (usize, usize) {
    let slot = slot as usize;
    (slot / CHUNK, slot % CHUNK)
}

fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}

impl<Q, S> Shard<Q, S> {
    fn new() -> Self {
        Self {
            index: HashTable::new(),
            forms: Vec::new(),
            states: Vec::new(),
            slots: 0,
            free: Vec::new(),
        }
    }
}

/// The value in `slot` of a slab (`forms` or `states`), if filled.
#[inline(always)]
fn at<T>(slab: &[Vec<T>], slot: u32) -> Option<&T> {
    let (chunk, at) = place(slot);
    slab.get(chunk)?.get(at)
}

impl<Q: Hash + Eq + Copy, S: Default, H: BuildHasher> Slab<Q, S, H> {
    pub(super) fn with_hasher(hasher: &H) -> Self
    where
        H: Clone,
    {
        let per_part = shards_per_part();
        Self {
            shards: (0..PARTS * per_part)
                .map(|_| RwLock::new(Shard::new()))
                .collect(),
            sub_bits: per_part.trailing_zeros(),
            hasher: hasher.clone(),
        }
    }

    /// The hash of `q` and its shard.
    #[inline(always)]
    fn shard(&self, q: &Q) -> (u64, &RwLock<Shard<Q, S>>) {
        let hash = self.hasher.hash_one(q);
        let group = usize::from(PART_OF_SLOT[usize::from((hash >> 48) as u8)]);
        let sub = (hash >> 40) as usize & ((1 << self.sub_bits) - 1);
        // `group < PARTS` and `sub < 2^sub_bits`: below `PARTS << sub_bits`, the length.
        (hash, &self.shards[group << self.sub_bits | sub])
    }

    /// The state of `q`, if held.
    #[inline]
    pub(super) fn get(&self, q: &Q) -> Option<Held<'_, Q, S>> {
        let (hash, lock) = self.shard(q);
        let shard = read(lock);
        let slot = *shard
            .index
            .find(hash, |&slot| at(&shard.forms, slot) == Some(q))?;
        Some(Held { shard, slot })
    }

    /// Whether `q` is held.
    pub(super) fn contains_key(&self, q: &Q) -> bool {
        self.get(q).is_some()
    }

    /// Runs `f` on the state of `q` under its shard's write lock, with `true` when `q` was
    /// not held and has just been inserted with the default state; `None` (and no change)
    /// when the shard has no slot number left (2^32 slots).
    pub(super) fn insert_with<R>(&self, q: Q, f: impl FnOnce(&S, bool) -> R) -> Option<R> {
        let (hash, lock) = self.shard(&q);
        let mut guard = write(lock);
        let Shard {
            index,
            forms,
            states,
            slots,
            free,
        } = &mut *guard;
        if let Some(&slot) = index.find(hash, |&slot| at(forms, slot) == Some(&q)) {
            return at(states, slot).map(|state| f(state, false));
        }
        let slot = if let Some(slot) = free.pop() {
            let (chunk, at) = place(slot);
            if let Some(form) = forms.get_mut(chunk).and_then(|c| c.get_mut(at)) {
                *form = q;
            }
            if let Some(state) = states.get_mut(chunk).and_then(|c| c.get_mut(at)) {
                *state = S::default();
            }
            slot
        } else {
            let slot = u32::try_from(*slots).ok()?;
            if *slots % CHUNK == 0 {
                forms.push(Vec::with_capacity(CHUNK));
                states.push(Vec::with_capacity(CHUNK));
            }
            // The last chunks have room: a new pair was pushed at every multiple of CHUNK.
            if let (Some(f), Some(s)) = (forms.last_mut(), states.last_mut()) {
                f.push(q);
                s.push(S::default());
            }
            *slots += 1;
            slot
        };
        let hasher = &self.hasher;
        index.insert_unique(hash, slot, |&slot| {
            at(forms, slot).map_or(0, |form| hasher.hash_one(form))
        });
        at(states, slot).map(|state| f(state, true))
    }

    /// Removes `q`, answering its form and state.
    pub(super) fn remove(&self, q: &Q) -> Option<(Q, S)> {
        let (hash, lock) = self.shard(q);
        let mut guard = write(lock);
        let Shard {
            index,
            forms,
            states,
            free,
            ..
        } = &mut *guard;
        let entry = index
            .find_entry(hash, |&slot| at(forms, slot) == Some(q))
            .ok()?;
        let (slot, _) = entry.remove();
        free.push(slot);
        let (chunk, at) = place(slot);
        let state = states.get_mut(chunk)?.get_mut(at)?;
        Some((*q, std::mem::take(state)))
    }

    /// Keeps the keys whose state passes `keep`; answers how many went.
    pub(super) fn retain(&self, keep: impl Fn(&S) -> bool) -> usize {
        let mut removed = 0;
        for lock in &self.shards {
            let mut guard = write(lock);
            let Shard {
                index,
                states,
                free,
                ..
            } = &mut *guard;
            index.retain(|&mut slot| {
                let (chunk, at) = place(slot);
                let Some(state) = states.get_mut(chunk).and_then(|c| c.get_mut(at)) else {
                    return false;
                };
                if keep(state) {
                    return true;
                }
                *state = S::default();
                free.push(slot);
                removed += 1;
                false
            });
        }
        removed
    }

    /// Keys held.
    pub(super) fn len(&self) -> usize {
        self.shards.iter().map(|lock| read(lock).index.len()).sum()
    }

    /// Bytes of the tables (buckets with their control bytes) and of the slabs (chunks and
    /// free lists), for the tests of the bytes per key.
    #[cfg(test)]
    pub(super) fn bytes(&self) -> (usize, usize) {
        let (mut table, mut slab) = (0, 0);
        for lock in &self.shards {
            let shard = read(lock);
            if shard.index.capacity() > 0 {
                let buckets = (shard.index.capacity() / 7 * 8).next_power_of_two();
                table += buckets * (std::mem::size_of::<u32>() + 1);
            }
            let per_slot = std::mem::size_of::<Q>() + std::mem::size_of::<S>();
            slab += shard.forms.len() * CHUNK * per_slot
                + shard.free.capacity() * std::mem::size_of::<u32>();
        }
        (table, slab)
    }

    /// Shards, for the tests.
    #[cfg(test)]
    pub(super) fn shards(&self) -> usize {
        self.shards.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    // A fixed seed: every run builds the same tables (a random one moves the worst counts).
    type Map = Slab<[u8; 28], AtomicU64, foldhash::fast::FixedState>;

    fn form(i: u64) -> [u8; 28] {
        let mut f = [b'k'; 28];
        f[..8].copy_from_slice(&i.to_le_bytes());
        f
    }

    fn value(map: &Map, i: u64) -> Option<u64> {
        map.get(&form(i)).map(|s| s.load(Ordering::Relaxed))
    }

    #[test]
    fn keys_keep_their_own_state_through_removals_and_reused_slots() {
        let map = Map::with_hasher(&foldhash::fast::FixedState::with_seed(
            0x7261_7465_6b65_6570,
        ));
        let n = 3 * CHUNK as u64 + 5;
        for i in 0..n {
            let inserted = map.insert_with(form(i), |s, new| {
                s.store(i, Ordering::Relaxed);
                new
            });
            assert_eq!(inserted, Some(true));
        }
        assert_eq!(map.insert_with(form(7), |_, new| new), Some(false));
        assert_eq!(map.len(), n as usize);
        // Every other key goes; the rest keep their values.
        let removed = map.retain(|s| s.load(Ordering::Relaxed) % 2 == 1);
        assert_eq!(removed, n.div_ceil(2) as usize);
        assert_eq!(map.remove(&form(1)).map(|(_, s)| s.into_inner()), Some(1));
        assert!(map.remove(&form(1)).is_none());
        for i in 0..n {
            let want = (i % 2 == 1 && i != 1).then_some(i);
            assert_eq!(value(&map, i), want, "key {i}");
            assert_eq!(map.contains_key(&form(i)), want.is_some());
        }
        // New keys take the freed slots (no new chunk) and start from the default state.
        let (_, slab) = map.bytes();
        for i in n..n + n / 2 {
            assert_eq!(
                map.insert_with(form(i), |s, _| s.load(Ordering::Relaxed)),
                Some(0)
            );
            map.insert_with(form(i), |s, _| s.store(i, Ordering::Relaxed));
        }
        assert_eq!(map.bytes().1, slab);
        for i in 0..n + n / 2 {
            let want = ((i % 2 == 1 && i != 1) || i >= n).then_some(i);
            assert_eq!(value(&map, i), want, "key {i}");
        }
    }

    #[test]
    fn a_28_byte_form_costs_36_bytes_of_slab_and_at_most_9_of_table_per_key() {
        // 28-byte forms and 8-byte states: 36 bytes per key in the slabs, plus at most one
        // partly filled chunk per shard; the staggered tables of 5-byte buckets cost 7.5 to
        // 9 bytes per key (1.5 to 1.8 buckets per key, as in `staggered`).
        let map = Map::with_hasher(&foldhash::fast::FixedState::with_seed(
            0x7261_7465_6b65_6570,
        ));
        let slack = map.shards() * CHUNK * 36;
        let (mut worst_table, mut worst_slab) = (0f64, 0f64);
        for i in 0..300_000u64 {
            map.insert_with(form(i), |_, _| ());
            let keys = i as usize + 1;
            if keys >= 100_000 && keys % 5_000 == 0 {
                let (table, slab) = map.bytes();
                assert!(
                    slab <= 36 * keys + slack,
                    "{slab} bytes of slab for {keys} keys"
                );
                #[allow(clippy::cast_precision_loss)]
                let (table, slab) = (table as f64 / keys as f64, slab as f64 / keys as f64);
                worst_table = worst_table.max(table);
                worst_slab = worst_slab.max(slab);
            }
        }
        assert!(
            worst_table <= 9.0,
            "table: up to {worst_table:.2} bytes per key"
        );
        assert!(worst_slab >= 36.0, "slab: {worst_slab:.2} bytes per key");
    }
}
