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
async fn answer(rls: &mut Rls, key: &str) -> (Result<i32, tonic::Code>, bool, Duration) {
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
async fn every_policy_answers_in_time(rls: &mut Rls) {
    let unavailable = Err(tonic::Code::Unavailable);
    for (key, want, limit) in [
        ("unavailable", [unavailable; 3], false),
        ("allow", [Ok(ok()); 3], false),
        ("deny", [Ok(over()); 3], true),
        // A counter first seen in the outage starts with one unit of the replica's share
        // (what it held in Redis is unknown).
        ("soft", [Ok(ok()), Ok(over()), Ok(over())], true),
        ("default", [Ok(over()); 3], true),
    ] {
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
    // Every limit decides once while Redis is up (the fail-soft handle learns the fleet).
    for key in ["unavailable", "allow", "deny", "soft", "default"] {
        let (got, has_limit, _) = answer(&mut rls, key).await;
        assert_eq!((got, has_limit), (Ok(ok()), true), "{key} with Redis up");
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

/// Redis hanging: a listener on its port accepts connections and never answers, so only
/// the deadline ends a call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_hanging_each_policy_answers_within_the_deadline() {
    let mut rls = started().await;
    let port = rls.redis.as_ref().unwrap().port();
    rls.redis.as_mut().unwrap().kill();
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("the port is free again");
    let hole = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    every_policy_answers_in_time(&mut rls).await;
    hole.abort();
}
