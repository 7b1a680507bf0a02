//! The state a [`TieredStore`](super::TieredStore) shares with its background renewals,
//! returns and sweeper: the leases by (policy, client key), the queue of lease visits, the
//! lease settings and the counters.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use dashmap::DashMap;
use dashmap::mapref::entry::Entry;

use super::lease::{LEASE_BIT, Lease, LeaseState, TierPolicy, Unused};
use super::nanos;
use crate::Key;
use crate::clock::Clock;
use crate::store::redis::{Invalidated, LeaseGrant, OwnedCharge, RedisStore};
use crate::store::{Charge, PolicyId, Receipt, Refund, Store};

type LeaseMap = DashMap<(PolicyId, Key), Arc<Lease>, foldhash::fast::RandomState>;

/// The most lease visits one sweeper tick makes (bounded work per tick; a backlog beyond it
/// is visited at the next ticks).
pub(super) const SWEEP_BUDGET: usize = 4_096;

/// A visit the sweeper owes a lease at `due` (ns): give back its units if they expired,
/// remove the entry if it is idle. Ordered by `due` only.
#[derive(Debug)]
pub(super) struct Visit {
    due: u64,
    policy: PolicyId,
    key: Key,
}

impl PartialEq for Visit {
    fn eq(&self, other: &Self) -> bool {
        self.due == other.due
    }
}

impl Eq for Visit {}

impl PartialOrd for Visit {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Visit {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.due.cmp(&other.due)
    }
}

pub(super) struct Inner {
    pub(super) leases: LeaseMap,
    pub(super) max_lease: u64,
    /// Lease period and TTL, ns.
    pub(super) period: u64,
    pub(super) ttl: u64,
    /// The visits owed, earliest first: one per lease entry at a time (`visit_at`).
    pub(super) visits: Mutex<BinaryHeap<Reverse<Visit>>>,
    /// A sweeper task is running (set before it is spawned, cleared when it ends).
    pub(super) sweeper: AtomicBool,
    /// The Redis store's decision clock (ns).
    pub(super) clock: Arc<dyn Clock>,
    pub(super) generation: AtomicU64,
    /// Bumped by [`TieredStore::shutdown`](super::TieredStore::shutdown): background
    /// renewals started before give up.
    pub(super) epoch: AtomicU64,
    pub(super) decisions: AtomicU64,
    pub(super) local: AtomicU64,
    pub(super) round_trips: AtomicU64,
    pub(super) prefetches: AtomicU64,
    pub(super) returned: AtomicU64,
    /// Client keys whose unused units are on their way back to Redis in background tasks.
    pub(super) returning: AtomicUsize,
    /// Notified each time such a task ends.
    pub(super) returns_done: tokio::sync::Notify,
    /// Per policy registered through any handle (clone) of the store, what local decisions
    /// need.
    pub(super) tiers: Mutex<Vec<TierPolicy>>,
}

impl Inner {
    /// The registered policies' local parameters, locked (a poisoned lock is taken over:
    /// every change is a single push).
    pub(super) fn lock_tiers(&self) -> std::sync::MutexGuard<'_, Vec<TierPolicy>> {
        self.tiers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The local parameters of `policy`, registered through any handle.
    pub(super) fn tier(&self, policy: PolicyId) -> Option<TierPolicy> {
        self.lock_tiers().get(policy.index()).copied()
    }

    pub(super) fn next_generation(&self) -> u64 {
        self.generation.fetch_add(1, Ordering::Relaxed) & !LEASE_BIT
    }

    /// The lease entry of (policy, key); a new entry is scheduled for its idle visit one
    /// TTL after `now`.
    pub(super) fn lease_of(&self, policy: PolicyId, key: &Key, now: u64) -> Arc<Lease> {
        let id = (policy, key.clone());
        if let Some(lease) = self.leases.get(&id) {
            return Arc::clone(&lease);
        }
        match self.leases.entry(id) {
            Entry::Occupied(e) => Arc::clone(e.get()),
            Entry::Vacant(e) => {
                let lease = Arc::new(Lease::default());
                self.schedule(&mut lease.lock(), policy, key, now.saturating_add(self.ttl));
                Arc::clone(e.insert(lease).value())
            }
        }
    }

    /// Owes the lease `state` of (policy, key) a visit at `due`, unless one is owed sooner.
    pub(super) fn schedule(&self, state: &mut LeaseState, policy: PolicyId, key: &Key, due: u64) {
        if state.visit_at != 0 && state.visit_at <= due {
            return;
        }
        let due = due.max(1);
        state.visit_at = due;
        self.visits
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Reverse(Visit {
                due,
                policy,
                key: key.clone(),
            }));
    }

    /// Makes the visits due at `now`, at most [`SWEEP_BUDGET`]: expired units go back to
    /// Redis, entries idle for a TTL (no units, no request, no renewal, no other user) are
    /// removed, the others are owed their next visit.
    pub(super) fn sweep(self: &Arc<Self>, redis: &Arc<RedisStore>, now: u64) {
        let mut returns = Vec::new();
        for _ in 0..SWEEP_BUDGET {
            let visit = {
                let mut visits = self.visits.lock().unwrap_or_else(PoisonError::into_inner);
                match visits.peek() {
                    Some(Reverse(v)) if v.due <= now => visits.pop(),
                    _ => None,
                }
            };
            let Some(Reverse(Visit { due, policy, key })) = visit else {
                break;
            };
            let id = (policy, key);
            let Some(lease) = self.leases.get(&id).map(|l| Arc::clone(&l)) else {
                continue;
            };
            let idle = {
                let mut s = lease.lock();
                if s.visit_at != due {
                    // Superseded by a sooner visit (a grant), which was made already.
                    continue;
                }
                s.visit_at = 0;
                if let Some(unused) = s.expire(now) {
                    returns.push((policy, id.1.clone(), unused));
                }
                let idle = s.is_idle(now, self.ttl);
                if !idle {
                    let next = s.next_visit(self.ttl);
                    let next = if next > now {
                        next
                    } else {
                        now.saturating_add(self.period)
                    };
                    self.schedule(&mut s, policy, &id.1, next);
                }
                idle
            };
            drop(lease);
            if idle {
                let removed = self.leases.remove_if(&id, |_, lease| {
                    Arc::strong_count(lease) == 1 && {
                        let s = lease.lock();
                        s.visit_at == 0 && s.is_idle(now, self.ttl)
                    }
                });
                if removed.is_none() {
                    // In use right now: look again a TTL later.
                    if let Some(lease) = self.leases.get(&id).map(|l| Arc::clone(&l)) {
                        let due = now.saturating_add(self.ttl);
                        self.schedule(&mut lease.lock(), policy, &id.1, due);
                    }
                }
            }
        }
        give_back(redis, self, returns);
    }

    /// When the units of a grant taken at `now` expire: after the TTL, and for the fixed
    /// window at the end of the window they were charged in.
    pub(super) fn expiry(&self, now: u64, fixed_window: bool, reset_after: Duration) -> u64 {
        let ttl = now.saturating_add(self.ttl);
        if fixed_window {
            ttl.min(now.saturating_add(nanos(reset_after)))
        } else {
            ttl
        }
    }

    /// Adds the units of `grant`, taken at `now` by a call sent at `sent`, to the lease
    /// `state`, with their expiry (counted from `sent`, so no later than the lease TTL after
    /// the script ran, as the lease record in Redis assumes).
    /// The lease's expiry is owed a visit, so the units come back even if no request of the
    /// key comes again. Returns the units the lease still held when it had expired by `now`
    /// (the grant starts a new lease): the caller gives them back to Redis.
    #[must_use = "the expired lease's unused units must go back to Redis"]
    pub(super) fn add_grant(
        &self,
        state: &mut LeaseState,
        (policy, key): (PolicyId, &Key),
        (sent, now): (u64, u64),
        fixed_window: bool,
        grant: &LeaseGrant,
    ) -> Option<Unused> {
        let expired = state.expire(now);
        let expires = self.expiry(sent.min(now), fixed_window, grant.decision.reset_after());
        state.add(
            now,
            grant.granted,
            grant.decision,
            grant.receipt,
            expires,
            || self.next_generation(),
        );
        self.schedule(state, policy, key, expires);
        expired
    }

    /// How long a denial from the lease script may be remembered: until another instance's
    /// lease could have given units back (its TTL, then one sweeper period), ns.
    /// A reset published through the invalidation channel (by any instance): the leases of
    /// the key under the policies reset are dropped without giving their units back (the
    /// reset forgot them in Redis and fenced their receipts) and forget their remembered
    /// denials, so the next request asks Redis. When the channel was subscribed again
    /// ([`Invalidated::All`]: a reset may have been missed) every lease forgets its
    /// remembered denial.
    pub(super) fn invalidate(&self, what: &Invalidated) {
        // The leases first, then their locks (never a lease's lock under the map's).
        let leases: Vec<Arc<Lease>> = self
            .leases
            .iter()
            .filter(|e| {
                let (policy, key) = e.key();
                what.covers(*policy, key)
            })
            .map(|e| Arc::clone(e.value()))
            .collect();
        for lease in leases {
            let mut s = lease.lock();
            if matches!(what, Invalidated::Key { .. }) {
                let _ = s.take();
            }
            s.forget_denial();
        }
    }

    pub(super) fn denial_bound(&self) -> u64 {
        self.ttl.saturating_add(self.period)
    }

    /// How long after a lease call its unspent units are given back at the latest: the
    /// lease TTL (counted from when the call was sent), then one sweeper period. The Redis
    /// store adds the give-back call's own allowance when it records the lease.
    pub(super) fn back_within(&self) -> Duration {
        Duration::from_nanos(self.denial_bound())
    }
}

/// Gives `unused` units of (policy, key) back to Redis in a background task on the current
/// runtime, counted in [`Inner::returning`] until it ends, so [`Inner::settled`] can wait for
/// it (outside a runtime the Redis store drops the refund with a warning).
pub(super) fn give_back(
    redis: &Arc<RedisStore>,
    inner: &Arc<Inner>,
    returns: Vec<(PolicyId, Key, Unused)>,
) {
    if returns.is_empty() {
        return;
    }
    for (_, _, u) in &returns {
        inner.returned.fetch_add(u.units, Ordering::Relaxed);
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        let refunds: Vec<Refund<'_, Key>> = returns
            .iter()
            .map(|(p, k, u)| Refund::new(Charge::new(*p, k, u.units), u.receipt))
            .collect();
        redis.refund(&refunds);
        return;
    };
    let refunds: Vec<(OwnedCharge, Receipt)> = returns
        .into_iter()
        .map(|(p, k, u)| ((p, k, u.units), u.receipt))
        .collect();
    let returning = Returning::start(inner, refunds.len());
    let redis = Arc::clone(redis);
    runtime.spawn(async move {
        // Failures are counted and logged by the Redis store; the units then stay charged
        // until their Redis state expires.
        let _ = redis.refund_async(&refunds).await;
        drop(returning);
    });
}

/// One background give-back in flight: counted in [`Inner::returning`] from its start until
/// it is dropped (it ended, or its runtime shut down).
struct Returning {
    inner: Arc<Inner>,
    keys: usize,
}

impl Returning {
    fn start(inner: &Arc<Inner>, keys: usize) -> Self {
        inner.returning.fetch_add(keys, Ordering::AcqRel);
        Self {
            inner: Arc::clone(inner),
            keys,
        }
    }
}

impl Drop for Returning {
    fn drop(&mut self) {
        self.inner.returning.fetch_sub(self.keys, Ordering::AcqRel);
        self.inner.returns_done.notify_waiters();
    }
}

impl Inner {
    /// Waits until the background give-backs in flight now have ended: at most one Redis
    /// `deadline` per client key they return (each key's refund is one script call within
    /// the deadline).
    pub(super) async fn settled(&self, deadline: Duration) {
        let keys = self.returning.load(Ordering::Acquire);
        if keys == 0 {
            return;
        }
        let all_ended = async {
            loop {
                let mut ended = std::pin::pin!(self.returns_done.notified());
                ended.as_mut().enable();
                if self.returning.load(Ordering::Acquire) == 0 {
                    return;
                }
                ended.await;
            }
        };
        let bound = deadline.saturating_mul(u32::try_from(keys).unwrap_or(u32::MAX));
        // Past the bound the refunds have failed by their own deadline (and were logged).
        let _ = tokio::time::timeout(bound, all_ended).await;
    }
}

/// Starts the background sweeper of `inner` on the current tokio runtime, unless one is
/// running or there is no runtime (then the next check tries again). It holds only weak
/// references: it ends at its first tick after the store is dropped.
pub(super) fn start_sweeper(inner: &Arc<Inner>, redis: &Arc<RedisStore>) {
    if inner.sweeper.load(Ordering::Relaxed) || inner.sweeper.swap(true, Ordering::AcqRel) {
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        inner.sweeper.store(false, Ordering::Release);
        return;
    };
    let running = Running(Arc::downgrade(inner));
    let redis = Arc::downgrade(redis);
    let period = Duration::from_nanos(inner.period.max(1));
    runtime.spawn(async move {
        let running = running;
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let (Some(inner), Some(redis)) = (running.0.upgrade(), redis.upgrade()) else {
                return;
            };
            inner.sweep(&redis, inner.clock.now());
        }
    });
}

/// Clears the sweeper flag when the sweeper task ends or is dropped (its runtime shut down),
/// so a later check starts another one.
struct Running(Weak<Inner>);

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(inner) = self.0.upgrade() {
            inner.sweeper.store(false, Ordering::Release);
        }
    }
}
