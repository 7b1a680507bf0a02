//! The limitador library beside ratekeeper's stores, in one process: decisions per second
//! with many concurrent callers, the time `redis-server` spends per decision, and (one
//! caller, a fixed count, for callgrind) instructions per decision.
//!
//! Run it through `scripts/limitador_bench.sh`, which starts a `redis-server` of its own on a
//! free loopback port and prints markdown tables. This binary reads:
//!
//! - `LB_URL`: the Redis to use (its statistics are reset and its keys written);
//! - `LB_MODE`: `rate` (default) or `count`;
//! - `rate` mode: `LB_SECS` (seconds per cell, default 2), `LB_ROUNDS` (default 5),
//!   `LB_CALLERS` (concurrent callers, default 16), `LB_CELLS` (comma-separated, default
//!   every cell: `memory,redis`);
//! - `count` mode: `LB_IMPL` (`limitador-memory`, `ours-memory`, `limitador-redis`,
//!   `ours-redis`), `LB_LIMIT` (`loose` or `tight`), `LB_COUNT` (decisions, one caller on a
//!   current-thread runtime, after `LB_WARM` decisions: by default one per key, and under
//!   the tight limit enough for every key to have used its window).
//!
//! Every decision is one call for one of `LB_KEYS` (default 1 000) distinct keys in turn,
//! cost 1, against one fixed-window limit: `loose` is 1 000 000 per 60 s (every call allowed),
//! `tight` is 10 per 60 s (after the first 10 calls per key, every call refused). limitador
//! gets a `Limit` with the key as its one variable (`user`) and a context built per call
//! from a map holding it; ratekeeper gets a `FixedWindow` policy and a `Key` built per call
//! from the same string. limitador in memory is its `RateLimiter` (`InMemoryStorage`), on
//! Redis its `AsyncRateLimiter` on `AsyncRedisStorage` (not the cached storage); ours are
//! `MemoryStore` and `RedisStore` with their defaults (the negative cache on), except a
//! 2 s deadline so a slow machine does not turn decisions into store errors.
//!
//! `rate` mode prints one line per cell and round:
//! `cell limit impl round decisions allowed errors secs redis_calls redis_usec`, where the
//! last two are the `INFO commandstats` calls and usec of the script commands (`eval`,
//! `evalsha`, `fcall` and their read-only forms) since the cell's `CONFIG RESETSTAT`; other
//! commands seen are printed to stderr. `count` mode prints `decisions allowed`.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use limitador::limit::{Context, Limit};
use limitador::storage::redis::AsyncRedisStorage;
use limitador::{AsyncRateLimiter, RateLimiter};
use ratekeeper_core::store::MemoryStore;
use ratekeeper_core::store::redis::RedisStore;
use ratekeeper_core::store::{Charge, Checked, PolicyId, Store};
use ratekeeper_core::{Algorithm, Key, Policy, Quota};

type Error = Box<dyn std::error::Error + Send + Sync>;

const WINDOW_SECS: u64 = 60;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum LimitKind {
    Loose,
    Tight,
}

impl LimitKind {
    fn name(self) -> &'static str {
        match self {
            Self::Loose => "loose",
            Self::Tight => "tight",
        }
    }

    fn max(self) -> u32 {
        match self {
            Self::Loose => 1_000_000,
            Self::Tight => 10,
        }
    }
}

/// One limiter under test, shared by every caller.
#[derive(Clone)]
enum Limiter {
    TheirsMemory(Arc<RateLimiter>),
    TheirsRedis(Arc<AsyncRateLimiter>),
    OursMemory(MemoryStore<Key>, PolicyId),
    OursRedis(RedisStore, PolicyId),
}

impl Limiter {
    fn name(&self) -> &'static str {
        match self {
            Self::TheirsMemory(_) => "limitador",
            Self::TheirsRedis(_) => "limitador",
            Self::OursMemory(..) => "ours",
            Self::OursRedis(..) => "ours",
        }
    }

    /// One decision for `key`: `Ok(true)` allowed, `Ok(false)` refused.
    async fn decide(&self, namespace: &str, key: &str) -> Result<bool, Error> {
        match self {
            Self::TheirsMemory(limiter) => {
                let ctx: Context<'_> = HashMap::from([("user".to_owned(), key.to_owned())]).into();
                let result = limiter
                    .check_rate_limited_and_update(&namespace.into(), &ctx, 1)
                    .map_err(|e| e.to_string())?;
                Ok(!result.limited)
            }
            Self::TheirsRedis(limiter) => {
                let ctx: Context<'_> = HashMap::from([("user".to_owned(), key.to_owned())]).into();
                let result = limiter
                    .check_rate_limited_and_update(&namespace.into(), &ctx, 1)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(!result.limited)
            }
            Self::OursMemory(store, id) => {
                let key = Key::from(key.to_owned());
                let charges = [Charge::new(*id, &key, 1)];
                let decisions = match store.check(&charges) {
                    Checked::Ready(r) => r,
                    Checked::Pending(f) => f.await,
                }?;
                Ok(decisions.is_allowed())
            }
            Self::OursRedis(store, id) => {
                let key = Key::from(key.to_owned());
                let charges = [Charge::new(*id, &key, 1)];
                let decisions = match store.check(&charges) {
                    Checked::Ready(r) => r,
                    Checked::Pending(f) => f.await,
                }?;
                Ok(decisions.is_allowed())
            }
        }
    }
}

fn their_limit(kind: LimitKind) -> Result<Limit, Error> {
    Ok(Limit::new(
        kind.name(),
        u64::from(kind.max()),
        WINDOW_SECS,
        [],
        ["user".try_into().map_err(|e| format!("variable: {e:?}"))?],
    ))
}

fn our_policy(kind: LimitKind) -> Result<Policy, Error> {
    let quota = Quota::new(kind.max(), Duration::from_secs(WINDOW_SECS))?;
    Ok(Policy::new(kind.name(), quota).with_algorithm(Algorithm::FixedWindow))
}

async fn build(imp: &str, kind: LimitKind, url: &str) -> Result<Limiter, Error> {
    Ok(match imp {
        "limitador-memory" => {
            // limitador-server's default cache size.
            let limiter = RateLimiter::new(10_000);
            limiter.add_limit(their_limit(kind)?);
            Limiter::TheirsMemory(Arc::new(limiter))
        }
        "limitador-redis" => {
            let storage = AsyncRedisStorage::new(url).await?;
            let limiter = AsyncRateLimiter::new_with_storage(Box::new(storage));
            limiter.add_limit(their_limit(kind)?);
            Limiter::TheirsRedis(Arc::new(limiter))
        }
        "ours-memory" => {
            let mut store = MemoryStore::<Key>::new();
            let id = store.register(&our_policy(kind)?)?;
            Limiter::OursMemory(store, id)
        }
        "ours-redis" => {
            let mut store = RedisStore::builder()
                .prefix(format!("rk-{}", kind.name()))
                .deadline(Duration::from_secs(2))
                .standalone(url)
                .await?;
            let id = store.register(&our_policy(kind)?)?;
            Limiter::OursRedis(store, id)
        }
        other => return Err(format!("unknown implementation {other:?}").into()),
    })
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn keys() -> Arc<Vec<String>> {
    let n: usize = env_or("LB_KEYS", 1_000);
    Arc::new((0..n).map(|i| format!("user-{i}")).collect())
}

/// What one cell counted.
#[derive(Default)]
struct Tally {
    decisions: u64,
    allowed: u64,
    errors: u64,
}

/// `callers` tasks deciding for `secs` seconds, keys in turn (each caller starts at its own
/// offset). Returns the tally and the seconds it took.
async fn drive(
    limiter: &Limiter,
    namespace: &'static str,
    keys: &Arc<Vec<String>>,
    callers: usize,
    secs: f64,
) -> (Tally, f64) {
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(callers);
    for c in 0..callers {
        let limiter = limiter.clone();
        let keys = Arc::clone(keys);
        let stop = Arc::clone(&stop);
        tasks.push(tokio::spawn(async move {
            let mut tally = Tally::default();
            let mut i = c * keys.len() / callers.max(1);
            while !stop.load(Ordering::Relaxed) {
                match limiter.decide(namespace, &keys[i % keys.len()]).await {
                    Ok(allowed) => tally.allowed += u64::from(allowed),
                    Err(_) => tally.errors += 1,
                }
                tally.decisions += 1;
                i += 1;
                // The memory limiters never wait: let the other callers run.
                if tally.decisions % 64 == 0 {
                    tokio::task::yield_now().await;
                }
            }
            tally
        }));
    }
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    stop.store(true, Ordering::Relaxed);
    let mut total = Tally::default();
    for t in tasks {
        if let Ok(t) = t.await {
            total.decisions += t.decisions;
            total.allowed += t.allowed;
            total.errors += t.errors;
        }
    }
    (total, start.elapsed().as_secs_f64())
}

/// `calls` and `usec` of the script commands in `INFO commandstats`, and the other commands
/// seen (name, calls), apart from the admin ones this binary sends.
fn script_stats(info: &str) -> (u64, u64, Vec<(String, u64)>) {
    let mut calls = 0;
    let mut usec = 0;
    let mut others = Vec::new();
    for line in info.lines() {
        let Some((name, fields)) = line.split_once(':') else {
            continue;
        };
        let Some(name) = name.strip_prefix("cmdstat_") else {
            continue;
        };
        let (mut c, mut u) = (0u64, 0u64);
        for field in fields.split(',') {
            match field.split_once('=') {
                Some(("calls", v)) => c = v.parse().unwrap_or(0),
                Some(("usec", v)) => u = v.parse().unwrap_or(0),
                _ => {}
            }
        }
        match name {
            "eval" | "evalsha" | "eval_ro" | "evalsha_ro" | "fcall" | "fcall_ro" => {
                calls += c;
                usec += u;
            }
            // This binary's own (CONFIG RESETSTAT, INFO) and the clients' connection checks.
            name if name.starts_with("config") || name == "info" || name == "ping" => {}
            other => others.push((other.to_owned(), c)),
        }
    }
    (calls, usec, others)
}

async fn admin(url: &str) -> Result<redis::aio::MultiplexedConnection, Error> {
    Ok(redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?)
}

async fn rate_mode(url: &str) -> Result<(), Error> {
    let secs: f64 = env_or("LB_SECS", 2.0);
    let rounds: usize = env_or("LB_ROUNDS", 5);
    let callers: usize = env_or("LB_CALLERS", 16);
    let cells = std::env::var("LB_CELLS").unwrap_or_else(|_| "memory,redis".to_owned());
    let keys = keys();
    let mut admin = admin(url).await?;
    let mut limiters = Vec::new();
    for cell in cells.split(',') {
        for kind in [LimitKind::Loose, LimitKind::Tight] {
            let pair = [
                build(&format!("limitador-{cell}"), kind, url).await?,
                build(&format!("ours-{cell}"), kind, url).await?,
            ];
            // Warm up: every key present, connections open.
            for limiter in &pair {
                drive(limiter, kind.name(), &keys, callers, secs.min(1.0) / 2.0).await;
            }
            limiters.push((cell.to_owned(), kind, pair));
        }
    }
    for round in 0..rounds {
        for (cell, kind, pair) in &limiters {
            // Alternate who goes first.
            let order: [usize; 2] = if round % 2 == 0 { [0, 1] } else { [1, 0] };
            for &which in &order {
                let limiter = &pair[which];
                let () = redis::cmd("CONFIG")
                    .arg("RESETSTAT")
                    .query_async(&mut admin)
                    .await?;
                let (tally, took) = drive(limiter, kind.name(), &keys, callers, secs).await;
                let info: String = redis::cmd("INFO")
                    .arg("commandstats")
                    .query_async(&mut admin)
                    .await?;
                let (calls, usec, others) = script_stats(&info);
                if !others.is_empty() {
                    eprintln!(
                        "{cell} {} {}: other commands {others:?}",
                        kind.name(),
                        limiter.name()
                    );
                }
                println!(
                    "{cell} {} {} {round} {} {} {} {took:.4} {calls} {usec}",
                    kind.name(),
                    limiter.name(),
                    tally.decisions,
                    tally.allowed,
                    tally.errors,
                );
            }
        }
    }
    Ok(())
}

async fn count_mode(url: &str) -> Result<(), Error> {
    let imp = std::env::var("LB_IMPL").map_err(|_| "LB_IMPL: the implementation to count")?;
    let kind = match std::env::var("LB_LIMIT").as_deref() {
        Ok("tight") => LimitKind::Tight,
        _ => LimitKind::Loose,
    };
    let count: usize = env_or("LB_COUNT", 10_000);
    let keys = keys();
    // Warm up until every key is present, and under the tight limit until every key has
    // used its window, so that the counted decisions are all allowed (loose) or all
    // refused (tight).
    let exhaust = match kind {
        LimitKind::Loose => keys.len(),
        LimitKind::Tight => keys.len() * (kind.max() as usize + 1),
    };
    let warm: usize = env_or("LB_WARM", exhaust);
    let limiter = build(&imp, kind, url).await?;
    let mut allowed = 0u64;
    for i in 0..warm + count {
        allowed += u64::from(limiter.decide(kind.name(), &keys[i % keys.len()]).await?);
    }
    println!("{} {allowed}", warm + count);
    Ok(())
}

fn main() -> Result<(), Error> {
    let url = std::env::var("LB_URL").map_err(|_| "LB_URL: the Redis to use")?;
    let mode = std::env::var("LB_MODE").unwrap_or_else(|_| "rate".to_owned());
    if mode == "count" {
        // One caller on one thread: instructions per decision under callgrind.
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(count_mode(&url))
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?
            .block_on(rate_mode(&url))
    }
}
