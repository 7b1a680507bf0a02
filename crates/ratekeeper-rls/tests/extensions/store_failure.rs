//! `on_store_failure` per limit and `ON_STORE_FAILURE` for the default: with Redis gone or
//! hanging, every call is answered within the store's deadline, with the code its limits
//! ask for. The reference waits `REDIS_TIMEOUT` (10 s by default) and fails every call alike
//! (<https://github.com/envoyproxy/ratelimit/issues/462>).

use std::time::{Duration, Instant};

use crate::support::*;

const CONFIG: &str = "\
domain: sf
descriptors:
  - key: unavailable
    rate_limit: {unit: minute, requests_per_unit: 10, on_store_failure: unavailable}
  - key: allow
    rate_limit: {unit: minute, requests_per_unit: 10, on_store_failure: allow}
  - key: deny
    rate_limit: {unit: minute, requests_per_unit: 10, on_store_failure: deny}
  - key: soft
    rate_limit: {unit: minute, requests_per_unit: 10, on_store_failure: fail_soft}
  - key: default
    rate_limit: {unit: minute, requests_per_unit: 10}
";

/// The store's deadline in these tests.
const DEADLINE: Duration = Duration::from_millis(100);

/// Slack over the deadline for a loaded machine (16 busy loops on 2 cores): a call that
/// waited for Redis without a deadline would hang far longer (the black hole never answers).
const SLACK: Duration = Duration::from_secs(2);

/// (gRPC code or overall code, whether the first status has a limit) of one call on `key`,
/// and the time it took.
async fn answer(rls: &mut Rls, key: &str) -> (Answer, bool, Duration) {
    let started = Instant::now();
    let r = rls.try_call(req("sf", vec![desc(&[(key, "c")])], 1)).await;
    let took = started.elapsed();
    match r {
        Ok(r) => (
            Ok(r.overall_code),
            r.statuses[0].current_limit.is_some(),
            took,
        ),
        Err(e) => (Err(e.code()), false, took),
    }
}

/// Every policy's answer, each within the deadline (plus slack); `default` answers as
/// `ON_STORE_FAILURE=deny` says.
/// A call's answer: the overall code, or the gRPC error's code.
type Answer = Result<i32, tonic::Code>;

/// Each key's answers to its first three calls in an outage, and whether its status has a
/// limit.
fn expected() -> [(&'static str, [Answer; 3], bool); 5] {
    let unavailable = Err(tonic::Code::Unavailable);
    [
        ("unavailable", [unavailable; 3], false),
        ("allow", [Ok(ok()); 3], false),
        ("deny", [Ok(over()); 3], true),
        // A counter first seen in the outage starts with one unit of the replica's share
        // (what it held in Redis is unknown).
        ("soft", [Ok(ok()), Ok(over()), Ok(over())], true),
        ("default", [Ok(over()); 3], true),
    ]
}

async fn every_policy_answers_in_time(rls: &mut Rls) {
    for (key, want, limit) in expected() {
        for (i, want) in want.into_iter().enumerate() {
            let (got, has_limit, took) = answer(rls, key).await;
            assert_eq!(got, want, "{key} call {i}");
            assert_eq!(has_limit, limit, "{key} call {i}: current_limit");
            assert!(took < DEADLINE + SLACK, "{key} call {i} took {took:?}");
        }
    }
    // Fail soft, in the next window: this replica (the only one registered) enforces its
    // share, the whole limit: 10, then refused.
    rls.clock.advance(Duration::from_secs(60));
    for i in 0..10 {
        assert_eq!(answer(rls, "soft").await.0, Ok(ok()), "soft hit {}", i + 1);
    }
    assert_eq!(answer(rls, "soft").await.0, Ok(over()), "soft hit 11");
}

async fn started() -> Rls {
    let env = [("REDIS_TIMEOUT", "100ms"), ("ON_STORE_FAILURE", "deny")];
    let mut rls = Rls::start(Backend::Redis, CONFIG, &env).await;
    // Every limit decides once while Redis is up (the fail-soft handle learns the fleet);
    // on a loaded machine a call may miss the 100 ms deadline: try again, a bounded number
    // of times.
    for key in ["unavailable", "allow", "deny", "soft", "default"] {
        let mut tries = 0;
        loop {
            let (got, has_limit, _) = answer(&mut rls, key).await;
            if (got, has_limit) == (Ok(ok()), true) {
                break;
            }
            tries += 1;
            assert!(tries < 50, "{key} never decided with Redis up: {got:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    rls
}

/// Redis stopped: connections are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stopped_each_policy_answers_within_the_deadline() {
    let mut rls = started().await;
    rls.redis.as_mut().unwrap().kill();
    every_policy_answers_in_time(&mut rls).await;
}

/// Redis hanging (the process stopped with SIGSTOP: connections stay open and nothing is
/// answered), so only the deadline ends a call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_hanging_each_policy_answers_within_the_deadline() {
    let mut rls = started().await;
    rls.redis.as_ref().unwrap().signal("STOP");
    every_policy_answers_in_time(&mut rls).await;
    rls.redis.as_ref().unwrap().signal("CONT");
}

/// Redis hanging, on tokio's paused clock: every call, whatever its policy, is answered by
/// the store's deadline plus 1 ms of virtual time (the wall-clock tests above need slack
/// for a loaded machine; this one does not). The first call waits the whole deadline (the
/// hang is reached, not a quick connection error); once the store's circuit breaker opens,
/// calls are answered at once.
#[tokio::test(flavor = "current_thread")]
async fn each_policy_answers_by_the_deadline_on_a_virtual_clock() {
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService as _;
    let rls = started().await;
    // Stopped (SIGSTOP): connections stay open and nothing is answered.
    rls.redis.as_ref().unwrap().signal("STOP");
    let service = rls.server().service();
    tokio::time::pause();
    for (key, want, limit) in expected() {
        for (i, want) in want.into_iter().enumerate() {
            let started = tokio::time::Instant::now();
            // A call that waited on Redis without a deadline would hang: fail it instead.
            let r = tokio::time::timeout(
                DEADLINE * 10,
                service.should_rate_limit(tonic::Request::new(req(
                    "sf",
                    vec![desc(&[(key, "c")])],
                    1,
                ))),
            )
            .await
            .unwrap_or_else(|_| panic!("{key} call {i} is not answered by 10 deadlines"));
            let took = started.elapsed();
            if (key, i) == ("unavailable", 0) {
                assert!(
                    took >= DEADLINE,
                    "the first call waited for the hang: {took:?}"
                );
            }
            assert!(
                took <= DEADLINE + Duration::from_millis(1),
                "{key} call {i} took {took:?} of virtual time"
            );
            let got = r
                .as_ref()
                .map(|r| r.get_ref().overall_code)
                .map_err(tonic::Status::code);
            assert_eq!(got, want, "{key} call {i}");
            let has_limit = r.is_ok_and(|r| r.get_ref().statuses[0].current_limit.is_some());
            assert_eq!(has_limit, limit, "{key} call {i}: current_limit");
        }
    }
}

/// A `fail_soft` rule that only a reload brings (the config at start has none, and
/// `ON_STORE_FAILURE` is `unavailable`) fails soft once Redis is gone: the fail-soft handle
/// exists from the start, whatever the config said then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fail_soft_rule_a_reload_brings_fails_soft() {
    let config = |limit: u32, on_failure: &str| {
        format!(
            "domain: sf\ndescriptors:\n  - key: soft\n    rate_limit: {{unit: minute, \
             requests_per_unit: {limit}, on_store_failure: {on_failure}}}\n"
        )
    };
    let env = [("REDIS_TIMEOUT", "100ms")];
    let mut rls = Rls::start(Backend::Redis, &config(10, "unavailable"), &env).await;
    let path = rls.dir.path().join("config.yaml");
    std::fs::write(&path, config(3, "fail_soft")).expect("rewrite the config");
    // The reload is seen by the new limit; each call decides with Redis up (a loaded
    // machine may miss the 100 ms deadline on one: bounded retries).
    let mut tries = 0;
    loop {
        let r = rls
            .try_call(req("sf", vec![desc(&[("soft", "c")])], 0))
            .await;
        let limit = r.ok().and_then(|r| {
            r.statuses[0]
                .current_limit
                .as_ref()
                .map(|l| l.requests_per_unit)
        });
        if limit == Some(3) {
            break;
        }
        tries += 1;
        assert!(tries < 200, "the reloaded config never decided: {limit:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    rls.redis.as_mut().unwrap().kill();
    // As in the start-time case: one unit for a counter first seen in the outage, then
    // this replica's share (the whole limit, as the only replica) in the next window.
    let want = [Ok(ok()), Ok(over()), Ok(over())];
    for (i, want) in want.into_iter().enumerate() {
        let (got, has_limit, took) = answer(&mut rls, "soft").await;
        assert_eq!(got, want, "call {i}");
        assert!(has_limit, "call {i}: current_limit");
        assert!(took < DEADLINE + SLACK, "call {i} took {took:?}");
    }
    rls.clock.advance(Duration::from_secs(60));
    for i in 0..3 {
        assert_eq!(answer(&mut rls, "soft").await.0, Ok(ok()), "hit {}", i + 1);
    }
    assert_eq!(answer(&mut rls, "soft").await.0, Ok(over()), "hit 4");
}
