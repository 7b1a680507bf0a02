//! The failure policy of the Redis store: what a decision becomes when Redis cannot make it
//! (timeout, error, stale call or open breaker).
//!
//! [`FailurePolicy::Local`] is answered here by an in-memory store with the same (or
//! overridden) policies, [`FailurePolicy::FailSoft`] by an in-memory store whose policies
//! are this instance's share of the fleet's quota; every other policy is carried to the HTTP
//! layer in [`StoreError::Failed`]. Each such decision is counted (`RedisStats::degraded` and
//! the `ratekeeper_store_degraded_total` counter, label `action`). The first degraded
//! decision of an outage is logged at WARN at once (then at most one such line per
//! [`WARN_EVERY`]); the circuit breaker logs its transitions; each other decision is a DEBUG
//! event (here for `Local` and `FailSoft`, by the HTTP layer for the others).

use std::collections::HashSet;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::OwnedCharge;
use crate::clock::Clock;
use crate::store::{Charge, Decisions, FailurePolicy, MemoryStore, PolicyId, Store, StoreError};
use crate::{Key, Policy};

/// A clock shared with the Redis store (so the local fallback sees injected time too).
#[derive(Clone)]
pub(super) struct ClockRef(pub(super) Arc<dyn Clock>);

impl Clock for ClockRef {
    fn now(&self) -> u64 {
        self.0.now()
    }
    fn unix_now(&self) -> Duration {
        self.0.unix_now()
    }
}

impl fmt::Debug for ClockRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClockRef")
    }
}

/// At most one "first degraded decision" WARN line per this many ns (10 s), so a Redis that
/// flaps does not flood the log; the breaker's own WARN and INFO lines are not limited.
pub(super) const WARN_EVERY: u64 = 10_000_000_000;

/// A degraded decision less than this many ns (1 s) after the previous one keeps the
/// fail-soft share of the previous outage: Redis answered only for a moment in between (a
/// probe that closed the breaker; on a Cluster with a primary down, the keys of the slots
/// that are up), and a share started afresh each time would give every key one more unit
/// per instance each time.
pub(super) const SHARE_KEPT: u64 = 1_000_000_000;

/// Where an outage stands, for its log lines and the fail-soft share store: shared by the
/// store, its check futures and the breaker's prober. Times are ns on the app's clock.
#[derive(Debug, Default)]
pub(super) struct Outage {
    /// A degraded decision was made since Redis last answered.
    during: AtomicBool,
    /// When the last "first degraded decision" WARN was written (0: never).
    warned_at: AtomicU64,
    /// When the last degraded decision was made (0: never).
    last_degraded: AtomicU64,
    /// The fleet size learned from Redis (live instances registered there; 0: not known).
    pub(super) instances: AtomicU32,
    /// The fail-soft store of the current (or last) outage, made at its first degraded
    /// decision; dropped when an outage begins [`SHARE_KEPT`] or more after the last
    /// degraded decision.
    share: Mutex<Option<Arc<Share>>>,
}

impl Outage {
    /// Redis answered: the outage (if any) is over; the next degraded decision starts a new
    /// one (with a fresh fail-soft share unless it comes within [`SHARE_KEPT`] of the last).
    pub(super) fn end(&self) {
        if self.during.load(Ordering::Relaxed) {
            self.during.store(false, Ordering::Relaxed);
        }
    }

    /// A degraded decision at `now`: whether it is the first of its outage (and so starts
    /// one), and whether its WARN line is due.
    fn begin(&self, now: u64) -> (bool, bool) {
        let previous = self.last_degraded.swap(now.max(1), Ordering::AcqRel);
        if self.during.load(Ordering::Relaxed) || self.during.swap(true, Ordering::AcqRel) {
            return (false, false);
        }
        if previous == 0 || now.saturating_sub(previous) >= SHARE_KEPT {
            if let Ok(mut share) = self.share.lock() {
                share.take();
            }
        }
        let last = self.warned_at.load(Ordering::Relaxed);
        let due = last == 0 || now.saturating_sub(last) >= WARN_EVERY;
        let due = due
            && self
                .warned_at
                .compare_exchange(last, now.max(1), Ordering::AcqRel, Ordering::Relaxed)
                .is_ok();
        (true, due)
    }
}

/// Most (policy, key) pairs one outage's fail-soft store remembers having started; later
/// new pairs start with a full share bucket.
const MAX_STARTED: usize = 1 << 20;

/// The in-memory store of an outage under [`FailurePolicy::FailSoft`].
#[derive(Debug)]
struct Share {
    store: Arc<MemoryStore<Key, ClockRef>>,
    /// Per policy: the units a key's share bucket is drained by when the key is first seen
    /// in the outage (its burst minus one), so it starts with one unit, not a full burst.
    prefill: Vec<u64>,
    /// Hashes of the (policy, key) pairs started in this outage.
    started: Mutex<HashSet<u64>>,
}

impl Share {
    /// Drains the share bucket of each (policy, key) of `charges` not seen before in this
    /// outage down to one unit, then checks `charges`.
    fn check(&self, charges: &[Charge<'_, Key>]) -> Result<Decisions, StoreError> {
        for c in charges {
            let prefill = self.prefill.get(c.policy.index()).copied().unwrap_or(0);
            if prefill > 0 && self.start(c.policy, c.key) {
                // Always fits a fresh bucket (burst - 1 <= burst); a refusal only means the
                // bucket was not fresh, which is the state wanted.
                let _ = self
                    .store
                    .check_now(&[Charge::new(c.policy, c.key, prefill)]);
            }
        }
        self.store.check_now(charges)
    }

    /// Whether `(policy, key)` is new in this outage (and now remembered).
    fn start(&self, policy: PolicyId, key: &Key) -> bool {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        (policy, key).hash(&mut hasher);
        let h = hasher.finish();
        let Ok(mut started) = self.started.lock() else {
            return false;
        };
        if started.len() >= MAX_STARTED {
            return false;
        }
        started.insert(h)
    }
}

/// The failure policy and, for [`FailurePolicy::Local`] and [`FailurePolicy::FailSoft`],
/// their in-memory stores. Cheap to clone.
#[derive(Debug, Clone)]
pub(super) struct Failover {
    pub(super) policy: FailurePolicy,
    local: Option<Arc<MemoryStore<Key, ClockRef>>>,
    /// The registered policies (for the fail-soft share store).
    policies: Arc<Vec<Policy>>,
    /// The configured fleet size (`RedisStoreBuilder::instances`).
    instances: Option<u32>,
    /// Failures in a row that open the circuit breaker (for the log).
    threshold: u32,
    clock: ClockRef,
    /// The app's clock (ns), for the WARN rate.
    app: ClockRef,
    pub(super) outage: Arc<Outage>,
}

impl Failover {
    /// The failure policy `policy`; with [`FailurePolicy::Local`] an in-memory store on
    /// `clock`; `instances` is the configured fleet size for [`FailurePolicy::FailSoft`].
    pub(super) fn new(
        policy: FailurePolicy,
        clock: &Arc<dyn Clock>,
        app: &Arc<dyn Clock>,
        instances: Option<u32>,
        threshold: u32,
    ) -> Self {
        let local = (policy == FailurePolicy::Local)
            .then(|| Arc::new(MemoryStore::with_clock(ClockRef(Arc::clone(clock)))));
        Self {
            policy,
            local,
            policies: Arc::new(Vec::new()),
            instances,
            threshold,
            clock: ClockRef(Arc::clone(clock)),
            app: ClockRef(Arc::clone(app)),
            outage: Arc::new(Outage::default()),
        }
    }

    /// Registers `policy` with the local store (the override of the same name among
    /// `overrides` if there is one), and remembers it for the fail-soft share. Called in the
    /// same order as the Redis registrations, so the policy ids agree.
    ///
    /// # Errors
    ///
    /// The local store's registration error.
    pub(super) fn register(
        &mut self,
        policy: &Policy,
        overrides: &[Policy],
    ) -> Result<(), StoreError> {
        if self.policy == FailurePolicy::FailSoft {
            // Every share of the policy must be representable (checked now, not mid-outage).
            for n in [1, self.instances.unwrap_or(1)] {
                MemoryStore::<Key>::new().register(&share_of(policy, n)?)?;
            }
            Arc::make_mut(&mut self.policies).push(policy.clone());
        }
        let Some(local) = &mut self.local else {
            return Ok(());
        };
        let local_policy = overrides
            .iter()
            .find(|p| p.name() == policy.name())
            .unwrap_or(policy);
        // A handle on the same local store (clones share its registry), so the handles
        // other checks hold see the policy too.
        Arc::make_mut(local).register(local_policy)?;
        Ok(())
    }

    /// Forgets `key` under `policy` (`None`: every policy) in the [`FailurePolicy::Local`]
    /// store, when there is one: a reset of the shared state resets its stand-in too.
    pub(super) fn reset_local(&self, policy: Option<crate::store::PolicyId>, key: &Key) {
        if let Some(local) = &self.local {
            // An unknown policy was refused by the Redis store already.
            let _ = local.reset_now(policy, key);
        }
    }

    /// Whether the store must learn the fleet size from Redis (fail-soft without a
    /// configured size).
    pub(super) fn learns_fleet(&self) -> bool {
        self.policy == FailurePolicy::FailSoft && self.instances.is_none()
    }

    /// The fleet size fail-soft divides by: the configured one, else the learned one.
    fn fleet(&self) -> Option<u32> {
        self.instances.or_else(|| {
            let learned = self.outage.instances.load(Ordering::Relaxed);
            (learned > 0).then_some(learned)
        })
    }

    /// The fail-soft store of this outage, made at its first decision with the policies
    /// divided by the fleet size then known; `None` while the fleet size is unknown.
    fn share(&self) -> Option<Arc<Share>> {
        let mut slot = self.outage.share.lock().ok()?;
        if let Some(share) = &*slot {
            return Some(Arc::clone(share));
        }
        let n = self.fleet()?;
        let mut store = MemoryStore::with_clock(self.clock.clone());
        let mut prefill = Vec::with_capacity(self.policies.len());
        for policy in self.policies.iter() {
            // Registered at build with the same arguments' shapes; a failure here leaves the
            // decision to `Deny` (never more than the share).
            let share = share_of(policy, n).ok()?;
            prefill.push(u64::from(share.capacity().saturating_sub(1)));
            store.register(&share).ok()?;
        }
        let share = Arc::new(Share {
            store: Arc::new(store),
            prefill,
            started: Mutex::new(HashSet::new()),
        });
        *slot = Some(Arc::clone(&share));
        tracing::debug!(
            instances = n,
            "redis store fail-soft: each policy divided by the fleet size"
        );
        Some(share)
    }

    /// Applies the failure policy to `charges` that Redis could not decide because of `err`:
    /// counts it in `degraded` and the metrics, logs it (WARN for the first of an outage,
    /// then DEBUG for `Local` and `FailSoft`), and answers.
    ///
    /// # Errors
    ///
    /// [`StoreError::Failed`] with the policy (and `err` as its source), except under
    /// [`FailurePolicy::Local`] and [`FailurePolicy::FailSoft`], which answer with their
    /// in-memory store's decisions. Those carry no receipts: the charges were not made in
    /// Redis, so a refund of them gives back nothing there. `FailSoft` before the fleet size
    /// is known answers as [`FailurePolicy::Deny`].
    pub(super) fn apply(
        &self,
        charges: &[OwnedCharge],
        err: StoreError,
        degraded: &AtomicU64,
    ) -> Result<Decisions, StoreError> {
        degraded.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("ratekeeper_store_degraded_total", "action" => self.policy.as_str())
            .increment(1);
        let (first, warn) = self.outage.begin(self.app.now());
        if warn {
            tracing::warn!(
                error = %err,
                action = self.policy.as_str(),
                "redis store could not decide; the failure policy ({}) answers until Redis \
                 does again (the circuit breaker opens after {} failures in a row)",
                self.policy,
                self.threshold
            );
        } else if first {
            tracing::debug!(error = %err, "redis store could not decide; an outage begins");
        }
        let borrowed = || -> Vec<Charge<'_, Key>> {
            charges
                .iter()
                .map(|(p, k, c)| Charge::new(*p, k, *c))
                .collect()
        };
        let answered = match self.policy {
            FailurePolicy::Local => self.local.as_ref().map(|l| l.check_now(&borrowed())),
            FailurePolicy::FailSoft => self.share().map(|s| s.check(&borrowed())),
            _ => None,
        };
        if let Some(result) = answered {
            tracing::debug!(
                error = %err,
                action = self.policy.as_str(),
                "redis store could not decide; the local store answered"
            );
            return result.map(|d| Decisions::new(d.as_slice().iter().copied()));
        }
        let policy = match self.policy {
            FailurePolicy::Local => FailurePolicy::Allow,
            FailurePolicy::FailSoft => FailurePolicy::Deny,
            other => other,
        };
        Err(StoreError::Failed {
            policy,
            source: Box::new(err),
        })
    }
}

/// One instance's share of `policy` in a fleet of `n`: the same name, algorithm and period,
/// with `limit` and `burst` divided by `n` and rounded down (at least 1 each: with fewer
/// units than instances, each instance keeps one, so the fleet may admit up to `n`).
///
/// # Errors
///
/// The quota error of a share that cannot be built (never for a valid policy and `n >= 1`).
fn share_of(policy: &Policy, n: u32) -> Result<Policy, StoreError> {
    let n = n.max(1);
    let quota = policy.quota();
    let invalid = |e: crate::QuotaError| {
        StoreError::UnsupportedQuota(format!(
            "policy {:?}: its fail-soft share of 1/{n} is not a valid quota: {e}",
            policy.name()
        ))
    };
    let share = crate::Quota::new((quota.limit() / n).max(1), quota.period())
        .and_then(|q| q.with_burst((quota.burst() / n).max(1)))
        .map_err(invalid)?;
    let share = Policy::new(policy.name(), share).with_algorithm(policy.algorithm());
    // A ban is kept as it is: during the outage each instance counts its own refusals.
    Ok(match policy.ban() {
        Some(ban) => share.with_ban(*ban),
        None => share,
    })
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use super::*;
    use crate::Quota;

    #[test]
    fn a_share_divides_limit_and_burst_and_keeps_at_least_one() {
        let quota = Quota::per_second(NonZeroU32::new(1_000).unwrap())
            .with_burst(400)
            .unwrap();
        let share = share_of(&Policy::new("api", quota), 8).unwrap();
        assert_eq!(share.name(), "api");
        assert_eq!((share.quota().limit(), share.quota().burst()), (125, 50));
        assert_eq!(share.quota().period(), Duration::from_secs(1));
        let small = share_of(
            &Policy::new("tiny", Quota::per_minute(NonZeroU32::new(3).unwrap())),
            8,
        )
        .unwrap();
        assert_eq!((small.quota().limit(), small.quota().burst()), (1, 1));
        let ban = crate::Ban::after(NonZeroU32::new(3).unwrap(), Duration::from_secs(60))
            .lasting(Duration::from_secs(900));
        let banned = share_of(&Policy::new("login", quota).with_ban(ban), 8).unwrap();
        assert_eq!(banned.ban(), Some(&ban));
    }

    #[test]
    fn only_the_first_degraded_decision_of_an_outage_warns_and_at_most_every_10_s() {
        let outage = Outage::default();
        assert_eq!(outage.begin(5), (true, true));
        assert_eq!(outage.begin(6), (false, false));
        outage.end();
        // A new outage 1 s later: its start is known, but the WARN line is not due yet.
        assert_eq!(outage.begin(1_000_000_005), (true, false));
        outage.end();
        assert_eq!(outage.begin(WARN_EVERY + 10), (true, true));
    }
}
