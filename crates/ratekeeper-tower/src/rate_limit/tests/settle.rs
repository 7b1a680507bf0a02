//! Settlement: what a request that got no response, or whose service failed, is settled as.

use std::convert::Infallible;
use std::num::NonZeroU32;
use std::sync::Arc;

use http::{Request, Response, StatusCode};
use ratekeeper_core::{Policy, Quota};
use tower::{Service, ServiceBuilder, ServiceExt};

use super::futures_poll;
use crate::{RateLimitLayer, key::GlobalKey};

/// One request per minute, globally, with `settle` on policy `default`, on a manual clock.
fn settled(settle: crate::policy::Settle) -> RateLimitLayer<GlobalKey> {
    RateLimitLayer::builder()
        .policy(Policy::new("default", Quota::per_minute(NonZeroU32::MIN)))
        .key(GlobalKey)
        .settle("default", settle)
        .build()
        .unwrap()
}

/// Whether a second request right after the first gets through (the first's charge was given
/// back).
async fn second_passes<S>(svc: &S) -> bool
where
    S: Service<Request<()>, Response = Response<crate::body::ResponseBody<String>>> + Clone,
    S::Error: std::fmt::Debug,
{
    svc.clone()
        .oneshot(Request::new(()))
        .await
        .unwrap()
        .status()
        == StatusCode::OK
}

#[tokio::test]
async fn a_request_dropped_before_its_answer_is_settled_as_no_response() {
    use crate::policy::Settle;
    // The inner service answers `/hang` never; the client goes away after one poll.
    let hang_or_ok = |req: Request<()>| async move {
        if req.uri().path() == "/hang" {
            std::future::pending::<()>().await;
        }
        Ok::<_, Infallible>(Response::new(String::new()))
    };
    // Counting only 401s: a request that got no answer was no 401, so its unit comes back.
    let svc = ServiceBuilder::new()
        .layer(settled(Settle::COUNT_UNAUTHORIZED))
        .service_fn(hang_or_ok);
    let mut first = Box::pin(svc.clone().oneshot(Request::get("/hang").body(()).unwrap()));
    assert!(futures_poll(first.as_mut()).is_pending());
    drop(first);
    assert!(
        second_passes(&svc).await,
        "a cancelled request spent a failed-login unit"
    );

    // Refunding server errors: a client that went away is no server error; the unit stays.
    let svc = ServiceBuilder::new()
        .layer(settled(Settle::REFUND_SERVER_ERRORS))
        .service_fn(hang_or_ok);
    let mut first = Box::pin(svc.clone().oneshot(Request::get("/hang").body(()).unwrap()));
    assert!(futures_poll(first.as_mut()).is_pending());
    drop(first);
    assert!(!second_passes(&svc).await);
}

#[tokio::test]
async fn a_request_whose_service_failed_is_settled_as_a_server_error() {
    use crate::policy::Settle;
    let fail_once = {
        let failed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        move |_req: Request<()>| {
            let first = !failed.swap(true, std::sync::atomic::Ordering::SeqCst);
            async move {
                if first {
                    Err("inner service failed")
                } else {
                    Ok(Response::new(String::new()))
                }
            }
        }
    };
    let svc = ServiceBuilder::new()
        .layer(settled(Settle::REFUND_SERVER_ERRORS))
        .service_fn(fail_once);
    assert!(svc.clone().oneshot(Request::new(())).await.is_err());
    assert!(
        second_passes(&svc).await,
        "a failed request was not refunded as a 5xx"
    );
}
