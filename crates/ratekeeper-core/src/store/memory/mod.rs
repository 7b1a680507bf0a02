//! The in-memory store: [`MemoryStore`] (registration, checks and reservations with
//! receipts, refunds) over one key map per policy (`keyed`); several charges at once in
//! `all_or_nothing`, bans in `ban`, peeks and resets in `reset`.
//!
//! How the store keeps its keys (the public contract is on [`MemoryStore`]).
//!
//! # Keys in compact form
//!
//! With [`Key`](crate::Key) keys the map does not hold the 40-byte enum: each kind of key
//! has its own map ("lane") whose key is just large enough, and every lane keeps the key
//! whole, so two distinct keys never share a budget (a hash collision only costs a
//! comparison; no fingerprint stands in for a key):
//!
//! | key | kept as | map entry (key + 8-byte GCRA state) |
//! |---|---|---:|
//! | `Key::Ip` IPv4, `Key::Net` IPv4, `Key::Global` | one `u64` (address, prefix length and kind bits) | 16 bytes |
//! | `Key::Net(v6, 64)` (the HTTP layer's IPv6 key; host bits clear) | one `u64` (the 64 prefix bits) | 16 bytes |
//! | `Key::Ip` IPv6 | 16 bytes inline | 24 bytes |
//! | `Key::Net` IPv6 of another length below 128, host bits clear (/48, /56) | 16 bytes inline (the prefix and a terminating bit) | 24 bytes |
//! | `Key::Int`, `Key::Str` up to 15 bytes | 16 bytes inline (a length byte and the bytes) | 24 bytes |
//! | `Key::Str` of 16 to 32 bytes, each byte ASCII and not NUL (API keys, user ids) | 28 bytes: 7 bits per character, in a slab beside the state; the hash table holds its 4-byte slot number | 28 + 8 bytes of slab + a 4-byte bucket |
//! | other `Key::Str` over 15 bytes | `Box<str>`, the full string | 24 bytes + the string on the heap |
//! | tuples, networks with host bits set; keys of any type other than `Key` | the key itself | the key's size + 8 |
//!
//! An IPv4 address and its IPv4-mapped IPv6 form are different keys and stay apart (one
//! is in the IPv4 lane, the other in the IPv6 one). The lane of a key depends only on
//! the key; which lane a key type uses is decided at compile time.
//!
//! # Bytes per key
//!
//! Each lane is made of hashbrown tables (one control byte per bucket, at most 7/8 of the
//! buckets full, a power-of-two bucket count), so a lane of 16-byte entries
//! costs 17 bytes per bucket. The fixed-size lanes are split into 8 maps that take unequal
//! shares of the keys (23/256 to 42/256, a geometric series over one doubling), so their
//! doublings are spread out: from 100,000 keys up, an IPv4 or IPv6 /64 key costs between 25.5
//! and 30.1 bytes of table at any key count (one table alone: 19.4 to 38.9, by the count).
//! An ASCII string key of 16 to 32 bytes (a typical API key) takes no allocation of its own:
//! its packed form and its state sit in slabs of fixed-size chunks, filled in order (28 + 8
//! bytes per key with GCRA, and at most one partly filled chunk per table), and the hash
//! table, staggered the same way, holds only its slot number (5 bytes per bucket with the
//! control byte: 7.5 to 9 bytes per key). Any other string over 15 bytes adds a heap block
//! holding the string to its 24-byte entry.
//!
//! With [`MemoryStore::with_max_keys`], a policy holds at most `max_keys` keys: its resident
//! set stays within the per-key cost above times `max_keys`, times two, plus a constant (a
//! table filled by swept keys is rehashed in place or into twice the buckets, so under a long
//! flood each table doubles at most once; a slab reuses the slots of swept keys and holds at
//! most as many as its table ever held keys at once).
//!
//! # Per-key state
//!
//! One `AtomicU64` for GCRA, the leaky bucket and the concurrency counter (lock-free CAS);
//! a small `Mutex`-guarded value for the fixed window, the sliding window
//! counter and the sliding log (held only for the pure decision, never across I/O).

mod all_or_nothing;
mod ban;
mod compact;
mod keyed;
mod registry;
mod reset;
mod slab;
mod staggered;
mod store;

use std::fmt;
use std::hash::Hash;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use self::keyed::{Slot, with_keyed};
use self::registry::{Registered, Registry};
use super::{Charge, Decisions, PolicyId, Receipt, StoreError};
#[cfg(test)]
use super::{Checked, Correction, Refund, Store};
use crate::algorithm::Reserved;
use crate::clock::{Clock, MonotonicClock};
use crate::{Decision, Policy};

/// The in-memory store (the embedded default): one [`DashMap`](dashmap::DashMap) per policy, per-key state in
/// atomics where the algorithm allows (GCRA: one `AtomicU64`, updated by compare-and-swap).
///
/// Hot path for an existing key: one clock read, one map lookup (foldhash), one CAS; no
/// allocation. A denied request on an unseen key inserts nothing.
///
/// Memory: a key whose state equals "absent" (bucket full again, window over) is idle and can
/// be evicted with no visible effect, refunds included: no receipt of an evicted state
/// takes anything from the key's next one. The store sweeps idle keys by itself: a sweep runs
/// when the number of keys inserted since the last sweep reaches the number of keys the last
/// sweep kept (at least 4096), so sweeping costs O(1) amortised per insert and memory stays
/// within twice the keys that are live. [`MemoryStore::sweep`] runs one on demand.
/// [`MemoryStore::with_max_keys`] adds a hard cap per policy; keys beyond it share one
/// overflow budget, so a flood of new keys is still limited.
///
/// **Keys in compact form.** With [`Key`](crate::Key) keys the map does not hold the enum:
/// each kind of key has its own map whose key is just large enough (an IPv4 address or the
/// IPv6 /64 the HTTP layer keys by fits one word), and every form keeps the key whole, so two
/// distinct keys never share a budget (a hash collision only costs a comparison; no
/// fingerprint stands in for a key). An IPv4 address and its IPv4-mapped IPv6 form are
/// different keys and stay apart. With [`MemoryStore::with_max_keys`], a policy's resident
/// set stays within twice its cost per key times `max_keys`, plus a constant. Bytes per key,
/// measured beside governor, are in the repository's `BENCHMARKS.md`.
///
/// **Receipts.** Every allowed decision carries the [`Receipt`] of what its charge took (the
/// TAT after the charge, the window index, the log entry's time; see [`Receipt`]), and
/// [`Store::refund`](super::Store::refund) gives back only what that charge still holds: nothing after its window
/// closed, its entry expired or the bucket drained it, and never a slot booked by a later
/// reservation. For GCRA and the leaky bucket, refunds in any order give back exactly the
/// undrained part of their own charge's slot (the FIFO ledger of [`Receipt`]): a key that
/// has a charge refunded out of the middle of its schedule keeps an explicit ledger of its
/// slots, apart from the other keys, until its schedule is empty.
/// [`Receipt::NONE`] gives back nothing. The all-or-nothing rollback of a
/// multi-policy check or reservation uses the receipts it has just taken.
///
/// [`Store::correct`](super::Store::correct) settles a charge whose true cost became known later: a give-back by
/// the refund rules (paying off a debt first), an extra charge forced, never refused, on
/// the state a check of the key would charge now (so the key may go into debt, which later
/// requests wait out; window counts above the limit are kept whole).
///
/// A refund lands on the state its charge was made on, in the same life, whatever happened
/// to the key in between: a charge on the shared overflow state (see
/// [`MemoryStore::with_max_keys`]) goes back there even once the key holds a state of its
/// own; a charge on a state that went (evicted when idle, or forgotten by
/// [`MemoryStore::forget`]) gives back nothing, and never frees a later charge. The stamp of
/// a charge on the overflow state has bit 63 set; a charge on a key's own state whose stamp
/// would reach bit 63 (a clock or a tolerance beyond 2^63 ns, 292 years) gets
/// [`Receipt::NONE`] or gives back nothing.
///
/// **Bans.** A policy with a [`Ban`](crate::Ban) keeps a second, small map beside its key
/// map: a key is in it while its refusals are being counted or its ban is in force, at most
/// `max_keys` of them ([`MemoryStore::with_max_keys`]; a new key's refusals are not counted
/// while the map is full and a sweep frees nothing), swept of ended bans and counts as keys
/// are added (O(1) amortised) and by [`MemoryStore::sweep`]. A ban in force refuses the
/// whole request before anything is charged, and a request charged while a concurrent
/// refusal starts a ban is given back and refused too, so no charge lands after a ban's
/// start; [`MemoryStore::forget`] ends a ban. A policy
/// without a ban has no such map, and while no policy of the store has one, a check pays
/// nothing for bans.
///
/// **Parameters in force.** A policy's quota is fixed when it is registered and its state
/// lives only as long as the store, so state is always read under the quota that wrote it.
/// A new quota means a new store (a restart, or a new layer): nothing written under the old
/// quota survives.
///
/// # Clones
///
/// A clone is a handle on the same store, made in O(policies) with no key copied: the same
/// key state, caps and bans, and one registry of policies. A policy registered through any
/// clone, at any time, is known to every clone: give each layer a clone and they share one
/// budget per policy and key. A handle made before a registration reads the shared registry
/// (under a lock) when a charge names the new policy, until it is cloned again; the
/// registrations it knows cost it nothing. The clock is cloned too (the clocks of this crate
/// share their time with their clones), so a clock type of your own must be [`Clone`] in the
/// same way for the store to be.
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
    /// The registered policies as this handle knows them. Its `policies` (every policy
    /// while none has a ban, empty otherwise) is where the one-charge check looks its
    /// policy up, so a store without bans pays nothing for them; once one has a ban,
    /// `banning` holds them and checks take [`MemoryStore::with_bans`].
    reg: Registered<K>,
    clock: C,
    /// What every clone shares: the policies registered through any of them.
    registry: Arc<Registry<K, C>>,
    /// Run once by the next check or reservation that takes [`MemoryStore::with_bans`],
    /// between its first look at the bans and its charge (tests race requests with it).
    #[cfg(test)]
    before_charge: BeforeCharge<K, C>,
}

/// See `MemoryStore::before_charge`.
#[cfg(test)]
type BeforeCharge<K, C> = std::sync::Mutex<Option<Box<dyn FnOnce(&MemoryStore<K, C>) + Send>>>;

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
            reg: Registered::new(),
            clock,
            registry: Arc::new(Registry::new()),
            #[cfg(test)]
            before_charge: std::sync::Mutex::new(None),
        }
    }

    /// Runs the hook of `before_charge`, if one is set.
    #[cfg(test)]
    fn run_before_charge(&self) {
        let hook = crate::algorithm::lock(&self.before_charge).take();
        if let Some(hook) = hook {
            hook(self);
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
    /// counted ([`MemoryStore::overflowed`]). A check that charges nothing (cost 0, or a cost
    /// that can never fit) of a key that is not held reports the overflow state while
    /// `max_keys` keys are held, the state a charge would go to.
    ///
    /// Receipts say which state a charge was made on: the refund of a charge on the
    /// overflow state goes back to the overflow state, even once the key holds a state of
    /// its own; the refund of a charge on a key's own state gives back nothing once that
    /// state is gone (evicted when idle, or reset).
    ///
    /// A reset ([`MemoryStore::forget`], [`Store::reset`](super::Store::reset)) of a key on the overflow state
    /// gives it a fresh state of its own, taking room in the cap (sweeping idle keys if need
    /// be); when every key held is live it fails with [`StoreError::KeysFull`] and resets
    /// nothing.
    ///
    /// Sweeps that make room run at most once per `max(max_keys / 2, 256)` new keys or
    /// overflowed decisions, so a small cap does not sweep on every request.
    ///
    /// The cap is the store's: it applies through every clone of this store (see
    /// [`MemoryStore`], "Clones").
    pub fn with_max_keys(self, max_keys: NonZeroUsize) -> Self {
        let latest = self.registry.lock();
        self.registry
            .max_keys
            .store(max_keys.get(), Ordering::Relaxed);
        for entry in latest.entries() {
            with_keyed!(&entry.1, k => k.max_keys.store(max_keys.get(), Ordering::Relaxed));
        }
        for bans in latest.bans.iter().flatten() {
            bans.max_keys.store(max_keys.get(), Ordering::Relaxed);
        }
        drop(latest);
        self
    }

    /// A handle with every policy registered so far through any clone, when this one's
    /// list is older (`None`: it is up to date).
    // Inlined: the up-to-date test (one atomic load and a compare) is on every check; only
    // the refresh is out of line.
    #[inline]
    fn refreshed(&self) -> Option<Self> {
        if self.is_current() {
            return None;
        }
        self.refresh()
    }

    /// Whether this handle knows every policy registered through any clone.
    #[inline]
    fn is_current(&self) -> bool {
        self.registry.count() == self.reg.len()
    }

    /// [`MemoryStore::refreshed`] for a handle whose list is older than the registry's.
    #[cold]
    #[inline(never)]
    fn refresh(&self) -> Option<Self> {
        self.registry.refresh.get().map(|refresh| refresh(self))
    }

    /// Decisions made on the shared overflow state because a policy held `max_keys` keys,
    /// summed over policies. Each is also counted by the [`metrics`] counter
    /// `ratekeeper_memory_store_overflowed_total` (label `policy`).
    pub fn overflowed(&self) -> u64 {
        if let Some(fresh) = self.refreshed() {
            return fresh.overflowed();
        }
        self.registered()
            .map(|(_, slot)| with_keyed!(slot, k => k.overflowed.load(Ordering::Relaxed)))
            .sum()
    }

    /// The store's clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// The registered policies, in registration order.
    fn registered(&self) -> impl Iterator<Item = (&Policy, &Slot<K>)> {
        self.reg.entries().iter().map(|e| (&e.0, &e.1))
    }

    fn slot(&self, id: PolicyId) -> Result<&Slot<K>, StoreError> {
        self.reg
            .entries()
            .get(id.index())
            .map(|e| &e.1)
            .ok_or_else(|| StoreError::UnknownPolicy(id))
    }

    /// The policy registered under `id` through this handle, or through any clone before
    /// this handle was made (`None` otherwise).
    pub fn policy(&self, id: PolicyId) -> Option<&Policy> {
        self.reg.entries().get(id.index()).map(|e| &e.0)
    }

    /// Checks `charges` all-or-nothing at the clock's current time. Same as [`Store::check`](super::Store::check)
    /// without the [`Checked`](super::Checked) wrapper.
    ///
    /// # Errors
    ///
    /// [`StoreError::UnknownPolicy`] when a charge names a policy this store never registered
    /// (nothing is charged then).
    pub fn check_now(&self, charges: &[Charge<'_, K>]) -> Result<Decisions, StoreError> {
        self.check_at(charges, self.clock.now())
    }

    /// A check at `now` on the policies registered through any clone (see
    /// [`MemoryStore::check_known`]).
    #[inline]
    fn check_at(&self, charges: &[Charge<'_, K>], now: u64) -> Result<Decisions, StoreError> {
        if !self.is_current() {
            return self.check_refreshed(charges, now);
        }
        self.check_known(charges, now)
    }

    /// [`MemoryStore::check_at`] through a handle that does not know every registered
    /// policy: out of line, so the usual check inlines one copy of the check.
    #[cold]
    #[inline(never)]
    fn check_refreshed(
        &self,
        charges: &[Charge<'_, K>],
        now: u64,
    ) -> Result<Decisions, StoreError> {
        match self.refresh() {
            Some(fresh) => fresh.check_known(charges, now),
            None => self.check_known(charges, now),
        }
    }

    /// A check at `now` on the policies this handle knows: [`MemoryStore::with_bans`] when
    /// some policy has a ban, else [`MemoryStore::check_plain`]. Not recursive, so that
    /// [`MemoryStore::check_at`] inlines into its caller.
    #[inline]
    fn check_known(&self, charges: &[Charge<'_, K>], now: u64) -> Result<Decisions, StoreError> {
        if self.reg.has_bans {
            return self.with_bans(charges, now, None);
        }
        self.check_plain(charges, now)
    }

    /// One charge (the common case) inlines into the caller so the decision and its receipt
    /// are written in place; several charges go through [`MemoryStore::all_or_nothing`].
    #[inline]
    fn check_plain(&self, charges: &[Charge<'_, K>], now: u64) -> Result<Decisions, StoreError> {
        if let [only] = charges {
            let (d, receipt) = self.check_one(only, now)?;
            return Ok(Decisions::one_with_receipt(d, receipt));
        }
        self.all_or_nothing(charges, now, false, |slot, c| {
            let (decision, receipt) = with_keyed!(slot, k => k.check(c.key, now, c.cost));
            Reserved {
                decision,
                receipt,
                delay: 0,
                exact: false,
            }
        })
    }

    /// The decision and receipt of one charge.
    #[inline(always)]
    fn check_one(&self, only: &Charge<'_, K>, now: u64) -> Result<(Decision, Receipt), StoreError> {
        let slot = self.slot(only.policy)?;
        Ok(with_keyed!(slot, k => k.check(only.key, now, only.cost)))
    }

    /// Reserves `charges` all-or-nothing at the clock's current time for a request that may
    /// wait up to `max_wait`. Same as [`Store::reserve`](super::Store::reserve) without the [`Checked`](super::Checked) wrapper.
    ///
    /// Exact for GCRA ([`Gcra::reserve`](crate::algorithm::Gcra::reserve)) and the leaky
    /// bucket (the shaper, [`LeakyBucket::shape`](crate::algorithm::LeakyBucket::shape)): the
    /// answer charges now and gives the delay. The fixed window, sliding log, sliding window
    /// counter and concurrency counter cannot reserve: for them a reservation is a check
    /// (allowed now, or denied with a `retry_after` that is not final), so a request limited
    /// by them falls back to check-and-retry. A dropped reservation is given back with
    /// [`Store::refund`](super::Store::refund) and the receipts of the answer; while later reservations wait behind
    /// it, its slot stays unused rather than handed to a newcomer.
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
        if let Some(fresh) = self.refreshed() {
            return fresh.reserve_now(charges, std::time::Duration::from_nanos(max_wait));
        }
        let now = self.clock.now();
        if self.reg.has_bans {
            return self.with_bans(charges, now, Some(max_wait));
        }
        self.reserve_at(charges, now, max_wait)
    }

    /// Keys held across all policies.
    pub fn len(&self) -> usize {
        if let Some(fresh) = self.refreshed() {
            return fresh.len();
        }
        self.registered()
            .map(|(_, slot)| with_keyed!(slot, k => k.len()))
            .sum()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Evicts every idle key now (the store also does this by itself as keys are added).
    pub fn sweep(&self) {
        if let Some(fresh) = self.refreshed() {
            return fresh.sweep();
        }
        let now = self.clock.now();
        for (_, slot) in self.registered() {
            with_keyed!(slot, k => k.sweep(now));
        }
        for bans in self.reg.bans.iter().flatten() {
            bans.sweep(now);
        }
    }
}

/// A handle on the same store: the same key state, the same registry of policies (a policy
/// registered through any clone is known to every clone) and a clone of the clock (the
/// clocks of this crate share their time with their clones).
impl<K, C: Clone> Clone for MemoryStore<K, C> {
    fn clone(&self) -> Self {
        let _ = self.registry.refresh.set(Self::clone);
        Self {
            reg: self.registry.snapshot(),
            clock: self.clock.clone(),
            registry: Arc::clone(&self.registry),
            #[cfg(test)]
            before_charge: std::sync::Mutex::new(None),
        }
    }
}

impl<K, C: fmt::Debug> fmt::Debug for MemoryStore<K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field(
                "policies",
                &self
                    .reg
                    .entries()
                    .iter()
                    .map(|e| e.0.name())
                    .collect::<Vec<_>>(),
            )
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod ban_tests;
#[cfg(test)]
mod correct_tests;
#[cfg(test)]
mod edge_tests;
#[cfg(test)]
mod lane_tests;
#[cfg(test)]
mod refund_tests;
#[cfg(test)]
mod reset_tests;
#[cfg(test)]
mod tests;
