//! Our statuses, as Envoy's clients see them: Envoy's own 429 past the limit, and the
//! `x-ratelimit-*` headers Envoy builds from our `current_limit`, `limit_remaining` and
//! `duration_until_reset` (`enable_x_ratelimit_headers: DRAFT_VERSION_03`).

use std::time::{SystemTime, UNIX_EPOCH};

use crate::harness::{ERROR, Listener, OK, OVER_LIMIT, Scenario};

const OPEN: Listener = Listener {
    name: "open",
    failure_mode_deny: false,
    status_on_error: None,
};

/// The example's per-client limit: 3 per hour, named `per-client`.
const LIMIT: u64 = 3;
const WINDOW_SECS: u64 = 3_600;

/// Seconds since the Unix epoch on this machine (our server's clock too: same host).
fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("a clock after 1970")
        .as_secs()
}

/// One response's status and rate limit headers.
#[derive(Debug)]
struct Seen {
    status: u16,
    limit: Option<String>,
    remaining: Option<String>,
    reset: Option<u64>,
    envoy_ratelimited: bool,
}

async fn seen(res: reqwest::Response) -> Seen {
    let header = |name: &str| {
        res.headers()
            .get(name)
            .map(|v| v.to_str().expect("an ASCII header").to_owned())
    };
    let seen = Seen {
        status: res.status().as_u16(),
        limit: header("x-ratelimit-limit"),
        remaining: header("x-ratelimit-remaining"),
        reset: header("x-ratelimit-reset").map(|r| r.parse().expect("a reset in seconds")),
        envoy_ratelimited: header("x-envoy-ratelimited").as_deref() == Some("true"),
    };
    let _ = res.bytes().await;
    seen
}

/// Past the example's limit (3 per hour per client) Envoy answers 429 itself, without asking
/// the upstream, and every response carries the headers Envoy builds from our status:
/// `x-ratelimit-limit: 3, 3;w=3600;name="per-client"` (the limit, then the quota policy:
/// `requests_per_unit`, the unit in seconds, the rule's `name`), `x-ratelimit-remaining`
/// counting 2, 1, 0, 0, 0, and `x-ratelimit-reset` the seconds to the end of the current
/// hour (the reference's epoch-aligned window, `3600 - now % 3600`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_limit_envoy_answers_429_with_headers_built_from_our_statuses() {
    let scenario = Scenario::start(&[OPEN]).await;
    // A run that crosses the top of an hour sees the window restart: it starts again with a
    // new client, at most 3 times.
    for attempt in 0..3 {
        let client = format!("client-{attempt}");
        let hits_before = scenario.upstream.hits();
        let over_before = scenario.envoy.counter(OVER_LIMIT).await;
        let ok_before = scenario.envoy.counter(OK).await;
        let mut seen_all = Vec::new();
        let mut hours = Vec::new();
        for _ in 0..LIMIT + 2 {
            let before = now_secs();
            let res = seen(scenario.get(OPEN.name, Some(&client)).await).await;
            let after = now_secs();
            hours.push((before / WINDOW_SECS, after / WINDOW_SECS));
            seen_all.push((before, after, res));
        }
        let first_hour = hours[0].0;
        if hours
            .iter()
            .any(|&(b, a)| b != first_hour || a != first_hour)
        {
            continue;
        }
        for (i, (before, after, res)) in seen_all.iter().enumerate() {
            let i = i as u64;
            let allowed = i < LIMIT;
            assert_eq!(
                res.status,
                if allowed { 200 } else { 429 },
                "request {} of {client}: {res:?}\nEnvoy's log:\n{}",
                i + 1,
                scenario.envoy.log()
            );
            assert_eq!(
                res.envoy_ratelimited,
                !allowed,
                "x-envoy-ratelimited on request {}: {res:?}",
                i + 1
            );
            assert_eq!(
                res.limit.as_deref(),
                Some("3, 3;w=3600;name=\"per-client\""),
                "request {}: {res:?}",
                i + 1
            );
            let remaining = LIMIT.saturating_sub(i + 1).to_string();
            assert_eq!(
                res.remaining.as_deref(),
                Some(remaining.as_str()),
                "request {}: {res:?}",
                i + 1
            );
            // Whole seconds, read before and after the request: the server's reading is
            // between them (1 s of slack for its rounding).
            let reset = res.reset.unwrap_or_else(|| panic!("no reset: {res:?}"));
            let latest = WINDOW_SECS - after % WINDOW_SECS;
            let earliest = WINDOW_SECS - before % WINDOW_SECS;
            assert!(
                (latest.saturating_sub(1)..=earliest + 1).contains(&reset),
                "request {}: reset {reset} s, expected {latest}..={earliest} s (the end of the hour): {res:?}",
                i + 1
            );
        }
        assert_eq!(
            scenario.upstream.hits() - hits_before,
            LIMIT,
            "the upstream answers the allowed requests only"
        );
        // Envoy's own account: our server answered every call, 3 OK and 2 OVER_LIMIT.
        assert_eq!(scenario.envoy.counter(OK).await - ok_before, LIMIT);
        assert_eq!(scenario.envoy.counter(OVER_LIMIT).await - over_before, 2);
        assert_eq!(scenario.envoy.counter(ERROR).await, 0);
        return;
    }
    panic!("3 runs each crossed the top of an hour: the clock is not monotonic?");
}

/// A client our configuration never limits (`unlimited: true`) always reaches the upstream,
/// and Envoy adds no rate limit headers (our status has no `current_limit`, which Envoy
/// needs to build them); a request without `x-client` sends Envoy no descriptor at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlimited_client_and_a_request_without_descriptor_always_pass_without_headers() {
    let scenario = Scenario::start(&[OPEN]).await;
    for client in [Some("internal-batch"), None] {
        for i in 0..LIMIT + 2 {
            let res = seen(scenario.get(OPEN.name, client).await).await;
            assert_eq!(res.status, 200, "request {} of {client:?}: {res:?}", i + 1);
            assert_eq!(
                (res.limit, res.remaining, res.reset),
                (None, None, None),
                "request {} of {client:?}",
                i + 1
            );
        }
    }
    assert_eq!(scenario.upstream.hits(), 2 * (LIMIT + 2));
    // Envoy asked us for the unlimited client only; we answered OK each time.
    assert_eq!(scenario.envoy.counter(OK).await, LIMIT + 2);
    assert_eq!(scenario.envoy.counter(ERROR).await, 0);
}
