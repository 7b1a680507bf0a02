//! Server processes of the built binary on one `redis-server` the test starts.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::Channel;

use crate::redis_support::{RedisServer, free_port};

/// One `ratekeeper-rls` process, killed on drop.
pub(crate) struct Process {
    child: Child,
    pub(crate) grpc: u16,
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Process {
    /// Starts the binary with `--config dir`, `args` and `env`, and waits (at most 30 s)
    /// until its `/healthcheck` answers 200.
    pub(crate) async fn start(
        dir: &std::path::Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Process {
        let (grpc, http, debug) = (free_port(), free_port(), free_port());
        let child = Command::new(env!("CARGO_BIN_EXE_ratekeeper-rls"))
            .arg("--config")
            .arg(dir)
            .args(["--grpc", &format!("127.0.0.1:{grpc}")])
            .args(["--http", &format!("127.0.0.1:{http}")])
            .args(["--debug", &format!("127.0.0.1:{debug}")])
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the binary starts");
        let mut p = Process { child, grpc };
        let health = format!("http://127.0.0.1:{http}/healthcheck");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(r) = reqwest::get(&health).await
                && r.status().as_u16() == 200
            {
                break;
            }
            assert!(Instant::now() < deadline, "the binary never became healthy");
            assert!(
                p.child.try_wait().unwrap().is_none(),
                "the binary exited early"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        p
    }

    /// A gRPC client of this process.
    pub(crate) async fn client(&self) -> RateLimitServiceClient<Channel> {
        RateLimitServiceClient::connect(format!("http://127.0.0.1:{}", self.grpc))
            .await
            .expect("the gRPC client connects")
    }
}

/// Redis `TIME` in whole seconds.
pub(crate) fn redis_secs(redis: &RedisServer) -> u64 {
    let out = redis.cli(&["TIME"]).expect("redis answers TIME");
    out.lines()
        .next()
        .and_then(|l| l.trim().parse().ok())
        .expect("TIME's seconds")
}
