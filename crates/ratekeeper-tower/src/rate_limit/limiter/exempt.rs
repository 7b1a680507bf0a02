//! Exempt networks: matched against the client's address as the layer's trust rules read
//! it, never against a proxy's.

use http::Request;

use super::Limiter;
use crate::key::{Client, PeerIp, normalize_ip};
use crate::rate_limit::diag::forwarding_header;

impl<K, Co, St, R> Limiter<K, Co, St, R> {
    /// Whether the request's client is inside the exempt networks (only called when there
    /// are some).
    ///
    /// The client is the one the trust rules name (the builder's, or the key extractor's)
    /// when a trusted proxy forwarded the request, and the TCP peer otherwise. A trusted
    /// proxy's chain that names no client (it does not parse) exempts nobody; so does a
    /// peer in an exempt network that sends a forwarding header the rules read no client
    /// from (a proxy the layer was not told to trust, logged once): its clients are not
    /// exempt by its address.
    #[inline]
    pub(super) fn network_exempt<B>(&self, req: &Request<B>) -> bool {
        let rules = &self.rules;
        let Some(peer) = PeerIp::peer_addr(req) else {
            return false;
        };
        let client = match &rules.exempt_trust {
            Some(trust) => trust.resolve(peer.ip(), req.headers()),
            None => Client::Peer,
        };
        let ip = match client {
            Client::Forwarded(ip) => ip,
            Client::Peer => peer.ip(),
            Client::Unknown => return false,
        };
        let ip = normalize_ip(ip, &rules.nat64);
        if !rules.exempt_networks.iter().any(|n| n.contains(&ip)) {
            return false;
        }
        if client == Client::Peer {
            if let Some(header) = forwarding_header(req.headers()) {
                self.diag
                    .exempt_proxy(ip, header, rules.exempt_trust.is_some());
                return false;
            }
        }
        true
    }
}
