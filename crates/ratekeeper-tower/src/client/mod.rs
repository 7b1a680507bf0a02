//! Polite clients: a layer for HTTP *clients* that honours the rate-limit fields servers send.
//!
//! [`PoliteLayer`] wraps any tower `Service<http::Request<B>>` that answers
//! `http::Response<_>` and is `Clone`: hyper's `hyper_util::client::legacy::Client`, a
//! `tower::buffer::Buffer` around a connection, a `service_fn`. After each response it reads
//! what the server announced, and when the server said nothing is left, the next request to
//! that server waits until the reset before it is sent. It never retries by itself: a 429
//! is still handed to the caller, and it is the *next* request that waits.
//!
//! # What is read
//!
//! | field | asks to wait when | for |
//! |---|---|---|
//! | `Retry-After` (on a 429 or 503) | always | its number, or until the HTTP-date |
//! | `RateLimit` (draft-ietf-httpapi-ratelimit-headers-11) | an item has `r=0` | its `t` (the longest among such items) |
//! | `X-RateLimit-Remaining` + `X-RateLimit-Reset` | remaining is `0` | the reset |
//! | `RateLimit-Remaining` + `RateLimit-Reset` (drafts -00 to -03) | remaining is `0` | the reset |
//!
//! Servers write these numbers in different units whatever the field's definition says, so
//! every number (the reset, `t`, a numeric `Retry-After`) is read by plausibility, the same
//! way in every field:
//!
//! | value | read as |
//! |---|---|
//! | below 10⁹ | delay seconds |
//! | 10⁹ to 10¹² − 1 | a Unix time in seconds (2001-09-09 onwards) |
//! | 10¹² to 10¹⁵ − 1 | a Unix time in milliseconds (2001-09-09 onwards) |
//! | 10¹⁵ and above | implausible: ignored |
//!
//! A Unix time or HTTP-date in the past means no wait; a wait longer than one year, in any
//! unit, is implausible and ignored (one odd answer never locks an origin away for a year).
//!
//! When several fields apply the longest wait wins. The latest word wins between answers:
//! the answer to a request sent after a wait was recorded replaces it, shorter or longer,
//! and a remaining count above 0 (or `Retry-After: 0`, or a reset already past) clears it;
//! the answer to a request sent before the wait was announced can only lengthen it. A
//! request already waiting follows: it wakes early when the wait is shortened or cleared,
//! and waits longer (never past `max_wait` from its call) when it is lengthened. Malformed fields are ignored, as the IETF draft asks of clients:
//! a value that is not exactly the syntax above, a field sent twice (except `RateLimit`, a
//! list), a value longer than 4096 bytes.
//!
//! # Which requests wait, and how long at most
//!
//! Announcements are remembered per key: by default the request's origin
//! (`scheme://host:port`, see [`Origin`]), or any [`ClientKey`] set with
//! [`PoliteLayer::key`], such as the API token. The decision is made in `call`, never in
//! `poll_ready`, so requests to other keys go at once. A wait is bounded by
//! [`PoliteLayer::max_wait`] (default 60 s); beyond it the request fails at once with
//! [`Error::WaitTooLong`] without being sent, or is sent anyway with
//! [`OverDeadline::SendAnyway`]. Time comes from tokio (`tokio::time`), so tests can pause
//! it. Clones of the layer and of the service share one memory behind an `Arc`, holding at
//! most 10 000 keys at once.
//!
//! # Example
//!
//! A server that refuses the first request with `Retry-After: 2`; the client's second
//! request waits those 2 s before it reaches the server (the example runs on tokio's paused
//! clock, so it takes no real time):
//!
//! ```
//! use std::convert::Infallible;
//! use std::sync::{Arc, Mutex};
//! use std::time::Duration;
//! use axum::http::{Request, Response, StatusCode};
//! use ratekeeper_tower::client::PoliteLayer;
//! use tokio::time::Instant;
//! use tower::{Layer, ServiceExt, service_fn};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let start = Instant::now();
//! let seen = Arc::new(Mutex::new(Vec::new())); // when the server saw each request
//! let log = seen.clone();
//! let server = service_fn(move |_req: Request<()>| {
//!     let mut log = log.lock().unwrap();
//!     log.push(start.elapsed());
//!     let res = if log.len() == 1 {
//!         Response::builder().status(StatusCode::TOO_MANY_REQUESTS).header("retry-after", "2")
//!     } else {
//!         Response::builder()
//!     };
//!     std::future::ready(Ok::<_, Infallible>(res.body(()).unwrap()))
//! });
//! let client = PoliteLayer::new().layer(server);
//!
//! let req = || Request::get("http://127.0.0.1:3000/").body(()).unwrap();
//! let first = client.clone().oneshot(req()).await.unwrap();
//! assert_eq!(first.status(), StatusCode::TOO_MANY_REQUESTS);
//! let second = client.clone().oneshot(req()).await.unwrap();
//! assert_eq!(second.status(), StatusCode::OK);
//! assert_eq!(*seen.lock().unwrap(), [Duration::ZERO, Duration::from_secs(2)]);
//! # }
//! ```
//!
//! With hyper's client (crates `hyper-util` with features `client-legacy`, `http1` and
//! `tokio`, and `http-body-util`):
//!
//! ```
//! use http_body_util::Empty;
//! use hyper::body::Bytes;
//! use hyper_util::client::legacy::Client;
//! use hyper_util::rt::TokioExecutor;
//! use ratekeeper_tower::client::PoliteLayer;
//! use tower::Layer;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let http = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
//! let client = PoliteLayer::new().layer(http);
//! // client.clone().oneshot(Request::get("http://127.0.0.1:3000/").body(Empty::new())?).await
//! # let _ = client;
//! # }
//! ```

mod deadline;
mod error;
mod future;
mod key;
mod layer;
pub(crate) mod parse;
mod service;
mod state;
#[cfg(test)]
mod tests;

use std::time::{Duration, SystemTime};

use http::{HeaderMap, StatusCode};

pub use deadline::OverDeadline;
pub use error::{Error, WaitTooLong};
pub use future::ResponseFuture;
pub use key::{ClientKey, Origin};
pub use layer::PoliteLayer;
pub use service::Polite;

/// How long a response asks its client to wait before the next request, read as
/// [`PoliteLayer`] reads it (see the [module docs](self)): `Some(Duration::ZERO)` when its
/// fields say the client may go on (some left, a reset already past, `Retry-After: 0`), so a
/// wait recorded earlier can be dropped; `None` when it carries no field this reader
/// understands (absent, malformed or implausible).
///
/// For clients that are not tower services (such as `reqwest`, whose status and headers are
/// `http` types), to apply the same rules by hand.
///
/// ```
/// use std::time::Duration;
/// use axum::http::{HeaderMap, HeaderValue, StatusCode};
/// use ratekeeper_tower::client::announced_wait;
///
/// let mut headers = HeaderMap::new();
/// headers.insert("ratelimit", HeaderValue::from_static("\"default\";r=0;t=6"));
/// assert_eq!(announced_wait(StatusCode::OK, &headers), Some(Duration::from_secs(6)));
///
/// headers.insert("ratelimit", HeaderValue::from_static("\"default\";r=3;t=6"));
/// assert_eq!(announced_wait(StatusCode::OK, &headers), Some(Duration::ZERO));
///
/// assert_eq!(announced_wait(StatusCode::OK, &HeaderMap::new()), None);
/// ```
pub fn announced_wait(status: StatusCode, headers: &HeaderMap) -> Option<Duration> {
    parse::announced_wait_at(status, headers, SystemTime::now())
}
