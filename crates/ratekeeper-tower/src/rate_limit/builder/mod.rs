//! [`RateLimitBuilder`](crate::RateLimitBuilder): policies, key, cost, store, headers and mode, checked into a
//! [`RateLimitLayer`](crate::RateLimitLayer).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use ratekeeper_core::store::MemoryStore;
use ratekeeper_core::{Key, Policy, Quota};

use super::layer::RateLimitLayer;
use super::mode::Mode;
use crate::key::PeerIp;
use crate::policy::{AllPolicies, Rules, Settle};
use crate::report::{HeaderStyle, PartitionKey, Rejection, ResetFormat};
use crate::usage::Usage;

mod build;

/// Everything a [`RateLimitBuilder`](crate::RateLimitBuilder) holds that does not change its type, moved as a whole when a
/// strategy (key, cost, store, resolver) is swapped.
#[derive(Default)]
struct Settings {
    policies: Vec<Policy>,
    fixed_cost: Option<u64>,
    style: HeaderStyle,
    reset: ResetFormat,
    mode: Mode,
    rejection: Option<Arc<dyn Rejection>>,
    partition_key: Option<PartitionKey>,
    request_info: bool,
    rules: Rules,
    settle: Vec<(String, Settle)>,
    usage: Vec<(String, Usage)>,
    quiet_forwarded: bool,
    raw_keys: bool,
    grpc: bool,
    /// The fail-closed 503's `Retry-After`; `None`: the default.
    unavailable_retry_after: Option<Duration>,
}

impl RateLimitLayer {
    /// A builder for several policies, another key, cost, store or header style.
    pub fn builder() -> RateLimitBuilder {
        RateLimitBuilder::new()
    }
}

/// Builds a [`RateLimitLayer`](crate::RateLimitLayer): policies, key extractor, cost, store, headers.
///
/// ```
/// use std::num::NonZeroU32;
/// use ratekeeper_core::{Policy, Quota};
/// use ratekeeper_tower::{key::GlobalKey, RateLimitLayer};
///
/// let layer = RateLimitLayer::builder()
///     .policy(Policy::new("burst", Quota::per_second(NonZeroU32::new(50).unwrap())))
///     .policy(Policy::new("daily", Quota::per_day(NonZeroU32::new(10_000).unwrap())))
///     .key(GlobalKey)
///     .build()?;
/// assert_eq!(layer.policy_ids().len(), 2);
/// # Ok::<(), ratekeeper_tower::BuildError>(())
/// ```
pub struct RateLimitBuilder<K = PeerIp, Co = u64, St = MemoryStore<Key>, R = AllPolicies> {
    settings: Settings,
    key: K,
    cost: Co,
    store: St,
    resolver: R,
}

impl RateLimitBuilder {
    /// Peer-IP key, cost 1, memory store, `X-RateLimit-*` headers, no policy yet.
    pub fn new() -> Self {
        Self {
            settings: Settings {
                fixed_cost: Some(1),
                ..Settings::default()
            },
            key: PeerIp::new(),
            cost: 1,
            store: MemoryStore::new(),
            resolver: AllPolicies,
        }
    }
}

impl Default for RateLimitBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl<K, Co, St, R> RateLimitBuilder<K, Co, St, R> {
    /// Adds a policy. Every policy is checked on every request, all-or-nothing, with its own
    /// algorithm ([`Policy::with_algorithm`]; GCRA by default).
    pub fn policy(mut self, policy: Policy) -> Self {
        self.settings.policies.push(policy);
        self
    }

    /// Adds a GCRA policy named `"default"` with `quota`.
    pub fn quota(self, quota: Quota) -> Self {
        self.policy(Policy::new("default", quota))
    }

    /// Sets the key extractor.
    pub fn key<K2>(self, key: K2) -> RateLimitBuilder<K2, Co, St, R> {
        let Self {
            settings,
            cost,
            store,
            resolver,
            ..
        } = self;
        RateLimitBuilder {
            settings,
            key,
            cost,
            store,
            resolver,
        }
    }

    /// Sets a fixed cost per request, in units (checked against every policy's capacity when
    /// the layer is built).
    pub fn cost(self, cost: u64) -> RateLimitBuilder<K, u64, St, R> {
        self.cost_fn(cost)
    }

    /// Sets the cost of each request, in units (see [`crate::cost::Cost`]). When the cost is
    /// the same for every request ([`Cost::fixed`](crate::cost::Cost::fixed) is `Some`),
    /// [`build`](Self::build) refuses 0 and a cost above a policy's capacity; a cost computed
    /// per request above the capacity gets the "cost can never fit" 429.
    pub fn cost_fn<Co2: crate::cost::Cost>(self, cost: Co2) -> RateLimitBuilder<K, Co2, St, R> {
        let Self {
            mut settings,
            key,
            store,
            resolver,
            ..
        } = self;
        settings.fixed_cost = cost.fixed();
        RateLimitBuilder {
            settings,
            key,
            cost,
            store,
            resolver,
        }
    }

    /// Sets the store (default: a new [`MemoryStore`]).
    pub fn store<St2>(self, store: St2) -> RateLimitBuilder<K, Co, St2, R> {
        let Self {
            settings,
            key,
            cost,
            resolver,
            ..
        } = self;
        RateLimitBuilder {
            settings,
            key,
            cost,
            store,
            resolver,
        }
    }

    /// Sets the policy resolver (default [`AllPolicies`]): which policies each request is
    /// charged to, with which key and cost. See [`crate::policy`] and
    /// [`crate::route::RouteTable`].
    pub fn resolver<R2>(self, resolver: R2) -> RateLimitBuilder<K, Co, St, R2> {
        let Self {
            settings,
            key,
            cost,
            store,
            ..
        } = self;
        RateLimitBuilder {
            settings,
            key,
            cost,
            store,
            resolver,
        }
    }

    /// Sets the rate-limit header style (default [`HeaderStyle::XRateLimit`]).
    pub fn headers(mut self, style: HeaderStyle) -> Self {
        self.settings.style = style;
        self
    }

    /// Sets how reset values are written (default [`ResetFormat::DeltaSeconds`]).
    pub fn reset_format(mut self, reset: ResetFormat) -> Self {
        self.settings.reset = reset;
        self
    }

    /// Sets what happens to a request over the limit (default [`Mode::Reject`]).
    pub fn mode(mut self, mode: Mode) -> Self {
        self.settings.mode = mode;
        self
    }

    /// Replaces the default problem+json 429 (and, through [`Rejection::unkeyed`], the `400`
    /// of a request without a key) with `rejection`. The layer still adds the rate-limit
    /// headers, `Retry-After`, `Cache-Control: no-store` and `Content-Length` to its 429.
    pub fn rejection<J: Rejection>(mut self, rejection: J) -> Self {
        self.settings.rejection = Some(Arc::new(rejection));
        self
    }

    /// Whether allowed requests carry an [`Info`](crate::info::Info) extension (default
    /// `false`; the axum `RateLimitInfo` extractor reads it, so turn it on for handlers that
    /// extract it). Off, an allowed request costs no extension (no allocation, map insert or
    /// copy of the decisions). Requests let through over the limit (shadow mode,
    /// fallback) always carry it; in shadow mode, requests under the limit carry it only
    /// when this is on.
    pub fn request_info(mut self, on: bool) -> Self {
        self.settings.request_info = on;
        self
    }

    /// Adds a hashed partition key (`pk`) to the IETF headers (see
    /// [`PartitionKey`](crate::report::PartitionKey)). Off by default.
    pub fn partition_key(mut self, partition_key: PartitionKey) -> Self {
        self.settings.partition_key = Some(partition_key);
        self
    }

    /// Settles the named policy's charge once the response status is known (see
    /// [`Settle`]). Checked at build time: the policy must exist.
    pub fn settle(mut self, policy: &str, settle: Settle) -> Self {
        self.settings.settle.push((policy.to_owned(), settle));
        self
    }

    /// Settles the named policy's charge to its true cost once the response tells it: a
    /// response header, a trailer, or a count over the streamed body (see [`usage`] for the
    /// sources, the reserve-then-settle flow and its bound). The request is charged the
    /// layer's cost (or the resolver's) as an estimate first; the other policies keep their
    /// charge. Checked at build time: the policy must exist. Given twice for one policy, the
    /// last one holds.
    ///
    /// [`usage`]: crate::usage
    pub fn usage(mut self, policy: &str, usage: Usage) -> Self {
        self.settings.usage.push((policy.to_owned(), usage));
        self
    }

    /// Exempts requests that look like CORS preflights (see
    /// [`cors::is_preflight`](crate::cors::is_preflight): `OPTIONS` with `Origin` and
    /// `Access-Control-Request-Method`, and no body). Default `false`: every request that
    /// reaches this layer is counted.
    ///
    /// The exemption is **client-controlled**: any client can send those headers, so on a
    /// route whose handler also answers `OPTIONS` (a catch-all, a JSON-RPC endpoint) it
    /// opens a way around the limit. Prefer a `tower_http::cors::CorsLayer` *outside* this
    /// layer: it answers real preflights itself, so they never reach the limiter and stay
    /// free (see [`crate::cors`]).
    pub fn exempt_preflight(mut self, exempt: bool) -> Self {
        self.settings.rules.exempt_preflight = exempt;
        self
    }

    /// Clients inside these networks (for example monitoring or an internal network) are
    /// not limited: their requests reach the inner service without rate-limit headers.
    ///
    /// A network is matched against the request's **client** address, as the layer's
    /// trust rules read it: the rules of [`exempt_client_ip`](Self::exempt_client_ip) when
    /// set, else those of the key extractor
    /// ([`KeyExtractor::trusted_proxies`](crate::key::KeyExtractor::trusted_proxies):
    /// a [`ForwardedIp`](crate::key::ForwardedIp) key, or a combination holding one):
    ///
    /// - A request from a trusted proxy is matched by the client its forwarded chain names
    ///   (read as [`ForwardedIp`](crate::key::ForwardedIp) reads it), never by the proxy:
    ///   an exempt network that holds the proxy does not exempt the clients behind it. A
    ///   chain that names no client (an entry that does not parse) exempts nobody.
    /// - Any other request is matched by its TCP peer (an internal caller that reaches the
    ///   app directly, or a trusted proxy's own request without a forwarded chain) — unless
    ///   it carries `X-Forwarded-For` or `Forwarded` that the rules read no client from (no
    ///   rules, a peer that is not a trusted proxy, another header than the rules read): the
    ///   peer then acts as a proxy the layer was not told to trust, the request is limited
    ///   like any other, and the layer logs one WARN (target `ratekeeper`) naming the fix.
    ///   So a proxy inside an exempt network never exempts everyone behind it.
    ///
    /// With a key that is not an address ([`HeaderKey`](crate::key::HeaderKey),
    /// [`UserKey`](crate::key::UserKey)) behind a reverse proxy, state the proxies with
    /// [`exempt_client_ip`](Self::exempt_client_ip) so that forwarded clients in the
    /// networks are exempt.
    ///
    /// Addresses and networks are compared in the normal form of
    /// [`normalize_ip`](crate::key::normalize_ip): IPv4-mapped and well-known NAT64
    /// (`64:ff9b::/96`) spellings are IPv4, so `::ffff:192.0.2.0/120` and `192.0.2.0/24` are
    /// the same network and match `192.0.2.7` in either spelling. With no exempt network (the
    /// default) the layer reads no address for exemptions.
    ///
    /// ```
    /// use std::net::SocketAddr;
    /// use std::num::NonZeroU32;
    /// use axum::http::{Request, Response, StatusCode};
    /// use ratekeeper_core::Quota;
    /// use ratekeeper_tower::key::{ForwardedIp, PeerAddr};
    /// use ratekeeper_tower::RateLimitLayer;
    /// use tower::{ServiceBuilder, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let loopback = "127.0.0.0/8".parse()?;
    /// let svc = ServiceBuilder::new()
    ///     .layer(
    ///         RateLimitLayer::builder()
    ///             .quota(Quota::per_minute(NonZeroU32::MIN))
    ///             // A reverse proxy on loopback forwards the clients ...
    ///             .key(ForwardedIp::trusting([loopback]))
    ///             // ... and local callers (health checks) are exempt.
    ///             .exempt_networks([loopback])
    ///             .build()?,
    ///     )
    ///     .service_fn(|_req: Request<()>| async { Ok::<_, std::convert::Infallible>(Response::new(())) });
    /// let request = |xff: Option<&str>| {
    ///     let mut req = Request::builder();
    ///     if let Some(client) = xff {
    ///         req = req.header("x-forwarded-for", client);
    ///     }
    ///     let mut req = req.body(()).unwrap();
    ///     req.extensions_mut().insert(PeerAddr("127.0.0.1:40000".parse::<SocketAddr>().unwrap()));
    ///     req
    /// };
    /// // A client forwarded by the proxy is limited by its own address.
    /// let first = svc.clone().oneshot(request(Some("203.0.113.9"))).await?;
    /// assert_eq!(first.status(), StatusCode::OK);
    /// assert_eq!(first.headers()["x-ratelimit-remaining"], "0");
    /// let second = svc.clone().oneshot(request(Some("203.0.113.9"))).await?;
    /// assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
    /// // A local caller without a forwarded chain is exempt: no limit, no headers.
    /// for _ in 0..3 {
    ///     let local = svc.clone().oneshot(request(None)).await?;
    ///     assert_eq!(local.status(), StatusCode::OK);
    ///     assert!(local.headers().get("x-ratelimit-limit").is_none());
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn exempt_networks(mut self, networks: impl IntoIterator<Item = ipnet::IpNet>) -> Self {
        // Normalised in `build`, with the NAT64 prefixes set by then.
        self.settings.rules.exempt_networks.extend(networks);
        self
    }

    /// The trusted-proxy rules by which the layer reads a request's client address for
    /// [`exempt_networks`](Self::exempt_networks), in place of the key extractor's
    /// ([`KeyExtractor::trusted_proxies`](crate::key::KeyExtractor::trusted_proxies)).
    /// Needed behind a reverse proxy when the key is not an address (an API key, a user):
    /// without rules, a request that a proxy forwarded is never exempt (see
    /// [`exempt_networks`](Self::exempt_networks)). The rules only decide exemptions; the
    /// key stays the key extractor's.
    ///
    /// ```
    /// use ratekeeper_core::Quota;
    /// use ratekeeper_tower::key::{ForwardedIp, HeaderKey};
    /// use ratekeeper_tower::RateLimitLayer;
    /// use std::num::NonZeroU32;
    ///
    /// let layer = RateLimitLayer::builder()
    ///     .quota(Quota::per_minute(NonZeroU32::new(600).unwrap()))
    ///     .key(HeaderKey::raw("x-api-key"))
    ///     // Internal clients, reached through the proxy on 127.0.0.1, are exempt ...
    ///     .exempt_networks(["10.0.0.0/8".parse()?])
    ///     // ... by the address the proxy forwards, not the proxy's own.
    ///     .exempt_client_ip(ForwardedIp::trusting(["127.0.0.1/32".parse()?]))
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn exempt_client_ip(mut self, rules: crate::key::ForwardedIp) -> Self {
        self.settings.rules.exempt_trust = Some(rules);
        self
    }

    /// Also reads client addresses inside `prefix`, your NAT64 translator's network-specific
    /// prefix, as the IPv4 address they embed when matching
    /// [`exempt_networks`](Self::exempt_networks) (the well-known `64:ff9b::/96` always is,
    /// and so is the prefix of the trust rules the exempt networks are read by). Set the
    /// same prefix on the key extractor ([`PeerIp::nat64`](crate::key::PeerIp::nat64),
    /// [`ForwardedIp::nat64`](crate::key::ForwardedIp::nat64)) so that keys agree.
    pub fn nat64(mut self, prefix: crate::key::Nat64Prefix) -> Self {
        self.settings.rules.nat64.push(prefix);
        self
    }

    /// Requests whose key (from the layer's key extractor) is one of `keys` are not limited.
    /// An address key is compared in the normal form of the IP extractors
    /// ([`normalize_ip`](crate::key::normalize_ip)), as they write it.
    pub fn exempt_keys(mut self, keys: impl IntoIterator<Item = Key>) -> Self {
        let keys = keys.into_iter().map(|key| match key {
            Key::Ip(ip) => Key::Ip(crate::key::normalize_ip(ip, &[])),
            key => key,
        });
        self.settings.rules.exempt_keys.extend(keys);
        self
    }

    /// Whether to warn (once, at WARN, target `ratekeeper`) when a request keyed by its peer
    /// address ([`PeerIp`], see [`KeyExtractor::keys_by_peer`](crate::key::KeyExtractor::keys_by_peer))
    /// arrives from a private or loopback peer with an `X-Forwarded-For` or `Forwarded`
    /// header: a reverse proxy is in front, and every client behind it shares its budget. The
    /// warning names the fix, [`ForwardedIp`](crate::key::ForwardedIp). The layer looks at the
    /// first 4,096 requests from private peers (a proxy adds the header to every request, so
    /// it shows itself among them) and then stops looking, so the watch costs nothing in
    /// the long run. Default `true`; turn it off when one budget for the proxy is what you
    /// want.
    pub fn warn_forwarded(mut self, on: bool) -> Self {
        self.settings.quiet_forwarded = !on;
        self
    }

    /// Whether the per-decision DEBUG events (target `ratekeeper::decision`) and the other
    /// log lines that name a key write the raw key (an IP address, an API key) instead of its
    /// hash (`h:` and 16 hex digits of SHA-256 of the key). Default `false`: keys are
    /// pseudonymous in logs.
    pub fn log_raw_keys(mut self, on: bool) -> Self {
        self.settings.raw_keys = on;
        self
    }

    /// Whether this layer serves gRPC (tonic, gRPC-Web): a refused gRPC call then gets a
    /// gRPC answer, a trailers-only response with HTTP `200 OK` and `grpc-status: 8`
    /// (`RESOURCE_EXHAUSTED`), which gRPC clients read (see [`report`](crate::report#grpc)).
    ///
    /// A gRPC call is recognised by its protocol's grammar: `content-type: application/grpc`
    /// (or `application/grpc+<format>`) on an HTTP/2 request, or a gRPC-Web content type
    /// (`application/grpc-web`, `application/grpc-web-text`, with an optional
    /// `+<format>`) on any HTTP version. Default `false`: every refusal is an HTTP status
    /// (429, 503, 400, 500) whatever the request's `content-type` says, so a client of a
    /// plain HTTP service cannot turn its own 429 into a 200 that access logs and proxies do
    /// not count as a refusal.
    pub fn grpc(mut self, on: bool) -> Self {
        self.settings.grpc = on;
        self
    }

    /// How long a client should wait before it retries after the `503 Service Unavailable`
    /// the layer answers when the store cannot decide and its failure policy is
    /// [`FailurePolicy::Deny`](ratekeeper_core::store::FailurePolicy::Deny) (fail closed).
    ///
    /// The 503 carries it as `Retry-After` in whole seconds, rounded up and at least 1, in an
    /// RFC 9457 `application/problem+json` body of type
    /// [`TEMPORARY_REDUCED_CAPACITY_TYPE`](crate::report::TEMPORARY_REDUCED_CAPACITY_TYPE)
    /// whose `detail` names the same seconds; a gRPC call gets `UNAVAILABLE` with the same
    /// delay as `retry-after` and a `google.rpc.RetryInfo` (see [`RateLimitBuilder::grpc`](crate::RateLimitBuilder::grpc)).
    /// Default 1 s: the Redis store's default circuit-breaker open period (500 ms) rounded
    /// up, after which the breaker lets a request probe Redis again. With a longer breaker
    /// period (`RedisStoreBuilder::breaker`), set the same duration here, so clients come
    /// back when the store is tried again rather than while it is still skipped.
    pub fn unavailable_retry_after(mut self, retry_after: Duration) -> Self {
        self.settings.unavailable_retry_after = Some(retry_after);
        self
    }
}

impl<K, Co, St, R> fmt::Debug for RateLimitBuilder<K, Co, St, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.settings;
        f.debug_struct("RateLimitBuilder")
            .field("policies", &s.policies)
            .field("style", &s.style)
            .field("reset", &s.reset)
            .field("mode", &s.mode)
            .field("custom_rejection", &s.rejection.is_some())
            .field("partition_key", &s.partition_key)
            .field("request_info", &s.request_info)
            .finish_non_exhaustive()
    }
}
