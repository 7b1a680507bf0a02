//! Per-route costs and limits keyed by the **route template**, not the raw path.
//!
//! A limiter that keys on `req.uri().path()` gives `/login`, `/login/`, `/LOGIN`, `//login`
//! and `/%6Cogin` separate buckets whenever the router sends them to the same handler. Here routes are identified by method and the template the router matched
//! (`/users/{id}/avatar`), read from axum's `MatchedPath` (feature `axum`) or a
//! [`RouteTemplate`] extension that another router inserts. Whatever spelling reaches a
//! handler, it is charged that handler's cost and bucket; spellings the router does not
//! match (a 404) carry no template and get the default cost and only the unscoped policies
//! (with no unscoped policy they are not limited, and not admitted to any handler either).
//!
//! - [`RouteTable`] ([`Resolve`]): per-route costs and route-scoped policies.
//! - [`MatchedRoute`] ([`KeyExtractor`]): the route itself as a key, for
//!   `(MatchedRoute, PeerIp::new())`.
//!
//! `HEAD` is looked up as `GET` (routers answer `HEAD` with the `GET` handler).
//!
//! # Example
//!
//! ```
//! use std::num::NonZeroU32;
//! use axum::http::Method;
//! use ratekeeper_core::{Policy, Quota};
//! use ratekeeper_tower::RateLimitLayer;
//! use ratekeeper_tower::route::RouteTable;
//!
//! let per_minute = |n| Quota::per_minute(NonZeroU32::new(n).unwrap());
//! let layer = RateLimitLayer::builder()
//!     .policy(Policy::new("api", per_minute(100)))
//!     .policy(Policy::new("login", per_minute(3)))
//!     .resolver(
//!         RouteTable::new()
//!             .cost(Method::GET, "/search", 10)
//!             .limit(Method::POST, "/login", "login"),
//!     )
//!     .build();
//! assert!(layer.is_ok());
//!
//! // A static route cost above a policy's burst is a build error.
//! let too_big = RateLimitLayer::builder()
//!     .policy(Policy::new("api", per_minute(5)))
//!     .resolver(RouteTable::new().cost(Method::GET, "/search", 10))
//!     .build();
//! assert!(too_big.is_err());
//! ```

use std::sync::Arc;

use http::{Method, Request};
use ratekeeper_core::{Key, Policy};
use smallvec::SmallVec;

use crate::error::BuildError;
use crate::key::{KeyError, KeyExtractor};
use crate::policy::{Plan, Resolve};

/// The matched route template of a request, for routers other than axum (insert it into the
/// request extensions before the limiter runs).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RouteTemplate(pub Arc<str>);

/// The route template the router matched: axum's `MatchedPath` (feature `axum`) or a
/// [`RouteTemplate`] extension. `None` when no route matched.
pub fn route_template<B>(req: &Request<B>) -> Option<&str> {
    let ext = req.extensions();
    #[cfg(feature = "axum")]
    if let Some(path) = ext.get::<axum::extract::MatchedPath>() {
        return Some(path.as_str());
    }
    ext.get::<RouteTemplate>().map(|t| &*t.0)
}

fn lookup_method(method: &Method) -> &Method {
    if method == Method::HEAD {
        &Method::GET
    } else {
        method
    }
}

fn route_key(method: &Method, template: &str) -> Key {
    Key::from(format!("{method} {template}"))
}

/// Keys by method and route template (`"POST /users/{id}/avatar"`); missing when no route
/// matched.
///
/// ```
/// use axum::http::Request;
/// use ratekeeper_tower::key::KeyExtractor;
/// use ratekeeper_tower::route::{MatchedRoute, RouteTemplate};
///
/// let mut req = Request::post("/users/7/avatar").body(()).unwrap();
/// req.extensions_mut().insert(RouteTemplate("/users/{id}/avatar".into()));
/// assert_eq!(MatchedRoute.extract(&req).unwrap().to_string(), "POST /users/{id}/avatar");
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MatchedRoute;

impl MatchedRoute {
    /// Falls back to `next` when no route matched.
    pub fn or<N>(self, next: N) -> crate::key::Or<Self, N> {
        crate::key::Or::new(self, next)
    }
}

impl KeyExtractor for MatchedRoute {
    fn extract<B>(&self, req: &Request<B>) -> Result<Key, KeyError> {
        route_template(req)
            .map(|t| route_key(lookup_method(req.method()), t))
            .ok_or(KeyError::Missing("no matched route"))
    }
}

#[derive(Debug, Clone)]
struct Route {
    method: Method,
    template: Box<str>,
    cost: Option<u64>,
    policies: SmallVec<[Box<str>; 2]>,
}

/// Per-route costs and route-scoped policies, keyed by method and route template.
///
/// - [`cost`](Self::cost): what one request to the route costs (units), for every policy
///   that applies to it. Other requests cost the layer's cost.
/// - [`limit`](Self::limit): the named policy applies **only** to the routes it is attached
///   to, and each route gets its own bucket per client: the key is
///   `(METHOD template, layer key)`. Policies never attached to a route apply to every
///   request with the layer's key.
///
/// Checked when the layer is built: every policy name exists, and no route cost is 0 or
/// larger than the capacity ([`Policy::capacity`](ratekeeper_core::Policy::capacity): the burst, or the limit for window
/// algorithms) of a policy that applies to that route ([`BuildError`]).
#[derive(Debug, Clone, Default)]
pub struct RouteTable {
    routes: Vec<Route>,
}

impl RouteTable {
    /// An empty table: every request is charged every policy at the layer's cost.
    pub fn new() -> Self {
        Self::default()
    }

    fn route_mut(&mut self, method: Method, template: &str) -> &mut Route {
        let pos = self
            .routes
            .iter()
            .position(|r| r.method == method && &*r.template == template);
        let i = match pos {
            Some(i) => i,
            None => {
                self.routes.push(Route {
                    method,
                    template: template.into(),
                    cost: None,
                    policies: SmallVec::new(),
                });
                self.routes.len() - 1
            }
        };
        &mut self.routes[i]
    }

    /// The key a policy attached to `method template` ([`RouteTable::limit`]) charges for the
    /// client key `client`: such a policy keeps a bucket per route and client, under
    /// `(<METHOD> <template>, client)` (`HEAD` shares `GET`'s bucket). Pass it to the layer's
    /// [`Admin`](crate::rate_limit::Admin) to peek at or reset a client's bucket on that
    /// route; the client key alone names the client's buckets of the layer-wide policies.
    ///
    /// ```
    /// use axum::http::Method;
    /// use ratekeeper_core::Key;
    /// use ratekeeper_tower::route::RouteTable;
    ///
    /// let key = RouteTable::scoped_key(&Method::POST, "/login", &Key::from("customer:alice"));
    /// assert_eq!(key.to_string(), "(POST /login,customer:alice)");
    /// ```
    pub fn scoped_key(method: &Method, template: &str, client: &Key) -> Key {
        Key::tuple([route_key(lookup_method(method), template), client.clone()])
    }

    /// Requests to `method template` cost `cost` units.
    pub fn cost(mut self, method: Method, template: &str, cost: u64) -> Self {
        self.route_mut(method, template).cost = Some(cost);
        self
    }

    /// The policy named `policy` applies to `method template` (and to the other routes it is
    /// attached to), with a bucket per route and client. A route either has a policy or not:
    /// attaching the same policy to a route twice is the same as once (the route is charged
    /// once, at its cost), so a table can never charge one policy twice in a request.
    pub fn limit(mut self, method: Method, template: &str, policy: &str) -> Self {
        let route = self.route_mut(method, template);
        if !route.policies.iter().any(|p| &**p == policy) {
            route.policies.push(policy.into());
        }
        self
    }

    /// Exempts requests for which `predicate` is true.
    pub fn except<P>(self, predicate: P) -> crate::policy::Except<Self, P> {
        crate::policy::Except::new(self, predicate)
    }

    fn scoped(&self, policy: &str) -> bool {
        self.routes
            .iter()
            .any(|r| r.policies.iter().any(|p| &**p == policy))
    }

    fn find(&self, method: &Method, template: &str) -> Option<&Route> {
        let method = lookup_method(method);
        self.routes
            .iter()
            .find(|r| r.method == *method && &*r.template == template)
    }
}

impl Resolve for RouteTable {
    fn resolve<B>(&self, req: &Request<B>, plan: &mut Plan<'_>) {
        let template = route_template(req);
        let route = template.and_then(|t| self.find(req.method(), t));
        let cost = route.and_then(|r| r.cost).unwrap_or(plan.cost());
        let names = plan.names();
        for (index, name) in (0u32..).zip(names) {
            if !self.scoped(name) {
                plan.push(index, None, cost);
            } else if let (Some(route), Some(template)) = (route, template) {
                if route.policies.iter().any(|p| p == name) {
                    let key = Self::scoped_key(req.method(), template, plan.key());
                    plan.push(index, Some(key), cost);
                }
            }
        }
    }

    fn check(&self, policies: &[Policy]) -> Result<(), BuildError> {
        for route in &self.routes {
            check_template(&route.template)?;
            for name in &route.policies {
                if !policies.iter().any(|p| p.name() == &**name) {
                    return Err(BuildError::UnknownPolicy(name.to_string()));
                }
            }
            let Some(cost) = route.cost else { continue };
            if cost == 0 {
                return Err(BuildError::ZeroCost);
            }
            let applies = policies.iter().filter(|p| {
                !self.scoped(p.name()) || route.policies.iter().any(|n| &**n == p.name())
            });
            for p in applies {
                if cost > u64::from(p.capacity()) {
                    return Err(BuildError::CostExceedsBurst {
                        policy: p.name().to_owned(),
                        cost,
                        burst: p.capacity(),
                    });
                }
            }
        }
        Ok(())
    }
}

/// Checks that `template` can match a route as axum 0.8 writes it: a leading `/`, parameters
/// as `{name}` and a catch-all as `{*name}`. axum 0.7's `:name` and `*name` segments are
/// literal text under axum 0.8 (and `MatchedPath` reports the template as written in the
/// router), so such a route would never match and silently stay under the general limit only.
/// So would a template with a query string (`/search?q=1`: a route matches the path only), a
/// nameless parameter (`{}`, `{*}`: refused by axum's router), or a space, line break or
/// other control character (no request path holds one).
///
/// # Errors
///
/// [`BuildError::RouteTemplate`] naming the template, what is wrong and the fix.
pub fn check_template(template: &str) -> Result<(), BuildError> {
    let err = |problem: &'static str, fix: String| {
        Err(BuildError::RouteTemplate {
            template: template.to_owned(),
            problem,
            fix,
        })
    };
    if !template.starts_with('/') {
        return err(
            "it does not start with `/`",
            format!("write \"/{template}\""),
        );
    }
    let mut fixed = String::with_capacity(template.len() + 4);
    let mut legacy = None;
    for (i, segment) in template.split('/').enumerate() {
        if i > 0 {
            fixed.push('/');
        }
        // A parameter needs a name under axum 0.8 (`{}` and `{*}` are refused by the router).
        if let Some(name) = segment.strip_prefix(':') {
            legacy.get_or_insert("it uses axum 0.7's `:param` syntax");
            let name = if name.is_empty() { "param" } else { name };
            fixed.push_str(&format!("{{{name}}}"));
        } else if let Some(name) = segment.strip_prefix('*') {
            legacy.get_or_insert("it uses axum 0.7's `*rest` syntax");
            let name = if name.is_empty() { "rest" } else { name };
            fixed.push_str(&format!("{{*{name}}}"));
        } else {
            fixed.push_str(segment);
        }
    }
    if let Some(problem) = legacy {
        return err(
            problem,
            format!(
                "write \"{fixed}\" (axum 0.8 writes parameters as `{{param}}` and `{{*rest}}`)"
            ),
        );
    }
    if let Some((path, _)) = template.split_once('?') {
        return err(
            "it has a query string, and a route matches the path only",
            format!("write \"{path}\" (the query is never part of the route)"),
        );
    }
    let (opens, closes) = (template.matches('{').count(), template.matches('}').count());
    if opens != closes {
        return err(
            "its braces do not pair up",
            "write each parameter as `{param}` (or `{*rest}` for the rest of the path)".to_owned(),
        );
    }
    if template.contains("{}") || template.contains("{*}") {
        return err(
            "a parameter has no name",
            "write each parameter as `{param}` (or `{*rest}` for the rest of the path)".to_owned(),
        );
    }
    if let Some(c) = template
        .chars()
        .find(|c| c.is_control() || c.is_whitespace())
    {
        let problem = if matches!(c, '\n' | '\r') {
            "it holds a line break, which no request path holds"
        } else {
            "it holds a space or control character, which no request path holds"
        };
        let fixed: String = template
            .chars()
            .filter(|c| !c.is_control() && !c.is_whitespace())
            .collect();
        return err(
            problem,
            format!("write \"{fixed}\" (percent-encode a space as %20)"),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::num::NonZeroU32;

    use ratekeeper_core::Quota;

    fn policies() -> Vec<Policy> {
        vec![
            Policy::new("api", Quota::per_minute(NonZeroU32::new(100).unwrap())),
            Policy::new("login", Quota::per_minute(NonZeroU32::new(3).unwrap())),
        ]
    }

    #[test]
    fn check_catches_names_and_costs() {
        let p = policies();
        assert!(matches!(
            Resolve::check(&RouteTable::new().limit(Method::POST, "/x", "nope"), &p),
            Err(BuildError::UnknownPolicy(n)) if n == "nope"
        ));
        assert!(matches!(
            Resolve::check(&RouteTable::new().cost(Method::GET, "/x", 0), &p),
            Err(BuildError::ZeroCost)
        ));
        // 50 fits "api" (100); "login" is scoped to another route, so it does not apply.
        let t = RouteTable::new().cost(Method::GET, "/search", 50).limit(
            Method::POST,
            "/login",
            "login",
        );
        assert!(Resolve::check(&t, &p).is_ok());
        let t = t.cost(Method::POST, "/login", 4);
        assert!(matches!(
            Resolve::check(&t, &p),
            Err(BuildError::CostExceedsBurst {
                cost: 4,
                burst: 3,
                ..
            })
        ));
    }

    #[test]
    fn templates_are_checked_when_the_layer_is_built() {
        let p = policies();
        let message = |template: &str| {
            Resolve::check(&RouteTable::new().cost(Method::GET, template, 1), &p)
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            message("search"),
            "route template \"search\" can never match: it does not start with `/`; \
             write \"/search\""
        );
        assert_eq!(
            message("/items/:id"),
            "route template \"/items/:id\" can never match: it uses axum 0.7's `:param` \
             syntax; write \"/items/{id}\" (axum 0.8 writes parameters as `{param}` and \
             `{*rest}`)"
        );
        assert!(message("/files/*rest").contains("write \"/files/{*rest}\""));
        assert!(message("/a/{id").contains("braces"));
        let limit = RouteTable::new().limit(Method::POST, "login", "login");
        assert!(matches!(
            Resolve::check(&limit, &p),
            Err(BuildError::RouteTemplate { template, .. }) if template == "login"
        ));
        for good in ["/", "/items/{id}", "/files/{*rest}", "/users/{id}/avatar"] {
            assert!(check_template(good).is_ok(), "{good}");
        }
    }

    #[test]
    fn templates_that_can_never_match_name_a_fix_that_can() {
        let message = |template: &str| check_template(template).unwrap_err().to_string();
        // A nameless legacy parameter: the fix names it (`{*}` and `{}` are refused by axum).
        assert!(
            message("/*").contains("write \"/{*rest}\""),
            "{}",
            message("/*")
        );
        assert!(
            message("/:").contains("write \"/{param}\""),
            "{}",
            message("/:")
        );
        // A query string is never part of a matched route.
        assert_eq!(
            message("/search?q=1"),
            "route template \"/search?q=1\" can never match: it has a query string, and a \
             route matches the path only; write \"/search\" (the query is never part of the \
             route)"
        );
        for nameless in ["/items/{}", "/files/{*}"] {
            assert!(
                message(nameless).contains("a parameter has no name"),
                "{nameless}"
            );
        }
    }

    #[test]
    fn resolve_scopes_and_costs() {
        let names: Vec<Box<str>> = vec!["api".into(), "login".into()];
        let table = RouteTable::new().cost(Method::GET, "/search", 10).limit(
            Method::POST,
            "/login",
            "login",
        );
        let key = Key::from("client");
        let req = |m: Method, t: Option<&str>| {
            let mut req = Request::builder().method(m).body(()).unwrap();
            if let Some(t) = t {
                req.extensions_mut().insert(RouteTemplate(t.into()));
            }
            req
        };
        let entries = |r: &Request<()>| {
            let mut plan = Plan::new(&names, &key, 1);
            table.resolve(r, &mut plan);
            format!("{plan:?}")
        };
        let search = entries(&req(Method::HEAD, Some("/search")));
        assert!(search.contains("cost: 10"), "{search}");
        let login = entries(&req(Method::POST, Some("/login")));
        assert!(
            login.contains("(POST /login,client)") || login.contains("POST /login"),
            "{login}"
        );
        assert!(login.contains("index: 1"), "{login}");
        let unmatched = entries(&req(Method::POST, None));
        assert!(!unmatched.contains("index: 1"), "{unmatched}");
        assert!(unmatched.contains("index: 0"), "{unmatched}");
    }
}
