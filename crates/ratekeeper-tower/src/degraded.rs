//! Request markers for requests the rate limit let through without a normal decision:
//! [`StoreDegraded`] (the store could not decide) and the private marker that sends a denied
//! request to the degraded-response [`Fallback`](crate::fallback::Fallback).
//!
//! Both are request extensions, set by the [`RateLimit`](crate::RateLimit) service before it
//! calls the inner service; a fallback or a handler reads them.
//!
//! ```
//! use axum::http::Request;
//! use ratekeeper_tower::StoreDegraded;
//! use ratekeeper_core::store::FailurePolicy;
//!
//! let mut req = Request::new(());
//! req.extensions_mut().insert(StoreDegraded { action: FailurePolicy::Degrade });
//! assert_eq!(
//!     req.extensions().get::<StoreDegraded>().map(|d| d.action),
//!     Some(FailurePolicy::Degrade)
//! );
//! ```

use std::sync::Arc;

use ratekeeper_core::store::FailurePolicy;

/// Request extension set by the rate limit when its store could not decide and the request
/// goes on anyway: the failure policy failed open ([`FailurePolicy::Allow`]) or asks for the
/// degraded-response fallback ([`FailurePolicy::Degrade`]). The hook a fallback or a handler
/// reads. Such a request carries no rate-limit headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreDegraded {
    /// The failure policy that let the request through.
    pub action: FailurePolicy,
}

/// Marks a request that the rate limit denied (or whose store failed under
/// [`FailurePolicy::Degrade`]), so that the [`Fallback`](crate::fallback::Fallback) answers
/// it: the policy named in `RateLimit-Degraded` and the `reason` label of
/// `ratekeeper_degraded_total`.
#[derive(Debug, Clone)]
pub(crate) struct Degrade {
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

    /// The store could not decide and its failure policy is [`FailurePolicy::Degrade`].
    pub(crate) fn store_unavailable() -> Self {
        Self {
            policy: Arc::from(STORE_UNAVAILABLE),
            reason: "store_unavailable",
        }
    }
}

/// The `RateLimit-Degraded` value when the store could not decide.
const STORE_UNAVAILABLE: &str = "store-unavailable";
