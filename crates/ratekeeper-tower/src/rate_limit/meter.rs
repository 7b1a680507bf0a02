//! `metrics` of a rate limit's decisions: counters by policy and outcome, the usage
//! histogram by policy, and the shadow-mode counters.

use std::sync::{Arc, OnceLock};

use metrics::{Counter, Histogram};
use ratekeeper_core::Outcome;
use ratekeeper_core::store::Decisions;

use crate::metrics::{
    BANS_TOTAL, DECISIONS_TOTAL, SHADOW_CHECKED_TOTAL, SHADOW_WOULD_REFUSE_TOTAL, USAGE_RATIO,
};
use crate::policy::Applied;

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
    use crate::{RateLimitLayer, key::GlobalKey};

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
