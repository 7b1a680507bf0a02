use std::fmt;
use std::future::Ready;
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use dashmap::DashMap;
use smallvec::SmallVec;

use super::{Charge, Checked, Decisions, PolicyId, Store, StoreError};
use crate::algorithm::{Gcra, KeyedAlgorithm};
use crate::clock::{Clock, MonotonicClock};
use crate::{Algorithm, Decision, Policy};

type Hasher = foldhash::fast::RandomState;

/// Sweeps never run before this many new keys were inserted since the last one.
const MIN_SWEEP_INSERTS: usize = 4_096;

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
}

enum Slot<K> {
    Gcra(Keyed<K, Gcra>),
}

/// Runs `$body` with `$k` bound to the slot's `Keyed<K, A>`, whatever the algorithm.
macro_rules! with_keyed {
    ($slot:expr, $k:ident => $body:expr) => {
        match $slot {
            Slot::Gcra($k) => $body,
        }
    };
}

struct Keyed<K, A: KeyedAlgorithm> {
    algorithm: A,
    map: DashMap<K, A::State, Hasher>,
    inserts_since_sweep: AtomicUsize,
    kept_by_last_sweep: AtomicUsize,
    sweeping: AtomicBool,
}

impl<K: Hash + Eq + Clone, A: KeyedAlgorithm> Keyed<K, A> {
    fn new(algorithm: A) -> Self {
        Self {
            algorithm,
            map: DashMap::with_hasher(Hasher::default()),
            inserts_since_sweep: AtomicUsize::new(0),
            kept_by_last_sweep: AtomicUsize::new(0),
            sweeping: AtomicBool::new(false),
        }
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
        let decision = {
            let state = self.map.entry(key.clone()).or_default();
            self.algorithm.check(&state, now, cost)
        };
        self.after_insert(now);
        decision
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
        }
    }

    fn after_insert(&self, now: u64) {
        let inserted = self.inserts_since_sweep.fetch_add(1, Ordering::Relaxed) + 1;
        let threshold = self
            .kept_by_last_sweep
            .load(Ordering::Relaxed)
            .max(MIN_SWEEP_INSERTS);
        if inserted >= threshold {
            self.sweep(now);
        }
    }

    /// Removes idle keys. Single-flight: a sweep already running makes this a no-op.
    fn sweep(&self, now: u64) {
        if self.sweeping.swap(true, Ordering::Acquire) {
            return;
        }
        self.map
            .retain(|_, state| !self.algorithm.is_idle(state, now));
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
        }
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
        let mut out: SmallVec<[Decision; 4]> = SmallVec::new();
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
            with_keyed!(slot, k => { k.map.remove(key); });
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
        let slot = match policy.algorithm() {
            Algorithm::Gcra => Slot::Gcra(Keyed::new(Gcra::new(policy.quota()))),
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

    fn refund(&self, charges: &[Charge<'_, K>]) {
        let now = self.clock.now();
        for c in charges {
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
    use crate::{Key, Quota};
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
}
