//! [`Admin`]: a handle from a [`RateLimitLayer`](crate::RateLimitLayer) to show a client
//! key's state and reset it, naming policies by their names (an operator's route, a support
//! tool), with any [`Store`].

use std::fmt;
use std::sync::Arc;

use ratekeeper_core::store::{Checked, Decisions, MemoryStore, PolicyId, Store, StoreError};
use ratekeeper_core::{Decision, Key};

use super::limiter::Limiter;

/// Peeks at and resets client keys in a [`RateLimitLayer`](crate::RateLimitLayer)'s store,
/// by policy name. From [`RateLimitLayer::admin`](crate::RateLimitLayer::admin); cheap to
/// clone (one [`Arc`]), `Send + Sync`, and it keeps the layer's store alive.
///
/// It calls the store's [`Store::peek`] and [`Store::reset`], so it works with every store:
/// the memory store answers at once, the Redis and tiered stores in one Redis call (a reset
/// of every policy of a key is one atomic call), and a store of your own through the trait's
/// default methods (a peek is a free probe, a check of cost 0; a reset is
/// [`StoreError::UnsupportedOperation`] unless the store implements it).
///
/// The key is the [`Key`] the policy charges for the client, as the layer's key extractor
/// makes it: look at the extractor's docs (for example
/// [`HeaderKey::raw`](crate::key::HeaderKey::raw) keys a credential by `(header name,
/// digest)`, which [`HeaderKey::key_of`](crate::key::HeaderKey::key_of) computes,
/// [`HeaderKey::validated`](crate::key::HeaderKey::validated) by what its closure returns,
/// and [`PeerIp`](crate::key::PeerIp) an IPv6 client by its /64 network, `Key::Net`). A
/// policy attached to a route by a [`RouteTable`](crate::route::RouteTable) charges
/// [`RouteTable::scoped_key`](crate::route::RouteTable::scoped_key) instead. A key the
/// layer never charged peeks as a full budget and resets to one, so a wrong key shows as
/// "nothing used" rather than as an error.
///
/// # Example
///
/// ```
/// use std::num::NonZeroU32;
/// use ratekeeper_core::{Key, Policy, Quota};
/// use ratekeeper_tower::{key::GlobalKey, RateLimitLayer};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let layer = RateLimitLayer::builder()
///     .policy(Policy::new("api", Quota::per_minute(NonZeroU32::new(3).unwrap())))
///     .key(GlobalKey)
///     .build()?;
/// let admin = layer.admin();
/// let key = Key::Global;
///
/// // A fresh key has its whole burst; a peek charges nothing.
/// let state = admin.peek("api", &key).await?;
/// assert_eq!((state.limit(), state.remaining()), (3, 3));
///
/// // Unknown policy names are a typed error.
/// assert!(admin.peek("nope", &key).await.unwrap_err().is_unknown_policy());
///
/// // A reset answers the state after it: the whole burst again.
/// let after = admin.reset("api", &key).await?;
/// assert_eq!(after.remaining(), 3);
/// # Ok(())
/// # }
/// ```
pub struct Admin<St = MemoryStore<Key>> {
    source: Arc<dyn Source<St>>,
}

/// What an [`Admin`] needs from the layer's limiter, without its key, cost and resolver
/// types.
trait Source<St>: Send + Sync {
    fn store(&self) -> &St;
    fn names(&self) -> &[Box<str>];
    fn ids(&self) -> &[PolicyId];
}

impl<K, Co, St, R> Source<St> for Limiter<K, Co, St, R>
where
    Self: Send + Sync,
{
    fn store(&self) -> &St {
        &self.store
    }

    fn names(&self) -> &[Box<str>] {
        Limiter::names(self)
    }

    fn ids(&self) -> &[PolicyId] {
        &self.ids
    }
}

impl<St> Admin<St> {
    /// The admin handle of `limiter`.
    pub(super) fn new<K, Co, R>(limiter: Arc<Limiter<K, Co, St, R>>) -> Self
    where
        Limiter<K, Co, St, R>: Send + Sync + 'static,
    {
        Self { source: limiter }
    }

    /// The layer's policy names, in the order they were added.
    pub fn policies(&self) -> impl Iterator<Item = &str> + '_ {
        self.source.names().iter().map(|n| &**n)
    }

    /// The store's id of the policy named `name`.
    fn id(&self, name: &str) -> Result<PolicyId, AdminError> {
        self.source
            .names()
            .iter()
            .position(|n| &**n == name)
            .and_then(|i| self.source.ids().get(i).copied())
            .ok_or_else(|| AdminError::UnknownPolicy(name.to_owned()))
    }
}

impl<St: Store<Key>> Admin<St> {
    /// `key`'s state under the policy named `policy`, charging nothing: the store's
    /// [`Store::peek`], a [`Decision`] whose `limit`, `remaining` (whole cost-1 requests
    /// that would pass now) and `reset_after` (time until the budget is full again) are the
    /// state's, and whose outcome is allowed unless the store refuses every request of the
    /// key (a ban in force, [`Decision::is_banned`], with the time until it ends).
    ///
    /// # Errors
    ///
    /// [`AdminError::UnknownPolicy`] when the layer has no policy of that name;
    /// [`AdminError::Store`] when the store cannot answer (Redis down or slow).
    pub async fn peek(&self, policy: &str, key: &Key) -> Result<Decision, AdminError> {
        let id = self.id(policy)?;
        let decisions = answer(self.source.store().peek(id, key)).await?;
        first(&decisions, id)
    }

    /// `key`'s state under every policy of the layer, in the order the policies were added
    /// (see [`Admin::peek`]); one store call per policy.
    ///
    /// # Errors
    ///
    /// [`AdminError::Store`] when the store cannot answer.
    pub async fn usage(&self, key: &Key) -> Result<Vec<PolicyState>, AdminError> {
        let mut out = Vec::with_capacity(self.source.ids().len());
        for (name, &id) in self.source.names().iter().zip(self.source.ids()) {
            let decisions = answer(self.source.store().peek(id, key)).await?;
            out.push(PolicyState {
                policy: name.to_string(),
                decision: first(&decisions, id)?,
            });
        }
        Ok(out)
    }

    /// Forgets `key`'s charges under the policy named `policy` (its next request sees the
    /// whole burst, and a ban of the key under the policy ends) and answers the state
    /// afterwards. The store's [`Store::reset`]: receipts of charges made before it give
    /// back nothing after it; the other policies' state of the key is left as it is.
    ///
    /// # Errors
    ///
    /// [`AdminError::UnknownPolicy`] when the layer has no policy of that name (nothing is
    /// reset); [`AdminError::Store`] when the store cannot reset
    /// ([`StoreError::UnsupportedOperation`] for a store without resets;
    /// [`StoreError::KeysFull`] when a memory store at its `max_keys`, none idle, charges the
    /// key on its shared overflow state: nothing is reset) or cannot answer (then the reset
    /// may or may not have been applied).
    pub async fn reset(&self, policy: &str, key: &Key) -> Result<Decision, AdminError> {
        let id = self.id(policy)?;
        let decisions = answer(self.source.store().reset(Some(id), key)).await?;
        first(&decisions, id)
    }

    /// Forgets `key`'s charges under every policy of the layer (one store call: one atomic
    /// Redis call with the Redis and tiered stores) and answers the state afterwards, in the
    /// order the policies were added.
    ///
    /// # Errors
    ///
    /// As [`Admin::reset`], without the unknown name.
    pub async fn reset_all(&self, key: &Key) -> Result<Vec<PolicyState>, AdminError> {
        let decisions = answer(self.source.store().reset(None, key)).await?;
        self.source
            .names()
            .iter()
            .zip(self.source.ids())
            .map(|(name, &id)| {
                let decision = decisions
                    .as_slice()
                    .get(id.index())
                    .copied()
                    .ok_or(StoreError::UnknownPolicy(id))?;
                Ok(PolicyState {
                    policy: name.to_string(),
                    decision,
                })
            })
            .collect()
    }
}

async fn answer<F>(checked: Checked<F>) -> Result<Decisions, StoreError>
where
    F: Future<Output = Result<Decisions, StoreError>>,
{
    match checked {
        Checked::Ready(result) => result,
        Checked::Pending(future) => future.await,
    }
}

/// The one decision of a peek or a reset of policy `id`.
fn first(decisions: &Decisions, id: PolicyId) -> Result<Decision, AdminError> {
    decisions
        .as_slice()
        .first()
        .copied()
        .ok_or(AdminError::Store(StoreError::UnknownPolicy(id)))
}

impl<St> Clone for Admin<St> {
    fn clone(&self) -> Self {
        Self {
            source: Arc::clone(&self.source),
        }
    }
}

impl<St> fmt::Debug for Admin<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admin")
            .field("policies", &self.source.names())
            .finish_non_exhaustive()
    }
}

/// One policy's state of a key, as [`Admin::usage`] and [`Admin::reset_all`] report it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PolicyState {
    /// The policy's name.
    pub policy: String,
    /// The state (see [`Admin::peek`]).
    pub decision: Decision,
}

impl PolicyState {
    /// The state `decision` of the policy named `policy`.
    pub fn new(policy: impl Into<String>, decision: Decision) -> Self {
        Self {
            policy: policy.into(),
            decision,
        }
    }
}

/// Why an [`Admin`] call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdminError {
    /// The layer has no policy of this name.
    #[error("there is no policy named {0:?}")]
    UnknownPolicy(String),
    /// The store could not peek or reset (see [`StoreError`]).
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl AdminError {
    /// Whether the layer has no policy of the name given.
    pub fn is_unknown_policy(&self) -> bool {
        matches!(self, Self::UnknownPolicy(_))
    }
}
