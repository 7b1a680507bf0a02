use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroU8;

use http::header::{FORWARDED, HeaderName};
use http::{HeaderMap, Request};

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

/// A spoofed `X-Forwarded-For` (<https://github.com/long2ice/fastapi-limiter/issues/9>: a random
/// one per request bypassed the limiter): it counts only from a trusted proxy, and only its
/// rightmost untrusted address; anything unparsable falls back to the peer.
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

/// RFC 7239 quoted strings (<https://github.com/jshttp/forwarded/issues/1>: splitting on `,` and
/// `;` smuggles a `for=` node): a `,` or `;` inside a quoted-string (here a `host=` the proxy
/// copied from the client's Host) is text, never an element or pair boundary, so the `for=` the
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

/// `resolve` (what exempt networks are matched by) tells the peer's own request from a
/// forwarded client and from a chain that names nobody; `client_ip` keys the last on the
/// peer, and never skips an unparsable entry on the way to the `n`-th hop.
#[test]
fn resolve_tells_the_peer_a_forwarded_client_and_an_unreadable_chain_apart() {
    let headers = |name: &str, values: &[&str]| {
        let mut map = HeaderMap::new();
        for v in values {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                http::HeaderValue::from_str(v).unwrap(),
            );
        }
        map
    };
    let xff = |values: &[&str]| headers("x-forwarded-for", values);
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    let proxy = ip("10.0.0.5");
    let cidrs = trusting();
    let hops = ForwardedIp::hops(NonZeroU8::new(2).unwrap());
    let forwarded = |s: &str| Client::Forwarded(ip(s));
    for (rules, peer, chain, expected) in [
        // Not a trusted proxy: the peer, whatever the header says.
        (
            &cidrs,
            ip("203.0.113.9"),
            xff(&["198.51.100.7"]),
            Client::Peer,
        ),
        // A trusted proxy without a chain: its own call.
        (&cidrs, proxy, HeaderMap::new(), Client::Peer),
        (
            &cidrs,
            proxy,
            xff(&["198.51.100.7"]),
            forwarded("198.51.100.7"),
        ),
        (
            &cidrs,
            proxy,
            xff(&["198.51.100.7", "10.0.0.9"]),
            forwarded("198.51.100.7"),
        ),
        // Every entry trusted: the leftmost, an internal caller.
        (
            &cidrs,
            proxy,
            xff(&["10.0.0.7, 10.0.0.9"]),
            forwarded("10.0.0.7"),
        ),
        (
            &cidrs,
            proxy,
            xff(&["198.51.100.7, not-an-ip"]),
            Client::Unknown,
        ),
        (&cidrs, proxy, xff(&[""]), Client::Unknown),
        // The rules read `X-Forwarded-For`: a `Forwarded` header is no chain of theirs.
        (
            &cidrs,
            proxy,
            headers("forwarded", &["for=198.51.100.7"]),
            Client::Peer,
        ),
        (&hops, proxy, HeaderMap::new(), Client::Peer),
        (
            &hops,
            proxy,
            xff(&["198.51.100.7, 10.0.0.9"]),
            forwarded("198.51.100.7"),
        ),
        // Too short for two hops, or an unparsable entry on the way: nobody.
        (&hops, proxy, xff(&["10.0.0.9"]), Client::Unknown),
        (
            &hops,
            proxy,
            xff(&["198.51.100.7, garbage"]),
            Client::Unknown,
        ),
    ] {
        assert_eq!(rules.resolve(peer, &chain), expected, "{peer} {chain:?}");
        let keyed = match expected {
            Client::Forwarded(ip) => Some(ip),
            Client::Peer | Client::Unknown => None,
        };
        assert_eq!(rules.client_ip(peer, &chain), keyed, "{peer} {chain:?}");
    }
    // More than `MAX_HOPS` trusted entries: nobody.
    let long = vec!["10.0.0.7"; MAX_HOPS + 1].join(", ");
    assert_eq!(cidrs.resolve(proxy, &xff(&[&long])), Client::Unknown);
}
