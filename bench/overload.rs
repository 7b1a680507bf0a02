//! The overload harness `scripts/overload.sh` runs: an axum service whose capacity is fixed
//! by a bounded worker pool with a fixed service time, loaded on loopback at 1×, 2× and 4×
//! its capacity, with the capacity halved in the middle of every run, behind each limiter
//! in turn.
//!
//! # The service
//!
//! `GET /work` puts a job on a FIFO queue served by `WORKERS` worker tasks; a worker spends
//! `SERVICE_MS` per job, timed from the end of its previous job when it works back to back
//! (so a late timer wake-up delays one response, not the worker's next job), so the capacity
//! is exactly `WORKERS / SERVICE_MS` requests per second whatever the CPU does (the work is
//! a timer, not computation). Halving retires half
//! the workers, each after its current job. A job whose client has gone (timed out) is
//! skipped, as a server that notices the disconnect would: this favours the unprotected
//! baseline, whose queue would otherwise hold every abandoned request.
//!
//! # The load
//!
//! Open loop: requests are sent at a constant rate (a late tick sends at once, so the
//! offered load holds even when the generator is descheduled), each on its own task with
//! keep-alive connections (one per request in flight), a client timeout of
//! `TIMEOUT_MS`. Every other request carries `x-priority: critical`, the rest
//! `x-priority: sheddable`.
//!
//! # The limiters (`MODES`)
//!
//! | mode | limiter |
//! |---|---|
//! | `none` | no limiter |
//! | `tower` | tower's `ConcurrencyLimit` + `LoadShed` (503 when no permit), the limit hand-tuned to the initial worker count |
//! | `tower_acc` | tower-acc 0.1's `Gradient2` (defaults) + `LoadShed` |
//! | `adaptive` | ratekeeper's adaptive `ConcurrencyLimitLayer` with its defaults |
//! | `adaptive_p` | the same with partitions `critical` 0.9 / `sheddable` 0.1 by the `x-priority` header |
//!
//! # Measured, per run and phase (before / after the halving)
//!
//! - goodput: responses `200` within the latency objective `SLO_MS`, per second, and as a
//!   share of the phase's capacity;
//! - p99 latency of admitted requests (every `200`);
//! - shed (`503`) and timed-out shares;
//! - critical goodput as a share of what the critical partition is owed: 0.9 × capacity,
//!   or all critical requests when fewer are offered;
//! - recovery: after the halving, the time until the p99 of admitted requests in 250 ms
//!   windows stays within 2× the unloaded p99;
//! - for `adaptive` and `adaptive_p`, settle: the time until the limit (sampled every 50 ms,
//!   median of each 0.5 s) stays within ±25 % of its median over the last 2 s of the run.
//!
//! The unloaded p99 comes from a calibration run first: no limiter, a quarter of the
//! capacity, `CALIBRATE_S` seconds.
//!
//! Settings (environment): `MODES` (comma-separated), `LOADS` (e.g. `1,2,4`), `WARMUP_S`,
//! `PHASE_S` (each phase), `CALIBRATE_S`; `SMOOTHING` and `BUFFER` replace the controller's
//! defaults (to compare settings). Prints a Markdown table.
//!
//! ```text
//! cargo run --release -p ratekeeper-bench --bin overload
//! ```

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::error_handling::HandleErrorLayer;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use ratekeeper_axum::adaptive::Adaptive;
use ratekeeper_axum::adaptive::controller::ControllerSettings;
use ratekeeper_axum::concurrency::ConcurrencyLimitLayer;
use ratekeeper_axum::{RequestParts, core::Key};
use tokio::sync::{mpsc, oneshot};
use tower::{BoxError, ServiceBuilder};

/// Workers in the pool before the halving.
const WORKERS: usize = 16;
/// Time a worker spends on a job (ms).
const SERVICE_MS: u64 = 40;
/// The latency objective (ms): a `200` slower than this is not goodput.
const SLO_MS: f64 = 200.0;
/// The client gives up after this long (ms).
const TIMEOUT_MS: u64 = 2000;

/// Requests per second the pool serves with `workers` workers.
fn capacity(workers: usize) -> f64 {
    workers as f64 * 1000.0 / SERVICE_MS as f64
}

/// A FIFO queue served by a pool of workers.
#[derive(Clone)]
struct Pool {
    jobs: mpsc::UnboundedSender<(tokio::time::Instant, oneshot::Sender<()>)>,
    active: Arc<AtomicUsize>,
}

impl Pool {
    fn start(workers: usize) -> Self {
        let (jobs, rx) = mpsc::unbounded_channel::<(tokio::time::Instant, oneshot::Sender<()>)>();
        let rx = Arc::new(tokio::sync::Mutex::new(rx));
        let active = Arc::new(AtomicUsize::new(workers));
        for id in 0..workers {
            let rx = Arc::clone(&rx);
            let active = Arc::clone(&active);
            tokio::spawn(async move {
                let service = Duration::from_millis(SERVICE_MS);
                // When this worker is free again. Back-to-back jobs are timed from the
                // previous job's deadline, not from a (possibly late) wake-up, so a busy
                // worker finishes exactly one job per service time.
                let mut free_at = tokio::time::Instant::now();
                loop {
                    let job = rx.lock().await.recv().await;
                    let Some((queued_at, job)) = job else { return };
                    if !job.is_closed() {
                        // Starts when both the job and the worker were ready.
                        free_at = free_at.max(queued_at) + service;
                        tokio::time::sleep_until(free_at).await;
                        let _ = job.send(());
                    }
                    if id >= active.load(Ordering::Relaxed) {
                        return;
                    }
                }
            });
        }
        Self { jobs, active }
    }

    /// Retires workers down to `workers`, each after its current job.
    fn resize(&self, workers: usize) {
        self.active.store(workers, Ordering::Relaxed);
    }
}

async fn work(State(pool): State<Pool>) -> StatusCode {
    let (tx, rx) = oneshot::channel();
    if pool.jobs.send((tokio::time::Instant::now(), tx)).is_err() {
        return StatusCode::INTERNAL_SERVER_ERROR;
    }
    match rx.await {
        Ok(()) => StatusCode::OK,
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

fn priority(req: &RequestParts<'_>) -> &'static str {
    match req.headers().get("x-priority") {
        Some(v) if v == "critical" => "critical",
        _ => "sheddable",
    }
}

async fn overloaded(_err: BoxError) -> StatusCode {
    StatusCode::SERVICE_UNAVAILABLE
}

/// The app of `mode`, and the adaptive layer (to read its limit) when there is one.
fn app(mode: &str, pool: Pool) -> Option<(Router, Option<AdaptiveLayer>)> {
    let router = Router::new().route("/work", get(work)).with_state(pool);
    Some(match mode {
        "none" => (router, None),
        "tower" => (
            router.layer(
                ServiceBuilder::new()
                    .layer(HandleErrorLayer::new(overloaded))
                    .load_shed()
                    .concurrency_limit(WORKERS),
            ),
            None,
        ),
        "tower_acc" => (
            router.layer(
                ServiceBuilder::new()
                    .layer(HandleErrorLayer::new(overloaded))
                    .load_shed()
                    .layer(tower_acc::ConcurrencyLimitLayer::new(
                        tower_acc::Gradient2::default(),
                    )),
            ),
            None,
        ),
        "adaptive" => {
            let layer = ConcurrencyLimitLayer::adaptive()
                .controller(controller_settings())
                .build()
                .ok()?;
            (
                router.layer(layer.clone()),
                Some(AdaptiveLayer::Plain(layer)),
            )
        }
        "adaptive_p" => {
            let layer = ConcurrencyLimitLayer::adaptive()
                .controller(controller_settings())
                .partition("critical", 0.9)
                .partition("sheddable", 0.1)
                .classify(priority as Classifier)
                .build()
                .ok()?;
            (
                router.layer(layer.clone()),
                Some(AdaptiveLayer::Partitioned(Box::new(layer))),
            )
        }
        _ => return None,
    })
}

/// The controller's defaults, or the `SMOOTHING` and `BUFFER` (min RTT buffer) of the
/// environment, to compare settings.
fn controller_settings() -> ControllerSettings {
    let d = ControllerSettings::default();
    ControllerSettings {
        smoothing: env_f64("SMOOTHING", d.smoothing),
        min_rtt_buffer: env_f64("BUFFER", d.min_rtt_buffer),
        ..d
    }
}

type Classifier = fn(&RequestParts<'_>) -> &'static str;

enum AdaptiveLayer {
    Plain(ConcurrencyLimitLayer<ratekeeper_axum::key::GlobalKey, Adaptive>),
    Partitioned(Box<ConcurrencyLimitLayer<ratekeeper_axum::key::GlobalKey, Adaptive<Classifier>>>),
}

impl AdaptiveLayer {
    fn snapshot(&self) -> Option<ratekeeper_axum::adaptive::Snapshot> {
        match self {
            Self::Plain(l) => l.snapshot(&Key::Global),
            Self::Partitioned(l) => l.snapshot(&Key::Global),
        }
    }
}

/// One request's outcome.
#[derive(Clone, Copy)]
struct Rec {
    /// Sent at (s since the run started).
    sent: f64,
    /// Latency (s).
    latency: f64,
    /// HTTP status, 0 for a timeout or a connection error.
    status: u16,
    critical: bool,
}

async fn serve(app: Router) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(addr)
}

/// Sends `rate` requests per second to `addr` for `duration`, calling `at` with the time
/// since the start before each send (to halve the pool on time). Returns every outcome.
async fn load(
    addr: SocketAddr,
    rate: f64,
    duration: Duration,
    mut at: impl FnMut(f64),
) -> Vec<Rec> {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(usize::MAX)
        .build(connector);
    let records = Arc::new(Mutex::new(Vec::new()));
    let start = tokio::time::Instant::now();
    let total = (rate * duration.as_secs_f64()) as u64;
    let uri: http::Uri = match format!("http://{addr}/work").parse() {
        Ok(u) => u,
        Err(_) => return Vec::new(),
    };
    let mut tasks = Vec::with_capacity(total as usize);
    for k in 0..total {
        let due = start + Duration::from_secs_f64(k as f64 / rate);
        tokio::time::sleep_until(due).await;
        let sent = start.elapsed().as_secs_f64();
        at(sent);
        let critical = k % 2 == 0;
        let req = http::Request::get(uri.clone())
            .header(
                "x-priority",
                if critical { "critical" } else { "sheddable" },
            )
            .body(Empty::new());
        let Ok(req) = req else { continue };
        let client = client.clone();
        let records = Arc::clone(&records);
        tasks.push(tokio::spawn(async move {
            let t0 = Instant::now();
            let outcome = tokio::time::timeout(Duration::from_millis(TIMEOUT_MS), async {
                let res = client.request(req).await.ok()?;
                let status = res.status().as_u16();
                res.into_body().collect().await.ok()?;
                Some(status)
            })
            .await;
            let status = outcome.ok().flatten().unwrap_or(0);
            let rec = Rec {
                sent,
                latency: t0.elapsed().as_secs_f64(),
                status,
                critical,
            };
            if let Ok(mut r) = records.lock() {
                r.push(rec);
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    // Every task has ended: this is the last reference.
    Arc::try_unwrap(records)
        .ok()
        .and_then(|m| m.into_inner().ok())
        .unwrap_or_default()
}

fn percentile(values: &mut [f64], p: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let rank = ((p * values.len() as f64).ceil() as usize).clamp(1, values.len());
    Some(values[rank - 1])
}

struct PhaseStats {
    offered: f64,
    goodput: f64,
    goodput_share: f64,
    p99_ms: Option<f64>,
    shed: f64,
    timeouts: f64,
    critical_share: f64,
}

fn phase_stats(recs: &[Rec], from: f64, to: f64, cap: f64) -> PhaseStats {
    let dur = to - from;
    let phase: Vec<&Rec> = recs
        .iter()
        .filter(|r| r.sent >= from && r.sent < to)
        .collect();
    let n = phase.len().max(1) as f64;
    let good = |r: &&&Rec| r.status == 200 && r.latency * 1000.0 <= SLO_MS;
    let goodput = phase.iter().filter(good).count() as f64 / dur;
    let mut admitted: Vec<f64> = phase
        .iter()
        .filter(|r| r.status == 200)
        .map(|r| r.latency * 1000.0)
        .collect();
    let critical_offered = phase.iter().filter(|r| r.critical).count() as f64 / dur;
    let critical_good = phase.iter().filter(|r| r.critical).filter(good).count() as f64 / dur;
    let owed = (0.9 * cap).min(critical_offered);
    PhaseStats {
        offered: phase.len() as f64 / dur,
        goodput,
        goodput_share: goodput / cap,
        p99_ms: percentile(&mut admitted, 0.99),
        shed: phase.iter().filter(|r| r.status == 503).count() as f64 / n,
        timeouts: phase.iter().filter(|r| r.status == 0).count() as f64 / n,
        critical_share: if owed > 0.0 {
            critical_good / owed
        } else {
            0.0
        },
    }
}

/// Seconds after `from` until the p99 of admitted requests in 250 ms windows stays within
/// `bound_ms` up to `to`; `None` if the last window is above it.
fn recovery(recs: &[Rec], from: f64, to: f64, bound_ms: f64) -> Option<f64> {
    let width = 0.25;
    let windows = ((to - from) / width).floor() as usize;
    let mut last_bad: Option<usize> = None;
    for w in 0..windows {
        let lo = from + w as f64 * width;
        let mut lat: Vec<f64> = recs
            .iter()
            .filter(|r| r.sent >= lo && r.sent < lo + width && r.status == 200)
            .map(|r| r.latency * 1000.0)
            .collect();
        if percentile(&mut lat, 0.99).is_none_or(|p| p > bound_ms) {
            last_bad = Some(w);
        }
    }
    match last_bad {
        None => Some(0.0),
        Some(w) if w + 1 >= windows => None,
        Some(w) => Some((w + 1) as f64 * width),
    }
}

/// Seconds after `from` until the limit settles: until a sample is within ±25 % of the
/// median over the last 2 s and the median of the samples in each 0.5 s window stays within
/// it (the windows smooth the controller's own up-and-down around its operating point,
/// about ±15 %). Returns the time and that final median.
fn settle(samples: &[(f64, u32)], from: f64, end: f64) -> Option<(f64, f64)> {
    let mut tail: Vec<f64> = samples
        .iter()
        .filter(|(t, _)| *t >= end - 2.0)
        .map(|&(_, l)| f64::from(l))
        .collect();
    let fin = percentile(&mut tail, 0.5)?;
    let width = 0.5;
    let windows = ((end - from) / width).floor() as usize;
    let mut last_out = None;
    for w in 0..windows {
        let lo = from + w as f64 * width;
        let mut window: Vec<f64> = samples
            .iter()
            .filter(|(t, _)| *t >= lo && *t < lo + width)
            .map(|&(_, l)| f64::from(l))
            .collect();
        if percentile(&mut window, 0.5).is_some_and(|m| (m - fin).abs() > 0.25 * fin) {
            last_out = Some(w);
        }
    }
    // Not before the first sample inside the band.
    let entered = samples
        .iter()
        .find(|&&(t, l)| t >= from && (f64::from(l) - fin).abs() <= 0.25 * fin)
        .map_or(end - from, |&(t, _)| t - from);
    let t = last_out.map_or(0.0, |w| (w + 1) as f64 * width);
    Some((t.max(entered), fin))
}

/// One line of the table.
struct Row {
    load: f64,
    phase: &'static str,
    mode: String,
    stats: PhaseStats,
    settle: Option<f64>,
}

/// Prints each target of the adaptive layer, met or not, from the rows. Steady state is the
/// "before" phase and the second half of the "after" phase; the first half of "after" is
/// the transition.
fn targets(rows: &[Row], bound: f64) {
    let ours = ["adaptive", "adaptive_p"];
    let baselines = ["none", "tower", "tower_acc"];
    let steady = |r: &&Row| r.phase == "before" || r.phase == "after, 2nd half";
    let mark = |ok: bool| if ok { "met" } else { "NOT met" };
    println!("Targets (adaptive and adaptive_p; steady phases: before, after 2nd half):");
    for r in rows
        .iter()
        .filter(|r| ours.contains(&r.mode.as_str()))
        .filter(steady)
    {
        if r.load == 4.0 {
            let g = r.stats.goodput_share;
            println!(
                "- goodput >= 90 % of capacity at 4x, {} {}: {:.0} % {}",
                r.mode,
                r.phase,
                g * 100.0,
                mark(g >= 0.9)
            );
        }
        if r.load >= 2.0 {
            let p = r.stats.p99_ms.unwrap_or(f64::INFINITY);
            println!(
                "- p99 admitted <= 2x unloaded p99 ({bound:.1} ms) at {}x, {} {}: {p:.1} ms {}",
                r.load,
                r.mode,
                r.phase,
                mark(p <= bound)
            );
        }
        if r.load == 4.0 && r.mode == "adaptive_p" {
            let c = r.stats.critical_share;
            println!(
                "- critical goodput >= 95 % of its share at 4x, {}: {:.0} % {}",
                r.phase,
                c * 100.0,
                mark(c >= 0.95)
            );
        }
    }
    for r in rows
        .iter()
        .filter(|r| ours.contains(&r.mode.as_str()) && r.phase == "after")
    {
        let t = r.settle.unwrap_or(f64::INFINITY);
        println!(
            "- limit settles within 5 s after the halving, {} at {}x: {t:.2} s {}",
            r.mode,
            r.load,
            mark(t <= 5.0)
        );
    }
    for r in rows
        .iter()
        .filter(|r| ours.contains(&r.mode.as_str()) && r.load >= 2.0)
    {
        let mut lost = Vec::new();
        for b in rows.iter().filter(|b| {
            baselines.contains(&b.mode.as_str()) && b.load == r.load && b.phase == r.phase
        }) {
            let p = r.stats.p99_ms.unwrap_or(f64::INFINITY);
            let bp = b.stats.p99_ms.unwrap_or(f64::INFINITY);
            // Goodput within 1 % counts as a tie (run-to-run noise is larger).
            let goodput_ok = r.stats.goodput >= b.stats.goodput * 0.99;
            let p99_ok = p <= bp;
            if !(goodput_ok && p99_ok) {
                lost.push(format!(
                    "{} (goodput {:.0} vs {:.0}, p99 {p:.1} vs {bp:.1} ms)",
                    b.mode, r.stats.goodput, b.stats.goodput
                ));
            }
        }
        println!(
            "- better than every baseline on goodput and p99, {} at {}x {}: {}{}",
            r.mode,
            r.load,
            r.phase,
            mark(lost.is_empty()),
            if lost.is_empty() {
                String::new()
            } else {
                format!("; not better than {}", lost.join(", "))
            }
        );
    }
}

fn env_f64(name: &str, default: f64) -> f64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> std::process::ExitCode {
    let modes: Vec<String> = std::env::var("MODES")
        .unwrap_or_else(|_| "none,tower,tower_acc,adaptive,adaptive_p".into())
        .split(',')
        .map(str::to_owned)
        .collect();
    let loads: Vec<f64> = std::env::var("LOADS")
        .unwrap_or_else(|_| "1,2,4".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let warmup = env_f64("WARMUP_S", 3.0);
    let phase = env_f64("PHASE_S", 8.0);
    let calibrate = env_f64("CALIBRATE_S", 5.0);
    // TRACE=1: the adaptive limit, in flight per partition and latencies every 50 ms, on stderr.
    let trace = std::env::var_os("TRACE").is_some();
    for m in &modes {
        if app(m, Pool::start(1)).is_none() {
            eprintln!("unknown mode {m:?}: none, tower, tower_acc, adaptive, adaptive_p");
            return std::process::ExitCode::from(2);
        }
    }
    let load_start = loadavg();
    let wall = Instant::now();

    // Unloaded p99: no limiter, a quarter of the capacity.
    let unloaded_p99 = {
        let pool = Pool::start(WORKERS);
        let Some((router, _)) = app("none", pool) else {
            return std::process::ExitCode::FAILURE;
        };
        let Ok(addr) = serve(router).await else {
            eprintln!("cannot bind 127.0.0.1");
            return std::process::ExitCode::FAILURE;
        };
        let recs = load(
            addr,
            capacity(WORKERS) / 4.0,
            Duration::from_secs_f64(calibrate),
            |_| {},
        )
        .await;
        let mut lat: Vec<f64> = recs
            .iter()
            .filter(|r| r.status == 200 && r.sent >= 0.5)
            .map(|r| r.latency * 1000.0)
            .collect();
        percentile(&mut lat, 0.99).unwrap_or(f64::NAN)
    };
    let bound = 2.0 * unloaded_p99;

    println!(
        "workers {WORKERS} -> {} at the halving, service time {SERVICE_MS} ms: capacity {:.0} -> {:.0} req/s; \
         latency objective {SLO_MS} ms; client timeout {TIMEOUT_MS} ms; warmup {warmup} s, phases {phase} s each",
        WORKERS / 2,
        capacity(WORKERS),
        capacity(WORKERS / 2)
    );
    println!("unloaded p99: {unloaded_p99:.1} ms (p99 target: <= {bound:.1} ms)");
    println!();
    println!(
        "| load | phase | limiter | offered req/s | goodput req/s | goodput / capacity | p99 admitted ms | shed | timed out | critical goodput / owed | recovery s | limit settle s (final) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");

    let mut rows: Vec<Row> = Vec::new();
    for &x in &loads {
        for mode in &modes {
            let pool = Pool::start(WORKERS);
            let Some((router, layer)) = app(mode, pool.clone()) else {
                continue;
            };
            let Ok(addr) = serve(router).await else {
                eprintln!("cannot bind 127.0.0.1");
                return std::process::ExitCode::FAILURE;
            };
            let halve_at = warmup + phase;
            let end = warmup + 2.0 * phase;
            // Samples the adaptive limit every 50 ms.
            let samples = Arc::new(Mutex::new(Vec::new()));
            let sampler = layer.map(|layer| {
                let samples = Arc::clone(&samples);
                tokio::spawn(async move {
                    let start = Instant::now();
                    let mut tick = tokio::time::interval(Duration::from_millis(50));
                    loop {
                        tick.tick().await;
                        let Some(snap) = layer.snapshot() else {
                            continue;
                        };
                        let t = start.elapsed().as_secs_f64();
                        if trace {
                            eprintln!(
                                "{t:.2} s: limit {} in flight {:?} latency {:?} min {:?}{}",
                                snap.limit,
                                snap.in_flight_by_partition,
                                snap.latency,
                                snap.min_latency,
                                if snap.measuring { " (measuring)" } else { "" }
                            );
                        }
                        if let Ok(mut s) = samples.lock() {
                            s.push((t, snap.limit));
                        }
                    }
                })
            });
            let mut halved = false;
            let recs = load(
                addr,
                x * capacity(WORKERS),
                Duration::from_secs_f64(end),
                |t| {
                    if !halved && t >= halve_at {
                        pool.resize(WORKERS / 2);
                        halved = true;
                    }
                },
            )
            .await;
            if let Some(s) = sampler {
                s.abort();
            }
            let samples: Vec<(f64, u32)> = samples.lock().map(|s| s.clone()).unwrap_or_default();
            let rec = recovery(&recs, halve_at, end, bound);
            let settled = settle(&samples, halve_at, end);
            for (name, from, to, cap) in [
                ("before", warmup, halve_at, capacity(WORKERS)),
                ("after", halve_at, end, capacity(WORKERS / 2)),
                (
                    "after, 2nd half",
                    halve_at + phase / 2.0,
                    end,
                    capacity(WORKERS / 2),
                ),
            ] {
                let s = phase_stats(&recs, from, to, cap);
                let (rec_s, settle_s) = match name {
                    "after" => (
                        rec.map_or("never".into(), |r| format!("{r:.2}")),
                        settled.map_or("n/a".into(), |(t, f)| format!("{t:.2} ({f:.0})")),
                    ),
                    "before" => {
                        let mut fin = samples
                            .iter()
                            .filter(|(t, _)| *t >= halve_at - 2.0 && *t < halve_at)
                            .map(|&(_, l)| f64::from(l))
                            .collect::<Vec<_>>();
                        (
                            String::new(),
                            percentile(&mut fin, 0.5)
                                .map_or(String::new(), |f| format!("({f:.0})")),
                        )
                    }
                    _ => (String::new(), String::new()),
                };
                println!(
                    "| {x}x | {name} | {mode} | {:.0} | {:.0} | {:.0} % | {} | {:.1} % | {:.1} % | {:.0} % | {rec_s} | {settle_s} |",
                    s.offered,
                    s.goodput,
                    s.goodput_share * 100.0,
                    s.p99_ms.map_or("n/a".into(), |p| format!("{p:.1}")),
                    s.shed * 100.0,
                    s.timeouts * 100.0,
                    s.critical_share * 100.0,
                );
                rows.push(Row {
                    load: x,
                    phase: name,
                    mode: mode.clone(),
                    stats: s,
                    settle: if name == "after" {
                        settled.map(|(t, _)| t)
                    } else {
                        None
                    },
                });
            }
            // Let abandoned connections close before the next run.
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    println!();
    targets(&rows, bound);
    println!();
    println!(
        "load average (1, 5, 15 min) at start: {load_start}; at end: {}; wall time {:.0} s",
        loadavg(),
        wall.elapsed().as_secs_f64()
    );
    std::process::ExitCode::SUCCESS
}
