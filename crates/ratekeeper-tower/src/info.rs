//! [`Info`]: the rate-limit decision for a request, readable by handlers.
//!
//! The [`RateLimit`](crate::RateLimit) service inserts an [`Info`] into the request's
//! extensions before it calls the inner service, so a handler can tell a client how much
//! budget is left or serve a cheaper answer near the limit. Requests let through over the
//! limit (shadow-mode overruns, degraded fallbacks) always carry it; allowed requests carry
//! it when the layer was built with
//! [`request_info(true)`](crate::RateLimitBuilder::request_info) (off by default: it
//! costs an allocation per request that most apps never read). axum users read it with the
//! `RateLimitInfo` extractor of `ratekeeper-axum`.
//!
//! # Example
//!
//! ```
//! use std::convert::Infallible;
//! use std::num::NonZeroU32;
//! use axum::http::{Request, Response};
//! use ratekeeper_core::Quota;
//! use ratekeeper_tower::info::Info;
//! use ratekeeper_tower::{key::GlobalKey, RateLimitLayer};
//! use tower::{ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let layer = RateLimitLayer::builder()
//!     .quota(Quota::per_minute(NonZeroU32::new(5).unwrap()))
//!     .key(GlobalKey)
//!     .request_info(true)
//!     .build()?;
//! let svc = ServiceBuilder::new().layer(layer).service_fn(|req: Request<()>| async move {
//!     let info = req.extensions().get::<Info>().cloned();
//!     let left = info.map_or(0, |i| i.remaining());
//!     Ok::<_, Infallible>(Response::new(format!("{left} left")))
//! });
//! let res = svc.oneshot(Request::new(())).await?;
//! let body = axum::body::to_bytes(axum::body::Body::new(res.into_body()), 1024).await?;
//! assert_eq!(&body[..], b"4 left");
//! # Ok(())
//! # }
//! ```

use std::sync::Arc;
use std::time::Duration;

use ratekeeper_core::Decision;
use ratekeeper_core::store::Decisions;
use smallvec::SmallVec;

/// The decisions of every policy of one rate limit for one request. Cheap to clone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Info {
    names: Arc<[Box<str>]>,
    /// The layer's policy index of each decision.
    policies: SmallVec<[usize; 2]>,
    decisions: Decisions,
    limited: bool,
}

impl Info {
    pub(crate) fn new(
        names: Arc<[Box<str>]>,
        policies: impl Iterator<Item = usize>,
        decisions: Decisions,
    ) -> Self {
        let limited = !decisions.is_allowed();
        Self {
            names,
            policies: policies.collect(),
            decisions,
            limited,
        }
    }

    fn name(&self, decision: usize) -> &str {
        self.policies
            .get(decision)
            .and_then(|&i| self.names.get(i))
            .map_or("", |n| &**n)
    }

    /// Whether the request was over the limit but let through anyway (shadow mode, or a
    /// degraded-response fallback answers it).
    pub fn is_limited(&self) -> bool {
        self.limited
    }

    /// The decision of every policy this request was charged to, in the order the resolver
    /// charged them (the default resolver charges every policy, in the order they were
    /// added; a resolver or route table may charge a subset).
    pub fn decisions(&self) -> &Decisions {
        &self.decisions
    }

    /// `(policy name, decision)` for every policy this request was charged to, in the order
    /// of [`Info::decisions`]: each decision is named after the policy that made it, also
    /// when the resolver charged only some of the layer's policies.
    pub fn policies(&self) -> impl Iterator<Item = (&str, &Decision)> {
        (0..self.decisions.as_slice().len())
            .map(|i| self.name(i))
            .zip(self.decisions.as_slice())
    }

    /// The policy that headers report (the one closest to exhaustion, or the denying one):
    /// its name and decision.
    pub fn deciding(&self) -> Option<(&str, &Decision)> {
        let i = self.decisions.deciding()?;
        Some((self.name(i), self.decisions.as_slice().get(i)?))
    }

    /// Whole cost-1 requests left under the deciding policy (0 when there is none).
    pub fn remaining(&self) -> u32 {
        self.deciding().map_or(0, |(_, d)| d.remaining())
    }

    /// Time until the deciding policy's quota is fully available again.
    pub fn reset_after(&self) -> Duration {
        self.deciding()
            .map_or(Duration::ZERO, |(_, d)| d.reset_after())
    }
}
