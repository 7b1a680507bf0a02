//! Our statuses, as Envoy's clients see them: Envoy's own 429 past the limit, the
//! `x-ratelimit-*` headers Envoy builds from our `current_limit`, `limit_remaining` and
//! `duration_until_reset` (`enable_x_ratelimit_headers: DRAFT_VERSION_03`), the headers we
//! add ourselves (`LIMIT_RESPONSE_HEADERS_ENABLED`), and the check-then-report flow of
//! `hits_addend: 0` before the request and 1 once it is done.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::harness::{ERROR, Listener, OK, OVER_LIMIT, Scenario};

const OPEN: Listener = Listener::open("open");
const CHECK_THEN_REPORT: Listener = Listener {
    check_then_report: true,
    ..Listener::open("check_then_report")
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

/// One response: its status and rate limit headers, and the clock (s) read just before and
/// just after it.
#[derive(Debug)]
struct Seen {
    status: u16,
    /// `x-ratelimit-limit`, `-remaining`, `-reset` (built by Envoy).
    x_limit: Option<String>,
    x_remaining: Option<String>,
    x_reset: Option<u64>,
    /// `ratelimit-limit`, `-remaining`, `-reset` (ours, with `--limit-response-headers`).
    limit: Option<String>,
    remaining: Option<String>,
    reset: Option<u64>,
    envoy_ratelimited: bool,
    before: u64,
    after: u64,
}

impl Seen {
    /// Asserts that `reset` (s) is the time left in the hour this response was in
    /// (`3600 - now % 3600`, the reference's epoch-aligned window), read between `before` and
    /// `after` (1 s of slack for rounding).
    fn assert_reset_ends_the_hour(&self, reset: Option<u64>, what: &str) {
        let reset = reset.unwrap_or_else(|| panic!("no {what}: {self:?}"));
        let latest = WINDOW_SECS - self.after % WINDOW_SECS;
        let earliest = WINDOW_SECS - self.before % WINDOW_SECS;
        assert!(
            (latest.saturating_sub(1)..=earliest + 1).contains(&reset),
            "{what} {reset} s, expected {latest}..={earliest} s (the end of the hour): {self:?}"
        );
    }
}

/// Our count of `ShouldRateLimit` calls (Envoy does not count the calls it makes once a
/// stream is done).
const CALLS: &str = r#"ratelimit_service_total_requests{grpc_method="ShouldRateLimit"}"#;

/// Sends `requests` GETs with `x-client: <client>` through `listener`. With `wait_report`,
/// after each request it waits (at most 30 s) until our server has answered both calls of
/// that request (the check and the report), so the next check sees the charge.
async fn run(
    scenario: &Scenario,
    listener: &str,
    client: &str,
    requests: u64,
    wait_report: bool,
) -> Vec<Seen> {
    let mut seen = Vec::new();
    for sent in 1..=requests {
        let before = now_secs();
        let res = scenario.get(listener, Some(client)).await;
        let after = now_secs();
        let header = |name: &str| {
            res.headers()
                .get(name)
                .map(|v| v.to_str().expect("an ASCII header").to_owned())
        };
        let secs = |v: String| v.parse::<u64>().expect("seconds");
        let one = Seen {
            status: res.status().as_u16(),
            x_limit: header("x-ratelimit-limit"),
            x_remaining: header("x-ratelimit-remaining"),
            x_reset: header("x-ratelimit-reset").map(secs),
            limit: header("ratelimit-limit"),
            remaining: header("ratelimit-remaining"),
            reset: header("ratelimit-reset").map(secs),
            envoy_ratelimited: header("x-envoy-ratelimited").as_deref() == Some("true"),
            before,
            after,
        };
        let _ = res.bytes().await;
        if wait_report {
            // Envoy reports every request once its stream is done, refused ones included.
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let calls = scenario.rls.metric(CALLS).await;
                if calls >= (2 * sent) as f64 {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "{calls} calls for {sent} requests within 30 s (2 each expected)\n\
                     Envoy's log:\n{}",
                    scenario.envoy.log()
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        seen.push(one);
    }
    seen
}

/// [`run`] with a fresh client, again with another while a run crosses the top of an hour
/// (the window restarts there), at most 3 times. Runs on a fresh scenario each time, so
/// Envoy's counters count this run only.
async fn run_in_one_window(
    listener: Listener,
    rls_args: &[&str],
    requests: u64,
    wait_report: bool,
) -> (Scenario, Vec<Seen>) {
    for attempt in 0..3 {
        let scenario = Scenario::start_with(&[listener], rls_args).await;
        let seen = run(
            &scenario,
            listener.name,
            &format!("client-{attempt}"),
            requests,
            wait_report,
        )
        .await;
        let hour = seen[0].before / WINDOW_SECS;
        if seen.iter().all(|s| s.after / WINDOW_SECS == hour) {
            return (scenario, seen);
        }
    }
    panic!("3 runs each crossed the top of an hour: is the clock moving backwards?");
}

/// Past the example's limit (3 per hour per client) Envoy answers 429 itself, without asking
/// the upstream, and every response carries the headers Envoy builds from our status:
/// `x-ratelimit-limit: 3, 3;w=3600;name="per-client"` (the limit, then the quota policy:
/// `requests_per_unit`, the unit in seconds, the rule's `name`), `x-ratelimit-remaining`
/// counting 2, 1, 0, 0, 0, and `x-ratelimit-reset` the seconds to the end of the current
/// hour (the reference's epoch-aligned window, `3600 - now % 3600`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_limit_envoy_answers_429_with_headers_built_from_our_statuses() {
    let (scenario, seen) = run_in_one_window(OPEN, &[], LIMIT + 2, false).await;
    for (i, res) in (1..).zip(&seen) {
        let allowed = i <= LIMIT;
        assert_eq!(
            res.status,
            if allowed { 200 } else { 429 },
            "request {i}: {res:?}\nEnvoy's log:\n{}",
            scenario.envoy.log()
        );
        assert_eq!(res.envoy_ratelimited, !allowed, "request {i}: {res:?}");
        assert_eq!(
            res.x_limit.as_deref(),
            Some("3, 3;w=3600;name=\"per-client\""),
            "request {i}: {res:?}"
        );
        let remaining = LIMIT.saturating_sub(i).to_string();
        assert_eq!(
            res.x_remaining.as_deref(),
            Some(remaining.as_str()),
            "request {i}: {res:?}"
        );
        res.assert_reset_ends_the_hour(res.x_reset, "x-ratelimit-reset");
        // Our own headers are off by default (LIMIT_RESPONSE_HEADERS_ENABLED=false).
        assert_eq!(
            (&res.limit, &res.remaining, res.reset),
            (&None, &None, None)
        );
    }
    assert_eq!(
        scenario.upstream.hits(),
        LIMIT,
        "the upstream answers the allowed requests only"
    );
    // Envoy's own account: our server answered every call, 3 OK and 2 OVER_LIMIT.
    assert_eq!(scenario.envoy.counter(OK).await, LIMIT);
    assert_eq!(scenario.envoy.counter(OVER_LIMIT).await, 2);
    assert_eq!(scenario.envoy.counter(ERROR).await, 0);
}

/// Requests sent at once by one client in [`many_requests_at_once_admit_exactly_the_limit`].
const AT_ONCE: u64 = 30;

/// 30 requests of one client at once: Envoy multiplexes their calls on its HTTP/2
/// connection to our server, and exactly the limit (3) of them reaches the upstream; the
/// other 27 are Envoy's 429, each with `x-ratelimit-remaining: 0`. The admitted ones saw
/// remaining 2, 1 and 0, once each: no two calls read the same count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_requests_at_once_admit_exactly_the_limit() {
    for attempt in 0..3 {
        let scenario = Scenario::start(&[OPEN]).await;
        let client = format!("crowd-{attempt}");
        let start = now_secs();
        let answers = futures_util::future::join_all((0..AT_ONCE).map(|_| async {
            let res = scenario.get(OPEN.name, Some(&client)).await;
            let remaining = res
                .headers()
                .get("x-ratelimit-remaining")
                .map(|v| v.to_str().expect("ASCII").to_owned());
            (res.status().as_u16(), remaining)
        }))
        .await;
        if now_secs() / WINDOW_SECS != start / WINDOW_SECS {
            continue; // the window restarted during the run
        }
        // Each admitted request saw its own count: remaining 2, 1 and 0, once each.
        let mut allowed: Vec<&str> = answers
            .iter()
            .filter(|(status, _)| *status == 200)
            .map(|(_, remaining)| remaining.as_deref().unwrap_or("none"))
            .collect();
        allowed.sort_unstable();
        assert_eq!(allowed, ["0", "1", "2"], "{answers:?}");
        for (status, remaining) in &answers {
            if *status != 200 {
                assert_eq!(*status, 429, "{answers:?}");
                assert_eq!(remaining.as_deref(), Some("0"), "{answers:?}");
            }
        }
        assert_eq!(scenario.upstream.hits(), LIMIT);
        assert_eq!(scenario.envoy.counter(OK).await, LIMIT);
        assert_eq!(scenario.envoy.counter(OVER_LIMIT).await, AT_ONCE - LIMIT);
        assert_eq!(scenario.envoy.counter(ERROR).await, 0);
        return;
    }
    panic!("3 runs each crossed the top of an hour: is the clock moving backwards?");
}

/// With `--limit-response-headers` (the reference's `LIMIT_RESPONSE_HEADERS_ENABLED`) our
/// server puts `RateLimit-Limit` (`requests_per_unit` alone), `RateLimit-Remaining` and
/// `RateLimit-Reset` (seconds to the end of the window) in `response_headers_to_add`, and
/// Envoy hands them to the client on the upstream's 200s and on its own 429s, beside the
/// `x-ratelimit-*` it builds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_ratelimit_headers_reach_the_client_on_200_and_429() {
    let (scenario, seen) =
        run_in_one_window(OPEN, &["--limit-response-headers"], LIMIT + 1, false).await;
    for (i, res) in (1..).zip(&seen) {
        let allowed = i <= LIMIT;
        assert_eq!(
            res.status,
            if allowed { 200 } else { 429 },
            "request {i}: {res:?}"
        );
        assert_eq!(res.limit.as_deref(), Some("3"), "request {i}: {res:?}");
        let remaining = LIMIT.saturating_sub(i).to_string();
        assert_eq!(
            res.remaining.as_deref(),
            Some(remaining.as_str()),
            "request {i}: {res:?}"
        );
        res.assert_reset_ends_the_hour(res.reset, "ratelimit-reset");
        assert_eq!(res.x_remaining, res.remaining, "request {i}: {res:?}");
    }
    assert_eq!(scenario.upstream.hits(), LIMIT);
}

/// Check, then report (envoyproxy/ratelimit's token-quota example): the request path sends
/// the descriptor with `hits_addend: 0`, a check that charges nothing, and Envoy reports
/// `hits_addend: 1` once the response is done. Here a check of a counter *at* its limit is
/// over (the crate docs' divergence R1; the reference answers `OK` there and admits
/// `limit + 1`), so a client gets exactly the limit per window: with 3 per hour, 3 requests
/// reach the upstream (the checks see 0, 1, 2 used: remaining 3, 2, 1) and the next ones
/// are Envoy's 429 (remaining 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_then_report_admits_exactly_the_limit_per_window() {
    let (scenario, seen) = run_in_one_window(CHECK_THEN_REPORT, &[], LIMIT + 2, true).await;
    let statuses: Vec<u16> = seen.iter().map(|s| s.status).collect();
    assert_eq!(
        statuses,
        [200, 200, 200, 429, 429],
        "{seen:#?}\nEnvoy's log:\n{}",
        scenario.envoy.log()
    );
    let remaining: Vec<Option<&str>> = seen.iter().map(|s| s.x_remaining.as_deref()).collect();
    assert_eq!(
        remaining,
        [Some("3"), Some("2"), Some("1"), Some("0"), Some("0")],
        "{seen:#?}"
    );
    assert_eq!(scenario.upstream.hits(), LIMIT);
    // Each request was checked, then reported once done (the refused ones too): 10 calls.
    assert_eq!(scenario.rls.metric(CALLS).await, 10.0);
    assert_eq!(scenario.envoy.counter(ERROR).await, 0);
}

/// A client our configuration never limits (`unlimited: true`) always reaches the upstream,
/// and Envoy adds no rate limit headers (our status has no `current_limit`, which Envoy
/// needs to build them); a request without `x-client` sends Envoy no descriptor at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlimited_client_and_a_request_without_descriptor_always_pass_without_headers() {
    let scenario = Scenario::start(&[OPEN]).await;
    for client in [Some("internal-batch"), None] {
        for i in 1..=LIMIT + 2 {
            let res = scenario.get(OPEN.name, client).await;
            assert_eq!(res.status(), 200, "request {i} of {client:?}: {res:?}");
            for name in [
                "x-ratelimit-limit",
                "x-ratelimit-remaining",
                "x-ratelimit-reset",
            ] {
                assert!(
                    res.headers().get(name).is_none(),
                    "request {i} of {client:?}: {res:?}"
                );
            }
        }
    }
    assert_eq!(scenario.upstream.hits(), 2 * (LIMIT + 2));
    // Envoy asked us for the unlimited client only; we answered OK each time.
    assert_eq!(scenario.envoy.counter(OK).await, LIMIT + 2);
    assert_eq!(scenario.envoy.counter(ERROR).await, 0);
}
