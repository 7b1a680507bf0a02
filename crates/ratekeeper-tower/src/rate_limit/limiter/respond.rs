//! After the inner service answered (or did not): the [`Respond`] side of the limiter. It
//! adds the rate-limit headers to a passed request's response, settles the request's charges
//! by the response's status (or by [`NO_RESPONSE`] or [`FAILED`] when there is none), gives
//! back a dropped Delay-mode reservation, and starts the count of a response whose cost is
//! settled from a header, a trailer or the body (see [`crate::usage`]).

use std::sync::Arc;

use http::{HeaderMap, StatusCode};
use ratekeeper_core::Key;
use ratekeeper_core::store::{Decisions, Store};
use smallvec::SmallVec;

use super::Limiter;
use crate::policy::Applied;
use crate::rate_limit::ticket::Ticket;
use crate::usage::{Corrector, Metered};

/// The limiter as a settlement sees it: what happens after the inner service answered (or
/// did not). No type parameter, so a settlement can move into a response body.
pub(crate) trait Respond: Send + Sync {
    /// Settles the ticket by the response's status, then adds the rate-limit headers of
    /// `decisions` to the response; `true` when the layer settles some policy from the
    /// response ([`Respond::meter`] then).
    fn respond(
        &self,
        ticket: &Ticket,
        decisions: &Decisions,
        parts: &mut http::response::Parts,
    ) -> bool;
    /// Corrects the charges a response header settles; returns what the response body
    /// carries for those a trailer or the body settles (see [`crate::usage`]).
    fn meter(
        self: Arc<Self>,
        ticket: &mut Ticket,
        decisions: &Decisions,
        head: &http::response::Parts,
    ) -> Option<Box<Metered>>;
    /// Settles the ticket without a response (see [`NO_RESPONSE`] and [`FAILED`]).
    fn settle(&self, ticket: &Ticket, decisions: &Decisions, status: StatusCode);
}

/// The status a charge is settled with when the response future is dropped before the inner
/// service answered (the client went away): `499`, nginx's "client closed request". So
/// `Settle::COUNT_UNAUTHORIZED` gives the charge back (it was no `401`) and
/// `Settle::REFUND_SERVER_ERRORS` keeps it (the server did not fail).
pub(crate) const NO_RESPONSE: u16 = 499;
/// The status a charge is settled with when the inner service returned an error instead of a
/// response: `500`, as hyper answers such a request.
pub(crate) const FAILED: u16 = 500;

impl<K, Co, St, R> Respond for Limiter<K, Co, St, R>
where
    K: Send + Sync + 'static,
    Co: Send + Sync + 'static,
    St: Store<Key>,
    R: Send + Sync + 'static,
{
    #[inline]
    fn respond(
        &self,
        ticket: &Ticket,
        decisions: &Decisions,
        parts: &mut http::response::Parts,
    ) -> bool {
        self.settle_charges(ticket, decisions, parts.status);
        self.headers(ticket, decisions, &mut parts.headers);
        !self.usage.is_empty()
    }

    fn meter(
        self: Arc<Self>,
        ticket: &mut Ticket,
        decisions: &Decisions,
        head: &http::response::Parts,
    ) -> Option<Box<Metered>> {
        self.meter_response(ticket, decisions, head)
    }

    fn settle(&self, ticket: &Ticket, decisions: &Decisions, status: StatusCode) {
        self.settle_charges(ticket, decisions, status);
    }
}

impl<K, Co, St, R> Limiter<K, Co, St, R>
where
    St: Store<Key>,
{
    /// Adds the rate-limit headers of a passed request's decisions to its response.
    #[inline]
    pub(super) fn headers(&self, ticket: &Ticket, decisions: &Decisions, headers: &mut HeaderMap) {
        // Only the IETF fields and several policies need the list.
        let policies: SmallVec<[usize; 2]> = if self.reporter.needs_policy_indices() {
            ticket.charges.policy_indices()
        } else {
            SmallVec::new()
        };
        self.reporter.headers(
            decisions,
            &policies,
            ticket.pk.as_deref(),
            || self.store.unix_now(),
            headers,
        );
    }

    /// Settles after the response: gives back the charges a policy's settle rule refunds for
    /// `status`, each with the receipt its decision carried (so a charge whose window closed
    /// or that the bucket drained gives back nothing).
    #[inline]
    pub(super) fn settle_charges(
        &self,
        ticket: &Ticket,
        decisions: &Decisions,
        status: StatusCode,
    ) {
        let applied = &ticket.charges;
        let refunds = applied.refunds(&self.rules, &self.ids, decisions, status);
        if !refunds.is_empty() {
            tracing::debug!(key = self.diag.key_text(&applied.key), %status, "refunding rate-limit charge after the response");
            self.store.refund(&refunds);
        }
    }

    /// Gives back a Delay-mode reservation dropped before it proceeded, as far as the
    /// receipts in `decisions` say its charges still hold (never a later reservation's slot).
    pub(super) fn give_back(&self, ticket: &Ticket, decisions: &Decisions) {
        let applied = &ticket.charges;
        tracing::debug!(
            key = self.diag.key_text(&applied.key),
            "refunding a dropped delay-mode reservation"
        );
        self.store
            .refund(&applied.all_refunds(&self.ids, decisions));
    }

    /// At the response head, for a layer with usage rules: corrects the charges a response
    /// header settles, and returns what the body carries for the charges a trailer or the
    /// body settles (taking the charges out of the ticket, which is settled then).
    #[cold]
    pub(super) fn meter_response(
        self: Arc<Self>,
        ticket: &mut Ticket,
        decisions: &Decisions,
        head: &http::response::Parts,
    ) -> Option<Box<Metered>>
    where
        K: Send + Sync + 'static,
        Co: Send + Sync + 'static,
        R: Send + Sync + 'static,
    {
        let status = head.status;
        let settle = &self.rules.settle;
        let refunded = |index: u32| settle.iter().any(|(i, s)| *i == index && s.refunds(status));
        let started = self.usage.start(&ticket.charges, decisions, refunded, head);
        if !started.now.is_empty() {
            let receipts: SmallVec<[_; 2]> = decisions.receipts().collect();
            self.correct(&ticket.charges, &receipts, &started.now);
        }
        if !started.counts_body() {
            return None;
        }
        let charges = std::mem::take(&mut ticket.charges);
        let metered = started.into_metered(self, charges, decisions);
        Some(Box::new(metered))
    }
}

impl<K, Co, St, R> Corrector for Limiter<K, Co, St, R>
where
    K: Send + Sync + 'static,
    Co: Send + Sync + 'static,
    St: Store<Key>,
    R: Send + Sync + 'static,
{
    fn correct(
        &self,
        applied: &Applied,
        receipts: &[ratekeeper_core::store::Receipt],
        actuals: &[(usize, u64)],
    ) {
        let corrections =
            crate::usage::corrections(applied, &self.ids, &self.usage, receipts, actuals);
        if corrections.is_empty() {
            return;
        }
        if tracing::enabled!(target: crate::usage::USAGE_TARGET, tracing::Level::DEBUG) {
            let pairs: SmallVec<[(u64, u64); 2]> = corrections
                .iter()
                .map(|c| (c.charge.cost, c.actual))
                .collect();
            tracing::debug!(
                target: crate::usage::USAGE_TARGET,
                key = self.diag.key_text(&applied.key),
                corrections = ?pairs,
                "settling rate-limit charges to their true cost (estimate, actual)"
            );
        }
        self.store.correct(&corrections);
    }
}
