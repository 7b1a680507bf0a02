//! Redis time per decision: the µs `redis-server` spends running the Redis store's script
//! for one decision, read from `INFO commandstats` (calls and usec of `fcall`, `evalsha`
//! and `eval`), per algorithm and per number of policies charged in one call.
//!
//! Redis runs every instance's decisions on one thread, so this time bounds the decisions
//! per second one Redis can serve, whatever the number of app instances.
//!
//! Run: `scripts/redis_server_time.sh` (starts its own `redis-server`). This binary needs
//! `RK_URL` (a running Redis it may reset the statistics of); `RK_ALGOS` (comma-separated:
//! gcra, leaky_bucket, fixed_window, sliding_window, sliding_log), `RK_POLICIES`
//! (comma-separated counts, default `1,2,4`) and `RK_COUNT` (decisions per cell, default
//! 5000) choose the cells. Prints one line per cell: algorithm, policies, calls, usec,
//! µs per call.
//!
//! Each cell registers its policies on a store of its own (its own key prefix), makes
//! `RK_WARM` (default 200) decisions to warm up (keys present), resets the server's statistics,
//! then makes `RK_COUNT` decisions one after the other on 1 000 client keys in turn, each
//! one charge of cost 1 per policy, all in one call. The quota (1 000 000 per second) never
//! denies, so every cell measures the allow path, the common one.

use std::time::Duration;

use ratekeeper_axum::core::store::redis::RedisStore;
use ratekeeper_axum::core::store::{Charge, Checked, PolicyId, Store};
use ratekeeper_axum::{core::Algorithm, core::Key, core::Policy, core::Quota};

const KEYS: usize = 1_000;

fn algorithm(name: &str) -> Result<Algorithm, String> {
    Ok(match name {
        "gcra" => Algorithm::Gcra,
        "leaky_bucket" => Algorithm::LeakyBucket,
        "fixed_window" => Algorithm::FixedWindow,
        "sliding_window" => Algorithm::SlidingWindow,
        "sliding_log" => Algorithm::SlidingLog,
        other => return Err(format!("unknown algorithm {other:?}")),
    })
}

/// `usec` and `calls` of the script commands in `INFO commandstats`.
fn script_stats(info: &str) -> (u64, u64) {
    let mut calls = 0;
    let mut usec = 0;
    for line in info.lines() {
        let Some((name, fields)) = line.split_once(':') else {
            continue;
        };
        if !matches!(name, "cmdstat_fcall" | "cmdstat_evalsha" | "cmdstat_eval") {
            continue;
        }
        for field in fields.split(',') {
            match field.split_once('=') {
                Some(("calls", v)) => calls += v.parse::<u64>().unwrap_or(0),
                Some(("usec", v)) => usec += v.parse::<u64>().unwrap_or(0),
                _ => {}
            }
        }
    }
    (calls, usec)
}

async fn cell(
    url: &str,
    algo: &str,
    policies: usize,
    count: usize,
    warm: usize,
) -> Result<(u64, u64), Box<dyn std::error::Error>> {
    let quota = Quota::new(1_000_000, Duration::from_secs(1))?;
    let mut store = RedisStore::builder()
        .prefix(format!("t-{algo}-{policies}"))
        .deadline(Duration::from_secs(5))
        .standalone(url)
        .await?;
    let mut ids: Vec<PolicyId> = Vec::new();
    for p in 0..policies {
        let policy = Policy::new(format!("p{p}"), quota).with_algorithm(algorithm(algo)?);
        ids.push(store.register(&policy)?);
    }
    let keys: Vec<Key> = (0..KEYS).map(|i| Key::from(format!("k{i}"))).collect();
    let mut admin = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let mut allowed = 0;
    for j in 0..warm + count {
        if j == warm {
            let () = redis::cmd("CONFIG")
                .arg("RESETSTAT")
                .query_async(&mut admin)
                .await?;
        }
        let key = &keys[j % KEYS];
        let charges: Vec<Charge<'_, Key>> = ids.iter().map(|id| Charge::new(*id, key, 1)).collect();
        let decisions = match store.check(&charges) {
            Checked::Ready(r) => r,
            Checked::Pending(f) => f.await,
        }?;
        allowed += usize::from(decisions.is_allowed());
    }
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut admin)
        .await?;
    if allowed != warm + count || store.stats().degraded != 0 {
        return Err(format!("{algo} x{policies}: {allowed} allowed of {}", warm + count).into());
    }
    Ok(script_stats(&info))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("RK_URL").map_err(|_| "RK_URL: the Redis to measure on")?;
    let algos = std::env::var("RK_ALGOS")
        .unwrap_or_else(|_| "gcra,fixed_window,sliding_window,sliding_log".to_owned());
    let policies = std::env::var("RK_POLICIES").unwrap_or_else(|_| "1,2,4".to_owned());
    let count: usize = std::env::var("RK_COUNT")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5_000);
    let warm: usize = std::env::var("RK_WARM")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    for algo in algos.split(',') {
        for p in policies.split(',') {
            let p: usize = p.parse()?;
            let (calls, usec) = cell(&url, algo, p, count, warm).await?;
            let per = usec as f64 / calls.max(1) as f64;
            println!("{algo} {p} {calls} {usec} {per:.2}");
        }
    }
    Ok(())
}
