//! Counting on ratekeeper-core's stores: one policy per distinct (`requests_per_unit`,
//! period, algorithm), registered when a request first names it, and one hashed store key
//! per counter.
//!
//! No algorithm lives here: every decision is a [`Store::check`] of one charge.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::{PoisonError, RwLock};
use std::time::Duration;

use base64::Engine as _;
use ratekeeper_core::clock::Clock;
use ratekeeper_core::store::redis::RedisStore;
use ratekeeper_core::store::tiered::TieredStore;
use ratekeeper_core::store::{Charge, Checked, MemoryStore, PolicyId, Store, StoreError};
use ratekeeper_core::{Algorithm, Decision, Key, Policy, Quota};
use sha2::{Digest as _, Sha256};

use crate::clock::SharedClock;
use crate::config::OnStoreFailure;

/// The most distinct (limit, unit) pairs registered with the store. Configs name a handful;
/// request overrides could name more, and each registration is kept for the process's life.
pub(crate) const MAX_POLICIES: usize = 4_096;

/// Where counters live.
pub(crate) enum Backend {
    /// This process (the default): nothing else has to run.
    Memory(MemoryStore<Key, SharedClock>),
    /// Redis standalone or Cluster, shared by every instance.
    Redis(RedisStore),
    /// Redis with units leased to this instance.
    Tiered(TieredStore),
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.kind())
    }
}

impl Backend {
    /// The store's name: `memory`, `redis` or `tiered`.
    pub(crate) const fn kind(&self) -> &'static str {
        match self {
            Self::Memory(_) => "memory",
            Self::Redis(_) => "redis",
            Self::Tiered(_) => "tiered",
        }
    }

    fn register(&mut self, policy: &Policy) -> Result<PolicyId, StoreError> {
        match self {
            Self::Memory(s) => s.register(policy),
            Self::Redis(s) => s.register(policy),
            Self::Tiered(s) => s.register(policy),
        }
    }
}

/// A charge's answer, before it is awaited (the store's lock is released by then).
enum Pending {
    Ready(Result<ratekeeper_core::store::Decisions, StoreError>),
    Redis(<RedisStore as Store<Key>>::Future),
    Tiered(<TieredStore as Store<Key>>::Future),
}

/// One counter to charge.
#[derive(Debug, Clone)]
pub(crate) struct Hit {
    /// Units admitted per window (never 0: a limit of 0 is answered without the store).
    pub(crate) limit: NonZeroU32,
    /// The window (the period of the quota), in seconds.
    pub(crate) period_secs: u64,
    /// How the store counts.
    pub(crate) algorithm: Algorithm,
    /// What the limit answers when the store fails; `fail_soft` goes through the
    /// fail-soft handle.
    pub(crate) on_failure: OnStoreFailure,
    /// The counter's store key (hashed, see [`counter_key`]).
    pub(crate) key: Key,
    /// Units to charge (0 reads the counter).
    pub(crate) cost: u64,
}

/// Registered policies by (limit, period in seconds, algorithm).
type Policies = HashMap<(u32, u64, Algorithm), PolicyId>;

struct Inner {
    backend: Backend,
    policies: Policies,
    /// A second handle on the same Redis keys, built to fail soft (each replica enforces its
    /// share of the limit in memory while Redis is unreachable): for the limits whose
    /// `on_store_failure` is `fail_soft`.
    soft: Option<(RedisStore, Policies)>,
}

/// The store and its registry of policies.
pub(crate) struct Limiter {
    inner: RwLock<Inner>,
    clock: SharedClock,
}

impl std::fmt::Debug for Limiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter").finish_non_exhaustive()
    }
}

impl Limiter {
    /// A limiter over `backend`; `clock` gives the Unix time of a memory store's windows.
    pub(crate) fn new(backend: Backend, clock: SharedClock) -> Self {
        Self {
            inner: RwLock::new(Inner {
                backend,
                policies: HashMap::new(),
                soft: None,
            }),
            clock,
        }
    }

    /// Adds the fail-soft handle (a Redis store on the same keys, built with
    /// [`FailurePolicy::FailSoft`](ratekeeper_core::store::FailurePolicy::FailSoft)).
    pub(crate) fn with_fail_soft(self, store: RedisStore) -> Self {
        self.inner
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .soft = Some((store, HashMap::new()));
        self
    }

    /// The store's name (`memory`, `redis`, `tiered`).
    pub(crate) fn kind(&self) -> &'static str {
        self.read(|i| i.backend.kind())
    }

    fn read<T>(&self, f: impl FnOnce(&Inner) -> T) -> T {
        f(&self.inner.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// The policy of (`limit` per `period_secs`, `algorithm`), registered now if it is new.
    /// Fixed-window policies keep the name `rls_<limit>_per_<secs>s` (part of their store
    /// keys); the others are `rls_<algorithm>_<limit>_per_<secs>s`.
    ///
    /// # Errors
    ///
    /// The store's refusal, or [`StoreError::UnsupportedQuota`] past [`MAX_POLICIES`].
    #[cfg(test)]
    pub(crate) fn policy(
        &self,
        limit: NonZeroU32,
        period_secs: u64,
        algorithm: Algorithm,
    ) -> Result<PolicyId, StoreError> {
        self.policy_in(limit, period_secs, algorithm, false)
    }

    /// [`Limiter::policy`] in the main store, or (`soft`) in the fail-soft handle when there
    /// is one.
    fn policy_in(
        &self,
        limit: NonZeroU32,
        period_secs: u64,
        algorithm: Algorithm,
        soft: bool,
    ) -> Result<PolicyId, StoreError> {
        let pair = (limit.get(), period_secs, algorithm);
        let found = self.read(|i| match (&i.soft, soft) {
            (Some((_, map)), true) => map.get(&pair).copied(),
            _ => i.policies.get(&pair).copied(),
        });
        if let Some(id) = found {
            return Ok(id);
        }
        let mut guard = self.inner.write().unwrap_or_else(PoisonError::into_inner);
        let inner = &mut *guard;
        let soft = soft && inner.soft.is_some();
        let map = match &inner.soft {
            Some((_, map)) if soft => map,
            _ => &inner.policies,
        };
        if let Some(id) = map.get(&pair) {
            return Ok(*id);
        }
        if map.len() >= MAX_POLICIES {
            return Err(StoreError::UnsupportedQuota(format!(
                "more than {MAX_POLICIES} distinct limits"
            )));
        }
        let quota = Quota::new(limit.get(), Duration::from_secs(period_secs))
            .map_err(|e| StoreError::UnsupportedQuota(e.to_string()))?;
        let name = if algorithm == Algorithm::FixedWindow {
            format!("rls_{limit}_per_{period_secs}s")
        } else {
            format!(
                "rls_{}_{limit}_per_{period_secs}s",
                algorithm.name().replace('-', "_")
            )
        };
        let policy = Policy::new(name, quota).with_algorithm(algorithm);
        match &mut inner.soft {
            Some((store, map)) if soft => {
                let id = store.register(&policy)?;
                map.insert(pair, id);
                Ok(id)
            }
            _ => {
                let id = inner.backend.register(&policy)?;
                inner.policies.insert(pair, id);
                Ok(id)
            }
        }
    }

    /// Charges `hit.cost` units to `hit.key`'s window: allowed (and charged) or refused
    /// (and not charged), as the store decides.
    ///
    /// # Errors
    ///
    /// The store's error (its failure policy is in [`StoreError::failure_policy`]).
    pub(crate) async fn charge(&self, hit: &Hit) -> Result<Decision, StoreError> {
        let decisions = self
            .charge_all(
                std::slice::from_ref(hit),
                hit.on_failure == OnStoreFailure::FailSoft,
            )
            .await?;
        decisions
            .first()
            .copied()
            .ok_or(StoreError::UnsupportedOperation("an empty answer"))
    }

    /// Charges every hit all-or-nothing, in one store call: when one is refused, none is
    /// charged, and the others report their counters as they are. The decisions come back in
    /// `hits` order.
    ///
    /// # Errors
    ///
    /// The store's error (its failure policy is in [`StoreError::failure_policy`]).
    ///
    /// `soft`: through the fail-soft handle, when there is one (the same counters).
    pub(crate) async fn charge_all(
        &self,
        hits: &[Hit],
        soft: bool,
    ) -> Result<Vec<Decision>, StoreError> {
        let mut policies = Vec::with_capacity(hits.len());
        for hit in hits {
            policies.push(self.policy_in(hit.limit, hit.period_secs, hit.algorithm, soft)?);
        }
        let pending = self.read(|i| {
            let charges: Vec<Charge<'_, Key>> = hits
                .iter()
                .zip(&policies)
                .map(|(h, &p)| Charge::new(p, &h.key, h.cost))
                .collect();
            if let (Some((store, _)), true) = (&i.soft, soft) {
                return match store.check(&charges) {
                    Checked::Ready(r) => Pending::Ready(r),
                    Checked::Pending(f) => Pending::Redis(f),
                };
            }
            match &i.backend {
                Backend::Memory(s) => match s.check(&charges) {
                    Checked::Ready(r) => Pending::Ready(r),
                    Checked::Pending(f) => Pending::Ready(f.into_inner()),
                },
                Backend::Redis(s) => match s.check(&charges) {
                    Checked::Ready(r) => Pending::Ready(r),
                    Checked::Pending(f) => Pending::Redis(f),
                },
                Backend::Tiered(s) => match s.check(&charges) {
                    Checked::Ready(r) => Pending::Ready(r),
                    Checked::Pending(f) => Pending::Tiered(f),
                },
            }
        });
        let decisions = match pending {
            Pending::Ready(r) => r,
            Pending::Redis(f) => f.await,
            Pending::Tiered(f) => f.await,
        }?;
        Ok(decisions.as_slice().to_vec())
    }

    /// Wall-clock time since the Unix epoch as the store sees it (Redis `TIME` for a Redis
    /// store, the service's clock for the memory store).
    pub(crate) fn unix_now(&self) -> Duration {
        self.read(|i| match &i.backend {
            Backend::Memory(_) => self.clock.unix_now(),
            Backend::Redis(s) => s.unix_now(),
            Backend::Tiered(s) => s.unix_now(),
        })
    }

    /// Whether the store can decide now: always for memory; for Redis, connected with its
    /// circuit breaker closed.
    pub(crate) fn is_healthy(&self) -> bool {
        self.read(|i| match &i.backend {
            Backend::Memory(_) => true,
            Backend::Redis(s) => s.is_ready() && !s.is_breaker_open(),
            Backend::Tiered(s) => s.redis().is_ready() && !s.redis().is_breaker_open(),
        })
    }

    /// Gives leased units back to Redis (tiered store) before the process exits. Call it
    /// once no request is in flight: the limiter answers from a fresh memory store after.
    pub(crate) async fn shutdown(&self) {
        let taken = {
            let mut inner = self.inner.write().unwrap_or_else(PoisonError::into_inner);
            if !matches!(inner.backend, Backend::Tiered(_)) {
                return;
            }
            inner.policies.clear();
            let fresh = Backend::Memory(MemoryStore::with_clock(self.clock.clone()));
            std::mem::replace(&mut inner.backend, fresh)
        };
        if let Backend::Tiered(s) = taken
            && let Err(e) = s.shutdown().await
        {
            tracing::warn!(error = %e, "leased units not given back at shutdown");
        }
    }
}

/// The store key of a counter: `domain` and the rule's counter key, hashed (SHA-256,
/// 144 bits kept, base64url), so that descriptor values (which may be credentials) never
/// reach a store key in clear. `prefix` (the `CACHE_KEY_PREFIX`) is part of the hash, so two
/// services with different prefixes never share a counter.
pub(crate) fn counter_key(prefix: &str, domain: &str, counter: &str) -> Key {
    let mut h = Sha256::new();
    for part in [prefix, domain, counter] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    let digest = h.finalize();
    let text = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&digest[..18]);
    Key::from(text.as_str())
}

/// Seconds until the window of `period_secs` that holds `now` ends: `period − (now mod
/// period)` in whole seconds, never 0 (at a boundary, the whole period), as the reference
/// computes it.
pub(crate) fn until_reset(now: Duration, period_secs: u64) -> u64 {
    let period = period_secs.max(1);
    period - now.as_secs() % period
}

/// `duration_until_reset` from a store decision: its `reset_after` rounded up to whole
/// seconds, within [1, `period_secs`] (never 0, as the reference's).
pub(crate) fn reset_secs(decision: &Decision, period_secs: u64) -> u64 {
    ratekeeper_core::ceil_secs(decision.reset_after()).clamp(1, period_secs.max(1))
}

#[cfg(test)]
mod tests;
