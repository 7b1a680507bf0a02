use std::time::Duration;

/// The error of a [`Polite`](super::Polite) service: the inner service's, or a wait longer
/// than allowed.
///
/// ```
/// use std::time::Duration;
/// use ratekeeper_tower::client::Error;
///
/// let e: Error<std::io::Error> = Error::Service(std::io::Error::other("refused"));
/// assert!(e.is_service());
/// assert!(!e.is_wait_too_long());
/// assert_eq!(e.to_string(), "refused");
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error<E> {
    /// The inner service (the HTTP client) failed.
    #[error(transparent)]
    Service(E),
    /// The server asked for a longer wait than [`PoliteLayer::max_wait`](super::PoliteLayer::max_wait)
    /// allows, and [`OverDeadline::Fail`](super::OverDeadline::Fail) is set: the request was not
    /// sent.
    #[error(transparent)]
    WaitTooLong(WaitTooLong),
}

impl<E> Error<E> {
    /// Whether the inner service failed.
    ///
    /// ```
    /// use ratekeeper_tower::client::Error;
    ///
    /// assert!(Error::Service("boom").is_service());
    /// ```
    pub fn is_service(&self) -> bool {
        matches!(self, Self::Service(_))
    }

    /// Whether the request was not sent because the announced wait was too long.
    ///
    /// ```
    /// use ratekeeper_tower::client::Error;
    ///
    /// assert!(!Error::Service("boom").is_wait_too_long());
    /// ```
    pub fn is_wait_too_long(&self) -> bool {
        matches!(self, Self::WaitTooLong(_))
    }

    /// The inner service's error, if that is what this is.
    ///
    /// ```
    /// use ratekeeper_tower::client::Error;
    ///
    /// assert_eq!(Error::Service("boom").into_service(), Some("boom"));
    /// ```
    pub fn into_service(self) -> Option<E> {
        match self {
            Self::Service(e) => Some(e),
            Self::WaitTooLong(_) => None,
        }
    }
}

/// A request was not sent: the server asked for a longer wait than allowed.
///
/// ```
/// use std::convert::Infallible;
/// use std::time::Duration;
/// use axum::http::{Request, Response, StatusCode};
/// use ratekeeper_tower::client::{Error, PoliteLayer};
/// use tower::{Layer, ServiceExt, service_fn};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// // A server that always answers 429 with `Retry-After: 120` (seconds).
/// let server = service_fn(|_req: Request<()>| async {
///     let res = Response::builder().status(StatusCode::TOO_MANY_REQUESTS).header("retry-after", "120");
///     Ok::<_, Infallible>(res.body(()).unwrap())
/// });
/// let client = PoliteLayer::new().max_wait(Duration::from_secs(60)).layer(server);
/// let req = || Request::get("http://127.0.0.1:3000/").body(()).unwrap();
/// assert_eq!(client.clone().oneshot(req()).await.unwrap().status(), 429);
///
/// let Err(Error::WaitTooLong(e)) = client.clone().oneshot(req()).await else { panic!() };
/// assert_eq!(e.wait(), Duration::from_secs(120));
/// assert_eq!(e.max_wait(), Duration::from_secs(60));
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the server asked to wait {} before the next request, longer than the {} allowed",
    ratekeeper_core::throttle::seconds(*wait),
    ratekeeper_core::throttle::seconds(*max_wait)
)]
pub struct WaitTooLong {
    pub(super) wait: Duration,
    pub(super) max_wait: Duration,
}

impl WaitTooLong {
    /// How long the request would have had to wait, from the time it was called.
    ///
    /// ```
    /// # use ratekeeper_tower::client::WaitTooLong;
    /// fn wait_secs(e: &WaitTooLong) -> u64 { e.wait().as_secs() }
    /// # let _ = wait_secs;
    /// ```
    pub fn wait(&self) -> Duration {
        self.wait
    }

    /// The configured [`PoliteLayer::max_wait`](super::PoliteLayer::max_wait).
    ///
    /// ```
    /// # use ratekeeper_tower::client::WaitTooLong;
    /// fn limit_secs(e: &WaitTooLong) -> u64 { e.max_wait().as_secs() }
    /// # let _ = limit_secs;
    /// ```
    pub fn max_wait(&self) -> Duration {
        self.max_wait
    }
}
