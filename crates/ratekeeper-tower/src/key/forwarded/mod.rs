//! [`ForwardedIp`]: the client IP behind trusted reverse proxies.
//!
//! This module holds the trust rules: which peer may forward, and which entry of the chain
//! is the client. Reading the chain (`X-Forwarded-For`, RFC 7239 `Forwarded`) into
//! addresses, from the right, is [`parse`]'s.

mod parse;
#[cfg(test)]
mod tests;

use std::net::IpAddr;
use std::num::NonZeroU8;

use http::{HeaderMap, Request};
use ipnet::IpNet;
use ratekeeper_core::Key;

use self::parse::Entries;
use super::{KeyError, KeyExtractor, Nat64Prefix, PeerIp, normalize_ip, normalize_nets};

/// At most this many forwarded entries, counted from the right, are examined per request (a
/// 64 KiB header costs one bounded scan).
///
/// A longer chain is still keyed on its rightmost untrusted entry when that entry is among
/// the last `MAX_HOPS`: the entries further left were written by the client (or by proxies
/// you do not trust) and never change the key, so padding the header cannot move it. Only
/// when the last `MAX_HOPS` entries are all trusted proxies (or [`Trust::Hops`]`(n)` asks for
/// an entry beyond them) does the extractor key on the TCP peer instead.
///
/// ```
/// use ratekeeper_tower::key::MAX_HOPS;
///
/// assert_eq!(MAX_HOPS, 32);
/// ```
pub const MAX_HOPS: usize = 32;

/// Which proxies are trusted to append the client address.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Trust {
    /// Peers and forwarded entries inside these networks are proxies.
    Cidrs(Vec<IpNet>),
    /// Exactly this many proxies sit in front of the app and the peer is always the nearest;
    /// the client is the `n`-th forwarded entry from the right.
    Hops(NonZeroU8),
}

/// Which header carries the forwarded chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Source {
    /// `X-Forwarded-For: client, proxy1, proxy2` (the default).
    #[default]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=client, for="[2001:db8::1]:4711"`.
    Forwarded,
}

/// Keys by the client IP that trusted reverse proxies report, and by the TCP peer otherwise.
///
/// Rules:
///
/// - The forwarded header is read **only** when the TCP peer is trusted ([`Trust::Cidrs`]
///   contains it, or [`Trust::Hops`] is used). Otherwise the peer is the key, whatever the
///   headers say; `X-Real-IP` is never read.
/// - The chain is walked from the **right** (the entry the nearest proxy appended), skipping
///   trusted proxies; the first untrusted entry is the client. With [`Trust::Hops`]`(n)` the
///   `n`-th entry from the right is the client. If every entry is trusted, the leftmost is
///   the client (an internal caller).
/// - Ports are stripped (`198.51.100.7:51234`, `[2001:db8::1]:80`, RFC 7239 quoted forms).
/// - Only the last [`MAX_HOPS`] entries are read: a longer chain keys on its rightmost
///   untrusted entry among them, and falls back to the peer only when all of them are trusted.
/// - An entry that does not parse (garbage, non-UTF-8 bytes, RFC 7239 `unknown` or obfuscated
///   `_hidden` identifiers) or a missing header makes the
///   extractor **fall back to the peer**: it never skips leftward past an unparsable entry
///   (that entry is where a client could inject a victim's address) and never keys on the
///   raw text.
/// - `Forwarded` is read by RFC 7239's grammar (§4, with RFC 9110's quoted-string): a `,`
///   or `;` inside a quoted value such as `host="a,for=198.51.100.9"` is text, never a
///   separator, so a client-written value copied into a parameter by a proxy can never
///   become an element of its own. A syntax error (an unterminated quoted-string, a pair
///   without `=`), a repeated parameter or an element without `for=` is an entry that does
///   not parse: the peer is the key.
/// - Every address (peer, entries, trusted networks) is compared and keyed in the normal
///   form of [`normalize_ip`]: IPv4-mapped and NAT64 (`64:ff9b::/96`, and a prefix set
///   with [`ForwardedIp::nat64`]) spellings are the IPv4 address, so one client is one key
///   in every spelling and a trusted network matches its proxies in every spelling. IPv6 is
///   keyed by a prefix (default /64), like [`PeerIp`].
///
/// # Example
///
/// ```
/// use axum::http::Request;
/// use ratekeeper_tower::key::{ForwardedIp, KeyExtractor, PeerAddr};
///
/// let ip = ForwardedIp::trusting(["10.0.0.0/8".parse().unwrap()]);
/// let req = |peer: &str, xff: &str| {
///     let mut req = Request::builder().header("x-forwarded-for", xff).body(()).unwrap();
///     req.extensions_mut().insert(PeerAddr(peer.parse().unwrap()));
///     req
/// };
/// // From a trusted proxy: the rightmost untrusted entry, port stripped.
/// let key = ip.extract(&req("10.0.0.5:1", "6.6.6.6, 198.51.100.7:51234")).unwrap();
/// assert_eq!(key.to_string(), "ip:198.51.100.7");
/// // From anyone else: the peer; the header is ignored.
/// assert_eq!(ip.extract(&req("203.0.113.9:1", "1.1.1.1")).unwrap().to_string(), "ip:203.0.113.9");
/// // Unparsable rightmost entry: the peer, never `198.51.100.8`.
/// let key = ip.extract(&req("10.0.0.5:1", "198.51.100.8, not-an-ip")).unwrap();
/// assert_eq!(key.to_string(), "ip:10.0.0.5");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForwardedIp {
    /// The trusted networks in normal form.
    trust: Trust,
    /// The networks as configured (normalised again when a NAT64 prefix is added).
    configured: Vec<IpNet>,
    source: Source,
    peer: PeerIp,
}

impl ForwardedIp {
    /// Trusts peers and forwarded entries inside `proxies` (for example `10.0.0.0/8`).
    ///
    /// The networks are compared in the normal form of [`normalize_ip`]: a network written in
    /// IPv4-mapped or NAT64 spelling (`::ffff:10.0.0.0/104`, `64:ff9b::a00:0/104`) is the IPv4
    /// network it spells, and matches the proxy in any spelling.
    pub fn trusting(proxies: impl IntoIterator<Item = IpNet>) -> Self {
        let proxies: Vec<IpNet> = proxies.into_iter().collect();
        Self {
            trust: Trust::Cidrs(normalize_nets(proxies.iter().copied(), &[])),
            configured: proxies,
            source: Source::default(),
            peer: PeerIp::new(),
        }
    }

    /// Trusts exactly `hops` proxies in front of the app (the peer is always one of them).
    pub const fn hops(hops: NonZeroU8) -> Self {
        Self {
            trust: Trust::Hops(hops),
            configured: Vec::new(),
            source: Source::XForwardedFor,
            peer: PeerIp::new(),
        }
    }

    /// Reads `source` instead of `X-Forwarded-For`.
    pub fn source(mut self, source: Source) -> Self {
        self.source = source;
        self
    }

    /// Groups IPv6 clients by a `/prefix` (clamped to 1..=128; default 64).
    pub fn ipv6_prefix(mut self, prefix: u8) -> Self {
        let nat64 = self.peer.nat64_prefixes().first().copied();
        self.peer = PeerIp::ipv6_prefix(prefix);
        if let Some(nat64) = nat64 {
            self.peer = self.peer.nat64(nat64);
        }
        self
    }

    /// Also reads addresses inside `prefix`, your NAT64 translator's network-specific prefix,
    /// as the IPv4 address they embed, in the peer, the forwarded entries and the trusted
    /// networks (the well-known `64:ff9b::/96` always is); see [`PeerIp::nat64`].
    #[must_use]
    pub fn nat64(mut self, prefix: Nat64Prefix) -> Self {
        self.peer = self.peer.nat64(prefix);
        if let Trust::Cidrs(_) = self.trust {
            self.trust = Trust::Cidrs(normalize_nets(
                self.configured.iter().copied(),
                self.peer.nat64_prefixes(),
            ));
        }
        self
    }

    fn trusted(&self, ip: IpAddr) -> bool {
        match &self.trust {
            Trust::Cidrs(nets) => nets.iter().any(|n| n.contains(&ip)),
            Trust::Hops(_) => true,
        }
    }

    /// The client address for a request from `peer`, or `None` to key on the peer.
    pub fn client_ip(&self, peer: IpAddr, headers: &HeaderMap) -> Option<IpAddr> {
        match self.resolve(peer, headers) {
            Client::Forwarded(ip) => Some(ip),
            Client::Peer | Client::Unknown => None,
        }
    }

    /// Who sent a request from `peer`, as these rules read it: the peer itself (it is not a
    /// trusted proxy, or it forwarded no entry), the client its chain names, or nobody (the
    /// chain does not parse, or holds too few entries or only trusted ones beyond
    /// [`MAX_HOPS`]). [`client_ip`](Self::client_ip) keys the last case on the peer; the
    /// layer's exempt networks exempt nobody for it.
    pub(crate) fn resolve(&self, peer: IpAddr, headers: &HeaderMap) -> Client {
        let nat64 = self.peer.nat64_prefixes();
        let peer = normalize_ip(peer, nat64);
        if !self.trusted(peer) {
            return Client::Peer;
        }
        let mut entries = Entries::new(headers, self.source, nat64);
        // The first entry tells a request without a chain (the proxy's own call, or an
        // internal caller) from one whose chain names no client.
        let Some(first) = entries.next() else {
            return Client::Peer;
        };
        let named = match &self.trust {
            Trust::Hops(n) => Self::hop(first, entries, n.get()),
            Trust::Cidrs(_) => {
                Self::walk(std::iter::once(first).chain(entries), |ip| self.trusted(ip))
            }
        };
        named.map_or(Client::Unknown, Client::Forwarded)
    }

    /// The `n`-th entry from the right (`first` is the first); `None` when the chain is
    /// shorter or an entry up to it does not parse.
    fn hop(
        first: Result<IpAddr, ()>,
        mut entries: impl Iterator<Item = Result<IpAddr, ()>>,
        n: u8,
    ) -> Option<IpAddr> {
        let mut entry = first;
        for _ in 1..n {
            entry.ok()?;
            entry = entries.next()?;
        }
        entry.ok()
    }

    /// The rightmost untrusted entry, or the leftmost when every entry is trusted; `None` at
    /// the first entry that does not parse.
    fn walk(
        entries: impl Iterator<Item = Result<IpAddr, ()>>,
        trusted: impl Fn(IpAddr) -> bool,
    ) -> Option<IpAddr> {
        let mut last = None;
        for entry in entries {
            let ip = entry.ok()?;
            if !trusted(ip) {
                return Some(ip);
            }
            last = Some(ip);
        }
        last
    }

    /// The NAT64 prefixes these rules read as IPv4 besides the well-known one.
    pub(crate) fn nat64_prefixes(&self) -> &[Nat64Prefix] {
        self.peer.nat64_prefixes()
    }
}

/// Who sent a request, as a [`ForwardedIp`]'s trust rules read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Client {
    /// The TCP peer: it is not a trusted proxy, or it forwarded no entry.
    Peer,
    /// The client a trusted proxy's chain names (normal form).
    Forwarded(IpAddr),
    /// A trusted proxy forwarded a chain that names no client.
    Unknown,
}

impl KeyExtractor for ForwardedIp {
    fn extract<B>(&self, req: &Request<B>) -> Result<Key, KeyError> {
        let peer = PeerIp::peer_addr(req)
            .ok_or(KeyError::Misconfigured(
                "no peer address in request extensions; serve the app with \
                 `into_make_service_with_connect_info::<SocketAddr>()` or insert `PeerAddr`",
            ))?
            .ip();
        let ip = self.client_ip(peer, req.headers()).unwrap_or(peer);
        Ok(self.peer.key_for(ip))
    }

    fn trusted_proxies(&self) -> Option<&ForwardedIp> {
        Some(self)
    }
}
