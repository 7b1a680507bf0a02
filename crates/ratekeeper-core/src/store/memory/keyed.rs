//! The per-policy key map of the [`MemoryStore`](super::MemoryStore): per-key state in one
//! map per lane (the compact key forms of `compact`; a [`DashMap`], or the `ascii` lane's
//! slabs of `slab`), insertion only when a request
//! changes state, amortised sweeping of idle keys, the optional cap on keys (over all lanes)
//! with its shared overflow state, the fences of reset keys, and the metrics of all of them.
//!
//! # Which state a receipt belongs to
//!
//! A refund gives back only what its own charge still holds, so it must land on the state
//! the charge was made on, in the same life. Three things start a new life of a key's
//! state, and each is told apart without a byte more per key or an instruction more on
//! the check of a held key:
//!
//! - **Overflow.** A charge on the shared overflow state has a receipt whose stamp has bit
//!   63 set ([`OVERFLOW_BIT`]); its refund goes to the overflow state whatever the key holds
//!   now. A receipt without it belongs to the key's own state, and gives back nothing when
//!   the key holds none. Stamps of the key's own state reach bit 63 only past 2^63 ns
//!   (292 years) of clock, or a tolerance that long: a refund that cannot tell the two
//!   apart then gives back nothing.
//! - **Eviction.** Only a state no receipt can take anything from goes (`is_idle`), so a
//!   receipt of an evicted state finds nothing in the next one. For GCRA and the leaky
//!   bucket, a refund of a charge other than the latest pulls the TAT below the stamps of
//!   later charges (by less than `tau`); for `tau` after such a refund in a policy, its
//!   sweeps evict only buckets full for `tau` (`is_idle_strict`).
//! - **Reset.** [`Keyed::reset`] puts the key behind a fence: its new state runs in time
//!   shifted forward (by a whole number of windows for the window algorithms, so decisions
//!   are the same), so every stamp it hands out is larger than any stamp handed out before
//!   the reset, and a receipt at or below the fence's boundary gives back nothing. The
//!   fence goes (and the key returns to its lane) once both lives' stamps are stale in real
//!   time; checks of a fenced key take the slow path meanwhile.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use metrics::{Counter, Gauge};

use crate::algorithm::{
    Concurrency, FixedWindow, Gcra, KeyedAlgorithm, LeakyBucket, Reserved, SlidingLog,
    SlidingWindow, lock,
};
use crate::store::Receipt;
use crate::{Algorithm, Decision, Policy};

use super::compact::{Lane, Packed, Wide, lane};
use super::slab::Slab;
use super::staggered::Staggered;

/// The map hasher (a type parameter of [`Keyed`] so tests can force equal hashes).
pub(super) type Hasher = foldhash::fast::RandomState;

/// Sweeps never run before this many new keys were inserted since the last one.
const MIN_SWEEP_INSERTS: usize = 4_096;

/// With `max_keys` set, sweeps to make room run at most once per this many new keys (or
/// overflowed decisions), however small the cap: a sweep visits every shard of every lane
/// (a few hundred locks), so this keeps its share of a check small.
const MIN_CAPPED_SWEEP_INSERTS: usize = 256;

/// Bit 63 of a receipt's stamp: the charge was made on the shared overflow state.
pub(super) const OVERFLOW_BIT: u64 = 1 << 63;

/// The [`metrics`] counter of decisions made on a policy's shared overflow state (label
/// `policy`).
pub(super) const OVERFLOWED_TOTAL: &str = "ratekeeper_memory_store_overflowed_total";
/// The [`metrics`] gauge of the keys a policy holds (label `policy`).
pub(super) const KEYS: &str = "ratekeeper_memory_store_keys";
/// The [`metrics`] counter of idle keys swept away (label `policy`).
pub(super) const EVICTED_TOTAL: &str = "ratekeeper_memory_store_evicted_total";

/// One registered policy's key map, whatever its algorithm.
pub(super) enum Slot<K> {
    Gcra(Keyed<K, Gcra>),
    LeakyBucket(Keyed<K, LeakyBucket>),
    FixedWindow(Keyed<K, FixedWindow>),
    SlidingLog(Keyed<K, SlidingLog>),
    SlidingWindow(Keyed<K, SlidingWindow>),
    Concurrency(Keyed<K, Concurrency>),
}

/// Runs `$body` with `$k` bound to the slot's `Keyed<K, A>`, whatever the algorithm.
macro_rules! with_keyed {
    ($slot:expr, $k:ident => $body:expr) => {
        match $slot {
            Slot::Gcra($k) => $body,
            Slot::LeakyBucket($k) => $body,
            Slot::FixedWindow($k) => $body,
            Slot::SlidingLog($k) => $body,
            Slot::SlidingWindow($k) => $body,
            Slot::Concurrency($k) => $body,
        }
    };
}
pub(super) use with_keyed;

impl<K: Hash + Eq + Clone + 'static> Slot<K> {
    /// The key map of `policy`, holding at most `max_keys` keys.
    pub(super) fn new(policy: &Policy, max_keys: usize) -> Self {
        let quota = policy.quota();
        let name = policy.name();
        match policy.algorithm() {
            Algorithm::Gcra => Slot::Gcra(Keyed::new(Gcra::new(quota), name, max_keys)),
            Algorithm::LeakyBucket => {
                Slot::LeakyBucket(Keyed::new(LeakyBucket::new(quota), name, max_keys))
            }
            Algorithm::FixedWindow => Slot::FixedWindow(Keyed::new(
                FixedWindow::new(quota).keeping_debt(),
                name,
                max_keys,
            )),
            Algorithm::SlidingLog => {
                Slot::SlidingLog(Keyed::new(SlidingLog::new(quota), name, max_keys))
            }
            Algorithm::SlidingWindow => Slot::SlidingWindow(Keyed::new(
                SlidingWindow::new(quota).keeping_debt(),
                name,
                max_keys,
            )),
            Algorithm::Concurrency => {
                Slot::Concurrency(Keyed::new(Concurrency::new(quota), name, max_keys))
            }
        }
    }
}

/// The key maps of one policy, one per lane (see `compact`): each holds its keys in the
/// smallest form that keeps them whole. The fixed-size lanes are [`Staggered`], so their
/// bytes per key do not swing with the key count; the `ascii` lane is a [`Slab`].
pub(super) struct Maps<K, S, H = Hasher> {
    v4: Staggered<u64, S, H>,
    p64: Staggered<u64, S, H>,
    v6: Staggered<Wide, S, H>,
    v6net: Staggered<Wide, S, H>,
    short: Staggered<Wide, S, H>,
    ascii: Slab<Packed, S, H>,
    long: DashMap<Box<str>, S, H>,
    full: DashMap<K, S, H>,
}

impl<K: Hash + Eq, S: Default, H: BuildHasher + Clone> Maps<K, S, H> {
    fn with_hasher(hasher: &H) -> Self {
        Self {
            v4: Staggered::with_hasher(hasher),
            p64: Staggered::with_hasher(hasher),
            v6: Staggered::with_hasher(hasher),
            v6net: Staggered::with_hasher(hasher),
            short: Staggered::with_hasher(hasher),
            ascii: Slab::with_hasher(hasher),
            long: DashMap::with_hasher(hasher.clone()),
            full: DashMap::with_hasher(hasher.clone()),
        }
    }

    /// The dashmaps of the lanes keyed by one word.
    fn word_parts(&self) -> impl Iterator<Item = &DashMap<u64, S, H>> {
        self.v4.parts().iter().chain(self.p64.parts())
    }

    /// The dashmaps of the lanes keyed by two words.
    fn wide_parts(&self) -> impl Iterator<Item = &DashMap<Wide, S, H>> {
        let wide = [&self.v6, &self.v6net, &self.short];
        wide.into_iter().flat_map(Staggered::parts)
    }

    /// Keys held, over all lanes.
    pub(super) fn len(&self) -> usize {
        let words: usize = self.word_parts().map(DashMap::len).sum();
        let wides: usize = self.wide_parts().map(DashMap::len).sum();
        words + wides + self.ascii.len() + self.long.len() + self.full.len()
    }

    /// Keeps the entries whose state passes `keep`; answers how many went.
    fn retain(&self, keep: impl Fn(&S) -> bool) -> usize {
        fn go<Q: Hash + Eq, S, H: BuildHasher + Clone>(
            map: &DashMap<Q, S, H>,
            keep: &impl Fn(&S) -> bool,
        ) -> usize {
            let mut removed = 0;
            map.retain(|_, state| {
                let kept = keep(state);
                removed += usize::from(!kept);
                kept
            });
            removed
        }
        let words: usize = self.word_parts().map(|m| go(m, &keep)).sum();
        let wides: usize = self.wide_parts().map(|m| go(m, &keep)).sum();
        let ascii = self.ascii.retain(&keep);
        words + wides + ascii + go(&self.long, &keep) + go(&self.full, &keep)
    }
}

/// Runs `$body` with `$map` bound to the lane map of `$key`, `$q` to its compact form (a
/// borrow the map can look up), `$own` to a closure making the owned map key and `$fence`
/// to one making its [`FenceKey`] (both capture only what the lookup needs).
macro_rules! on_lane {
    ($maps:expr, $key:expr, |$map:ident, $q:ident, $own:ident, $fence:ident| $body:expr) => {
        match lane($key) {
            Lane::V4(x) => {
                let ($map, $q, $own) = ($maps.v4.part(&x), &x, || x);
                let $fence = || FenceKey::<K>::V4(x);
                $body
            }
            Lane::P64(x) => {
                let ($map, $q, $own) = ($maps.p64.part(&x), &x, || x);
                let $fence = || FenceKey::<K>::P64(x);
                $body
            }
            Lane::V6(x) => {
                let ($map, $q, $own) = ($maps.v6.part(&x), &x, || x);
                let $fence = || FenceKey::<K>::V6(x);
                $body
            }
            Lane::V6Net(x) => {
                let ($map, $q, $own) = ($maps.v6net.part(&x), &x, || x);
                let $fence = || FenceKey::<K>::V6Net(x);
                $body
            }
            Lane::Short(x) => {
                let ($map, $q, $own) = ($maps.short.part(&x), &x, || x);
                let $fence = || FenceKey::<K>::Short(x);
                $body
            }
            Lane::Ascii(x) => {
                let ($map, $q, $own) = (&$maps.ascii, &x, || x);
                let $fence = || FenceKey::<K>::Ascii(x);
                $body
            }
            Lane::Long(s) => {
                let ($map, $q, $own) = (&$maps.long, s, || Box::<str>::from(s));
                let $fence = || FenceKey::<K>::Long(Box::<str>::from(s));
                $body
            }
            Lane::Full(k) => {
                let ($map, $q, $own) = (&$maps.full, k, || k.clone());
                let $fence = || FenceKey::<K>::Full(k.clone());
                $body
            }
        }
    };
}

/// A key as the fences of reset keys hold it: its lane and compact form, owned.
#[derive(PartialEq, Eq, Hash)]
enum FenceKey<K> {
    V4(u64),
    P64(u64),
    V6(Wide),
    V6Net(Wide),
    Short(Wide),
    Ascii(Packed),
    Long(Box<str>),
    Full(K),
}

impl<K: Clone + 'static> FenceKey<K> {
    fn of(key: &K) -> Self {
        match lane(key) {
            Lane::V4(x) => FenceKey::V4(x),
            Lane::P64(x) => FenceKey::P64(x),
            Lane::V6(x) => FenceKey::V6(x),
            Lane::V6Net(x) => FenceKey::V6Net(x),
            Lane::Short(x) => FenceKey::Short(x),
            Lane::Ascii(x) => FenceKey::Ascii(x),
            Lane::Long(s) => FenceKey::Long(s.into()),
            Lane::Full(k) => FenceKey::Full(k.clone()),
        }
    }
}

/// The insertion of a new key into a lane's map, for [`Keyed::check_new`] and [`Keyed::debit`].
trait Insert<Q, S> {
    /// Runs `f` on the state of `q` under the map's write lock, with `true` when `q` was not
    /// held and has just been inserted with the default state; `None` when the map has no
    /// room for `q`.
    fn insert_with<R>(&self, q: Q, f: impl FnOnce(&S, bool) -> R) -> Option<R>;
}

impl<Q: Hash + Eq, S: Default, H: BuildHasher + Clone> Insert<Q, S> for DashMap<Q, S, H> {
    fn insert_with<R>(&self, q: Q, f: impl FnOnce(&S, bool) -> R) -> Option<R> {
        Some(match self.entry(q) {
            Entry::Occupied(state) => f(state.get(), false),
            Entry::Vacant(vacant) => f(&vacant.insert(S::default()), true),
        })
    }
}

impl<S: Default, H: BuildHasher> Insert<Packed, S> for Slab<Packed, S, H> {
    fn insert_with<R>(&self, q: Packed, f: impl FnOnce(&S, bool) -> R) -> Option<R> {
        Slab::insert_with(self, q, f)
    }
}

/// The keys of one policy and their state under its algorithm.
pub(super) struct Keyed<K, A: KeyedAlgorithm, H = Hasher> {
    algorithm: A,
    /// The policy's name, the `policy` label of the metrics.
    name: Arc<str>,
    /// Metric handles, registered with the recorder on first use.
    keys_gauge: OnceLock<Gauge>,
    overflow_counter: OnceLock<Counter>,
    pub(super) map: Maps<K, A::State, H>,
    /// Entries in `map` plus insertions in progress; never above `max_keys`.
    held: AtomicUsize,
    pub(super) max_keys: usize,
    /// The state every new key shares while `map` is full.
    overflow: A::State,
    pub(super) overflowed: AtomicU64,
    inserts_since_sweep: AtomicUsize,
    kept_by_last_sweep: AtomicUsize,
    sweeping: AtomicBool,
    /// Reset keys whose new state runs behind a fence (see the module docs).
    fences: Mutex<HashMap<FenceKey<K>, Fence<A::State>>>,
    /// Entries in `fences` (plus one while a reset is adding one), read without the lock.
    fenced: AtomicUsize,
    /// The largest stamp a reservation booked beyond the tolerance (0: none).
    max_booked: AtomicU64,
    /// Until this time, sweeps evict by `is_idle_strict` (see the module docs).
    strict_until: AtomicU64,
    /// Sweeps run (tests count them).
    #[cfg(test)]
    pub(super) sweeps: AtomicUsize,
}

/// A reset key's state (see the module docs): it decides at `now + shift`, so every stamp
/// it hands out is above `boundary`, the largest stamp any earlier life handed out.
struct Fence<S> {
    state: S,
    shift: u64,
    boundary: u64,
    /// The largest stamp handed out for the key in any life (it goes when this is stale).
    bound: u64,
    /// Concurrency permits taken before the reset and not yet released (their releases
    /// give back nothing).
    old_permits: u64,
}

impl<K: Hash + Eq + Clone + 'static, A: KeyedAlgorithm> Keyed<K, A> {
    fn new(algorithm: A, name: &str, max_keys: usize) -> Self {
        Self::with_hasher(algorithm, name, max_keys, &Hasher::default())
    }
}

impl<K: Hash + Eq + Clone + 'static, A: KeyedAlgorithm, H: BuildHasher + Clone> Keyed<K, A, H> {
    pub(super) fn with_hasher(algorithm: A, name: &str, max_keys: usize, hasher: &H) -> Self {
        // Announce the policy's counters at 0 (a Prometheus series should exist before its
        // first event, so `rate()` and alerts see it); a no-op without a recorder installed.
        metrics::counter!(EVICTED_TOTAL, "policy" => name.to_owned()).increment(0);
        metrics::counter!(OVERFLOWED_TOTAL, "policy" => name.to_owned()).increment(0);
        Self {
            algorithm,
            name: name.into(),
            keys_gauge: OnceLock::new(),
            overflow_counter: OnceLock::new(),
            map: Maps::with_hasher(hasher),
            held: AtomicUsize::new(0),
            max_keys,
            overflow: A::State::default(),
            overflowed: AtomicU64::new(0),
            inserts_since_sweep: AtomicUsize::new(0),
            kept_by_last_sweep: AtomicUsize::new(0),
            sweeping: AtomicBool::new(false),
            fences: Mutex::new(HashMap::new()),
            fenced: AtomicUsize::new(0),
            max_booked: AtomicU64::new(0),
            strict_until: AtomicU64::new(0),
            #[cfg(test)]
            sweeps: AtomicUsize::new(0),
        }
    }

    /// Takes room for one new key; false when `max_keys` are held.
    fn take_room(&self) -> bool {
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max_keys).then_some(n + 1)
            })
            .is_ok()
    }

    fn release(&self, n: usize) {
        let _ = self
            .held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                Some(held.saturating_sub(n))
            });
    }

    /// Decides and charges `cost` to `key`; the receipt says what the charge took.
    #[inline(always)]
    pub(super) fn check(&self, key: &K, now: u64, cost: u64) -> (Decision, Receipt) {
        on_lane!(self.map, key, |map, q, own, fence| {
            if let Some(state) = map.get(q) {
                return self.algorithm.check(&state, now, cost);
            }
            self.check_new(map, own, fence, now, cost)
        })
    }

    /// Whether `key` holds its own state (in its lane, or behind a fence).
    pub(super) fn holds(&self, key: &K) -> bool {
        on_lane!(self.map, key, |map, q, _own, _fence| map.contains_key(q))
            || (self.fenced.load(Ordering::Acquire) != 0
                && lock(&self.fences).contains_key(&FenceKey::of(key)))
    }

    /// [`Keyed::check`] for a key not in its lane: a fenced key's state; otherwise inserts
    /// the key only when the request changes state, into the overflow state when `max_keys`
    /// are held and no idle key can go. A request that charges nothing (cost 0, a cost that
    /// can never fit) reports the state a charge would go to, as [`Keyed::peek`] does.
    #[inline(never)]
    fn check_new<Q>(
        &self,
        map: &impl Insert<Q, A::State>,
        own: impl FnOnce() -> Q,
        fence: impl FnOnce() -> FenceKey<K>,
        now: u64,
        cost: u64,
    ) -> (Decision, Receipt) {
        if self.fenced.load(Ordering::Acquire) != 0 {
            if let Some(answer) = self.check_fenced(&fence(), now, cost) {
                return answer;
            }
        }
        // An unseen key behaves as absent; insert only when the request changes state.
        let absent = A::State::default();
        let probe = self.algorithm.peek(&absent, now, cost);
        if probe.is_denied() || cost == 0 {
            if self.is_full() {
                return (
                    self.algorithm.peek(&self.overflow, now, cost),
                    Receipt::NONE,
                );
            }
            return (probe, Receipt::NONE);
        }
        if !self.take_room() {
            // Full: make room by evicting idle keys (amortised like every sweep), else the
            // key shares the overflow state, so limiting never stops.
            self.after_insert(now);
            if !self.take_room() {
                return self.check_overflow(now, cost);
            }
        }
        let decision = map.insert_with(own(), |state, inserted| {
            if inserted {
                self.keys_gauge().increment(1.0);
            } else {
                // Another thread inserted it meanwhile.
                self.release(1);
            }
            self.algorithm.check(state, now, cost)
        });
        let Some(decision) = decision else {
            // The lane has no room left for the key (2^32 keys in one slab shard).
            self.release(1);
            return self.check_overflow(now, cost);
        };
        self.after_insert(now);
        decision
    }

    /// A charge on the shared overflow state, counted.
    fn check_overflow(&self, now: u64, cost: u64) -> (Decision, Receipt) {
        self.overflowed.fetch_add(1, Ordering::Relaxed);
        self.overflow_counter
            .get_or_init(|| metrics::counter!(OVERFLOWED_TOTAL, "policy" => self.name.to_string()))
            .increment(1);
        let (decision, receipt) = self.algorithm.check(&self.overflow, now, cost);
        (decision, overflow_receipt(receipt))
    }

    /// Whether `max_keys` keys are held (a new key's charge would go to the overflow state,
    /// unless a sweep makes room).
    fn is_full(&self) -> bool {
        self.held.load(Ordering::Acquire) >= self.max_keys
    }

    /// A check of a fenced key, or `None` when `key` has no fence (or its fence just went).
    #[cold]
    fn check_fenced(&self, key: &FenceKey<K>, now: u64, cost: u64) -> Option<(Decision, Receipt)> {
        let mut fences = lock(&self.fences);
        let fence = fences.get_mut(key)?;
        if self.fence_is_done(fence, now) {
            fences.remove(key);
            self.unfence(1);
            return None;
        }
        let (decision, receipt) =
            self.algorithm
                .check(&fence.state, now.saturating_add(fence.shift), cost);
        if let Some(stamp) = receipt.stamp() {
            fence.bound = fence.bound.max(stamp);
        }
        Some((decision, own_receipt(receipt)))
    }

    /// A reservation of a fenced key, or `None` when `key` has no fence (or its fence just
    /// went).
    #[cold]
    fn reserve_fenced(
        &self,
        key: &FenceKey<K>,
        now: u64,
        cost: u64,
        max_wait: u64,
    ) -> Option<Reserved> {
        let mut fences = lock(&self.fences);
        let fence = fences.get_mut(key)?;
        if self.fence_is_done(fence, now) {
            fences.remove(key);
            self.unfence(1);
            return None;
        }
        let mut reserved = self.algorithm.reserve(
            &fence.state,
            now.saturating_add(fence.shift),
            cost,
            max_wait,
        );
        if let Some(stamp) = reserved.receipt.stamp() {
            fence.bound = fence.bound.max(stamp);
        }
        reserved.receipt = own_receipt(reserved.receipt);
        Some(reserved)
    }

    /// Whether a fence can go: its state is idle and no stamp of any life of the key can
    /// take anything from a state created now (concurrency: every permit is back).
    fn fence_is_done(&self, fence: &Fence<A::State>, now: u64) -> bool {
        fence.old_permits == 0
            && self
                .algorithm
                .is_idle(&fence.state, now.saturating_add(fence.shift))
            && self.algorithm.stale(fence.bound, now)
    }

    /// `n` fences went: their keys no longer hold state.
    fn unfence(&self, n: usize) {
        self.fenced.fetch_sub(n, Ordering::AcqRel);
        self.release(n);
        // Precision: a gauge is an f64; key counts stay far below 2^53.
        #[allow(clippy::cast_precision_loss)]
        self.keys_gauge().decrement(n as f64);
    }

    /// A reservation for a key holding state (in its lane or behind its fence); an unseen
    /// key is absent, where a reservation is a check (no wait), so it goes through
    /// [`Keyed::check`] (with its insertion and overflow handling).
    pub(super) fn reserve(&self, key: &K, now: u64, cost: u64, max_wait: u64) -> Reserved {
        let held = on_lane!(self.map, key, |map, q, _own, _fence| map
            .get(q)
            .map(|state| self.algorithm.reserve(&state, now, cost, max_wait)));
        if let Some(mut reserved) = held {
            if reserved.delay > 0 {
                // Booked beyond the tolerance: a fence set later must clear this stamp.
                if let Some(stamp) = reserved.receipt.stamp() {
                    self.max_booked.fetch_max(stamp, Ordering::AcqRel);
                }
            }
            reserved.receipt = own_receipt(reserved.receipt);
            return reserved;
        }
        if self.fenced.load(Ordering::Acquire) != 0 {
            if let Some(reserved) = self.reserve_fenced(&FenceKey::of(key), now, cost, max_wait) {
                return reserved;
            }
        }
        let (decision, receipt) = self.check(key, now, cost);
        Reserved {
            decision,
            receipt,
            delay: 0,
            exact: false,
        }
    }

    /// The decision for `cost` without charging, read from the state a check of `key` would
    /// charge: the key's own (in its lane or behind its fence); for a key not held, the
    /// shared overflow state while `max_keys` keys are held (where [`Keyed::check`] would
    /// send it), otherwise "absent".
    pub(super) fn peek(&self, key: &K, now: u64, cost: u64) -> Decision {
        let held = on_lane!(self.map, key, |map, q, _own, _fence| map
            .get(q)
            .map(|state| self.algorithm.peek(&state, now, cost)));
        if let Some(decision) = held {
            return decision;
        }
        if self.fenced.load(Ordering::Acquire) != 0 {
            if let Some(fence) = lock(&self.fences).get(&FenceKey::of(key)) {
                return self
                    .algorithm
                    .peek(&fence.state, now.saturating_add(fence.shift), cost);
            }
        }
        if self.is_full() {
            self.algorithm.peek(&self.overflow, now, cost)
        } else {
            self.algorithm.peek(&A::State::default(), now, cost)
        }
    }

    /// Gives back what the charge of `cost` with `receipt` still holds (nothing for
    /// [`Receipt::NONE`]), on the state the charge was made on: the overflow state for a
    /// receipt marked [`OVERFLOW_BIT`]; otherwise the key's own state in the same life (in
    /// its lane; behind its fence when the stamp is above the fence's boundary). A charge
    /// whose state is gone (evicted when idle, or reset) gives back nothing.
    pub(super) fn refund(&self, key: &K, now: u64, cost: u64, receipt: Receipt) {
        self.settle_back(key, now, cost, receipt, false);
    }

    /// [`Keyed::refund`] for a correction's give-back: by
    /// [`KeyedAlgorithm::give_back`], which pays off a debt.
    pub(super) fn give_back(&self, key: &K, now: u64, cost: u64, receipt: Receipt) {
        self.settle_back(key, now, cost, receipt, true);
    }

    /// The algorithm's refund, or its give-back when `correcting`.
    fn back(&self, state: &A::State, now: u64, cost: u64, stamp: u64, correcting: bool) -> bool {
        if correcting {
            self.algorithm.give_back(state, now, cost, stamp)
        } else {
            self.algorithm.refund(state, now, cost, stamp)
        }
    }

    fn settle_back(&self, key: &K, now: u64, cost: u64, receipt: Receipt, correcting: bool) {
        let Some(stamp) = receipt.stamp() else {
            return;
        };
        if stamp & OVERFLOW_BIT != 0 {
            // Unless the key's own stamps can reach bit 63 by now (then the two cannot be
            // told apart, and nothing comes back).
            if now.saturating_add(self.algorithm.headroom()) < OVERFLOW_BIT {
                // The overflow state is never evicted.
                let _ = self.back(&self.overflow, now, cost, stamp & !OVERFLOW_BIT, correcting);
            }
            return;
        }
        let found = on_lane!(self.map, key, |map, q, _own, _fence| match map.get(q) {
            Some(state) => {
                if self.back(&state, now, cost, stamp, correcting) {
                    let until = now.saturating_add(self.algorithm.headroom());
                    self.strict_until.fetch_max(until, Ordering::AcqRel);
                }
                true
            }
            None => false,
        });
        if !found && self.fenced.load(Ordering::Acquire) != 0 {
            self.refund_fenced(key, now, cost, stamp, correcting);
        }
    }

    #[cold]
    fn refund_fenced(&self, key: &K, now: u64, cost: u64, stamp: u64, correcting: bool) {
        let mut fences = lock(&self.fences);
        let Some(fence) = fences.get_mut(&FenceKey::of(key)) else {
            return;
        };
        if stamp > fence.boundary {
            // A fence goes only once every stamp is stale, so what this returns is moot.
            let shifted = now.saturating_add(fence.shift);
            let _ = self.back(&fence.state, shifted, cost, stamp, correcting);
        } else {
            // A charge from before the reset: the reset forgot it; a permit is accounted.
            fence.old_permits -= cost.min(fence.old_permits);
        }
    }

    /// Charges `extra` units to `key` at `now` without refusing (a correction's extra
    /// charge), on the state a check of `key` would charge now: its own (inserted if it
    /// holds none), its fence's, or the overflow state while `max_keys` keys are held.
    pub(super) fn debit(&self, key: &K, now: u64, extra: u64) {
        if extra == 0 {
            return;
        }
        let held = on_lane!(self.map, key, |map, q, _own, _fence| map
            .get(q)
            .map(|state| self.algorithm.debit(&state, now, extra))
            .is_some());
        if !held {
            self.debit_new(key, now, extra);
        }
    }

    /// [`Keyed::debit`] of a key not in its lane (as [`Keyed::check_new`] charges one).
    #[cold]
    #[inline(never)]
    fn debit_new(&self, key: &K, now: u64, extra: u64) {
        if self.fenced.load(Ordering::Acquire) != 0 {
            let mut fences = lock(&self.fences);
            if let Some(fence) = fences.get_mut(&FenceKey::of(key)) {
                let shifted = now.saturating_add(fence.shift);
                self.algorithm.debit(&fence.state, shifted, extra);
                return;
            }
        }
        on_lane!(self.map, key, |map, _q, own, _fence| {
            if !self.take_room() {
                self.after_insert(now);
                if !self.take_room() {
                    self.algorithm.debit(&self.overflow, now, extra);
                    return;
                }
            }
            let debited = map.insert_with(own(), |state, inserted| {
                if inserted {
                    self.keys_gauge().increment(1.0);
                } else {
                    self.release(1);
                }
                self.algorithm.debit(state, now, extra);
            });
            if debited.is_none() {
                // The lane has no room left for the key (2^32 keys in one slab shard).
                self.release(1);
                self.algorithm.debit(&self.overflow, now, extra);
                return;
            }
            self.after_insert(now);
        });
    }

    /// The room in the cap a reset of `key` needs: a key that holds no state while
    /// `max_keys` keys are held would be charged on the shared overflow state, so its reset
    /// gives it a state of its own (a fence), which takes room. `Ok(true)`: room was taken
    /// (pass it to [`Keyed::reset`]); `Ok(false)`: none is needed; `Err(CapFull)`: none is
    /// free even after a sweep (every key held is live), so the key cannot be reset.
    pub(super) fn reset_room(&self, key: &K, now: u64) -> Result<bool, CapFull> {
        if !self.is_full() || self.holds(key) {
            return Ok(false);
        }
        if self.take_room() {
            return Ok(true);
        }
        self.sweep(now);
        if self.take_room() {
            Ok(true)
        } else {
            Err(CapFull)
        }
    }

    /// Gives back room taken by [`Keyed::reset_room`] for a reset that does not happen.
    pub(super) fn release_room(&self) {
        self.release(1);
    }

    /// Forgets `key`'s charges (its next request sees a full budget), fencing its state so
    /// that no receipt handed out before gives back anything after (see the module docs).
    /// With `room` (taken by [`Keyed::reset_room`]), a key that holds no state gets a fresh
    /// one behind a fence, so its next request is not charged on the overflow state; its
    /// earlier charges there stay there (their refunds still go there).
    pub(super) fn reset(&self, key: &K, now: u64, room: bool) {
        let mut fences = lock(&self.fences);
        // Announced before the key leaves its lane, so a concurrent check of it waits for
        // the fence (on the lock) instead of inserting the key again.
        self.fenced.fetch_add(1, Ordering::AcqRel);
        let removed = on_lane!(self.map, key, |map, q, _own, _fence| map
            .remove(q)
            .map(|(_, s)| s));
        let before = self
            .algorithm
            .stamp_bound(now)
            .max(self.max_booked.load(Ordering::Acquire));
        let permits = removed.as_ref().map_or(0, |s| self.algorithm.permits(s));
        let fence_key = FenceKey::of(key);
        if let Some(fence) = fences.get_mut(&fence_key) {
            // Fenced already: a new life behind a higher fence.
            let side = self.algorithm.stamp_bound(now.saturating_add(fence.shift));
            fence.old_permits = fence
                .old_permits
                .saturating_add(self.algorithm.permits(&fence.state))
                .saturating_add(permits);
            fence.bound = fence.bound.max(before).max(side);
            fence.boundary = fence.bound;
            fence.shift = self.algorithm.fence_shift(fence.boundary, now);
            fence.state = A::State::default();
            self.fenced.fetch_sub(1, Ordering::AcqRel);
            if removed.is_some() {
                // A check that raced the first fence put the key back in its lane.
                self.release(1);
                self.keys_gauge().decrement(1.0);
            }
            if room {
                self.release(1);
            }
        } else if removed.is_some() || room {
            // The key's room in the cap passes to the fence: the room it held in its lane,
            // or the room taken for it (one is enough, if a check inserted the key since).
            if removed.is_none() {
                self.keys_gauge().increment(1.0);
            } else if room {
                self.release(1);
            }
            fences.insert(
                fence_key,
                Fence {
                    state: A::State::default(),
                    shift: self.algorithm.fence_shift(before, now),
                    boundary: before,
                    bound: before,
                    old_permits: permits,
                },
            );
        } else {
            // Not held while the cap had room: the key's next request gets a state of its
            // own, as a new key's. Its charges, if any, were on a state that went when idle,
            // or on the overflow state, which stays shared (their refunds still go there).
            self.fenced.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Keys holding state: in the lanes and behind fences.
    pub(super) fn len(&self) -> usize {
        self.map.len() + self.fenced.load(Ordering::Acquire)
    }

    /// The keys-held gauge (see [`KEYS`]).
    fn keys_gauge(&self) -> &Gauge {
        self.keys_gauge
            .get_or_init(|| metrics::gauge!(KEYS, "policy" => self.name.to_string()))
    }

    fn after_insert(&self, now: u64) {
        let inserted = self.inserts_since_sweep.fetch_add(1, Ordering::Relaxed) + 1;
        let threshold = self
            .kept_by_last_sweep
            .load(Ordering::Relaxed)
            .max(MIN_SWEEP_INSERTS)
            .min(self.max_keys.div_ceil(2).max(MIN_CAPPED_SWEEP_INSERTS));
        if inserted >= threshold {
            self.sweep(now);
        }
    }

    /// Removes idle keys, and the fences that can go. Single-flight: a sweep already
    /// running makes this a no-op.
    pub(super) fn sweep(&self, now: u64) {
        if self.sweeping.swap(true, Ordering::Acquire) {
            return;
        }
        #[cfg(test)]
        self.sweeps.fetch_add(1, Ordering::Relaxed);
        let removed = if now < self.strict_until.load(Ordering::Acquire) {
            self.map
                .retain(|state| !self.algorithm.is_idle_strict(state, now))
        } else {
            self.map.retain(|state| !self.algorithm.is_idle(state, now))
        };
        self.release(removed);
        if removed > 0 {
            // Precision: a gauge is an f64; key counts stay far below 2^53.
            #[allow(clippy::cast_precision_loss)]
            self.keys_gauge().decrement(removed as f64);
            metrics::counter!(EVICTED_TOTAL, "policy" => self.name.to_string())
                .increment(removed as u64);
        }
        if self.fenced.load(Ordering::Acquire) != 0 {
            let mut fences = lock(&self.fences);
            let before = fences.len();
            fences.retain(|_, fence| !self.fence_is_done(fence, now));
            let gone = before - fences.len();
            if gone > 0 {
                self.unfence(gone);
            }
        }
        self.kept_by_last_sweep
            .store(self.map.len(), Ordering::Relaxed);
        self.inserts_since_sweep.store(0, Ordering::Relaxed);
        self.sweeping.store(false, Ordering::Release);
    }
}

/// A reset found `max_keys` keys held, none idle, so the key, which holds no state, could
/// not get one of its own (see [`Keyed::reset_room`]).
#[derive(Debug)]
pub(super) struct CapFull;

/// The receipt of a charge on the overflow state: its stamp marked with [`OVERFLOW_BIT`]
/// (nothing to give back for a stamp that already has it: past 2^63 ns).
fn overflow_receipt(receipt: Receipt) -> Receipt {
    match receipt.stamp() {
        Some(stamp) if stamp & OVERFLOW_BIT == 0 => Receipt::new(stamp | OVERFLOW_BIT),
        _ => Receipt::NONE,
    }
}

/// The receipt of a charge on a key's own state, away from the hot path: a stamp with
/// [`OVERFLOW_BIT`] set would read as the overflow state's, so it gives back nothing.
fn own_receipt(receipt: Receipt) -> Receipt {
    match receipt.stamp() {
        Some(stamp) if stamp & OVERFLOW_BIT == 0 => receipt,
        _ => Receipt::NONE,
    }
}
