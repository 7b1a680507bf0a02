//! Charges that follow the response: a policy's true cost read from the response (a header
//! or a trailer) or counted from its body as it streams, such as the tokens a language model
//! generated.
//!
//! # Reserve, then settle
//!
//! The request is charged an **estimate** when it arrives: the layer's [`Cost`](crate::cost::Cost)
//! (a per-route default, a request header such as `max-tokens`, or a request extension an
//! earlier layer set from the body, see the recipe below) or a resolver's
//! [`Plan::charge_cost`](crate::policy::Plan::charge_cost). A request whose estimate does not
//! fit is refused with a 429 like any other. For a policy named in
//! [`RateLimitBuilder::usage`](crate::RateLimitBuilder::usage), the charge is then
//! **settled** once the true cost is known, through
//! [`Store::correct`](ratekeeper_core::store::Store::correct) with the receipt the decision
//! carried (so it works on every store and algorithm):
//!
//! - true cost below the estimate: the difference is given back, as far as the receipt says
//!   the charge still holds (nothing once its window closed or the bucket drained);
//! - true cost above the estimate: the difference is charged **without refusing** (the
//!   response was already sent), so the key may go over its limit and its next requests wait
//!   until the debt has refilled;
//! - equal: nothing.
//!
//! The policies not named keep their charge (a requests-per-minute policy beside a
//! tokens-per-minute one, say).
//!
//! | source | settled when | missing, repeated, or not digits only |
//! |---|---|---|
//! | [`Usage::header`] | the response head arrives | the estimate is kept |
//! | [`Usage::trailer`] | the body ends or is dropped (with the trailer, if it came) | the estimate is kept |
//! | [`Usage::body`] | the body ends, fails or is dropped | (the [`Tally`] always answers) |
//!
//! A header or trailer is read as a decimal count: ASCII digits only (no sign, no
//! fraction), spaces around them allowed. A field that appears more than once (`5` and
//! `50`) is garbled, as neither count can be trusted over the other. A count too large for
//! a `u64` is not garbled: it is the largest count there is, and is charged like any count
//! above the capacity (see [the bound](#the-bound)).
//!
//! A kept estimate is logged at DEBUG (target `ratekeeper::usage`); nothing on this path
//! panics, and a charge is never lost: until the true cost is known the estimate stands.
//! A body dropped before its end (the client went away, a timeout) is settled with what
//! the [`Tally`] counted so far, so a cancelled stream is charged what it produced. A charge
//! that a [`Settle`](crate::policy::Settle) rule gives back for the response status is not
//! corrected (it is already refunded); a charge the store denied (a request a fallback or
//! [`Mode::Shadow`](crate::rate_limit::Mode::Shadow) let through) took nothing and is not
//! corrected either.
//!
//! The rate-limit headers of the response describe the state **after the estimate** (they
//! are written with the response head, before a body is counted); the next response shows
//! the settled state. 429 answers, their problem+json body and the polite
//! [`client`](crate::client) are unchanged.
//!
//! # The bound
//!
//! A correction above the estimate is never refused, so it is the only way a key goes over
//! its quota. Per key and policy, with at most `R` requests in flight and corrections of at
//! most `C` units above their estimates, the units charged beyond the quota are at most
//! `R × C` at any instant: each admitted request fitted with its estimate, and each can add
//! at most `C` after it was admitted. With estimates that are upper bounds (`max_tokens`:
//! a model never generates more than it was allowed), every correction gives back and the
//! overshoot is **zero**.
//!
//! A reported true cost is charged at most the policy's capacity
//! ([`Policy::capacity`](ratekeeper_core::Policy::capacity): its burst, or its limit for the
//! window algorithms), or the estimate when that is larger. A response that reports more (a
//! backend bug, or a header passed through from elsewhere; also a count too large for a
//! `u64`, such as `18446744073709551616`) can empty the key's budget but
//! never lock the key out for longer than the policy takes to refill it whole; so `C` above
//! is at most the capacity minus the smallest estimate.
//!
//! # Example: tokens from a response header
//!
//! ```
//! use std::convert::Infallible;
//! use std::num::NonZeroU32;
//! use axum::http::{HeaderName, Request, Response};
//! use ratekeeper_core::{Policy, Quota};
//! use ratekeeper_tower::usage::Usage;
//! use ratekeeper_tower::{key::GlobalKey, RateLimitLayer, RequestParts};
//! use tower::{ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let layer = RateLimitLayer::builder()
//!     .policy(Policy::new("tokens", Quota::per_day(NonZeroU32::new(1000).unwrap())))
//!     .key(GlobalKey)
//!     // The estimate: the client's `max-tokens` header (at least 1, at most 500).
//!     .cost_fn(|req: &RequestParts<'_>| {
//!         let max = req.headers().get("max-tokens").and_then(|v| v.to_str().ok());
//!         max.and_then(|v| v.parse::<u64>().ok()).unwrap_or(500).clamp(1, 500)
//!     })
//!     // The true cost: the backend's `x-usage-tokens` header.
//!     .usage("tokens", Usage::header(HeaderName::from_static("x-usage-tokens")))
//!     .build()?;
//! let svc = ServiceBuilder::new().layer(layer).service_fn(|_req: Request<()>| async {
//!     let res = Response::builder().header("x-usage-tokens", "30").body(String::new());
//!     Ok::<_, Infallible>(res.unwrap())
//! });
//! let ask = || Request::builder().header("max-tokens", "100").body(()).unwrap();
//!
//! let first = svc.clone().oneshot(ask()).await?;
//! // The headers show the state after the estimate: 1000 - 100.
//! assert_eq!(first.headers()["x-ratelimit-remaining"], "900");
//! // Settled to 30 tokens: the next request sees 1000 - 30 - 100.
//! let second = svc.clone().oneshot(ask()).await?;
//! assert_eq!(second.headers()["x-ratelimit-remaining"], "870");
//! # Ok(())
//! # }
//! ```
//!
//! # Example: tokens counted from a streamed body
//!
//! A [`Tally`] sees every data frame of the response body and says how many units the
//! response has cost so far; the last answer (at the end, an error or a drop) settles the
//! charge. Here each `data:` line of a server-sent-events stream is one token:
//!
//! ```
//! use ratekeeper_tower::usage::{BodyEvent, Usage};
//!
//! let usage = Usage::body(|_head| {
//!     let mut tokens = 0u64;
//!     move |event: BodyEvent<'_>| {
//!         if let BodyEvent::Data(bytes) = event {
//!             let events = bytes.split(|&b| b == b'\n').filter(|line| line.starts_with(b"data:"));
//!             tokens += events.count() as u64;
//!         }
//!         tokens
//!     }
//! });
//! # let _ = usage;
//! ```
//!
//! A tally sees the frames as the body yields them: an event split across two frames must be
//! joined by the tally itself (keep the unfinished line in its state).
//!
//! # Recipe: the estimate from `max_tokens` in a JSON body
//!
//! The [`Cost`](crate::cost::Cost) sees the request head only. To reserve what a JSON body
//! asks for, read the body in a layer **outside** the rate limit (the body is buffered
//! there anyway to parse it; bound its size), put the number in a request extension and
//! give the request on with the same bytes; the cost reads the extension:
//!
//! ```
//! use ratekeeper_tower::RequestParts;
//!
//! /// Set by a body-reading layer outside the rate limit: the request's `max_tokens`.
//! #[derive(Clone, Copy)]
//! struct MaxTokens(u64);
//!
//! /// The estimate: `max_tokens` (at least 1), or 1 000 when the body did not say.
//! let estimate = |req: &RequestParts<'_>| {
//!     req.extensions().get::<MaxTokens>().map_or(1_000, |m| m.0.max(1))
//! };
//! # let _ = estimate;
//! ```
//!
//! With axum that layer is `axum::middleware::from_fn` around `axum::body::to_bytes` and
//! `serde_json` (the `llm_tokens` example does exactly this). Cap the estimate at the
//! policy's burst, or a request asking for more than the burst is refused as "can never
//! fit".

mod metered;
#[cfg(test)]
mod tests;

use std::fmt;
use std::sync::Arc;

use http::{HeaderMap, HeaderName};

pub(crate) use metered::{Corrector, Metered, USAGE_TARGET, UsageRules, corrections};

/// Where a policy's true cost comes from once the response is known (see the
/// [module docs](self)). Given to [`RateLimitBuilder::usage`](crate::RateLimitBuilder::usage)
/// with the policy it settles.
#[derive(Clone)]
pub struct Usage {
    source: Source,
}

/// A per-response [`Tally`] maker.
type Start = dyn Fn(&http::response::Parts) -> Box<dyn Tally> + Send + Sync;

#[derive(Clone)]
enum Source {
    Header(HeaderName),
    Trailer(HeaderName),
    Body(Arc<Start>),
}

impl Usage {
    /// The true cost is the response header `name`, a decimal count (such as
    /// `x-usage-tokens: 312`). A response without it, with the header more than once, or with
    /// a value that is not digits only keeps the estimate (logged at DEBUG); a count above
    /// the policy's capacity (also one too large for a `u64`) is charged the capacity. The
    /// header is left on the response.
    pub fn header(name: HeaderName) -> Self {
        Self {
            source: Source::Header(name),
        }
    }

    /// The true cost is the trailer `name` of the response body (HTTP/2 or chunked HTTP/1.1
    /// trailers, gRPC-style), a decimal count. The charge is settled when the body ends, fails
    /// or is dropped, with the trailer if it came; without it (or with the trailer more than
    /// once, or a value that is not digits only) the estimate is kept (logged at DEBUG); a
    /// count above the policy's capacity (also one too large for a `u64`) is charged the
    /// capacity.
    pub fn trailer(name: HeaderName) -> Self {
        Self {
            source: Source::Trailer(name),
        }
    }

    /// The true cost is counted from the response body as it streams: `start` is called once
    /// per response with its head and returns a [`Tally`] that sees every frame of the body
    /// and answers with the units counted so far. Its answer to the body's end
    /// ([`BodyEvent::End`]), error ([`BodyEvent::Error`]) or drop ([`BodyEvent::Dropped`]:
    /// the client went away) settles the charge.
    ///
    /// One `Box` per response the policy charged.
    pub fn body<F, T>(start: F) -> Self
    where
        F: Fn(&http::response::Parts) -> T + Send + Sync + 'static,
        T: Tally,
    {
        Self {
            source: Source::Body(Arc::new(move |head: &http::response::Parts| {
                Box::new(start(head)) as Box<dyn Tally>
            })),
        }
    }
}

impl fmt::Debug for Usage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.source {
            Source::Header(name) => f.debug_tuple("Usage::header").field(name).finish(),
            Source::Trailer(name) => f.debug_tuple("Usage::trailer").field(name).finish(),
            Source::Body(_) => f.write_str("Usage::body(..)"),
        }
    }
}

/// What a [`Tally`] sees of a response body.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum BodyEvent<'a> {
    /// One data frame, as the body yielded it.
    Data(&'a [u8]),
    /// The trailers.
    Trailers(&'a HeaderMap),
    /// The body ended (its last frame was read). Final.
    End,
    /// The body failed with an error. Final.
    Error,
    /// The body was dropped before its end (the client went away, a timeout). Final.
    Dropped,
}

impl BodyEvent<'_> {
    /// Whether this is the last event a tally sees ([`BodyEvent::End`], [`BodyEvent::Error`]
    /// or [`BodyEvent::Dropped`]).
    pub fn is_final(&self) -> bool {
        matches!(self, Self::End | Self::Error | Self::Dropped)
    }
}

/// Counts a response's true cost from its body (see [`Usage::body`]).
///
/// Closures `FnMut(BodyEvent<'_>) -> u64` are tallies. Each event's answer is the number of
/// units the response has cost so far; the answer to the final event (exactly one of
/// [`BodyEvent::End`], [`BodyEvent::Error`], [`BodyEvent::Dropped`], then no more events)
/// settles the charge.
pub trait Tally: Send + Sync + 'static {
    /// Sees one event of the body; returns the units counted so far.
    fn count(&mut self, event: BodyEvent<'_>) -> u64;
}

impl<F> Tally for F
where
    F: FnMut(BodyEvent<'_>) -> u64 + Send + Sync + 'static,
{
    fn count(&mut self, event: BodyEvent<'_>) -> u64 {
        self(event)
    }
}

impl fmt::Debug for dyn Tally {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Tally")
    }
}
