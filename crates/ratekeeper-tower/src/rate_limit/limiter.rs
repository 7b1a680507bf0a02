//! The one owner of the request path: [`Limiter`] builds a request's charges, calls the
//! store, turns the store's answer into a [`Verdict`] (with the metrics and logs of that
//! decision), renders headers and 429s, and settles after the response.
//!
//! Both ways a store answers go through the same [`Limiter::verdict`]: at once (the memory
//! store, inside `call`, statically dispatched and inlined) and later (an async store, from
//! the response future, through the object-safe [`Erased`] face, so the future does not carry
//! the key, cost and resolver types). The response future only moves between states.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE};
use http::{Extensions, HeaderMap, HeaderValue, Request, StatusCode};
use ratekeeper_core::Key;
use ratekeeper_core::store::{
    Charge, Checked, Decisions, FailurePolicy, PolicyId, Store, StoreError,
};
use smallvec::SmallVec;
use tokio::time::Instant;

use super::diag::{DECISION_TARGET, Diagnostics};
use super::meter::Meter;
use super::mode::Mode;
use crate::cost::Cost;
use crate::degraded::{Degrade, StoreDegraded};
use crate::info::Info;
use crate::key::{KeyError, KeyExtractor, PeerIp};
use crate::policy::{AllPolicies, Applied, Plan, Resolve, Rules};
use crate::report::{Reporter, trailers_only};
use crate::usage::{Corrector, Metered, UsageRules};

/// A response the layer writes itself (a 429, a 503 when the store fails closed, or a key
/// error).
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
    /// For a 429: the layer's policy names and the index of the one the headers report, to
    /// name it in a gRPC answer.
    pub(crate) policy: Option<(Arc<[Box<str>]>, usize)>,
}

impl Answer {
    /// A plain-text answer.
    fn text(status: StatusCode, body: Bytes) -> Self {
        let mut headers = HeaderMap::new();
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        Self {
            status,
            headers,
            body,
            policy: None,
        }
    }

    /// This answer as the request can read it: unchanged, or for a gRPC call to a layer that
    /// serves gRPC (`grpc`, from [`Reporter::grpc_call`]) a trailers-only response with the
    /// matching gRPC status (see [`trailers_only`]). Called on the answer path only.
    pub(crate) fn for_request(mut self, grpc: Option<HeaderValue>) -> Self {
        let Some(content_type) = grpc else {
            return self;
        };
        let policy = self
            .policy
            .as_ref()
            .and_then(|(names, i)| names.get(*i))
            .map(|n| &**n);
        let (status, body) = trailers_only(
            self.status,
            &mut self.headers,
            &self.body,
            policy,
            content_type,
        );
        self.status = status;
        self.body = body;
        self
    }

    /// The answer to a request the layer could not key (`400` for a missing key, `500` for a
    /// misconfiguration, with an error log line).
    pub(crate) fn key_error(err: &KeyError) -> Self {
        let status = err.status();
        let message = if status.is_server_error() {
            tracing::error!(error = %err, "rate limiter cannot key the request");
            "rate limiter misconfigured: no key for this request\n".to_owned()
        } else {
            tracing::debug!(error = %err, "request has no rate-limit key");
            format!("{err}\n")
        };
        Self::text(status, Bytes::from(message))
    }

    /// What a response future answers when polled after it completed.
    pub(crate) fn polled_after_completion() -> Self {
        Self::text(
            StatusCode::INTERNAL_SERVER_ERROR,
            Bytes::from_static(b"response future polled after completion\n"),
        )
    }
}

/// What the headers of one response report: the decisions, the charges they came from (to
/// name the policies and settle after the response) and the hashed partition key.
#[derive(Debug)]
pub(crate) struct Reported {
    pub(crate) decisions: Decisions,
    pub(crate) applied: Applied,
    pub(crate) pk: Option<Arc<str>>,
}

/// What the layer does with a request once the store decided. Every verdict but
/// [`Verdict::Retry`] is final and was counted once in `ratekeeper_decisions_total`. The
/// decisions stay with the caller (moving them through the verdict copied some 150 bytes
/// twice per request).
#[derive(Debug)]
pub(crate) enum Verdict {
    /// Call the inner service; report the decisions on its response and settle after it.
    Pass,
    /// Answer without calling the inner service.
    Answer(Answer),
    /// [`Mode::Delay`], reserved: already charged; sleep [`Decisions::delay`], then pass with
    /// the decisions without a second check. A drop before then gives the charges back.
    Wait,
    /// [`Mode::Delay`], check-and-retry: nothing is held; sleep this long, then reserve again.
    Retry(Duration),
}

/// What the layer does before the store: exempt, fail, or charge.
pub(crate) enum Prepared {
    /// Not limited: straight to the inner service, no headers.
    Exempt,
    /// No key could be found.
    Failed(KeyError),
    /// Check these charges.
    Charge(Applied),
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
}

impl<K, Co, St, R> Limiter<K, Co, St, R> {
    /// The layer's policy names, in the order they were added.
    pub(crate) fn names(&self) -> &Arc<[Box<str>]> {
        &self.reporter.names
    }

    /// Exemptions, key, cost and resolver for one request: its charges.
    #[inline]
    pub(crate) fn prepare<B>(&self, req: &Request<B>) -> Prepared
    where
        K: KeyExtractor,
        Co: Cost,
        R: Resolve,
    {
        let rules = &self.rules;
        if rules.exempt_preflight && crate::cors::is_preflight(req) {
            return Prepared::Exempt;
        }
        if !rules.exempt_networks.is_empty() {
            if let Some(peer) = PeerIp::peer_addr(req) {
                let ip = crate::key::normalize_ip(peer.ip(), &rules.nat64);
                if rules.exempt_networks.iter().any(|n| n.contains(&ip)) {
                    return Prepared::Exempt;
                }
            }
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
        if let Some(err) = key_error {
            // Only an explicit exemption lets a request without a key through: a resolver
            // that charges nothing for the stand-in key must not open a bypass.
            return if exempt {
                Prepared::Exempt
            } else {
                Prepared::Failed(err)
            };
        }
        if let Some(err) = error {
            return Prepared::Failed(err);
        }
        if exempt || entries.is_empty() {
            return Prepared::Exempt;
        }
        Prepared::Charge(Applied { key, entries })
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

    /// The `pk` parameter of the IETF headers for this request's key.
    #[inline]
    pub(crate) fn pk(&self, applied: &Applied) -> Option<Arc<str>> {
        self.reporter.pk(&applied.key)
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

    /// Reserves a waiting request's charges again, waiting at most `max_wait`
    /// (check-and-retry, for stores or algorithms that cannot reserve).
    pub(crate) fn recheck(&self, applied: &Applied, max_wait: Duration) -> Checked<St::Future> {
        self.store.reserve(&applied.charges(&self.ids), max_wait)
    }

    /// The one rule that turns a store's decisions into what happens to the request, for
    /// the memory store (inside `call`) and async stores (from the response future) alike
    /// (a store error goes to [`store_failed`] instead).
    ///
    /// Counts the decision once in `ratekeeper_decisions_total` when the verdict is final
    /// (everything but [`Verdict::Retry`]: a Delay-mode request that re-checks after sleeping
    /// is counted by its last answer only), writes one DEBUG event per decision (target
    /// `ratekeeper::decision`; the layer's first "cost can never fit" case also at WARN;
    /// shadow-mode overruns also at DEBUG, target `ratekeeper::shadow`), and marks
    /// the request's `extensions` for what comes after it ([`Info`], the fallback marker,
    /// [`StoreDegraded`]). `deadline` is the request's Delay-mode deadline (set at its first
    /// denial); `degrade` says the inner service is a fallback.
    #[inline]
    pub(crate) fn verdict(
        &self,
        applied: &Applied,
        pk: Option<&str>,
        decisions: &Decisions,
        deadline: &mut Option<Instant>,
        degrade: bool,
        extensions: &mut Extensions,
    ) -> Verdict {
        if !decisions.is_allowed() {
            return self.denied(applied, pk, decisions, deadline, degrade, extensions);
        }
        if !decisions.delay().is_zero() {
            return self.reserved(applied, pk, decisions, extensions);
        }
        self.record(applied, decisions);
        if self.request_info {
            self.insert_info(applied, decisions, extensions);
        }
        Verdict::Pass
    }

    fn insert_info(&self, applied: &Applied, decisions: &Decisions, extensions: &mut Extensions) {
        extensions.insert(Info::new(
            self.names().clone(),
            applied.indices(),
            decisions.clone(),
        ));
    }

    /// A Delay-mode reservation: counted (allowed) now, the request waits for its turn.
    #[cold]
    fn reserved(
        &self,
        applied: &Applied,
        pk: Option<&str>,
        decisions: &Decisions,
        extensions: &mut Extensions,
    ) -> Verdict {
        self.record(applied, decisions);
        if tokio::runtime::Handle::try_current().is_err() {
            // Cannot wait outside a tokio runtime: give the reservation back and reject.
            self.release(applied, decisions);
            return Verdict::Answer(self.limited(applied, pk, decisions));
        }
        tracing::debug!(delay = ?decisions.delay(), "delay mode: capacity reserved, waiting for its turn");
        if self.request_info {
            self.insert_info(applied, decisions, extensions);
        }
        Verdict::Wait
    }

    #[inline]
    fn denied(
        &self,
        applied: &Applied,
        pk: Option<&str>,
        decisions: &Decisions,
        deadline: &mut Option<Instant>,
        degrade: bool,
        extensions: &mut Extensions,
    ) -> Verdict {
        match self.mode {
            Mode::Delay { max_wait } => {
                let now = Instant::now();
                let deadline = *deadline.get_or_insert_with(|| saturating_deadline(now, max_wait));
                // A final denial (the store reserved exactly) cannot pass in time.
                if let Some(wait) = decisions.retry_after() {
                    if !decisions.is_final()
                        && now.checked_add(wait).is_some_and(|at| at <= deadline)
                        && tokio::runtime::Handle::try_current().is_ok()
                    {
                        tracing::debug!(?wait, "delay mode: waiting for capacity");
                        return Verdict::Retry(wait);
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
        if degrade {
            extensions.insert(Degrade::limited(self.deciding_name(applied, decisions)));
            self.insert_info(applied, decisions, extensions);
            Verdict::Pass
        } else {
            Verdict::Answer(self.limited(applied, pk, decisions))
        }
    }

    /// The name of the policy whose decision the headers report.
    fn deciding_name(&self, applied: &Applied, decisions: &Decisions) -> &str {
        decisions
            .deciding()
            .and_then(|i| applied.entries.get(i))
            .and_then(|e| self.names().get(e.index as usize))
            .map_or("", |n| &**n)
    }

    /// The "cost can never fit" warning, once per layer (every other denial, and the later
    /// cannot-fit ones, are DEBUG events).
    fn log_denial(&self, applied: &Applied, decisions: &Decisions) {
        if decisions.is_cannot_fit() {
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

    /// The 429 for a denial.
    fn limited(&self, applied: &Applied, pk: Option<&str>, decisions: &Decisions) -> Answer {
        let policies = applied.policy_indices();
        let (status, headers, body) = self
            .reporter
            .limited(decisions, &policies, pk, || self.store.unix_now());
        let deciding = decisions
            .deciding()
            .and_then(|i| applied.entries.get(i))
            .map(|e| e.index as usize);
        Answer {
            status,
            headers,
            body,
            policy: deciding.map(|i| (self.names().clone(), i)),
        }
    }

    /// Adds the rate-limit headers of `reported` to a response.
    #[inline]
    pub(crate) fn headers(&self, reported: &Reported, headers: &mut HeaderMap) {
        // Only the IETF fields and several policies need the list.
        let policies: SmallVec<[usize; 2]> = if self.reporter.needs_policy_indices() {
            reported.applied.policy_indices()
        } else {
            SmallVec::new()
        };
        self.reporter.headers(
            &reported.decisions,
            &policies,
            reported.pk.as_deref(),
            || self.store.unix_now(),
            headers,
        );
    }

    /// Settles after the response: gives back the charges a policy's settle rule refunds for
    /// `status`, each with the receipt its decision carried (so a charge whose window closed
    /// or that the bucket drained gives back nothing).
    #[inline]
    pub(crate) fn settle(&self, reported: &Reported, status: StatusCode) {
        let applied = &reported.applied;
        let refunds = applied.refunds(&self.rules, &self.ids, &reported.decisions, status);
        if !refunds.is_empty() {
            tracing::debug!(key = self.diag.key_text(&applied.key), %status, "refunding rate-limit charge after the response");
            self.store.refund(&refunds);
        }
    }

    /// Gives back a Delay-mode reservation dropped before it proceeded, as far as the
    /// receipts in `decisions` say its charges still hold (never a later reservation's slot).
    pub(crate) fn release(&self, applied: &Applied, decisions: &Decisions) {
        tracing::debug!(
            key = self.diag.key_text(&applied.key),
            "refunding a dropped delay-mode reservation"
        );
        self.store
            .refund(&applied.all_refunds(&self.ids, decisions));
    }

    /// At the response head, for a layer with usage rules: corrects the charges a response
    /// header settles, and returns what the body must carry for the charges a trailer or
    /// the body settles (taking the charges out of `reported`, which is settled then).
    #[cold]
    fn meter(
        self: Arc<Self>,
        reported: &mut Reported,
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
        let started = self
            .usage
            .start(&reported.applied, &reported.decisions, refunded, head);
        if !started.now.is_empty() {
            let receipts: SmallVec<[_; 2]> = reported.decisions.receipts().collect();
            self.correct(&reported.applied, &receipts, &started.now);
        }
        if !started.counts_body() {
            return None;
        }
        let applied = std::mem::take(&mut reported.applied);
        let metered = started.into_metered(self, applied, &reported.decisions);
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
        let corrections = crate::usage::corrections(applied, &self.ids, receipts, actuals);
        if corrections.is_empty() {
            return;
        }
        tracing::debug!(
            target: crate::usage::USAGE_TARGET,
            key = self.diag.key_text(&applied.key),
            corrections = ?corrections.iter().map(|c| (c.charge.cost, c.actual)).collect::<SmallVec<[_; 2]>>(),
            "settling rate-limit charges to their true cost (estimate, actual)"
        );
        self.store.correct(&corrections);
    }
}

/// The key and cost of the charge whose decision the headers report (for the logs).
fn denied_charge<'a>(applied: &'a Applied, decisions: &Decisions) -> (&'a Key, u64) {
    let entry = decisions.deciding().and_then(|i| applied.entries.get(i));
    let key = entry.and_then(|e| e.key.as_ref()).unwrap_or(&applied.key);
    (key, entry.map_or(0, |e| e.cost))
}

/// The store could not decide: its failure policy says whether the request goes on (marked
/// [`StoreDegraded`], for a fallback or handler to read) or gets a 503
/// ([`FailurePolicy::Deny`]: failing closed is not a rate limit, so not a 429).
///
/// `None`: the request goes on (fail open or degrade); `Some`: the 503 to answer with.
#[cold]
pub(crate) fn store_failed(err: &StoreError, extensions: &mut Extensions) -> Option<Answer> {
    // `Local` and `FailSoft` are answered inside the store; should one ever reach the layer,
    // it fails open.
    let action = match err.failure_policy() {
        FailurePolicy::Local | FailurePolicy::FailSoft => FailurePolicy::Allow,
        other => other,
    };
    if action == FailurePolicy::Deny {
        tracing::debug!(error = %err, "rate-limit store could not decide; answering 503 (fail closed)");
        let mut answer = Answer::text(
            StatusCode::SERVICE_UNAVAILABLE,
            Bytes::from_static(b"rate limiter unavailable\n"),
        );
        answer
            .headers
            .insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
        return Some(answer);
    }
    tracing::debug!(error = %err, %action, "rate-limit store could not decide; the request goes on without rate-limit headers");
    extensions.insert(StoreDegraded { action });
    None
}

/// The limiter as the response future sees it after `call` returned: the same functions,
/// without the key, cost and resolver types.
pub(crate) trait Erased<SF>: Send + Sync {
    /// [`Limiter::verdict`].
    fn verdict(
        &self,
        applied: &Applied,
        pk: Option<&str>,
        decisions: &Decisions,
        deadline: &mut Option<Instant>,
        degrade: bool,
        extensions: &mut Extensions,
    ) -> Verdict;
    /// [`Limiter::recheck`].
    fn recheck(&self, applied: &Applied, max_wait: Duration) -> Checked<SF>;
    /// [`Limiter::release`].
    fn release(&self, applied: &Applied, decisions: &Decisions);
    /// [`Limiter::settle`], then [`Limiter::headers`]; `true` when the layer settles some
    /// policy from the response ([`Erased::meter`] then).
    fn respond(&self, reported: &Reported, parts: &mut http::response::Parts) -> bool;
    /// [`Limiter::meter`].
    fn meter(
        self: Arc<Self>,
        reported: &mut Reported,
        head: &http::response::Parts,
    ) -> Option<Box<Metered>>;
    /// [`Limiter::settle`] without a response (see [`NO_RESPONSE`] and [`FAILED`]).
    fn settle_status(&self, reported: &Reported, status: StatusCode);
    /// [`Reporter::grpc_call`].
    fn grpc_call(&self, version: http::Version, headers: &HeaderMap) -> Option<HeaderValue>;
}

/// The status a charge is settled with when the response future is dropped before the inner
/// service answered (the client went away): `499`, nginx's "client closed request". So
/// `Settle::COUNT_UNAUTHORIZED` gives the charge back (it was no `401`) and
/// `Settle::REFUND_SERVER_ERRORS` keeps it (the server did not fail).
pub(crate) const NO_RESPONSE: u16 = 499;
/// The status a charge is settled with when the inner service returned an error instead of a
/// response: `500`, as hyper answers such a request.
pub(crate) const FAILED: u16 = 500;

impl<K, Co, St, R> Erased<St::Future> for Limiter<K, Co, St, R>
where
    K: Send + Sync + 'static,
    Co: Send + Sync + 'static,
    St: Store<Key>,
    R: Send + Sync + 'static,
{
    fn verdict(
        &self,
        applied: &Applied,
        pk: Option<&str>,
        decisions: &Decisions,
        deadline: &mut Option<Instant>,
        degrade: bool,
        extensions: &mut Extensions,
    ) -> Verdict {
        Limiter::verdict(self, applied, pk, decisions, deadline, degrade, extensions)
    }

    fn recheck(&self, applied: &Applied, max_wait: Duration) -> Checked<St::Future> {
        Limiter::recheck(self, applied, max_wait)
    }

    fn release(&self, applied: &Applied, decisions: &Decisions) {
        Limiter::release(self, applied, decisions);
    }

    fn respond(&self, reported: &Reported, parts: &mut http::response::Parts) -> bool {
        self.settle(reported, parts.status);
        self.headers(reported, &mut parts.headers);
        !self.usage.is_empty()
    }

    fn meter(
        self: Arc<Self>,
        reported: &mut Reported,
        head: &http::response::Parts,
    ) -> Option<Box<Metered>> {
        Limiter::meter(self, reported, head)
    }

    fn grpc_call(&self, version: http::Version, headers: &HeaderMap) -> Option<HeaderValue> {
        self.reporter.grpc_call(version, headers)
    }

    fn settle_status(&self, reported: &Reported, status: StatusCode) {
        self.settle(reported, status);
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
