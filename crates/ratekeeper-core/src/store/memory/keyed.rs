//! The per-policy key map of the [`MemoryStore`](super::MemoryStore): per-key state in one
//! [`DashMap`] per lane (the compact key forms of `compact`), insertion only when a request
//! changes state, amortised sweeping of idle keys, the optional cap on keys (over all lanes)
//! with its shared overflow state, and the metrics of all three.

use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use metrics::{Counter, Gauge};

use crate::algorithm::{
    Concurrency, FixedWindow, Gcra, KeyedAlgorithm, LeakyBucket, Reserved, SlidingLog,
    SlidingWindow,
};
use crate::store::Receipt;
use crate::{Algorithm, Decision, Policy};

use super::compact::{Lane, Wide, lane};
use super::staggered::Staggered;

/// The map hasher (a type parameter of [`Keyed`] so tests can force equal hashes).
pub(super) type Hasher = foldhash::fast::RandomState;

/// Sweeps never run before this many new keys were inserted since the last one.
const MIN_SWEEP_INSERTS: usize = 4_096;

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
            Algorithm::FixedWindow => {
                Slot::FixedWindow(Keyed::new(FixedWindow::new(quota), name, max_keys))
            }
            Algorithm::SlidingLog => {
                Slot::SlidingLog(Keyed::new(SlidingLog::new(quota), name, max_keys))
            }
            Algorithm::SlidingWindow => {
                Slot::SlidingWindow(Keyed::new(SlidingWindow::new(quota), name, max_keys))
            }
            Algorithm::Concurrency => {
                Slot::Concurrency(Keyed::new(Concurrency::new(quota), name, max_keys))
            }
        }
    }
}

/// The key maps of one policy, one per lane (see `compact`): each holds its keys in the
/// smallest form that keeps them whole. The fixed-size lanes are [`Staggered`], so their
/// bytes per key do not swing with the key count.
pub(super) struct Maps<K, S, H = Hasher> {
    v4: Staggered<u64, S, H>,
    p64: Staggered<u64, S, H>,
    v6: Staggered<Wide, S, H>,
    v6net: Staggered<Wide, S, H>,
    short: Staggered<Wide, S, H>,
    long: DashMap<Box<str>, S, H>,
    full: DashMap<K, S, H>,
}

impl<K: Hash + Eq, S, H: BuildHasher + Clone> Maps<K, S, H> {
    fn with_hasher(hasher: &H) -> Self {
        Self {
            v4: Staggered::with_hasher(hasher),
            p64: Staggered::with_hasher(hasher),
            v6: Staggered::with_hasher(hasher),
            v6net: Staggered::with_hasher(hasher),
            short: Staggered::with_hasher(hasher),
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
        words + wides + self.long.len() + self.full.len()
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
        words + wides + go(&self.long, &keep) + go(&self.full, &keep)
    }
}

/// Runs `$body` with `$map` bound to the lane map of `$key`, `$q` to its compact form (a
/// borrow the map can look up) and `$own` to a closure making the owned map key.
macro_rules! on_lane {
    ($maps:expr, $key:expr, |$map:ident, $q:ident, $own:ident| $body:expr) => {
        match lane($key) {
            Lane::V4(x) => {
                let ($map, $q, $own) = ($maps.v4.part(&x), &x, || x);
                $body
            }
            Lane::P64(x) => {
                let ($map, $q, $own) = ($maps.p64.part(&x), &x, || x);
                $body
            }
            Lane::V6(x) => {
                let ($map, $q, $own) = ($maps.v6.part(&x), &x, || x);
                $body
            }
            Lane::V6Net(x) => {
                let ($map, $q, $own) = ($maps.v6net.part(&x), &x, || x);
                $body
            }
            Lane::Short(x) => {
                let ($map, $q, $own) = ($maps.short.part(&x), &x, || x);
                $body
            }
            Lane::Long(s) => {
                let ($map, $q, $own) = (&$maps.long, s, || Box::<str>::from(s));
                $body
            }
            Lane::Full(k) => {
                let ($map, $q, $own) = (&$maps.full, k, || k.clone());
                $body
            }
        }
    };
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
        on_lane!(self.map, key, |map, q, own| {
            if let Some(state) = map.get(q) {
                return self.algorithm.check(&state, now, cost);
            }
            self.check_new(map, own, now, cost)
        })
    }

    /// [`Keyed::check`] for a key not held: inserts it only when the request changes state,
    /// into the overflow state when `max_keys` are held and no idle key can go.
    #[inline(never)]
    fn check_new<Q: Hash + Eq>(
        &self,
        map: &DashMap<Q, A::State, H>,
        own: impl FnOnce() -> Q,
        now: u64,
        cost: u64,
    ) -> (Decision, Receipt) {
        // An unseen key behaves as absent; insert only when the request changes state.
        let absent = A::State::default();
        let probe = self.algorithm.peek(&absent, now, cost);
        if probe.is_denied() || cost == 0 {
            return (probe, Receipt::NONE);
        }
        if !self.take_room() {
            // Full: make room by evicting idle keys (amortised like every sweep), else the
            // key shares the overflow state, so limiting never stops.
            self.after_insert(now);
            if !self.take_room() {
                self.overflowed.fetch_add(1, Ordering::Relaxed);
                self.overflow_counter
                    .get_or_init(
                        || metrics::counter!(OVERFLOWED_TOTAL, "policy" => self.name.to_string()),
                    )
                    .increment(1);
                return self.algorithm.check(&self.overflow, now, cost);
            }
        }
        let decision = match map.entry(own()) {
            Entry::Occupied(state) => {
                // Another thread inserted it meanwhile.
                self.release(1);
                self.algorithm.check(state.get(), now, cost)
            }
            Entry::Vacant(vacant) => {
                let state = vacant.insert(A::State::default());
                self.keys_gauge().increment(1.0);
                self.algorithm.check(&state, now, cost)
            }
        };
        self.after_insert(now);
        decision
    }

    /// A reservation for a stored key; an unseen key is absent, where a reservation is a
    /// check (no wait), so it goes through [`Keyed::check`] (with its insertion and overflow
    /// handling).
    pub(super) fn reserve(&self, key: &K, now: u64, cost: u64, max_wait: u64) -> Reserved {
        let held = on_lane!(self.map, key, |map, q, _own| map
            .get(q)
            .map(|state| self.algorithm.reserve(&state, now, cost, max_wait)));
        if let Some(reserved) = held {
            return reserved;
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
    /// charge: the key's own; for a key not held, the shared overflow state while `max_keys`
    /// keys are held (where [`Keyed::check`] would send it), otherwise "absent".
    pub(super) fn peek(&self, key: &K, now: u64, cost: u64) -> Decision {
        let held = on_lane!(self.map, key, |map, q, _own| map
            .get(q)
            .map(|state| self.algorithm.peek(&state, now, cost)));
        if let Some(decision) = held {
            return decision;
        }
        if self.held.load(Ordering::Acquire) >= self.max_keys {
            self.algorithm.peek(&self.overflow, now, cost)
        } else {
            self.algorithm.peek(&A::State::default(), now, cost)
        }
    }

    /// Gives back what the charge of `cost` with `receipt` still holds (nothing for
    /// [`Receipt::NONE`]): on the key's state, or on the overflow state when the key is not
    /// held (the charge went there), under the same rules.
    pub(super) fn refund(&self, key: &K, now: u64, cost: u64, receipt: Receipt) {
        let Some(stamp) = receipt.stamp() else {
            return;
        };
        let found = on_lane!(self.map, key, |map, q, _own| match map.get(q) {
            Some(state) => {
                self.algorithm.refund(&state, now, cost, stamp);
                true
            }
            None => false,
        });
        if !found && !self.algorithm.is_idle(&self.overflow, now) {
            self.algorithm.refund(&self.overflow, now, cost, stamp);
        }
    }

    /// Forgets `key`.
    pub(super) fn remove(&self, key: &K) {
        let removed = on_lane!(self.map, key, |map, q, _own| map.remove(q).is_some());
        if removed {
            self.release(1);
            self.keys_gauge().decrement(1.0);
        }
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
            .min(self.max_keys.div_ceil(2));
        if inserted >= threshold {
            self.sweep(now);
        }
    }

    /// Removes idle keys. Single-flight: a sweep already running makes this a no-op.
    pub(super) fn sweep(&self, now: u64) {
        if self.sweeping.swap(true, Ordering::Acquire) {
            return;
        }
        let removed = self.map.retain(|state| !self.algorithm.is_idle(state, now));
        self.release(removed);
        if removed > 0 {
            // Precision: a gauge is an f64; key counts stay far below 2^53.
            #[allow(clippy::cast_precision_loss)]
            self.keys_gauge().decrement(removed as f64);
            metrics::counter!(EVICTED_TOTAL, "policy" => self.name.to_string())
                .increment(removed as u64);
        }
        self.kept_by_last_sweep
            .store(self.map.len(), Ordering::Relaxed);
        self.inserts_since_sweep.store(0, Ordering::Relaxed);
        self.sweeping.store(false, Ordering::Release);
    }
}
