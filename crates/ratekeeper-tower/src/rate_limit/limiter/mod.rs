//! The one owner of the request path: [`Limiter`] makes a request's [`Ticket`], calls the
//! store, turns the store's answer into a [`Verdict`] (with the metrics and logs of that
//! decision), renders headers and 429s, and settles after the response (the response side,
//! [`Respond`], is in `respond.rs`).
//!
//! Both ways a store answers go through the same [`Erased::verdict`]: at once (the memory
//! store, inside `call`, on the concrete limiter, inlined) and later (an async store, from
//! the response future, on the trait object, so the future does not carry the key, cost and
//! resolver types). Which state follows a verdict is decided in one function, `dispatch` in
//! `future.rs`.

use std::sync::Arc;
use std::time::Duration;

use http::{Extensions, Request};
use ratekeeper_core::Key;
use ratekeeper_core::store::{
    Charge, Checked, Decisions, FailurePolicy, PolicyId, Store, StoreError,
};
use smallvec::SmallVec;
use tokio::time::Instant;

mod exempt;
mod respond;

pub(crate) use respond::{FAILED, NO_RESPONSE, Respond};

use super::answer::{Answer, Refusal};
use super::degrade::Degrade;
use super::diag::{DECISION_TARGET, Diagnostics};
use super::meter::Meter;
use super::mode::Mode;
use super::ticket::Ticket;
use crate::cost::Cost;
use crate::degraded::StoreDegraded;
use crate::info::Info;
use crate::key::KeyExtractor;
use crate::policy::{AllPolicies, Applied, Plan, Resolve, Rules};
use crate::report::{Reporter, Unavailable};
use crate::usage::UsageRules;

/// What the layer does with a request once the store decided. Every verdict but
/// [`Verdict::Retry`] is final and was counted once in `ratekeeper_decisions_total`. The
/// decisions stay with the caller (moving them through the verdict copied some 150 bytes
/// twice per request).
#[derive(Debug)]
pub(crate) enum Verdict {
    /// Call the inner service; report the decisions on its response and settle after it.
    Pass,
    /// Answer without calling the inner service (in HTTP form: the ticket's [`Refusal`]
    /// gives it its final form).
    Answer(Answer),
    /// [`Mode::Delay`], reserved: already charged; sleep [`Decisions::delay`], then pass with
    /// the decisions without a second check. A drop before then gives the charges back.
    Wait,
    /// [`Mode::Delay`], check-and-retry: nothing is held; sleep `wait`, then reserve again,
    /// and refuse the request if it cannot pass by `deadline` (the ticket's, set at its first
    /// denial).
    Retry { wait: Duration, deadline: Instant },
    /// Denied, and the ticket's refusal goes to the fallback: hand it the request with
    /// [`Erased::degrade`] (the decisions are reported on its response and settled after it,
    /// as for a pass). No payload, so the verdict keeps the size it has without a fallback.
    Degrade,
}

/// What the layer does before the store: exempt, refuse, or charge.
pub(crate) enum Prepared {
    /// Not limited: straight to the inner service, no headers.
    Exempt,
    /// No key could be found: this answer, in the form the refusal gives it.
    Failed(Answer, Refusal),
    /// Check the ticket's charges.
    Charge(Ticket),
}

/// The state of one rate limit, shared (behind an `Arc`) by its layer, every service the
/// layer builds and their clones.
pub(crate) struct Limiter<K, Co, St, R = AllPolicies> {
    pub(crate) store: St,
    pub(crate) ids: SmallVec<[PolicyId; 4]>,
    /// Renders headers and 429s (no mode, no request-info flag: those are decided here).
    pub(crate) reporter: Reporter,
    pub(crate) key: K,
    pub(crate) cost: Co,
    pub(crate) resolver: R,
    pub(crate) rules: Rules,
    pub(crate) meter: Meter,
    pub(crate) mode: Mode,
    /// Insert an [`Info`] extension into allowed requests.
    pub(crate) request_info: bool,
    /// The proxy warning and the decision events.
    pub(crate) diag: Diagnostics,
    /// The policies settled from the response (a header, a trailer, the body).
    pub(crate) usage: UsageRules,
    /// The 503 when the store cannot decide and fails closed.
    pub(crate) unavailable: Unavailable,
}

impl<K, Co, St, R> Limiter<K, Co, St, R> {
    /// The layer's policy names, in the order they were added.
    pub(crate) fn names(&self) -> &Arc<[Box<str>]> {
        &self.reporter.names
    }

    /// Exemptions, key, cost and resolver for one request: its [`Ticket`]. `fallback` says
    /// the rate limit has a [`Fallback`](super::Fallback) behind it (denials go to it; known
    /// from the inner service's type, [`Inner::FALLBACK`](super::inner::Inner::FALLBACK)).
    // Always inlined into `call`: the ticket is then built where it is used, not copied out
    // of the returned value.
    #[inline(always)]
    pub(crate) fn prepare<B>(&self, req: &Request<B>, fallback: bool) -> Prepared
    where
        K: KeyExtractor,
        Co: Cost,
        R: Resolve,
    {
        let rules = &self.rules;
        if rules.exempt_preflight && crate::cors::is_preflight(req) {
            return Prepared::Exempt;
        }
        if !rules.exempt_networks.is_empty() && self.network_exempt(req) {
            return Prepared::Exempt;
        }
        let (key, key_error) = match self.key.extract(req) {
            Ok(key) => (key, None),
            // The resolver still runs, with one budget standing in for the missing key, so
            // that it can exempt the request (a health check that sends no API key); if it
            // does not, the key error answers.
            Err(err) => (Key::Global, Some(err)),
        };
        self.diag.watch(req, &key);
        if key_error.is_none() && rules.exempt_keys.contains(&key) {
            return Prepared::Exempt;
        }
        let cost = self.cost.cost(req);
        let mut plan = Plan::new(&self.reporter.names, &key, cost);
        self.resolver.resolve(req, &mut plan);
        let (entries, exempt, error) = plan.finish();
        // Only an explicit exemption lets a request without a key through: a resolver that
        // charges nothing for the stand-in key must not open a bypass.
        if exempt && key_error.is_some() {
            return Prepared::Exempt;
        }
        if let Some(err) = key_error.or(error) {
            let rejection = self.reporter.rejection.as_deref();
            return Prepared::Failed(
                Answer::key_error(&err, rejection),
                self.refusal(req, fallback),
            );
        }
        if exempt || entries.is_empty() {
            return Prepared::Exempt;
        }
        Prepared::Charge(Ticket {
            pk: self.reporter.pk(&key),
            charges: Applied { key, entries },
            deadline: None,
            refusal: self.refusal(req, fallback),
        })
    }

    /// Where a refusal of `req` goes: to the fallback (denials only) or an answer, in gRPC
    /// form for a gRPC call to a layer that serves gRPC.
    #[inline]
    fn refusal<B>(&self, req: &Request<B>, fallback: bool) -> Refusal {
        Refusal {
            fallback,
            grpc: self
                .reporter
                .grpc_call(req.version(), req.headers())
                .is_some(),
        }
    }

    /// Counts a final decision in the metrics and writes its DEBUG event (target
    /// `ratekeeper::decision`; nothing but the level check when DEBUG is off).
    #[inline]
    fn record(&self, applied: &Applied, decisions: &Decisions) {
        self.meter.record(applied, decisions);
        if tracing::enabled!(target: DECISION_TARGET, tracing::Level::DEBUG) {
            self.diag
                .decision(self.names(), applied, decisions, self.mode);
        }
    }

    fn insert_info(&self, applied: &Applied, decisions: &Decisions, extensions: &mut Extensions) {
        extensions.insert(Info::new(
            self.names().clone(),
            applied.indices(),
            decisions.clone(),
        ));
    }

    /// The name of the policy whose decision the headers report.
    fn deciding_name(&self, applied: &Applied, decisions: &Decisions) -> &str {
        decisions
            .deciding()
            .and_then(|i| applied.entries.get(i))
            .and_then(|e| self.names().get(e.index as usize))
            .map_or("", |n| &**n)
    }

    /// Each ban this answer started: counted ([`BANS_TOTAL`](crate::metrics::BANS_TOTAL)) and
    /// logged at INFO, target `ratekeeper`, with the policy, the key (hashed unless raw keys
    /// were asked for) and how long the ban lasts. A store reports a ban's start once, so
    /// this runs once per ban, whatever the mode does with the request.
    #[cold]
    #[inline(never)]
    fn note_bans(&self, applied: &Applied, decisions: &Decisions) {
        for (entry, decision) in applied.entries.iter().zip(decisions.as_slice()) {
            if !decision.starts_ban() {
                continue;
            }
            let index = entry.index as usize;
            self.meter.ban(index);
            let policy = self.names().get(index).map_or("", |n| &**n);
            let key = self
                .diag
                .key_text(entry.key.as_ref().unwrap_or(&applied.key));
            let seconds = decision.retry_after().map_or(0, ratekeeper_core::ceil_secs);
            tracing::info!(
                target: "ratekeeper",
                policy,
                key,
                seconds,
                "key banned: the policy refused it as often as its ban allows; every request \
                 of the key under this policy is refused for {seconds} s"
            );
        }
    }

    /// The "cost can never fit" warning, once per layer (every other denial, and the later
    /// cannot-fit ones, are DEBUG events).
    #[inline]
    fn log_denial(&self, applied: &Applied, decisions: &Decisions) {
        if decisions.is_cannot_fit() {
            self.log_cannot_fit(applied, decisions);
        }
    }

    #[cold]
    #[inline(never)]
    fn log_cannot_fit(&self, applied: &Applied, decisions: &Decisions) {
        let (key, cost) = denied_charge(applied, decisions);
        let policy = self.deciding_name(applied, decisions);
        let key = self.diag.key_text(key);
        if self.diag.first_cannot_fit() {
            tracing::warn!(
                key,
                cost,
                policy,
                "request cost is larger than the policy's burst; it can never be allowed \
                 (logged once per layer; later ones at DEBUG)"
            );
        } else {
            tracing::debug!(key, cost, policy, "request cost can never fit the burst");
        }
    }
}

impl<K, Co, St, R> Limiter<K, Co, St, R>
where
    St: Store<Key>,
{
    /// The store call for a new request: [`Mode::Delay`] reserves (it needs tokio's timer to
    /// wait; without a runtime it checks, and a denied request is rejected), the other modes
    /// check.
    #[inline]
    pub(crate) fn check(&self, applied: &Applied) -> Checked<St::Future> {
        let one;
        let many;
        let charges: &[Charge<'_, Key>] = match applied.single_charge(&self.ids) {
            Some(charge) => {
                one = [charge];
                &one
            }
            None => {
                many = applied.charges(&self.ids);
                &many
            }
        };
        match self.mode {
            Mode::Delay { max_wait } if tokio::runtime::Handle::try_current().is_ok() => {
                self.store.reserve(charges, max_wait)
            }
            _ => self.store.check(charges),
        }
    }

    /// A Delay-mode reservation: counted (allowed) now, the request waits for its turn.
    #[cold]
    fn reserved(
        &self,
        ticket: &Ticket,
        decisions: &Decisions,
        extensions: &mut Extensions,
    ) -> Verdict {
        self.record(&ticket.charges, decisions);
        if tokio::runtime::Handle::try_current().is_err() {
            // Cannot wait outside a tokio runtime: give the reservation back and reject.
            self.give_back(ticket, decisions);
            return Verdict::Answer(self.limited(ticket, decisions));
        }
        tracing::debug!(delay = ?decisions.delay(), "delay mode: capacity reserved, waiting for its turn");
        if self.request_info {
            self.insert_info(&ticket.charges, decisions, extensions);
        }
        Verdict::Wait
    }

    #[inline]
    fn denied(
        &self,
        ticket: &Ticket,
        decisions: &Decisions,
        extensions: &mut Extensions,
    ) -> Verdict {
        let applied = &ticket.charges;
        if decisions.starts_ban() {
            self.note_bans(applied, decisions);
        }
        match self.mode {
            Mode::Delay { max_wait } => {
                let now = Instant::now();
                let deadline = ticket
                    .deadline
                    .unwrap_or_else(|| saturating_deadline(now, max_wait));
                // A final denial (the store reserved exactly) cannot pass in time.
                if let Some(wait) = decisions.retry_after() {
                    if !decisions.is_final()
                        && now.checked_add(wait).is_some_and(|at| at <= deadline)
                        && tokio::runtime::Handle::try_current().is_ok()
                    {
                        tracing::debug!(?wait, "delay mode: waiting for capacity");
                        return Verdict::Retry { wait, deadline };
                    }
                }
            }
            Mode::Shadow => {
                self.record(applied, decisions);
                self.log_denial(applied, decisions);
                tracing::debug!(
                    target: "ratekeeper::shadow",
                    policy = self.deciding_name(applied, decisions),
                    "shadow mode: request over the limit let through"
                );
                self.insert_info(applied, decisions, extensions);
                return Verdict::Pass;
            }
            Mode::Reject => {}
        }
        self.record(applied, decisions);
        self.log_denial(applied, decisions);
        if ticket.refusal.fallback {
            self.insert_info(applied, decisions, extensions);
            Verdict::Degrade
        } else {
            Verdict::Answer(self.limited(ticket, decisions))
        }
    }

    /// The 429 for a denial.
    fn limited(&self, ticket: &Ticket, decisions: &Decisions) -> Answer {
        let applied = &ticket.charges;
        let policies = applied.policy_indices();
        let (head, body) =
            self.reporter
                .limited_response(decisions, &policies, ticket.pk.as_deref(), || {
                    self.store.unix_now()
                });
        // Only a gRPC answer names the policy.
        let policy = if ticket.refusal.grpc {
            decisions
                .deciding()
                .and_then(|i| applied.entries.get(i))
                .map(|e| (self.names().clone(), e.index as usize))
        } else {
            None
        };
        Answer { head, body, policy }
    }
}

/// The key and cost of the charge whose decision the headers report (for the logs).
fn denied_charge<'a>(applied: &'a Applied, decisions: &Decisions) -> (&'a Key, u64) {
    let entry = decisions.deciding().and_then(|i| applied.entries.get(i));
    let key = entry.and_then(|e| e.key.as_ref()).unwrap_or(&applied.key);
    (key, entry.map_or(0, |e| e.cost))
}

/// What follows a store that could not decide ([`store_failed`]).
pub(crate) enum StoreFailed {
    /// The request goes on to the inner service (fail open).
    Pass,
    /// The request goes to the fallback ([`FailurePolicy::Degrade`]; without a fallback the
    /// inner service takes it, as for [`StoreFailed::Pass`]).
    Degrade(Degrade),
    /// This answer, the limiter's 503 ([`FailurePolicy::Deny`]: failing closed is not a rate
    /// limit, so not a 429).
    Answer(Answer),
}

/// The store could not decide: its failure policy says whether the request goes on (marked
/// [`StoreDegraded`], for a handler or the fallback to read), to the fallback, or gets the
/// limiter's 503, `unavailable`.
#[cold]
pub(crate) fn store_failed(
    err: &StoreError,
    extensions: &mut Extensions,
    unavailable: &Unavailable,
) -> StoreFailed {
    // `Local` and `FailSoft` are answered inside the store; should one ever reach the layer,
    // it fails open.
    let action = match err.failure_policy() {
        FailurePolicy::Local | FailurePolicy::FailSoft => FailurePolicy::Allow,
        other => other,
    };
    if action == FailurePolicy::Deny {
        tracing::debug!(error = %err, "rate-limit store could not decide; answering 503 (fail closed)");
        return StoreFailed::Answer(Answer::unavailable(unavailable));
    }
    tracing::debug!(error = %err, %action, "rate-limit store could not decide; the request goes on without rate-limit headers");
    extensions.insert(StoreDegraded { action });
    if action == FailurePolicy::Degrade {
        StoreFailed::Degrade(Degrade::store_unavailable())
    } else {
        StoreFailed::Pass
    }
}

/// The limiter as the request path sees it: in `call` statically (the concrete [`Limiter`],
/// inlined), in the response future as a trait object (so the future does not carry the
/// key, cost and resolver types).
pub(crate) trait Erased<SF>: Respond {
    /// The one rule that turns a store's decisions into what happens to the request, for the
    /// memory store (inside `call`) and async stores (from the response future) alike (a
    /// store error goes to [`store_failed`] instead).
    ///
    /// Counts the decision once in `ratekeeper_decisions_total` when the verdict is final
    /// (everything but [`Verdict::Retry`]: a Delay-mode request that re-checks after sleeping
    /// is counted by its last answer only), writes one DEBUG event per decision (target
    /// `ratekeeper::decision`; the layer's first "cost can never fit" case also at WARN;
    /// shadow-mode overruns also at DEBUG, target `ratekeeper::shadow`), marks the request's
    /// `extensions` for the handler ([`Info`]); a denial the fallback answers is
    /// [`Verdict::Degrade`]. The ticket is
    /// only read (so the request path can build it in place): a Delay-mode deadline set at the
    /// first denial comes back in [`Verdict::Retry`].
    fn verdict(
        &self,
        ticket: &Ticket,
        decisions: &Decisions,
        extensions: &mut Extensions,
    ) -> Verdict;
    /// Reserves a waiting request's charges again, for what is left until its deadline
    /// (check-and-retry, for stores or algorithms that cannot reserve).
    fn recheck(&self, ticket: &Ticket) -> Checked<SF>;
    /// Gives back a Delay-mode reservation dropped before it proceeded.
    fn release(&self, ticket: &Ticket, decisions: &Decisions);
    /// This limiter as a settlement holds it.
    fn responder(self: Arc<Self>) -> Arc<dyn Respond>;
    /// The 503 when the store cannot decide and fails closed (see [`store_failed`]).
    fn unavailable(&self) -> &Unavailable;
    /// What the fallback is handed with a request of [`Verdict::Degrade`]: the policy whose
    /// denial the headers report.
    fn degrade(&self, ticket: &Ticket, decisions: &Decisions) -> Degrade;
}

impl<K, Co, St, R> Erased<St::Future> for Limiter<K, Co, St, R>
where
    K: Send + Sync + 'static,
    Co: Send + Sync + 'static,
    St: Store<Key>,
    R: Send + Sync + 'static,
{
    #[inline]
    fn verdict(
        &self,
        ticket: &Ticket,
        decisions: &Decisions,
        extensions: &mut Extensions,
    ) -> Verdict {
        if !decisions.is_allowed() {
            return self.denied(ticket, decisions, extensions);
        }
        if !decisions.delay().is_zero() {
            return self.reserved(ticket, decisions, extensions);
        }
        self.record(&ticket.charges, decisions);
        if self.request_info {
            self.insert_info(&ticket.charges, decisions, extensions);
        }
        Verdict::Pass
    }

    fn recheck(&self, ticket: &Ticket) -> Checked<St::Future> {
        let left = ticket.deadline.map_or(Duration::ZERO, |d| {
            d.saturating_duration_since(Instant::now())
        });
        self.store.reserve(&ticket.charges.charges(&self.ids), left)
    }

    fn release(&self, ticket: &Ticket, decisions: &Decisions) {
        self.give_back(ticket, decisions);
    }

    fn responder(self: Arc<Self>) -> Arc<dyn Respond> {
        self
    }

    fn unavailable(&self) -> &Unavailable {
        &self.unavailable
    }

    #[cold]
    fn degrade(&self, ticket: &Ticket, decisions: &Decisions) -> Degrade {
        Degrade::limited(self.deciding_name(&ticket.charges, decisions))
    }
}

/// `now + max_wait`, or the latest instant the clock can represent when that is beyond it
/// (`Duration::MAX` waits as long as needed, never "not at all").
pub(super) fn saturating_deadline(now: Instant, max_wait: Duration) -> Instant {
    if let Some(deadline) = now.checked_add(max_wait) {
        return deadline;
    }
    // Beyond the clock's range: add the largest halvings of `max_wait` that still fit
    // (each fits at most once more after the previous one failed: about 128 rounds).
    let mut step = max_wait / 2;
    let mut deadline = now;
    while !step.is_zero() {
        match deadline.checked_add(step) {
            Some(later) => deadline = later,
            None => step /= 2,
        }
    }
    deadline
}
