use std::fmt;
use std::task::{Context, Poll};

use http::{Request, Response};
use tokio::time::Instant;
use tower_layer::Layer;
use tower_service::Service;

use super::deadline::OverDeadline;
use super::error::{Error, WaitTooLong};
use super::future::ResponseFuture;
use super::key::{ClientKey, Origin};
use super::layer::PoliteLayer;

/// A client service that waits, before sending, for the time its server announced; made by
/// [`PoliteLayer`].
///
/// `poll_ready` only asks the inner service; the wait is decided in `call`, from the request's
/// key, so a request for an origin that is not waited on never queues behind one that is.
/// A waiting call holds the inner service that was made ready for it (the inner service is
/// cloned to take its place) and calls it when the wait is over.
///
/// ```
/// use std::convert::Infallible;
/// use axum::http::{Request, Response};
/// use ratekeeper_tower::client::Polite;
/// use tower::{Layer, ServiceExt, service_fn};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let server = service_fn(|_req: Request<()>| async {
///     Ok::<_, Infallible>(Response::new("hello"))
/// });
/// let client = Polite::layer().layer(server);
/// let res = client.oneshot(Request::get("http://127.0.0.1:3000/").body(()).unwrap()).await;
/// assert_eq!(res.unwrap().into_body(), "hello");
/// # }
/// ```
pub struct Polite<S, K = Origin> {
    inner: S,
    layer: PoliteLayer<K>,
}

impl Polite<(), Origin> {
    /// A [`PoliteLayer`] with the defaults (keyed by origin, at most 60 s of wait).
    ///
    /// ```
    /// use ratekeeper_tower::client::Polite;
    ///
    /// let layer = Polite::layer();
    /// # let _ = layer;
    /// ```
    pub fn layer() -> PoliteLayer {
        PoliteLayer::new()
    }
}

impl<S, K> Polite<S, K> {
    pub(super) fn from_parts(inner: S, layer: PoliteLayer<K>) -> Self {
        Self { inner, layer }
    }

    define_inner_service_accessors! {
        get_ref: [
            ///
            /// ```
            /// use ratekeeper_tower::client::Polite;
            /// use tower::Layer;
            ///
            /// let client = Polite::layer().layer(7);
            /// assert_eq!(*client.get_ref(), 7);
            /// ```
        ]
        get_mut: [
            ///
            /// ```
            /// use ratekeeper_tower::client::Polite;
            /// use tower::Layer;
            ///
            /// let mut client = Polite::layer().layer(7);
            /// *client.get_mut() += 1;
            /// assert_eq!(client.into_inner(), 8);
            /// ```
        ]
        into_inner: [
            ///
            /// ```
            /// use ratekeeper_tower::client::Polite;
            /// use tower::Layer;
            ///
            /// assert_eq!(Polite::layer().layer("inner").into_inner(), "inner");
            /// ```
        ]
    }

    /// The layer this service was made with; it shares this service's memory, so
    /// [`PoliteLayer::wait_for`] and [`PoliteLayer::clear`] act on it.
    ///
    /// ```
    /// use ratekeeper_tower::client::Polite;
    /// use tower::Layer;
    ///
    /// let client = Polite::layer().layer(());
    /// assert_eq!(client.polite_layer().wait_for("http://127.0.0.1:3000"), None);
    /// ```
    pub fn polite_layer(&self) -> &PoliteLayer<K> {
        &self.layer
    }
}

impl<S: Clone, K> Clone for Polite<S, K> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

impl<S: fmt::Debug, K> fmt::Debug for Polite<S, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Polite")
            .field("inner", &self.inner)
            .field("layer", &self.layer)
            .finish()
    }
}

impl<S, K, ReqB, ResB> Service<Request<ReqB>> for Polite<S, K>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone,
    K: ClientKey,
{
    type Response = Response<ResB>;
    type Error = Error<S::Error>;
    type Future = ResponseFuture<S, Request<ReqB>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Error::Service)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let (parts, body) = req.into_parts();
        let key = self.layer.key.key(&parts);
        let req = Request::from_parts(parts, body);
        let shared = std::sync::Arc::clone(&self.layer.shared);
        let now = Instant::now();
        let Some(until) = shared.blocked_until(&key, now) else {
            return ResponseFuture::call(self.inner.call(req), shared, key);
        };
        let wait = until - now;
        if wait > self.layer.max_wait {
            return match self.layer.over_deadline {
                OverDeadline::SendAnyway => {
                    tracing::debug!(%key, ?wait, "server asked for a longer wait than allowed; sending anyway");
                    ResponseFuture::call(self.inner.call(req), shared, key)
                }
                _ => ResponseFuture::refused(WaitTooLong {
                    wait,
                    max_wait: self.layer.max_wait,
                }),
            };
        }
        tracing::debug!(%key, ?wait, "waiting for the time the server announced");
        // Keep the service that was made ready for this request; a clone takes its place.
        let clone = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, clone);
        ResponseFuture::wait(
            until,
            now,
            self.layer.max_wait,
            self.layer.over_deadline,
            ready,
            req,
            shared,
            key,
        )
    }
}

impl<S, K> Layer<S> for PoliteLayer<K> {
    type Service = Polite<S, K>;

    fn layer(&self, inner: S) -> Self::Service {
        Polite::from_parts(inner, self.clone())
    }
}
