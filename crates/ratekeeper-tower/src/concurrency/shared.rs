//! The keyed concurrency layer over a shared slot store (`ConcurrencyLimitLayer::shared`).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use ratekeeper_core::store::slots::{Acquired, SharedSlots};
use ratekeeper_core::store::{Decisions, FailurePolicy};
use ratekeeper_core::{Decision, Outcome};
use tower_layer::Layer;
use tower_service::Service;

use super::ConcurrencyBody;
use super::future::ResponseFuture;
use super::layer::Permit;
use super::service::refused;
use super::upgrade::Held;
use crate::key::{KeyExtractor, PeerIp};
use crate::report::{Reporter, Unavailable, trailers_only};

/// The keyed concurrency layer whose slots live in a shared store (made by
/// [`ConcurrencyLimitLayer::shared`](super::ConcurrencyLimitLayer::shared)): at most `max`
/// requests in flight per key across every instance sharing the store.
///
/// Same answers as [`ConcurrencyLimitLayer`](super::ConcurrencyLimitLayer) (headers, 429
/// with `Retry-After: 1`, gRPC, upgrades, slot held until the response body ends). The
/// decision takes one round trip to the store, made in the response future before the inner
/// service is called. When the store cannot decide, its failure policy applies:
/// [`FailurePolicy::Deny`] answers `503 Service Unavailable` with `Retry-After` (see
/// [`SharedConcurrencyLimitLayer::unavailable_retry_after`]); every other policy passes the
/// request without a slot and without rate-limit headers (fail open).
pub struct SharedConcurrencyLimitLayer<K = PeerIp> {
    pub(crate) key: Arc<K>,
    pub(crate) max: u32,
    pub(crate) slots: Arc<dyn SharedSlots>,
    pub(crate) reporter: Arc<Reporter>,
    pub(crate) unavailable: Arc<Unavailable>,
}

impl<K> SharedConcurrencyLimitLayer<K> {
    /// How long a client should wait before it retries after the `503 Service Unavailable`
    /// answered when the slot store cannot decide and fails closed
    /// ([`FailurePolicy::Deny`]).
    ///
    /// The 503 carries it as `Retry-After` in whole seconds, rounded up and at least 1, with
    /// `Cache-Control: no-store` and an RFC 9457 `application/problem+json` body of type
    /// [`TEMPORARY_REDUCED_CAPACITY_TYPE`](crate::report::TEMPORARY_REDUCED_CAPACITY_TYPE)
    /// whose `detail` names the same seconds; a gRPC call (with
    /// [`ConcurrencyLimitLayer::grpc`](super::ConcurrencyLimitLayer::grpc)) gets `UNAVAILABLE`
    /// with the same delay as `retry-after` metadata and a `google.rpc.RetryInfo`. Default
    /// 1 s: the Redis store's default circuit-breaker open period (500 ms) rounded up; with a
    /// longer breaker period, set the same duration here.
    pub fn unavailable_retry_after(mut self, retry_after: Duration) -> Self {
        self.unavailable = Arc::new(Unavailable::concurrency(retry_after));
        self
    }
}

impl<K> Clone for SharedConcurrencyLimitLayer<K> {
    fn clone(&self) -> Self {
        Self {
            key: Arc::clone(&self.key),
            max: self.max,
            slots: Arc::clone(&self.slots),
            reporter: Arc::clone(&self.reporter),
            unavailable: Arc::clone(&self.unavailable),
        }
    }
}

impl<K> fmt::Debug for SharedConcurrencyLimitLayer<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedConcurrencyLimitLayer")
            .field("max", &self.max)
            .field("style", &self.reporter.style)
            .finish_non_exhaustive()
    }
}

impl<S, K> Layer<S> for SharedConcurrencyLimitLayer<K> {
    type Service = SharedConcurrencyLimit<S, K>;

    fn layer(&self, inner: S) -> Self::Service {
        SharedConcurrencyLimit {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service of [`SharedConcurrencyLimitLayer`].
pub struct SharedConcurrencyLimit<S, K = PeerIp> {
    inner: S,
    layer: SharedConcurrencyLimitLayer<K>,
}

impl<S: Clone, K> Clone for SharedConcurrencyLimit<S, K> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

impl<S: fmt::Debug, K> fmt::Debug for SharedConcurrencyLimit<S, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedConcurrencyLimit")
            .field("inner", &self.inner)
            .field("layer", &self.layer)
            .finish()
    }
}

/// The response future of [`SharedConcurrencyLimit`] (boxed: the store does I/O anyway).
pub type SharedResponseFuture<B, E> =
    Pin<Box<dyn Future<Output = Result<Response<ConcurrencyBody<B>>, E>> + Send>>;

impl<S, K, ReqB, ResB> Service<Request<ReqB>> for SharedConcurrencyLimit<S, K>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqB: Send + 'static,
    ResB: Send + 'static,
    K: KeyExtractor,
{
    type Response = Response<ConcurrencyBody<ResB>>;
    type Error = S::Error;
    type Future = SharedResponseFuture<ResB, S::Error>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<ReqB>) -> Self::Future {
        let key = match self.layer.key.extract(&req) {
            Ok(key) => key,
            Err(err) => {
                let grpc = self.layer.reporter.grpc_call(req.version(), req.headers());
                return Box::pin(ResponseFuture::<S::Future>::key_error(&err, grpc));
            }
        };
        let max = self.layer.max;
        let acquire = self.layer.slots.acquire(&key, max);
        let reporter = Arc::clone(&self.layer.reporter);
        let unavailable = Arc::clone(&self.layer.unavailable);
        // The service that was made ready goes with this request; a clone takes its place.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            match acquire.await {
                Ok(Acquired::Held { lease, free }) => {
                    let decisions = Decisions::new([Decision::new(
                        Outcome::Allowed,
                        max,
                        free,
                        Duration::ZERO,
                    )]);
                    let held = Held::for_request(Permit::shared(lease), &mut req);
                    ResponseFuture::called(inner.call(req), held, reporter, decisions).await
                }
                Ok(Acquired::Full) => {
                    let grpc = reporter.grpc_call(req.version(), req.headers());
                    let (status, headers, body) = refused(&reporter, max, grpc);
                    ResponseFuture::<S::Future>::answered(status, headers, body).await
                }
                Err(err) if err.failure_policy() == FailurePolicy::Deny => {
                    // The store logs the outage once per transition; one DEBUG event per request.
                    tracing::debug!(error = %err, "shared concurrency slots unavailable; failing closed");
                    let (mut status, mut headers, mut body) = unavailable.parts();
                    if let Some(content_type) = reporter.grpc_call(req.version(), req.headers()) {
                        (status, body) =
                            trailers_only(status, &mut headers, &body, None, content_type);
                    }
                    ResponseFuture::<S::Future>::answered(status, headers, body).await
                }
                Err(err) => {
                    tracing::debug!(error = %err, "shared concurrency slots unavailable; failing open");
                    ResponseFuture::passed(inner.call(req)).await
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::num::NonZeroU32;
    use std::sync::atomic::{AtomicU32, Ordering};

    use bytes::Bytes;
    use http::StatusCode;
    use http_body_util::BodyExt as _;
    use ratekeeper_core::Key;
    use ratekeeper_core::store::StoreError;
    use ratekeeper_core::store::slots::{AcquireFuture, SlotLease};
    use tower::{ServiceBuilder, ServiceExt};

    use super::*;
    use crate::GlobalKey;
    use crate::concurrency::ConcurrencyLimitLayer;

    /// Answers what `mode` says: 0 a slot (counted in `held` until dropped), 1 full, 2 a
    /// store failure with `policy`.
    struct Fake {
        mode: u32,
        policy: FailurePolicy,
        held: Arc<AtomicU32>,
    }

    struct Release(Arc<AtomicU32>);
    impl Drop for Release {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }

    impl SharedSlots for Fake {
        fn acquire(&self, _key: &Key, max: u32) -> AcquireFuture {
            let answer = match self.mode {
                0 => {
                    let held = self.held.fetch_add(1, Ordering::SeqCst) + 1;
                    Ok(Acquired::Held {
                        lease: SlotLease::new(Release(Arc::clone(&self.held))),
                        free: max - held,
                    })
                }
                1 => Ok(Acquired::Full),
                _ => Err(StoreError::Failed {
                    policy: self.policy,
                    source: Box::new(StoreError::Timeout),
                }),
            };
            Box::pin(std::future::ready(answer))
        }
    }

    async fn answer(mode: u32, policy: FailurePolicy) -> (Response<Bytes>, Arc<AtomicU32>) {
        let held = Arc::new(AtomicU32::new(0));
        let fake = Fake {
            mode,
            policy,
            held: Arc::clone(&held),
        };
        let svc = ServiceBuilder::new()
            .layer(
                ConcurrencyLimitLayer::new(NonZeroU32::new(3).unwrap())
                    .key(GlobalKey)
                    .shared(fake),
            )
            .service_fn(|_req: Request<()>| async {
                Ok::<_, Infallible>(Response::new(String::from("hi")))
            });
        let res = svc.oneshot(Request::new(())).await.unwrap();
        let (parts, body) = res.into_parts();
        assert_eq!(held.load(Ordering::SeqCst), u32::from(mode == 0));
        let body = body.collect().await.unwrap().to_bytes();
        (Response::from_parts(parts, body), held)
    }

    #[tokio::test]
    async fn held_slot_reports_headers_and_is_released_at_the_end_of_the_body() {
        let (res, held) = answer(0, FailurePolicy::Allow).await;
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(res.headers()["x-ratelimit-limit"], "3");
        assert_eq!(res.headers()["x-ratelimit-remaining"], "2");
        assert_eq!(held.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn full_is_a_429_with_retry_after_1() {
        let (res, _) = answer(1, FailurePolicy::Allow).await;
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(res.headers()["retry-after"], "1");
    }

    #[tokio::test]
    async fn store_failure_follows_the_failure_policy() {
        let (res, _) = answer(2, FailurePolicy::Deny).await;
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(res.headers()["content-type"], "application/problem+json");
        assert_eq!(res.headers()["retry-after"], "1");
        assert_eq!(res.headers()["cache-control"], "no-store");
        let problem: serde_json::Value = serde_json::from_slice(res.body()).unwrap();
        assert_eq!(
            problem["type"],
            crate::report::TEMPORARY_REDUCED_CAPACITY_TYPE
        );
        assert_eq!(
            problem["detail"],
            "the concurrency limiter cannot decide now (its store is unavailable); retry after 1 s"
        );
        let (res, _) = answer(2, FailurePolicy::Allow).await;
        assert_eq!(res.status(), StatusCode::OK);
        assert!(res.headers().get("x-ratelimit-limit").is_none());
        assert_eq!(res.body().as_ref(), b"hi");
    }

    /// A gRPC call to a layer that serves gRPC gets the fail-closed answer as `UNAVAILABLE`,
    /// with the same `retry-after`, a `RetryInfo`, and the configured wait rounded up.
    #[tokio::test]
    async fn fail_closed_grpc_call_is_unavailable_with_retry_after() {
        let fake = Fake {
            mode: 2,
            policy: FailurePolicy::Deny,
            held: Arc::new(AtomicU32::new(0)),
        };
        let svc = ServiceBuilder::new()
            .layer(
                ConcurrencyLimitLayer::new(NonZeroU32::new(3).unwrap())
                    .key(GlobalKey)
                    .grpc(true)
                    .shared(fake)
                    .unavailable_retry_after(Duration::from_millis(4_100)),
            )
            .service_fn(|_req: Request<()>| async {
                Ok::<_, Infallible>(Response::new(String::from("hi")))
            });
        let req = Request::builder()
            .version(http::Version::HTTP_2)
            .header("content-type", "application/grpc")
            .body(())
            .unwrap();
        let res = svc.oneshot(req).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(res.headers()["content-type"], "application/grpc");
        assert_eq!(res.headers()["grpc-status"], "14");
        assert_eq!(res.headers()["retry-after"], "5");
        assert!(res.headers().contains_key("grpc-status-details-bin"));
    }
}
