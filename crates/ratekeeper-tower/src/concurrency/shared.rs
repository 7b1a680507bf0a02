//! [`Shared`]: the slots of a store shared by every instance
//! ([`ConcurrencyLimitLayer::shared`](super::ConcurrencyLimitLayer::shared)).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, Request, Version};
use ratekeeper_core::store::slots::{Acquired, SharedSlots};
use ratekeeper_core::store::{Decisions, FailurePolicy, StoreError};
use ratekeeper_core::{Decision, Key, Outcome};

use super::answer::refused;
use super::limit::{Acquire, Answer, Decide, Decided, Limit, Pending};
use super::permit::Permit;
use crate::report::{Reporter, Unavailable, trailers_only};

/// The slots of a [`ConcurrencyLimitLayer`](super::ConcurrencyLimitLayer) counted in a store
/// shared by every instance (made by
/// [`ConcurrencyLimitLayer::shared`](super::ConcurrencyLimitLayer::shared)): at most `max`
/// requests in flight per key across every instance sharing the store.
///
/// Same answers as [`Local`](super::Local) (headers, 429 with `Retry-After: 1`, gRPC,
/// upgrades, slot held until the response body ends). The decision takes one round trip to
/// the store, made in the response future before the inner service is called. When the store
/// cannot decide, its failure policy applies: [`FailurePolicy::Deny`] answers
/// `503 Service Unavailable` with `Retry-After` (see
/// [`ConcurrencyLimitLayer::unavailable_retry_after`](super::ConcurrencyLimitLayer::unavailable_retry_after));
/// every other policy passes the request without a slot and without rate-limit headers
/// (fail open).
pub struct Shared {
    pub(crate) state: Arc<State>,
}

/// What every service of a shared limit reads.
pub(crate) struct State {
    pub(crate) max: u32,
    pub(crate) slots: Arc<dyn SharedSlots>,
    pub(crate) reporter: Arc<Reporter>,
    pub(crate) unavailable: Unavailable,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("max", &self.state.max)
            .field("style", &self.state.reporter.style)
            .finish_non_exhaustive()
    }
}

impl Limit for Shared {
    fn acquire<B>(&self, key: &Key, _req: &mut Request<B>) -> Acquire {
        Acquire(Answer::Pending(Pending {
            acquire: self.state.slots.acquire(key, self.state.max),
            decide: Arc::clone(&self.state) as _,
        }))
    }

    fn serves_grpc(&self) -> bool {
        self.state.reporter.grpc
    }

    fn describe(&self) -> &'static str {
        "concurrency limiter"
    }
}

impl Decide for State {
    /// What the store's answer means for a request: a slot, a refusal (all slots taken, or
    /// the store failed closed), or a pass: the store failed open and the request goes on
    /// without a slot or headers.
    fn decide(
        &self,
        answer: Result<Acquired, StoreError>,
        version: Version,
        headers: &HeaderMap,
    ) -> Decided {
        let max = self.max;
        match answer {
            Ok(Acquired::Held { lease, free }) => Decided::Slot {
                permit: Permit::Shared(lease),
                reporter: Arc::clone(&self.reporter),
                decisions: Decisions::new([Decision::new(
                    Outcome::Allowed,
                    max,
                    free,
                    Duration::ZERO,
                )]),
            },
            Ok(Acquired::Full) => {
                let grpc = self.reporter.grpc_call(version, headers);
                let (status, headers, body) = refused(&self.reporter, max, grpc);
                Decided::Refused(status, headers, body)
            }
            Err(err) if err.failure_policy() == FailurePolicy::Deny => {
                // The store logs the outage once per transition; one DEBUG event per request.
                tracing::debug!(error = %err, "shared concurrency slots unavailable; failing closed");
                let (mut status, mut answer_headers, mut body) = self.unavailable.parts();
                if let Some(content_type) = self.reporter.grpc_call(version, headers) {
                    (status, body) =
                        trailers_only(status, &mut answer_headers, &body, None, content_type);
                }
                Decided::Refused(status, answer_headers, body)
            }
            Err(err) => {
                tracing::debug!(error = %err, "shared concurrency slots unavailable; failing open");
                Decided::Pass
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::num::NonZeroU32;
    use std::sync::atomic::{AtomicU32, Ordering};

    use bytes::Bytes;
    use http::StatusCode;
    use http_body_util::BodyExt as _;
    use ratekeeper_core::Key;
    use ratekeeper_core::store::StoreError;
    use ratekeeper_core::store::slots::{AcquireFuture, SlotLease};
    use tower::{ServiceBuilder, ServiceExt};

    use http::Response;

    use super::*;
    use crate::concurrency::ConcurrencyLimitLayer;
    use crate::key::GlobalKey;

    /// Answers what `mode` says: 0 a slot (counted in `held` until dropped), 1 full, 2 a
    /// store failure with `policy`.
    struct Fake {
        mode: u32,
        policy: FailurePolicy,
        held: Arc<AtomicU32>,
    }

    struct Release(Arc<AtomicU32>);
    impl Drop for Release {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }

    impl SharedSlots for Fake {
        fn acquire(&self, _key: &Key, max: u32) -> AcquireFuture {
            let answer = match self.mode {
                0 => {
                    let held = self.held.fetch_add(1, Ordering::SeqCst) + 1;
                    Ok(Acquired::Held {
                        lease: SlotLease::new(Release(Arc::clone(&self.held))),
                        free: max - held,
                    })
                }
                1 => Ok(Acquired::Full),
                _ => Err(StoreError::Failed {
                    policy: self.policy,
                    source: Box::new(StoreError::Timeout),
                }),
            };
            Box::pin(std::future::ready(answer))
        }
    }

    async fn answer(mode: u32, policy: FailurePolicy) -> (Response<Bytes>, Arc<AtomicU32>) {
        let held = Arc::new(AtomicU32::new(0));
        let fake = Fake {
            mode,
            policy,
            held: Arc::clone(&held),
        };
        let svc = ServiceBuilder::new()
            .layer(
                ConcurrencyLimitLayer::new(NonZeroU32::new(3).unwrap())
                    .key(GlobalKey)
                    .shared(fake),
            )
            .service_fn(|_req: Request<()>| async {
                Ok::<_, Infallible>(Response::new(String::from("hi")))
            });
        let res = svc.oneshot(Request::new(())).await.unwrap();
        let (parts, body) = res.into_parts();
        assert_eq!(held.load(Ordering::SeqCst), u32::from(mode == 0));
        let body = body.collect().await.unwrap().to_bytes();
        (Response::from_parts(parts, body), held)
    }

    #[tokio::test]
    async fn held_slot_reports_headers_and_is_released_at_the_end_of_the_body() {
        let (res, held) = answer(0, FailurePolicy::Allow).await;
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(res.headers()["x-ratelimit-limit"], "3");
        assert_eq!(res.headers()["x-ratelimit-remaining"], "2");
        assert_eq!(held.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn full_is_a_429_with_retry_after_1() {
        let (res, _) = answer(1, FailurePolicy::Allow).await;
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(res.headers()["retry-after"], "1");
    }

    #[tokio::test]
    async fn store_failure_follows_the_failure_policy() {
        let (res, _) = answer(2, FailurePolicy::Deny).await;
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(res.headers()["content-type"], "application/problem+json");
        assert_eq!(res.headers()["retry-after"], "1");
        assert_eq!(res.headers()["cache-control"], "no-store");
        let problem: serde_json::Value = serde_json::from_slice(res.body()).unwrap();
        assert_eq!(
            problem["type"],
            crate::report::TEMPORARY_REDUCED_CAPACITY_TYPE
        );
        assert_eq!(
            problem["detail"],
            "the concurrency limiter cannot decide now (its store is unavailable); retry after 1 s"
        );
        let (res, _) = answer(2, FailurePolicy::Allow).await;
        assert_eq!(res.status(), StatusCode::OK);
        assert!(res.headers().get("x-ratelimit-limit").is_none());
        assert_eq!(res.body().as_ref(), b"hi");
    }

    /// A gRPC call to a layer that serves gRPC gets the fail-closed answer as `UNAVAILABLE`,
    /// with the same `retry-after`, a `RetryInfo`, and the configured wait rounded up.
    #[tokio::test]
    async fn fail_closed_grpc_call_is_unavailable_with_retry_after() {
        let fake = Fake {
            mode: 2,
            policy: FailurePolicy::Deny,
            held: Arc::new(AtomicU32::new(0)),
        };
        let svc = ServiceBuilder::new()
            .layer(
                ConcurrencyLimitLayer::new(NonZeroU32::new(3).unwrap())
                    .key(GlobalKey)
                    .grpc(true)
                    .shared(fake)
                    .unavailable_retry_after(Duration::from_millis(4_100)),
            )
            .service_fn(|_req: Request<()>| async {
                Ok::<_, Infallible>(Response::new(String::from("hi")))
            });
        let req = Request::builder()
            .version(http::Version::HTTP_2)
            .header("content-type", "application/grpc")
            .body(())
            .unwrap();
        let res = svc.oneshot(req).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(res.headers()["content-type"], "application/grpc");
        assert_eq!(res.headers()["grpc-status"], "14");
        assert_eq!(res.headers()["retry-after"], "5");
        assert!(res.headers().contains_key("grpc-status-details-bin"));
    }
}
