//! A layer from a configuration file (feature `serde`; `toml` to read TOML).
//!
//! [`LayerConfig`] holds what a [`RateLimitBuilder`](crate::RateLimitBuilder) is told in code:
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
//! are read as [`ForwardedIp::trusting`](crate::key::ForwardedIp::trusting) reads them (the rightmost untrusted entry is the
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

mod build;
mod document;
mod fields;
mod key;
mod resolve;
mod schema;
#[cfg(all(test, feature = "toml"))]
mod tests;

pub use self::build::{ConfiguredBuilder, ConfiguredLayer};
pub use self::document::ConfigError;
pub use self::fields::{HeaderField, MethodField, RoutePath};
pub use self::key::ConfigKey;
pub use self::resolve::ConfigResolver;
pub use self::schema::{
    ExemptConfig, HeadersConfig, KeyConfig, KeyKind, LayerConfig, ModeConfig, RouteConfig,
    TiersConfig,
};
