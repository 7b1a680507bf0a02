//! A layer from a configuration file (feature `serde`; `toml` to read TOML).
//!
//! [`LayerConfig`] holds what a [`RateLimitBuilder`] is told in code:
//! policies (name, quota, algorithm), the key, the cost, a route table with costs and
//! route-scoped policies, tiers, exemptions, the header style and the mode. It deserialises
//! with any `serde` format; with the `toml` feature, [`LayerConfig::from_toml`] reads a TOML
//! document and a mistake is a [`ConfigError`] naming the file, line, column and field, for
//! settings that do not fit together (an unknown policy in a route, a cost above a burst, a
//! duplicate policy name or route) as for a typo. [`LayerConfig::build`] then builds the
//! layer, with the same checks as the builder.
//!
//! # The document
//!
//! Every field but `policies` is optional; the defaults are the builder's (peer-IP key, cost
//! 1, `X-RateLimit-*` headers, reject mode).
//!
//! ```toml
//! # The key: "peer_ip" (default), "global", "header" (with `header`; keyed by a digest, see
//! # `HeaderKey::raw`) or "forwarded" (with `trusted`, the proxies' networks). `nat64`: your NAT64 translator's prefix, whose
//! # addresses are keyed (and matched against `exempt.networks`) as the IPv4 address they
//! # embed; 64:ff9b::/96 always is.
//! key = { kind = "forwarded", trusted = ["10.0.0.0/8"], nat64 = ["64:ff9b:1::/96"] }
//! cost = 1                      # units per request, unless a route says otherwise
//! headers = "ietf"              # x-ratelimit | ietf | ietf-legacy | both | none
//! mode = "reject"               # reject | shadow | delay (with max_wait_ms)
//!
//! [[policies]]
//! name = "api"
//! quota = "100/m burst 20"      # see `Quota`'s string form
//!
//! [[policies]]
//! name = "login"
//! quota = "5/m"
//! algorithm = "sliding_window"  # gcra (default), leaky_bucket, fixed_window, sliding_window, sliding_log
//! # Optional: once this policy refused a client `after` times within `within`, every request
//! # of the client under it is refused for `duration` (see `Ban`). Durations: "500ms",
//! # "30s", "15m", "1h", "1d"; whole µs, at most 365 days.
//! ban = { after = 3, within = "1m", duration = "15m" }
//!
//! [[routes]]
//! method = "GET"
//! path = "/search"              # axum 0.8 templates: "/items/{id}", "/files/{*rest}"
//! cost = 5
//!
//! [[routes]]
//! method = "POST"
//! path = "/login"
//! policies = ["login"]          # route-scoped: only this route, a bucket per route and client
//!
//! [exempt]
//! networks = ["192.0.2.0/24"]   # clients never limited (by the client's address: see below)
//! preflight = false             # CORS preflights (client-controlled: see the builder)
//! ```
//!
//! # Exempt networks
//!
//! `exempt.networks` are matched against the request's **client** address, never a
//! proxy's. With a `forwarded` key, a request from one of the `trusted` proxies is matched by
//! the client the proxy forwards; other requests by their TCP peer. So
//!
//! ```toml
//! key = { kind = "forwarded", trusted = ["127.0.0.0/8"] }
//!
//! [[policies]]
//! name = "api"
//! quota = "100/m"
//!
//! [exempt]
//! networks = ["127.0.0.0/8"]
//! ```
//!
//! exempts local callers that reach the app directly (a health check on loopback), while
//! every client the proxy on 127.0.0.1 forwards is limited by its own address. With another
//! key (`peer_ip`, `header`, `global`) behind a reverse proxy, name the proxies in
//! `[exempt]` so the forwarded clients in `networks` are exempt:
//!
//! ```toml
//! key = { kind = "header", header = "x-api-key" }
//!
//! [[policies]]
//! name = "api"
//! quota = "100/m"
//!
//! [exempt]
//! networks = ["10.0.0.0/8"]     # internal clients, reached through the proxy
//! trusted = ["127.0.0.1/32"]    # the proxy (reads X-Forwarded-For)
//! ```
//!
//! Without `trusted` proxies, a request carrying `X-Forwarded-For` or `Forwarded` from a
//! peer in an exempt network is not exempt: the peer is a proxy, and its clients are not
//! exempt by its address (the layer logs one WARN naming the fix). Proxies in `trusted`
//! are read as [`ForwardedIp::trusting`] reads them (the rightmost untrusted entry is the
//! client; a chain that does not parse exempts nobody). `exempt.trusted` with a `forwarded`
//! key, or without `networks`, is an error naming the field.
//!
//! Tiers charge one of several policies by the value of a request header:
//!
//! ```toml
//! [[policies]]
//! name = "free"
//! quota = "60/m"
//!
//! [[policies]]
//! name = "paid"
//! quota = "1000/m"
//!
//! [tiers]
//! header = "x-api-key"          # a secret (an API key) or a header your gateway sets
//! default = "free"              # requests whose value is not listed
//! values = { "key-acme" = "paid", "key-globex" = "paid" }
//! ```
//!
//! The tier header decides the budget, so it must be one a client cannot choose freely: an
//! API key (a client only gets the paid tier with a paid key), or a header your
//! authentication gateway sets and strips from client requests.
//!
//! # Example
//!
//! ```
//! # #[cfg(feature = "toml")] {
//! use ratekeeper_tower::config::LayerConfig;
//!
//! let text = r#"
//! [[policies]]
//! name = "api"
//! quota = "100/m"
//!
//! [[routes]]
//! method = "GET"
//! path = "/search"
//! cost = 5
//! "#;
//! let layer = LayerConfig::from_toml("ratekeeper.toml", text).unwrap().build().unwrap();
//! assert_eq!(layer.policy_ids().len(), 1);
//!
//! // A typo: the error names the file, the line, the column and the field.
//! let err = LayerConfig::from_toml("ratekeeper.toml", "[[policies]]\nname = \"api\"\nquota = \"100/fortnight\"\n").unwrap_err();
//! assert_eq!((err.line(), err.column()), (Some(3), Some(9)));
//! assert!(err.to_string().starts_with("ratekeeper.toml:3:9: policies[0].quota: "), "{err}");
//! # }
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use http::Request;
use ipnet::IpNet;
use ratekeeper_core::store::MemoryStore;
use ratekeeper_core::{Key, Policy};
use serde::Deserialize;

mod fields;

use fields::networks;
pub use fields::{HeaderField, MethodField, RoutePath};

use crate::error::BuildError;
use crate::key::{ForwardedIp, GlobalKey, HeaderKey, KeyError, KeyExtractor, PeerIp, Raw};
use crate::policy::{Plan, Resolve};
use crate::rate_limit::{Mode, RateLimitBuilder, RateLimitLayer};
use crate::report::HeaderStyle;
use crate::route::RouteTable;

/// A layer's settings, as a configuration file declares them (see the [module docs](self)).
#[derive(Debug, Clone, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a layer's settings, with at least a [[policies]] entry"
)]
pub struct LayerConfig {
    /// The policies, checked all-or-nothing (at least one).
    pub policies: Vec<Policy>,
    /// Who a request is charged to (default: the peer IP).
    #[serde(default)]
    pub key: KeyConfig,
    /// Units per request (default 1), unless a route says otherwise.
    #[serde(default = "one")]
    pub cost: u64,
    /// Per-route costs and route-scoped policies.
    #[serde(default)]
    pub routes: Vec<RouteConfig>,
    /// Policies chosen by a request header's value.
    #[serde(default)]
    pub tiers: Option<TiersConfig>,
    /// Requests that are never limited.
    #[serde(default)]
    pub exempt: ExemptConfig,
    /// The rate-limit header style (default `x-ratelimit`).
    #[serde(default)]
    pub headers: HeadersConfig,
    /// What happens over the limit (default `reject`).
    #[serde(default)]
    pub mode: ModeConfig,
    /// With `mode = "delay"`: the longest a request waits, ms (default 500).
    #[serde(default)]
    pub max_wait_ms: Option<u64>,
}

const fn one() -> u64 {
    1
}

/// The `key` table: `kind` and what that kind needs.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a key such as { kind = \"peer_ip\" } or { kind = \"header\", header = \"x-api-key\" }"
)]
pub struct KeyConfig {
    /// Which extractor.
    #[serde(default)]
    pub kind: KeyKind,
    /// For `kind = "header"`: the header (an API key).
    #[serde(default)]
    pub header: Option<HeaderField>,
    /// For `kind = "forwarded"`: the networks of the trusted reverse proxies.
    #[serde(default, deserialize_with = "networks")]
    pub trusted: Vec<IpNet>,
    /// For `kind = "peer_ip"` or `"forwarded"`: at most one network-specific NAT64 prefix
    /// (see [`Nat64Prefix`](crate::key::Nat64Prefix)); also applied to the exempt networks.
    #[serde(default, deserialize_with = "networks")]
    pub nat64: Vec<IpNet>,
}

/// The key extractor a [`KeyConfig`] names.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum KeyKind {
    /// [`PeerIp`]: the TCP peer (default).
    #[default]
    PeerIp,
    /// [`GlobalKey`]: one budget for everyone.
    Global,
    /// [`HeaderKey`]: the value of `header`, raw.
    Header,
    /// [`ForwardedIp`]: the client IP reported by the `trusted` proxies.
    Forwarded,
}

/// One `[[routes]]` entry: a method and template, with a cost and/or route-scoped policies
/// (see [`RouteTable`]).
#[derive(Debug, Clone, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a route such as { method = \"GET\", path = \"/search\", cost = 5 }"
)]
pub struct RouteConfig {
    /// The method (`HEAD` is looked up as `GET`).
    pub method: MethodField,
    /// The route template, as the router writes it.
    pub path: RoutePath,
    /// Units one request to the route costs.
    #[serde(default)]
    pub cost: Option<u64>,
    /// Policies that apply only to this route (and the other routes naming them).
    #[serde(default)]
    pub policies: Vec<String>,
}

/// The `[tiers]` table: the policy a request is charged is picked by a header's value.
#[derive(Debug, Clone, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "tiers such as { header = \"x-api-key\", default = \"free\", values = { \"key-acme\" = \"paid\" } }"
)]
pub struct TiersConfig {
    /// The header whose value picks the tier.
    pub header: HeaderField,
    /// The policy of requests whose value is missing or not listed.
    pub default: String,
    /// Header value to policy name.
    #[serde(default)]
    pub values: BTreeMap<String, String>,
}

/// The `[exempt]` table.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "exemptions such as { networks = [\"192.0.2.0/24\"], preflight = false }"
)]
pub struct ExemptConfig {
    /// Clients in these networks are not limited, matched by the client's address (see
    /// [`exempt_networks`](crate::RateLimitBuilder::exempt_networks) and the
    /// [module docs](self#exempt-networks)).
    #[serde(default, deserialize_with = "networks")]
    pub networks: Vec<IpNet>,
    /// The networks of the reverse proxies whose forwarded client address (`X-Forwarded-For`)
    /// is matched against `networks`, for a key that is not `forwarded` (see
    /// [`exempt_client_ip`](crate::RateLimitBuilder::exempt_client_ip)). Only with
    /// `networks`; a `forwarded` key's `trusted` networks apply without it.
    #[serde(default, deserialize_with = "networks")]
    pub trusted: Vec<IpNet>,
    /// CORS preflights are not limited (see
    /// [`exempt_preflight`](crate::RateLimitBuilder::exempt_preflight)).
    #[serde(default)]
    pub preflight: bool,
}

/// The `headers` value: a [`HeaderStyle`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum HeadersConfig {
    /// [`HeaderStyle::XRateLimit`] (default).
    #[default]
    XRatelimit,
    /// [`HeaderStyle::Ietf`].
    Ietf,
    /// [`HeaderStyle::IetfLegacy`].
    IetfLegacy,
    /// [`HeaderStyle::Both`].
    Both,
    /// [`HeaderStyle::None`].
    None,
}

impl From<HeadersConfig> for HeaderStyle {
    fn from(h: HeadersConfig) -> Self {
        match h {
            HeadersConfig::XRatelimit => Self::XRateLimit,
            HeadersConfig::Ietf => Self::Ietf,
            HeadersConfig::IetfLegacy => Self::IetfLegacy,
            HeadersConfig::Both => Self::Both,
            HeadersConfig::None => Self::None,
        }
    }
}

/// The `mode` value: a [`Mode`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ModeConfig {
    /// [`Mode::Reject`] (default).
    #[default]
    Reject,
    /// [`Mode::Shadow`].
    Shadow,
    /// [`Mode::Delay`], waiting at most `max_wait_ms` (default 500 ms).
    Delay,
}

/// The key extractor of a configured layer.
#[derive(Debug, Clone)]
pub enum ConfigKey {
    /// [`PeerIp`].
    PeerIp(PeerIp),
    /// [`GlobalKey`].
    Global(GlobalKey),
    /// [`HeaderKey`] (raw value).
    Header(HeaderKey<Raw>),
    /// [`ForwardedIp`].
    Forwarded(ForwardedIp),
}

impl KeyExtractor for ConfigKey {
    #[inline]
    fn extract<B>(&self, req: &Request<B>) -> Result<Key, KeyError> {
        match self {
            Self::PeerIp(k) => k.extract(req),
            Self::Global(k) => k.extract(req),
            Self::Header(k) => k.extract(req),
            Self::Forwarded(k) => k.extract(req),
        }
    }

    fn keys_by_peer(&self) -> bool {
        matches!(self, Self::PeerIp(_))
    }

    fn trusted_proxies(&self) -> Option<&ForwardedIp> {
        match self {
            Self::Forwarded(k) => Some(k),
            Self::PeerIp(_) | Self::Global(_) | Self::Header(_) => None,
        }
    }

    fn describe(&self) -> String {
        match self {
            Self::PeerIp(k) => k.describe(),
            Self::Global(k) => k.describe(),
            Self::Header(k) => k.describe(),
            Self::Forwarded(k) => k.describe(),
        }
    }
}

/// The resolver of a configured layer: the route table, then the tiers.
#[derive(Debug, Clone)]
pub struct ConfigResolver {
    routes: RouteTable,
    tiers: Option<TiersConfig>,
}

impl ConfigResolver {
    /// Whether `policy` is one of the tiers' policies.
    fn tiered(&self, policy: &str) -> bool {
        self.tiers
            .as_ref()
            .is_some_and(|t| t.default == policy || t.values.values().any(|p| p == policy))
    }
}

impl Resolve for ConfigResolver {
    fn resolve<B>(&self, req: &Request<B>, plan: &mut Plan<'_>) {
        self.routes.resolve(req, plan);
        let Some(tiers) = &self.tiers else { return };
        let chosen = req
            .headers()
            .get(&tiers.header.0)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| tiers.values.get(v))
            .unwrap_or(&tiers.default);
        let names = plan.names();
        plan.retain(|index| {
            names
                .get(index as usize)
                .is_none_or(|name| !self.tiered(name) || **name == **chosen)
        });
    }

    fn check(&self, policies: &[Policy]) -> Result<(), BuildError> {
        self.routes.check(policies)?;
        if let Some(tiers) = &self.tiers {
            for name in std::iter::once(&tiers.default).chain(tiers.values.values()) {
                if !policies.iter().any(|p| p.name() == name) {
                    return Err(BuildError::UnknownPolicy(name.clone()));
                }
            }
        }
        Ok(())
    }
}

/// The layer a [`LayerConfig`] builds.
pub type ConfiguredLayer = RateLimitLayer<ConfigKey, u64, MemoryStore<Key>, ConfigResolver>;

/// The builder [`LayerConfig::builder`] returns.
pub type ConfiguredBuilder = RateLimitBuilder<ConfigKey, u64, MemoryStore<Key>, ConfigResolver>;

impl LayerConfig {
    /// Builds the layer (memory store), with the builder's checks.
    ///
    /// # Errors
    ///
    /// [`BuildError`] as [`RateLimitBuilder::build`](crate::RateLimitBuilder::build) gives
    /// it, and [`BuildError::Config`] naming the field for settings that do not fit together
    /// (a `header` key without `header`, `header` or `trusted` with another kind of key,
    /// `exempt.trusted` with a `forwarded` key or without `exempt.networks`, `max_wait_ms`
    /// without `mode = "delay"`).
    pub fn build(&self) -> Result<ConfiguredLayer, BuildError> {
        self.builder()?.build()
    }

    /// A builder holding these settings, for what a file does not say: another store (Redis,
    /// a memory store on a test clock), a fallback, a rejection body. Finish it with
    /// [`build`](RateLimitBuilder::build).
    ///
    /// # Errors
    ///
    /// [`BuildError::Config`] as for [`build`](Self::build); the other checks run in the
    /// builder's `build`.
    pub fn builder(&self) -> Result<ConfiguredBuilder, BuildError> {
        let config_err = |field: &str, message: &str| BuildError::Config {
            field: field.to_owned(),
            message: message.to_owned(),
        };
        // A setting of another kind of key is a mistake (say `trusted` without
        // kind = "forwarded"): ignoring it would key by something the file does not say.
        if self.key.header.is_some() && self.key.kind != KeyKind::Header {
            return Err(config_err(
                "key.header",
                "`header` only applies with kind = \"header\"",
            ));
        }
        if !self.key.trusted.is_empty() && self.key.kind != KeyKind::Forwarded {
            return Err(config_err(
                "key.trusted",
                "`trusted` only applies with kind = \"forwarded\"",
            ));
        }
        // A tier value no header value can equal would silently never apply.
        if let Some(tiers) = &self.tiers {
            for value in tiers.values.keys() {
                if http::HeaderValue::from_str(value).is_err() || value.trim() != value {
                    return Err(config_err(
                        &format!("tiers.values.{value}"),
                        &format!(
                            "tier value {value:?} can never match: a header value holds no line \
                             break or control character, and no leading or trailing space"
                        ),
                    ));
                }
            }
        }
        let nat64 = match self.key.nat64.as_slice() {
            [] => None,
            [IpNet::V6(net)] => Some(
                crate::key::Nat64Prefix::new(*net)
                    .map_err(|e| config_err("key.nat64", &e.to_string()))?,
            ),
            [IpNet::V4(net)] => {
                return Err(config_err(
                    "key.nat64",
                    &format!(
                        "{net} is not a NAT64 prefix: it is an IPv6 network, such as \"64:ff9b:1::/96\""
                    ),
                ));
            }
            _ => {
                return Err(config_err(
                    "key.nat64",
                    "give one NAT64 prefix (your translator's), not several",
                ));
            }
        };
        if nat64.is_some() && !matches!(self.key.kind, KeyKind::PeerIp | KeyKind::Forwarded) {
            return Err(config_err(
                "key.nat64",
                "`nat64` only applies with kind = \"peer_ip\" or \"forwarded\"",
            ));
        }
        let peer_ip = match nat64 {
            Some(p) => PeerIp::new().nat64(p),
            None => PeerIp::new(),
        };
        let key = match self.key.kind {
            KeyKind::PeerIp => ConfigKey::PeerIp(peer_ip),
            KeyKind::Global => ConfigKey::Global(GlobalKey),
            KeyKind::Header => {
                let header = self.key.header.as_ref().ok_or_else(|| {
                    config_err("key.header", "a `header` key needs the header's name")
                })?;
                ConfigKey::Header(HeaderKey::raw_name(header.0.clone()))
            }
            KeyKind::Forwarded => {
                if self.key.trusted.is_empty() {
                    return Err(config_err(
                        "key.trusted",
                        "a `forwarded` key needs the networks of the trusted proxies",
                    ));
                }
                let forwarded = ForwardedIp::trusting(self.key.trusted.iter().copied());
                ConfigKey::Forwarded(match nat64 {
                    Some(p) => forwarded.nat64(p),
                    None => forwarded,
                })
            }
        };
        let mode = match (self.mode, self.max_wait_ms) {
            (ModeConfig::Reject, None) => Mode::Reject,
            (ModeConfig::Shadow, None) => Mode::Shadow,
            (ModeConfig::Delay, wait) => Mode::Delay {
                max_wait: Duration::from_millis(wait.unwrap_or(500)),
            },
            (_, Some(_)) => {
                return Err(config_err(
                    "max_wait_ms",
                    "`max_wait_ms` only applies with mode = \"delay\"",
                ));
            }
        };
        let mut routes = RouteTable::new();
        for route in &self.routes {
            if let Some(cost) = route.cost {
                routes = routes.cost(route.method.0.clone(), &route.path.0, cost);
            }
            for policy in &route.policies {
                routes = routes.limit(route.method.0.clone(), &route.path.0, policy);
            }
        }
        let exempt_trust = if self.exempt.trusted.is_empty() {
            None
        } else if self.exempt.networks.is_empty() {
            return Err(config_err(
                "exempt.trusted",
                "`trusted` only applies with `networks` (the networks it exempts)",
            ));
        } else if self.key.kind == KeyKind::Forwarded {
            return Err(config_err(
                "exempt.trusted",
                "a `forwarded` key's `trusted` networks already say which proxies forward the \
                 client address the exempt networks are matched against: list the proxies there",
            ));
        } else {
            let rules = ForwardedIp::trusting(self.exempt.trusted.iter().copied());
            Some(match nat64 {
                Some(p) => rules.nat64(p),
                None => rules,
            })
        };
        let mut builder = RateLimitLayer::builder()
            .key(key)
            .cost(self.cost)
            .resolver(ConfigResolver {
                routes,
                tiers: self.tiers.clone(),
            })
            .headers(self.headers.into())
            .mode(mode)
            .exempt_networks(self.exempt.networks.iter().copied())
            .exempt_preflight(self.exempt.preflight);
        if let Some(p) = nat64 {
            builder = builder.nat64(p);
        }
        if let Some(rules) = exempt_trust {
            builder = builder.exempt_client_ip(rules);
        }
        for policy in &self.policies {
            builder = builder.policy(policy.clone());
        }
        Ok(builder)
    }
}

mod document;

pub use self::document::ConfigError;

#[cfg(all(test, feature = "toml"))]
mod tests;
