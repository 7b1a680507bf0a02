//! One clock for the fleet: on Redis, windows and `duration_until_reset` come from Redis
//! `TIME`, not from the replicas' own clocks. The reference keys each window on the pod's
//! clock, so two pods skewed around a boundary count in two windows and report two resets.

use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use ratekeeper_core::clock::Clock;
use ratekeeper_rls::settings::Settings;
use ratekeeper_rls::{Server, UnixClock};
use tonic::transport::Channel;

use crate::redis_support::RedisServer;
use crate::support::*;

const CONFIG: &str = "\
domain: sk
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 10}
";

/// The host's clock moved by `offset_ns` (a skewed replica).
struct Skewed {
    wall: UnixClock,
    offset_ns: i64,
}

impl Clock for Skewed {
    fn now(&self) -> u64 {
        self.wall.now().saturating_add_signed(self.offset_ns)
    }

    fn unix_now(&self) -> Duration {
        Duration::from_nanos(self.now())
    }
}

async fn server(
    dir: &std::path::Path,
    redis: &RedisServer,
    offset_ns: i64,
) -> (Server, RateLimitServiceClient<Channel>) {
    let config = dir.display().to_string();
    let args = [
        "ratekeeper-rls",
        "--config",
        &config,
        "--grpc",
        "127.0.0.1:0",
        "--http",
        "127.0.0.1:0",
        "--debug",
        "127.0.0.1:0",
    ];
    let vars = [
        ("REDIS_URL".to_owned(), redis.url()),
        ("REDIS_TIMEOUT".to_owned(), "30s".to_owned()),
    ];
    let (settings, _) = Settings::parse(args, move |name: &str| {
        vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    })
    .expect("settings parse");
    let server = Server::builder(settings)
        .local_clock(Skewed {
            wall: UnixClock::new(),
            offset_ns,
        })
        .bind()
        .await
        .expect("the server starts");
    let client = RateLimitServiceClient::connect(format!("http://{}", server.local_grpc_addr()))
        .await
        .expect("the gRPC client connects");
    (server, client)
}

/// A minute in microseconds (Redis `TIME`'s unit here).
const MINUTE: u64 = 60_000_000;

/// Redis `TIME` in microseconds.
fn redis_micros(redis: &RedisServer) -> u64 {
    let out = redis.cli(&["TIME"]).expect("redis answers TIME");
    let mut lines = out
        .lines()
        .map(|l| l.trim().parse::<u64>().expect("a number"));
    let (secs, micros) = (lines.next().unwrap(), lines.next().unwrap());
    secs * 1_000_000 + micros
}

/// Two replicas, one 3 s ahead and one 3 s behind, called just after a minute boundary of
/// Redis time (10 per minute): the one behind believes it is still in the previous minute,
/// the one ahead is 3 s into the current one. Both report the reset of Redis's window (58 to
/// 60 s), and 20 hits alternating between them admit 10 (the limit) within the one
/// Redis-time minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skewed_replicas_count_in_one_redis_window() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("sk.yaml"), CONFIG).unwrap();
    let (_a, mut ahead) = server(dir.path(), &redis, 3_000_000_000).await;
    let (_b, mut behind) = server(dir.path(), &redis, -3_000_000_000).await;
    for attempt in 0..3 {
        // Wait for 300 ms past the next minute boundary of Redis time.
        let now = redis_micros(&redis);
        let target = (now / MINUTE + 1) * MINUTE + 300_000;
        tokio::time::sleep(Duration::from_micros(target - now)).await;
        let start = redis_micros(&redis);
        let window = start / MINUTE;
        let client = format!("c{attempt}");
        let mut admitted = 0;
        let mut resets = Vec::new();
        for i in 0..20 {
            let c = if i % 2 == 0 { &mut ahead } else { &mut behind };
            let r = c
                .should_rate_limit(req("sk", vec![desc(&[("k", &client)])], 1))
                .await
                .expect("ShouldRateLimit answers")
                .into_inner();
            if r.overall_code == ok() {
                admitted += 1;
            }
            resets.push(r.statuses[0].duration_until_reset.unwrap().seconds);
        }
        let end = redis_micros(&redis);
        if end / MINUTE != window || start % MINUTE >= 2_000_000 {
            // A loaded machine let the burst start late or straddle a boundary: again.
            continue;
        }
        assert_eq!(admitted, 10, "the limit per Redis-time window");
        // Redis time is 0.3 to 2 s into its minute: 58 to 60 s left (the replicas' own
        // clocks would say 55-57 s ahead and 1-3 s behind).
        assert!(
            resets.iter().all(|r| (58..=60).contains(r)),
            "resets {resets:?}"
        );
        return;
    }
    panic!("three bursts missed their Redis-time window");
}
