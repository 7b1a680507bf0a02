//! A tonic gRPC service behind ratekeeper: `greeter.Greeter/SayHello` answers 3 calls per
//! minute per client IP (burst 3); the 4th gets the gRPC status `RESOURCE_EXHAUSTED` with the
//! retry time, instead of an HTTP 429 (which gRPC clients read as `UNAVAILABLE`).
//!
//! ```text
//! ADDR=127.0.0.1:50051 cargo run -p ratekeeper-examples-grpc --example grpc
//! ```
//!
//! A limited call's trailers-only response carries:
//!
//! ```text
//! grpc-status: 8
//! grpc-message: rate limit "calls" exceeded; retry after 20 s
//! retry-after: 20
//! ratelimit-policy: "calls";q=3;w=60
//! ratelimit: "calls";r=0;t=60
//! grpc-status-details-bin: <google.rpc.Status with a google.rpc.RetryInfo of 20 s>
//! ```
//!
//! The service is written by hand (what `tonic-build` would generate for a one-method
//! service), so the example needs no `protoc`: the messages derive `prost::Message`, and
//! [`Greeter`] routes the one method through `tonic::server::Grpc`. The rate limit is the
//! ordinary ratekeeper layer on the axum router that tonic's `Routes` builds; it sees every
//! call as an HTTP/2 request, and answers the limited ones in gRPC because the layer is
//! built with `.grpc(true)` and their `content-type` is `application/grpc`.

use std::convert::Infallible;
use std::future::{Future, Ready};
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::Router;
use axum::http;
use ratekeeper_axum::report::HeaderStyle;
use ratekeeper_axum::{BuildError, RateLimitLayer, core::Policy, core::Quota};
use tonic::body::Body;
use tonic::server::{Grpc, NamedService, UnaryService};
use tonic::{Request, Response, Status};
use tonic_prost::ProstCodec;

/// The request of `SayHello` (`message HelloRequest { string name = 1; }`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct HelloRequest {
    /// Who to greet.
    #[prost(string, tag = "1")]
    pub name: String,
}

/// The reply of `SayHello` (`message HelloReply { string message = 1; }`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct HelloReply {
    /// The greeting.
    #[prost(string, tag = "1")]
    pub message: String,
}

/// The full path of the one method, as clients call it.
pub const SAY_HELLO: &str = "/greeter.Greeter/SayHello";

/// The method's handler.
#[derive(Debug, Clone, Copy)]
struct SayHello;

impl UnaryService<HelloRequest> for SayHello {
    type Response = HelloReply;
    type Future = Ready<Result<Response<HelloReply>, Status>>;

    fn call(&mut self, request: Request<HelloRequest>) -> Self::Future {
        let message = format!("hello, {}", request.into_inner().name);
        std::future::ready(Ok(Response::new(HelloReply { message })))
    }
}

/// The `greeter.Greeter` service: `SayHello`, and `UNIMPLEMENTED` for any other method.
#[derive(Debug, Clone, Copy, Default)]
pub struct Greeter;

impl NamedService for Greeter {
    const NAME: &'static str = "greeter.Greeter";
}

impl tower_service::Service<http::Request<Body>> for Greeter {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        if req.uri().path() == SAY_HELLO {
            Box::pin(async move {
                let mut grpc = Grpc::new(ProstCodec::<HelloReply, HelloRequest>::default());
                Ok(grpc.unary(SayHello, req).await)
            })
        } else {
            Box::pin(async { Ok(Status::unimplemented("no such method").into_http()) })
        }
    }
}

/// The app: [`Greeter`] on tonic's axum router, limited to 3 calls per minute per client IP
/// (burst 3) by one policy named `calls`, reported with the IETF `RateLimit` and
/// `RateLimit-Policy` fields.
///
/// # Errors
///
/// None in practice: the one policy is valid. The layer's builder checks it all the same.
pub fn app() -> Result<Router, BuildError> {
    let quota = Quota::per_minute(NonZeroU32::new(3).unwrap_or(NonZeroU32::MIN));
    let layer = RateLimitLayer::builder()
        .policy(Policy::new("calls", quota))
        .headers(HeaderStyle::Ietf)
        // This layer serves gRPC: refused calls get gRPC answers, not HTTP 429s.
        .grpc(true)
        .build()?;
    Ok(tonic::service::Routes::new(Greeter)
        .into_axum_router()
        .layer(layer))
}

#[allow(dead_code)] // The end-to-end test includes this file for `app`, not for `main`.
async fn run() -> std::io::Result<()> {
    ratekeeper_examples::init_tracing();
    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:50051".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("listening on {}", listener.local_addr()?);
    // axum serves HTTP/2 without TLS (h2c), as gRPC clients connect to `http://` endpoints.
    axum::serve(
        listener,
        app()
            .map_err(std::io::Error::other)?
            .into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await
}

#[allow(dead_code)] // The end-to-end test includes this file for `app`, not for `main`.
#[tokio::main]
async fn main() -> std::process::ExitCode {
    ratekeeper_examples::exit(run().await)
}
