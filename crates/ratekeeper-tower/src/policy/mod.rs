//! Which policies a request is charged to, with which key and cost, and what happens once the
//! response status is known.
//!
//! A layer has a list of named policies (added with
//! [`Builder::policy`](crate::RateLimitBuilder::policy)), a key extractor and a cost. For each
//! request a [`Resolve`] strategy fills a [`Plan`]: the policies that apply, each with the
//! layer's key and cost or its own. All charges of one request are checked all-or-nothing: if
//! any policy denies, none is charged.
//!
//! - [`AllPolicies`] (the default): every policy, the layer's key and cost.
//! - [`RouteTable`](crate::route::RouteTable): per-route costs and route-scoped policies keyed
//!   by method and route template.
//! - Closures `Fn(&RequestParts<'_>, &mut Plan<'_>)` (as they are, or through [`resolve_fn`]
//!   to infer their parameter types): tiers by plan, per-policy keys, anything.
//! - [`Except`]: exempt requests matching a predicate.
//!
//! The layer also exempts, before any key is extracted: clients in
//! [`Builder::exempt_networks`](crate::RateLimitBuilder::exempt_networks) (by the client's
//! address as trusted proxies report it, never a proxy's) and, only when
//! asked with [`Builder::exempt_preflight`](crate::RateLimitBuilder::exempt_preflight), CORS
//! preflights (see [`crate::cors`]);
//! and after the key is extracted, keys in [`Builder::exempt_keys`](crate::RateLimitBuilder::exempt_keys).
//! Exempt requests reach the inner service without rate-limit headers.
//!
//! After the response, a policy's [`Settle`] rule may give its charge back (refund on a 5xx,
//! or count only failed logins), through [`Store::refund`](ratekeeper_core::store::Store::refund)
//! with the receipt of that charge: a charge whose window has closed, whose log entry expired
//! or that the bucket already drained gives back nothing, so a late refund never frees quota
//! that belongs to later requests.
//! The charge is taken when the request is admitted, so concurrent requests cannot overshoot;
//! the headers of that response show the state before the refund. When the inner service
//! fails with an error (no status) or the response future is dropped, the charge is kept.
//! A charge whose true cost follows the response (a header, a trailer, the streamed body) is
//! corrected to it by a [`usage`](crate::usage) rule, unless its settle rule gave it back.
//!
//! # Example: ban for 15 minutes after 10 failed logins
//!
//! A [`Ban`](ratekeeper_core::Ban) refuses a key for longer than its policy's window once the
//! policy has refused it often enough. With a settle rule that keeps only the charges of
//! `401`s, the policy's refusals are "too many failed logins": a quota of 10 per 15 minutes
//! (the sliding log counts exactly the last 15 minutes), counting only `401`s, refuses the
//! attempt after 10 failures within 15 minutes, and a ban after 1 refusal then refuses
//! every attempt of that client, right password or not, for 15 minutes from that refusal
//! (`Retry-After` = the ban's end, counted down; attempts during the ban do not extend
//! it). Successful logins cost nothing. Each ban is counted once in the `metrics` counter
//! `ratekeeper_bans_total{policy}` and logged once.
//!
//! ```
//! use std::num::NonZeroU32;
//! use std::time::Duration;
//! use axum::http::{Request, Response, StatusCode};
//! use ratekeeper_core::{Algorithm, Ban, Policy};
//! use ratekeeper_tower::key::HeaderKey;
//! use ratekeeper_tower::policy::Settle;
//! use ratekeeper_tower::RateLimitLayer;
//! use tower::{ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let fifteen_minutes = Duration::from_secs(15 * 60);
//! let layer = RateLimitLayer::builder()
//!     .policy(
//!         Policy::new("login", "10/15min".parse()?)
//!             .with_algorithm(Algorithm::SlidingLog)
//!             .with_ban(Ban::after(NonZeroU32::MIN, fifteen_minutes).lasting(fifteen_minutes)),
//!     )
//!     .settle("login", Settle::COUNT_UNAUTHORIZED)
//!     .key(HeaderKey::raw("x-user")) // or the peer IP (the default)
//!     .build()?;
//! let login = ServiceBuilder::new().layer(layer).service_fn(|req: Request<()>| async move {
//!     let right = req.headers().get("x-password").is_some_and(|p| p == "right");
//!     let status = if right { StatusCode::OK } else { StatusCode::UNAUTHORIZED };
//!     let mut res = Response::new(String::new());
//!     *res.status_mut() = status;
//!     Ok::<_, std::convert::Infallible>(res)
//! });
//! let attempt = |password: &'static str| {
//!     let req = Request::post("/login")
//!         .header("x-user", "alice")
//!         .header("x-password", password)
//!         .body(())
//!         .unwrap();
//!     login.clone().oneshot(req)
//! };
//! for _ in 0..10 {
//!     assert_eq!(attempt("wrong").await?.status(), StatusCode::UNAUTHORIZED);
//! }
//! let banned = attempt("right").await?;
//! assert_eq!(banned.status(), StatusCode::TOO_MANY_REQUESTS);
//! assert_eq!(banned.headers()["retry-after"], "900");
//! # Ok(())
//! # }
//! ```
//!
//! # Example: tiers
//!
//! ```
//! use std::num::NonZeroU32;
//! use axum::http::{Request, StatusCode};
//! use ratekeeper_core::{Policy, Quota};
//! use ratekeeper_tower::key::PeerAddr;
//! use ratekeeper_tower::policy::resolve_fn;
//! use ratekeeper_tower::RateLimitLayer;
//! use tower::{ServiceBuilder, ServiceExt};
//!
//! #[derive(Clone, Copy, PartialEq)]
//! enum Tier { Free, Paid }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let layer = RateLimitLayer::builder()
//!     .policy(Policy::new("free", Quota::per_minute(NonZeroU32::new(1).unwrap())))
//!     .policy(Policy::new("paid", Quota::per_minute(NonZeroU32::new(1000).unwrap())))
//!     .resolver(resolve_fn(|req, plan| {
//!         match req.extensions().get::<Tier>() {
//!             Some(Tier::Paid) => plan.charge("paid"),
//!             _ => plan.charge("free"),
//!         };
//!     }))
//!     .build()
//!     .unwrap();
//! let svc = ServiceBuilder::new()
//!     .layer(layer)
//!     .service_fn(|_req: Request<()>| async { Ok::<_, std::convert::Infallible>(axum::http::Response::new(String::new())) });
//! let req = |tier: Tier| {
//!     let mut req = Request::new(());
//!     req.extensions_mut().insert(PeerAddr("192.0.2.1:1".parse().unwrap()));
//!     req.extensions_mut().insert(tier);
//!     req
//! };
//! let free = svc.clone().oneshot(req(Tier::Free)).await.unwrap();
//! assert_eq!(free.headers()["x-ratelimit-limit"], "1");
//! let free = svc.clone().oneshot(req(Tier::Free)).await.unwrap();
//! assert_eq!(free.status(), StatusCode::TOO_MANY_REQUESTS);
//! let paid = svc.clone().oneshot(req(Tier::Paid)).await.unwrap();
//! assert_eq!(paid.status(), StatusCode::OK);
//! assert_eq!(paid.headers()["x-ratelimit-remaining"], "999");
//! # }
//! ```

mod plan;
mod resolve;
mod settle;
#[cfg(test)]
mod tests;

pub(crate) use plan::Applied;
pub use plan::Plan;
pub use resolve::{AllPolicies, Except, Resolve, ResolveFn, resolve_fn};
pub(crate) use settle::Rules;
pub use settle::Settle;
