//! When our server cannot answer (stopped, or up without a config), Envoy's
//! `failure_mode_deny` decides: `false` lets requests through to the upstream, `true` refuses
//! them with Envoy's `status_on_error` (500 unless configured).

use crate::harness::{ERROR, FAILURE_MODE_ALLOWED, Listener, OK, Rls, Scenario, TempDir};

const OPEN: Listener = Listener::open("open");
const CLOSED: Listener = Listener {
    name: "closed",
    failure_mode_deny: true,
    ..Listener::open("")
};
const CLOSED_503: Listener = Listener {
    name: "closed_503",
    failure_mode_deny: true,
    status_on_error: Some(503),
    ..Listener::open("")
};

/// Requests sent on each listener once our server is stopped.
const REQUESTS: u64 = 4;

/// First each listener gets an answer from our server (200 with `x-ratelimit-remaining: 2`:
/// the path works); then our server is killed, and each listener answers as its failure
/// mode says: the fail-open one 200 from the upstream, without rate limit headers; the
/// fail-closed ones Envoy's 500 (its default) and 503 (`status_on_error`), without reaching
/// the upstream. Envoy counts every call as an error, and the fail-open ones as
/// `failure_mode_allowed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_our_server_stopped_envoy_lets_through_or_refuses_as_its_failure_mode_says() {
    let mut scenario = Scenario::start(&[OPEN, CLOSED, CLOSED_503]).await;
    for listener in [OPEN, CLOSED, CLOSED_503] {
        // One client per listener: the three share our server's counters.
        let res = scenario.get(listener.name, Some(listener.name)).await;
        assert_eq!(res.status(), 200, "{}: {res:?}", listener.name);
        assert_eq!(
            res.headers()
                .get("x-ratelimit-remaining")
                .and_then(|v| v.to_str().ok()),
            Some("2"),
            "{}: {res:?}",
            listener.name
        );
    }
    assert_eq!(scenario.envoy.counter(OK).await, 3);
    assert_eq!(scenario.upstream.hits(), 3);

    scenario.stop_rls();

    for listener in [OPEN, CLOSED, CLOSED_503] {
        let expected = match listener.status_on_error {
            _ if !listener.failure_mode_deny => 200,
            Some(code) => code,
            None => 500,
        };
        for i in 0..REQUESTS {
            let res = scenario.get(listener.name, Some(listener.name)).await;
            assert_eq!(
                res.status(),
                expected,
                "{} request {} with our server stopped: {res:?}\nEnvoy's log:\n{}",
                listener.name,
                i + 1,
                scenario.envoy.log()
            );
            for name in [
                "x-ratelimit-limit",
                "x-ratelimit-remaining",
                "x-ratelimit-reset",
            ] {
                assert!(res.headers().get(name).is_none(), "{name} in {res:?}");
            }
            assert!(
                res.headers().get("x-envoy-ratelimited").is_none(),
                "{res:?}"
            );
        }
    }
    // Only the fail-open listener's requests reached the upstream.
    assert_eq!(scenario.upstream.hits(), 3 + REQUESTS);
    assert_eq!(scenario.envoy.counter(ERROR).await, 3 * REQUESTS);
    assert_eq!(scenario.envoy.counter(FAILURE_MODE_ALLOWED).await, REQUESTS);
}

/// Our server up but unable to decide: its only config file does not load, and
/// `FORCE_START_WITHOUT_INITIAL_CONFIG=true` starts it anyway, so every call is a gRPC
/// error (`no rate limit configuration loaded`; `UNAVAILABLE` here, `UNKNOWN` from the
/// reference, divergence R3). Envoy treats it as it treats a server that is down: the
/// fail-open listener lets the requests through, the fail-closed ones answer 500 and 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_config_loaded_our_errors_follow_envoys_failure_mode() {
    let dir = TempDir::new("bad-config");
    std::fs::write(
        dir.path().join("api.yaml"),
        "domain: api\ndescriptors:\n  - key: client\n    rate_limit: {unit: fortnight, requests_per_unit: 3}\n",
    )
    .expect("write the config");
    let rls = Rls::start_with(
        dir.path(),
        &[],
        &[("FORCE_START_WITHOUT_INITIAL_CONFIG", "true")],
    )
    .await;
    let scenario = Scenario::start_with_rls(&[OPEN, CLOSED, CLOSED_503], rls).await;
    for (listener, expected) in [(OPEN, 200), (CLOSED, 500), (CLOSED_503, 503)] {
        for i in 0..REQUESTS {
            let res = scenario.get(listener.name, Some(listener.name)).await;
            assert_eq!(
                res.status(),
                expected,
                "{} request {} with no config loaded: {res:?}\nEnvoy's log:\n{}",
                listener.name,
                i + 1,
                scenario.envoy.log()
            );
            assert!(
                res.headers().get("x-ratelimit-remaining").is_none(),
                "{res:?}"
            );
        }
    }
    assert_eq!(scenario.upstream.hits(), REQUESTS);
    assert_eq!(scenario.envoy.counter(OK).await, 0);
    assert_eq!(scenario.envoy.counter(ERROR).await, 3 * REQUESTS);
    assert_eq!(scenario.envoy.counter(FAILURE_MODE_ALLOWED).await, REQUESTS);
}
