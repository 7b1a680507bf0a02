//! `charging: all_or_nothing`: a request's descriptors are checked and charged in one store
//! call, and a refused request charges none of them. The reference charges every matched
//! descriptor even when it refuses, so one tight limit drains a shared wide one
//! (<https://github.com/envoyproxy/ratelimit/issues/1060>): this test runs that scenario,
//! two server processes and eight clients against a tight and a wide limit, with and
//! without the key.

use crate::fleet::{Process, redis_secs};
use crate::redis_support::RedisServer;
use crate::support::*;

const CONFIG_AON: &str = "\
domain: aon
charging: all_or_nothing
descriptors:
  - key: tight
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: wide
    rate_limit: {unit: minute, requests_per_unit: 10000}
";

const CONFIG_PER: &str = "\
domain: per
descriptors:
  - key: tight
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: wide
    rate_limit: {unit: minute, requests_per_unit: 10000}
";

const TASKS: usize = 8;
const CALLS_PER_TASK: usize = 40;

/// Eight tasks (four per server) send 40 requests each, every one carrying the tight and
/// the wide descriptor of `client`. Returns (admitted, units the wide counter holds after).
async fn run(servers: &[Process; 2], domain: &str, client: &str) -> (usize, u64) {
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let mut c = servers[t % 2].client().await;
        let (domain, client) = (domain.to_owned(), client.to_owned());
        tasks.push(tokio::spawn(async move {
            let mut admitted = 0;
            for _ in 0..CALLS_PER_TASK {
                let r = c
                    .should_rate_limit(req(
                        &domain,
                        vec![desc(&[("tight", &client)]), desc(&[("wide", &client)])],
                        1,
                    ))
                    .await
                    .expect("ShouldRateLimit answers")
                    .into_inner();
                if r.overall_code == ok() {
                    admitted += 1;
                }
            }
            admitted
        }));
    }
    let mut admitted = 0;
    for t in tasks {
        admitted += t.await.expect("a client task");
    }
    // A check (0 hits) of the wide counter alone: its remaining tells what it holds.
    let mut c = servers[0].client().await;
    let r = c
        .should_rate_limit(req(domain, vec![desc_hits(&[("wide", client)], 0)], 1))
        .await
        .expect("the check answers")
        .into_inner();
    (admitted, 10_000 - u64::from(r.statuses[0].limit_remaining))
}

/// `run` within one Redis-time minute: a run that straddles a minute boundary (two windows)
/// is run again with a fresh client, at most three times.
async fn run_in_one_window(
    redis: &RedisServer,
    servers: &[Process; 2],
    domain: &str,
) -> (usize, u64) {
    for attempt in 0..3 {
        let before = redis_secs(redis) / 60;
        let result = run(servers, domain, &format!("client-{attempt}")).await;
        if redis_secs(redis) / 60 == before {
            return result;
        }
    }
    panic!("three runs straddled a minute boundary");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_charge_all_or_nothing() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("aon.yaml"), CONFIG_AON).unwrap();
    std::fs::write(dir.path().join("per.yaml"), CONFIG_PER).unwrap();
    let url = redis.url();
    let env = [("REDIS_URL", url.as_str()), ("REDIS_TIMEOUT", "30s")];
    let servers = [
        Process::start(dir.path(), &[], &env).await,
        Process::start(dir.path(), &[], &env).await,
    ];
    let total = TASKS * CALLS_PER_TASK;

    let (admitted, wide) = run_in_one_window(&redis, &servers, "aon").await;
    assert!(admitted <= 100, "admitted {admitted} > 100 in one window");
    assert_eq!(admitted, 100, "the tight limit is used up, not more");
    assert_eq!(
        wide, admitted as u64,
        "the wide counter holds exactly the admitted"
    );

    // Without the key (the reference's charging), refused requests drain the wide limit.
    let (admitted, wide) = run_in_one_window(&redis, &servers, "per").await;
    assert_eq!(admitted, 100);
    assert_eq!(wide, total as u64, "every request charged the wide limit");
}
