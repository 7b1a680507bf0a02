//! [`ForwardedIp`]: the client IP behind trusted reverse proxies.

use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroU8;

use http::header::{FORWARDED, HeaderName};
use http::{HeaderMap, Request};
use ipnet::IpNet;
use ratekeeper_core::Key;

use super::{KeyError, KeyExtractor, Nat64Prefix, PeerIp, normalize_ip, normalize_nets};

/// `X-Forwarded-For`.
static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

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
        let nat64 = self.peer.nat64_prefixes();
        let peer = normalize_ip(peer, nat64);
        if !self.trusted(peer) {
            return None;
        }
        let mut entries = Entries::new(headers, self.source, nat64);
        match &self.trust {
            Trust::Hops(n) => {
                let n = usize::from(n.get());
                for _ in 1..n {
                    entries.next()?.ok()?;
                }
                entries.next()?.ok()
            }
            Trust::Cidrs(_) => {
                let mut last = None;
                for entry in entries {
                    let ip = entry.ok()?;
                    if !self.trusted(ip) {
                        return Some(ip);
                    }
                    last = Some(ip);
                }
                last
            }
        }
    }
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
}

/// Forwarded entries from right to left; an `Err` is an entry that does not parse. Ends
/// with one `Err` after [`MAX_HOPS`] entries.
struct Entries<'a> {
    lines: std::iter::Rev<http::header::ValueIter<'a, http::HeaderValue>>,
    current: Option<Line<'a>>,
    source: Source,
    nat64: &'a [Nat64Prefix],
    seen: usize,
}

/// The entries of one field line not yet returned, from the right.
enum Line<'a> {
    /// `X-Forwarded-For`: split lazily from the right (its grammar has no quoting).
    Xff(std::iter::Rev<std::str::Split<'a, char>>),
    /// `Forwarded`: parsed left to right by RFC 7239's grammar (the only direction its
    /// quoted-strings can be read in), the last entries kept.
    Forwarded(std::iter::Rev<std::collections::vec_deque::IntoIter<Result<IpAddr, ()>>>),
}

impl<'a> Entries<'a> {
    fn new(headers: &'a HeaderMap, source: Source, nat64: &'a [Nat64Prefix]) -> Self {
        let name = match source {
            Source::XForwardedFor => &X_FORWARDED_FOR,
            Source::Forwarded => &FORWARDED,
        };
        Self {
            lines: headers.get_all(name).iter().rev(),
            current: None,
            source,
            nat64,
            seen: 0,
        }
    }
}

impl Iterator for Entries<'_> {
    type Item = Result<IpAddr, ()>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.seen > MAX_HOPS {
            return None;
        }
        loop {
            let next = match &mut self.current {
                Some(Line::Xff(parts)) => parts
                    .next()
                    .map(|part| parse_node(part.trim(), self.nat64).ok_or(())),
                Some(Line::Forwarded(entries)) => entries.next(),
                None => None,
            };
            if let Some(entry) = next {
                self.seen += 1;
                if self.seen > MAX_HOPS {
                    return Some(Err(()));
                }
                return Some(entry);
            }
            self.current = None;
            let line = self.lines.next()?;
            match self.source {
                Source::XForwardedFor => match line.to_str() {
                    Ok(text) => self.current = Some(Line::Xff(text.split(',').rev())),
                    Err(_) => {
                        self.seen = MAX_HOPS + 1;
                        return Some(Err(()));
                    }
                },
                Source::Forwarded => {
                    let keep = MAX_HOPS + 1 - self.seen;
                    let entries = forwarded_line(line.as_bytes(), keep, self.nat64);
                    self.current = Some(Line::Forwarded(entries.into_iter().rev()));
                }
            }
        }
    }
}

/// The client addresses of one RFC 7239 `Forwarded` field line, one per element, left to
/// right; only the last `keep` are kept (the walk never reads further left).
///
/// The line is read by the grammar of RFC 7239 §4 (with the list and quoted-string rules of
/// RFC 9110 §5.6): `forwarded-element *( OWS "," OWS forwarded-element )`, an element being
/// `forwarded-pair *( ";" forwarded-pair )`, a pair `token "=" ( token / quoted-string )`.
/// A `,` or `;` inside a quoted-string is text, never a separator, and `\` escapes the next
/// character. Optional whitespace around `;` is accepted; empty list elements are skipped
/// (RFC 9110 §5.6.1).
///
/// Each element gives `Ok(address)` for a `for=` node that [`parse_for_node`] accepts, and
/// `Err` when it has no `for=`, repeats a parameter (§4: "MUST NOT occur more than once") or
/// its node is not an address. At the first syntax error (an unterminated quoted-string, a
/// pair without `=`, a stray character) the line ends with one `Err`: past that point no
/// element boundary can be trusted, so the walk from the right stops there and the
/// extractor keys on the peer.
fn forwarded_line(
    line: &[u8],
    keep: usize,
    nat64: &[Nat64Prefix],
) -> std::collections::VecDeque<Result<IpAddr, ()>> {
    let mut out = std::collections::VecDeque::with_capacity(keep.min(8) + 1);
    let push = |out: &mut std::collections::VecDeque<_>, entry| {
        out.push_back(entry);
        if out.len() > keep {
            out.pop_front();
        }
    };
    let mut p = Scanner { s: line, i: 0 };
    loop {
        match p.element(nat64) {
            Ok(Some(entry)) => push(&mut out, entry),
            Ok(None) => {}
            Err(()) => {
                push(&mut out, Err(()));
                return out;
            }
        }
        p.skip_ows();
        match p.peek() {
            None => return out,
            Some(b',') => p.i += 1,
            Some(_) => {
                push(&mut out, Err(()));
                return out;
            }
        }
    }
}

/// A cursor over one `Forwarded` field line.
struct Scanner<'a> {
    s: &'a [u8],
    i: usize,
}

/// Most pairs read in one element (RFC 7239 defines four parameters; extensions are rare).
const MAX_PAIRS: usize = 16;

impl<'a> Scanner<'a> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn skip_ows(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t')) {
            self.i += 1;
        }
    }

    /// One element, up to (not including) the `,` that ends it: `Ok(None)` for an empty
    /// element, `Ok(Some(entry))` otherwise, `Err` on a syntax error.
    fn element(&mut self, nat64: &[Nat64Prefix]) -> Result<Option<Result<IpAddr, ()>>, ()> {
        let mut names: [&'a [u8]; MAX_PAIRS] = [&[]; MAX_PAIRS];
        let mut pairs = 0;
        let mut node: Option<Result<IpAddr, ()>> = None;
        let mut valid = true;
        loop {
            self.skip_ows();
            match self.peek() {
                None | Some(b',') => break,
                Some(b';') => {
                    self.i += 1;
                    continue;
                }
                Some(_) => {}
            }
            let name = self.token().ok_or(())?;
            if self.peek() != Some(b'=') {
                return Err(());
            }
            self.i += 1;
            let value = match self.peek() {
                Some(b'"') => self.quoted_string().ok_or(())?,
                _ => self.token().ok_or(())?.to_vec(),
            };
            if pairs == MAX_PAIRS || names[..pairs].iter().any(|n| n.eq_ignore_ascii_case(name)) {
                valid = false;
            } else {
                names[pairs] = name;
                pairs += 1;
            }
            if name.eq_ignore_ascii_case(b"for") {
                node = Some(parse_for_node(&value, nat64).ok_or(()));
            }
            self.skip_ows();
            match self.peek() {
                None | Some(b',' | b';') => {}
                Some(_) => return Err(()),
            }
        }
        if pairs == 0 && valid {
            return Ok(None);
        }
        Ok(Some(if valid {
            node.unwrap_or(Err(()))
        } else {
            Err(())
        }))
    }

    /// `token = 1*tchar` (RFC 9110 §5.6.2).
    fn token(&mut self) -> Option<&'a [u8]> {
        let start = self.i;
        while self
            .peek()
            .is_some_and(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
        {
            self.i += 1;
        }
        let s: &'a [u8] = self.s;
        (self.i > start).then(|| s.get(start..self.i)).flatten()
    }

    /// `quoted-string = DQUOTE *( qdtext / quoted-pair ) DQUOTE` (RFC 9110 §5.6.4), its
    /// content unescaped.
    fn quoted_string(&mut self) -> Option<Vec<u8>> {
        self.i += 1; // the opening quote
        let mut text = Vec::new();
        loop {
            let b = self.peek()?;
            self.i += 1;
            match b {
                b'"' => return Some(text),
                b'\\' => {
                    let escaped = self.peek()?;
                    if !(escaped == b'\t' || escaped >= 0x20) || escaped == 0x7f {
                        return None;
                    }
                    self.i += 1;
                    text.push(escaped);
                }
                b'\t' | 0x20..=0x7e | 0x80..=0xff => text.push(b),
                _ => return None,
            }
        }
    }
}

/// An address with an optional port: `1.2.3.4`, `1.2.3.4:5`, `2001:db8::1`, `[2001:db8::1]`,
/// `[2001:db8::1]:5`. See [`client_address`] for what is refused.
fn parse_node(s: &str, nat64: &[Nat64Prefix]) -> Option<IpAddr> {
    let ip = if let Ok(ip) = s.parse::<IpAddr>() {
        ip
    } else if let Ok(sa) = s.parse::<SocketAddr>() {
        sa.ip()
    } else {
        s.strip_prefix('[')
            .and_then(|rest| rest.strip_suffix(']'))
            .and_then(|inner| inner.parse::<IpAddr>().ok())?
    };
    client_address(ip, nat64)
}

/// Normalises an entry the same way as the peer ([`normalize_ip`]: an IPv4-mapped or NAT64
/// address becomes IPv4, so a trusted hop written `::ffff:10.0.0.1` is recognised as
/// trusted) and refuses addresses that can never be a client's: unspecified (`0.0.0.0`,
/// `::`), multicast and the IPv4 broadcast address. A refused entry is unparsable: the
/// extractor keys on the peer.
fn client_address(ip: IpAddr, nat64: &[Nat64Prefix]) -> Option<IpAddr> {
    let ip = normalize_ip(ip, nat64);
    let never_a_client = ip.is_unspecified()
        || ip.is_multicast()
        || matches!(ip, IpAddr::V4(v4) if v4.is_broadcast());
    (!never_a_client).then_some(ip)
}

/// The address of an RFC 7239 `for=` value (unescaped, quotes removed), strictly per §6: an
/// unquoted node is a bare IPv4 address (a token cannot hold `:` or `[`); a quoted one is
/// `IPv4address` or `"[" IPv6address "]"`, each with an optional port, which may be
/// obfuscated (§6.3: `for="192.0.2.43:_abc"`) and is dropped like any port. `unknown` and
/// obfuscated node names (`_hidden`) are not addresses.
fn parse_for_node(value: &[u8], nat64: &[Nat64Prefix]) -> Option<IpAddr> {
    parse_quoted_node(std::str::from_utf8(value).ok()?, nat64)
}

/// A quoted RFC 7239 §6 `node = nodename [ ":" node-port ]` whose name is an address:
/// `IPv4address` or `"[" IPv6address "]"`, each with an optional port.
fn parse_quoted_node(node: &str, nat64: &[Nat64Prefix]) -> Option<IpAddr> {
    let (ip, port) = match node.strip_prefix('[') {
        Some(rest) => {
            let (v6, after) = rest.split_once(']')?;
            let port = match after {
                "" => None,
                _ => Some(after.strip_prefix(':')?),
            };
            (IpAddr::V6(v6.parse().ok()?), port)
        }
        None => match node.split_once(':') {
            Some((v4, port)) => (IpAddr::V4(v4.parse().ok()?), Some(port)),
            None => (IpAddr::V4(node.parse().ok()?), None),
        },
    };
    if !port.is_none_or(is_node_port) {
        return None;
    }
    client_address(ip, nat64)
}

/// RFC 7239 §6: `node-port = port / obfport`, `port = 1*5DIGIT`,
/// `obfport = "_" 1*(ALPHA / DIGIT / "." / "_" / "-")`.
fn is_node_port(port: &str) -> bool {
    match port.strip_prefix('_') {
        Some(obf) => {
            !obf.is_empty()
                && obf
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        }
        None => (1..=5).contains(&port.len()) && port.bytes().all(|b| b.is_ascii_digit()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::PeerAddr;

    fn key(ip: &ForwardedIp, peer: &str, name: &str, values: &[&[u8]]) -> String {
        let mut req = Request::new(());
        for v in values {
            req.headers_mut().append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                http::HeaderValue::from_bytes(v).unwrap(),
            );
        }
        req.extensions_mut()
            .insert(PeerAddr(SocketAddr::new(peer.parse().unwrap(), 1)));
        ip.extract(&req).unwrap().to_string()
    }

    fn trusting() -> ForwardedIp {
        ForwardedIp::trusting(["10.0.0.0/8".parse().unwrap()])
    }

    /// Case B01: `X-Forwarded-For` counts only from a trusted proxy, and only its rightmost
    /// untrusted address; anything unparsable falls back to the peer.
    #[test]
    fn only_trusted_proxies_forwarded_for_counts() {
        let ip = trusting();
        let xff = "x-forwarded-for";
        assert_eq!(
            key(&ip, "203.0.113.50", xff, &[b"1.1.1.1"]),
            "ip:203.0.113.50"
        );
        assert_eq!(
            key(&ip, "203.0.113.50", "x-real-ip", &[b"9.9.9.9"]),
            "ip:203.0.113.50"
        );
        assert_eq!(
            key(&ip, "10.0.0.5", xff, &[b"6.6.6.6, 198.51.100.7"]),
            "ip:198.51.100.7"
        );
        assert_eq!(
            key(&ip, "10.0.0.5", xff, &[b"198.51.100.7:51234"]),
            "ip:198.51.100.7"
        );
        assert_eq!(
            key(&ip, "10.0.0.5", xff, &[b"198.51.100.8, not-an-ip"]),
            "ip:10.0.0.5"
        );
        assert_eq!(key(&ip, "10.0.0.5", xff, &[b"\xFF\xFE"]), "ip:10.0.0.5");
    }

    #[test]
    fn mapped_trusted_hops_are_trusted_and_never_a_client_addresses_fall_back() {
        let ip = ForwardedIp::trusting(["127.0.0.0/8".parse().unwrap()]);
        let xff = "x-forwarded-for";
        // A dual-stack proxy writes itself as an IPv4-mapped address: still a trusted hop.
        assert_eq!(
            key(&ip, "127.0.0.1", xff, &[b"7.2.7.2, ::ffff:127.0.0.1"]),
            "ip:7.2.7.2"
        );
        assert_eq!(
            key(
                &ip.clone().source(Source::Forwarded),
                "127.0.0.1",
                "forwarded",
                &[b"for=7.3.7.3, for=\"[::ffff:127.0.0.1]\""]
            ),
            "ip:7.3.7.3"
        );
        // A mapped client entry is keyed as its IPv4 address.
        assert_eq!(
            key(&ip, "127.0.0.1", xff, &[b"::ffff:7.2.7.2"]),
            "ip:7.2.7.2"
        );
        // Addresses that are never a client's are unparsable: the peer is the key.
        for bad in [
            &b"0.0.0.0"[..],
            b"::",
            b"255.255.255.255",
            b"224.0.0.1",
            b"ff02::1",
        ] {
            assert_eq!(key(&ip, "127.0.0.1", xff, &[bad]), "ip:127.0.0.1");
        }
    }

    #[test]
    fn forwarded_syntax_is_strict() {
        let ip = ForwardedIp::trusting(["127.0.0.0/8".parse().unwrap()]).source(Source::Forwarded);
        let fwd = "forwarded";
        let peer = "ip:127.0.0.1";
        // RFC 7239 §6: IPv6 must be quoted and bracketed; a port needs quotes.
        assert_eq!(key(&ip, "127.0.0.1", fwd, &[b"for=[2001:db8::2]"]), peer);
        assert_eq!(key(&ip, "127.0.0.1", fwd, &[b"for=\"2001:db8::2\""]), peer);
        assert_eq!(key(&ip, "127.0.0.1", fwd, &[b"for=1.2.3.4:80"]), peer);
        assert_eq!(
            key(&ip, "127.0.0.1", fwd, &[b"for=\"[2001:db8::2]:4711\""]),
            "net:2001:db8::/64"
        );
        assert_eq!(
            key(&ip, "127.0.0.1", fwd, &[b"for=\"1.2.3.4:80\""]),
            "ip:1.2.3.4"
        );
        assert_eq!(
            key(&ip, "127.0.0.1", fwd, &[b"For=1.2.3.4;proto=https"]),
            "ip:1.2.3.4"
        );
        // §4: a parameter appears at most once per element.
        assert_eq!(
            key(&ip, "127.0.0.1", fwd, &[b"for=\"1.2.3.4\";for=6.6.6.6"]),
            peer
        );
        // A malformed pair makes the element unparsable.
        assert_eq!(key(&ip, "127.0.0.1", fwd, &[b"for=1.2.3.4;proto"]), peer);
    }

    #[test]
    fn trusted_hops_are_skipped_and_lines_are_joined() {
        let ip = trusting();
        let xff = "x-forwarded-for";
        assert_eq!(
            key(
                &ip,
                "10.0.0.5",
                xff,
                &[b"5.5.5.5", b"198.51.100.7, 10.1.1.1"]
            ),
            "ip:198.51.100.7"
        );
        // Every entry trusted: the leftmost is the (internal) client.
        assert_eq!(
            key(&ip, "10.0.0.5", xff, &[b"10.9.9.9, 10.1.1.1"]),
            "ip:10.9.9.9"
        );
        // No header at all: the peer.
        assert_eq!(key(&ip, "10.0.0.5", xff, &[]), "ip:10.0.0.5");
        // v6 with port and mapped v4.
        assert_eq!(
            key(&ip, "10.0.0.5", xff, &[b"[2001:db8:aa:1::9]:80"]),
            "net:2001:db8:aa:1::/64"
        );
        assert_eq!(
            key(&ip, "::ffff:10.0.0.5", xff, &[b"::ffff:192.0.2.1"]),
            "ip:192.0.2.1"
        );
    }

    #[test]
    fn hop_count() {
        let ip = ForwardedIp::hops(NonZeroU8::new(2).unwrap());
        let xff = "x-forwarded-for";
        assert_eq!(
            key(&ip, "127.0.0.1", xff, &[b"1.1.1.1, 2.2.2.2, 3.3.3.3"]),
            "ip:2.2.2.2"
        );
        // Too few entries: the peer.
        assert_eq!(key(&ip, "127.0.0.1", xff, &[b"3.3.3.3"]), "ip:127.0.0.1");
    }

    #[test]
    fn rfc7239_forwarded() {
        let ip = trusting().source(Source::Forwarded);
        let fwd = "forwarded";
        assert_eq!(
            key(
                &ip,
                "10.0.0.5",
                fwd,
                &[b"for=6.6.6.6, for=\"[2001:db8:cafe::17]:4711\";proto=https"]
            ),
            "net:2001:db8:cafe::/64"
        );
        assert_eq!(
            key(
                &ip,
                "10.0.0.5",
                fwd,
                &[b"For=192.0.2.60;proto=http;by=10.0.0.5"]
            ),
            "ip:192.0.2.60"
        );
        for hidden in [
            &b"for=_hidden"[..],
            b"for=unknown",
            b"for=\"_x:_y\"",
            b"proto=http",
        ] {
            assert_eq!(key(&ip, "10.0.0.5", fwd, &[hidden]), "ip:10.0.0.5");
        }
        // X-Forwarded-For is not read in this mode.
        assert_eq!(
            key(&ip, "10.0.0.5", "x-forwarded-for", &[b"1.1.1.1"]),
            "ip:10.0.0.5"
        );
    }

    /// Case B45: a `,` or `;` inside a quoted-string (here a `host=` the proxy copied from
    /// the client's Host) is text, never an element or pair boundary, so the `for=` the
    /// client wrote inside it never becomes the client address.
    #[test]
    fn quoted_separators_in_forwarded_never_make_a_client_address() {
        let ip = trusting().source(Source::Forwarded);
        let peer = "10.0.0.5".parse().unwrap();
        let client = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(FORWARDED, http::HeaderValue::from_str(value).unwrap());
            ip.client_ip(peer, &headers)
        };
        let v4 = |s: &str| Some(s.parse::<IpAddr>().unwrap());
        assert_eq!(
            client(r#"for=203.0.113.50;host="x,for=198.51.100.99;y=";proto=https"#),
            v4("203.0.113.50")
        );
        assert_eq!(
            client(r#"for=203.0.113.51;host="a;for=198.51.100.98""#),
            v4("203.0.113.51")
        );
        // Controls.
        assert_eq!(
            client(r#"For="[2001:db8:cafe::17]:4711""#),
            v4("2001:db8:cafe::17")
        );
        assert_eq!(
            client("for=192.0.2.43, for=198.51.100.17"),
            v4("198.51.100.17")
        );
        assert_eq!(
            client("for=192.0.2.60;proto=http;by=203.0.113.43"),
            v4("192.0.2.60")
        );
        // Escapes inside a quoted-string, an escaped quote included, stay inside it.
        assert_eq!(
            client(r#"for=203.0.113.52;host="a\",for=198.51.100.97""#),
            v4("203.0.113.52")
        );
        assert_eq!(client(r#"for="\[2001:db8::5\]""#), v4("2001:db8::5"));
        // A quoted-string that never ends, a stray character or a pair without `=`: the
        // element boundaries cannot be known, so the peer is the key.
        for broken in [
            r#"for=198.51.100.99, for=203.0.113.53;host="x, for=198.51.100.98"#,
            r#"for=203.0.113.54;host="x"y, for=198.51.100.96"#,
            "for=203.0.113.55 for=198.51.100.95",
            "for=198.51.100.94, proto",
        ] {
            assert_eq!(client(broken), None, "{broken}");
        }
        // A parameter twice (in any case) makes the element unparsable.
        assert_eq!(client("for=203.0.113.56;FOR=198.51.100.93"), None);
        assert_eq!(client("for=203.0.113.57;host=a;Host=b"), None);
        // Empty list elements and whitespace around `;` are allowed.
        assert_eq!(
            client("for=192.0.2.1 ,, for=203.0.113.58 ; proto=https ,"),
            v4("203.0.113.58")
        );
    }

    #[test]
    fn long_chains_key_on_the_rightmost_untrusted_entry() {
        let ip = trusting();
        // Padding left of the client (client-written) never reaches the key.
        let mut chain = vec!["203.0.113.9"; MAX_HOPS + 20];
        chain.push("198.51.100.7");
        chain.extend(["10.0.0.1"; 3]);
        let chain = chain.join(", ");
        assert_eq!(
            key(&ip, "10.0.0.5", "x-forwarded-for", &[chain.as_bytes()]),
            "ip:198.51.100.7"
        );
    }

    #[test]
    fn long_chains_fall_back_to_the_peer() {
        let ip = trusting();
        let chain = vec!["10.0.0.1"; MAX_HOPS + 5].join(", ");
        assert_eq!(
            key(&ip, "10.0.0.5", "x-forwarded-for", &[chain.as_bytes()]),
            "ip:10.0.0.5"
        );
        let huge = "9".repeat(64 * 1024);
        assert_eq!(
            key(&ip, "10.0.0.5", "x-forwarded-for", &[huge.as_bytes()]),
            "ip:10.0.0.5"
        );
    }
}
