//! What happens to a request over the limit: [`Mode::Reject`], [`Mode::Delay`] or
//! [`Mode::Shadow`].

use std::time::Duration;

#[cfg(doc)]
use ratekeeper_core::store::Store;

/// What the layer does with a request that is over the limit.
///
/// ```
/// use std::convert::Infallible;
/// use std::num::NonZeroU32;
/// use axum::http::{Request, Response, StatusCode};
/// use ratekeeper_core::Quota;
/// use ratekeeper_tower::rate_limit::Mode;
/// use ratekeeper_tower::{key::GlobalKey, RateLimitLayer};
/// use tower::{ServiceBuilder, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // Shadow: measure what a limit would do before enforcing it.
/// let layer = RateLimitLayer::builder()
///     .quota(Quota::per_minute(NonZeroU32::new(1).unwrap()))
///     .key(GlobalKey)
///     .mode(Mode::Shadow)
///     .build()?;
/// let svc = ServiceBuilder::new()
///     .layer(layer)
///     .service_fn(|_req: Request<()>| async { Ok::<_, Infallible>(Response::new(String::new())) });
/// for remaining in ["0", "0", "0"] {
///     let res = svc.clone().oneshot(Request::new(())).await?;
///     assert_eq!(res.status(), StatusCode::OK);
///     assert_eq!(res.headers()["x-ratelimit-remaining"], remaining);
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Mode {
    /// Answer with a 429 (or the degraded-response fallback). The default.
    #[default]
    Reject,
    /// Throttle: wait for capacity up to `max_wait`, then reject.
    ///
    /// The layer **reserves** ([`Store::reserve`](ratekeeper_core::store::Store::reserve)): a request that can pass within
    /// `max_wait` is charged at once and told how long to wait; it sleeps that long (tokio's
    /// timer) and then reaches the inner service without a second check, so it can no longer
    /// wait and still get a 429, and waiters are served in the order they reserved. A request
    /// whose wait would exceed `max_wait` is rejected at once, without sleeping, with
    /// `Retry-After` = the time until a new reservation would fit within `max_wait`; "cost
    /// can never fit" is rejected at once. A request dropped while it waits
    /// (client gone, timeout) gives back what its reservation still holds, by the receipt
    /// the store gave it: never a slot booked by a later reservation, so however waiters
    /// drop out, no two requests reach the inner service closer than the emission interval.
    /// The headers of the eventual response report the state as of the reservation.
    ///
    /// Each request is counted once in `ratekeeper_decisions_total`: a reservation as
    /// allowed when it is made; a request that waits without a reservation
    /// (check-and-retry, below) by the answer that ends its wait (allowed, or denied when it
    /// is rejected after all); one dropped during such a wait is not counted.
    ///
    /// With the memory store and the Redis store (one script call that books the turn, so
    /// waiters on every instance are ordered by one schedule), GCRA reserves exactly (the
    /// burst passes at once, then one request per `T = period / limit`) and the leaky bucket
    /// reserves as a shaper (output spaced by `T` from the first request, at most `burst`
    /// queued: [`LeakyBucket::shape`](ratekeeper_core::algorithm::LeakyBucket::shape)). The
    /// window algorithms, the sliding log, the concurrency counter and stores that cannot
    /// reserve (user stores using the default
    /// [`Store::reserve`](ratekeeper_core::store::Store::reserve)) fall back to check-and-retry: a
    /// waiting request holds nothing, sleeps for the store's `retry_after` and asks again
    /// while its deadline (`max_wait` after arrival) allows, so it may still be rejected
    /// after waiting, and waiters are not ordered.
    ///
    /// Waiting uses tokio's timer; outside a tokio runtime the layer checks instead of
    /// reserving and rejects a denied request. The inner service instance that was ready
    /// when the request arrived waits with it (a fresh clone serves the next request), so
    /// whatever its readiness reserved (for example a `tower::limit::ConcurrencyLimit`
    /// permit) stays reserved during the wait.
    Delay {
        /// The longest a request may wait, measured from its arrival (its reservation). A
        /// value beyond the clock's range (`Duration::MAX`) waits as long as needed.
        max_wait: Duration,
    },
    /// Decide and report (headers; the `ratekeeper_shadow_checked_total` and
    /// `ratekeeper_shadow_would_refuse_total` counters; a DEBUG event with target
    /// `ratekeeper::shadow` per request over the limit), but never block: requests over the
    /// limit reach the inner service. Denied requests charge nothing, so the budget reflects
    /// the allowed ones.
    Shadow,
}
