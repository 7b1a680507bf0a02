//! [`Settle`]: what happens to a charge once the response status is known, and the refunds
//! it gives back (each with its charge's receipt).

use http::StatusCode;
use ipnet::IpNet;
use ratekeeper_core::Key;
use ratekeeper_core::store::{Charge, Decisions, PolicyId, Refund};
use smallvec::SmallVec;

use super::Applied;
use crate::key::ForwardedIp;

/// What to do with a charge once the response status is known.
///
/// A request with no response status is settled too: as a `500` when the inner service
/// returned an error, and as a `499` ("client closed request", nginx's convention) when its
/// response future was dropped before the answer (the client went away). So
/// [`Settle::COUNT_UNAUTHORIZED`] gives a cancelled request's unit back (it was no `401`), and
/// [`Settle::REFUND_SERVER_ERRORS`] refunds a failed one but keeps a cancelled one.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum Settle {
    /// Keep the charge only when the status makes the function return true (for example
    /// only `401` on a login route, so failed logins are limited and good ones are free);
    /// refund it otherwise.
    CountOnly(fn(StatusCode) -> bool),
    /// Refund the charge when the function returns true (for example on `5xx`).
    RefundIf(fn(StatusCode) -> bool),
}

impl Settle {
    /// Refund on any `5xx`: the client is not charged for the server's failures.
    pub const REFUND_SERVER_ERRORS: Self = Self::RefundIf(|s| s.is_server_error());

    /// Count only `401 Unauthorized` responses (failed logins).
    pub const COUNT_UNAUTHORIZED: Self = Self::CountOnly(|s| s == StatusCode::UNAUTHORIZED);

    /// Whether a charge is given back for a response with `status`.
    pub fn refunds(&self, status: StatusCode) -> bool {
        match self {
            Self::CountOnly(counts) => !counts(status),
            Self::RefundIf(refund) => refund(status),
        }
    }
}

/// Layer-wide exemptions and settle rules (not generic over the request).
#[derive(Debug, Clone, Default)]
pub(crate) struct Rules {
    /// Settle rule per policy index.
    pub(crate) settle: SmallVec<[(u32, Settle); 2]>,
    /// Requests that look like CORS preflights are not limited (opt-in; client-controlled).
    pub(crate) exempt_preflight: bool,
    /// In the normal form of [`normalize_ip`](crate::key::normalize_ip) with `nat64`.
    pub(crate) exempt_networks: Vec<IpNet>,
    /// The trust rules that find the client address matched against `exempt_networks`
    /// (set with the builder, or the key extractor's); `None`: the client is the peer.
    pub(crate) exempt_trust: Option<ForwardedIp>,
    pub(crate) exempt_keys: Vec<Key>,
    /// NAT64 prefixes read as IPv4 besides the well-known one (exempt networks and peers).
    pub(crate) nat64: Vec<crate::key::Nat64Prefix>,
}

impl Applied {
    /// Every charge with the receipt its decision carried: what a dropped reservation gives
    /// back.
    pub(crate) fn all_refunds<'a>(
        &'a self,
        ids: &[PolicyId],
        decisions: &Decisions,
    ) -> SmallVec<[Refund<'a, Key>; 2]> {
        let mut refunds = SmallVec::new();
        for (i, e) in self.entries.iter().enumerate() {
            if let Some(&id) = ids.get(e.index as usize) {
                let charge = Charge::new(id, e.key.as_ref().unwrap_or(&self.key), e.cost);
                refunds.push(Refund::new(charge, decisions.receipt(i)));
            }
        }
        refunds
    }

    /// The charges to give back for a response with `status`, each with the receipt its
    /// decision carried.
    pub(crate) fn refunds<'a>(
        &'a self,
        rules: &Rules,
        ids: &[PolicyId],
        decisions: &Decisions,
        status: StatusCode,
    ) -> SmallVec<[Refund<'a, Key>; 4]> {
        if rules.settle.is_empty() {
            return SmallVec::new();
        }
        self.entries
            .iter()
            .enumerate()
            .filter(|(_, e)| {
                rules
                    .settle
                    .iter()
                    .any(|(i, s)| *i == e.index && s.refunds(status))
            })
            .filter_map(|(i, e)| {
                let id = *ids.get(e.index as usize)?;
                let charge = Charge::new(id, e.key.as_ref().unwrap_or(&self.key), e.cost);
                Some(Refund::new(charge, decisions.receipt(i)))
            })
            .collect()
    }
}
