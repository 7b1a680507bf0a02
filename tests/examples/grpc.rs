//! The `grpc` example over real HTTP/2 on loopback, called with a tonic client: 3 calls pass,
//! then the client gets `RESOURCE_EXHAUSTED` (not `UNAVAILABLE`, what an HTTP 429 becomes)
//! with the retry time in the message, the metadata and a `google.rpc.RetryInfo`.

// The example's own app, not a copy; its `pub` items are public for readers of the example.
#[allow(unreachable_pub)]
#[path = "../../examples/grpc.rs"]
mod grpc_example;

use std::net::SocketAddr;

use grpc_example::{HelloReply, HelloRequest, SAY_HELLO};
use prost::Message as _;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Status};
use tonic_prost::ProstCodec;

/// `google.rpc.Status`.
#[derive(Clone, PartialEq, prost::Message)]
struct RpcStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
    #[prost(message, repeated, tag = "3")]
    details: Vec<Any>,
}

/// `google.protobuf.Any`.
#[derive(Clone, PartialEq, prost::Message)]
struct Any {
    #[prost(string, tag = "1")]
    type_url: String,
    #[prost(bytes = "vec", tag = "2")]
    value: Vec<u8>,
}

/// `google.rpc.RetryInfo`.
#[derive(Clone, PartialEq, prost::Message)]
struct RetryInfo {
    #[prost(message, optional, tag = "1")]
    retry_delay: Option<ProtoDuration>,
}

/// `google.protobuf.Duration`.
#[derive(Clone, PartialEq, prost::Message)]
struct ProtoDuration {
    #[prost(int64, tag = "1")]
    seconds: i64,
    #[prost(int32, tag = "2")]
    nanos: i32,
}

async fn connect(addr: SocketAddr) -> tonic::client::Grpc<Channel> {
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect to the example");
    tonic::client::Grpc::new(channel)
}

async fn say_hello(
    client: &mut tonic::client::Grpc<Channel>,
    name: &str,
) -> Result<tonic::Response<HelloReply>, Status> {
    client.ready().await.expect("channel ready");
    client
        .unary(
            Request::new(HelloRequest {
                name: name.to_owned(),
            }),
            http::uri::PathAndQuery::from_static(SAY_HELLO),
            ProstCodec::<HelloRequest, HelloReply>::default(),
        )
        .await
}

fn metadata<'a>(status: &'a Status, key: &str) -> &'a str {
    status
        .metadata()
        .get(key)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_else(|| panic!("metadata {key} missing in {status:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_calls_pass_then_resource_exhausted_with_retry_information() {
    let addr = ratekeeper_tests::spawn(grpc_example::app().expect("app")).await;
    let mut client = connect(addr).await;

    for remaining in [2, 1, 0] {
        let res = say_hello(&mut client, "ratekeeper").await.expect("allowed");
        let ratelimit = res.metadata().get("ratelimit").expect("ratelimit");
        assert!(
            ratelimit
                .to_str()
                .expect("ascii")
                .starts_with(&format!("\"calls\";r={remaining};t=")),
            "{ratelimit:?}"
        );
        assert_eq!(res.into_inner().message, "hello, ratekeeper");
    }

    for _ in 0..2 {
        let status = say_hello(&mut client, "ratekeeper")
            .await
            .expect_err("limited");
        assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
        assert_eq!(
            status.message(),
            "rate limit \"calls\" exceeded; retry after 20 s"
        );
        assert_eq!(metadata(&status, "retry-after"), "20");
        assert_eq!(metadata(&status, "ratelimit"), "\"calls\";r=0;t=60");
        assert_eq!(metadata(&status, "ratelimit-policy"), "\"calls\";q=3;w=60");
        assert_eq!(metadata(&status, "cache-control"), "no-store");

        let details = RpcStatus::decode(status.details()).expect("google.rpc.Status");
        assert_eq!(details.code, Code::ResourceExhausted as i32);
        assert_eq!(details.message, status.message());
        assert_eq!(details.details.len(), 1);
        assert_eq!(
            details.details[0].type_url,
            "type.googleapis.com/google.rpc.RetryInfo"
        );
        let retry = RetryInfo::decode(details.details[0].value.as_slice()).expect("RetryInfo");
        assert_eq!(
            retry.retry_delay,
            Some(ProtoDuration {
                seconds: 20,
                nanos: 0
            })
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_to_the_same_app_still_gets_a_429() {
    let addr = ratekeeper_tests::spawn(grpc_example::app().expect("app")).await;
    let client = reqwest::Client::new();
    let mut statuses = Vec::new();
    for _ in 0..4 {
        let res = client
            .post(format!("http://{addr}{SAY_HELLO}"))
            .header("content-type", "application/json")
            .send()
            .await
            .expect("response");
        statuses.push(res.status().as_u16());
        if res.status() == 429 {
            assert!(res.headers().get("grpc-status").is_none());
            assert_eq!(res.headers()["retry-after"], "20");
        }
    }
    assert_eq!(statuses[3], 429, "{statuses:?}");
}
