use std::fmt;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use super::future::ResponseFuture;
use super::layer::AdaptiveConcurrencyLayer;
use super::partition::{Classify, Unclassified};
use crate::key::{GlobalKey, KeyExtractor};
use crate::report::trailers_only;

/// The adaptive concurrency-limiting service (see the [module docs](super)). Decides in
/// `call`; `poll_ready` only forwards.
pub struct AdaptiveConcurrency<S, K = GlobalKey, C = Unclassified> {
    inner: S,
    layer: AdaptiveConcurrencyLayer<K, C>,
}

impl<S, K, C> AdaptiveConcurrency<S, K, C> {
    pub(crate) fn new(inner: S, layer: AdaptiveConcurrencyLayer<K, C>) -> Self {
        Self { inner, layer }
    }

    define_inner_service_accessors!();

    /// A layer that builds services sharing this service's limits.
    pub fn layer(&self) -> AdaptiveConcurrencyLayer<K, C> {
        self.layer.clone()
    }
}

impl<S: Clone, K, C> Clone for AdaptiveConcurrency<S, K, C> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

impl<S: fmt::Debug, K, C> fmt::Debug for AdaptiveConcurrency<S, K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdaptiveConcurrency")
            .field("inner", &self.inner)
            .field("layer", &self.layer)
            .finish()
    }
}

impl<S, K, C, ReqB, ResB> Service<Request<ReqB>> for AdaptiveConcurrency<S, K, C>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    K: KeyExtractor,
    C: Classify,
{
    type Response = Response<super::AdaptiveBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let shared = &self.layer.shared;
        let key = match shared.key.extract(&req) {
            Ok(key) => key,
            Err(err) => return ResponseFuture::key_error(&err, shared.grpc_call(&req)),
        };
        let partition = shared.partitions.index(shared.classify.classify(&req));
        let limiter = shared.limiter(&key);
        match shared.try_admit(&limiter, partition) {
            Some(permit) => {
                ResponseFuture::called(self.inner.call(req), permit, shared.clock.clone())
            }
            None => {
                let answer = &shared.answer;
                let mut headers = answer.headers.clone();
                let body = answer.bodies.get(partition).cloned().unwrap_or_default();
                match shared.grpc_call(&req) {
                    Some(content_type) => {
                        let (status, body) = trailers_only(
                            answer.status,
                            &mut headers,
                            &body,
                            Some(&shared.name),
                            content_type,
                        );
                        if answer.status != http::StatusCode::TOO_MANY_REQUESTS {
                            // UNAVAILABLE: say why, rather than the fail-closed store text.
                            let message = format!(
                                "server overloaded; retry after {} s",
                                answer.retry_after_secs
                            );
                            if let Ok(v) = http::HeaderValue::try_from(message) {
                                headers.insert(GRPC_MESSAGE.clone(), v);
                            }
                        }
                        ResponseFuture::answered(status, headers, body)
                    }
                    None => ResponseFuture::answered(answer.status, headers, body),
                }
            }
        }
    }
}

/// `grpc-message`.
static GRPC_MESSAGE: http::HeaderName = http::HeaderName::from_static("grpc-message");
