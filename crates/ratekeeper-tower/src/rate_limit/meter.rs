//! `metrics` of a rate limit's decisions: counters by policy and outcome, the usage
//! histogram by policy, and the shadow-mode counters.

use std::sync::{Arc, OnceLock};

use metrics::{Counter, Histogram};
use ratekeeper_core::Outcome;
use ratekeeper_core::store::Decisions;

use crate::policy::Applied;

/// The counter's name: one count per charged policy per decision, labels `policy` (the
/// policy's name) and `outcome` (`allowed`, `denied`, or `cannot_fit` for a cost larger than
/// the burst). Each policy's own decision is counted: with several policies, a request one
/// of them denies counts as allowed for the others, which were not charged (all or
/// nothing). Every request is counted once, by the decision that settled what happens to it,
/// whether the store answered at once or later: shadow-mode overruns and requests a fallback
/// answers as denied (so a shadow rollout shows how many requests a limit would deny), a
/// [`Mode::Delay`](super::Mode::Delay) reservation as allowed when it is made, a Delay-mode
/// request that re-checks after sleeping by its last answer only.
pub const DECISIONS_TOTAL: &str = "ratekeeper_decisions_total";

/// The usage histogram's name: for every charged policy of every decision, the share of the
/// policy's capacity the key had used once it was checked, `(limit - remaining) / limit`
/// (`limit` and `remaining` as in the rate-limit headers: the capacity
/// ([`Policy::capacity`](ratekeeper_core::Policy::capacity)) and the units left after the
/// decision), from `0.0` (untouched) to `1.0` (nothing left), label `policy`. Its p99 near
/// 1.0 says the busiest clients live at the limit; near 0 says the limit is far above the
/// traffic. Recorded in every mode.
pub const USAGE_RATIO: &str = "ratekeeper_usage_ratio";

/// In [`Mode::Shadow`](super::Mode::Shadow) only: every decision of a charged policy
/// (label `policy`). With [`SHADOW_WOULD_REFUSE_TOTAL`], the share of requests the policy
/// would refuse: `rate(ratekeeper_shadow_would_refuse_total[5m]) /
/// rate(ratekeeper_shadow_checked_total[5m])`.
pub const SHADOW_CHECKED_TOTAL: &str = "ratekeeper_shadow_checked_total";

/// In [`Mode::Shadow`](super::Mode::Shadow) only: decisions the policy denied, which the
/// layer let through (label `policy`; a cost that can never fit counts too).
pub const SHADOW_WOULD_REFUSE_TOTAL: &str = "ratekeeper_shadow_would_refuse_total";

/// One count per ban a policy starts (label `policy`): a key the policy refused as often as
/// its [`Ban`](ratekeeper_core::Ban) allows is now refused for the ban's duration. Counted
/// once per ban, by the request whose refusal started it (not per request the ban refuses),
/// in every mode (in [`Mode::Shadow`](super::Mode::Shadow) the store bans, the layer lets the
/// requests through). Each ban is also logged at INFO, target `ratekeeper`.
pub const BANS_TOTAL: &str = "ratekeeper_bans_total";

/// Per policy, one counter handle per outcome, registered with the `metrics` recorder the
/// first time that policy has that outcome (so a recorder installed after the layer was
/// built, but before traffic, still gets every count). Counting costs a load and a branch
/// when no recorder is installed.
pub(crate) struct Meter {
    names: Arc<[Box<str>]>,
    counters: Box<[[OnceLock<Counter>; 4]]>,
    usage: Box<[OnceLock<Histogram>]>,
    /// Shadow mode: `[checked, would refuse]` per policy (`None` in other modes).
    shadow: Option<Box<[[OnceLock<Counter>; 2]]>>,
    /// [`BANS_TOTAL`] per policy.
    bans: Box<[OnceLock<Counter>]>,
}

impl Meter {
    pub(crate) fn new(names: Arc<[Box<str>]>, shadow: bool) -> Self {
        let counters = names.iter().map(|_| Default::default()).collect();
        let usage = names.iter().map(|_| OnceLock::new()).collect();
        let shadow = shadow.then(|| names.iter().map(|_| Default::default()).collect());
        let bans = names.iter().map(|_| OnceLock::new()).collect();
        Self {
            names,
            counters,
            usage,
            shadow,
            bans,
        }
    }

    /// Counts a ban started by the policy at `index` ([`BANS_TOTAL`]).
    #[cold]
    pub(crate) fn ban(&self, index: usize) {
        if let (Some(slot), Some(name)) = (self.bans.get(index), self.names.get(index)) {
            slot.get_or_init(|| metrics::counter!(BANS_TOTAL, "policy" => name.to_string()))
                .increment(1);
        }
    }

    /// Counts the decision of every policy `applied` charged, records its usage and, in
    /// shadow mode, the shadow counters.
    #[inline]
    pub(crate) fn record(&self, applied: &Applied, decisions: &Decisions) {
        for (entry, decision) in applied.entries.iter().zip(decisions.as_slice()) {
            let index = entry.index as usize;
            if let (Some(slot), Some(name)) = (self.usage.get(index), self.names.get(index)) {
                let limit = decision.limit();
                if limit > 0 {
                    let used = f64::from(limit.saturating_sub(decision.remaining()));
                    slot.get_or_init(
                        || metrics::histogram!(USAGE_RATIO, "policy" => name.to_string()),
                    )
                    .record(used / f64::from(limit));
                }
            }
            if let (Some(shadow), Some(name)) = (&self.shadow, self.names.get(index)) {
                if let Some([checked, refused]) = shadow.get(index) {
                    let counter = |slot: &OnceLock<Counter>, metric: &'static str| {
                        slot.get_or_init(
                            || metrics::counter!(metric, "policy" => name.to_string()),
                        )
                        .increment(1);
                    };
                    counter(checked, SHADOW_CHECKED_TOTAL);
                    if !decision.is_allowed() {
                        counter(refused, SHADOW_WOULD_REFUSE_TOTAL);
                    }
                }
            }
            let (outcome, label) = match decision.outcome() {
                Outcome::Allowed => (0, "allowed"),
                Outcome::Denied { .. } => (1, "denied"),
                Outcome::CannotFit => (2, "cannot_fit"),
                // `Outcome` is non-exhaustive.
                _ => (3, "other"),
            };
            let index = entry.index as usize;
            let (Some(slots), Some(name)) = (self.counters.get(index), self.names.get(index))
            else {
                continue;
            };
            let Some(slot) = slots.get(outcome) else {
                continue;
            };
            slot.get_or_init(|| {
                metrics::counter!(
                    DECISIONS_TOTAL,
                    "policy" => name.to_string(),
                    "outcome" => label
                )
            })
            .increment(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::convert::Infallible;
    use std::future::{Future, Ready, ready};
    use std::num::NonZeroU32;
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};

    use http::{Request, Response};
    use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
    use ratekeeper_core::{Policy, Quota};
    use tower::{Layer, Service, service_fn};

    use super::*;
    use crate::{GlobalKey, RateLimitLayer};

    /// `ratekeeper_decisions_total` by `(policy, outcome)`, from a debugging recorder.
    fn decisions(snapshotter: &Snapshotter) -> HashMap<(String, String), u64> {
        let label = |key: &metrics::Key, name: &str| {
            key.labels()
                .find(|l| l.key() == name)
                .map_or_else(String::new, |l| l.value().to_owned())
        };
        snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .filter_map(|(key, _, _, value)| {
                let key = key.key();
                match value {
                    DebugValue::Counter(n) if key.name() == DECISIONS_TOTAL => {
                        Some(((label(key, "policy"), label(key, "outcome")), n))
                    }
                    _ => None,
                }
            })
            .collect()
    }

    fn ok(_req: Request<()>) -> Ready<Result<Response<String>, Infallible>> {
        ready(Ok(Response::new(String::new())))
    }

    #[test]
    fn decisions_are_counted_by_policy_and_outcome() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        // Built before the recorder is installed: handles are registered at first use.
        let layer = RateLimitLayer::builder()
            .policy(Policy::new(
                "burst",
                Quota::per_minute(NonZeroU32::new(2).unwrap()),
            ))
            .policy(Policy::new(
                "daily",
                Quota::per_day(NonZeroU32::new(100).unwrap()),
            ))
            .key(GlobalKey)
            .build()
            .unwrap();
        let mut svc = layer.layer(service_fn(ok));
        metrics::with_local_recorder(&recorder, || {
            for want in [200, 200, 429] {
                let future = pin!(svc.call(Request::new(())));
                let mut cx = Context::from_waker(Waker::noop());
                let Poll::Ready(Ok(res)) = future.poll(&mut cx) else {
                    panic!("the memory store decides in call");
                };
                assert_eq!(res.status(), want);
            }
        });
        let counts = decisions(&snapshotter);
        let count = |policy: &str, outcome: &str| {
            counts
                .get(&(policy.to_owned(), outcome.to_owned()))
                .copied()
                .unwrap_or(0)
        };
        assert_eq!(count("burst", "allowed"), 2);
        assert_eq!(count("burst", "denied"), 1);
        // Each policy's own decision: "daily" would have passed the third request too (it
        // was not charged, all or nothing).
        assert_eq!(count("daily", "allowed"), 3);
        assert_eq!(count("daily", "denied"), 0);
        assert_eq!(count("burst", "cannot_fit"), 0);
    }
}
