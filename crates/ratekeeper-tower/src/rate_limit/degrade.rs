//! [`Degrade`]: what the rate limit hands its fallback with a refused request.

use std::sync::Arc;

/// Why the rate limit hands a request to its fallback: a denial by a policy, or a store that
/// could not decide under [`FailurePolicy::Degrade`](ratekeeper_core::store::FailurePolicy::Degrade). Carries the policy named in
/// `RateLimit-Degraded` and the `reason` label of `ratekeeper_degraded_total`.
#[derive(Debug, Clone)]
pub struct Degrade {
    pub(crate) policy: Arc<str>,
    pub(crate) reason: &'static str,
}

impl Degrade {
    /// A denial by `policy`.
    pub(crate) fn limited(policy: &str) -> Self {
        Self {
            policy: Arc::from(policy),
            reason: "limited",
        }
    }

    /// The store could not decide and its failure policy is [`FailurePolicy::Degrade`](ratekeeper_core::store::FailurePolicy::Degrade).
    pub(crate) fn store_unavailable() -> Self {
        Self {
            policy: Arc::from(STORE_UNAVAILABLE),
            reason: "store_unavailable",
        }
    }
}

/// The `RateLimit-Degraded` value when the store could not decide.
const STORE_UNAVAILABLE: &str = "store-unavailable";
