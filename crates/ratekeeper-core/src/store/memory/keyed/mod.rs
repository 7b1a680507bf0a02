//! The per-policy key map of the [`MemoryStore`](super::MemoryStore): per-key state in one
//! map per lane (the compact key forms of `compact`; a [`DashMap`], or the `ascii` lane's
//! slabs of `slab`; see `lanes`), insertion only when a request changes state, amortised
//! sweeping of idle keys, the optional cap on keys (over all lanes) with its shared
//! overflow state, the fences of reset keys (`fence`), refunds and corrections (`settle`),
//! and the metrics of all of them.
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
//!   receipt of an evicted state finds nothing in the next one.
//! - **Reset.** [`Keyed::reset`] puts the key behind a fence: its new state runs in time
//!   shifted forward (by a whole number of windows for the window algorithms, so decisions
//!   are the same), so every stamp it hands out is larger than any stamp handed out before
//!   the reset, and a receipt at or below the fence's boundary gives back nothing. The
//!   fence goes (and the key returns to its lane) once both lives' stamps are stale in real
//!   time; checks of a fenced key take the slow path meanwhile.
//!
//! # Refunds out of the middle of a schedule
//!
//! A GCRA or leaky-bucket key's state is its TAT, and a charge's stamp the end of its slot.
//! A refund of the latest charge, or of one the bucket drained, is settled on the TAT. A
//! refund out of the middle (an earlier charge, still partly undrained) moves the slots
//! after it up, so their stamps would no longer say where they are: the key leaves its
//! lane for the fence table (`shift`) with its schedule as an explicit FIFO ledger, which
//! knows every live slot and the holes refunds cut, and where each later refund takes out
//! exactly what its own charge still holds. The ledger decides exactly as the TAT would
//! (its TAT is `now` plus its live length). The key goes back to its lane, as a new key,
//! once the ledger is empty and every stamp it handed out is stale (as a fence goes).
//! Keys that never see such a refund never leave their lane: their checks and their bytes
//! are unchanged.

mod fence;
mod lanes;
mod settle;
mod shift;

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use metrics::{Counter, Gauge};

use crate::algorithm::{
    Concurrency, FixedWindow, Gcra, KeyedAlgorithm, LeakyBucket, Reserved, SlidingLog,
    SlidingWindow, lock,
};
use crate::store::Receipt;
use crate::{Algorithm, Decision, Policy};

use self::fence::Fence;
use self::lanes::{FenceKey, Insert, Maps, on_lane};

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
            $crate::store::memory::keyed::Slot::Gcra($k) => $body,
            $crate::store::memory::keyed::Slot::LeakyBucket($k) => $body,
            $crate::store::memory::keyed::Slot::FixedWindow($k) => $body,
            $crate::store::memory::keyed::Slot::SlidingLog($k) => $body,
            $crate::store::memory::keyed::Slot::SlidingWindow($k) => $body,
            $crate::store::memory::keyed::Slot::Concurrency($k) => $body,
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
    /// Settable through a shared handle ([`MemoryStore::with_max_keys`](super::MemoryStore::with_max_keys)).
    pub(super) max_keys: AtomicUsize,
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
    /// Sweeps run (tests count them).
    #[cfg(test)]
    pub(super) sweeps: AtomicUsize,
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
            max_keys: AtomicUsize::new(max_keys),
            overflow: A::State::default(),
            overflowed: AtomicU64::new(0),
            inserts_since_sweep: AtomicUsize::new(0),
            kept_by_last_sweep: AtomicUsize::new(0),
            sweeping: AtomicBool::new(false),
            fences: Mutex::new(HashMap::new()),
            fenced: AtomicUsize::new(0),
            max_booked: AtomicU64::new(0),
            #[cfg(test)]
            sweeps: AtomicUsize::new(0),
        }
    }

    /// Takes room for one new key; false when `max_keys` are held.
    fn take_room(&self) -> bool {
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max_keys.load(Ordering::Relaxed)).then_some(n + 1)
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
        self.held.load(Ordering::Acquire) >= self.max_keys.load(Ordering::Relaxed)
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
                return match &fence.ledger {
                    Some(ledger) => self.ledger_peek(ledger, now, cost),
                    None => {
                        self.algorithm
                            .peek(&fence.state, now.saturating_add(fence.shift), cost)
                    }
                };
            }
        }
        if self.is_full() {
            self.algorithm.peek(&self.overflow, now, cost)
        } else {
            self.algorithm.peek(&A::State::default(), now, cost)
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
            .min(
                self.max_keys
                    .load(Ordering::Relaxed)
                    .div_ceil(2)
                    .max(MIN_CAPPED_SWEEP_INSERTS),
            );
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
        let removed = self.map.retain(|state| !self.algorithm.is_idle(state, now));
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
