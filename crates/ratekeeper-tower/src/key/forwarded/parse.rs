//! Reading a forwarded chain: the entries of `X-Forwarded-For` and RFC 7239 `Forwarded`
//! field lines, from the right, as client addresses in normal form (or `Err` for an entry
//! that does not parse).

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};

use http::header::{FORWARDED, HeaderName};
use http::{HeaderMap, HeaderValue};

use super::{MAX_HOPS, Source};
use crate::key::{Nat64Prefix, normalize_ip};

/// `X-Forwarded-For`.
static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// Forwarded entries from right to left; an `Err` is an entry that does not parse. Ends
/// with one `Err` after [`MAX_HOPS`] entries.
pub(super) struct Entries<'a> {
    lines: std::iter::Rev<http::header::ValueIter<'a, HeaderValue>>,
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
    pub(super) fn new(headers: &'a HeaderMap, source: Source, nat64: &'a [Nat64Prefix]) -> Self {
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
fn forwarded_line(line: &[u8], keep: usize, nat64: &[Nat64Prefix]) -> VecDeque<Result<IpAddr, ()>> {
    let mut out = VecDeque::with_capacity(keep.min(8) + 1);
    let push = |out: &mut VecDeque<_>, entry| {
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
