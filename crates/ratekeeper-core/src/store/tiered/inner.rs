//! The state a [`TieredStore`](super::TieredStore) shares with its background renewals and
//! returns: the leases by (policy, client key), the lease settings and the counters.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use dashmap::DashMap;

use std::time::Duration;

use super::lease::{LEASE_BIT, Lease, LeaseState, Unused};
use super::nanos;
use crate::Key;
use crate::clock::Clock;
use crate::store::redis::{LeaseGrant, RedisStore};
use crate::store::{Charge, PolicyId, Refund, Store};

type LeaseMap = DashMap<(PolicyId, Key), Arc<Lease>, foldhash::fast::RandomState>;

pub(super) struct Inner {
    pub(super) leases: LeaseMap,
    pub(super) max_lease: u64,
    /// Lease period and TTL, ns.
    pub(super) period: u64,
    pub(super) ttl: u64,
    /// The Redis store's decision clock (ns).
    pub(super) clock: Arc<dyn Clock>,
    pub(super) generation: AtomicU64,
    /// Bumped by [`TieredStore::shutdown`]: background renewals started before give up.
    pub(super) epoch: AtomicU64,
    pub(super) last_sweep: AtomicU64,
    pub(super) decisions: AtomicU64,
    pub(super) local: AtomicU64,
    pub(super) round_trips: AtomicU64,
    pub(super) prefetches: AtomicU64,
    pub(super) returned: AtomicU64,
}

impl Inner {
    pub(super) fn next_generation(&self) -> u64 {
        self.generation.fetch_add(1, Ordering::Relaxed) & !LEASE_BIT
    }

    pub(super) fn lease_of(&self, policy: PolicyId, key: &Key) -> Arc<Lease> {
        let id = (policy, key.clone());
        if let Some(lease) = self.leases.get(&id) {
            return Arc::clone(&lease);
        }
        Arc::clone(&self.leases.entry(id).or_default())
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

    /// Adds the units of `grant`, taken at `now`, to the lease `state`, with their expiry.
    pub(super) fn add_grant(
        &self,
        state: &mut LeaseState,
        now: u64,
        fixed_window: bool,
        grant: &LeaseGrant,
    ) {
        let expires = self.expiry(now, fixed_window, grant.decision.reset_after());
        state.add(
            now,
            grant.granted,
            grant.decision,
            grant.receipt,
            expires,
            || self.next_generation(),
        );
    }
}

/// Gives `unused` units of (policy, key) back to Redis (spawned by the Redis store).
pub(super) fn give_back(redis: &RedisStore, inner: &Inner, returns: &[(PolicyId, Key, Unused)]) {
    if returns.is_empty() {
        return;
    }
    let refunds: Vec<Refund<'_, Key>> = returns
        .iter()
        .map(|(p, k, u)| {
            inner.returned.fetch_add(u.units, Ordering::Relaxed);
            Refund::new(Charge::new(*p, k, u.units), u.receipt)
        })
        .collect();
    redis.refund(&refunds);
}
