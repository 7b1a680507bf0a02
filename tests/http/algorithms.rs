//! Every algorithm through the layer over real HTTP, with a manual clock: per-policy
//! algorithm selection, the public reports on reset units, costs above the burst,
//! configuration values, window boundaries and leaky-bucket timestamps (each test names its
//! report), and the limits of the wait-for-capacity API.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};
use ratekeeper_axum::report::ResetFormat;
use ratekeeper_axum::{
    BuildError, RateLimitLayer, RequestParts, core::Algorithm, core::Key, core::Policy,
    core::Quota, key::GlobalKey,
};
use ratekeeper_core::clock::ManualClock;
use ratekeeper_core::clock::TokioClock;
use ratekeeper_core::store::{Charge, MemoryStore};
use ratekeeper_core::throttle::Throttle;
use ratekeeper_core::{Outcome, QuotaError};
use ratekeeper_tests::TestServer;

const MS: u64 = 1_000_000;

/// A layer keyed globally on a manual-clock memory store, with one policy.
fn layer(
    clock: &ManualClock,
    policy: Policy,
) -> RateLimitLayer<GlobalKey, u64, MemoryStore<Key, ManualClock>> {
    RateLimitLayer::builder()
        .policy(policy)
        .key(GlobalKey)
        .store(MemoryStore::with_clock(clock.clone()))
        .build()
        .unwrap()
}

/// Status and the rate-limit headers of one response (absent headers are `None`).
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    status: u16,
    remaining: Option<String>,
    reset: Option<String>,
    retry_after: Option<String>,
}

async fn send(req: reqwest::RequestBuilder) -> Seen {
    let res = req.send().await.unwrap();
    let h = |name: &str| {
        res.headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    };
    let seen = Seen {
        status: res.status().as_u16(),
        remaining: h("x-ratelimit-remaining"),
        reset: h("x-ratelimit-reset"),
        retry_after: h("retry-after"),
    };
    // Every value is a non-negative integer without a decimal point.
    for v in [&seen.remaining, &seen.reset, &seen.retry_after]
        .into_iter()
        .flatten()
    {
        assert!(
            v.bytes().all(|b| b.is_ascii_digit()),
            "not an integer: {v:?}"
        );
    }
    seen
}

fn seen(status: u16, remaining: u32, reset: u64, retry_after: Option<u64>) -> Seen {
    Seen {
        status,
        remaining: Some(remaining.to_string()),
        reset: Some(reset.to_string()),
        retry_after: retry_after.map(|r| r.to_string()),
    }
}

/// Each route has a policy with another algorithm; the fourth request on each shows which
/// algorithm decided. Policies come from a configuration document (serde).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_algorithm_is_selectable_per_policy_over_http() {
    let config = r#"[
        {"name": "gcra", "quota": "3/min"},
        {"name": "leaky", "quota": "3/min", "algorithm": "leaky-bucket"},
        {"name": "fixed", "quota": "3/min", "algorithm": "fixed-window"},
        {"name": "log", "quota": "3/min", "algorithm": "sliding-log"},
        {"name": "counter", "quota": "3/min", "algorithm": "sliding-window"}
    ]"#;
    let policies: Vec<Policy> = serde_json::from_str(config).unwrap();
    let clock = ManualClock::new();
    let mut app = Router::new();
    for p in &policies {
        app = app.route(
            &format!("/{}", p.name()),
            get(|| async { "ok" }).layer(layer(&clock, p.clone())),
        );
    }
    let server = TestServer::start(app).await;
    // Retry-After of the 4th request at t = 0, per algorithm (3 per 60 s):
    // GCRA and leaky bucket: one every 20 s. Fixed window and sliding log: the window (or
    // the oldest entry) ends at 60 s. Sliding counter: 3 * (1 - e) + 1 <= 3 needs e >= 1/3
    // of the next window: 60 s + 20 s.
    let expected = [
        ("gcra", 20),
        ("leaky", 20),
        ("fixed", 60),
        ("log", 60),
        ("counter", 80),
    ];
    for (name, retry) in expected {
        let path = format!("/{name}");
        for remaining in [2, 1, 0] {
            let s = send(server.get(&path)).await;
            assert_eq!(s.status, 200, "{name}");
            assert_eq!(s.remaining, Some(remaining.to_string()), "{name}");
        }
        let s = send(server.get(&path)).await;
        assert_eq!(s.status, 429, "{name}");
        assert_eq!(s.retry_after, Some(retry.to_string()), "{name}");
    }
}

/// `Retry-After` as seconds, not the reset's Unix time (the report
/// <https://github.com/cloudfoundry/cloud_controller_ng/issues/2544>): fixed window 2 per 10 s;
/// Reset as delta seconds and as epoch seconds; Retry-After is delta seconds in both modes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_and_retry_after_as_delta_and_epoch() {
    const E_SECS: u64 = 1_700_000_000;
    for format in [ResetFormat::DeltaSeconds, ResetFormat::UnixEpoch] {
        let clock = ManualClock::with_unix_origin(Duration::from_secs(E_SECS));
        let policy =
            Policy::new("b07", "2/10s".parse().unwrap()).with_algorithm(Algorithm::FixedWindow);
        let layer = RateLimitLayer::builder()
            .policy(policy)
            .key(GlobalKey)
            .store(MemoryStore::with_clock(clock.clone()))
            .reset_format(format)
            .build()
            .unwrap();
        let app = Router::new().route("/", get(|| async { "ok" }).layer(layer));
        let server = TestServer::start(app).await;
        let reset = |delta: u64, epoch: u64| match format {
            ResetFormat::DeltaSeconds => delta,
            _ => epoch,
        };
        let trace = [
            (0, seen(200, 1, reset(10, E_SECS + 10), None)),
            (9_999, seen(200, 0, reset(1, E_SECS + 10), None)),
            (10_000, seen(200, 1, reset(10, E_SECS + 20), None)),
            (10_500, seen(200, 0, reset(10, E_SECS + 20), None)),
            (10_600, seen(429, 0, reset(10, E_SECS + 20), Some(10))),
        ];
        for (t, expected) in trace {
            clock.set(t * MS);
            let s = send(server.get("/")).await;
            assert_eq!(s, expected, "{format:?} at t={t}");
        }
    }
}

/// A cost above the burst never fits (<https://github.com/boinkor-net/governor/issues/11>: it was
/// answered "not yet"): cost 11 against burst 10: 429 without Retry-After, state unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cost_larger_than_the_burst_never_fits() {
    let clock = ManualClock::new();
    let layer = RateLimitLayer::builder()
        .policy(Policy::new("b10", "10/s burst 10".parse().unwrap()))
        .key(GlobalKey)
        .cost_fn(
            |req: &RequestParts<'_>| {
                if req.uri().path() == "/export" { 11 } else { 1 }
            },
        )
        .store(MemoryStore::with_clock(clock.clone()))
        .build()
        .unwrap();
    let app = Router::new()
        .route("/export", post(|| async { "export" }))
        .route("/item", get(|| async { "item" }))
        .layer(layer);
    let server = TestServer::start(app).await;
    let export = || server.post("/export");
    let item = || server.get("/item");

    clock.set(0);
    let res = export().send().await.unwrap();
    assert_eq!(res.status(), 429);
    assert!(res.headers().get("retry-after").is_none());
    assert_eq!(res.headers()["x-ratelimit-remaining"], "10");
    let body: serde_json::Value = serde_json::from_slice(&res.bytes().await.unwrap()).unwrap();
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("can never be allowed"),
        "{body}"
    );
    clock.set(MS);
    let s = send(item()).await;
    assert_eq!((s.status, s.remaining.as_deref()), (200, Some("9")));
    clock.set(2 * MS);
    let s = send(export()).await;
    assert_eq!(
        (s.status, s.remaining.as_deref(), s.retry_after),
        (429, Some("9"), None)
    );
    clock.set(3 * MS);
    let s = send(item()).await;
    assert_eq!((s.status, s.remaining.as_deref()), (200, Some("8")));
}

/// A cost above the burst (<https://github.com/boinkor-net/governor/issues/11>) in wait mode:
/// waiting for capacity with a cost above the burst fails at once and never sleeps; the failed
/// attempts move nothing.
#[tokio::test(start_paused = true)]
async fn wait_mode_fails_at_once_and_never_sleeps_when_the_cost_cannot_fit() {
    let policy = Policy::new("b10", "10/s burst 10".parse().unwrap());
    let throttle = Throttle::new(MemoryStore::with_clock(TokioClock::new()), &[policy]).unwrap();
    let start = tokio::time::Instant::now();
    let wait = Duration::from_secs(3_600);
    let steps: [(u64, Option<u32>); 4] = [(11, Some(10)), (1, None), (11, Some(9)), (1, None)];
    let mut remaining_after_items = Vec::new();
    for (cost, cannot_fit_remaining) in steps {
        match throttle.acquire(&Key::Global, cost, wait).await {
            Err(err) => {
                assert!(err.is_cannot_fit());
                let ratekeeper_core::throttle::ThrottleError::CannotFit(d) = err else {
                    unreachable!()
                };
                assert_eq!(Some(d.as_slice()[0].remaining()), cannot_fit_remaining);
                assert_eq!(d.retry_after(), None);
            }
            Ok(d) => remaining_after_items.push(d.as_slice()[0].remaining()),
        }
    }
    assert_eq!(remaining_after_items, [9, 8]);
    assert_eq!(start.elapsed(), Duration::ZERO, "the wait mode slept");
    // u64::MAX as a cost: the same immediate outcome, no overflow.
    let err = throttle
        .acquire(&Key::Global, u64::MAX, wait)
        .await
        .unwrap_err();
    assert!(err.is_cannot_fit());
}

/// A burst across a window boundary (<https://github.com/plausible/analytics/pull/6497>: a fixed
/// window admits twice the limit there): limit 10 per 60 s; 10 requests at t = 59.9 s then 10 at
/// t = 60.1 s, for every algorithm, over HTTP; and the most admitted in any 60 s span.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_at_the_window_boundary_for_every_algorithm() {
    struct Expect {
        algorithm: Algorithm,
        first_reset: u64,
        second: fn(u32) -> Seen,
        max_in_any_window: usize,
    }
    let cases = [
        Expect {
            // Aligned windows: [0, 60 s) and [60 s, 120 s): the second batch is a new window.
            algorithm: Algorithm::FixedWindow,
            first_reset: 1,
            second: |rem| seen(200, rem, 60, None),
            max_in_any_window: 20,
        },
        Expect {
            // The oldest entry leaves at 119.9 s: 59.8 s rounded up.
            algorithm: Algorithm::SlidingLog,
            first_reset: 60,
            second: |_| seen(429, 0, 60, Some(60)),
            max_in_any_window: 10,
        },
        Expect {
            // Estimate 10 * (1 - 100/60000) = 9.983: denied. One more fits when
            // 10 * (1 - e) + 1 <= 10, e >= 6 s into the window: 5.9 s rounded up. The state
            // is absent once window [60 s, 120 s) has passed: 119.9 s rounded up.
            algorithm: Algorithm::SlidingWindow,
            first_reset: 61,
            second: |_| seen(429, 0, 60, Some(6)),
            max_in_any_window: 10,
        },
        Expect {
            // Burst 10, one per 6 s: the first refill is 5.8 s after t = 60.1 s.
            algorithm: Algorithm::Gcra,
            first_reset: 60,
            second: |_| seen(429, 0, 60, Some(6)),
            max_in_any_window: 10,
        },
        Expect {
            algorithm: Algorithm::LeakyBucket,
            first_reset: 60,
            second: |_| seen(429, 0, 60, Some(6)),
            max_in_any_window: 10,
        },
    ];
    for case in cases {
        let clock = ManualClock::new();
        let policy = Policy::new("b13", "10/min".parse().unwrap()).with_algorithm(case.algorithm);
        let app = Router::new().route("/", get(|| async { "ok" }).layer(layer(&clock, policy)));
        let server = TestServer::start(app).await;
        let mut admitted = Vec::new();
        clock.set(59_900 * MS);
        for rem in (0..10).rev() {
            let s = send(server.get("/")).await;
            let reset = case.first_reset;
            // GCRA / leaky bucket: each admission moves the full-again time 6 s further.
            let reset = if matches!(case.algorithm, Algorithm::Gcra | Algorithm::LeakyBucket) {
                6 * (10 - u64::from(rem))
            } else {
                reset
            };
            assert_eq!(s, seen(200, rem, reset, None), "{:?}", case.algorithm);
            admitted.push(59_900u64);
        }
        clock.set(60_100 * MS);
        for rem in (0..10).rev() {
            let s = send(server.get("/")).await;
            let mut expected = (case.second)(rem);
            if case.algorithm == Algorithm::Gcra || case.algorithm == Algorithm::LeakyBucket {
                // Full again 60 s after 59.9 s: 59.8 s rounded up.
                expected.reset = Some("60".to_owned());
            }
            if case.algorithm == Algorithm::SlidingWindow {
                expected.reset = Some("60".to_owned());
            }
            assert_eq!(s, expected, "{:?}", case.algorithm);
            if s.status == 200 {
                admitted.push(60_100);
            }
        }
        let max = admitted
            .iter()
            .map(|&t| {
                admitted
                    .iter()
                    .filter(|&&u| u >= t && u < t + 60_000)
                    .count()
            })
            .max()
            .unwrap_or(0);
        assert_eq!(max, case.max_in_any_window, "{:?}", case.algorithm);
    }
}

/// A burst with an algorithm that holds `limit` (a window algorithm) is a build error
/// naming the policy and the algorithms that take a burst; it used to be ignored, so
/// "10/m burst 3" admitted 10 in a row. Without the burst the same policy builds.
#[test]
fn a_burst_with_a_window_algorithm_is_a_build_error() {
    let bursty: Quota = "10/m burst 3".parse().unwrap();
    for algorithm in [
        Algorithm::FixedWindow,
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
    ] {
        let build = |quota: Quota| {
            RateLimitLayer::builder()
                .policy(Policy::new("search", quota).with_algorithm(algorithm))
                .key(GlobalKey)
                .build()
        };
        let err = build(bursty).unwrap_err().to_string();
        assert!(
            err.contains(&format!(
                "policy \"search\" sets burst 3 but algorithm {algorithm} takes no burst"
            )),
            "{err}"
        );
        assert!(err.contains("use gcra or leaky-bucket"), "{err}");
        assert!(build("10/m".parse().unwrap()).is_ok(), "{algorithm}");
    }
    // GCRA and the leaky bucket honour it.
    for algorithm in [Algorithm::Gcra, Algorithm::LeakyBucket] {
        let built = RateLimitLayer::builder()
            .policy(Policy::new("search", bursty).with_algorithm(algorithm))
            .key(GlobalKey)
            .build();
        assert!(built.is_ok(), "{algorithm}");
    }
}

/// Zero, negative and huge configuration values (the report
/// <https://github.com/spring-cloud/spring-cloud-gateway/issues/168>: burst capacity 0 turned
/// limiting off).
#[test]
fn zero_negative_and_huge_configuration_values() {
    // C1: rate 0 per 1,000 ms, burst 5.
    assert_eq!(
        Quota::new(0, Duration::from_secs(1)),
        Err(QuotaError::ZeroLimit)
    );
    assert!("0/1000ms burst 5".parse::<Quota>().is_err());
    // C2: limit 10, period 0 ms.
    assert_eq!(Quota::new(10, Duration::ZERO), Err(QuotaError::ZeroPeriod));
    assert!("10/0ms".parse::<Quota>().is_err());
    // C3: burst 0 (rate 10/s).
    let ten = Quota::new(10, Duration::from_secs(1)).unwrap();
    assert_eq!(ten.with_burst(0), Err(QuotaError::ZeroBurst));
    assert!("10/s burst 0".parse::<Quota>().is_err());
    // C4: fixed window limit 0, from a configuration file too.
    let err = serde_json::from_str::<Policy>(
        r#"{"name": "w", "quota": "0/min", "algorithm": "fixed-window"}"#,
    )
    .unwrap_err();
    assert!(err.to_string().contains("invalid limit \"0\""), "{err}");
    // C5: limit -1 read from a configuration file: the error names the field's bad part.
    let err = serde_json::from_str::<Policy>(r#"{"name": "n", "quota": "-1/min"}"#).unwrap_err();
    assert!(err.to_string().contains("invalid limit \"-1\""), "{err}");
    // C6: a route cost of 0 is a build error. (Costs are u64: -3 cannot be expressed; from
    // a file it fails to parse as a cost.) A static cost above the capacity is one too.
    let build = |cost: u64| {
        RateLimitLayer::builder()
            .policy(Policy::new("c6", ten))
            .cost(cost)
            .build()
    };
    assert!(matches!(build(0), Err(BuildError::ZeroCost)));
    assert!(matches!(
        build(11),
        Err(BuildError::CostExceedsBurst {
            cost: 11,
            burst: 10,
            ..
        })
    ));
    assert!(serde_json::from_str::<u64>("-3").is_err());
    // C8: 1 per 10^12 s does not fit u64 nanoseconds: a configuration error.
    assert_eq!(
        Quota::new(1, Duration::from_secs(1_000_000_000_000)),
        Err(QuotaError::PeriodTooLong)
    );
    assert!("1/1000000000000s".parse::<Quota>().is_err());
    // C8, saturating instead: 1 per u64::MAX ns (~584 years) on every algorithm; and a cost
    // of u64::MAX is the "can never fit" outcome without overflow.
    let longest = Quota::new(1, Duration::from_nanos(u64::MAX)).unwrap();
    for algorithm in Algorithm::ALL {
        let clock = ManualClock::new();
        let mut store = MemoryStore::with_clock(clock.clone());
        let id = ratekeeper_core::store::Store::register(
            &mut store,
            &Policy::new("c8", longest).with_algorithm(algorithm),
        )
        .unwrap();
        let check = |cost| {
            store
                .check_now(&[Charge::new(id, &Key::Global, cost)])
                .unwrap()
                .as_slice()[0]
        };
        assert!(check(u64::MAX).is_cannot_fit(), "{algorithm}");
        assert!(check(1).is_allowed(), "{algorithm}");
        let second = check(1);
        let retry = second.retry_after().unwrap();
        assert!(
            retry > Duration::ZERO && retry <= Duration::from_nanos(u64::MAX),
            "{algorithm}"
        );
        assert!(check(u64::MAX).is_cannot_fit(), "{algorithm}");
    }
}

/// A huge rate (configuration values of
/// <https://github.com/spring-cloud/spring-cloud-gateway/issues/168>): 2,000,000,000 per 1,000 ms,
/// burst 2,000,000,000; four threads each send 1,000,000 requests at the frozen time t = 0: all
/// 4,000,000 are admitted.
#[test]
fn huge_rate_four_threads_at_frozen_time_all_admitted() {
    let quota = Quota::new(2_000_000_000, Duration::from_secs(1)).unwrap();
    let mut store = MemoryStore::with_clock(ManualClock::new());
    let id =
        ratekeeper_core::store::Store::register(&mut store, &Policy::new("c7", quota)).unwrap();
    let store = Arc::new(store);
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                let mut admitted = 0u64;
                for _ in 0..1_000_000 {
                    let d = store
                        .check_now(&[Charge::new(id, &Key::Global, 1)])
                        .unwrap();
                    admitted += u64::from(d.is_allowed());
                }
                admitted
            })
        })
        .collect();
    let admitted: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert_eq!(admitted, 4_000_000);
    let d = store
        .check_now(&[Charge::new(id, &Key::Global, 1)])
        .unwrap();
    assert_eq!(d.as_slice()[0].remaining(), 2_000_000_000 - 4_000_001);
}

/// High rates on a leaky bucket (<https://github.com/openresty/openresty/issues/553>: a limit of
/// 3,000/s admitted about 1,000/s): leaky bucket (nginx `limit_req`, burst 0 = burst 1 here), 5,000
/// per second, 25,000 requests 40,000 ns apart, on a nanosecond clock through the memory store.
#[test]
fn leaky_bucket_nanosecond_timestamps_at_high_rate() {
    let quota = "5000/s burst 1".parse::<Quota>().unwrap();
    assert_eq!(quota.emission_interval_nanos(), 200_000);
    let clock = ManualClock::new();
    let mut store = MemoryStore::with_clock(clock.clone());
    let id = ratekeeper_core::store::Store::register(
        &mut store,
        &Policy::new("b17", quota).with_algorithm(Algorithm::LeakyBucket),
    )
    .unwrap();
    let mut admitted = Vec::new();
    for i in 0..25_000u64 {
        clock.set(i * 40_000);
        let d = store
            .check_now(&[Charge::new(id, &Key::Global, 1)])
            .unwrap();
        match d.as_slice()[0].outcome() {
            Outcome::Allowed => admitted.push(i),
            Outcome::Denied { retry_after } => assert!(retry_after > Duration::ZERO),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(admitted.len(), 5_000);
    assert!(admitted.iter().all(|i| i % 5 == 0));
    // At most 5 in any 1 ms span (1 ms = 25 request slots).
    let max_per_ms = admitted
        .iter()
        .map(|&i| admitted.iter().filter(|&&j| j >= i && j < i + 25).count())
        .max()
        .unwrap();
    assert_eq!(max_per_ms, 5);
}
