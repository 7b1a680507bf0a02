//! The settings of a layer as `serde` types: [`LayerConfig`] and its sections.

use std::collections::BTreeMap;

use ipnet::IpNet;
use ratekeeper_core::Policy;
use serde::Deserialize;

use super::fields::networks;
use super::fields::{HeaderField, MethodField, RoutePath};
use crate::report::HeaderStyle;

/// A layer's settings, as a configuration file declares them (see the [module docs](crate::config)).
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
    /// [`PeerIp`](crate::key::PeerIp): the TCP peer (default).
    #[default]
    PeerIp,
    /// [`GlobalKey`](crate::key::GlobalKey): one budget for everyone.
    Global,
    /// [`HeaderKey`](crate::key::HeaderKey): the value of `header`, raw.
    Header,
    /// [`ForwardedIp`](crate::key::ForwardedIp): the client IP reported by the `trusted` proxies.
    Forwarded,
}

/// One `[[routes]]` entry: a method and template, with a cost and/or route-scoped policies
/// (see [`RouteTable`](crate::route::RouteTable)).
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
    /// [module docs](crate::config#exempt-networks)).
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

/// The `mode` value: a [`Mode`](crate::rate_limit::Mode).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ModeConfig {
    /// [`Mode::Reject`](crate::rate_limit::Mode::Reject) (default).
    #[default]
    Reject,
    /// [`Mode::Shadow`](crate::rate_limit::Mode::Shadow).
    Shadow,
    /// [`Mode::Delay`](crate::rate_limit::Mode::Delay), waiting at most `max_wait_ms` (default 500 ms).
    Delay,
}
