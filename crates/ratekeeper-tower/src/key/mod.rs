//! Key extractors: who a request is charged to.
//!
//! A [`KeyExtractor`] turns a request into a [`Key`], or says why it cannot
//! ([`KeyError`]). Closures `Fn(&RequestParts<'_>) -> Result<Key, KeyError>` are extractors
//! too ([`RequestParts`]: the request's head, borrowed, whatever the body type).
//!
//! - [`PeerIp`] (the default): the TCP peer address, IPv4 written as IPv6 (IPv4-mapped,
//!   NAT64) normalised to IPv4, IPv6 grouped by prefix (default /64) so one host cannot
//!   rotate through its 2^64 addresses. Reads axum's `ConnectInfo<SocketAddr>` (feature
//!   `axum`), a [`SocketAddr`] extension, or a [`PeerAddr`] extension.
//! - [`ForwardedIp`]: the client IP reported by trusted reverse proxies (CIDR list or hop
//!   count), read only when the peer is trusted; the peer otherwise. `Forwarded` is read by
//!   RFC 7239's grammar.
//! - [`HeaderKey`]: an API key or bearer token header (any length, names in any case), best
//!   validated into the principal it authenticates.
//!
//! Every address is compared and keyed in one normal form, [`normalize_ip`]: the peer, the
//! forwarded entries, the trusted networks and the layer's exempt networks, so an IPv4
//! client is one key whether it arrives as `192.0.2.77`, `::ffff:192.0.2.77` or
//! `64:ff9b::192.0.2.77`.
//! - [`UserKey`]: the authenticated user an auth layer put in the request extensions.
//! - [`MatchedRoute`](crate::route::MatchedRoute): the route template (axum `MatchedPath`).
//! - [`GlobalKey`]: one budget for everyone.
//! - [`Or`] (`a.or(b)`): `b` when `a` reports [`KeyError::Missing`]; tuples `(a, b)` and
//!   `(a, b, c)`: several keys at once, such as (route, client).
//!
//! Every extractor returns a [`KeyError::Missing`] rather than an empty or made-up key, so
//! a chain such as `UserKey.or(HeaderKey).or(PeerIp)` never merges unrelated clients into one
//! bucket.
//!
//! # Example
//!
//! ```
//! use std::net::SocketAddr;
//! use axum::http::Request;
//! use ratekeeper_tower::key::{KeyExtractor, PeerAddr, PeerIp};
//! use ratekeeper_core::Key;
//!
//! let mut req = Request::new(());
//! req.extensions_mut().insert(PeerAddr("[2001:db8:aa:1::9]:4711".parse::<SocketAddr>().unwrap()));
//! let key = PeerIp::new().extract(&req).unwrap();
//! assert_eq!(key.to_string(), "net:2001:db8:aa:1::/64");
//!
//! let mut req = Request::new(());
//! req.extensions_mut().insert(PeerAddr("[::ffff:192.0.2.1]:80".parse().unwrap()));
//! assert_eq!(PeerIp::new().extract(&req).unwrap().to_string(), "ip:192.0.2.1");
//! ```
//!
//! A closure as the layer's key function (it takes the request's head, [`RequestParts`]):
//!
//! ```
//! use std::num::NonZeroU32;
//! use ratekeeper_core::{Key, Policy, Quota};
//! use ratekeeper_tower::key::KeyError;
//! use ratekeeper_tower::{RateLimitLayer, RequestParts};
//!
//! let layer = RateLimitLayer::builder()
//!     .policy(Policy::new("tenant", Quota::per_minute(NonZeroU32::new(600).unwrap())))
//!     .key(|req: &RequestParts<'_>| {
//!         req.headers()
//!             .get("x-tenant")
//!             .and_then(|v| v.to_str().ok())
//!             .map(Key::from)
//!             .ok_or(KeyError::Missing("x-tenant header"))
//!     })
//!     .build()
//!     .unwrap();
//! # let _ = layer;
//! ```
//!
//! The parameter type is written out: Rust infers a closure's parameter types only from an
//! `Fn` bound, and `.key` also takes extractor types, which are not closures.

mod addr;
mod combine;
mod credential;
mod forwarded;
mod header;
mod user;

pub(crate) use addr::normalize_nets;
pub use addr::{Nat64Prefix, Nat64PrefixError, normalize_ip};
pub use combine::Or;
pub use credential::{CREDENTIAL_SECRET_ENV, CredentialSecret};
pub(crate) use forwarded::Client;
pub use forwarded::{ForwardedIp, MAX_HOPS, Source, Trust};
pub use header::{HeaderKey, MAX_RAW_LEN, Raw};
pub use user::UserKey;

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use http::{Request, StatusCode};
use ratekeeper_core::Key;

use crate::RequestParts;

/// Why no key could be extracted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The request does not carry what the extractor reads (a header, a user). A fallback
    /// extractor may supply a key instead; without one the request gets a problem+json
    /// `400 Bad Request` in public words (see [`Unkeyed`](crate::report::Unkeyed), which
    /// [`Rejection::unkeyed`](crate::report::Rejection::unkeyed) replaces). The text is for
    /// logs, never sent to the client.
    #[error("rate-limit key missing: {0}")]
    Missing(&'static str),
    /// The server is not set up to provide the key (for example no peer address because the
    /// app was not served with connect info). Answered with `500` and an error log line.
    #[error("rate-limit key unavailable: {0}")]
    Misconfigured(&'static str),
}

impl KeyError {
    /// Whether a fallback extractor should be tried.
    pub fn is_missing(&self) -> bool {
        matches!(self, Self::Missing(_))
    }

    /// The status the request is answered with when no extractor supplies a key.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::Missing(_) => StatusCode::BAD_REQUEST,
            Self::Misconfigured(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// Extracts the rate-limit key from a request.
///
/// The trait has no body type parameter: [`KeyExtractor::extract`] is generic over the body,
/// so one extractor serves every service it is layered on. Closures
/// `Fn(&RequestParts<'_>) -> Result<Key, KeyError>` are extractors too ([`RequestParts`] is
/// the request's head, borrowed, without the body type a closure could not be generic over).
///
/// ```
/// use axum::http::Request;
/// use ratekeeper_core::Key;
/// use ratekeeper_tower::key::{KeyError, KeyExtractor};
/// use ratekeeper_tower::RequestParts;
///
/// let tenant = |req: &RequestParts<'_>| {
///     req.headers()
///         .get("x-tenant")
///         .and_then(|v| v.to_str().ok())
///         .map(Key::from)
///         .ok_or(KeyError::Missing("x-tenant"))
/// };
/// let req = Request::get("/").header("x-tenant", "acme").body(()).unwrap();
/// assert_eq!(tenant.extract(&req).unwrap().to_string(), "acme");
/// assert!(tenant.extract(&Request::new(())).unwrap_err().is_missing());
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a rate-limit key extractor",
    label = "not a `KeyExtractor`",
    note = "use a ready extractor (`PeerIp`, `ForwardedIp`, `HeaderKey`, `UserKey`, `GlobalKey`, `MatchedRoute`), or a closure taking `&RequestParts<'_>` and returning `Result<Key, KeyError>`",
    note = "a closure's parameter type must be written out: `|req: &RequestParts<'_>| ...`"
)]
pub trait KeyExtractor: Send + Sync + 'static {
    /// The key, or why there is none.
    ///
    /// # Errors
    ///
    /// [`KeyError::Missing`] when the request lacks the input, [`KeyError::Misconfigured`]
    /// when the server cannot provide it.
    fn extract<B>(&self, req: &Request<B>) -> Result<Key, KeyError>;

    /// Whether this extractor keys some requests by the TCP peer address ([`PeerIp`], and
    /// combinations holding it). The layer then warns once when such a request comes from a
    /// private or loopback peer with `X-Forwarded-For` or `Forwarded` (a reverse proxy whose
    /// clients would all share one budget). Default `false`.
    fn keys_by_peer(&self) -> bool {
        false
    }

    /// The trusted-proxy rules by which this extractor reads the client's address, if it
    /// reads one from a forwarded header ([`ForwardedIp`], and combinations holding one:
    /// the first part that has rules). Default `None`.
    ///
    /// The layer matches its exempt networks
    /// ([`exempt_networks`](crate::RateLimitBuilder::exempt_networks)) against the client
    /// address these rules resolve, so a client behind a trusted proxy is exempt by its own
    /// address, never by the proxy's. A wrapper around another extractor should return the
    /// inner one's rules.
    fn trusted_proxies(&self) -> Option<&ForwardedIp> {
        None
    }

    /// How the startup log names this extractor (default: its type without module paths,
    /// `Or<HeaderKey<Raw>, PeerIp>`).
    fn describe(&self) -> String {
        crate::type_name::short_type_name::<Self>()
    }

    /// Checks the extractor's own settings when a layer is built (for example
    /// [`HeaderKey`]'s header name). Default `Ok(())`; combinations check every part.
    ///
    /// # Errors
    ///
    /// The [`BuildError`](crate::BuildError) that makes the layer's `build` fail.
    fn check(&self) -> Result<(), crate::BuildError> {
        Ok(())
    }
}

impl<F> KeyExtractor for F
where
    F: Fn(&RequestParts<'_>) -> Result<Key, KeyError> + Send + Sync + 'static,
{
    #[inline]
    fn extract<B>(&self, req: &Request<B>) -> Result<Key, KeyError> {
        self(&RequestParts::new(req))
    }
}

/// The peer address of a connection, for servers that are not axum: insert it into request
/// extensions (hyper-util, a custom accept loop). A bare [`SocketAddr`] extension works too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PeerAddr(pub SocketAddr);

/// Keys by the TCP peer address (the safe default): IPv4 as the full address, IPv6 grouped
/// by a prefix (default /64). An IPv4 address written as IPv6 is keyed as the IPv4 address
/// ([`normalize_ip`]): IPv4-mapped (`::ffff:a.b.c.d`, recognised by address range, not
/// notation), the well-known NAT64 prefix `64:ff9b::/96`, and a NAT64 prefix set with
/// [`PeerIp::nat64`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerIp {
    v6_prefix: u8,
    nat64: Option<Nat64Prefix>,
}

impl Default for PeerIp {
    fn default() -> Self {
        Self::new()
    }
}

impl PeerIp {
    /// Peer IP with IPv6 grouped by /64.
    pub const fn new() -> Self {
        Self {
            v6_prefix: 64,
            nat64: None,
        }
    }

    /// Groups IPv6 peers by a `/prefix` (clamped to 1..=128; 128 keys every address).
    pub const fn ipv6_prefix(prefix: u8) -> Self {
        let p = if prefix == 0 {
            1
        } else if prefix > 128 {
            128
        } else {
            prefix
        };
        Self {
            v6_prefix: p,
            nat64: None,
        }
    }

    /// Also reads addresses inside `prefix`, your NAT64 translator's network-specific prefix,
    /// as the IPv4 address they embed (the well-known `64:ff9b::/96` always is).
    ///
    /// ```
    /// use axum::http::Request;
    /// use ratekeeper_tower::key::{KeyExtractor, Nat64Prefix, PeerAddr, PeerIp};
    ///
    /// let nsp = Nat64Prefix::new("2001:db8:64::/96".parse().unwrap()).unwrap();
    /// let mut req = Request::new(());
    /// req.extensions_mut().insert(PeerAddr("[2001:db8:64::c000:24d]:1".parse().unwrap()));
    /// assert_eq!(PeerIp::new().nat64(nsp).extract(&req).unwrap().to_string(), "ip:192.0.2.77");
    /// ```
    #[must_use]
    pub const fn nat64(mut self, prefix: Nat64Prefix) -> Self {
        self.nat64 = Some(prefix);
        self
    }

    /// The NAT64 prefixes read as IPv4 besides the well-known one.
    pub(crate) fn nat64_prefixes(&self) -> &[Nat64Prefix] {
        self.nat64.as_slice()
    }

    /// `ip` in the normal form of [`normalize_ip`], with this extractor's NAT64 prefix.
    pub fn normalize(&self, ip: IpAddr) -> IpAddr {
        normalize_ip(ip, self.nat64_prefixes())
    }

    /// The peer address of a request, if the server provided one.
    pub fn peer_addr<B>(req: &Request<B>) -> Option<SocketAddr> {
        let ext = req.extensions();
        #[cfg(feature = "axum")]
        if let Some(axum::extract::ConnectInfo(addr)) =
            ext.get::<axum::extract::ConnectInfo<SocketAddr>>()
        {
            return Some(*addr);
        }
        ext.get::<PeerAddr>()
            .map(|p| p.0)
            .or_else(|| ext.get::<SocketAddr>().copied())
    }

    /// The key for an address under this extractor's IPv6 prefix, after
    /// [`normalize`](Self::normalize).
    pub fn key_for(&self, ip: IpAddr) -> Key {
        ip_key(self.normalize(ip), self.v6_prefix)
    }
}

/// Keys an address: IPv4 (and IPv4 written as IPv6: mapped, or in the well-known NAT64
/// prefix, see [`normalize_ip`]) as the full IPv4 address; other IPv6 masked to `v6_prefix`
/// bits (`Key::Net`), or `Key::Ip` when the prefix is 128.
pub fn ip_key(ip: IpAddr, v6_prefix: u8) -> Key {
    match normalize_ip(ip, &[]) {
        IpAddr::V4(v4) => Key::Ip(IpAddr::V4(v4)),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => Key::Ip(IpAddr::V4(v4)),
            None if v6_prefix >= 128 => Key::Ip(IpAddr::V6(v6)),
            None => {
                let bits = u128::from(v6);
                let mask = if v6_prefix == 0 {
                    0
                } else {
                    u128::MAX << (128 - u32::from(v6_prefix))
                };
                Key::Net(IpAddr::V6(Ipv6Addr::from(bits & mask)), v6_prefix)
            }
        },
    }
}

impl KeyExtractor for PeerIp {
    #[inline]
    fn extract<B>(&self, req: &Request<B>) -> Result<Key, KeyError> {
        Self::peer_addr(req)
            .map(|addr| self.key_for(addr.ip()))
            .ok_or(KeyError::Misconfigured(
                "no peer address in request extensions; serve the app with \
                 `into_make_service_with_connect_info::<SocketAddr>()` or insert `PeerAddr`",
            ))
    }

    fn keys_by_peer(&self) -> bool {
        true
    }
}

/// One key for every request: a global budget.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GlobalKey;

impl KeyExtractor for GlobalKey {
    fn extract<B>(&self, _req: &Request<B>) -> Result<Key, KeyError> {
        Ok(Key::Global)
    }
}

/// Adds `.or(next)` to extractor types (closures use [`Or::new`]).
macro_rules! impl_or {
    ($($ty:ident $(<$($p:ident),*>)?),* $(,)?) => {$(
        impl $(<$($p),*>)? $ty $(<$($p),*>)? {
            /// Falls back to `next` when this extractor reports [`KeyError::Missing`].
            pub fn or<N>(self, next: N) -> Or<Self, N> {
                Or::new(self, next)
            }
        }
    )*};
}

impl_or!(
    PeerIp,
    GlobalKey,
    ForwardedIp,
    HeaderKey<V>,
    UserKey<T, F>,
);

#[cfg(test)]
mod tests {
    use super::*;

    fn key(addr: &str) -> String {
        let mut req = Request::new(());
        req.extensions_mut()
            .insert(addr.parse::<SocketAddr>().unwrap());
        PeerIp::new().extract(&req).unwrap().to_string()
    }

    /// The addresses of <https://github.com/express-rate-limit/express-rate-limit/issues/502>
    /// (IPv6 clients rotating inside their /64) and IPv4-mapped addresses.
    #[test]
    fn ipv6_is_grouped_by_64_and_mapped_v4_is_v4() {
        assert_eq!(key("[2001:db8:aa:1::1]:1"), "net:2001:db8:aa:1::/64");
        assert_eq!(
            key("[2001:db8:aa:1:ffff:ffff:ffff:ffff]:1"),
            "net:2001:db8:aa:1::/64"
        );
        assert_eq!(
            key("[2001:0db8:00aa:0001:0000:0000:0000:0003]:1"),
            "net:2001:db8:aa:1::/64"
        );
        assert_eq!(key("[2001:db8:aa:2::1]:1"), "net:2001:db8:aa:2::/64");
        assert_eq!(key("[::ffff:192.0.2.1]:1"), "ip:192.0.2.1");
        assert_eq!(key("192.0.2.1:1"), "ip:192.0.2.1");
        assert_eq!(key("[::ffff:c000:202]:1"), "ip:192.0.2.2");
        assert_eq!(
            key("[2001:db8:1234:5678::1.2.3.4]:1"),
            "net:2001:db8:1234:5678::/64"
        );
    }

    #[test]
    fn missing_peer_is_a_misconfiguration() {
        let req = Request::new(());
        let err = PeerIp::new().extract(&req).unwrap_err();
        assert_eq!(err.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(!err.is_missing());
    }

    #[test]
    fn prefix_is_clamped() {
        let mut req = Request::new(());
        req.extensions_mut()
            .insert(PeerAddr("[2001:db8::1]:1".parse().unwrap()));
        assert_eq!(
            PeerIp::ipv6_prefix(200).extract(&req).unwrap().to_string(),
            "ip:2001:db8::1"
        );
        assert_eq!(
            PeerIp::ipv6_prefix(0).extract(&req).unwrap().to_string(),
            "net:::/1"
        );
    }
}
