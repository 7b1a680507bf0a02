//! What happens to a request over the limit: [`Mode::Reject`], [`Mode::Delay`] or
//! [`Mode::Shadow`]; plus the builder options for the client-facing side (rejection body,
//! partition key).

use std::sync::Arc;
use std::time::Duration;

use ratekeeper_core::Key;
use ratekeeper_core::store::{Checked, Decisions, Store};

use super::future::Report;
use super::layer::{Builder, Shared};
use crate::policy::Applied;
use crate::report::{PartitionKey, Rejection, Reporter};

/// What the layer does with a request that is over the limit.
///
/// ```
/// use std::convert::Infallible;
/// use std::num::NonZeroU32;
/// use http::{Request, Response, StatusCode};
/// use ratekeeper_core::Quota;
/// use ratekeeper_tower::rate_limit::Mode;
/// use ratekeeper_tower::{GlobalKey, RateLimitLayer};
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
    /// Throttle: wait for capacity up to `max_wait`, then reject (DESIGN §2).
    ///
    /// The layer **reserves** ([`Store::reserve`]): a request that can pass within
    /// `max_wait` is charged at once and told how long to wait; it sleeps that long (tokio's
    /// timer) and then reaches the inner service without a second check, so it can no longer
    /// wait and still get a 429, and waiters are served in the order they reserved. A request
    /// whose wait would exceed `max_wait` is rejected at once, without sleeping, with
    /// `Retry-After` = the time until a new reservation would fit within `max_wait`; "cost
    /// can never fit" is rejected at once (case B10). A request dropped while it waits
    /// (client gone, timeout) is refunded, so it does not delay the requests behind it. The
    /// headers of the eventual response report the state as of the reservation.
    ///
    /// With the memory store, GCRA reserves exactly (the burst passes at once, then one
    /// request per `T = period / limit`) and the leaky bucket reserves as a shaper (output
    /// spaced by `T` from the first request, at most `burst` queued:
    /// [`LeakyBucket::shape`](ratekeeper_core::algorithm::LeakyBucket::shape)). The window
    /// algorithms, the concurrency counter and stores that cannot reserve (the Redis store,
    /// user stores using the default [`Store::reserve`]) fall back to check-and-retry: a
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
        /// The longest a request may wait, measured from its arrival (its reservation).
        max_wait: Duration,
    },
    /// Decide and report (headers, `tracing` events at INFO with target
    /// `ratekeeper::shadow`), but never block: requests over the limit reach the inner
    /// service. Denied requests charge nothing, so the budget reflects the allowed ones.
    Shadow,
}

/// Client-facing options of a [`Builder`].
#[derive(Clone, Default)]
pub(crate) struct Options {
    pub(crate) mode: Mode,
    pub(crate) rejection: Option<Arc<dyn Rejection>>,
    pub(crate) partition_key: Option<PartitionKey>,
    pub(crate) request_info: bool,
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("mode", &self.mode)
            .field("custom_rejection", &self.rejection.is_some())
            .field("partition_key", &self.partition_key)
            .field("request_info", &self.request_info)
            .finish()
    }
}

impl Options {
    pub(crate) fn apply(self, mut reporter: Reporter) -> Reporter {
        reporter.mode = self.mode;
        reporter.rejection = self.rejection;
        reporter.partition_key = self.partition_key;
        reporter.request_info = self.request_info;
        reporter
    }
}

impl<K, Co, St, R> Builder<K, Co, St, R> {
    /// Sets what happens to a request over the limit (default [`Mode::Reject`]).
    pub fn mode(mut self, mode: Mode) -> Self {
        self.options.mode = mode;
        self
    }

    /// Replaces the default problem+json 429 with `rejection` (see
    /// [`Rejection`](crate::report::Rejection)). The layer still adds the rate-limit headers,
    /// `Retry-After` and `Cache-Control: no-store` to its response.
    pub fn rejection<J: Rejection>(mut self, rejection: J) -> Self {
        self.options.rejection = Some(Arc::new(rejection));
        self
    }

    /// Whether allowed requests carry an [`Info`](crate::info::Info) extension (default
    /// `false`; the axum `RateLimitInfo` extractor reads it, so turn it on for handlers that
    /// extract it). Off, an allowed request costs no extension: about 600 fewer instructions
    /// (one allocation, a map insert, a copy of the decisions) per request, measured with
    /// `scripts/callgrind_http.sh`. Requests let through over the limit (shadow mode,
    /// fallback) always carry it; in shadow mode, requests under the limit carry it only
    /// when this is on.
    pub fn request_info(mut self, on: bool) -> Self {
        self.options.request_info = on;
        self
    }

    /// Adds a hashed partition key (`pk`) to the IETF headers (see
    /// [`PartitionKey`](crate::report::PartitionKey)). Off by default.
    pub fn partition_key(mut self, partition_key: PartitionKey) -> Self {
        self.options.partition_key = Some(partition_key);
        self
    }
}

/// Re-reserves for a waiting request and refunds a dropped reservation: the type-erased part
/// of the layer's state that the response future needs after `call` returned.
pub(crate) trait Limiter<SF>: Report {
    /// Reserves the request's charges again, waiting at most `max_wait` (check-and-retry for
    /// stores or algorithms that cannot reserve).
    fn recheck(&self, applied: &Applied, max_wait: Duration) -> Checked<SF>;
    /// Gives back the charges of a reservation that was dropped before it proceeded, as far
    /// as their receipts in `decisions` say they still hold.
    fn refund(&self, applied: &Applied, decisions: &Decisions);
    /// This state as a [`Report`].
    fn as_report(self: Arc<Self>) -> Arc<dyn Report>;
    /// The reporter (names, mode).
    fn reporter(&self) -> &Reporter;
    /// Counts a store's decisions in the `metrics` counters.
    fn record(&self, applied: &Applied, decisions: &Decisions);
}

impl<K, Co, St, R> Limiter<St::Future> for Shared<K, Co, St, R>
where
    K: Send + Sync + 'static,
    Co: Send + Sync + 'static,
    St: Store<Key>,
    R: Send + Sync + 'static,
{
    fn recheck(&self, applied: &Applied, max_wait: Duration) -> Checked<St::Future> {
        self.store.reserve(&applied.charges(&self.ids), max_wait)
    }

    fn refund(&self, applied: &Applied, decisions: &Decisions) {
        tracing::debug!(key = %applied.key, "refunding a dropped delay-mode reservation");
        self.store
            .refund(&applied.all_refunds(&self.ids, decisions));
    }

    fn as_report(self: Arc<Self>) -> Arc<dyn Report> {
        self
    }

    fn record(&self, applied: &Applied, decisions: &Decisions) {
        self.meter.record(applied, decisions);
    }

    fn reporter(&self) -> &Reporter {
        &self.reporter
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::num::NonZeroU32;
    use std::pin::pin;
    use std::task::Poll;

    use http::{Request, Response, StatusCode};
    use ratekeeper_core::store::MemoryStore;
    use ratekeeper_core::{Policy, Quota};
    use tower::{Service, ServiceBuilder, ServiceExt};

    use super::*;
    use crate::rate_limit::TokioClock;
    use crate::{GlobalKey, RateLimitLayer};

    fn delayed(max_wait: Duration) -> RateLimitLayer<GlobalKey, u64, MemoryStore<Key, TokioClock>> {
        RateLimitLayer::builder()
            .policy(Policy::new("default", Quota::per_second(NonZeroU32::MIN)))
            .key(GlobalKey)
            .store(MemoryStore::with_clock(TokioClock::new()))
            .mode(Mode::Delay { max_wait })
            .build()
            .unwrap()
    }

    fn ok(_req: Request<()>) -> std::future::Ready<Result<Response<String>, Infallible>> {
        std::future::ready(Ok(Response::new(String::new())))
    }

    #[tokio::test(start_paused = true)]
    async fn delay_waits_exactly_retry_after_then_passes() {
        let svc = ServiceBuilder::new()
            .layer(delayed(Duration::from_secs(5)))
            .service_fn(ok);
        let start = tokio::time::Instant::now();
        assert_eq!(
            svc.clone()
                .oneshot(Request::new(()))
                .await
                .unwrap()
                .status(),
            200
        );
        let res = svc.clone().oneshot(Request::new(())).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(start.elapsed(), Duration::from_secs(1));
        assert_eq!(res.headers()["x-ratelimit-remaining"], "0");
    }

    #[tokio::test(start_paused = true)]
    async fn delay_rejects_at_once_when_the_wait_exceeds_max_wait() {
        let svc = ServiceBuilder::new()
            .layer(delayed(Duration::from_millis(999)))
            .service_fn(ok);
        let start = tokio::time::Instant::now();
        svc.clone().oneshot(Request::new(())).await.unwrap();
        let res = svc.clone().oneshot(Request::new(())).await.unwrap();
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(res.headers()["retry-after"], "1");
        assert_eq!(start.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_reservation_dropped_while_waiting_is_refunded() {
        let svc = ServiceBuilder::new()
            .layer(delayed(Duration::from_secs(5)))
            .service_fn(ok);
        let start = tokio::time::Instant::now();
        svc.clone().oneshot(Request::new(())).await.unwrap();
        {
            // The second request reserves the turn at 1 s, then its client goes away.
            let mut waiting = pin!(svc.clone().oneshot(Request::new(())));
            assert!(matches!(futures_poll(waiting.as_mut()), Poll::Pending));
        }
        // The third request takes the refunded turn at 1 s, not the next one at 2 s.
        let res = svc.clone().oneshot(Request::new(())).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(start.elapsed(), Duration::from_secs(1));
    }

    /// 2 per second, burst 1 (T = 500 ms), max_wait 2 s; seven requests arrive at t = 0.
    /// Requests 1..5 reserve the turns at 0, 0.5, 1, 1.5 and 2 s and reach the service in
    /// arrival order; 6 and 7 would need 2.5 s > 2 s: 429 at t = 0, `Retry-After: 1`
    /// (0.5 s until a turn is within 2 s, rounded up), with nothing charged.
    #[tokio::test(start_paused = true)]
    async fn delay_reserves_turns_in_arrival_order_and_rejects_the_rest_at_once() {
        use std::sync::Mutex;
        let served = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&served);
        let layer = RateLimitLayer::builder()
            .policy(Policy::new(
                "default",
                Quota::per_second(NonZeroU32::new(2).unwrap())
                    .with_burst(1)
                    .unwrap(),
            ))
            .key(GlobalKey)
            .store(MemoryStore::with_clock(TokioClock::new()))
            .mode(Mode::Delay {
                max_wait: Duration::from_secs(2),
            })
            .build()
            .unwrap();
        let mut svc = ServiceBuilder::new()
            .layer(layer)
            .service_fn(move |req: Request<u32>| {
                let start = tokio::time::Instant::now();
                log.lock().unwrap().push((*req.body(), start));
                std::future::ready(Ok::<_, Infallible>(Response::new(String::new())))
            });
        let start = tokio::time::Instant::now();
        let mut tasks = Vec::new();
        for i in 1..=7u32 {
            // Each request reserves in `call`, in arrival order.
            let fut = svc.ready().await.unwrap().call(Request::new(i));
            tasks.push(tokio::spawn(async move {
                let res = fut.await.unwrap();
                let retry = res
                    .headers()
                    .get("retry-after")
                    .map(|v| v.to_str().unwrap().to_owned());
                (i, res.status().as_u16(), start.elapsed(), retry)
            }));
        }
        let mut results = Vec::new();
        for t in tasks {
            results.push(t.await.unwrap());
        }
        let ms = Duration::from_millis;
        assert_eq!(
            results,
            vec![
                (1, 200, ms(0), None),
                (2, 200, ms(500), None),
                (3, 200, ms(1_000), None),
                (4, 200, ms(1_500), None),
                (5, 200, ms(2_000), None),
                (6, 429, ms(0), Some("1".to_owned())),
                (7, 429, ms(0), Some("1".to_owned())),
            ]
        );
        let order: Vec<(u32, Duration)> = served
            .lock()
            .unwrap()
            .iter()
            .map(|(i, at)| (*i, at.duration_since(start)))
            .collect();
        assert_eq!(
            order,
            vec![
                (1, ms(0)),
                (2, ms(500)),
                (3, ms(1_000)),
                (4, ms(1_500)),
                (5, ms(2_000))
            ]
        );
    }

    /// Two policies: a reservation the second cannot make within `max_wait` is rejected at
    /// once and the first one's reservation is refunded.
    #[tokio::test(start_paused = true)]
    async fn delay_reservations_are_all_or_nothing_across_policies() {
        let layer = RateLimitLayer::builder()
            .policy(Policy::new("fast", Quota::per_second(NonZeroU32::MIN)))
            .policy(Policy::new(
                "slow",
                Quota::new(1, Duration::from_secs(10))
                    .unwrap()
                    .with_burst(2)
                    .unwrap(),
            ))
            .key(GlobalKey)
            .store(MemoryStore::with_clock(TokioClock::new()))
            .mode(Mode::Delay {
                max_wait: Duration::from_secs(2),
            })
            .build()
            .unwrap();
        let svc = ServiceBuilder::new().layer(layer).service_fn(ok);
        let start = tokio::time::Instant::now();
        // t = 0: passes; then the turn at 1 s ("fast"), still in "slow"'s burst.
        assert_eq!(
            svc.clone()
                .oneshot(Request::new(()))
                .await
                .unwrap()
                .status(),
            200
        );
        assert_eq!(
            svc.clone()
                .oneshot(Request::new(()))
                .await
                .unwrap()
                .status(),
            200
        );
        assert_eq!(start.elapsed(), Duration::from_secs(1));
        // "fast" could give the turn at 2 s, "slow" only at 10 s: 429 at once (retry after
        // 10 - 1 - 2 = 7 s) and "fast" refunded.
        let res = svc.clone().oneshot(Request::new(())).await.unwrap();
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(res.headers()["retry-after"], "7");
        assert_eq!(start.elapsed(), Duration::from_secs(1));
        assert_eq!(res.headers()["x-ratelimit-remaining"], "0");
    }

    #[tokio::test(start_paused = true)]
    async fn b10_cost_above_burst_is_rejected_at_once_in_delay_mode() {
        let layer = RateLimitLayer::builder()
            .policy(Policy::new("default", Quota::per_second(NonZeroU32::MIN)))
            .key(GlobalKey)
            .cost_fn(|_req: &crate::RequestParts<'_>| 2)
            .store(MemoryStore::with_clock(TokioClock::new()))
            .mode(Mode::Delay {
                max_wait: Duration::from_secs(60),
            })
            .build()
            .unwrap();
        let svc = ServiceBuilder::new().layer(layer).service_fn(ok);
        let start = tokio::time::Instant::now();
        let res = svc.oneshot(Request::new(())).await.unwrap();
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        assert!(res.headers().get("retry-after").is_none());
        assert_eq!(start.elapsed(), Duration::ZERO);
    }

    #[tokio::test]
    async fn nested_layers_report_the_most_restrictive_policy_once() {
        let inner = RateLimitLayer::builder()
            .policy(Policy::new(
                "route",
                Quota::per_minute(NonZeroU32::new(2).unwrap()),
            ))
            .key(GlobalKey)
            .headers(crate::report::HeaderStyle::Both)
            .build()
            .unwrap();
        let outer = RateLimitLayer::builder()
            .policy(Policy::new(
                "global",
                Quota::per_minute(NonZeroU32::new(100).unwrap()),
            ))
            .key(GlobalKey)
            .headers(crate::report::HeaderStyle::Both)
            .build()
            .unwrap();
        let svc = ServiceBuilder::new()
            .layer(outer)
            .layer(inner)
            .service_fn(ok);
        let res = svc.oneshot(Request::new(())).await.unwrap();
        let h = res.headers();
        assert_eq!(h.get_all("x-ratelimit-limit").iter().count(), 1);
        assert_eq!(h["x-ratelimit-limit"], "2");
        assert_eq!(h["x-ratelimit-remaining"], "1");
        assert_eq!(h["x-ratelimit-reset"], "30");
        assert_eq!(h.get_all("ratelimit").iter().count(), 1);
        assert_eq!(h["ratelimit"], "\"route\";r=1;t=30, \"global\";r=99;t=1");
        assert_eq!(
            h["ratelimit-policy"],
            "\"route\";q=2;w=60, \"global\";q=100;w=60"
        );
    }

    /// Polls a future once with a no-op waker.
    fn futures_poll<F: std::future::Future>(f: std::pin::Pin<&mut F>) -> Poll<F::Output> {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        f.poll(&mut cx)
    }
}
