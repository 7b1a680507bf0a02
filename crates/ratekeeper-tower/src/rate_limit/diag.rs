//! What the layer tells operators through `tracing`: the INFO event when a layer is built,
//! the one-time WARN about a proxy in front of a peer-keyed limit, and the DEBUG event of
//! each decision (key hashed unless raw keys were asked for).
//!
//! Targets: `ratekeeper` (built, proxy warning) and `ratekeeper::decision` (one event per
//! decision), so `RUST_LOG=info,ratekeeper::decision=debug` shows the decisions alone.

use std::fmt::{self, Write as _};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use http::header::FORWARDED;
use http::{HeaderMap, HeaderName, Request};
use ratekeeper_core::store::Decisions;
use ratekeeper_core::{Key, Outcome, Policy};
use sha2::{Digest, Sha256};

use super::mode::Mode;
use crate::key::PeerIp;
use crate::policy::Applied;
use crate::report::HeaderStyle;

/// How many requests from private peers (or keyed by something other than an address) the
/// layer looks at for a forwarding header before it stops looking: a proxy in front adds the
/// header to every request, so it shows itself among the first ones, and after them the
/// watch costs one relaxed load per request (measured: the header lookups cost about 290
/// instructions per request from a private peer).
pub(crate) const WATCHED_REQUESTS: u32 = 4_096;

/// `X-Forwarded-For`, built once (a `&str` name is parsed on every lookup).
static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// The `tracing` target of the decision events.
pub(crate) const DECISION_TARGET: &str = "ratekeeper::decision";

/// The diagnostics settings of one layer and the state of its one-time warning.
#[derive(Debug)]
pub(crate) struct Diagnostics {
    /// Watch for `X-Forwarded-For`/`Forwarded` from a private peer (the key reads the peer
    /// and the warning was not turned off).
    watch_forwarded: bool,
    /// The warning was given (or is not wanted, or [`WATCHED_REQUESTS`] showed no proxy).
    warned: AtomicBool,
    /// Requests from private peers looked at without finding a forwarding header.
    looked: AtomicU32,
    /// Write raw keys in decision events instead of their hash.
    raw_keys: bool,
    /// The "cost can never fit" WARN was given (later ones are DEBUG events: a cost that
    /// comes from client input must not flood the logs).
    cannot_fit_warned: AtomicBool,
    /// The "proxy inside an exempt network" WARN was given.
    exempt_warned: AtomicBool,
}

impl Diagnostics {
    pub(crate) fn new(watch_forwarded: bool, raw_keys: bool) -> Self {
        Self {
            watch_forwarded,
            warned: AtomicBool::new(!watch_forwarded),
            looked: AtomicU32::new(0),
            raw_keys,
            cannot_fit_warned: AtomicBool::new(false),
            exempt_warned: AtomicBool::new(false),
        }
    }

    /// Warns once when a request keyed by its peer address came through a proxy on a private
    /// or loopback address: every client behind it then shares the proxy's budget. Until it
    /// warned: a relaxed load and, for a key that is a public IPv4/IPv6 address, one range
    /// check; only a private peer (or a key that is not an address) looks at the headers,
    /// for the first [`WATCHED_REQUESTS`] such requests.
    #[inline]
    pub(crate) fn watch<B>(&self, req: &Request<B>, key: &Key) {
        if self.watch_forwarded && !self.warned.load(Ordering::Relaxed) {
            let ip = match key {
                Key::Ip(ip) if !is_private(*ip) => return,
                Key::Ip(ip) => Some(*ip),
                _ => None,
            };
            self.check_forwarded(req, ip);
        }
    }

    /// The slow part of [`watch`](Self::watch): the headers (by prebuilt name, no parsing),
    /// then the peer address when the key was not one.
    #[cold]
    #[inline(never)]
    fn check_forwarded<B>(&self, req: &Request<B>, ip: Option<IpAddr>) {
        let Some(header) = forwarding_header(req.headers()) else {
            if self.looked.fetch_add(1, Ordering::Relaxed) >= WATCHED_REQUESTS {
                self.warned.store(true, Ordering::Relaxed);
            }
            return;
        };
        let Some(ip) =
            ip.or_else(|| PeerIp::peer_addr(req).map(|a| crate::key::normalize_ip(a.ip(), &[])))
        else {
            return;
        };
        if !is_private(ip) || self.warned.swap(true, Ordering::Relaxed) {
            return;
        }
        tracing::warn!(
            target: "ratekeeper",
            peer = %ip,
            header,
            "rate limit keyed by the peer address, but requests arrive from {ip} (a private or \
             loopback address) carrying a forwarding header ({header}): every client behind that proxy shares \
             one budget. Key by the client address the proxy reports with \
             `ForwardedIp::trusting([<proxy network>])`, or turn this warning off with \
             `.warn_forwarded(false)` (logged once)"
        );
    }

    /// Warns once (WARN, target `ratekeeper`) that a request from `peer`, inside an exempt
    /// network, was limited because it carries a forwarding `header` the layer's trust rules
    /// read no client from: `peer` is a proxy, and its clients are not exempt by its address.
    /// `rules`: whether the layer has trust rules (then `peer` is not among its trusted
    /// proxies, or they read another header).
    #[cold]
    #[inline(never)]
    pub(crate) fn exempt_proxy(&self, peer: IpAddr, header: &'static str, rules: bool) {
        if self.exempt_warned.load(Ordering::Relaxed)
            || self.exempt_warned.swap(true, Ordering::Relaxed)
        {
            return;
        }
        let fix = if rules {
            "add the proxy to the trusted proxies of the layer's `ForwardedIp` (or of \
             `.exempt_client_ip(..)`), reading the header it writes"
        } else {
            "state the proxies: key by `ForwardedIp::trusting([<proxy network>])`, or keep the \
             key and set `.exempt_client_ip(ForwardedIp::trusting([<proxy network>]))` \
             (config: `key = { kind = \"forwarded\", trusted = [..] }` or `[exempt] trusted = [..]`)"
        };
        tracing::warn!(
            target: "ratekeeper",
            peer = %peer,
            header,
            "a request from {peer} (inside an exempt network) carries a forwarding header \
             ({header}), but the layer reads no client address from it: {peer} acts as a \
             proxy, and exempt networks are matched against the client's address, so the \
             request is limited. To exempt such requests by their clients' addresses, {fix} \
             (logged once)"
        );
    }

    /// Whether this is the layer's first "cost can never fit" denial (logged at WARN; the
    /// later ones at DEBUG).
    pub(crate) fn first_cannot_fit(&self) -> bool {
        !self.cannot_fit_warned.load(Ordering::Relaxed)
            && !self.cannot_fit_warned.swap(true, Ordering::Relaxed)
    }

    /// A key as logs show it: hashed (see [`hashed`]) unless raw keys were asked for.
    pub(crate) fn key_text(&self, key: &Key) -> String {
        if self.raw_keys {
            key.to_string()
        } else {
            hashed(key)
        }
    }

    /// One DEBUG event for a final decision (target [`DECISION_TARGET`]): the policy whose
    /// decision the headers report, its outcome, cost and remaining units, and the key
    /// (hashed unless raw keys were asked for). Free when DEBUG is off for the target: the
    /// caller checks `tracing::enabled!` first.
    #[cold]
    #[inline(never)]
    pub(crate) fn decision(
        &self,
        names: &[Box<str>],
        applied: &Applied,
        decisions: &Decisions,
        mode: Mode,
    ) {
        let at = decisions.deciding().unwrap_or(0);
        let entry = applied.entries.get(at);
        let decision = decisions.as_slice().get(at);
        let policy = entry
            .and_then(|e| names.get(e.index as usize))
            .map_or("", |n| &**n);
        let key = entry.and_then(|e| e.key.as_ref()).unwrap_or(&applied.key);
        let outcome = decision.map_or("other", |d| outcome_label(d.outcome()));
        let key = self.key_text(key);
        tracing::debug!(
            target: DECISION_TARGET,
            policy,
            outcome,
            cost = entry.map_or(0, |e| e.cost),
            remaining = decision.map_or(0, |d| d.remaining()),
            limit = decision.map_or(0, |d| d.limit()),
            policies = applied.entries.len(),
            key,
            mode = %ModeName(mode),
            "rate-limit decision"
        );
    }
}

/// The forwarding header a request carries, if any (`X-Forwarded-For` first), by prebuilt
/// name.
pub(crate) fn forwarding_header(headers: &HeaderMap) -> Option<&'static str> {
    if headers.contains_key(&X_FORWARDED_FOR) {
        Some("X-Forwarded-For")
    } else if headers.contains_key(FORWARDED) {
        Some("Forwarded")
    } else {
        None
    }
}

/// The metric and log label of an outcome.
pub(crate) fn outcome_label(outcome: Outcome) -> &'static str {
    match outcome {
        Outcome::Allowed => "allowed",
        Outcome::Denied { .. } => "denied",
        Outcome::CannotFit => "cannot_fit",
        // `Outcome` is non-exhaustive.
        _ => "other",
    }
}

/// `h:` and the first 8 bytes of SHA-256 of the key's text, in hex: the same key always
/// gives the same value (so one client's decisions can be followed), the raw key (an IP, an
/// API key) never appears. Not salted: a short key space (IPv4) can be searched, so treat
/// the hash as pseudonymous, not anonymous.
pub(crate) fn hashed(key: &Key) -> String {
    let digest = Sha256::digest(key.to_string().as_bytes());
    let mut out = String::with_capacity(18);
    out.push_str("h:");
    for byte in digest.iter().take(8) {
        let _ = write!(out, "{byte:02x}");
    }
    out
}

/// Whether `ip` is one a reverse proxy would connect from: loopback, RFC 1918 / RFC 4193
/// private, link-local or shared (CGNAT) space.
pub(crate) fn is_private(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || (a == 100 && (64..128).contains(&b))
        }
        IpAddr::V6(v6) => v6.is_loopback() || v6.is_unique_local() || v6.is_unicast_link_local(),
    }
}

/// A mode as a short name for logs.
struct ModeName(Mode);

impl fmt::Display for ModeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Mode::Reject => f.write_str("reject"),
            Mode::Shadow => f.write_str("shadow"),
            Mode::Delay { max_wait } => write!(f, "delay (at most {} ms)", max_wait.as_millis()),
        }
    }
}

/// The INFO event of a layer that was just built (target `ratekeeper`): its policies
/// (name, quota, algorithm), key extractor, store, header style and mode.
pub(crate) fn built(policies: &[Policy], key: &str, store: &str, style: HeaderStyle, mode: Mode) {
    let mut list = String::new();
    for (i, p) in policies.iter().enumerate() {
        if i > 0 {
            list.push_str(", ");
        }
        let _ = write!(list, "{} = {} ({})", p.name(), p.quota(), p.algorithm());
    }
    tracing::info!(
        target: "ratekeeper",
        policies = %list,
        key,
        store,
        headers = ?style,
        mode = %ModeName(mode),
        "rate limit built"
    );
}

pub(crate) use crate::type_name::short_type_name;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_addresses() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "192.168.0.9",
            "172.16.0.1",
            "100.64.0.1",
            "::1",
            "fd00::1",
            "fe80::1",
        ] {
            assert!(is_private(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["192.0.2.1", "8.8.8.8", "2001:db8::1", "100.128.0.1"] {
            assert!(!is_private(ip.parse().unwrap()), "{ip}");
        }
    }

    #[test]
    fn the_watch_stops_after_enough_private_requests_without_a_header() {
        let req = Request::new(());
        let public = Diagnostics::new(true, false);
        public.watch(&req, &Key::Ip("192.0.2.1".parse().unwrap()));
        assert_eq!(public.looked.load(Ordering::Relaxed), 0);
        let private = Diagnostics::new(true, false);
        let key = Key::Ip("10.0.0.1".parse().unwrap());
        for _ in 0..WATCHED_REQUESTS {
            private.watch(&req, &key);
        }
        assert!(!private.warned.load(Ordering::Relaxed));
        private.watch(&req, &key);
        assert!(private.warned.load(Ordering::Relaxed));
        let off = Diagnostics::new(false, false);
        assert!(off.warned.load(Ordering::Relaxed));
    }

    #[test]
    fn keys_are_hashed_stably() {
        let a = hashed(&Key::from("198.51.100.7"));
        assert_eq!(a, hashed(&Key::from("198.51.100.7")));
        assert_ne!(a, hashed(&Key::from("198.51.100.8")));
        assert!(
            a.starts_with("h:") && a.len() == 18 && !a.contains("198"),
            "{a}"
        );
    }
}
