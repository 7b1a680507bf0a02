use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use ratekeeper_core::store::Decisions;
use ratekeeper_core::{Decision, Outcome};
use tower_service::Service;

use super::future::ResponseFuture;
use super::layer::{ConcurrencyLimitLayer, NAME};
use super::upgrade::Held;
use crate::key::{KeyExtractor, PeerIp};
use crate::report::{Reporter, trailers_only};

/// The keyed concurrency-limiting service (see the [module docs](super)). Decides in `call`;
/// `poll_ready` only forwards.
pub struct ConcurrencyLimit<S, K = PeerIp> {
    inner: S,
    layer: ConcurrencyLimitLayer<K>,
}

impl<S, K> ConcurrencyLimit<S, K> {
    pub(crate) fn new(inner: S, layer: ConcurrencyLimitLayer<K>) -> Self {
        Self { inner, layer }
    }

    define_inner_service_accessors!();

    /// A layer that builds services sharing this service's counter.
    pub fn layer(&self) -> ConcurrencyLimitLayer<K> {
        self.layer.clone()
    }
}

impl<S: Clone, K> Clone for ConcurrencyLimit<S, K> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

impl<S: fmt::Debug, K> fmt::Debug for ConcurrencyLimit<S, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLimit")
            .field("inner", &self.inner)
            .field("layer", &self.layer)
            .finish()
    }
}

impl<S, K, ReqB, ResB> Service<Request<ReqB>> for ConcurrencyLimit<S, K>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    K: KeyExtractor,
{
    type Response = Response<super::ConcurrencyBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<ReqB>) -> Self::Future {
        let key = match self.layer.key.extract(&req) {
            Ok(key) => key,
            Err(err) => {
                let grpc = self.layer.reporter.grpc_call(req.version(), req.headers());
                return ResponseFuture::key_error(&err, grpc);
            }
        };
        let max = self.layer.counter.max();
        match self.layer.counter.acquire(&key) {
            Some((permit, free)) => {
                let decisions =
                    Decisions::new([Decision::new(Outcome::Allowed, max, free, Duration::ZERO)]);
                let held = Held::for_request(permit, &mut req);
                ResponseFuture::called(
                    self.inner.call(req),
                    held,
                    Arc::clone(&self.layer.reporter),
                    decisions,
                )
            }
            None => {
                let grpc = self.layer.reporter.grpc_call(req.version(), req.headers());
                let (status, headers, body) = refused(&self.layer.reporter, max, grpc);
                ResponseFuture::answered(status, headers, body)
            }
        }
    }
}

/// The answer when all `max` slots of the key are taken: 429 with `Retry-After: 1` (or a
/// gRPC trailers-only `RESOURCE_EXHAUSTED` when `grpc`, from [`Reporter::grpc_call`], is set).
pub(crate) fn refused(
    reporter: &Reporter,
    max: u32,
    grpc: Option<http::HeaderValue>,
) -> (http::StatusCode, http::HeaderMap, bytes::Bytes) {
    tracing::debug!(max, "concurrency limit reached");
    let decisions = Decisions::new([Decision::new(
        Outcome::Denied {
            retry_after: Duration::from_secs(1),
        },
        max,
        0,
        Duration::ZERO,
    )]);
    let (mut status, mut headers, mut body) = reporter.limited(&decisions, &[0], None, unix_now);
    if let Some(content_type) = grpc {
        (status, body) = trailers_only(status, &mut headers, &body, Some(NAME), content_type);
    }
    (status, headers, body)
}

pub(crate) fn unix_now() -> Duration {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
}
