//! The advertised quota bounds Remaining, over real HTTP. For GCRA and the leaky
//! bucket `X-RateLimit-Limit` and the IETF `q` are the capacity (the burst) and `w` the time
//! an empty bucket takes to refill completely; window algorithms keep `limit` and the period.
//! Every response of every algorithm keeps `0 <= Remaining <= Limit` and `r <= q`.

use std::time::Duration;

use ratekeeper_axum::core::clock::ManualClock;
use ratekeeper_axum::core::store::MemoryStore;
use ratekeeper_axum::report::HeaderStyle;
use ratekeeper_axum::{RateLimitLayer, core::Algorithm, core::Policy, core::Quota, key::GlobalKey};
use ratekeeper_tests::{TestServer, ok_app};

/// `limit` per `period_ms`, with `burst`.
fn quota(limit: u32, period_ms: u64, burst: u32) -> Quota {
    Quota::new(limit, Duration::from_millis(period_ms))
        .unwrap()
        .with_burst(burst)
        .unwrap()
}

/// One policy, one global key, a frozen clock: every request arrives at t=0.
async fn serve(policy: Policy, style: HeaderStyle) -> TestServer {
    let layer = RateLimitLayer::builder()
        .policy(policy)
        .key(GlobalKey)
        .store(MemoryStore::with_clock(ManualClock::new()))
        .headers(style)
        .build()
        .unwrap();
    TestServer::start(ok_app().layer(layer)).await
}

/// What one response said.
#[derive(Debug)]
struct Seen {
    status: u16,
    /// `X-RateLimit-Limit` and `-Remaining`, when sent.
    x: Option<(u64, u64)>,
    /// `RateLimit-Policy` and `RateLimit`, when sent.
    ietf: Option<(String, String)>,
}

async fn get(server: &TestServer) -> Seen {
    let res = server.get("/").send().await.unwrap();
    let h = |name: &str| {
        res.headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    };
    let number = |name: &str| h(name).map(|v| v.parse::<u64>().unwrap());
    let x = match (number("x-ratelimit-limit"), number("x-ratelimit-remaining")) {
        (Some(limit), Some(remaining)) => Some((limit, remaining)),
        (None, None) => None,
        other => panic!("half an X-RateLimit report: {other:?}"),
    };
    let ietf = match (h("ratelimit-policy"), h("ratelimit")) {
        (Some(policy), Some(state)) => Some((policy, state)),
        (None, None) => None,
        other => panic!("half an IETF report: {other:?}"),
    };
    Seen {
        status: res.status().as_u16(),
        x,
        ietf,
    }
}

/// The integer parameter `param` of the only item of a one-policy IETF field.
fn sf_param(field: &str, param: &str) -> u64 {
    field
        .split(';')
        .find_map(|p| p.strip_prefix(param)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("no {param} in {field:?}"))
        .parse()
        .unwrap()
}

/// The invariant on one response: `0 <= Remaining <= Limit`, `r <= q`, and both
/// styles report the same numbers when both are sent.
fn assert_bounded(seen: &Seen, what: &str) {
    if let Some((limit, remaining)) = seen.x {
        assert!(
            remaining <= limit,
            "{what}: Remaining {remaining} > Limit {limit}"
        );
    }
    if let Some((policy, state)) = &seen.ietf {
        let (q, r) = (sf_param(policy, "q"), sf_param(state, "r"));
        assert!(r <= q, "{what}: r={r} > q={q} ({policy} / {state})");
        if let Some((limit, remaining)) = seen.x {
            assert_eq!((limit, remaining), (q, r), "{what}: styles disagree");
        }
    }
}

/// P1 (GCRA 1 per 1,000 ms, burst 10) and P2 (GCRA 100 per 60,000 ms, burst 10):
/// Limit 10, Remaining 9..0 over ten requests, then a 429 with Limit 10 and Remaining 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x_ratelimit_limit_is_the_burst() {
    for (name, q) in [("p1", quota(1, 1_000, 10)), ("p2", quota(100, 60_000, 10))] {
        let server = serve(Policy::new(name, q), HeaderStyle::XRateLimit).await;
        for i in 0..10u64 {
            let seen = get(&server).await;
            assert_eq!(seen.status, 200, "{name} request {}", i + 1);
            assert_eq!(seen.x, Some((10, 9 - i)), "{name} request {}", i + 1);
            assert!(seen.ietf.is_none());
        }
        let seen = get(&server).await;
        assert_eq!(seen.status, 429, "{name} request 11");
        assert_eq!(seen.x, Some((10, 0)), "{name} request 11");
    }
}

/// The same in the IETF style: `"p1";q=10;w=10`, `"p2";q=10;w=6`, `r` from 9 to 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ietf_q_is_the_burst_and_w_the_full_refill_time() {
    for (name, q, w) in [
        ("p1", quota(1, 1_000, 10), 10),
        ("p2", quota(100, 60_000, 10), 6),
    ] {
        let server = serve(Policy::new(name, q), HeaderStyle::Ietf).await;
        let want_policy = format!("\"{name}\";q=10;w={w}");
        for i in 0..11u64 {
            let seen = get(&server).await;
            assert_eq!(
                seen.status,
                if i < 10 { 200 } else { 429 },
                "{name} #{}",
                i + 1
            );
            assert!(seen.x.is_none());
            let (policy, state) = seen.ietf.expect("IETF fields on every response");
            assert_eq!(policy, want_policy, "{name} #{}", i + 1);
            assert!(
                state.starts_with(&format!("\"{name}\";r={};t=", 9 - i.min(9))),
                "{name} #{}: {state}",
                i + 1
            );
        }
    }
}

/// "10 per minute, burst 10": nothing changes where burst = limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn burst_equal_to_limit_keeps_limit_and_period() {
    let server = serve(Policy::new("m", quota(10, 60_000, 10)), HeaderStyle::Both).await;
    let seen = get(&server).await;
    assert_eq!(seen.x, Some((10, 9)));
    let (policy, state) = seen.ietf.unwrap();
    assert_eq!(policy, "\"m\";q=10;w=60");
    assert!(state.starts_with("\"m\";r=9;t="), "{state}");
}

/// The invariant on every response of every algorithm the layer takes, for quotas
/// with the burst above, equal to and below the limit (GCRA and the leaky bucket; the window
/// algorithms take no burst, so they get the same quotas without one), in both header
/// styles.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remaining_never_exceeds_limit_for_any_algorithm() {
    let algorithms = Algorithm::ALL
        .into_iter()
        .filter(|a| *a != Algorithm::Concurrency);
    for algorithm in algorithms {
        for q in [
            quota(1, 1_000, 10),
            quota(100, 60_000, 10),
            quota(10, 60_000, 10),
            quota(10, 60_000, 3),
        ] {
            for style in [
                HeaderStyle::XRateLimit,
                HeaderStyle::Ietf,
                HeaderStyle::Both,
            ] {
                let q = match algorithm {
                    Algorithm::Gcra | Algorithm::LeakyBucket => q,
                    _ => q.with_burst(q.limit()).unwrap(),
                };
                let policy = Policy::new("p", q).with_algorithm(algorithm);
                let capacity = policy.capacity();
                let server = serve(policy, style).await;
                let mut denied = 0;
                for i in 0..12 {
                    let seen = get(&server).await;
                    let what = format!("{algorithm:?} {q:?} {style:?} request {}", i + 1);
                    assert!(seen.x.is_some() || seen.ietf.is_some(), "{what}: no report");
                    assert_bounded(&seen, &what);
                    denied += u32::from(seen.status == 429);
                }
                if capacity <= 10 {
                    assert!(denied >= 2, "{algorithm:?} {q:?}: the quota never ran out");
                }
            }
        }
    }
}

/// The leaky bucket as GCRA: the same exact values for P1 and P2 in both
/// header styles (Limit and `q` 10, `w` 10 and 6, Remaining 9..0, then a 429 with Limit 10).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaky_bucket_limit_is_the_burst() {
    for (name, q, w) in [
        ("p1", quota(1, 1_000, 10), 10),
        ("p2", quota(100, 60_000, 10), 6),
    ] {
        let policy = Policy::new(name, q).with_algorithm(Algorithm::LeakyBucket);
        let server = serve(policy, HeaderStyle::Both).await;
        let want_policy = format!("\"{name}\";q=10;w={w}");
        for i in 0..11u64 {
            let seen = get(&server).await;
            let what = format!("{name} #{}", i + 1);
            assert_eq!(seen.status, if i < 10 { 200 } else { 429 }, "{what}");
            assert_eq!(seen.x, Some((10, 9 - i.min(9))), "{what}");
            let (policy, state) = seen.ietf.expect("IETF fields on every response");
            assert_eq!(policy, want_policy, "{what}");
            assert!(
                state.starts_with(&format!("\"{name}\";r={};t=", 9 - i.min(9))),
                "{what}: {state}"
            );
        }
    }
}
