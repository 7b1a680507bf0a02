//! Decisions per second on one `redis-server`, side by side in one run: the bare GCRA script
//! (`EVALSHA` of the Redis store's own limiter script from a plain `redis` client), the
//! `RedisStore`, and the `TieredStore` (leases), on one hot key and on 10 000 keys, with 1
//! and 64 concurrent callers; plus the share of decisions that needed a round trip.
//! Prints a markdown table.
//!
//! Starts its own `redis-server` on a free loopback port (killed on exit). Every
//! configuration gets a fresh connection with the same setup (a lazy `ConnectionManager`
//! with the Redis store's settings) and its own key prefix. The quota (1 000 000/s, burst
//! 10 000 000) never denies, so every row measures the allow path.
//!
//! Run: `scripts/redis_bench.sh` (`RK_SECS` sets each cell's length, default 2 s;
//! `RK_ROUNDS` the number of rounds, default 1, each cell's median is printed).

use std::future::Future;
use std::net::TcpListener;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use ratekeeper_axum::core::store::redis::RedisStore;
use ratekeeper_axum::core::store::tiered::TieredStore;
use ratekeeper_axum::core::store::{Charge, Checked, PolicyId, Store};
use ratekeeper_axum::{core::Key, core::Policy, core::Quota};
use redis::aio::ConnectionManager;

const KEYS: usize = 10_000;
const LIMIT: u32 = 1_000_000;
const BURST: u32 = 10_000_000;
/// The stores' decision deadline: long enough that a loaded machine never times out (a
/// timeout would be answered by the failure policy without Redis, and counted as fast).
const DEADLINE: Duration = Duration::from_secs(5);

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_redis() -> Result<(Server, u16), Box<dyn std::error::Error>> {
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("redis-server (apt-get install redis-server): {e}"))?;
    let server = Server(child);
    for _ in 0..500 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok((server, port));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Err("redis-server did not start".into())
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Bare,
    Store,
    Tiered,
}

impl Kind {
    const fn name(self) -> &'static str {
        match self {
            Self::Bare => "bare",
            Self::Store => "store",
            Self::Tiered => "tiered",
        }
    }
}

/// What the callers of one cell decide with.
#[derive(Clone)]
enum Subject {
    Bare {
        conn: ConnectionManager,
        script: Arc<redis::Script>,
        names: Arc<Vec<String>>,
        params: [u64; 3],
    },
    Store(Arc<RedisStore>, PolicyId),
    Tiered(Arc<TieredStore>, PolicyId),
}

fn quota() -> Quota {
    Quota::new(LIMIT, Duration::from_secs(1))
        .and_then(|q| q.with_burst(BURST))
        .unwrap_or_else(|_| Quota::per_second(NonZeroU32::MIN))
}

/// The connection manager with the Redis store's own settings (`RedisStoreBuilder::standalone`).
fn manager(url: &str) -> Result<ConnectionManager, redis::RedisError> {
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_millis(100)))
        .set_response_timeout(None)
        .set_number_of_retries(2)
        .set_min_delay(Duration::from_millis(10))
        .set_max_delay(Duration::from_millis(200));
    ConnectionManager::new_lazy_with_config(redis::Client::open(url)?, config)
}

/// The Redis store's own script.
fn limiter_script() -> redis::Script {
    redis::Script::new(RedisStore::script_texts()[0])
}

/// The limiter's op code of a check (`OP_CHECK` of the store's protocol).
const OP_CHECK: u32 = 1;

/// The bare script's key names (as the store names them) and GCRA parameters (T µs,
/// tau µs, burst), for the quota every subject uses.
fn bare_arguments(prefix: &str) -> (Vec<String>, [u64; 3]) {
    let q = quota();
    let t_us = q.emission_interval_nanos().div_ceil(1_000).max(1);
    let names = (0..KEYS)
        .map(|i| format!("{prefix}:v2:{{s:k{i}}}:bench"))
        .collect();
    (
        names,
        [t_us, t_us * u64::from(q.burst()), u64::from(q.burst())],
    )
}

async fn subject(
    url: &str,
    kind: Kind,
    prefix: &str,
) -> Result<Subject, Box<dyn std::error::Error>> {
    let policy = Policy::new("bench", quota());
    Ok(match kind {
        Kind::Bare => {
            let (names, params) = bare_arguments(prefix);
            Subject::Bare {
                conn: manager(url)?,
                script: Arc::new(limiter_script()),
                names: Arc::new(names),
                params,
            }
        }
        Kind::Store => {
            let mut store = RedisStore::builder()
                .prefix(prefix)
                .deadline(DEADLINE)
                .standalone(url)
                .await?;
            let id = store.register(&policy)?;
            Subject::Store(Arc::new(store), id)
        }
        Kind::Tiered => {
            let redis = RedisStore::builder()
                .prefix(prefix)
                .deadline(DEADLINE)
                .standalone(url)
                .await?;
            let mut store = TieredStore::builder()
                .max_lease(NonZeroU32::new(1_000).unwrap_or(NonZeroU32::MIN))
                .build(redis)?;
            let id = store.register(&policy)?;
            Subject::Tiered(Arc::new(store), id)
        }
    })
}

impl Subject {
    /// One decision on key index `i`; whether it was allowed.
    async fn decide(&self, i: usize, keys: &[Key]) -> bool {
        match self {
            Self::Bare {
                conn,
                script,
                names,
                params,
            } => {
                let mut invocation = script.prepare_invoke();
                invocation
                    .key(&names[i])
                    .arg("")
                    .arg("")
                    .arg(OP_CHECK)
                    .arg(0)
                    .arg(1)
                    .arg(params[0])
                    .arg(params[1])
                    .arg(params[2])
                    .arg(1)
                    .arg(-1);
                let reply: Result<Vec<i64>, _> = invocation.invoke_async(&mut conn.clone()).await;
                reply.is_ok_and(|r| r.get(2) == Some(&0))
            }
            Self::Store(store, id) => decided(store.check(&[Charge::new(*id, &keys[i], 1)])).await,
            Self::Tiered(store, id) => decided(store.check(&[Charge::new(*id, &keys[i], 1)])).await,
        }
    }

    /// Redis round trips on the decision path so far (bare: every decision).
    fn round_trips(&self, decisions: u64) -> u64 {
        match self {
            Self::Bare { .. } => decisions,
            Self::Store(store, _) => store.stats().redis_decisions,
            Self::Tiered(store, _) => store.stats().round_trips,
        }
    }
}

async fn decided<F>(checked: Checked<F>) -> bool
where
    F: std::future::Future<
            Output = Result<
                ratekeeper_axum::core::store::Decisions,
                ratekeeper_axum::core::store::StoreError,
            >,
        >,
{
    match checked {
        Checked::Ready(r) => r,
        Checked::Pending(f) => f.await,
    }
    .is_ok_and(|d| d.is_allowed())
}

struct Cell {
    per_sec: f64,
    round_trip_share: f64,
    denied: u64,
}

async fn run_cell(
    subject: Subject,
    keys: Arc<Vec<Key>>,
    hot: bool,
    callers: usize,
    secs: Duration,
) -> Cell {
    // Warm-up (connection, script load, the tiered store's rate estimate), not counted.
    let warm = Instant::now() + Duration::from_millis(300);
    let count = Arc::new(AtomicU64::new(0));
    let denied = Arc::new(AtomicU64::new(0));
    let mut start_trips = 0;
    for phase in 0..2 {
        let end = if phase == 0 {
            warm
        } else {
            Instant::now() + secs
        };
        let started = Instant::now();
        let mut tasks = Vec::new();
        for c in 0..callers {
            let subject = subject.clone();
            let keys = Arc::clone(&keys);
            let count = Arc::clone(&count);
            let denied = Arc::clone(&denied);
            tasks.push(tokio::spawn(async move {
                let mut n = c.wrapping_mul(7_919);
                let mut local = 0;
                let mut no = 0;
                while Instant::now() < end {
                    let i = if hot { 0 } else { n % KEYS };
                    n = n.wrapping_add(1);
                    no += u64::from(!subject.decide(i, &keys).await);
                    local += 1;
                    // Yield now and then so a caller answered locally shares the runtime.
                    if local % 64 == 0 {
                        tokio::task::yield_now().await;
                    }
                }
                count.fetch_add(local, Ordering::Relaxed);
                denied.fetch_add(no, Ordering::Relaxed);
            }));
        }
        for t in tasks {
            let _ = t.await;
        }
        if phase == 0 {
            start_trips = subject.round_trips(count.load(Ordering::Relaxed));
            let warm_count = count.swap(0, Ordering::Relaxed);
            denied.store(0, Ordering::Relaxed);
            if let Subject::Bare { .. } = subject {
                start_trips = warm_count;
            }
            continue;
        }
        let elapsed = started.elapsed().as_secs_f64();
        let decisions = count.load(Ordering::Relaxed);
        let trips = match subject {
            Subject::Bare { .. } => decisions,
            _ => subject.round_trips(decisions).saturating_sub(start_trips),
        };
        return Cell {
            per_sec: decisions as f64 / elapsed,
            round_trip_share: trips as f64 / decisions.max(1) as f64,
            denied: denied.load(Ordering::Relaxed),
        };
    }
    Cell {
        per_sec: 0.0,
        round_trip_share: 0.0,
        denied: 0,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn fmt_rate(r: f64) -> String {
    let r = r.round() as u64;
    let s = r.to_string();
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(' ');
        }
        out.push(ch);
    }
    out
}

/// Polls a future through [`counted_poll`], the function `scripts/callgrind_redis.sh`
/// counts (`--toggle-collect`): the caller's own work, nothing of the tasks it wakes.
struct Counted<F>(Pin<Box<F>>);

impl<F: Future> Future for Counted<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        counted_poll(self.0.as_mut(), cx)
    }
}

/// One poll of the measured caller (the symbol the callgrind script toggles on). The poll is
/// a real call that returns here (`black_box` keeps it from becoming a tail jump, which
/// callgrind would not see as this function running).
#[inline(never)]
fn counted_poll<F: Future>(future: Pin<&mut F>, cx: &mut Context<'_>) -> Poll<F::Output> {
    std::hint::black_box(future.poll(cx))
}

/// Runs the measured loop on the current-thread runtime: everything the runtime thread does
/// meanwhile (the caller, the connection's driver task, the I/O and timer drivers) runs
/// inside this function (the callgrind script's `thread` scope).
#[inline(never)]
fn runtime_block<F: Future>(runtime: &tokio::runtime::Runtime, future: F) -> F::Output {
    std::hint::black_box(runtime.block_on(future))
}

/// What one fixed-count run decides with: one caller, its own connection or store.
enum Caller {
    /// `EVALSHA` of the limiter script (`redis::Script`) on a multiplexed connection made like the
    /// Redis store's own (connection timeout, no response timeout), owned by the caller.
    Bare {
        conn: redis::aio::MultiplexedConnection,
        script: redis::Script,
        names: Vec<String>,
        params: [u64; 3],
    },
    /// The same command written by hand: one `redis::Cmd` (no argument list of its own),
    /// sent with `send_packed_command`, the reply read as a `redis::Value` (the script is
    /// loaded first). The leanest client call, for information.
    BareCmd {
        conn: redis::aio::MultiplexedConnection,
        hash: String,
        names: Vec<String>,
        params: [u64; 3],
    },
    /// The same on a `ConnectionManager`, cloned per call (the bare side of the throughput
    /// table).
    BareManager(Subject),
    Store(Arc<RedisStore>, PolicyId),
    Tiered(Arc<TieredStore>, PolicyId),
}

impl Caller {
    async fn new(url: &str, kind: &str) -> Result<Self, Box<dyn std::error::Error>> {
        let prefix = format!("c-{kind}");
        Ok(match kind {
            "bare" => {
                let (names, params) = bare_arguments(&prefix);
                // The store's settings, but time to connect under valgrind on a busy machine
                // (connecting is not measured).
                let config = redis::AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(Duration::from_secs(5)))
                    .set_response_timeout(None);
                let conn = redis::Client::open(url)?
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?;
                Self::Bare {
                    conn,
                    script: limiter_script(),
                    names,
                    params,
                }
            }
            "bare-cmd" => {
                let (names, params) = bare_arguments(&prefix);
                let mut conn = redis::Client::open(url)?
                    .get_multiplexed_async_connection()
                    .await?;
                let hash = limiter_script().load_async(&mut conn).await?;
                Self::BareCmd {
                    conn,
                    hash,
                    names,
                    params,
                }
            }
            "bare-manager" => Self::BareManager(subject(url, Kind::Bare, &prefix).await?),
            "store" => match subject(url, Kind::Store, &prefix).await? {
                Subject::Store(store, id) => Self::Store(store, id),
                _ => return Err("not a store subject".into()),
            },
            "tiered" => match subject(url, Kind::Tiered, &prefix).await? {
                Subject::Tiered(store, id) => Self::Tiered(store, id),
                _ => return Err("not a tiered subject".into()),
            },
            other => return Err(format!("RK_KIND: unknown kind {other:?}").into()),
        })
    }

    /// One decision on key index `i`; whether it was allowed.
    async fn decide(&mut self, i: usize, keys: &[Key]) -> bool {
        match self {
            Self::Bare {
                conn,
                script,
                names,
                params,
            } => {
                let mut invocation = script.prepare_invoke();
                invocation
                    .key(&names[i])
                    .arg("")
                    .arg("")
                    .arg(OP_CHECK)
                    .arg(0)
                    .arg(1)
                    .arg(params[0])
                    .arg(params[1])
                    .arg(params[2])
                    .arg(1)
                    .arg(-1);
                let reply: Result<Vec<i64>, _> = invocation.invoke_async(conn).await;
                reply.is_ok_and(|r| r.get(2) == Some(&0))
            }
            Self::BareCmd {
                conn,
                hash,
                names,
                params,
            } => {
                let mut cmd = redis::Cmd::with_capacity(14, 200);
                cmd.arg("EVALSHA")
                    .arg(hash.as_str())
                    .arg(1)
                    .arg(&names[i])
                    .arg("")
                    .arg("")
                    .arg(OP_CHECK)
                    .arg(0)
                    .arg(1)
                    .arg(params[0])
                    .arg(params[1])
                    .arg(params[2])
                    .arg(1)
                    .arg(-1);
                let reply = conn.send_packed_command(&cmd).await;
                matches!(reply, Ok(redis::Value::Array(v)) if v.get(2) == Some(&redis::Value::Int(0)))
            }
            Self::BareManager(subject) => subject.decide(i, keys).await,
            Self::Store(store, id) => decided(store.check(&[Charge::new(*id, &keys[i], 1)])).await,
            Self::Tiered(store, id) => decided(store.check(&[Charge::new(*id, &keys[i], 1)])).await,
        }
    }

    /// `n` decisions one after the other (key 0, or keys in turn); how many were allowed.
    async fn run(&mut self, keys: &[Key], hot: bool, n: u64) -> u64 {
        let mut allowed = 0;
        for j in 0..n {
            let i = if hot { 0 } else { (j % KEYS as u64) as usize };
            allowed += u64::from(self.decide(i, keys).await);
        }
        allowed
    }
}

/// The fixed-count mode (`RK_COUNT` decisions of `RK_KIND`, see `scripts/callgrind_redis.sh`):
/// one caller on a current-thread runtime, `RK_WARM` decisions first (not counted), then the
/// measured ones through [`runtime_block`] and [`Counted`]. Prints `<allowed> of <n> allowed`
/// and the store's degraded decisions (a timeout answered by the failure policy would be a
/// different path).
fn fixed_count(n: u64) -> Result<(), Box<dyn std::error::Error>> {
    let kind = std::env::var("RK_KIND").unwrap_or_else(|_| "store".to_owned());
    let hot = std::env::var("RK_ROWS").map_or(true, |r| r != "many");
    let warm: u64 = std::env::var("RK_WARM")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    let (_server, port) = start_redis()?;
    let url = format!("redis://127.0.0.1:{port}/");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let keys: Vec<Key> = (0..KEYS).map(|i| Key::from(format!("k{i}"))).collect();
    let mut caller = runtime.block_on(Caller::new(&url, &kind))?;
    let warmed = runtime.block_on(caller.run(&keys, hot, warm));
    let allowed = runtime_block(&runtime, Counted(Box::pin(caller.run(&keys, hot, n))));
    let degraded = match &caller {
        Caller::Store(store, _) => store.stats().degraded,
        Caller::Tiered(store, _) => {
            let _ = runtime.block_on(store.shutdown());
            0
        }
        _ => 0,
    };
    println!("{allowed} of {n} allowed");
    println!("{degraded} degraded");
    if warmed != warm {
        println!("warm-up: {warmed} of {warm} allowed");
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if let Some(n) = std::env::var("RK_COUNT").ok().and_then(|s| s.parse().ok()) {
        return fixed_count(n);
    }
    let secs = Duration::from_secs_f64(
        std::env::var("RK_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(2.0),
    );
    let rounds: usize = std::env::var("RK_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
        .max(1);
    let (_server, port) = start_redis()?;
    let url = format!("redis://127.0.0.1:{port}/");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let keys: Arc<Vec<Key>> = Arc::new((0..KEYS).map(|i| Key::from(format!("k{i}"))).collect());
    println!(
        "one redis-server (127.0.0.1:{port}), {} s per cell, {rounds} round(s), tokio 2 workers\n",
        secs.as_secs_f64()
    );
    println!(
        "| workload | callers | bare script (/s) | Redis store (/s) | store / bare | tiered (/s) | tiered / store | round trips: bare / store / tiered |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    // RK_ROWS (for profiling): a comma-separated subset of hot-1, hot-64, many-1, many-64.
    let rows = std::env::var("RK_ROWS").unwrap_or_default();
    // RK_KINDS (for profiling): a comma-separated subset of bare, store, tiered.
    let kinds = std::env::var("RK_KINDS").unwrap_or_default();
    let mut cell_no = 0;
    for hot in [true, false] {
        for callers in [1, 64] {
            let row = format!("{}-{callers}", if hot { "hot" } else { "many" });
            if !rows.is_empty() && !rows.split(',').any(|r| r == row) {
                continue;
            }
            let mut rates = [Vec::new(), Vec::new(), Vec::new()];
            let mut shares = [0.0; 3];
            let mut denied = [0; 3];
            for _ in 0..rounds {
                // Interleaved: each round runs the three kinds one after the other.
                for (k, kind) in [Kind::Bare, Kind::Store, Kind::Tiered]
                    .into_iter()
                    .enumerate()
                {
                    if !kinds.is_empty() && !kinds.split(',').any(|n| n == kind.name()) {
                        continue;
                    }
                    cell_no += 1;
                    let prefix = format!("b{cell_no}");
                    let cell = runtime.block_on(async {
                        let subject = subject(&url, kind, &prefix).await?;
                        let cell =
                            run_cell(subject.clone(), Arc::clone(&keys), hot, callers, secs).await;
                        if let Subject::Tiered(store, _) = &subject {
                            let _ = store.shutdown().await;
                        }
                        Ok::<_, Box<dyn std::error::Error>>(cell)
                    })?;
                    rates[k].push(cell.per_sec);
                    shares[k] = cell.round_trip_share;
                    denied[k] += cell.denied;
                }
            }
            let [bare, store, tiered] = rates.map(median);
            println!(
                "| {} | {callers} | {} | {} | {:.2}x | {} | {:.1}x | {:.0} % / {:.0} % / {:.2} % |",
                if hot { "1 hot key" } else { "10 000 keys" },
                fmt_rate(bare),
                fmt_rate(store),
                store / bare.max(1.0),
                fmt_rate(tiered),
                tiered / store.max(1.0),
                shares[0] * 100.0,
                shares[1] * 100.0,
                shares[2] * 100.0,
            );
            if denied.iter().any(|d| *d > 0) {
                println!(
                    "(note: decisions denied or failed in this row, bare / store / tiered: {denied:?})"
                );
            }
        }
    }
    Ok(())
}
