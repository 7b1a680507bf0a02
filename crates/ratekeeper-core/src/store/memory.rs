use std::fmt;
use std::future::Ready;
use std::hash::Hash;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use metrics::{Counter, Gauge};
use smallvec::SmallVec;

use super::{Charge, Checked, Decisions, PolicyId, Refund, Store, StoreError};
use crate::algorithm::{
    Concurrency, FixedWindow, Gcra, KeyedAlgorithm, LeakyBucket, Reserved, SlidingLog,
    SlidingWindow,
};
use crate::clock::{Clock, MonotonicClock};
use crate::{Algorithm, Decision, Policy};

type Hasher = foldhash::fast::RandomState;

/// Sweeps never run before this many new keys were inserted since the last one.
const MIN_SWEEP_INSERTS: usize = 4_096;

/// The [`metrics`] counter of decisions made on a policy's shared overflow state (label
/// `policy`).
const OVERFLOWED_TOTAL: &str = "ratekeeper_memory_store_overflowed_total";
/// The [`metrics`] gauge of the keys a policy holds (label `policy`).
const KEYS: &str = "ratekeeper_memory_store_keys";
/// The [`metrics`] counter of idle keys swept away (label `policy`).
const EVICTED_TOTAL: &str = "ratekeeper_memory_store_evicted_total";

/// The in-memory store (the embedded default): one [`DashMap`] per policy, per-key state in
/// atomics where the algorithm allows (GCRA: one `AtomicU64`, updated by compare-and-swap).
///
/// Hot path for an existing key: one clock read, one map lookup (foldhash), one CAS; no
/// allocation. A denied request on an unseen key inserts nothing.
///
/// Memory: a key whose state equals "absent" (bucket full again, window over) is idle and can
/// be evicted with no visible effect. The store sweeps idle keys by itself: a sweep runs
/// when the number of keys inserted since the last sweep reaches the number of keys the last
/// sweep kept (at least 4096), so sweeping costs O(1) amortised per insert and memory stays
/// within twice the keys that are live. [`MemoryStore::sweep`] runs one on demand.
/// [`MemoryStore::with_max_keys`] adds a hard cap per policy; keys beyond it share one
/// overflow budget, so a flood of new keys is still limited (case B03).
///
/// Per-key state: one `AtomicU64` for GCRA, the leaky bucket and the concurrency counter
/// (lock-free CAS); a small `Mutex`-guarded value for the fixed window, the sliding window
/// counter and the sliding log (held only for the pure decision, never across I/O).
///
/// # Example
///
/// ```
/// use std::num::NonZeroU32;
/// use std::time::Duration;
/// use ratekeeper_core::clock::ManualClock;
/// use ratekeeper_core::store::{Charge, MemoryStore, Store};
/// use ratekeeper_core::{Key, Policy, Quota};
///
/// let clock = ManualClock::new();
/// let mut store = MemoryStore::<Key, _>::with_clock(clock.clone());
/// let api = store.register(&Policy::new("api", Quota::per_second(NonZeroU32::new(1).unwrap())))?;
/// let key = Key::from("alice");
///
/// assert!(store.check_now(&[Charge::new(api, &key, 1)])?.is_allowed());
/// assert!(!store.check_now(&[Charge::new(api, &key, 1)])?.is_allowed());
/// assert_eq!(store.len(), 1);
///
/// clock.advance(Duration::from_secs(1));
/// store.sweep(); // the bucket is full again: the key is idle and goes
/// assert_eq!(store.len(), 0);
/// # Ok::<(), ratekeeper_core::store::StoreError>(())
/// ```
pub struct MemoryStore<K, C = MonotonicClock> {
    policies: Vec<(Policy, Slot<K>)>,
    clock: C,
    max_keys: usize,
}

enum Slot<K> {
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

struct Keyed<K, A: KeyedAlgorithm> {
    algorithm: A,
    /// The policy's name, the `policy` label of the metrics.
    name: Arc<str>,
    /// Metric handles, registered with the recorder on first use.
    keys_gauge: OnceLock<Gauge>,
    overflow_counter: OnceLock<Counter>,
    map: DashMap<K, A::State, Hasher>,
    /// Entries in `map` plus insertions in progress; never above `max_keys`.
    held: AtomicUsize,
    max_keys: usize,
    /// The state every new key shares while `map` is full.
    overflow: A::State,
    overflowed: AtomicU64,
    inserts_since_sweep: AtomicUsize,
    kept_by_last_sweep: AtomicUsize,
    sweeping: AtomicBool,
}

impl<K: Hash + Eq + Clone, A: KeyedAlgorithm> Keyed<K, A> {
    fn new(algorithm: A, name: &str, max_keys: usize) -> Self {
        Self {
            algorithm,
            name: name.into(),
            keys_gauge: OnceLock::new(),
            overflow_counter: OnceLock::new(),
            map: DashMap::with_hasher(Hasher::default()),
            held: AtomicUsize::new(0),
            max_keys,
            overflow: A::State::default(),
            overflowed: AtomicU64::new(0),
            inserts_since_sweep: AtomicUsize::new(0),
            kept_by_last_sweep: AtomicUsize::new(0),
            sweeping: AtomicBool::new(false),
        }
    }

    /// Reserves room for one new key; false when `max_keys` are held.
    fn reserve(&self) -> bool {
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

    #[inline]
    fn check(&self, key: &K, now: u64, cost: u64) -> Decision {
        if let Some(state) = self.map.get(key) {
            return self.algorithm.check(&state, now, cost);
        }
        // An unseen key behaves as absent; insert only when the request changes state.
        let absent = A::State::default();
        let probe = self.algorithm.peek(&absent, now, cost);
        if probe.is_denied() || cost == 0 {
            return probe;
        }
        if !self.reserve() {
            // Full: make room by evicting idle keys (amortised like every sweep), else the
            // key shares the overflow state, so limiting never stops.
            self.after_insert(now);
            if !self.reserve() {
                self.overflowed.fetch_add(1, Ordering::Relaxed);
                self.overflow_counter
                    .get_or_init(
                        || metrics::counter!(OVERFLOWED_TOTAL, "policy" => self.name.to_string()),
                    )
                    .increment(1);
                return self.algorithm.check(&self.overflow, now, cost);
            }
        }
        let decision = match self.map.entry(key.clone()) {
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
    fn reserve_charge(&self, key: &K, now: u64, cost: u64, max_wait: u64) -> Reserved {
        if let Some(state) = self.map.get(key) {
            return self.algorithm.reserve(&state, now, cost, max_wait);
        }
        Reserved {
            decision: self.check(key, now, cost),
            delay: 0,
            exact: false,
        }
    }

    fn peek(&self, key: &K, now: u64, cost: u64) -> Decision {
        match self.map.get(key) {
            Some(state) => self.algorithm.peek(&state, now, cost),
            None => self.algorithm.peek(&A::State::default(), now, cost),
        }
    }

    fn refund(&self, key: &K, now: u64, cost: u64) {
        if let Some(state) = self.map.get(key) {
            self.algorithm.refund(&state, now, cost);
        } else if !self.algorithm.is_idle(&self.overflow, now) {
            // The charge went to the overflow state (the key was never stored).
            self.algorithm.refund(&self.overflow, now, cost);
        }
    }

    fn remove(&self, key: &K) {
        if self.map.remove(key).is_some() {
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
    fn sweep(&self, now: u64) {
        if self.sweeping.swap(true, Ordering::Acquire) {
            return;
        }
        let mut removed = 0;
        self.map.retain(|_, state| {
            let keep = !self.algorithm.is_idle(state, now);
            removed += usize::from(!keep);
            keep
        });
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

impl<K: Hash + Eq + Clone + Send + Sync + 'static> MemoryStore<K, MonotonicClock> {
    /// An empty store on the [`MonotonicClock`].
    pub fn new() -> Self {
        Self::with_clock(MonotonicClock::new())
    }
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static> Default for MemoryStore<K, MonotonicClock> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K, C> MemoryStore<K, C>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    C: Clock,
{
    /// An empty store reading time from `clock` (a [`crate::clock::ManualClock`] in tests).
    pub fn with_clock(clock: C) -> Self {
        Self {
            policies: Vec::new(),
            clock,
            max_keys: usize::MAX,
        }
    }

    /// Caps the keys held per policy at `max_keys` (default: no cap beyond the automatic
    /// eviction of idle keys). Applies to policies registered before and after.
    ///
    /// When a policy holds `max_keys` keys and a new key arrives, the store first evicts
    /// idle keys (amortised: at most one sweep per `max_keys / 2` new keys); if none is idle,
    /// the new key is charged to one **overflow state** that every such key shares, under
    /// the same quota and algorithm. Limiting never stops: an attacker who fills the map
    /// only shares one budget, while existing keys keep theirs. Each overflowed decision is
    /// counted ([`MemoryStore::overflowed`]). A refund for a key that is not held goes to the
    /// overflow state while that state is not idle. (DESIGN §5: "new keys share an overflow
    /// bucket".)
    pub fn with_max_keys(mut self, max_keys: NonZeroUsize) -> Self {
        self.max_keys = max_keys.get();
        for (_, slot) in &mut self.policies {
            with_keyed!(slot, k => k.max_keys = max_keys.get());
        }
        self
    }

    /// Decisions made on the shared overflow state because a policy held `max_keys` keys,
    /// summed over policies. Each is also counted by the [`metrics`] counter
    /// `ratekeeper_memory_store_overflowed_total` (DESIGN §5: overflow is counted in
    /// metrics).
    pub fn overflowed(&self) -> u64 {
        self.policies
            .iter()
            .map(|(_, slot)| with_keyed!(slot, k => k.overflowed.load(Ordering::Relaxed)))
            .sum()
    }

    /// The store's clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    fn slot(&self, id: PolicyId) -> Result<&Slot<K>, StoreError> {
        self.policies
            .get(id.index())
            .map(|(_, slot)| slot)
            .ok_or(StoreError::UnknownPolicy(id))
    }

    /// The policy registered under `id`.
    pub fn policy(&self, id: PolicyId) -> Option<&Policy> {
        self.policies.get(id.index()).map(|(p, _)| p)
    }

    /// Checks `charges` all-or-nothing at the clock's current time. Same as [`Store::check`]
    /// without the [`Checked`] wrapper.
    ///
    /// # Errors
    ///
    /// [`StoreError::UnknownPolicy`] when a charge names a policy this store never registered
    /// (nothing is charged then).
    pub fn check_now(&self, charges: &[Charge<'_, K>]) -> Result<Decisions, StoreError> {
        self.check_at(charges, self.clock.now())
    }

    /// One charge (the common case) inlines into the caller so the decision is written in
    /// place; several charges go through [`MemoryStore::check_many`].
    #[inline]
    fn check_at(&self, charges: &[Charge<'_, K>], now: u64) -> Result<Decisions, StoreError> {
        if let [only] = charges {
            let slot = self.slot(only.policy)?;
            let d = with_keyed!(slot, k => k.check(only.key, now, only.cost));
            return Ok(Decisions::one(d));
        }
        self.check_many(charges, now)
    }

    #[inline(never)]
    fn check_many(&self, charges: &[Charge<'_, K>], now: u64) -> Result<Decisions, StoreError> {
        for c in charges {
            self.slot(c.policy)?;
        }
        let mut out: SmallVec<[Decision; 2]> = SmallVec::new();
        for (i, c) in charges.iter().enumerate() {
            let slot = self.slot(c.policy)?;
            let d = with_keyed!(slot, k => k.check(c.key, now, c.cost));
            if d.is_denied() {
                // All-or-nothing: give back what the earlier policies charged, then report
                // every policy's state as it now is.
                for prev in &charges[..i] {
                    let slot = self.slot(prev.policy)?;
                    with_keyed!(slot, k => k.refund(prev.key, now, prev.cost));
                }
                let mut report = SmallVec::<[Decision; 4]>::new();
                for (j, other) in charges.iter().enumerate() {
                    if j == i {
                        report.push(d);
                    } else {
                        let slot = self.slot(other.policy)?;
                        report.push(with_keyed!(slot, k => k.peek(other.key, now, other.cost)));
                    }
                }
                return Ok(Decisions::new(report));
            }
            out.push(d);
        }
        Ok(Decisions::new(out))
    }

    /// Reserves `charges` all-or-nothing at the clock's current time for a request that may
    /// wait up to `max_wait`. Same as [`Store::reserve`] without the [`Checked`] wrapper.
    ///
    /// Exact for GCRA ([`Gcra::reserve`]) and the leaky bucket (the shaper,
    /// [`LeakyBucket::shape`]): the answer charges now and gives the delay. The fixed
    /// window, sliding log, sliding window counter and concurrency counter cannot reserve:
    /// for them a reservation is a check (allowed now, or denied with a `retry_after` that is
    /// not final), so a request limited by them falls back to check-and-retry.
    ///
    /// # Errors
    ///
    /// [`StoreError::UnknownPolicy`] when a charge names a policy this store never registered
    /// (nothing is charged then).
    pub fn reserve_now(
        &self,
        charges: &[Charge<'_, K>],
        max_wait: std::time::Duration,
    ) -> Result<Decisions, StoreError> {
        let max_wait = u64::try_from(max_wait.as_nanos()).unwrap_or(u64::MAX);
        self.reserve_at(charges, self.clock.now(), max_wait)
    }

    fn reserve_at(
        &self,
        charges: &[Charge<'_, K>],
        now: u64,
        max_wait: u64,
    ) -> Result<Decisions, StoreError> {
        for c in charges {
            self.slot(c.policy)?;
        }
        let mut out: SmallVec<[Decision; 2]> = SmallVec::new();
        let mut delay = 0;
        for (i, c) in charges.iter().enumerate() {
            let slot = self.slot(c.policy)?;
            let r = with_keyed!(slot, k => k.reserve_charge(c.key, now, c.cost, max_wait));
            if r.decision.is_denied() {
                // All-or-nothing: refund the reservations of the earlier policies, then
                // report every policy's state as it now is.
                for prev in &charges[..i] {
                    let slot = self.slot(prev.policy)?;
                    with_keyed!(slot, k => k.refund(prev.key, now, prev.cost));
                }
                let mut report = SmallVec::<[Decision; 4]>::new();
                for (j, other) in charges.iter().enumerate() {
                    if j == i {
                        report.push(r.decision);
                    } else {
                        let slot = self.slot(other.policy)?;
                        report.push(with_keyed!(slot, k => k.peek(other.key, now, other.cost)));
                    }
                }
                let is_final = r.exact || r.decision.is_cannot_fit();
                return Ok(Decisions::new(report).with_final(is_final));
            }
            delay = r.delay.max(delay);
            out.push(r.decision);
        }
        Ok(Decisions::new(out).with_delay(std::time::Duration::from_nanos(delay)))
    }

    /// Keys held across all policies.
    pub fn len(&self) -> usize {
        self.policies
            .iter()
            .map(|(_, slot)| with_keyed!(slot, k => k.map.len()))
            .sum()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Evicts every idle key now (the store also does this by itself as keys are added).
    pub fn sweep(&self) {
        let now = self.clock.now();
        for (_, slot) in &self.policies {
            with_keyed!(slot, k => k.sweep(now));
        }
    }

    /// Forgets `key` under `policy`: its next request sees a full budget.
    pub fn reset(&self, policy: PolicyId, key: &K) {
        if let Ok(slot) = self.slot(policy) {
            with_keyed!(slot, k => k.remove(key));
        }
    }
}

impl<K, C> Store<K> for MemoryStore<K, C>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    C: Clock,
{
    type Future = Ready<Result<Decisions, StoreError>>;

    fn register(&mut self, policy: &Policy) -> Result<PolicyId, StoreError> {
        policy.validate()?;
        let quota = policy.quota();
        let slot = match policy.algorithm() {
            Algorithm::Gcra => {
                Slot::Gcra(Keyed::new(Gcra::new(quota), policy.name(), self.max_keys))
            }
            Algorithm::LeakyBucket => Slot::LeakyBucket(Keyed::new(
                LeakyBucket::new(quota),
                policy.name(),
                self.max_keys,
            )),
            Algorithm::FixedWindow => Slot::FixedWindow(Keyed::new(
                FixedWindow::new(quota),
                policy.name(),
                self.max_keys,
            )),
            Algorithm::SlidingLog => Slot::SlidingLog(Keyed::new(
                SlidingLog::new(quota),
                policy.name(),
                self.max_keys,
            )),
            Algorithm::SlidingWindow => Slot::SlidingWindow(Keyed::new(
                SlidingWindow::new(quota),
                policy.name(),
                self.max_keys,
            )),
            Algorithm::Concurrency => Slot::Concurrency(Keyed::new(
                Concurrency::new(quota),
                policy.name(),
                self.max_keys,
            )),
        };
        let index = u32::try_from(self.policies.len())
            .map_err(|_| StoreError::UnknownPolicy(PolicyId::from_index(u32::MAX)))?;
        self.policies.push((policy.clone(), slot));
        Ok(PolicyId::from_index(index))
    }

    #[inline]
    fn check(&self, charges: &[Charge<'_, K>]) -> Checked<Self::Future> {
        Checked::Ready(self.check_at(charges, self.clock.now()))
    }

    /// Exact for GCRA and the leaky bucket; check-and-retry for the other algorithms (see
    /// [`MemoryStore::reserve_now`]).
    fn reserve(
        &self,
        charges: &[Charge<'_, K>],
        max_wait: std::time::Duration,
    ) -> Checked<Self::Future> {
        Checked::Ready(self.reserve_now(charges, max_wait))
    }

    fn refund(&self, refunds: &[Refund<'_, K>]) {
        let now = self.clock.now();
        for r in refunds {
            let c = r.charge;
            if let Ok(slot) = self.slot(c.policy) {
                with_keyed!(slot, k => k.refund(c.key, now, c.cost));
            }
        }
    }

    fn unix_now(&self) -> std::time::Duration {
        self.clock.unix_now()
    }
}

impl<K, C: fmt::Debug> fmt::Debug for MemoryStore<K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field(
                "policies",
                &self
                    .policies
                    .iter()
                    .map(|(p, _)| p.name())
                    .collect::<Vec<_>>(),
            )
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::store::Receipt;
    use crate::{Key, Quota};
    use std::collections::HashMap;

    use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
    use std::num::NonZeroU32;
    use std::sync::Arc;
    use std::time::Duration;

    fn store() -> (MemoryStore<Key, ManualClock>, ManualClock) {
        let clock = ManualClock::new();
        (MemoryStore::with_clock(clock.clone()), clock)
    }

    fn q(limit: u32, secs: u64) -> Quota {
        Quota::new(limit, Duration::from_secs(secs)).unwrap()
    }

    #[test]
    fn several_policies_are_all_or_nothing() {
        let (mut s, _) = store();
        let wide = s.register(&Policy::new("wide", q(100, 60))).unwrap();
        let narrow = s.register(&Policy::new("narrow", q(1, 10))).unwrap();
        let k = Key::from("k");
        let both = [Charge::new(wide, &k, 1), Charge::new(narrow, &k, 1)];
        let d = s.check_now(&both).unwrap();
        assert!(d.is_allowed());
        assert_eq!(d.as_slice()[0].remaining(), 99);
        assert_eq!(d.deciding(), Some(1));
        let d = s.check_now(&both).unwrap();
        assert!(!d.is_allowed());
        assert_eq!(d.retry_after(), Some(Duration::from_secs(10)));
        // The wide policy was refunded: still 99, not 98.
        assert_eq!(d.as_slice()[0].remaining(), 99);
        assert_eq!(d.deciding(), Some(1));
    }

    const MS: u64 = 1_000_000;

    fn reserve(s: &MemoryStore<Key, ManualClock>, charges: &[Charge<'_, Key>]) -> Decisions {
        match Store::reserve(s, charges, Duration::from_secs(2)) {
            Checked::Ready(r) => r.unwrap(),
            Checked::Pending(_) => unreachable!("the memory store answers at once"),
        }
    }

    #[test]
    fn gcra_reservations_are_spaced_in_order_and_denials_are_final() {
        let (mut s, clock) = store();
        // 2 per second, burst 1: T = 500 ms; max_wait 2 s.
        let p = s
            .register(&Policy::new("p", q(2, 1).with_burst(1).unwrap()))
            .unwrap();
        let k = Key::Global;
        let c = [Charge::new(p, &k, 1)];
        for expected in [0, 500, 1_000, 1_500, 2_000] {
            let d = reserve(&s, &c);
            assert!(d.is_allowed());
            assert_eq!(d.delay(), Duration::from_millis(expected));
            assert_eq!(d.as_slice()[0].remaining(), 0);
            assert_eq!(
                d.as_slice()[0].reset_after(),
                Duration::from_millis(expected + 500)
            );
        }
        for _ in 0..2 {
            let d = reserve(&s, &c);
            assert!(!d.is_allowed() && d.is_final());
            assert_eq!(d.delay(), Duration::ZERO);
            // allow_at 2.5 s - max_wait 2 s.
            assert_eq!(d.retry_after(), Some(Duration::from_millis(500)));
        }
        // A dropped reservation is refunded: the next one takes its turn.
        s.refund(&[Refund::new(c[0], Receipt::NONE)]);
        assert_eq!(reserve(&s, &c).delay(), Duration::from_millis(2_000));
        clock.advance(Duration::from_millis(500));
        // Half a second later the next turn (2.5 s) is within 2 s again.
        assert_eq!(reserve(&s, &c).delay(), Duration::from_millis(2_000));
    }

    #[test]
    fn reservations_are_all_or_nothing_across_policies() {
        let (mut s, _) = store();
        // a: 1 per second, burst 1. b: 1 per 10 s, burst 2 (T = 10 s, tau = 20 s).
        let a = s
            .register(&Policy::new("a", q(1, 1).with_burst(1).unwrap()))
            .unwrap();
        let b = s
            .register(&Policy::new("b", q(1, 10).with_burst(2).unwrap()))
            .unwrap();
        let k = Key::Global;
        let both = [Charge::new(a, &k, 1), Charge::new(b, &k, 1)];
        assert_eq!(reserve(&s, &both).delay(), Duration::ZERO);
        let d = reserve(&s, &both);
        assert!(d.is_allowed());
        assert_eq!(d.delay(), Duration::from_secs(1));
        // a could wait 2 s, but b would need 10 s > 2 s: denied, final, a refunded.
        let d = reserve(&s, &both);
        assert!(!d.is_allowed() && d.is_final());
        assert_eq!(d.retry_after(), Some(Duration::from_secs(8)));
        assert_eq!(d.deciding(), Some(1));
        let only_a = reserve(&s, &[Charge::new(a, &k, 1)]);
        assert_eq!(only_a.delay(), Duration::from_secs(2), "a was not refunded");
    }

    #[test]
    fn leaky_bucket_reserves_as_a_shaper() {
        let (mut s, _) = store();
        // 10 per second, queue of 3.
        let p = s
            .register(
                &Policy::new("p", q(10, 1).with_burst(3).unwrap())
                    .with_algorithm(Algorithm::LeakyBucket),
            )
            .unwrap();
        let k = Key::Global;
        let c = [Charge::new(p, &k, 1)];
        for expected in [0, 100 * MS, 200 * MS] {
            assert_eq!(reserve(&s, &c).delay(), Duration::from_nanos(expected));
        }
        let d = reserve(&s, &c);
        assert!(!d.is_allowed() && d.is_final());
        assert_eq!(d.retry_after(), Some(Duration::from_millis(100)));
    }

    #[test]
    fn window_algorithms_fall_back_to_check_and_retry() {
        let (mut s, _) = store();
        let g = s
            .register(&Policy::new("g", q(1, 1).with_burst(1).unwrap()))
            .unwrap();
        let w = s
            .register(&Policy::new("w", q(1, 10)).with_algorithm(Algorithm::FixedWindow))
            .unwrap();
        let k = Key::Global;
        let both = [Charge::new(g, &k, 1), Charge::new(w, &k, 1)];
        assert_eq!(reserve(&s, &both).delay(), Duration::ZERO);
        // The window denies: not final (retry after it), and the GCRA reservation is refunded.
        let d = reserve(&s, &both);
        assert!(!d.is_allowed() && !d.is_final());
        assert_eq!(d.retry_after(), Some(Duration::from_secs(10)));
        assert_eq!(
            reserve(&s, &[Charge::new(g, &k, 1)]).delay(),
            Duration::from_secs(1)
        );
    }

    #[test]
    fn b10_reserving_more_than_the_burst_fails_at_once() {
        let (mut s, _) = store();
        let p = s
            .register(&Policy::new("p", q(1, 1).with_burst(1).unwrap()))
            .unwrap();
        let k = Key::Global;
        let d = reserve(&s, &[Charge::new(p, &k, 2)]);
        assert!(d.is_cannot_fit() && d.is_final());
        assert_eq!(d.retry_after(), None);
        assert!(s.is_empty());
        assert_eq!(
            reserve(&s, &[Charge::new(p, &k, 1)]).as_slice()[0].remaining(),
            0
        );
    }

    #[test]
    fn unknown_policy_is_an_error_and_charges_nothing() {
        let (mut s, _) = store();
        let p = s.register(&Policy::new("p", q(1, 1))).unwrap();
        let k = Key::Global;
        let bad = PolicyId::from_index(9);
        assert!(matches!(
            s.check_now(&[Charge::new(p, &k, 1), Charge::new(bad, &k, 1)]),
            Err(StoreError::UnknownPolicy(_))
        ));
        assert!(s.check_now(&[Charge::new(p, &k, 1)]).unwrap().is_allowed());
    }

    #[test]
    fn invalid_policy_name_is_refused() {
        let (mut s, _) = store();
        let err = s.register(&Policy::new("bad name", q(1, 1))).unwrap_err();
        assert!(err.is_config());
    }

    #[test]
    fn denied_unseen_key_inserts_nothing() {
        let (mut s, _) = store();
        let p = s.register(&Policy::new("p", q(1, 1))).unwrap();
        let k = Key::Global;
        assert!(!s.check_now(&[Charge::new(p, &k, 5)]).unwrap().is_allowed());
        assert!(s.is_empty());
    }

    #[test]
    fn idle_keys_are_swept_automatically_and_eviction_is_invisible() {
        let (mut s, clock) = store();
        let p = s.register(&Policy::new("p", q(10, 1))).unwrap();
        let keys: Vec<Key> = (0..20_000u64).map(Key::Int).collect();
        for k in &keys {
            assert_eq!(
                s.check_now(&[Charge::new(p, k, 1)]).unwrap().as_slice()[0].remaining(),
                9
            );
        }
        clock.advance(Duration::from_secs(2));
        // New keys trigger sweeps that drop the now-idle ones.
        for k in (100_000..100_000 + 20_000u64).map(Key::Int) {
            s.check_now(&[Charge::new(p, &k, 1)]).unwrap();
        }
        assert!(s.len() < 40_000, "idle keys were not swept: {}", s.len());
        clock.advance(Duration::from_secs(2));
        s.sweep();
        assert_eq!(s.len(), 0);
        let again = s.check_now(&[Charge::new(p, &keys[1], 1)]).unwrap();
        assert_eq!(again.as_slice()[0].remaining(), 9);
    }

    #[test]
    fn concurrent_checks_never_over_admit() {
        let (mut s, _) = store();
        let p = s.register(&Policy::new("p", q(4, 86_400))).unwrap();
        let s = Arc::new(s);
        let keys: Vec<Key> = (1..=10u64).map(Key::Int).collect();
        let keys = Arc::new(keys);
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let s = Arc::clone(&s);
                let keys = Arc::clone(&keys);
                std::thread::spawn(move || {
                    let mut remaining = Vec::new();
                    for i in 0..250 {
                        let k = &keys[i % 10];
                        let d = s.check_now(&[Charge::new(p, k, 1)]).unwrap();
                        if d.is_allowed() {
                            remaining.push((i % 10, d.as_slice()[0].remaining()));
                        } else {
                            assert_eq!(d.as_slice()[0].remaining(), 0);
                        }
                    }
                    remaining
                })
            })
            .collect();
        let mut all: Vec<(usize, u32)> = threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect();
        all.sort();
        let expected: Vec<(usize, u32)> =
            (0..10).flat_map(|k| (0..4).map(move |r| (k, r))).collect();
        assert_eq!(all, expected);
    }

    #[test]
    fn reset_forgets_a_key() {
        let (mut s, _) = store();
        let p = s
            .register(&Policy::new("p", Quota::per_minute(NonZeroU32::MIN)))
            .unwrap();
        let k = Key::Global;
        assert!(s.check_now(&[Charge::new(p, &k, 1)]).unwrap().is_allowed());
        assert!(!s.check_now(&[Charge::new(p, &k, 1)]).unwrap().is_allowed());
        s.reset(p, &k);
        assert!(s.check_now(&[Charge::new(p, &k, 1)]).unwrap().is_allowed());
    }

    /// Case B03: 1,000,000 distinct keys (token bucket 10 per 1,000 ms, burst 10), one
    /// request each over t = 0..999 ms; with a hard cap C = 200,000 keys (the keys live at
    /// once are the last 100 ms: 100,000). Every request: 200, Remaining 9; the store never
    /// holds more than C; after a sweep at t = 1,000 ms + S (S = 100 ms, the time a bucket
    /// takes to refill after one request, so the last keys are idle) it holds 0; a returning
    /// key at t = 2,000 ms + S sees Remaining 9.
    #[test]
    fn b03_many_distinct_keys_bounded_and_evicted_unseen() {
        const C: usize = 200_000;
        let clock = ManualClock::new();
        let mut s =
            MemoryStore::with_clock(clock.clone()).with_max_keys(NonZeroUsize::new(C).unwrap());
        let p = s
            .register(&Policy::new(
                "b03",
                Quota::new(10, Duration::from_secs(1)).unwrap(),
            ))
            .unwrap();
        let mut max_len = 0;
        for i in 0..1_000_000u64 {
            clock.set(i * 1_000);
            let key = Key::from(format!("k{i:07}"));
            let d = s.check_now(&[Charge::new(p, &key, 1)]).unwrap();
            let d = d.as_slice()[0];
            assert!(d.is_allowed() && d.remaining() == 9, "key {i}: {d:?}");
            if i % 1_000 == 0 {
                max_len = max_len.max(s.len());
            }
        }
        assert!(max_len <= C, "held {max_len} keys");
        assert_eq!(s.overflowed(), 0, "live keys never exceeded the cap");
        clock.set(1_100_000_000);
        s.sweep();
        assert_eq!(s.len(), 0);
        clock.set(2_100_000_000);
        let d = s
            .check_now(&[Charge::new(p, &Key::from("k0000001"), 1)])
            .unwrap();
        assert_eq!(d.as_slice()[0].remaining(), 9);
    }

    #[test]
    fn max_keys_overflow_shares_one_budget_and_never_stops_limiting() {
        let clock = ManualClock::new();
        let mut s =
            MemoryStore::with_clock(clock.clone()).with_max_keys(NonZeroUsize::new(3).unwrap());
        let p = s.register(&Policy::new("p", q(2, 60))).unwrap();
        let check = |s: &MemoryStore<Key, ManualClock>, k: u64| {
            s.check_now(&[Charge::new(p, &Key::Int(k), 1)])
                .unwrap()
                .as_slice()[0]
        };
        for k in 0..3 {
            assert_eq!(check(&s, k).remaining(), 1);
        }
        assert_eq!(s.len(), 3);
        // Keys 3, 4, 5 share one overflow budget of 2: the third is denied.
        assert!(check(&s, 3).is_allowed());
        assert!(check(&s, 4).is_allowed());
        assert!(check(&s, 5).is_denied());
        assert_eq!(s.len(), 3);
        assert_eq!(s.overflowed(), 3);
        // Stored keys keep their own budget.
        assert_eq!(check(&s, 0).remaining(), 0);
        // Once the stored keys are idle, the next sweep (automatic after at most
        // ceil(max_keys / 2) new keys, or on demand) makes room: new keys get their own
        // entries again.
        clock.advance(Duration::from_secs(60));
        for k in 6..9 {
            assert_eq!(check(&s, k).remaining(), 1);
        }
        // Key 6 still went to the (idle again) overflow state; key 7 triggered the sweep
        // that evicted keys 0, 1 and 2, so keys 7 and 8 are stored on their own.
        assert_eq!(s.len(), 2);
        assert_eq!(check(&s, 8).remaining(), 0);
        assert_eq!(s.overflowed(), 4);
    }

    /// The metrics of policy "p" that changed since the previous snapshot (the debugging
    /// recorder reports each counter and gauge by its change), by name.
    fn changed(snapshotter: &Snapshotter) -> HashMap<String, DebugValue> {
        snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .filter(|(key, ..)| {
                key.key()
                    .labels()
                    .any(|l| l.key() == "policy" && l.value() == "p")
            })
            .map(|(key, _, _, value)| (key.key().name().to_owned(), value))
            .collect()
    }

    #[test]
    fn overflow_decisions_are_counted_in_metrics() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let mut s = MemoryStore::with_clock(ManualClock::new())
            .with_max_keys(NonZeroUsize::new(1).unwrap());
        let p = s.register(&Policy::new("p", q(5, 60))).unwrap();
        metrics::with_local_recorder(&recorder, || {
            for k in 0..4 {
                s.check_now(&[Charge::new(p, &Key::Int(k), 1)]).unwrap();
            }
        });
        // Key 0 is stored; keys 1, 2 and 3 go to the overflow state.
        assert_eq!(s.overflowed(), 3);
        assert_eq!(
            changed(&snapshotter).get(OVERFLOWED_TOTAL),
            Some(&DebugValue::Counter(3))
        );
    }

    #[test]
    fn keys_held_and_evictions_are_in_metrics() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let keys = |n: f64| DebugValue::Gauge(n.into());
        let (mut s, clock) = store();
        let p = s.register(&Policy::new("p", q(10, 1))).unwrap();
        metrics::with_local_recorder(&recorder, || {
            for k in 0..5 {
                s.check_now(&[Charge::new(p, &Key::Int(k), 1)]).unwrap();
            }
            // An existing key adds nothing.
            s.check_now(&[Charge::new(p, &Key::Int(0), 1)]).unwrap();
            assert_eq!(changed(&snapshotter).get(KEYS), Some(&keys(5.0)));
            s.reset(p, &Key::Int(4));
            assert_eq!(changed(&snapshotter).get(KEYS), Some(&keys(-1.0)));
            clock.advance(Duration::from_secs(2));
            s.sweep();
        });
        assert_eq!(s.len(), 0);
        let swept = changed(&snapshotter);
        assert_eq!(swept.get(KEYS), Some(&keys(-4.0)));
        assert_eq!(swept.get(EVICTED_TOTAL), Some(&DebugValue::Counter(4)));
    }

    #[test]
    fn the_cap_holds_under_concurrent_inserts() {
        let mut s = MemoryStore::with_clock(ManualClock::new())
            .with_max_keys(NonZeroUsize::new(100).unwrap());
        let p = s.register(&Policy::new("p", q(1, 60))).unwrap();
        let s = Arc::new(s);
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let s = Arc::clone(&s);
                std::thread::spawn(move || {
                    for i in 0..1_000u64 {
                        let k = Key::Int(t * 1_000_000 + i);
                        s.check_now(&[Charge::new(p, &k, 1)]).unwrap();
                        assert!(s.len() <= 100);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(s.len(), 100);
    }
}
