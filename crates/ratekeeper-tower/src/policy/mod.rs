//! Which policies a request is charged to, with which key and cost, and what happens once the
//! response status is known.
//!
//! A layer has a list of named policies (added with
//! [`Builder::policy`](crate::RateLimitBuilder::policy)), a key extractor and a cost. For each
//! request a [`Resolve`] strategy fills a [`Plan`]: the policies that apply, each with the
//! layer's key and cost or its own. All charges of one request are checked all-or-nothing: if
//! any policy denies, none is charged.
//!
//! - [`AllPolicies`] (the default): every policy, the layer's key and cost.
//! - [`RouteTable`](crate::route::RouteTable): per-route costs and route-scoped policies keyed
//!   by method and route template.
//! - Closures `Fn(&Request<B>, &mut Plan<'_>)` through [`resolve_fn`]: tiers by plan,
//!   per-policy keys, anything.
//! - [`Except`]: exempt requests matching a predicate.
//!
//! The layer also exempts, before any key is extracted: CORS preflights (see
//! [`crate::cors`]), peers in [`Builder::exempt_networks`](crate::RateLimitBuilder::exempt_networks);
//! and after the key is extracted, keys in [`Builder::exempt_keys`](crate::RateLimitBuilder::exempt_keys).
//! Exempt requests reach the inner service without rate-limit headers.
//!
//! After the response, a policy's [`Settle`] rule may give its charge back (refund on a 5xx,
//! or count only failed logins), through [`Store::refund`](ratekeeper_core::store::Store::refund).
//! The charge is taken when the request is admitted, so concurrent requests cannot overshoot;
//! the headers of that response show the state before the refund. When the inner service
//! fails with an error (no status) or the response future is dropped, the charge is kept.
//!
//! # Example: tiers
//!
//! ```
//! use std::num::NonZeroU32;
//! use http::{Request, StatusCode};
//! use ratekeeper_core::{Policy, Quota};
//! use ratekeeper_tower::key::PeerAddr;
//! use ratekeeper_tower::policy::{Plan, resolve_fn};
//! use ratekeeper_tower::RateLimitLayer;
//! use tower::{ServiceBuilder, ServiceExt};
//!
//! #[derive(Clone, Copy, PartialEq)]
//! enum Tier { Free, Paid }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let layer = RateLimitLayer::builder()
//!     .policy(Policy::new("free", Quota::per_minute(NonZeroU32::new(1).unwrap())))
//!     .policy(Policy::new("paid", Quota::per_minute(NonZeroU32::new(1000).unwrap())))
//!     .resolver(resolve_fn(|req: &Request<()>, plan: &mut Plan<'_>| {
//!         match req.extensions().get::<Tier>() {
//!             Some(Tier::Paid) => plan.charge("paid"),
//!             _ => plan.charge("free"),
//!         };
//!     }))
//!     .build()
//!     .unwrap();
//! let svc = ServiceBuilder::new()
//!     .layer(layer)
//!     .service_fn(|_req: Request<()>| async { Ok::<_, std::convert::Infallible>(http::Response::new(String::new())) });
//! let req = |tier: Tier| {
//!     let mut req = Request::new(());
//!     req.extensions_mut().insert(PeerAddr("192.0.2.1:1".parse().unwrap()));
//!     req.extensions_mut().insert(tier);
//!     req
//! };
//! let free = svc.clone().oneshot(req(Tier::Free)).await.unwrap();
//! assert_eq!(free.headers()["x-ratelimit-limit"], "1");
//! let free = svc.clone().oneshot(req(Tier::Free)).await.unwrap();
//! assert_eq!(free.status(), StatusCode::TOO_MANY_REQUESTS);
//! let paid = svc.clone().oneshot(req(Tier::Paid)).await.unwrap();
//! assert_eq!(paid.status(), StatusCode::OK);
//! assert_eq!(paid.headers()["x-ratelimit-remaining"], "999");
//! # }
//! ```

use std::fmt;

use http::{Request, StatusCode};
use ipnet::IpNet;
use ratekeeper_core::store::{Charge, Decisions, PolicyId, Refund};
use ratekeeper_core::{Key, Policy};
use smallvec::SmallVec;

use crate::BuildError;
use crate::cost::Cost;
use crate::key::{KeyError, KeyExtractor, PeerIp};
use crate::rate_limit::Shared;

/// Chooses the policies a request is charged to. Wrap a closure
/// `Fn(&Request<B>, &mut Plan<'_>)` with [`resolve_fn`] (there is no blanket impl for
/// closures because the build-time half, [`CheckPolicies`], must not depend on the request
/// body type, and a blanket impl over closures could not name it).
pub trait Resolve<B>: CheckPolicies + Send + Sync + 'static {
    /// Adds this request's charges to `plan` (or marks it exempt). A plan with no charge is
    /// exempt.
    fn resolve(&self, req: &Request<B>, plan: &mut Plan<'_>);
}

/// The build-time half of a resolver (independent of the request body type, so
/// [`Builder::build`](crate::RateLimitBuilder::build) can call it).
pub trait CheckPolicies {
    /// Checks the resolver against the layer's policies when the layer is built (policy names,
    /// static costs against bursts).
    ///
    /// # Errors
    ///
    /// A [`BuildError`] naming what is wrong.
    fn check(&self, policies: &[Policy]) -> Result<(), BuildError>;
}

/// A resolver from a closure (policy names are checked when each request is resolved: an
/// unknown name answers `500`).
pub fn resolve_fn<B, F>(f: F) -> ResolveFn<F>
where
    F: Fn(&Request<B>, &mut Plan<'_>) + Send + Sync + 'static,
{
    ResolveFn(f)
}

/// A closure resolver, from [`resolve_fn`].
#[derive(Clone, Copy)]
pub struct ResolveFn<F>(F);

impl<F> fmt::Debug for ResolveFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ResolveFn")
    }
}

impl<F> CheckPolicies for ResolveFn<F> {
    fn check(&self, _policies: &[Policy]) -> Result<(), BuildError> {
        Ok(())
    }
}

impl<B, F> Resolve<B> for ResolveFn<F>
where
    F: Fn(&Request<B>, &mut Plan<'_>) + Send + Sync + 'static,
{
    fn resolve(&self, req: &Request<B>, plan: &mut Plan<'_>) {
        (self.0)(req, plan);
    }
}

impl<F> ResolveFn<F> {
    /// Exempts requests for which `predicate` is true.
    pub fn except<P>(self, predicate: P) -> Except<Self, P> {
        Except::new(self, predicate)
    }
}

/// The default resolver: every policy, with the layer's key and cost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AllPolicies;

impl CheckPolicies for AllPolicies {
    fn check(&self, _policies: &[Policy]) -> Result<(), BuildError> {
        Ok(())
    }
}

impl<B> Resolve<B> for AllPolicies {
    #[inline]
    fn resolve(&self, _req: &Request<B>, plan: &mut Plan<'_>) {
        plan.charge_all();
    }
}

impl AllPolicies {
    /// Exempts requests for which `predicate` is true.
    pub fn except<P>(self, predicate: P) -> Except<Self, P> {
        Except::new(self, predicate)
    }
}

/// Exempts requests matching a predicate `Fn(&Request<B>) -> bool`; resolves the others
/// with `inner`.
///
/// ```
/// use http::Request;
/// use ratekeeper_tower::policy::AllPolicies;
///
/// let health_is_free = AllPolicies.except(|req: &Request<()>| req.uri().path() == "/health");
/// # let _ = health_is_free;
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Except<R, P> {
    inner: R,
    predicate: P,
}

impl<R, P> Except<R, P> {
    /// `inner`, except for requests where `predicate` is true.
    pub const fn new(inner: R, predicate: P) -> Self {
        Self { inner, predicate }
    }
}

impl<R: CheckPolicies, P> CheckPolicies for Except<R, P> {
    fn check(&self, policies: &[Policy]) -> Result<(), BuildError> {
        self.inner.check(policies)
    }
}

impl<B, R, P> Resolve<B> for Except<R, P>
where
    R: Resolve<B>,
    P: Fn(&Request<B>) -> bool + Send + Sync + 'static,
{
    fn resolve(&self, req: &Request<B>, plan: &mut Plan<'_>) {
        if (self.predicate)(req) {
            plan.exempt();
        } else {
            self.inner.resolve(req, plan);
        }
    }
}

/// What to do with a charge once the response status is known.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum Settle {
    /// Keep the charge only when the status makes the function return true (for example
    /// only `401` on a login route, so failed logins are limited and good ones are free);
    /// refund it otherwise.
    CountOnly(fn(StatusCode) -> bool),
    /// Refund the charge when the function returns true (for example on `5xx`).
    RefundIf(fn(StatusCode) -> bool),
}

impl Settle {
    /// Refund on any `5xx`: the client is not charged for the server's failures.
    pub const REFUND_SERVER_ERRORS: Self = Self::RefundIf(|s| s.is_server_error());

    /// Count only `401 Unauthorized` responses (failed logins).
    pub const COUNT_UNAUTHORIZED: Self = Self::CountOnly(|s| s == StatusCode::UNAUTHORIZED);

    /// Whether a charge is given back for a response with `status`.
    pub fn refunds(&self, status: StatusCode) -> bool {
        match self {
            Self::CountOnly(counts) => !counts(status),
            Self::RefundIf(refund) => refund(status),
        }
    }
}

/// Layer-wide exemptions and settle rules (not generic over the request).
#[derive(Debug, Clone, Default)]
pub(crate) struct Rules {
    /// Settle rule per policy index.
    pub(crate) settle: SmallVec<[(u32, Settle); 2]>,
    pub(crate) count_preflight: bool,
    pub(crate) exempt_networks: Vec<IpNet>,
    pub(crate) exempt_keys: Vec<Key>,
}

/// One charge of a plan: a policy index, its key (`None`: the layer's key) and cost.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub(crate) index: u32,
    pub(crate) key: Option<Key>,
    pub(crate) cost: u64,
}

/// The charges a [`Resolve`] strategy builds for one request.
///
/// Policies are named as they were added to the builder. Naming a policy the layer does not
/// have answers the request with `500` and an error log line (a bug in the resolver; the
/// built-in resolvers check names when the layer is built).
pub struct Plan<'a> {
    names: &'a [Box<str>],
    key: &'a Key,
    cost: u64,
    entries: SmallVec<[Entry; 2]>,
    exempt: bool,
    error: Option<KeyError>,
}

impl fmt::Debug for Plan<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Plan")
            .field("key", self.key)
            .field("cost", &self.cost)
            .field("entries", &self.entries)
            .field("exempt", &self.exempt)
            .finish_non_exhaustive()
    }
}

impl<'a> Plan<'a> {
    pub(crate) fn new(names: &'a [Box<str>], key: &'a Key, cost: u64) -> Self {
        Self {
            names,
            key,
            cost,
            entries: SmallVec::new(),
            exempt: false,
            error: None,
        }
    }

    /// The layer's key for this request. When the key extractor found none, this is
    /// [`Key::Global`] standing in for it: the resolver runs so that it can
    /// [`exempt`](Plan::exempt) the request (a health check without an API key, say), and
    /// anything else it does is ignored; the request then fails with the key error.
    pub fn key(&self) -> &Key {
        self.key
    }

    /// The layer's cost for this request (units).
    pub fn cost(&self) -> u64 {
        self.cost
    }

    /// The layer's policy names, in the order they were added.
    pub fn policies(&self) -> impl Iterator<Item = &str> {
        self.names.iter().map(|n| &**n)
    }

    /// The layer's policy names, borrowed from the layer (not from the plan).
    pub(crate) fn names(&self) -> &'a [Box<str>] {
        self.names
    }

    /// Charges the policy at `index` (already known to be valid).
    pub(crate) fn push(&mut self, index: u32, key: Option<Key>, cost: u64) {
        self.entries.push(Entry { index, key, cost });
    }

    fn index(&mut self, policy: &str) -> Option<u32> {
        let found = self
            .names
            .iter()
            .position(|n| &**n == policy)
            .and_then(|i| u32::try_from(i).ok());
        if found.is_none() {
            tracing::error!(policy, "rate-limit resolver named an unknown policy");
            self.error = Some(KeyError::Misconfigured(
                "rate-limit resolver named an unknown policy",
            ));
        }
        found
    }

    /// Charges `policy` with the layer's key and cost.
    pub fn charge(&mut self, policy: &str) -> &mut Self {
        if let Some(index) = self.index(policy) {
            self.entries.push(Entry {
                index,
                key: None,
                cost: self.cost,
            });
        }
        self
    }

    /// Charges `policy` with its own key and cost (units).
    pub fn charge_with(&mut self, policy: &str, key: Key, cost: u64) -> &mut Self {
        if let Some(index) = self.index(policy) {
            self.entries.push(Entry {
                index,
                key: Some(key),
                cost,
            });
        }
        self
    }

    /// Charges `policy` with the layer's key and its own cost (units).
    pub fn charge_cost(&mut self, policy: &str, cost: u64) -> &mut Self {
        if let Some(index) = self.index(policy) {
            self.entries.push(Entry {
                index,
                key: None,
                cost,
            });
        }
        self
    }

    /// Charges every policy with the layer's key and cost.
    pub fn charge_all(&mut self) -> &mut Self {
        let cost = self.cost;
        // A plain loop: SmallVec's `extend` sizes and re-checks more than one or two pushes.
        for i in 0..self.names.len() {
            if let Ok(index) = u32::try_from(i) {
                self.entries.push(Entry {
                    index,
                    key: None,
                    cost,
                });
            }
        }
        self
    }

    /// Exempts the request: no policy is charged and no headers are added.
    pub fn exempt(&mut self) -> &mut Self {
        self.exempt = true;
        self
    }

    /// Fails the request with `err` (`400` for [`KeyError::Missing`], `500` otherwise).
    pub fn fail(&mut self, err: KeyError) -> &mut Self {
        self.error = Some(err);
        self
    }
}

/// The charges of an admitted (or checking) request, owned so they can be settled after the
/// response.
#[derive(Debug, Clone)]
pub(crate) struct Applied {
    pub(crate) key: Key,
    pub(crate) entries: SmallVec<[Entry; 2]>,
}

impl Default for Applied {
    fn default() -> Self {
        Self {
            key: Key::Global,
            entries: SmallVec::new(),
        }
    }
}

impl Applied {
    /// The store charges, in plan order.
    pub(crate) fn charges<'a>(&'a self, ids: &[PolicyId]) -> SmallVec<[Charge<'a, Key>; 2]> {
        let mut charges = SmallVec::new();
        for e in &self.entries {
            if let Some(&id) = ids.get(e.index as usize) {
                charges.push(Charge::new(id, e.key.as_ref().unwrap_or(&self.key), e.cost));
            }
        }
        charges
    }

    /// The policy index of each decision, in plan order.
    pub(crate) fn indices(&self) -> impl Iterator<Item = usize> + Clone + '_ {
        self.entries.iter().map(|e| e.index as usize)
    }

    /// Every charge with the receipt its decision carried: what a dropped reservation gives
    /// back.
    pub(crate) fn all_refunds<'a>(
        &'a self,
        ids: &[PolicyId],
        decisions: &Decisions,
    ) -> SmallVec<[Refund<'a, Key>; 2]> {
        let mut refunds = SmallVec::new();
        for (i, e) in self.entries.iter().enumerate() {
            if let Some(&id) = ids.get(e.index as usize) {
                let charge = Charge::new(id, e.key.as_ref().unwrap_or(&self.key), e.cost);
                refunds.push(Refund::new(charge, decisions.receipt(i)));
            }
        }
        refunds
    }

    /// The charges to give back for a response with `status`, each with the receipt its
    /// decision carried.
    pub(crate) fn refunds<'a>(
        &'a self,
        rules: &Rules,
        ids: &[PolicyId],
        decisions: &Decisions,
        status: StatusCode,
    ) -> SmallVec<[Refund<'a, Key>; 4]> {
        if rules.settle.is_empty() {
            return SmallVec::new();
        }
        self.entries
            .iter()
            .enumerate()
            .filter(|(_, e)| {
                rules
                    .settle
                    .iter()
                    .any(|(i, s)| *i == e.index && s.refunds(status))
            })
            .filter_map(|(i, e)| {
                let id = *ids.get(e.index as usize)?;
                let charge = Charge::new(id, e.key.as_ref().unwrap_or(&self.key), e.cost);
                Some(Refund::new(charge, decisions.receipt(i)))
            })
            .collect()
    }
}

/// What the layer does with a request.
pub(crate) enum Prepared {
    /// Not limited: straight to the inner service, no headers.
    Exempt,
    /// No key could be found.
    Failed(KeyError),
    /// Check these charges.
    Charge(Applied),
}

impl<K, Co, St, R> Shared<K, Co, St, R> {
    /// Exemptions, key, cost and resolver for one request.
    pub(crate) fn prepare<B>(&self, req: &Request<B>) -> Prepared
    where
        K: KeyExtractor,
        Co: Cost,
        R: Resolve<B>,
    {
        let rules = &self.rules;
        if !rules.count_preflight && crate::cors::is_preflight(req) {
            return Prepared::Exempt;
        }
        if !rules.exempt_networks.is_empty() {
            if let Some(peer) = PeerIp::peer_addr(req) {
                let ip = peer.ip().to_canonical();
                if rules.exempt_networks.iter().any(|n| n.contains(&ip)) {
                    return Prepared::Exempt;
                }
            }
        }
        let (key, key_error) = match self.key.extract(req) {
            Ok(key) => (key, None),
            // The resolver still runs, with one budget standing in for the missing key, so
            // that it can exempt the request (a health check that sends no API key); if it
            // does not, the key error answers.
            Err(err) => (Key::Global, Some(err)),
        };
        if key_error.is_none() && rules.exempt_keys.contains(&key) {
            return Prepared::Exempt;
        }
        let cost = self.cost.cost(req);
        let mut plan = Plan::new(&self.reporter.names, &key, cost);
        self.resolver.resolve(req, &mut plan);
        if let Some(err) = key_error {
            // Only an explicit exemption lets a request without a key through: a resolver
            // that charges nothing for the stand-in key must not open a bypass.
            return if plan.exempt {
                Prepared::Exempt
            } else {
                Prepared::Failed(err)
            };
        }
        if let Some(err) = plan.error {
            return Prepared::Failed(err);
        }
        if plan.exempt || plan.entries.is_empty() {
            return Prepared::Exempt;
        }
        let entries = plan.entries;
        Prepared::Charge(Applied { key, entries })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;
    use std::future::{Ready, ready};
    use std::num::NonZeroU32;

    use http::{Method, Response};
    use ratekeeper_core::Quota;
    use ratekeeper_core::clock::ManualClock;
    use ratekeeper_core::store::{Checked, MemoryStore, Store, StoreError};
    use tower::{ServiceBuilder, ServiceExt};

    use crate::RateLimitLayer;
    use crate::key::PeerAddr;

    fn per_minute(n: u32) -> Quota {
        Quota::per_minute(NonZeroU32::new(n).unwrap())
    }

    fn req(peer: &str, path: &str) -> Request<()> {
        let mut req = Request::builder().uri(path).body(()).unwrap();
        req.extensions_mut()
            .insert(PeerAddr(format!("{peer}:1").parse().unwrap()));
        req
    }

    /// Answers `500` when the path is `/fail`, `200` otherwise.
    async fn app(req: Request<()>) -> Result<Response<String>, Infallible> {
        let mut res = Response::new(String::new());
        if req.uri().path() == "/fail" {
            *res.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
        }
        Ok(res)
    }

    /// The memory store answering through the async (`Checked::Pending`) path.
    struct Pending(MemoryStore<Key, ManualClock>);

    impl Store<Key> for Pending {
        type Future = Ready<Result<Decisions, StoreError>>;
        fn register(&mut self, policy: &Policy) -> Result<PolicyId, StoreError> {
            self.0.register(policy)
        }
        fn check(&self, charges: &[Charge<'_, Key>]) -> Checked<Self::Future> {
            Checked::Pending(ready(self.0.check_now(charges)))
        }
        fn refund(&self, refunds: &[Refund<'_, Key>]) {
            self.0.refund(refunds);
        }
    }

    #[test]
    fn settle_rules() {
        assert!(Settle::REFUND_SERVER_ERRORS.refunds(StatusCode::BAD_GATEWAY));
        assert!(!Settle::REFUND_SERVER_ERRORS.refunds(StatusCode::OK));
        assert!(Settle::COUNT_UNAUTHORIZED.refunds(StatusCode::OK));
        assert!(!Settle::COUNT_UNAUTHORIZED.refunds(StatusCode::UNAUTHORIZED));
    }

    #[test]
    fn unknown_policy_fails_the_plan() {
        let names: Vec<Box<str>> = vec!["a".into(), "b".into()];
        let key = Key::Global;
        let mut plan = Plan::new(&names, &key, 2);
        plan.charge("b").charge_with("a", Key::from("x"), 5);
        assert!(plan.error.is_none());
        assert_eq!(plan.entries.len(), 2);
        assert_eq!(plan.entries[0].index, 1);
        assert_eq!(plan.entries[0].cost, 2);
        assert_eq!(plan.entries[1].cost, 5);
        plan.charge("c");
        assert_eq!(
            plan.error.as_ref().map(KeyError::status),
            Some(StatusCode::INTERNAL_SERVER_ERROR)
        );
    }

    #[test]
    fn unknown_settle_policy_is_a_build_error() {
        let err = RateLimitLayer::builder()
            .quota(per_minute(1))
            .settle("login", Settle::COUNT_UNAUTHORIZED)
            .build()
            .unwrap_err();
        assert!(matches!(err, BuildError::UnknownPolicy(n) if n == "login"));
    }

    #[tokio::test]
    async fn exemptions_are_neither_charged_nor_reported() {
        let layer = RateLimitLayer::builder()
            .quota(per_minute(1))
            .exempt_networks(["192.0.2.0/24".parse().unwrap()])
            .exempt_keys([Key::Ip("198.51.100.1".parse().unwrap())])
            .resolver(AllPolicies.except(|r: &Request<()>| r.uri().path() == "/health"))
            .build()
            .unwrap();
        let svc = ServiceBuilder::new().layer(layer).service_fn(app);
        for (peer, path) in [
            ("192.0.2.7", "/"),
            ("[::ffff:192.0.2.8]", "/"),
            ("198.51.100.1", "/"),
            ("203.0.113.1", "/health"),
        ] {
            for _ in 0..3 {
                let res = svc.clone().oneshot(req(peer, path)).await.unwrap();
                assert_eq!(res.status(), StatusCode::OK, "{peer}{path}");
                assert!(res.headers().get("x-ratelimit-limit").is_none());
            }
        }
        let res = svc.clone().oneshot(req("203.0.113.1", "/")).await.unwrap();
        assert_eq!(res.headers()["x-ratelimit-remaining"], "0");
        let res = svc.clone().oneshot(req("203.0.113.1", "/")).await.unwrap();
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    }

    #[tokio::test]
    async fn an_exempt_route_needs_no_key_and_others_still_do() {
        // Keyed by API key; the health check sends none.
        let layer = RateLimitLayer::builder()
            .quota(per_minute(1))
            .key(crate::key::HeaderKey::raw("x-api-key"))
            .resolver(AllPolicies.except(|r: &Request<()>| r.uri().path() == "/health"))
            .build()
            .unwrap();
        let svc = ServiceBuilder::new().layer(layer).service_fn(app);
        for _ in 0..3 {
            let res = svc
                .clone()
                .oneshot(req("192.0.2.1", "/health"))
                .await
                .unwrap();
            assert_eq!(res.status(), StatusCode::OK);
            assert!(res.headers().get("x-ratelimit-limit").is_none());
        }
        // Not exempt and no key: the key error, as before.
        let res = svc.clone().oneshot(req("192.0.2.1", "/")).await.unwrap();
        assert_eq!(res.status(), StatusCode::BAD_REQUEST);
        // A resolver that charges nothing for the stand-in key does not open a bypass.
        let layer = RateLimitLayer::builder()
            .quota(per_minute(1))
            .key(crate::key::HeaderKey::raw("x-api-key"))
            .resolver(resolve_fn(|_: &Request<()>, plan: &mut Plan<'_>| {
                if plan.key() != &Key::Global {
                    plan.charge_all();
                }
            }))
            .build()
            .unwrap();
        let svc = ServiceBuilder::new().layer(layer).service_fn(app);
        let res = svc.clone().oneshot(req("192.0.2.1", "/")).await.unwrap();
        assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    }

    #[tokio::test]
    async fn preflights_are_free_unless_counted() {
        for counted in [false, true] {
            let layer = RateLimitLayer::builder()
                .quota(per_minute(1))
                .count_preflight(counted)
                .build()
                .unwrap();
            let svc = ServiceBuilder::new().layer(layer).service_fn(app);
            let preflight = || {
                let mut r = req("192.0.2.1", "/");
                *r.method_mut() = Method::OPTIONS;
                r.headers_mut()
                    .insert("access-control-request-method", "POST".parse().unwrap());
                r
            };
            svc.clone().oneshot(preflight()).await.unwrap();
            let second = svc.clone().oneshot(preflight()).await.unwrap();
            let expected = if counted {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::OK
            };
            assert_eq!(second.status(), expected);
        }
    }

    #[tokio::test]
    async fn server_errors_are_refunded() {
        let layer = RateLimitLayer::builder()
            .quota(per_minute(1))
            .settle("default", Settle::REFUND_SERVER_ERRORS)
            .store(MemoryStore::with_clock(ManualClock::new()))
            .build()
            .unwrap();
        let svc = ServiceBuilder::new().layer(layer).service_fn(app);
        for _ in 0..5 {
            let res = svc
                .clone()
                .oneshot(req("192.0.2.1", "/fail"))
                .await
                .unwrap();
            assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
        }
        let ok = svc.clone().oneshot(req("192.0.2.1", "/")).await.unwrap();
        assert_eq!(ok.status(), StatusCode::OK);
        let limited = svc.clone().oneshot(req("192.0.2.1", "/")).await.unwrap();
        assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
    }

    #[tokio::test]
    async fn pending_store_path_charges_the_planned_subset_and_settles() {
        let layer = RateLimitLayer::builder()
            .policy(Policy::new("wide", per_minute(10)))
            .policy(Policy::new("narrow", per_minute(1)))
            .settle("narrow", Settle::REFUND_SERVER_ERRORS)
            .resolver(resolve_fn(|r: &Request<()>, plan: &mut Plan<'_>| {
                let cost = plan.cost();
                plan.charge_with("narrow", Key::from(r.uri().path()), cost);
            }))
            .store(Pending(MemoryStore::with_clock(ManualClock::new())))
            .build()
            .unwrap();
        let svc = ServiceBuilder::new().layer(layer).service_fn(app);
        // Refunded after the 500: never limited.
        for _ in 0..3 {
            let res = svc
                .clone()
                .oneshot(req("192.0.2.1", "/fail"))
                .await
                .unwrap();
            assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
            assert_eq!(res.headers()["x-ratelimit-limit"], "1");
        }
        let ok = svc.clone().oneshot(req("192.0.2.1", "/a")).await.unwrap();
        assert_eq!(ok.status(), StatusCode::OK);
        let limited = svc.clone().oneshot(req("192.0.2.2", "/a")).await.unwrap();
        assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
        let body = http_body_util::BodyExt::collect(limited.into_body())
            .await
            .unwrap()
            .to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["violated-policies"], serde_json::json!(["narrow"]));
    }
}
