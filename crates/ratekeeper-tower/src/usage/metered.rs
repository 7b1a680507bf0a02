//! The settlement of a response whose cost follows it: the rules (which policy is settled
//! from where), the corrections a response head settles at once (a header), and
//! [`Metered`], what a response body carries until it ends (a trailer, a [`Tally`]).

use std::fmt;
use std::sync::Arc;

use http::{HeaderMap, HeaderName};
use ratekeeper_core::Key;
use ratekeeper_core::store::{Charge, Correction, Decisions, PolicyId, Receipt};
use smallvec::SmallVec;

use super::{BodyEvent, Source, Tally, Usage};
use crate::policy::Applied;

/// The `tracing` target of the usage events (a kept estimate, a correction).
pub(crate) const USAGE_TARGET: &str = "ratekeeper::usage";

/// Settles charges to their true cost (the rate limit's store, behind an `Arc` that a
/// response body can hold until it ends).
pub(crate) trait Corrector: Send + Sync + 'static {
    /// Corrects the charges of `applied` at the entries in `actuals` (entry index, true
    /// cost), each with the receipt at the same index of `receipts`.
    fn correct(&self, applied: &Applied, receipts: &[Receipt], actuals: &[(usize, u64)]);
}

/// The store corrections for `actuals`, each true cost capped by [`UsageRules::cap`]: a charge
/// whose (capped) true cost equals its estimate is left alone.
pub(crate) fn corrections<'a>(
    applied: &'a Applied,
    ids: &[PolicyId],
    rules: &UsageRules,
    receipts: &[Receipt],
    actuals: &[(usize, u64)],
) -> SmallVec<[Correction<'a, Key>; 2]> {
    let mut out = SmallVec::new();
    for &(i, actual) in actuals {
        let Some(e) = applied.entries.get(i) else {
            continue;
        };
        let Some(&id) = ids.get(e.index as usize) else {
            continue;
        };
        let actual = actual.min(rules.cap(e.index, e.cost));
        if actual == e.cost {
            continue;
        }
        let receipt = receipts.get(i).copied().unwrap_or(Receipt::NONE);
        let charge = Charge::new(id, e.key.as_ref().unwrap_or(&applied.key), e.cost);
        out.push(Correction::new(charge, receipt, actual));
    }
    out
}

/// Which policies a layer settles from the response, and from where (by policy index).
#[derive(Clone, Default)]
pub(crate) struct UsageRules {
    by_policy: SmallVec<[(u32, Usage); 1]>,
    /// Per settled policy (by index): the most a true cost is charged, the policy's
    /// capacity (see [`UsageRules::cap`]).
    caps: SmallVec<[(u32, u64); 1]>,
}

impl fmt::Debug for UsageRules {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.by_policy.iter().map(|(i, u)| (i, u)))
            .finish()
    }
}

/// What a response head settles: corrections to make now (header sources), and the counts a
/// body must carry until it ends.
pub(crate) struct Started {
    pub(crate) now: SmallVec<[(usize, u64); 2]>,
    counts: SmallVec<[Count; 1]>,
}

impl UsageRules {
    /// Whether no policy is settled from the response (the common case: one branch per
    /// response).
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.by_policy.is_empty()
    }

    /// Settles the policy at `index` from `usage` (the last rule given for a policy wins);
    /// `capacity` is the policy's capacity ([`Policy::capacity`](ratekeeper_core::Policy::capacity)).
    pub(crate) fn set(&mut self, index: u32, usage: Usage, capacity: u32) {
        match self.by_policy.iter_mut().find(|(i, _)| *i == index) {
            Some(rule) => rule.1 = usage,
            None => self.by_policy.push((index, usage)),
        }
        if !self.caps.iter().any(|(i, _)| *i == index) {
            self.caps.push((index, u64::from(capacity)));
        }
    }

    /// The most a true cost reported for the policy at `index` is charged: its capacity (a
    /// full bucket or window), or the estimate when that is larger. A response that reports
    /// more (a bug, or a value passed through from elsewhere) is charged this much, so one
    /// response can empty a key's budget but never lock the key out for longer than the
    /// policy takes to refill it whole.
    pub(crate) fn cap(&self, index: u32, estimate: u64) -> u64 {
        self.caps
            .iter()
            .find(|(i, _)| *i == index)
            .map_or(u64::MAX, |&(_, cap)| cap)
            .max(estimate)
    }

    /// At the response head: the true cost of each charge settled by a header, and a
    /// counter for each charge settled by a trailer or the body. Skipped: charges the store
    /// denied (they took nothing) and charges `refunded` says a settle rule gave back.
    pub(crate) fn start(
        &self,
        applied: &Applied,
        decisions: &Decisions,
        refunded: impl Fn(u32) -> bool,
        head: &http::response::Parts,
    ) -> Started {
        let mut started = Started {
            now: SmallVec::new(),
            counts: SmallVec::new(),
        };
        for (i, e) in applied.entries.iter().enumerate() {
            let Some((_, usage)) = self.by_policy.iter().find(|(p, _)| *p == e.index) else {
                continue;
            };
            let allowed = decisions.as_slice().get(i).is_some_and(|d| d.is_allowed());
            if !allowed || refunded(e.index) {
                continue;
            }
            match &usage.source {
                Source::Header(name) => {
                    let actual = match decimal(&head.headers, name) {
                        Some(actual) => actual,
                        None => {
                            kept(name, "response header", e.cost);
                            e.cost
                        }
                    };
                    started.now.push((i, actual));
                }
                Source::Trailer(name) => started.counts.push(Count {
                    entry: i,
                    estimate: e.cost,
                    how: Counting::Trailer {
                        name: name.clone(),
                        value: None,
                    },
                }),
                Source::Body(start) => started.counts.push(Count {
                    entry: i,
                    estimate: e.cost,
                    how: Counting::Body {
                        tally: start(head),
                        so_far: 0,
                    },
                }),
            }
        }
        started
    }
}

impl Started {
    /// Whether a body must count (a trailer or tally source).
    pub(crate) fn counts_body(&self) -> bool {
        !self.counts.is_empty()
    }

    /// The settlement a body carries: `applied` (taken from the request's report) with the
    /// receipts of its decisions.
    pub(crate) fn into_metered(
        self,
        corrector: Arc<dyn Corrector>,
        applied: Applied,
        decisions: &Decisions,
    ) -> Metered {
        Metered {
            corrector,
            receipts: decisions.receipts().collect(),
            applied,
            counts: self.counts,
            settled: false,
        }
    }
}

/// The header or trailer `name` of `fields` as a decimal count, `None` when missing or
/// garbled: not digits only, or the field repeated (two counts, neither to be trusted over
/// the other). A count too large for `u64` is `u64::MAX`, which the charge caps like any
/// other count above the policy's capacity.
fn decimal(fields: &HeaderMap, name: &HeaderName) -> Option<u64> {
    let mut values = fields.get_all(name).iter();
    let value = values.next()?;
    if values.next().is_some() {
        return None;
    }
    let text = value.to_str().ok()?.trim();
    // `u64::from_str` takes a leading `+`; a count is digits only.
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // Digits only, so the parse fails only when the count overflows.
    Some(text.parse().unwrap_or(u64::MAX))
}

/// The DEBUG event of a missing or garbled header or trailer.
fn kept(name: &HeaderName, what: &str, estimate: u64) {
    tracing::debug!(
        target: USAGE_TARGET,
        field = %name,
        estimate,
        "{what} with the usage is missing, repeated or not a decimal count; the estimate is kept"
    );
}

/// One charge a body settles.
struct Count {
    /// Its index in the request's charges.
    entry: usize,
    estimate: u64,
    how: Counting,
}

enum Counting {
    Trailer {
        name: HeaderName,
        value: Option<u64>,
    },
    Body {
        tally: Box<dyn Tally>,
        so_far: u64,
    },
}

/// The settlement a response body carries until it ends: its charges, their receipts and
/// what counts their true cost. Settled exactly once: at the body's end, error, or drop
/// (see [`BodyEvent`]).
pub(crate) struct Metered {
    corrector: Arc<dyn Corrector>,
    applied: Applied,
    receipts: SmallVec<[Receipt; 2]>,
    counts: SmallVec<[Count; 1]>,
    settled: bool,
}

impl fmt::Debug for Metered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metered")
            .field("charges", &self.applied.entries.len())
            .field("counts", &self.counts.len())
            .field("settled", &self.settled)
            .finish_non_exhaustive()
    }
}

impl Metered {
    /// One data frame of the body.
    pub(crate) fn data(&mut self, data: &[u8]) {
        for count in &mut self.counts {
            if let Counting::Body { tally, so_far } = &mut count.how {
                *so_far = tally.count(BodyEvent::Data(data));
            }
        }
    }

    /// The body's trailers.
    pub(crate) fn trailers(&mut self, trailers: &HeaderMap) {
        for count in &mut self.counts {
            match &mut count.how {
                Counting::Trailer { name, value } => *value = decimal(trailers, name),
                Counting::Body { tally, so_far } => {
                    *so_far = tally.count(BodyEvent::Trailers(trailers));
                }
            }
        }
    }

    /// Settles the charges once (`end` is [`BodyEvent::End`], [`BodyEvent::Error`] or
    /// [`BodyEvent::Dropped`]); later calls do nothing.
    pub(crate) fn finish(&mut self, end: BodyEvent<'_>) {
        if std::mem::replace(&mut self.settled, true) {
            return;
        }
        let mut actuals: SmallVec<[(usize, u64); 2]> = SmallVec::new();
        for count in &mut self.counts {
            let actual = match &mut count.how {
                Counting::Trailer { name, value } => value.unwrap_or_else(|| {
                    kept(name, "response trailer", count.estimate);
                    count.estimate
                }),
                Counting::Body { tally, .. } => tally.count(end),
            };
            actuals.push((count.entry, actual));
        }
        self.corrector
            .correct(&self.applied, &self.receipts, &actuals);
    }

    /// Gives up counting: the charges keep their estimates.
    pub(crate) fn keep_estimates(&mut self) {
        self.settled = true;
    }
}

impl Drop for Metered {
    fn drop(&mut self) {
        self.finish(BodyEvent::Dropped);
    }
}
