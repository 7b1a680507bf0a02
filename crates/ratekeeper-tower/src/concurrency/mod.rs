//! Keyed concurrency limit: at most `max` requests in flight per key.
//!
//! One middleware, [`ConcurrencyLimitLayer`] / [`ConcurrencyLimit`] / [`ResponseFuture`],
//! whose slots are counted by a [`Limit`]: [`Local`] (this process's memory, the default),
//! [`Shared`] (a store shared by every instance, [`ConcurrencyLimitLayer::shared`]) or
//! [`Adaptive`](crate::adaptive::Adaptive) (a limit found from latency,
//! [`ConcurrencyLimitLayer::adaptive`]). The inner service must be `Clone` (as axum's
//! `Router` is): with a shared store, the ready service goes with the request while the
//! store decides, and a clone takes its place.
//!
//! [`ConcurrencyLimitLayer`] counts, per key (default: the peer IP), the requests that have
//! been admitted and whose response **body** has not ended yet: the permit is released when
//! the body yields its last frame, fails, or is dropped, not when the handler returns, so a
//! long download or stream keeps its slot. The `(max + 1)`-th concurrent request of a key
//! gets a `429` with `Retry-After: 1` (a slot has no known release time; 1 s is the smallest
//! allowed value), the rate-limit headers and the problem+json body of
//! [`report`](crate::report). When the layer serves gRPC
//! ([`ConcurrencyLimitLayer::grpc`]), a gRPC call gets a trailers-only `RESOURCE_EXHAUSTED`
//! instead, with the message
//! `rate limit "concurrency" exceeded; retry after 1 s` (see [`report`](crate::report#grpc)).
//!
//! Headers use the policy name `"concurrency"`: `X-RateLimit-Limit` is `max`,
//! `X-RateLimit-Remaining` the free slots after this request, no `X-RateLimit-Reset` (there
//! is no window); in IETF style `RateLimit-Policy: "concurrency";q=<max>;qu="concurrent-requests"`
//! and `RateLimit: "concurrency";r=<free>` (draft-ietf-httpapi-ratelimit-headers-11 §3.1,
//! quota unit `concurrent-requests`).
//!
//! # Upgrades and WebSocket sessions
//!
//! After a `101 Switching Protocols` the session runs on the upgraded connection, whose end
//! no response body shows and the layer cannot see: the upgraded I/O reaches the handler
//! through hyper's `OnUpgrade` extension, which the layer leaves alone so that WebSocket
//! extractors keep working. So the slot of a request with an `Upgrade` header field, and of
//! a `CONNECT` request (a tunnel, or a WebSocket over HTTP/2 extended CONNECT, which has no
//! `Upgrade` field), is also offered to the handler as an [`UpgradeSlot`] extension: a
//! handler that accepts the upgrade calls [`UpgradeSlot::keep`] and moves the
//! [`ConcurrencyPermit`] into the session task, and the slot stays taken until the session
//! ends. A handler that does not keep it frees the slot when the `101` (or the `CONNECT`'s
//! `200`) has been sent, as for any response whose body has ended.
//!
//! ```
//! use axum::http::{Request, Response, StatusCode};
//! use ratekeeper_tower::concurrency::UpgradeSlot;
//!
//! fn accept_upgrade(req: &Request<()>) -> Response<()> {
//!     let permit = req.extensions().get::<UpgradeSlot>().and_then(UpgradeSlot::keep);
//!     // With hyper: `let on_upgrade = hyper::upgrade::on(req);` then spawn the session:
//!     // `tokio::spawn(async move { let _slot = permit; /* serve on_upgrade.await */ });`
//!     drop(permit); // (here: no session to run)
//!     let mut res = Response::new(());
//!     *res.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
//!     res
//! }
//! # assert_eq!(accept_upgrade(&Request::new(())).status(), 101);
//! ```
//!
//! Unlike `tower::limit::ConcurrencyLimit`, which applies backpressure in `poll_ready` and so
//! queues everyone behind one slow client, this layer decides in `call` and per key.
//!
//! # Example
//!
//! ```
//! use std::convert::Infallible;
//! use std::num::NonZeroU32;
//! use axum::http::{Request, Response, StatusCode};
//! use ratekeeper_tower::concurrency::ConcurrencyLimitLayer;
//! use ratekeeper_tower::key::GlobalKey;
//! use tower::{ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let svc = ServiceBuilder::new()
//!     .layer(ConcurrencyLimitLayer::new(NonZeroU32::MIN).key(GlobalKey))
//!     .service_fn(|_req: Request<()>| async { Ok::<_, Infallible>(Response::new("hi".to_owned())) });
//!
//! let first = svc.clone().oneshot(Request::new(())).await?; // body not read yet
//! assert_eq!(first.headers()["x-ratelimit-remaining"], "0");
//! let second = svc.clone().oneshot(Request::new(())).await?;
//! assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
//! assert_eq!(second.headers()["retry-after"], "1");
//!
//! // Reading the body to its end frees the slot again.
//! axum::body::to_bytes(axum::body::Body::new(first.into_body()), 1024).await?;
//! let third = svc.clone().oneshot(Request::new(())).await?;
//! assert_eq!(third.status(), StatusCode::OK);
//! # Ok(())
//! # }
//! ```

//! # Across instances
//!
//! [`ConcurrencyLimitLayer::shared`] counts the slots in a store shared by every instance
//! (the Redis store's `RedisStore::slots()`, with the `redis` feature), so the limit holds
//! across a fleet: the layer's slots become [`Shared`] ones; the layer takes a slot with one
//! round trip before calling the inner service and holds it until the response body ends. With
//! Redis, a slot is a lease renewed while its request runs, so the slots of an instance that
//! dies free themselves within the lease (2.5 s by default, renewed every 0.5 s). Any
//! [`SharedSlots`] store works:
//!
//! ```
//! use std::convert::Infallible;
//! use std::num::NonZeroU32;
//! use std::sync::{Arc, Mutex};
//! use axum::http::{Request, Response, StatusCode};
//! use ratekeeper_tower::concurrency::ConcurrencyLimitLayer;
//! use ratekeeper_core::store::slots::{AcquireFuture, Acquired, SharedSlots, SlotLease};
//! use ratekeeper_core::Key;
//! use ratekeeper_tower::key::GlobalKey;
//! use tower::{ServiceBuilder, ServiceExt};
//!
//! /// Slots in this process (a stand-in for `RedisStore::slots()`).
//! #[derive(Clone, Default)]
//! struct Slots(Arc<Mutex<u32>>);
//! struct Release(Arc<Mutex<u32>>);
//! impl Drop for Release {
//!     fn drop(&mut self) {
//!         *self.0.lock().unwrap() -= 1;
//!     }
//! }
//! impl SharedSlots for Slots {
//!     fn acquire(&self, _key: &Key, max: u32) -> AcquireFuture {
//!         let mut held = self.0.lock().unwrap();
//!         let answer = if *held < max {
//!             *held += 1;
//!             Acquired::Held { lease: SlotLease::new(Release(self.0.clone())), free: max - *held }
//!         } else {
//!             Acquired::Full
//!         };
//!         Box::pin(std::future::ready(Ok(answer)))
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let slots = Slots::default();
//! let svc = ServiceBuilder::new()
//!     .layer(ConcurrencyLimitLayer::new(NonZeroU32::MIN).key(GlobalKey).shared(slots.clone()))
//!     .service_fn(|_req: Request<()>| async { Ok::<_, Infallible>(Response::new("hi".to_owned())) });
//!
//! let first = svc.clone().oneshot(Request::new(())).await?; // holds the one slot
//! let second = svc.clone().oneshot(Request::new(())).await?;
//! assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
//! axum::body::to_bytes(axum::body::Body::new(first.into_body()), 1024).await?;
//! assert_eq!(*slots.0.lock().unwrap(), 0); // released at the end of the body
//! # Ok(())
//! # }
//! ```
//!
//! [`SharedSlots`]: ratekeeper_core::store::slots::SharedSlots

mod adaptive;
mod answer;
mod counter;
mod future;
mod held;
mod layer;
mod limit;
mod local;
mod permit;
mod service;
mod shared;
mod upgrade;

#[cfg(test)]
mod tests;

pub use future::{ConcurrencyBody, ResponseFuture};
pub use layer::ConcurrencyLimitLayer;
pub use limit::Limit;
pub use local::Local;
pub use service::ConcurrencyLimit;
pub use shared::Shared;
pub use upgrade::{ConcurrencyPermit, UpgradeSlot};
