//! The keyed concurrency layer over a shared slot store (`ConcurrencyLimitLayer::shared`).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
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
use crate::report::Reporter;

/// The keyed concurrency layer whose slots live in a shared store (made by
/// [`ConcurrencyLimitLayer::shared`](super::ConcurrencyLimitLayer::shared)): at most `max`
/// requests in flight per key across every instance sharing the store.
///
/// Same answers as [`ConcurrencyLimitLayer`](super::ConcurrencyLimitLayer) (headers, 429
/// with `Retry-After: 1`, gRPC, upgrades, slot held until the response body ends). The
/// decision takes one round trip to the store, made in the response future before the inner
/// service is called. When the store cannot decide, its failure policy applies:
/// [`FailurePolicy::Deny`] answers `503 Service Unavailable`; every other policy passes the
/// request without a slot and without rate-limit headers (fail open).
pub struct SharedConcurrencyLimitLayer<K = PeerIp> {
    pub(crate) key: Arc<K>,
    pub(crate) max: u32,
    pub(crate) slots: Arc<dyn SharedSlots>,
    pub(crate) reporter: Arc<Reporter>,
}

impl<K> Clone for SharedConcurrencyLimitLayer<K> {
    fn clone(&self) -> Self {
        Self {
            key: Arc::clone(&self.key),
            max: self.max,
            slots: Arc::clone(&self.slots),
            reporter: Arc::clone(&self.reporter),
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
                return Box::pin(ResponseFuture::<S::Future>::key_error(&err, req.headers()));
            }
        };
        let max = self.layer.max;
        let acquire = self.layer.slots.acquire(&key, max);
        let reporter = Arc::clone(&self.layer.reporter);
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
                    let (status, headers, body) = refused(&reporter, max, req.headers());
                    ResponseFuture::<S::Future>::answered(status, headers, body).await
                }
                Err(err) if err.failure_policy() == FailurePolicy::Deny => {
                    tracing::warn!(error = %err, "shared concurrency slots unavailable; failing closed");
                    let mut headers = HeaderMap::new();
                    headers.insert(
                        CONTENT_TYPE,
                        HeaderValue::from_static("text/plain; charset=utf-8"),
                    );
                    let body = Bytes::from_static(b"concurrency limit store unavailable\n");
                    ResponseFuture::<S::Future>::answered(
                        StatusCode::SERVICE_UNAVAILABLE,
                        headers,
                        body,
                    )
                    .await
                }
                Err(err) => {
                    tracing::warn!(error = %err, "shared concurrency slots unavailable; failing open");
                    ResponseFuture::passed(inner.call(req)).await
                }
            }
        })
    }
}
