//! A [`LayerConfig`] into a layer or a builder, with the checks of settings that do not fit
//! together.

use std::time::Duration;

use ipnet::IpNet;
use ratekeeper_core::Key;
use ratekeeper_core::store::MemoryStore;

use super::key::ConfigKey;
use super::resolve::ConfigResolver;
use super::schema::{KeyKind, LayerConfig, ModeConfig};
use crate::error::BuildError;
use crate::key::{ForwardedIp, GlobalKey, HeaderKey, PeerIp};
use crate::rate_limit::Mode;
use crate::route::RouteTable;
use crate::{RateLimitBuilder, RateLimitLayer};

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
