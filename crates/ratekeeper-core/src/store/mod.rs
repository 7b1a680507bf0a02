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

pub use memory::MemoryStore;

use std::fmt;
use std::future::Future;

use smallvec::SmallVec;

use crate::{Decision, policy::PolicyError};

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

/// What an allowed charge took, so that a refund gives back only what that charge still
/// holds (a refund after the window closed, the log entry expired or the bucket drained gives
/// back nothing; a refund never frees a slot booked by a later reservation).
///
/// The stamp is the store's, in the store's time unit, and means, per algorithm:
///
/// | algorithm | stamp |
/// |---|---|
/// | GCRA, leaky bucket | the TAT right after this charge (the end of the slot it took) |
/// | fixed window, sliding window counter | the index of the window the charge counted in |
/// | sliding log | the time of the log entry the charge added |
/// | concurrency | unused (a permit is the same whenever it was taken) |
///
/// [`Receipt::NONE`] is the receipt of a denied charge (which took nothing) and of a charge
/// whose store did not say; refunding it gives back nothing.
///
/// Eight bytes: the stamp `u64::MAX` is reserved for [`Receipt::NONE`] (no store time or
/// window index reaches it), so [`Receipt::new`]`(u64::MAX)` is [`Receipt::NONE`].
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Receipt(u64);

impl Receipt {
    /// Took nothing: a refund of it gives back nothing.
    pub const NONE: Receipt = Receipt(u64::MAX);

    /// A receipt with the store's stamp (see the table above).
    pub const fn new(stamp: u64) -> Self {
        Self(stamp)
    }

    /// The stamp, `None` for [`Receipt::NONE`].
    pub const fn stamp(self) -> Option<u64> {
        if self.0 == u64::MAX {
            None
        } else {
            Some(self.0)
        }
    }

    /// Whether the charge took something that a refund could give back.
    pub const fn is_some(self) -> bool {
        self.0 != u64::MAX
    }
}

impl Default for Receipt {
    fn default() -> Self {
        Self::NONE
    }
}

impl fmt::Debug for Receipt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Receipt").field(&self.stamp()).finish()
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

/// The decisions for a list of charges, in the same order.
///
/// One policy (the usual layer) is kept inline: the answer is 56 bytes, with no heap and
/// nothing to drop. Two policies take one heap block, three and more two.
///
/// An answer of [`Store::reserve`] also carries the reservation: [`Decisions::delay`] (how
/// long an allowed, already charged request waits before it proceeds) and
/// [`Decisions::is_final`] (a denial that waiting within `max_wait` cannot change).
///
/// Each allowed decision comes with the [`Receipt`] of what its charge took
/// ([`Decisions::receipts`]); equality compares the decisions, the delay and finality, not
/// the receipts (whose stamps are in each store's own time unit).
#[derive(Debug, Clone)]
pub struct Decisions {
    items: Items,
    /// The reservation delay in ns (see [`Decisions::delay`]).
    delay_ns: u64,
    is_final: bool,
}

/// The decisions and receipts of an answer. One policy (the usual layer) is kept inline, so
/// the answer of a one-policy check is 56 bytes with no heap and no drop work; two take one
/// heap block; zero or three and more two boxed slices (an empty one does not allocate, so
/// no policy, or decisions without receipts, take less). Keeping two inline too would make
/// every answer 96 bytes, and its copies cost the one-policy check more than the block
/// costs two policies (measured: 1 to 2 ns per check against about 150 instructions).
#[derive(Debug, Clone)]
enum Items {
    One(Receipt, [Decision; 1]),
    /// Two policies (a per-second and a per-minute limit, say): one heap block.
    Two(Box<([Decision; 2], [Receipt; 2])>),
    Many(Box<[Decision]>, Box<[Receipt]>),
}

impl Default for Decisions {
    fn default() -> Self {
        Self::from_items(Items::Many(Box::default(), Box::default()))
    }
}

impl PartialEq for Decisions {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
            && self.delay_ns == other.delay_ns
            && self.is_final == other.is_final
    }
}
impl Eq for Decisions {}

impl Decisions {
    #[inline]
    const fn from_items(items: Items) -> Self {
        Self {
            items,
            delay_ns: 0,
            is_final: false,
        }
    }

    /// Wraps decisions given in charge order.
    pub fn new(items: impl IntoIterator<Item = Decision>) -> Self {
        let items: SmallVec<[Decision; 4]> = items.into_iter().collect();
        match items.as_slice() {
            [] => Self::default(),
            [one] => Self::one(*one),
            [a, b] => Self::from_items(Items::Two(Box::new(([*a, *b], [Receipt::NONE; 2])))),
            // No receipts: an empty slice, which reads as `Receipt::NONE` and allocates nothing.
            many => Self::from_items(Items::Many(many.into(), Box::default())),
        }
    }

    /// Wraps decisions given in charge order, each with its charge's [`Receipt`]
    /// ([`Receipt::NONE`] for a denial).
    pub fn with_receipts(items: impl IntoIterator<Item = (Decision, Receipt)>) -> Self {
        let items: SmallVec<[(Decision, Receipt); 4]> = items.into_iter().collect();
        match items.as_slice() {
            [] => Self::default(),
            [(one, receipt)] => Self::one_with_receipt(*one, *receipt),
            [(a, ra), (b, rb)] => Self::from_items(Items::Two(Box::new(([*a, *b], [*ra, *rb])))),
            many => {
                let receipts = if many.iter().all(|(_, r)| *r == Receipt::NONE) {
                    Box::default()
                } else {
                    many.iter().map(|(_, r)| *r).collect()
                };
                let decisions = many.iter().map(|(d, _)| *d).collect();
                Self::from_items(Items::Many(decisions, receipts))
            }
        }
    }

    /// The decision of a single policy (cheaper than [`Decisions::new`] with one item).
    #[inline]
    pub fn one(decision: Decision) -> Self {
        Self::one_with_receipt(decision, Receipt::NONE)
    }

    /// The decision of a single policy with its charge's [`Receipt`].
    #[inline]
    pub fn one_with_receipt(decision: Decision, receipt: Receipt) -> Self {
        Self::from_items(Items::One(receipt, [decision]))
    }

    /// The receipt of the charge behind decision `i` ([`Receipt::NONE`] when it was denied,
    /// took nothing, or the store gave no receipt).
    #[inline]
    pub fn receipt(&self, i: usize) -> Receipt {
        let receipt = match &self.items {
            Items::One(receipt, _) => (i == 0).then_some(*receipt),
            Items::Two(two) => two.1.get(i).copied(),
            Items::Many(_, receipts) => receipts.get(i).copied(),
        };
        if self.as_slice().get(i).is_some_and(Decision::is_allowed) {
            receipt.unwrap_or_default()
        } else {
            Receipt::NONE
        }
    }

    /// The receipts, in charge order (see [`Decisions::receipt`]).
    pub fn receipts(&self) -> impl Iterator<Item = Receipt> + '_ {
        (0..self.len()).map(|i| self.receipt(i))
    }

    /// Sets the reservation delay (see [`Decisions::delay`]).
    #[must_use]
    pub const fn with_delay(mut self, delay: std::time::Duration) -> Self {
        // Saturates at u64::MAX ns, about 584 years.
        let ns = delay.as_nanos();
        self.delay_ns = if ns > u64::MAX as u128 {
            u64::MAX
        } else {
            ns as u64
        };
        self
    }

    /// Marks a denial as final (see [`Decisions::is_final`]).
    #[must_use]
    pub const fn with_final(mut self, is_final: bool) -> Self {
        self.is_final = is_final;
        self
    }

    /// For an allowed answer of [`Store::reserve`]: how long the request waits before it
    /// proceeds. Every policy is already charged; the caller must not check again, and must
    /// [`Store::refund`] the charges if the request is dropped before it proceeds.
    /// [`Duration::ZERO`](std::time::Duration::ZERO) for "allowed now" and for every answer
    /// of [`Store::check`].
    #[inline]
    pub const fn delay(&self) -> std::time::Duration {
        std::time::Duration::from_nanos(self.delay_ns)
    }

    /// For a denied answer of [`Store::reserve`]: whether the store reserved exactly and no
    /// wait within `max_wait` can admit the request, so the caller rejects at once instead of
    /// retrying after `retry_after`. `false` for [`Store::check`] answers and for stores
    /// (or algorithms) that cannot reserve, whose callers fall back to check-and-retry.
    #[inline]
    pub const fn is_final(&self) -> bool {
        self.is_final
    }

    /// Whether every policy allowed (and so every policy was charged).
    #[inline]
    pub fn is_allowed(&self) -> bool {
        match &self.items {
            Items::One(_, [one]) => one.is_allowed(),
            Items::Two(two) => two.0.iter().all(Decision::is_allowed),
            Items::Many(items, _) => items.iter().all(Decision::is_allowed),
        }
    }

    /// Whether some policy said the cost can never fit.
    #[inline]
    pub fn is_cannot_fit(&self) -> bool {
        self.as_slice().iter().any(Decision::is_cannot_fit)
    }

    /// The decisions, in charge order.
    #[inline]
    pub fn as_slice(&self) -> &[Decision] {
        match &self.items {
            Items::One(_, one) => one,
            Items::Two(two) => &two.0,
            Items::Many(items, _) => items,
        }
    }

    /// The number of decisions.
    #[inline]
    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    /// Whether there are no decisions (no policy applied).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.as_slice().is_empty()
    }

    /// Time until the whole request would pass: the longest `retry_after` among the denials.
    /// `None` when allowed or when the cost can never fit.
    #[inline]
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        if self.is_cannot_fit() {
            return None;
        }
        self.as_slice()
            .iter()
            .filter_map(Decision::retry_after)
            .max()
    }

    /// The index of the decision that headers report: when denied, the denial that lasts
    /// longest (a "cannot fit" first); when allowed, the policy closest to exhaustion
    /// (fewest remaining, then the longest reset).
    pub fn deciding(&self) -> Option<usize> {
        // One policy (the usual layer): its decision is the one, whatever it says.
        let items: &[Decision] = match &self.items {
            Items::One(..) => return Some(0),
            Items::Two(two) => &two.0,
            Items::Many(items, _) => items,
        };
        if let Some(i) = items.iter().position(Decision::is_cannot_fit) {
            return Some(i);
        }
        if self.is_allowed() {
            items
                .iter()
                .enumerate()
                .min_by(|(_, a), (_, b)| {
                    a.remaining()
                        .cmp(&b.remaining())
                        .then(b.reset_after().cmp(&a.reset_after()))
                })
                .map(|(i, _)| i)
        } else {
            items
                .iter()
                .enumerate()
                .filter(|(_, d)| d.is_denied())
                .max_by_key(|(_, d)| d.retry_after())
                .map(|(i, _)| i)
        }
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
    Local,
    /// The degraded-response fallback serves the request. The tower layer passes the request
    /// to the inner service with a `StoreDegraded` request extension (defined by the tower
    /// crate); its fallback (or the handler itself) reads it and answers cheaply.
    Degrade,
}

impl FailurePolicy {
    /// The lower-case name (`allow`, `deny`, `local`, `degrade`), as in logs and the `action`
    /// label of the `ratekeeper_store_degraded_total` counter.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Allow => "allow",
            Self::Deny => "deny",
            Self::Local => "local",
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
/// Implementations: [`MemoryStore`] (answers synchronously; the default). A networked store
/// implements the same trait with an async future, so the HTTP layer's API does not change.
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

    /// Gives back charges made earlier (a response-based refund, or a dropped reservation),
    /// each only as far as its [`Receipt`] says the charge still holds: nothing for a charge
    /// whose window closed, whose log entry expired or that the bucket already drained, and
    /// never a slot booked by a later reservation. Never fails visibly: a networked store
    /// logs and counts errors.
    fn refund(&self, refunds: &[Refund<'_, K>]);

    /// Wall-clock time since the Unix epoch, for epoch-style reset headers.
    fn unix_now(&self) -> std::time::Duration {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod decisions_tests {
    use super::*;
    use std::time::Duration;

    fn allowed(remaining: u32) -> Decision {
        Decision::new(
            crate::Outcome::Allowed,
            10,
            remaining,
            Duration::from_secs(1),
        )
    }

    fn denied(secs: u64) -> Decision {
        let retry_after = Duration::from_secs(secs);
        Decision::new(crate::Outcome::Denied { retry_after }, 10, 0, retry_after)
    }

    #[test]
    fn one_policy_is_inline_in_56_bytes() {
        assert_eq!(std::mem::size_of::<Decisions>(), 56);
        let one = Decisions::one_with_receipt(allowed(3), Receipt::new(7));
        assert_eq!(one.as_slice(), &[allowed(3)]);
        assert_eq!(one.receipt(0), Receipt::new(7));
        assert_eq!(one.receipt(1), Receipt::NONE);
        assert!(one.is_allowed());
        assert_eq!(one.deciding(), Some(0));
        // Built from a list of one, it is the same answer.
        assert_eq!(
            Decisions::with_receipts([(allowed(3), Receipt::new(7))]),
            one
        );
    }

    #[test]
    fn several_and_no_policies() {
        let none = Decisions::default();
        assert!(none.is_empty() && none.is_allowed());
        assert_eq!(none.deciding(), None);
        assert_eq!(none.receipts().count(), 0);

        let two =
            Decisions::with_receipts([(allowed(5), Receipt::new(1)), (denied(2), Receipt::new(2))]);
        assert_eq!(two.len(), 2);
        assert!(!two.is_allowed());
        assert_eq!(two.deciding(), Some(1));
        assert_eq!(two.retry_after(), Some(Duration::from_secs(2)));
        // A denial holds no receipt, whatever the store gave.
        let receipts: Vec<_> = two.receipts().collect();
        assert_eq!(receipts, [Receipt::new(1), Receipt::NONE]);

        let three = Decisions::with_receipts([
            (allowed(5), Receipt::new(1)),
            (allowed(2), Receipt::new(2)),
            (allowed(7), Receipt::new(3)),
        ]);
        assert_eq!(three.as_slice(), &[allowed(5), allowed(2), allowed(7)]);
        assert!(three.is_allowed());
        assert_eq!(three.deciding(), Some(1));
        let receipts: Vec<_> = three.receipts().collect();
        assert_eq!(
            receipts,
            [Receipt::new(1), Receipt::new(2), Receipt::new(3)]
        );
        assert_eq!(
            Decisions::new([allowed(1), allowed(1)]).receipt(1),
            Receipt::NONE
        );
        // Without receipts (no heap slice for them), three read as with `Receipt::NONE`.
        let bare = Decisions::new([allowed(1), denied(1), allowed(2)]);
        assert!(bare.receipts().all(|r| r == Receipt::NONE));
        assert_eq!(bare.deciding(), Some(1));
        let none = [allowed(1), denied(1), allowed(2)].map(|d| (d, Receipt::NONE));
        assert_eq!(bare, Decisions::with_receipts(none));

        let delayed = two.clone().with_delay(Duration::MAX);
        assert_eq!(delayed.delay(), Duration::from_nanos(u64::MAX));
        assert_ne!(delayed, two);
    }
}
