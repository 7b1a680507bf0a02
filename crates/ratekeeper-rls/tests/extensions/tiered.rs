//! The tiered store's bound: three server processes on `--store tiered`, offered three times
//! the limit, admit at most `limit + 3 × TIERED_MAX_LEASE` per window of Redis time.
//!
//! The suite runs it for 6 s (three 2 s windows); `scripts/rls_tiered_bound.sh` runs it for
//! 60 s (`RLS_TIERED_SECS=60`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::fleet::Process;
use crate::redis_support::RedisServer;
use crate::support::*;

/// 100 per 2 s window.
const CONFIG: &str = "\
domain: tier
descriptors:
  - key: k
    rate_limit: {period: 2s, requests_per_unit: 100}
";
const LIMIT: u64 = 100;
const WINDOW_US: u64 = 2_000_000;
const MAX_LEASE: u64 = 5;
const REPLICAS: usize = 3;
const TASKS_PER_REPLICA: usize = 2;
/// Each task sends one request per 40 ms: 6 tasks × 25/s = 150/s = 3 × 100 per 2 s.
const PACE: Duration = Duration::from_millis(40);

fn wall_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// Redis `TIME` minus this host's clock, in µs (read between two local readings).
fn redis_offset_us(redis: &RedisServer) -> i64 {
    let before = wall_us();
    let out = redis.cli(&["TIME"]).expect("redis answers TIME");
    let after = wall_us();
    let mut l = out
        .lines()
        .map(|l| l.trim().parse::<u64>().expect("a number"));
    let redis_us = l.next().unwrap() * 1_000_000 + l.next().unwrap();
    let local = before / 2 + after / 2;
    i64::try_from(redis_us).unwrap() - i64::try_from(local).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_tiered_replicas_admit_at_most_the_limit_plus_their_leases() {
    let secs: u64 = std::env::var("RLS_TIERED_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6);
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tier.yaml"), CONFIG).unwrap();
    let url = redis.url();
    let lease = MAX_LEASE.to_string();
    let env = [
        ("REDIS_URL", url.as_str()),
        ("REDIS_TIMEOUT", "30s"),
        ("TIERED_MAX_LEASE", lease.as_str()),
    ];
    let mut servers = Vec::new();
    for _ in 0..REPLICAS {
        servers.push(Process::start(dir.path(), &["--store", "tiered"], &env).await);
    }
    let offset = redis_offset_us(&redis);
    let to_redis = move |local: u64| local.saturating_add_signed(offset);
    let end = Instant::now() + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for t in 0..REPLICAS * TASKS_PER_REPLICA {
        let mut c = servers[t % REPLICAS].client().await;
        tasks.push(tokio::spawn(async move {
            // (Redis-time window when sent, when answered) of every admitted request.
            let mut admitted = Vec::new();
            let mut next = tokio::time::Instant::now();
            while Instant::now() < end {
                let sent = to_redis(wall_us());
                let r = c
                    .should_rate_limit(req("tier", vec![desc(&[("k", "shared")])], 1))
                    .await
                    .expect("ShouldRateLimit answers")
                    .into_inner();
                let answered = to_redis(wall_us());
                if r.overall_code == ok() {
                    admitted.push((sent / WINDOW_US, answered / WINDOW_US));
                }
                next += PACE;
                tokio::time::sleep_until(next).await;
            }
            admitted
        }));
    }
    // Per window: the requests admitted in it; one whose call spans a boundary counts in
    // both windows (an upper bound).
    let mut per_window: BTreeMap<u64, u64> = BTreeMap::new();
    let mut total = 0;
    for t in tasks {
        for (from, to) in t.await.expect("a client task") {
            total += 1;
            for w in from..=to {
                *per_window.entry(w).or_default() += 1;
            }
        }
    }
    let bound = LIMIT + REPLICAS as u64 * MAX_LEASE;
    let worst = per_window.values().copied().max().unwrap_or(0);
    eprintln!(
        "tiered bound: {secs} s, {total} admitted, {} windows, most in one window {worst} (bound {bound})",
        per_window.len()
    );
    assert!(worst <= bound, "{per_window:?}");
    // The load was enough to reach the limit in some window.
    assert!(
        worst >= LIMIT * 3 / 4,
        "the limit was never approached: {per_window:?}"
    );
}
