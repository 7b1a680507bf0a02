//! A null Envoy rate limit service: `ShouldRateLimit` answers `OK` (one `OK` status per
//! descriptor) without any lookup or counting. `scripts/rls_bench.sh` loads it beside
//! `ratekeeper-rls` to measure what this machine's gRPC stack (tonic over HTTP/2 on
//! loopback, the same server builder and runtime as the real service) costs on its own:
//! the ceiling any rate limit service here can reach.
//!
//! ```text
//! rls_null --grpc 127.0.0.1:18081
//! ```
//!
//! It prints `listening on ADDR` once bound and stops on SIGTERM or Ctrl-C.

use std::net::SocketAddr;
use std::process::ExitCode;

use clap::Parser;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

/// A rate limit service that answers OK to everything, to measure the gRPC ceiling.
#[derive(Debug, Parser)]
struct Args {
    /// gRPC listen address.
    #[arg(long, default_value = "127.0.0.1:18081")]
    grpc: SocketAddr,
}

/// The handler: no state, no work.
#[derive(Debug, Default)]
struct Null;

#[tonic::async_trait]
impl RateLimitService for Null {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        let statuses = request
            .get_ref()
            .descriptors
            .iter()
            .map(|_| DescriptorStatus {
                code: Code::Ok.into(),
                ..DescriptorStatus::default()
            })
            .collect();
        Ok(tonic::Response::new(RateLimitResponse {
            overall_code: Code::Ok.into(),
            statuses,
            ..RateLimitResponse::default()
        }))
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rls_null: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(serve(args))
}

async fn serve(args: Args) -> ExitCode {
    let listener = match tokio::net::TcpListener::bind(args.grpc).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("rls_null: cannot bind {}: {e}", args.grpc);
            return ExitCode::FAILURE;
        }
    };
    match listener.local_addr() {
        Ok(addr) => println!("listening on {addr}"),
        Err(e) => {
            eprintln!("rls_null: no local address: {e}");
            return ExitCode::FAILURE;
        }
    }
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    let stop = async {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => return std::future::pending().await,
            };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    };
    let result = tonic::transport::Server::builder()
        .add_service(RateLimitServiceServer::new(Null))
        .serve_with_incoming_shutdown(incoming, stop)
        .await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rls_null: the gRPC server stopped: {e}");
            ExitCode::FAILURE
        }
    }
}
