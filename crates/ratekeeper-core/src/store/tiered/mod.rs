//! The tiered store (feature `redis`): leases of units from Redis, spent locally.
//!
//! [`TieredStore`] wraps a [`RedisStore`] and implements the same [`Store<Key>`] trait, so the
//! HTTP layer uses it unchanged. For each (policy, client key) an instance **leases** N units
//! from Redis in one script call, spends them locally with no I/O, renews before they run
//! out, and gives back what it did not use when the lease ends. This is the two-tier scheme
//! for very high throughput: take tokens from Redis in batches, keep the rest in local memory.
//!
//! # How it decides
//!
//! - **The lease script** charges between `need` (the request's cost) and `want` (N minus the
//!   units still held) units on the key's Redis state (the same key and state format as the
//!   [`RedisStore`]: GCRA `"<TAT>:<T>:<tau>"` or fixed window `"<window>:<count>:<W>"`, µs) in one
//!   atomic call and returns how many it granted. Partial grants are allowed, but never below
//!   `need` (fewer available is a denial, which writes nothing). Every write sets a TTL
//!   (`PX`: until the TAT, or until the window ends).
//! - **Lease ahead only from the upper half**: with `room` units left in Redis and
//!   `reserve = ceil(capacity / 2)` (the burst for GCRA, the limit for the fixed window), a
//!   grant is `min(want, max(need, room - reserve))`. Units taken ahead of the request that
//!   asked come only from the upper half of the bucket or window, so batches **shrink near
//!   the limit** (never more than half of what is left) and in the lower half every instance
//!   takes exactly what its request costs: the units a client is still owed there are in
//!   Redis, not sitting unspent on an instance the client no longer talks to. A client whose
//!   traffic moves from one instance to another (a deploy drains the first, the load
//!   balancer moves it) therefore finds at once, on the new instance, everything it is owed
//!   below half of its capacity; units taken ahead above that come back when their lease
//!   ends (below).
//! - **N adapts to the key's local rate**: N is the number of units this instance was asked
//!   for in one lease period ([`TieredStoreBuilder::lease_period`], default 100 ms; the busier
//!   of the current and the previous period), between 1 and
//!   [`TieredStoreBuilder::max_lease`] (default 100). A **cold key** (N no larger than the
//!   request's cost) is checked by the Redis store itself, one round trip per request, so its
//!   decisions, headers and receipts are exactly the Redis store's. So are checks of several
//!   policies at once and free probes (cost 0).
//! - **Local spending**: a request whose cost the held units cover is allowed at once
//!   ([`Checked::Ready`], no I/O). Its `remaining` is Redis's `remaining` after the latest
//!   grant plus the units still held (so it lags what other instances did since); its
//!   `reset_after` counts down from the latest grant's.
//! - **Single-flight renewal**: when a spend leaves at most a quarter of N held, one
//!   background renewal tops the lease up to N while requests go on spending the remainder
//!   (it needs nothing, so in the lower half it takes nothing, and no other background
//!   renewal of the key follows for a lease period).
//!   A request that finds too few units waits for the renewal in flight (one per (policy,
//!   key), behind an async mutex), then spends from it or makes the next one.
//! - **Denials** from the lease script are remembered (for the same or a larger cost) until
//!   their `retry_after` or for at most `lease_ttl + lease_period`, whichever is sooner: the
//!   Redis state that denied may count units other instances hold and will give back within
//!   that time (below), so a remembered denial never outlives them. A cold key's denial is
//!   not remembered at all (its check goes to Redis every time, at most about once per
//!   lease period).
//! - **A denial's `retry_after` never outwaits leased units**: each grant records, next to
//!   the key's state in Redis (key `<state key>#leased`, same hash tag), the units it took
//!   ahead of the request that asked and when they are back at the latest: the lease TTL
//!   (counted from when the lease call was sent), one lease period (the sweeper) and the
//!   Redis store's deadline plus stale tolerance (the give-back's own call). The record is
//!   an upper bound (units spent or given back meanwhile are not taken off) and expires at
//!   that time. A denial decided while it lists units is told to come back when they are
//!   back, unless the quota needs longer even with them back: for GCRA `retry_after`
//!   shortened by `units × T` but not below that time, for the fixed window that time
//!   when the units cover what the request lacks (else the window's end). A cold key's
//!   denial whose `retry_after` is longer than `lease_ttl + lease_period` reads the record
//!   (one more round trip, writing nothing) and is bounded the same way; if that read
//!   fails, Redis's `retry_after` stands. The units may have been spent meanwhile: a
//!   client that comes back then and is denied again gets the quota's own `retry_after`
//!   once the record has expired.
//! - **The end of a lease**: units not spent within [`TieredStoreBuilder::lease_ttl`] (default
//!   1 s; for the fixed window also at the end of the window the units were charged in) go
//!   back to Redis through the Redis store's refund (its script's `refund` mode, with the
//!   grant's receipt, so a refund gives back only what the grant still holds there), as do
//!   the units held when the store is dropped or [`TieredStore::shutdown`] is awaited.
//!   A **background sweeper** (a tokio task started by the first check, holding only weak
//!   references, so it ends when the store is dropped) visits every lease when it expires,
//!   once per lease period, so unused units go back within `lease_ttl + lease_period` even
//!   if the instance never sees the key again; it also removes the entries of keys idle for
//!   a TTL. Its work per tick is bounded (4 096 leases; a larger backlog waits for the next
//!   ticks). Each check also gives back its own key's expired units at once.
//! - **Refunds** of locally spent units go back into the lease they came from (while it
//!   lives; after that they free nothing: a lease is a count of units, so a unit given back
//!   is a unit, whatever the order); refunds of charges the Redis store made go to Redis
//!   ([`TieredStore::refund_async`] waits for them), where each gives back exactly what its
//!   charge still holds, in any order (see [`Receipt`]); a lease's
//!   unused units go back by its grant's receipt, from the top of the grant's own slot. The
//!   key's remembered denial is forgotten, as the Redis store's negative cache forgets a
//!   refunded key.
//! - **Peek and reset**: [`TieredStore::peek_async`] is the Redis store's peek with the units
//!   this instance holds added to `remaining`; [`TieredStore::reset_async`] drops this
//!   instance's lease of the key (its units are not spent nor given back) and resets the
//!   key in Redis, whose fence makes every later return of a lease taken before the reset
//!   give back nothing.
//! - **Corrections** ([`Store::correct`]): a give-back of locally spent units goes back into
//!   their lease while it lives; once it expired (the key's current or last ended lease),
//!   to Redis by the receipt of that lease's latest grant, which gives back what the grant
//!   still holds there; a give-back of the Redis store's charges goes to Redis. An extra
//!   charge spends the units this instance holds for the key first and charges the rest in
//!   Redis without refusing ([`TieredStore::correct_async`] waits for it). A request is
//!   corrected by the instance that served it (a lease's receipts mean nothing elsewhere).
//! - **Failures**: a lease call that fails, times out or is skipped by the Redis store's
//!   circuit breaker is answered by the Redis store's [`FailurePolicy`](super::FailurePolicy)
//!   (allow, deny, local or degrade), exactly as a failed check; units already held keep
//!   being spent until they run out or expire.
//!
//! # Supported algorithms
//!
//! [`Algorithm::Gcra`] and
//! [`Algorithm::FixedWindow`]. Registering any other
//! algorithm is a [`StoreError::UnsupportedAlgorithm`] when the limiter is built (the leaky
//! bucket smooths traffic, which batches would defeat; the sliding algorithms and the
//! concurrency counter have no batch to lease).
//!
//! # Bans
//!
//! A policy with a [`Ban`](crate::Ban) is **never leased**: each of its checks is the Redis
//! store's (one round trip; a ban in force is answered from the Redis store's negative cache
//! until its end). Every refusal must be counted in Redis, where the ban is kept, and a ban
//! must stop every instance at once: units leased before the ban would otherwise keep being
//! spent locally after it. The store's other policies lease as usual. Put the policy with a
//! ban (a login limit, say) in a layer of its own when the hot policies of the same
//! requests should stay leased: a check of several policies at once is the Redis store's
//! anyway.
//!
//! # The over-admission bound
//!
//! Units are charged in Redis when they are leased, before they are spent. With `I` instances
//! each holding at most `N_max` units (the [`max_lease`](TieredStoreBuilder::max_lease)) of a
//! (policy, key), the admissions of any time window `[t, t + W)` satisfy
//!
//! ```text
//! redis(W) - I * N_max  <=  admitted(W)  <=  redis(W) + I * N_max
//! ```
//!
//! where `redis(W)` is what the Redis store alone would admit in that window: for GCRA
//! `burst + W / T` (`T` the emission interval, ns), for the fixed window the limit per window.
//! The upper bound: units spent in the window were charged in it, or held at its start (at
//! most `I * N_max`). The lower bound (under steady load, every instance asking): at most
//! `I * N_max` units charged in the window are still held, unspent, at its end. For the fixed
//! window the upper bound is tighter in window-aligned terms (units expire when their window
//! ends, so a window admits at most its limit; the bound covers clock differences between the
//! app and Redis at the boundary). Across instances, over any prefix of time, admissions never
//! exceed what Redis charged.
//!
//! # Example
//!
//! ```
//! use std::num::NonZeroU32;
//! use std::time::Duration;
//! use ratekeeper_core::store::redis::RedisStore;
//! use ratekeeper_core::store::tiered::TieredStore;
//! use ratekeeper_core::store::{Charge, Checked, Store};
//! use ratekeeper_core::{Key, Policy, Quota};
//!
//! # struct Server(std::process::Child);
//! # impl Drop for Server {
//! #     fn drop(&mut self) { let _ = self.0.kill(); let _ = self.0.wait(); }
//! # }
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
//! # let _server = Server(std::process::Command::new("redis-server")
//! #     .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", ""])
//! #     .stdout(std::process::Stdio::null())
//! #     .spawn()?);
//! # for _ in 0..500 {
//! #     if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() { break; }
//! #     std::thread::sleep(Duration::from_millis(10));
//! # }
//! # let url = format!("redis://127.0.0.1:{port}/");
//! # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
//! let redis = RedisStore::builder()
//! #   .deadline(Duration::from_secs(5)) // the doc test on a loaded machine: no timeouts
//!     .standalone(&url)
//!     .await?;
//! let mut store = TieredStore::builder()
//!     .max_lease(NonZeroU32::new(50).unwrap())
//!     .lease_period(Duration::from_millis(100))
//!     .build(redis)?;
//! let api = store.register(&Policy::new("api", Quota::per_second(NonZeroU32::new(1000).unwrap())))?;
//! let hot = Key::from("hot");
//! let mut allowed = 0;
//! for _ in 0..500 {
//!     let decisions = match store.check(&[Charge::new(api, &hot, 1)]) {
//!         Checked::Ready(result) => result?,
//!         Checked::Pending(future) => future.await?,
//!     };
//!     allowed += usize::from(decisions.is_allowed());
//! }
//! assert_eq!(allowed, 500);
//! // Most of those were answered from leased units, without a round trip.
//! let stats = store.stats();
//! assert!(stats.round_trips < 100, "{stats:?}");
//! store.shutdown().await; // gives the unused units back to Redis
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # })
//! # }
//! ```

mod builder;
mod check;
mod inner;
mod lease;
mod reset;

pub use self::builder::{TieredConfigError, TieredStoreBuilder};

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use self::inner::{Inner, give_back};
use self::lease::{LEASE_BIT, Lease, TierPolicy};
use super::redis::{OwnedCharge, RedisCheck, RedisStore};
use super::{Charge, Checked, Correction, PolicyId, Receipt, Refund, Store, StoreError};
use crate::{Algorithm, Key, Policy};

pub(super) use crate::clock::nanos;

/// Counters of one [`TieredStore`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct TieredStats {
    /// Checks made.
    pub decisions: u64,
    /// Checks answered from leased units or a remembered denial, with no I/O.
    pub local: u64,
    /// Checks that made a Redis round trip on their own path (a lease, or a check delegated
    /// to the Redis store). `round_trips / decisions` is the share of decisions that needed
    /// one.
    pub round_trips: u64,
    /// Background renewals (round trips no request waited for).
    pub prefetches: u64,
    /// Units given back to Redis when leases ended.
    pub returned_units: u64,
}

/// Leases from Redis, spent locally: a [`Store<Key>`] for very hot keys shared by many
/// instances. See the [module docs](self) for the lease script, the adaptive lease size, the
/// single-flight renewal and the over-admission bound `I * N_max`.
///
/// # Runtime
///
/// Like the [`RedisStore`]: checks that go to Redis run on the tokio runtime that polls them
/// (with its I/O and time drivers); background renewals, the sweeper and the return of
/// unused units are spawned on the current runtime (skipped outside one: units then go back
/// when they expire in Redis).
///
/// # Clones
///
/// A clone is a handle on the same store: the same Redis store underneath (one connection,
/// one breaker, scripts loaded once), the same leases, sweeper and counters, and the same
/// registry of policies: a policy registered through any clone, at any time, is known to
/// every clone (a handle made before the registration looks it up under a lock until it is
/// cloned again). Give each layer a clone.
pub struct TieredStore {
    redis: Arc<RedisStore>,
    /// Per registered policy, as this handle knows them (`inner` has every one).
    policies: Vec<TierPolicy>,
    inner: Arc<Inner>,
}

impl Clone for TieredStore {
    fn clone(&self) -> Self {
        Self {
            redis: Arc::clone(&self.redis),
            policies: self.inner.lock_tiers().clone(),
            inner: Arc::clone(&self.inner),
        }
    }
}

impl fmt::Debug for TieredStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TieredStore")
            .field("redis", &self.redis)
            .field("max_lease", &self.inner.max_lease)
            .field("lease_period_ns", &self.inner.period)
            .field("lease_ttl_ns", &self.inner.ttl)
            .field("leases", &self.inner.leases.len())
            .finish_non_exhaustive()
    }
}

impl TieredStore {
    /// A builder with the defaults: at most 100 units per lease, lease period 100 ms, lease
    /// TTL 1 s.
    pub fn builder() -> TieredStoreBuilder {
        TieredStoreBuilder::default()
    }

    /// Counters since the store was built.
    pub fn stats(&self) -> TieredStats {
        let i = &self.inner;
        TieredStats {
            decisions: i.decisions.load(Ordering::Relaxed),
            local: i.local.load(Ordering::Relaxed),
            round_trips: i.round_trips.load(Ordering::Relaxed),
            prefetches: i.prefetches.load(Ordering::Relaxed),
            returned_units: i.returned.load(Ordering::Relaxed),
        }
    }

    /// The Redis store underneath (its key names, counters and breaker).
    pub fn redis(&self) -> &RedisStore {
        &self.redis
    }

    /// Units this instance holds for `policy` and `key` right now (0 without a live lease).
    pub fn held(&self, policy: PolicyId, key: &Key) -> u64 {
        let now = self.inner.clock.now();
        self.inner
            .leases
            .get(&(policy, key.clone()))
            .map_or(0, |lease| lease.lock().held(now))
    }

    /// Ends every lease (after the renewal in flight, if any) and waits until the unused units
    /// are back in Redis (within the Redis store's deadline per call), those of leases that
    /// expired earlier and are still on their way back included. Checks made afterwards
    /// lease again.
    ///
    /// # Errors
    ///
    /// The first Redis error (the other refunds are still sent; units not returned stay
    /// charged in Redis until their state expires).
    pub async fn shutdown(&self) -> Result<(), StoreError> {
        let leases: Vec<((PolicyId, Key), Arc<Lease>)> = self
            .inner
            .leases
            .iter()
            .map(|e| (e.key().clone(), Arc::clone(e.value())))
            .collect();
        let mut returns: Vec<(OwnedCharge, Receipt)> = Vec::new();
        // Background renewals started before this point give up.
        self.inner.epoch.fetch_add(1, Ordering::AcqRel);
        for ((policy, key), lease) in leases {
            // Wait for a renewal in flight, so its grant is returned too.
            let _renewal = lease.renew.lock().await;
            if let Some(unused) = lease.lock().take() {
                returns.push(((policy, key, unused.units), unused.receipt));
            }
        }
        for ((_, _, units), _) in &returns {
            self.inner.returned.fetch_add(*units, Ordering::Relaxed);
        }
        let result = if returns.is_empty() {
            Ok(())
        } else {
            self.redis.refund_async(&returns).await
        };
        // Units of leases that expired before (given back by the sweeper, a check or a
        // renewal) may still be on their way.
        self.inner.settled(self.redis.deadline()).await;
        result
    }

    /// [`Store::refund`], waiting until the charges the Redis store made are back in Redis
    /// (one script call per client key, within the Redis store's deadline) instead of
    /// sending them in the background. Units spent from a lease go back into it at once, as
    /// with [`Store::refund`].
    ///
    /// # Errors
    ///
    /// The Redis store's error for the part that goes to Redis (see
    /// [`RedisStore::refund_async`]).
    pub async fn refund_async(&self, refunds: &[Refund<'_, Key>]) -> Result<(), StoreError> {
        let to_redis: Vec<(OwnedCharge, Receipt)> = self
            .refund_local(refunds)
            .into_iter()
            .map(|r| {
                (
                    (r.charge.policy, r.charge.key.clone(), r.charge.cost),
                    r.receipt,
                )
            })
            .collect();
        if to_redis.is_empty() {
            return Ok(());
        }
        self.redis.refund_async(&to_redis).await
    }

    /// Gives units spent from a lease back into it; returns the refunds of charges the Redis
    /// store made, for Redis. Either way the key's remembered denial is forgotten (as the
    /// Redis store's negative cache forgets a refunded key): the units coming back may make
    /// the next request fit.
    fn refund_local<'a>(&self, refunds: &[Refund<'a, Key>]) -> Vec<Refund<'a, Key>> {
        let now = self.inner.clock.now();
        let mut to_redis = Vec::new();
        for refund in refunds {
            let Some(stamp) = refund.receipt.stamp() else {
                continue;
            };
            let id = (refund.charge.policy, refund.charge.key.clone());
            let lease = self.inner.leases.get(&id);
            if stamp & LEASE_BIT != 0 {
                if let Some(lease) = lease {
                    lease
                        .lock()
                        .give_back(now, stamp & !LEASE_BIT, refund.charge.cost);
                }
            } else {
                if let Some(lease) = lease {
                    lease.lock().forget_denial();
                }
                to_redis.push(*refund);
            }
        }
        to_redis
    }

    /// [`Store::correct`], waiting until the part that goes to Redis is there (one script
    /// call per client key, within the Redis store's deadline) instead of sending it in the
    /// background. Give-backs of units spent from a lease go back into it at once, and
    /// extra charges spend held units first, as with [`Store::correct`].
    ///
    /// # Errors
    ///
    /// The Redis store's error for the part that goes to Redis (see
    /// [`RedisStore::correct_async`]).
    pub async fn correct_async(
        &self,
        corrections: &[Correction<'_, Key>],
    ) -> Result<(), StoreError> {
        let to_redis: Vec<(OwnedCharge, Receipt, u64)> = self
            .correct_local(corrections)
            .into_iter()
            .map(|c| {
                let charge = c.charge;
                (
                    (charge.policy, charge.key.clone(), charge.cost),
                    c.receipt,
                    c.actual,
                )
            })
            .collect();
        if to_redis.is_empty() {
            return Ok(());
        }
        self.redis.correct_async(&to_redis).await
    }

    /// Settles corrections locally where their units are: a give-back of units spent from a
    /// lease goes back into it while it lives, and to Redis by the receipt of its latest
    /// grant once it expired (the key's current or last ended lease only; before that,
    /// nothing); an extra charge spends held units first.
    /// Returns what Redis must settle: give-backs of charges the Redis store made, and the
    /// part of each extra charge the lease did not cover (as a correction of a 0-unit charge
    /// without a receipt). A key given units back forgets its remembered denial.
    fn correct_local<'a>(&self, corrections: &[Correction<'a, Key>]) -> Vec<Correction<'a, Key>> {
        let now = self.inner.clock.now();
        let mut to_redis = Vec::new();
        for c in corrections {
            let charge = c.charge;
            let lease = self.inner.leases.get(&(charge.policy, charge.key.clone()));
            let (back, extra) = (c.give_back(), c.extra());
            if back > 0 {
                match c.receipt.stamp() {
                    Some(stamp) if stamp & LEASE_BIT != 0 => {
                        let generation = stamp & !LEASE_BIT;
                        let ended = lease.as_ref().and_then(|lease| {
                            let mut state = lease.lock();
                            if state.give_back(now, generation, back) {
                                None
                            } else {
                                state.grant_of(generation)
                            }
                        });
                        if let Some(grant) = ended {
                            // Its lease expired or ended: the units are charged in Redis
                            // under the grant, which gives back what it still holds.
                            let spent = Charge::new(charge.policy, charge.key, back);
                            to_redis.push(Correction::new(spent, grant, 0));
                        }
                    }
                    Some(_) => {
                        if let Some(lease) = &lease {
                            lease.lock().forget_denial();
                        }
                        to_redis.push(*c);
                    }
                    None => {}
                }
            }
            if extra > 0 {
                let covered = lease.as_ref().map_or(0, |l| l.lock().consume(now, extra));
                if covered < extra {
                    let rest = Charge::new(charge.policy, charge.key, 0);
                    to_redis.push(Correction::new(rest, Receipt::NONE, extra - covered));
                }
            }
        }
        to_redis
    }
}

impl Store<Key> for TieredStore {
    type Future = RedisCheck;

    /// Registers `policy` with the Redis store.
    ///
    /// # Errors
    ///
    /// [`StoreError::UnsupportedAlgorithm`] for algorithms other than GCRA and the fixed
    /// window; the Redis store's registration errors; [`StoreError::UnsupportedQuota`] once
    /// the store has been used.
    fn register(&mut self, policy: &Policy) -> Result<PolicyId, StoreError> {
        match policy.algorithm() {
            Algorithm::Gcra | Algorithm::FixedWindow => {}
            other => return Err(StoreError::UnsupportedAlgorithm(other)),
        }
        let mut tiers = self.inner.lock_tiers();
        // A handle on the same Redis store (clones share its registry), so the handles
        // that checks and background tasks hold see the policy too.
        let id = Arc::make_mut(&mut self.redis).register(policy)?;
        let (limit, _) = policy.advertised();
        tiers.push(TierPolicy {
            limit,
            capacity: policy.capacity(),
            fixed_window: policy.algorithm() == Algorithm::FixedWindow,
            ban: policy.ban().is_some(),
        });
        self.policies.clone_from(&tiers);
        Ok(id)
    }

    fn check(&self, charges: &[Charge<'_, Key>]) -> Checked<Self::Future> {
        self.check_leased(charges)
    }

    /// Units spent from a lease go back into it while it lives (otherwise nothing: the
    /// lease's unused units already went back to Redis); charges the Redis store made are
    /// refunded there (see [`Store::refund`] of [`RedisStore`]).
    fn refund(&self, refunds: &[Refund<'_, Key>]) {
        let to_redis = self.refund_local(refunds);
        if !to_redis.is_empty() {
            self.redis.refund(&to_redis);
        }
    }

    /// See [`TieredStore::peek_async`].
    fn peek(&self, policy: PolicyId, key: &Key) -> Checked<Self::Future> {
        self.peek_owned(policy, key)
    }

    /// See [`TieredStore::reset_async`].
    fn reset(&self, policy: Option<PolicyId>, key: &Key) -> Checked<Self::Future> {
        self.reset_owned(policy, key)
    }

    /// Give-backs of units spent from a lease go back into it while it lives, and to Redis by
    /// the receipt of its latest grant once it expired (for the key's current or last ended
    /// lease; older ones give back nothing); give-backs of charges the Redis store made go to Redis. An
    /// extra charge spends the units this instance holds for the key first, and the rest is
    /// charged in Redis without refusing (see [`Store::correct`] of [`RedisStore`]).
    fn correct(&self, corrections: &[Correction<'_, Key>]) {
        let to_redis = self.correct_local(corrections);
        if !to_redis.is_empty() {
            self.redis.correct(&to_redis);
        }
    }

    fn unix_now(&self) -> Duration {
        self.redis.unix_now()
    }
}

impl Drop for TieredStore {
    /// Gives the units still held back to Redis (spawned on the current runtime; outside one
    /// they stay charged until their Redis state expires).
    fn drop(&mut self) {
        let mut returns = Vec::new();
        for entry in &self.inner.leases {
            if let Some(unused) = entry.value().lock().take() {
                let (policy, key) = entry.key();
                returns.push((*policy, key.clone(), unused));
            }
        }
        give_back(&self.redis, &self.inner, returns);
    }
}
