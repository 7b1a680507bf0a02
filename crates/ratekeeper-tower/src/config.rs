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
//! # The key: "peer_ip" (default), "global", "header" (with `header`) or "forwarded" (with
//! # `trusted`, the proxies' networks).
//! key = { kind = "forwarded", trusted = ["10.0.0.0/8"] }
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
//! networks = ["192.0.2.0/24"]   # never limited (matched against the TCP peer)
//! preflight = false             # CORS preflights (client-controlled: see the builder)
//! ```
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
//! use ratekeeper_axum::config::LayerConfig;
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
use std::fmt;
use std::time::Duration;

use http::{HeaderName, Method, Request};
use ipnet::IpNet;
use ratekeeper_core::store::MemoryStore;
use ratekeeper_core::{Key, Policy};
use serde::{Deserialize, Deserializer};

use crate::error::BuildError;
use crate::key::{ForwardedIp, GlobalKey, HeaderKey, KeyError, KeyExtractor, PeerIp, Raw};
use crate::policy::{CheckPolicies, Plan, Resolve};
use crate::rate_limit::{Mode, RateLimitBuilder, RateLimitLayer};
use crate::report::HeaderStyle;
use crate::route::RouteTable;

/// A layer's settings, as a configuration file declares them (see the [module docs](self)).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
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
#[serde(deny_unknown_fields)]
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

/// A header name, checked when it is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderField(pub HeaderName);

impl<'de> Deserialize<'de> for HeaderField {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        HeaderName::from_bytes(s.as_bytes())
            .map(HeaderField)
            .map_err(|_| serde::de::Error::custom(format!("\"{s}\" is not a valid header name")))
    }
}

/// A list of networks, each named in its error: `"192.0.2.1"` (no prefix length) or
/// `"10.0.0.0/33"` say what they are and what is expected.
fn networks<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<IpNet>, D::Error> {
    struct Net(IpNet);
    struct NetVisitor;
    impl serde::de::Visitor<'_> for NetVisitor {
        type Value = Net;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a network such as \"192.0.2.0/24\"")
        }
        // Parsed inside the format's deserializer, so the error carries the element's place.
        fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Net, E> {
            s.parse().map(Net).map_err(|_| {
                E::custom(format!(
                    "invalid network {s:?}: expected an address and a prefix length, such as \
                     \"192.0.2.0/24\", \"2001:db8::/32\" or \"192.0.2.7/32\" for one address"
                ))
            })
        }
    }
    impl<'de> Deserialize<'de> for Net {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            deserializer.deserialize_str(NetVisitor)
        }
    }
    Ok(Vec::<Net>::deserialize(deserializer)?
        .into_iter()
        .map(|n| n.0)
        .collect())
}

/// A route template, checked when it is read (see
/// [`route::check_template`](crate::route::check_template)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutePath(pub String);

impl<'de> Deserialize<'de> for RoutePath {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        crate::route::check_template(&s).map_err(serde::de::Error::custom)?;
        Ok(RoutePath(s))
    }
}

/// An HTTP method, checked when it is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MethodField(pub Method);

impl<'de> Deserialize<'de> for MethodField {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        Method::from_bytes(s.to_ascii_uppercase().as_bytes())
            .map(MethodField)
            .map_err(|_| serde::de::Error::custom(format!("\"{s}\" is not an HTTP method")))
    }
}

/// One `[[routes]]` entry: a method and template, with a cost and/or route-scoped policies
/// (see [`RouteTable`]).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
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
#[serde(deny_unknown_fields)]
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
#[serde(deny_unknown_fields)]
pub struct ExemptConfig {
    /// Peers in these networks are not limited (see
    /// [`exempt_networks`](crate::RateLimitBuilder::exempt_networks)).
    #[serde(default, deserialize_with = "networks")]
    pub networks: Vec<IpNet>,
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
    /// [`Mode::Delay`], waiting at most `max_wait_ms`.
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

impl CheckPolicies for ConfigResolver {
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
    /// `max_wait_ms` without `mode = "delay"`).
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
        let key = match self.key.kind {
            KeyKind::PeerIp => ConfigKey::PeerIp(PeerIp::new()),
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
                ConfigKey::Forwarded(ForwardedIp::trusting(self.key.trusted.iter().copied()))
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
        for policy in &self.policies {
            builder = builder.policy(policy.clone());
        }
        Ok(builder)
    }
}

#[cfg(feature = "toml")]
impl LayerConfig {
    /// Reads a TOML document; `file` names it in errors (a path, or any label).
    ///
    /// # Errors
    ///
    /// [`ConfigError`] with the file, the line and column (1-based) and the field path
    /// (`policies[1].quota`) of the first mistake: TOML syntax, an unknown field, a value of
    /// the wrong type, a quota, algorithm, route template, method, header name or network
    /// that does not parse, or settings that do not fit together (a route or tier naming no
    /// policy, a policy name that is invalid or used twice, a cost of 0 or above a burst, a
    /// method and path listed twice, a `header` key without its header): the checks of
    /// [`build`](Self::build), located in the document.
    pub fn from_toml(file: &str, text: &str) -> Result<Self, ConfigError> {
        let de =
            toml::Deserializer::parse(text).map_err(|e| ConfigError::toml(file, text, "", &e))?;
        let config: Self = serde_path_to_error::deserialize(de).map_err(|e| {
            let field = e.path().to_string();
            ConfigError::toml(file, text, &field, e.inner())
        })?;
        match config.mismatch() {
            None => Ok(config),
            Some((path, message)) => Err(ConfigError::located(file, text, &path, message)),
        }
    }

    /// The first setting that does not fit the others (an unknown policy in a route, a cost
    /// above a burst, a duplicate name), with the path of the field that holds it: the
    /// checks [`build`](Self::build) makes too, found here so that the error names the line.
    fn mismatch(&self) -> Option<(Vec<Step>, String)> {
        use Step::{Field, Index};
        let policies = &self.policies;
        if policies.is_empty() {
            return Some((
                vec![Field("policies".into())],
                BuildError::NoPolicy.to_string(),
            ));
        }
        let policy_err = |i: usize, field: &str, err: BuildError| {
            let path = vec![Field("policies".into()), Index(i), Field(field.into())];
            Some((path, err.to_string()))
        };
        for (i, p) in policies.iter().enumerate() {
            if let Err(e) = p.validate() {
                return Some((
                    vec![Field("policies".into()), Index(i), Field("name".into())],
                    e.to_string(),
                ));
            }
            if policies[..i].iter().any(|q| q.name() == p.name()) {
                return policy_err(i, "name", BuildError::DuplicatePolicy(p.name().to_owned()));
            }
            if p.algorithm() == ratekeeper_core::Algorithm::Concurrency {
                let err = BuildError::ConcurrencyPolicy(p.name().to_owned());
                return policy_err(i, "algorithm", err);
            }
        }
        if let Err(BuildError::Config { field, message }) = self.builder() {
            return Some((field.split('.').map(|f| Field(f.into())).collect(), message));
        }
        let exceeds = |cost: u64, p: &Policy| BuildError::CostExceedsBurst {
            policy: p.name().to_owned(),
            cost,
            burst: p.capacity(),
        };
        if self.cost == 0 {
            return Some((vec![Field("cost".into())], BuildError::ZeroCost.to_string()));
        }
        if let Some(p) = policies
            .iter()
            .find(|p| self.cost > u64::from(p.capacity()))
        {
            return Some((
                vec![Field("cost".into())],
                exceeds(self.cost, p).to_string(),
            ));
        }
        let unknown = |name: &str| !policies.iter().any(|p| p.name() == name);
        let scoped = |name: &str| {
            self.routes
                .iter()
                .any(|r| r.policies.iter().any(|n| n == name))
        };
        for (i, route) in self.routes.iter().enumerate() {
            let at = |field: Option<&str>| {
                let mut path = vec![Field("routes".into()), Index(i)];
                path.extend(field.map(|f| Field(f.into())));
                path
            };
            if let Some(k) = self.routes[..i]
                .iter()
                .position(|r| r.method == route.method && r.path == route.path)
            {
                let message = format!(
                    "{} {} is also routes[{k}]: give each method and path one entry",
                    route.method.0, route.path.0
                );
                return Some((at(None), message));
            }
            for (j, name) in route.policies.iter().enumerate() {
                if unknown(name) {
                    let mut path = at(Some("policies"));
                    path.push(Index(j));
                    return Some((path, BuildError::UnknownPolicy(name.clone()).to_string()));
                }
            }
            let Some(cost) = route.cost else { continue };
            if cost == 0 {
                return Some((at(Some("cost")), BuildError::ZeroCost.to_string()));
            }
            let applies = policies
                .iter()
                .filter(|p| !scoped(p.name()) || route.policies.iter().any(|n| n == p.name()));
            for p in applies {
                if cost > u64::from(p.capacity()) {
                    return Some((at(Some("cost")), exceeds(cost, p).to_string()));
                }
            }
        }
        if let Some(tiers) = &self.tiers {
            if unknown(&tiers.default) {
                let path = vec![Field("tiers".into()), Field("default".into())];
                return Some((
                    path,
                    BuildError::UnknownPolicy(tiers.default.clone()).to_string(),
                ));
            }
            for (value, name) in &tiers.values {
                if unknown(name) {
                    let path = vec![
                        Field("tiers".into()),
                        Field("values".into()),
                        Field(value.clone()),
                    ];
                    return Some((path, BuildError::UnknownPolicy(name.clone()).to_string()));
                }
            }
        }
        None
    }

    /// Reads the TOML file at `path` (see [`from_toml`](Self::from_toml)).
    ///
    /// # Errors
    ///
    /// [`ConfigError`]: the file cannot be read, or [`from_toml`](Self::from_toml)'s errors.
    pub fn from_toml_file(path: impl AsRef<std::path::Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: file.clone(),
            line: None,
            column: None,
            field: String::new(),
            message: format!("cannot read the file: {e}"),
        })?;
        Self::from_toml(&file, &text)
    }
}

/// One step of a field's path in a document: a table's field or an array's index.
#[cfg(feature = "toml")]
#[derive(Debug)]
enum Step {
    Field(String),
    Index(usize),
}

/// A configuration document that could not be read: where, which field, and why.
///
/// `Display`: `file:line:column: field: message` (the parts that are known).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    file: String,
    line: Option<usize>,
    column: Option<usize>,
    field: String,
    message: String,
}

impl ConfigError {
    /// The file, as named to the reader.
    pub fn file(&self) -> &str {
        &self.file
    }

    /// The line of the mistake (1-based), when known.
    pub fn line(&self) -> Option<usize> {
        self.line
    }

    /// The column of the mistake (1-based, in characters), when known.
    pub fn column(&self) -> Option<usize> {
        self.column
    }

    /// The field's path (`routes[2].path`; empty for a syntax error outside any field).
    pub fn field(&self) -> &str {
        &self.field
    }

    /// What is wrong.
    pub fn message(&self) -> &str {
        &self.message
    }

    #[cfg(feature = "toml")]
    fn toml(file: &str, text: &str, field: &str, err: &toml::de::Error) -> Self {
        let (line, column) = match err.span() {
            Some(span) => {
                let (line, column) = line_column(text, span.start);
                (Some(line), Some(column))
            }
            None => (None, None),
        };
        Self {
            file: file.to_owned(),
            line,
            column,
            field: field.trim_start_matches('.').to_owned(),
            message: err.message().trim_end().to_owned(),
        }
    }
}

#[cfg(feature = "toml")]
impl ConfigError {
    /// An error at the field `path` of the (well-formed) document `text`: its line and
    /// column are those of the field's value, or of the deepest table on the path that the
    /// document writes (a field left out is reported at its table).
    fn located(file: &str, text: &str, path: &[Step], message: String) -> Self {
        use toml::de::{DeTable, DeValue};
        let mut field = String::new();
        for step in path {
            match step {
                Step::Field(name) if field.is_empty() => field.push_str(name),
                Step::Field(name) => {
                    field.push('.');
                    field.push_str(name);
                }
                Step::Index(i) => field.push_str(&format!("[{i}]")),
            }
        }
        let mut span = None;
        if let Ok(doc) = DeTable::parse(text) {
            let mut table: Option<&DeTable<'_>> = Some(doc.get_ref());
            let mut array: Option<&[toml::Spanned<DeValue<'_>>]> = None;
            for step in path {
                let value = match (step, table, array) {
                    (Step::Field(name), Some(t), _) => t
                        .iter()
                        .find(|(k, _)| k.get_ref().as_ref() == name.as_str())
                        .map(|(_, v)| v),
                    (Step::Index(i), _, Some(a)) => a.get(*i),
                    _ => None,
                };
                let Some(value) = value else { break };
                let range = value.span();
                if range.start < range.end {
                    span = Some(range.start);
                }
                (table, array) = match value.get_ref() {
                    DeValue::Table(t) => (Some(t), None),
                    DeValue::Array(a) => (None, Some(&a[..])),
                    _ => (None, None),
                };
            }
        }
        let (line, column) = line_column(text, span.unwrap_or(0));
        Self {
            file: file.to_owned(),
            line: Some(line),
            column: Some(column),
            field,
            message,
        }
    }
}

/// The line and column (1-based, in characters) of the byte offset `start` of `text`.
#[cfg(feature = "toml")]
fn line_column(text: &str, start: usize) -> (usize, usize) {
    let before = text.get(..start).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.file)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
            if let Some(column) = self.column {
                write!(f, ":{column}")?;
            }
        }
        if !self.field.is_empty() && self.field != "." {
            write!(f, ": {}", self.field)?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for ConfigError {}

#[cfg(all(test, feature = "toml"))]
#[path = "config_tests.rs"]
mod tests;
