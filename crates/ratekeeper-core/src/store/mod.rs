//! Stores: where per-key state lives.
//!
//! A [`Store`] registers policies when a limiter is built (so misconfiguration is caught
//! then), and at request time checks a list of [`Charge`]s all-or-nothing: if any policy
//! denies, none is charged. A store that can answer at once (the [`MemoryStore`]) returns
//! [`Checked::Ready`], so the HTTP layer decides inside `call` without allocating or boxing;
//! a networked store returns [`Checked::Pending`] with its future.
//!
//! # Example
//!
//! ```
//! use std::num::NonZeroU32;
//! use ratekeeper_core::store::{Charge, Checked, MemoryStore, Store};
//! use ratekeeper_core::{Key, Policy, Quota};
//!
//! let mut store = MemoryStore::<Key>::new();
//! let api = store.register(&Policy::new("api", Quota::per_second(NonZeroU32::new(2).unwrap())))?;
//! let key = Key::from("alice");
//! let check = |store: &MemoryStore<Key>| match store.check(&[Charge::new(api, &key, 1)]) {
//!     Checked::Ready(result) => result.unwrap(),
//!     Checked::Pending(_) => unreachable!("the memory store always answers at once"),
//! };
//! assert!(check(&store).is_allowed());
//! assert!(check(&store).is_allowed());
//! assert!(!check(&store).is_allowed());
//! # Ok::<(), ratekeeper_core::store::StoreError>(())
//! ```

mod memory;
#[cfg(feature = "redis")]
pub mod redis;
pub mod slots;
#[cfg(feature = "redis")]
pub mod tiered;

pub use crate::decision::decisions::Decisions;
pub use crate::decision::receipt::Receipt;
pub use memory::MemoryStore;

use std::future::Future;

use crate::policy::PolicyError;

/// Identifies a policy registered with a store. Cheap to copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PolicyId(u32);

impl PolicyId {
    /// A policy id from its registration index.
    pub const fn from_index(index: u32) -> Self {
        Self(index)
    }

    /// The registration index.
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

/// One policy to charge for one key.
#[derive(Debug)]
pub struct Charge<'a, K: ?Sized> {
    /// The registered policy.
    pub policy: PolicyId,
    /// Who is charged.
    pub key: &'a K,
    /// Units to charge (0 is a free probe; more than the burst can never fit).
    pub cost: u64,
}

impl<K: ?Sized> Clone for Charge<'_, K> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<K: ?Sized> Copy for Charge<'_, K> {}

impl<'a, K: ?Sized> Charge<'a, K> {
    /// A charge of `cost` units to `key` under `policy`.
    pub const fn new(policy: PolicyId, key: &'a K, cost: u64) -> Self {
        Self { policy, key, cost }
    }
}

/// A charge to give back: the charge as it was made and the receipt its decision carried
/// ([`Decisions::receipts`]).
#[derive(Debug)]
pub struct Refund<'a, K: ?Sized> {
    /// The charge as it was made (policy, key, cost).
    pub charge: Charge<'a, K>,
    /// What the charge took.
    pub receipt: Receipt,
}

impl<K: ?Sized> Clone for Refund<'_, K> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<K: ?Sized> Copy for Refund<'_, K> {}

impl<'a, K: ?Sized> Refund<'a, K> {
    /// A refund of `charge`, which took what `receipt` says.
    pub const fn new(charge: Charge<'a, K>, receipt: Receipt) -> Self {
        Self { charge, receipt }
    }
}

/// A charge whose true cost became known after its decision (the tokens a response
/// generated, say): the charge as it was made, the receipt its decision carried
/// ([`Decisions::receipts`]) and the true cost. [`Store::correct`] settles it.
///
/// ```
/// use std::num::NonZeroU32;
/// use ratekeeper_core::store::{Charge, Correction, MemoryStore, Store};
/// use ratekeeper_core::{Key, Policy, Quota};
///
/// let mut store = MemoryStore::<Key>::new();
/// let tokens = store.register(&Policy::new("tokens", Quota::per_hour(NonZeroU32::new(1_000).unwrap())))?;
/// let key = Key::from("alice");
/// // Reserve an estimate of 100 tokens; the response turns out to use 40.
/// let charge = Charge::new(tokens, &key, 100);
/// let decisions = store.check_now(&[charge])?;
/// assert_eq!(decisions.as_slice()[0].remaining(), 900);
/// store.correct(&[Correction::new(charge, decisions.receipt(0), 40)]);
/// let probe = store.check_now(&[Charge::new(tokens, &key, 0)])?;
/// assert_eq!(probe.as_slice()[0].remaining(), 960);
/// # Ok::<(), ratekeeper_core::store::StoreError>(())
/// ```
#[derive(Debug)]
pub struct Correction<'a, K: ?Sized> {
    /// The charge as it was made: `charge.cost` is what was charged (the estimate).
    pub charge: Charge<'a, K>,
    /// The receipt its decision carried ([`Decisions::receipts`]).
    pub receipt: Receipt,
    /// The true cost, in the policy's units.
    pub actual: u64,
}

impl<K: ?Sized> Clone for Correction<'_, K> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<K: ?Sized> Copy for Correction<'_, K> {}

impl<'a, K: ?Sized> Correction<'a, K> {
    /// A correction of `charge` (which took what `receipt` says) to the true cost `actual`.
    pub const fn new(charge: Charge<'a, K>, receipt: Receipt, actual: u64) -> Self {
        Self {
            charge,
            receipt,
            actual,
        }
    }

    /// Units to give back: `cost - actual` when the estimate was too high, else 0.
    pub const fn give_back(&self) -> u64 {
        self.charge.cost.saturating_sub(self.actual)
    }

    /// Units to charge on top, without refusing: `actual - cost` when the estimate was too
    /// low, else 0.
    pub const fn extra(&self) -> u64 {
        self.actual.saturating_sub(self.charge.cost)
    }
}

/// A store's answer: at once, or a future.
#[derive(Debug)]
pub enum Checked<F> {
    /// The answer is known now (memory store).
    Ready(Result<Decisions, StoreError>),
    /// The answer needs I/O.
    Pending(F),
}

/// A store failed to decide.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// A charge named a policy this store never registered.
    #[error("the store has no policy with id {}", .0.index())]
    UnknownPolicy(PolicyId),
    /// A policy was refused when registered.
    #[error("the store refused the policy: {0}")]
    Policy(#[from] PolicyError),
    /// The store cannot run this algorithm.
    #[error("the store does not support the {0} algorithm")]
    UnsupportedAlgorithm(crate::Algorithm),
    /// The store cannot hold this policy's quota (the message names the policy and the limit).
    #[error("the store cannot hold this quota: {0}")]
    UnsupportedQuota(String),
    /// The store does not implement this operation (for example `reset` on a store that
    /// keeps the trait's default method).
    #[error("the store does not support {0}")]
    UnsupportedOperation(&'static str),
    /// A reset could not give a key a state of its own: the policy holds the most keys the
    /// store allows (the memory store's `max_keys`), none of them idle, and the key holds
    /// none, so its requests share the store's overflow state. Nothing was reset.
    #[error(
        "the store holds its most keys for policy id {}, none idle: the key shares the overflow \
         state and was not reset",
        .0.index()
    )]
    KeysFull(PolicyId),
    /// The store did not answer within the decision deadline.
    #[error("the store did not answer within the decision deadline")]
    Timeout,
    /// The store is unreachable or returned an error (the cause is the [`source`]).
    ///
    /// [`source`]: std::error::Error::source
    #[error("the store is unavailable: {0}")]
    Unavailable(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The store's configuration is invalid (a Redis URL that does not parse, say): fix the
    /// configuration, retrying cannot help. `message` says what is wrong in one sentence
    /// without the cause's own text; the cause is the [`source`].
    ///
    /// [`source`]: std::error::Error::source
    #[error("configuration error: {message}")]
    Config {
        /// What is wrong and how to fix it.
        message: String,
        /// The error that revealed it.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A shared store could not decide (see [`StoreError::is_unavailable`]) and its
    /// [`FailurePolicy`] tells the HTTP layer what to do instead.
    #[error("the store could not decide, so its failure policy ({policy}) applies: {source}")]
    Failed {
        /// What the layer does with the request.
        policy: FailurePolicy,
        /// Why the store could not decide.
        #[source]
        source: Box<StoreError>,
    },
}

/// What happens to a request when a shared store (Redis) cannot decide within its deadline
/// (slow, down, answering errors, or skipped by an open circuit breaker).
///
/// Set on the store (for example `RedisStoreBuilder::on_failure` with the `redis` feature)
/// and carried by [`StoreError::Failed`] to the HTTP layer; every other store error means
/// [`FailurePolicy::Allow`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Fail open: the request reaches the service without rate-limit headers (no made-up
    /// `Remaining`). The default.
    #[default]
    Allow,
    /// Fail closed: the layer answers `503 Service Unavailable` (not 429: the client did not
    /// exceed anything).
    Deny,
    /// An in-memory store inside the shared store takes over with the same (or overridden)
    /// policies; its decisions carry normal headers. The store answers these itself, so an
    /// HTTP layer that ever sees `Local` in a [`StoreError::Failed`] treats it as
    /// [`FailurePolicy::Allow`].
    ///
    /// Each instance applies the **whole** quota on its own: a fleet of `N` instances admits
    /// up to `N` × the quota while the shared store is unreachable (less with a stricter
    /// per-instance override). For a fleet-wide bound use [`FailurePolicy::FailSoft`].
    Local,
    /// Fail-soft: each instance enforces **its share of the fleet's quota** in memory while
    /// the shared store is unreachable, so the fleet as a whole stays near the quota instead
    /// of failing open (`Allow`: unlimited), failing closed (`Deny`: nothing admitted) or
    /// multiplying it (`Local`: `N` × the quota).
    ///
    /// The share is each policy with its `limit` and `burst` divided by the fleet size `N`
    /// (rounded down, at least 1 unit each), same period and algorithm. `N` is configured
    /// (the Redis store builder's `instances`) or learned: every instance registers itself
    /// in Redis every 250 ms and reads how many live instances there are (an outage uses the
    /// size last learned; an instance that joined less than 250 ms before it may be missing).
    /// The share store is made at the outage's first degraded decision and kept until an
    /// outage begins a second or more after the last degraded decision: a shared store that
    /// answers only for a moment in between (a probe; on a Redis Cluster with a primary
    /// down, the keys whose slots are up) does not start the shares afresh, so the keys
    /// whose slot is down stay within the bound below. Nothing is known about how full each
    /// key's bucket was in the shared store (a key at its limit has an empty bucket there),
    /// so each key's share starts with **one unit** when the outage first sees it, and
    /// refills at the share's rate (`limit / N` per period) up to the share's burst.
    ///
    /// What it promises, per key, while the shared store is unreachable: the fleet admits
    /// at most `N + limit × elapsed / period` units (one unit per instance, then the
    /// quota's rate), plus rounding, provided `N` is at least the number of instances
    /// taking traffic; together with what the shared store admitted before the outage (its
    /// bucket) that stays within the quota. Traffic spread unevenly over the instances is
    /// admitted less (an instance never lends its share to another), and a key that had
    /// unused burst when the outage began gets it back only at the share's rate. Until `N`
    /// is known (no configuration and no reply from Redis yet) it answers as
    /// [`FailurePolicy::Deny`]. Its decisions carry normal headers (the share's limit and
    /// remaining). A policy's [`Ban`](crate::Ban) is kept whole in its share: each instance
    /// counts the refusals it makes and bans on its own until the shared store answers. The
    /// store answers these itself, so an HTTP layer that ever sees `FailSoft` in a
    /// [`StoreError::Failed`] treats it as [`FailurePolicy::Allow`].
    FailSoft,
    /// The degraded-response fallback serves the request. The tower layer passes the request
    /// to the inner service with a `StoreDegraded` request extension (defined by the tower
    /// crate); its fallback (or the handler itself) reads it and answers cheaply.
    Degrade,
}

impl FailurePolicy {
    /// The lower-case name (`allow`, `deny`, `local`, `fail-soft`, `degrade`), as in logs and
    /// the `action` label of the `ratekeeper_store_degraded_total` counter.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Allow => "allow",
            Self::Deny => "deny",
            Self::Local => "local",
            Self::FailSoft => "fail-soft",
            Self::Degrade => "degrade",
        }
    }
}

impl std::fmt::Display for FailurePolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl StoreError {
    /// Whether the error is a configuration problem (found when building a limiter).
    pub fn is_config(&self) -> bool {
        matches!(
            self,
            Self::UnknownPolicy(_)
                | Self::Policy(_)
                | Self::UnsupportedAlgorithm(_)
                | Self::UnsupportedQuota(_)
                | Self::Config { .. }
        )
    }

    /// Whether the store was unreachable, failed or too slow at request time.
    pub fn is_unavailable(&self) -> bool {
        match self {
            Self::Timeout | Self::Unavailable(_) => true,
            Self::Failed { source, .. } => source.is_unavailable(),
            _ => false,
        }
    }

    /// What the HTTP layer does with the request: the policy of [`StoreError::Failed`], else
    /// [`FailurePolicy::Allow`] (fail open).
    pub fn failure_policy(&self) -> FailurePolicy {
        match self {
            Self::Failed { policy, .. } => *policy,
            _ => FailurePolicy::Allow,
        }
    }
}

/// Per-key state for registered policies.
///
/// Implementations in this crate:
///
/// | store | where the state lives | answers | feature |
/// |---|---|---|---|
/// | [`MemoryStore`] (the default) | this process | at once ([`Checked::Ready`]) | |
/// | `redis::RedisStore` | Redis standalone or Cluster, shared by every app instance | one script call ([`Checked::Pending`]), with a deadline and a failure policy | `redis` |
/// | `tiered::TieredStore` | Redis, with units leased to each instance and spent locally | at once while leased units last, else after a Redis call | `redis` |
///
/// A networked store implements the same trait with an async future, so the HTTP layer's API
/// does not change; a store of your own can implement it too.
///
/// The stores of this crate are cheap handles ([`Clone`]): clones share the key state, the
/// connection and one registry of policies, so several layers can share a store, and a
/// policy registered through one clone (while others serve requests) is known to all.
/// `Arc<S>` is a store as well.
pub trait Store<K: ?Sized>: Send + Sync + 'static {
    /// The future of a check that needs I/O. A store that always answers at once uses
    /// [`std::future::Ready`].
    type Future: Future<Output = Result<Decisions, StoreError>> + Send + 'static;

    /// Registers a policy and returns its id. Called while a limiter is built.
    ///
    /// # Errors
    ///
    /// A [`StoreError::is_config`] error when the policy is invalid or unsupported.
    fn register(&mut self, policy: &crate::Policy) -> Result<PolicyId, StoreError>;

    /// Checks every charge all-or-nothing: if any policy denies, none is charged. The
    /// decisions come back in charge order.
    fn check(&self, charges: &[Charge<'_, K>]) -> Checked<Self::Future>;

    /// Reserves capacity for a request that may wait up to `max_wait` (the `Delay` mode of
    /// the HTTP layer). All-or-nothing across charges, like [`Store::check`]:
    ///
    /// - allowed with [`Decisions::delay`] zero: charged, proceed now;
    /// - allowed with a positive delay: **reserved**, already charged; proceed after the delay
    ///   without checking again, or [`Store::refund`] the charges if the request is dropped;
    /// - denied: nothing charged (reservations made for other charges are refunded). When
    ///   [`Decisions::is_final`], no wait within `max_wait` helps and the caller rejects at
    ///   once; otherwise it may sleep `retry_after` and reserve again (check-and-retry).
    ///
    /// The default method cannot reserve: it is [`Store::check`] (delay always zero, denials
    /// never final), so a store without reservations (user stores) keeps
    /// the check-and-retry behaviour: a waiting request holds nothing, can wait and still be
    /// denied, and waiters are not served in arrival order.
    fn reserve(
        &self,
        charges: &[Charge<'_, K>],
        max_wait: std::time::Duration,
    ) -> Checked<Self::Future> {
        let _ = max_wait;
        self.check(charges)
    }

    /// Reports `key`'s state under `policy` without charging it: the decision of a free
    /// probe (a charge of cost 0). Its `limit`, `remaining` (whole cost-1 requests that would
    /// pass now) and `reset_after` (time until the key is back to a full budget) are the
    /// state's; its outcome is [`Outcome::Allowed`](crate::Outcome::Allowed) unless the
    /// store refuses every request of the key. The answer holds one decision (and no
    /// receipt).
    ///
    /// The default method is [`Store::check`] of one charge of cost 0, which by the trait's
    /// contract charges nothing, so every store can be peeked at.
    ///
    /// # Errors
    ///
    /// [`StoreError::UnknownPolicy`] for a policy this store never registered; a networked
    /// store's error when it cannot answer (no failure policy applies: a peek reports the
    /// shared state or fails).
    fn peek(&self, policy: PolicyId, key: &K) -> Checked<Self::Future> {
        self.check(&[Charge::new(policy, key, 0)])
    }

    /// Forgets `key`'s charges under `policy`, or under every policy this store registered
    /// (`None`): its next request sees the whole burst. The answer is the state after the
    /// reset as [`Store::peek`] reports it: one decision for `Some(policy)`, one per
    /// registered policy in registration order for `None`.
    ///
    /// Receipts of charges made before a reset give back nothing after it, so a refund that
    /// arrives late never frees a charge made since. For a concurrency-counter policy this
    /// means the permits held at the reset (requests still running, or permits leaked by
    /// lost responses) are forgotten: the key can take its whole limit again at once, and
    /// the release of a permit taken before the reset frees nothing, so no permit is ever
    /// released twice nor frees one taken since.
    ///
    /// The default method cannot reset: it answers
    /// [`StoreError::UnsupportedOperation`] (a store of your own overrides it to support
    /// resets).
    ///
    /// # Errors
    ///
    /// [`StoreError::UnknownPolicy`] for a policy this store never registered (nothing is
    /// reset); [`StoreError::KeysFull`] from a store with a cap on keys, when the key
    /// shares the overflow state and no room can be made for a state of its own (nothing is
    /// reset); [`StoreError::UnsupportedOperation`] from the default method; a networked
    /// store's error when it cannot answer (the reset may or may not have been applied).
    fn reset(&self, policy: Option<PolicyId>, key: &K) -> Checked<Self::Future> {
        let _ = (policy, key);
        Checked::Ready(Err(StoreError::UnsupportedOperation("reset")))
    }

    /// Gives back charges made earlier (a response-based refund, or a dropped reservation),
    /// each only as far as its [`Receipt`] says the charge still holds: nothing for a charge
    /// whose window closed, whose log entry expired or that the bucket already drained, and
    /// never a slot booked by a later reservation. Never fails visibly: a networked store
    /// logs and counts errors.
    fn refund(&self, refunds: &[Refund<'_, K>]);

    /// Corrects charges whose true cost is now known (a cost read from the response), each
    /// on the state its [`Receipt`] says it was made on (latest correction first, as
    /// refunds):
    ///
    /// - `actual < cost`: gives back `cost - actual` units, as far as the receipt says the
    ///   charge still holds them (the rules of [`Store::refund`]: nothing once its window
    ///   closed, its log entry expired or the bucket drained it). A give-back pays off a debt
    ///   (below) first: a token bucket whose TAT lies beyond its tolerance is read as in
    ///   debt, not as holding turns booked by waiting reservations.
    /// - `actual > cost`: charges `actual - cost` units at the time of the correction
    ///   **without refusing**: the request was already served. The key may go over its
    ///   capacity (a debt); later requests are refused until it is paid off, as if the
    ///   charge had been made in full: a token bucket or leaky bucket waits `T` (the
    ///   emission interval) more per unit of debt, a fixed window stays full until it ends,
    ///   a sliding log until enough units expired, a sliding window counter counts the
    ///   debt in its estimate (the Redis store's checks count at most the limit there). The
    ///   concurrency counter charges nothing: a permit is
    ///   a permit, whatever the request cost, so its corrections only give back.
    /// - `actual == cost`: nothing.
    ///
    /// Never fails visibly: a networked store logs and counts errors, as for refunds.
    ///
    /// **Bound.** Per key, with each request's estimate charged before it runs (refused
    /// when it does not fit) and corrected once when it ends, by at most `C` extra units,
    /// the units used beyond what the quota admits are at most `R × C`, where `R` is the
    /// most requests in flight (charged, not yet corrected) at once. Why: the last request
    /// admitted was admitted because the units charged then (the true costs of the
    /// requests already corrected, the estimates of those in flight, its own estimate) fit
    /// the quota; what is used in the end differs from that by the corrections of the
    /// requests then in flight, at most `R` of them, each adding at most `C`. An extra
    /// charge is never refused, so this is the only overshoot, and the debt it leaves is
    /// waited out by later requests. With estimates that are upper bounds (corrections only
    /// give back) nothing is used beyond the quota.
    ///
    /// The default gives back through [`Store::refund`] with a charge of `cost - actual`
    /// units and charges the extra through [`Store::check`] with a charge of
    /// `actual - cost` units, so an extra charge that does not fit is **lost** (and one that
    /// needs I/O is dropped unawaited), and a refund's own rules apply to a debt; every
    /// store in this crate overrides it with a forced charge.
    fn correct(&self, corrections: &[Correction<'_, K>]) {
        for c in corrections.iter().rev() {
            let give_back = c.give_back();
            if give_back > 0 {
                let charge = Charge::new(c.charge.policy, c.charge.key, give_back);
                self.refund(&[Refund::new(charge, c.receipt)]);
            }
            let extra = c.extra();
            if extra > 0 {
                let _ = self.check(&[Charge::new(c.charge.policy, c.charge.key, extra)]);
            }
        }
    }

    /// Wall-clock time since the Unix epoch, for epoch-style reset headers.
    fn unix_now(&self) -> std::time::Duration {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
    }
}

/// A store behind an [`Arc`](std::sync::Arc) is a store: every method forwards to `S`, and
/// [`Store::register`] registers through [`Arc::make_mut`](std::sync::Arc::make_mut) (a
/// clone of `S` when the `Arc` is shared). The stores of this crate are cheap handles whose
/// clones share one registry of policies, so a policy registered through any `Arc` or clone
/// is known to every other; a store of your own whose clones do not share state gets a copy
/// on registration instead, so register before sharing the `Arc`.
impl<K: ?Sized, S: Store<K> + Clone> Store<K> for std::sync::Arc<S> {
    type Future = S::Future;

    fn register(&mut self, policy: &crate::Policy) -> Result<PolicyId, StoreError> {
        std::sync::Arc::make_mut(self).register(policy)
    }

    #[inline(always)]
    fn check(&self, charges: &[Charge<'_, K>]) -> Checked<Self::Future> {
        (**self).check(charges)
    }

    fn reserve(
        &self,
        charges: &[Charge<'_, K>],
        max_wait: std::time::Duration,
    ) -> Checked<Self::Future> {
        (**self).reserve(charges, max_wait)
    }

    fn peek(&self, policy: PolicyId, key: &K) -> Checked<Self::Future> {
        (**self).peek(policy, key)
    }

    fn reset(&self, policy: Option<PolicyId>, key: &K) -> Checked<Self::Future> {
        (**self).reset(policy, key)
    }

    fn refund(&self, refunds: &[Refund<'_, K>]) {
        (**self).refund(refunds);
    }

    fn correct(&self, corrections: &[Correction<'_, K>]) {
        (**self).correct(corrections);
    }

    fn unix_now(&self) -> std::time::Duration {
        (**self).unix_now()
    }
}
