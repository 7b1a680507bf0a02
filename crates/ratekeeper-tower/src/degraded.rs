//! [`StoreDegraded`]: the request extension on requests the rate limit let through without a
//! decision because its store could not decide, set by the [`RateLimit`](crate::RateLimit)
//! service before it calls the inner service (or the degraded-response fallback, see
//! [`RateLimitLayer::with_fallback`](crate::RateLimitLayer::with_fallback)); a handler reads
//! it.

use ratekeeper_core::store::FailurePolicy;

/// Request extension set by the rate limit when its store could not decide and the request
/// goes on anyway: the failure policy failed open ([`FailurePolicy::Allow`]) or asks for the
/// degraded-response fallback ([`FailurePolicy::Degrade`]). The hook a handler or a fallback
/// reads. Such a request carries no rate-limit headers.
///
/// ```
/// use axum::http::Request;
/// use ratekeeper_tower::StoreDegraded;
/// use ratekeeper_core::store::FailurePolicy;
///
/// let mut req = Request::new(());
/// req.extensions_mut().insert(StoreDegraded { action: FailurePolicy::Degrade });
/// assert_eq!(
///     req.extensions().get::<StoreDegraded>().map(|d| d.action),
///     Some(FailurePolicy::Degrade)
/// );
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreDegraded {
    /// The failure policy that let the request through.
    pub action: FailurePolicy,
}
