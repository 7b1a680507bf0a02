use std::fmt;
use std::sync::Arc;

use ratekeeper_core::store::{MemoryStore, PolicyId, Store, StoreError};
use ratekeeper_core::{Algorithm, Key, Policy, Quota};
use smallvec::SmallVec;
use tower_layer::Layer;

use super::RateLimit;
use super::meter::Meter;
use super::mode::Options;
use crate::key::PeerIp;
use crate::policy::{AllPolicies, CheckPolicies, Rules, Settle};
use crate::report::{HeaderStyle, Reporter, ResetFormat};

/// Why a [`RateLimitLayer`] could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// No policy was added.
    #[error("a rate limit needs at least one policy")]
    NoPolicy,
    /// Two policies share a name.
    #[error("policy name {0:?} is used twice")]
    DuplicatePolicy(String),
    /// The store refused a policy (invalid name, unsupported algorithm).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A fixed cost of 0 would make every policy unlimited.
    #[error("a fixed request cost of 0 would never limit anything")]
    ZeroCost,
    /// A fixed cost larger than a policy's capacity ([`Policy::capacity`]: the burst for
    /// GCRA and the leaky bucket, the limit for window algorithms) would deny every request.
    #[error("fixed request cost {cost} is larger than the burst {burst} of policy {policy:?}")]
    CostExceedsBurst {
        /// The policy.
        policy: String,
        /// The fixed cost.
        cost: u64,
        /// The policy's capacity.
        burst: u32,
    },
    /// A resolver or settle rule names a policy the layer does not have.
    #[error("unknown policy {0:?}")]
    UnknownPolicy(String),
    /// A [`Algorithm::Concurrency`](ratekeeper_core::Algorithm::Concurrency) policy holds
    /// permits until released; a rate limit never releases them, so it would end up denying
    /// everything. Use a concurrency limit layer for in-flight limits.
    #[error(
        "policy {0:?} uses the concurrency algorithm, which a rate limit cannot release; \
         use a concurrency limit layer"
    )]
    ConcurrencyPolicy(String),
}

pub(crate) struct Shared<K, Co, St, R = AllPolicies> {
    pub(crate) store: St,
    pub(crate) ids: SmallVec<[PolicyId; 4]>,
    pub(crate) reporter: Reporter,
    pub(crate) key: K,
    pub(crate) cost: Co,
    pub(crate) resolver: R,
    pub(crate) rules: Rules,
    /// The decision counters.
    pub(crate) meter: Meter,
}

/// A [`tower_layer::Layer`] that rate limits requests (see the [module docs](super)).
///
/// Every service the layer builds, and every clone of those services, shares one state
/// behind an [`Arc`], so one budget holds however many connections a server opens.
pub struct RateLimitLayer<K = PeerIp, Co = u64, St = MemoryStore<Key>, R = AllPolicies> {
    shared: Arc<Shared<K, Co, St, R>>,
}

impl RateLimitLayer {
    /// Limits each client IP (IPv6 by /64) to `quota`, with the GCRA algorithm, the
    /// in-memory store, cost 1 per request and `X-RateLimit-*` headers. The policy is named
    /// `"default"`.
    pub fn new(quota: Quota) -> Self {
        let mut store = MemoryStore::new();
        let policy = Policy::new("default", quota);
        // "default" is a valid name and GCRA is always supported by the memory store.
        let id = store.register(&policy).unwrap_or(PolicyId::from_index(0));
        Self::from_parts(
            store,
            SmallVec::from_elem(id, 1),
            Reporter::new(&[policy], HeaderStyle::default(), ResetFormat::default()),
            PeerIp::new(),
            1,
            AllPolicies,
            Rules::default(),
        )
    }

    /// A builder for several policies, another key, cost, store or header style.
    pub fn builder() -> Builder {
        Builder::new()
    }
}

impl<K, Co, St, R> RateLimitLayer<K, Co, St, R> {
    #[allow(clippy::too_many_arguments)]
    fn from_parts(
        store: St,
        ids: SmallVec<[PolicyId; 4]>,
        reporter: Reporter,
        key: K,
        cost: Co,
        resolver: R,
        rules: Rules,
    ) -> Self {
        Self {
            shared: Arc::new(Shared {
                store,
                ids,
                meter: Meter::new(reporter.names.clone()),
                reporter,
                key,
                cost,
                resolver,
                rules,
            }),
        }
    }

    pub(crate) fn from_shared(shared: Arc<Shared<K, Co, St, R>>) -> Self {
        Self { shared }
    }

    pub(crate) fn shared(&self) -> Arc<Shared<K, Co, St, R>> {
        Arc::clone(&self.shared)
    }

    /// The store, to inspect or reset keys (for example [`MemoryStore::reset`]).
    pub fn store(&self) -> &St {
        &self.shared.store
    }

    /// The ids of this layer's policies, in the order they were added.
    pub fn policy_ids(&self) -> &[PolicyId] {
        &self.shared.ids
    }
}

impl<K, Co, St, R> Clone for RateLimitLayer<K, Co, St, R> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<K, Co, St, R> fmt::Debug for RateLimitLayer<K, Co, St, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("policies", &self.shared.reporter.names)
            .finish_non_exhaustive()
    }
}

impl<S, K, Co, St, R> Layer<S> for RateLimitLayer<K, Co, St, R> {
    type Service = RateLimit<S, K, Co, St, R>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::from_shared(inner, Arc::clone(&self.shared))
    }
}

/// Builds a [`RateLimitLayer`]: policies, key extractor, cost, store, headers.
///
/// ```
/// use std::num::NonZeroU32;
/// use ratekeeper_core::{Policy, Quota};
/// use ratekeeper_tower::{GlobalKey, RateLimitLayer};
///
/// let layer = RateLimitLayer::builder()
///     .policy(Policy::new("burst", Quota::per_second(NonZeroU32::new(50).unwrap())))
///     .policy(Policy::new("daily", Quota::per_day(NonZeroU32::new(10_000).unwrap())))
///     .key(GlobalKey)
///     .build()?;
/// assert_eq!(layer.policy_ids().len(), 2);
/// # Ok::<(), ratekeeper_tower::BuildError>(())
/// ```
pub struct Builder<K = PeerIp, Co = u64, St = MemoryStore<Key>, R = AllPolicies> {
    policies: Vec<Policy>,
    key: K,
    cost: Co,
    fixed_cost: Option<u64>,
    store: St,
    style: HeaderStyle,
    reset: ResetFormat,
    pub(super) options: Options,
    resolver: R,
    rules: Rules,
    settle: Vec<(String, Settle)>,
}

impl Builder {
    /// Peer-IP key, cost 1, memory store, `X-RateLimit-*` headers, no policy yet.
    pub fn new() -> Self {
        Self {
            policies: Vec::new(),
            key: PeerIp::new(),
            cost: 1,
            fixed_cost: Some(1),
            store: MemoryStore::new(),
            style: HeaderStyle::default(),
            reset: ResetFormat::default(),
            options: Options::default(),
            resolver: AllPolicies,
            rules: Rules::default(),
            settle: Vec::new(),
        }
    }
}

impl Default for Builder {
    fn default() -> Self {
        Self::new()
    }
}

impl<K, Co, St, R> Builder<K, Co, St, R> {
    /// Adds a policy. Every policy is checked on every request, all-or-nothing, with its own
    /// algorithm ([`Policy::with_algorithm`]; GCRA by default).
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policies.push(policy);
        self
    }

    /// Adds a GCRA policy named `"default"` with `quota`.
    pub fn quota(self, quota: Quota) -> Self {
        self.policy(Policy::new("default", quota))
    }

    /// Sets the key extractor.
    pub fn key<K2>(self, key: K2) -> Builder<K2, Co, St, R> {
        Builder {
            policies: self.policies,
            key,
            cost: self.cost,
            fixed_cost: self.fixed_cost,
            store: self.store,
            style: self.style,
            reset: self.reset,
            options: self.options,
            resolver: self.resolver,
            rules: self.rules,
            settle: self.settle,
        }
    }

    /// Sets a fixed cost per request (checked against every policy's burst at build time).
    pub fn cost(self, cost: u64) -> Builder<K, u64, St, R> {
        Builder {
            policies: self.policies,
            key: self.key,
            cost,
            fixed_cost: Some(cost),
            store: self.store,
            style: self.style,
            reset: self.reset,
            options: self.options,
            resolver: self.resolver,
            rules: self.rules,
            settle: self.settle,
        }
    }

    /// Sets a per-request cost function (see [`crate::cost::Cost`]). A cost above a policy's
    /// burst gets the "cost can never fit" 429.
    pub fn cost_fn<Co2>(self, cost: Co2) -> Builder<K, Co2, St, R> {
        Builder {
            policies: self.policies,
            key: self.key,
            cost,
            fixed_cost: None,
            store: self.store,
            style: self.style,
            reset: self.reset,
            options: self.options,
            resolver: self.resolver,
            rules: self.rules,
            settle: self.settle,
        }
    }

    /// Sets the store (default: a new [`MemoryStore`]).
    pub fn store<St2>(self, store: St2) -> Builder<K, Co, St2, R> {
        Builder {
            policies: self.policies,
            key: self.key,
            cost: self.cost,
            fixed_cost: self.fixed_cost,
            store,
            style: self.style,
            reset: self.reset,
            options: self.options,
            resolver: self.resolver,
            rules: self.rules,
            settle: self.settle,
        }
    }

    /// Sets the rate-limit header style (default [`HeaderStyle::XRateLimit`]).
    pub fn headers(mut self, style: HeaderStyle) -> Self {
        self.style = style;
        self
    }

    /// Sets how reset values are written (default [`ResetFormat::DeltaSeconds`]).
    pub fn reset_format(mut self, reset: ResetFormat) -> Self {
        self.reset = reset;
        self
    }

    /// Sets the policy resolver (default [`AllPolicies`]): which policies each request is
    /// charged to, with which key and cost. See [`crate::policy`] and
    /// [`crate::route::RouteTable`].
    pub fn resolver<R2>(self, resolver: R2) -> Builder<K, Co, St, R2> {
        Builder {
            policies: self.policies,
            key: self.key,
            cost: self.cost,
            fixed_cost: self.fixed_cost,
            store: self.store,
            style: self.style,
            reset: self.reset,
            options: self.options,
            resolver,
            rules: self.rules,
            settle: self.settle,
        }
    }

    /// Settles the named policy's charge once the response status is known (see
    /// [`Settle`]). Checked at build time: the policy must exist.
    pub fn settle(mut self, policy: &str, settle: Settle) -> Self {
        self.settle.push((policy.to_owned(), settle));
        self
    }

    /// Whether CORS preflights (`OPTIONS` with `Access-Control-Request-Method`) are counted.
    /// Default `false`: preflights pass without charge or headers (see [`crate::cors`]).
    pub fn count_preflight(mut self, count: bool) -> Self {
        self.rules.count_preflight = count;
        self
    }

    /// Peers inside these networks (for example monitoring or an internal network) are not
    /// limited. Matched against the TCP peer (IPv4-mapped IPv6 as IPv4), never a forwarded
    /// header.
    pub fn exempt_networks(mut self, networks: impl IntoIterator<Item = ipnet::IpNet>) -> Self {
        self.rules.exempt_networks.extend(networks);
        self
    }

    /// Requests whose key (from the layer's key extractor) is one of `keys` are not limited.
    pub fn exempt_keys(mut self, keys: impl IntoIterator<Item = Key>) -> Self {
        self.rules.exempt_keys.extend(keys);
        self
    }

    /// Registers the policies with the store and builds the layer.
    ///
    /// # Errors
    ///
    /// [`BuildError`] when there is no policy, a name is reused or invalid, the store
    /// refuses a policy, or a fixed cost is 0 or larger than a policy's burst.
    pub fn build(mut self) -> Result<RateLimitLayer<K, Co, St, R>, BuildError>
    where
        St: Store<Key>,
        R: CheckPolicies,
    {
        if self.policies.is_empty() {
            return Err(BuildError::NoPolicy);
        }
        for (i, p) in self.policies.iter().enumerate() {
            if self.policies[..i].iter().any(|q| q.name() == p.name()) {
                return Err(BuildError::DuplicatePolicy(p.name().to_owned()));
            }
        }
        if let Some(p) = self
            .policies
            .iter()
            .find(|p| p.algorithm() == Algorithm::Concurrency)
        {
            return Err(BuildError::ConcurrencyPolicy(p.name().to_owned()));
        }
        if let Some(cost) = self.fixed_cost {
            if cost == 0 {
                return Err(BuildError::ZeroCost);
            }
            if let Some(p) = self
                .policies
                .iter()
                .find(|p| cost > u64::from(p.capacity()))
            {
                return Err(BuildError::CostExceedsBurst {
                    policy: p.name().to_owned(),
                    cost,
                    burst: p.capacity(),
                });
            }
        }
        for (name, settle) in &self.settle {
            let index = self
                .policies
                .iter()
                .position(|p| p.name() == name)
                .and_then(|i| u32::try_from(i).ok())
                .ok_or_else(|| BuildError::UnknownPolicy(name.clone()))?;
            self.rules.settle.push((index, *settle));
        }
        self.resolver.check(&self.policies)?;
        let mut ids = SmallVec::new();
        for p in &self.policies {
            ids.push(self.store.register(p)?);
        }
        let reporter = self
            .options
            .apply(Reporter::new(&self.policies, self.style, self.reset));
        Ok(RateLimitLayer::from_parts(
            self.store,
            ids,
            reporter,
            self.key,
            self.cost,
            self.resolver,
            self.rules,
        ))
    }
}

impl<K, Co, St, R> fmt::Debug for Builder<K, Co, St, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("policies", &self.policies)
            .field("style", &self.style)
            .field("reset", &self.reset)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}
