//! An open-loop load generator for Envoy rate limit services (`envoy.service.ratelimit.v3`
//! `ShouldRateLimit` over gRPC), run by `scripts/rls_bench.sh`.
//!
//! # Open loop
//!
//! Request `i` is scheduled at `start + i / rate`, whatever happened to the ones before: a
//! dispatcher thread wakes when the next request is due (plain `std::thread::sleep`, whose
//! slack on Linux is about 50 µs, far below tokio's 1 ms timer tick) and hands every due
//! request to its own task on the tokio runtime. Latency is taken from the **scheduled**
//! send time to the answer, so a stalled server, client or connection is charged for every
//! request that should have gone out meanwhile (no coordinated omission), and recorded in an
//! HDR histogram (1 µs .. 60 s, 3 significant digits). A second histogram holds the service
//! time (from the actual send), to show how much of the latency is queueing in the client.
//!
//! # Bounds
//!
//! A warm-up (`--warmup`, not recorded), then `--duration` seconds or `--max-requests`
//! requests, whichever comes first; every call has a deadline (`--timeout-ms`, counted as
//! an error); at most `--max-in-flight` calls are outstanding (the excess is counted as
//! dropped, an error); after the schedule the tool waits at most the call deadline plus one
//! second for the calls in flight.
//!
//! # Sustained or not
//!
//! A rate is **not sustained** when the achieved rate (answers of the measured window per
//! second, from the window's start to the last answer) is below 95 % of the target, when
//! more than 0.1 % of the calls failed, or when the backlog grew: the mean number of calls
//! in flight over the last quarter of the window is more than twice that of the first
//! quarter plus 5 ms worth of arrivals.
//!
//! # Descriptors
//!
//! Each request carries one descriptor `[(--key, VALUE)]` in `--domain`, `VALUE` drawn
//! (pseudo-randomly, the same sequence every run) from `--keys` distinct values: one hot
//! key with `--keys 1`, many with `--keys 10000`.
//!
//! ```text
//! rls_load --addr 127.0.0.1:8081 --rate 10000 --duration 10 --connections 4 --keys 100
//! ```

use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use hdrhistogram::Histogram;
use tonic::transport::{Channel, Endpoint};

/// Open-loop ShouldRateLimit load at a fixed arrival rate, latency from the scheduled send.
#[derive(Debug, Parser, Clone)]
struct Args {
    /// The service's gRPC address (host:port).
    #[arg(long, default_value = "127.0.0.1:8081")]
    addr: String,
    /// Target arrival rate, requests (decisions) per second.
    #[arg(long)]
    rate: u64,
    /// Length of the measured window, seconds.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Unrecorded load at the same rate before the window, seconds.
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// At most this many measured requests (default: rate × duration).
    #[arg(long)]
    max_requests: Option<u64>,
    /// Number of gRPC connections (tonic channels); requests go round-robin.
    #[arg(long, default_value_t = 4)]
    connections: usize,
    /// The request's domain.
    #[arg(long, default_value = "bench")]
    domain: String,
    /// The descriptor entry's key.
    #[arg(long, default_value = "user")]
    key: String,
    /// Number of distinct descriptor values.
    #[arg(long, default_value_t = 1)]
    keys: u64,
    /// Deadline of one call, milliseconds (a late answer counts as an error).
    #[arg(long, default_value_t = 2000)]
    timeout_ms: u64,
    /// Most calls outstanding at once; requests over it are dropped (counted as errors).
    #[arg(long, default_value_t = 100_000)]
    max_in_flight: usize,
    /// A label for the one-line output (`--tsv`).
    #[arg(long, default_value = "")]
    label: String,
    /// Print one tab-separated line instead of the human summary: label, target, achieved,
    /// p50 ms, p99 ms, p99.9 ms, max ms, errors, sustained (yes/no: reason).
    #[arg(long)]
    tsv: bool,
}

/// What the request tasks share.
struct Shared {
    /// Latency from the scheduled send, µs (measured window only).
    corrected: Mutex<Histogram<u64>>,
    /// Latency from the actual send, µs (measured window only).
    service: Mutex<Histogram<u64>>,
    ok: AtomicU64,
    errors: AtomicU64,
    in_flight: AtomicUsize,
    /// Last answer of the measured window, in µs since the window's start.
    last_answer_us: AtomicU64,
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("1 µs .. 60 s at 3 digits is a valid range")
}

/// splitmix64: a fixed pseudo-random sequence for the descriptor values.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn request(args: &Args, values: &[String], i: u64) -> RateLimitRequest {
    let n = values.len() as u64;
    let value = values[usize::try_from(mix(i) % n).unwrap_or(0)].clone();
    RateLimitRequest {
        domain: args.domain.clone(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: args.key.clone(),
                value,
            }],
            ..RateLimitDescriptor::default()
        }],
        hits_addend: 1,
    }
}

/// The run's outcome.
struct Summary {
    target: u64,
    achieved: f64,
    ok: u64,
    errors: u64,
    p50_ms: f64,
    p99_ms: f64,
    p999_ms: f64,
    max_ms: f64,
    service_p99_ms: f64,
    max_dispatch_lag_ms: f64,
    in_flight_first: f64,
    in_flight_last: f64,
    not_sustained: Vec<String>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.rate == 0 || args.keys == 0 || args.connections == 0 || args.duration <= 0.0 {
        eprintln!("rls_load: --rate, --keys, --connections and --duration must be positive");
        return ExitCode::FAILURE;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rls_load: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let channels = match runtime.block_on(connect(&args)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("rls_load: cannot connect to {}: {e}", args.addr);
            return ExitCode::FAILURE;
        }
    };
    let summary = run(&args, &runtime, channels);
    print(&args, &summary);
    ExitCode::SUCCESS
}

async fn connect(
    args: &Args,
) -> Result<Vec<RateLimitServiceClient<Channel>>, tonic::transport::Error> {
    let uri = if args.addr.contains("://") {
        args.addr.clone()
    } else {
        format!("http://{}", args.addr)
    };
    let mut clients = Vec::with_capacity(args.connections);
    for _ in 0..args.connections {
        let channel = Endpoint::from_shared(uri.clone())?
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await?;
        clients.push(RateLimitServiceClient::new(channel));
    }
    Ok(clients)
}

fn run(
    args: &Args,
    runtime: &tokio::runtime::Runtime,
    clients: Vec<RateLimitServiceClient<Channel>>,
) -> Summary {
    let shared = Arc::new(Shared {
        corrected: Mutex::new(histogram()),
        service: Mutex::new(histogram()),
        ok: AtomicU64::new(0),
        errors: AtomicU64::new(0),
        in_flight: AtomicUsize::new(0),
        last_answer_us: AtomicU64::new(0),
    });
    let values: Arc<Vec<String>> = Arc::new((0..args.keys).map(|i| format!("u{i}")).collect());
    let rate = args.rate as f64;
    let warmup_n = (args.warmup.max(0.0) * rate) as u64;
    let window_n = args
        .max_requests
        .unwrap_or(u64::MAX)
        .min((args.duration * rate).ceil() as u64)
        .max(1);
    let total = warmup_n + window_n;
    let timeout = Duration::from_millis(args.timeout_ms);
    let handle = runtime.handle().clone();
    let start = Instant::now() + Duration::from_millis(20);
    let window_start = start + Duration::from_secs_f64(warmup_n as f64 / rate);
    let mut dropped = 0u64;
    let mut max_lag = Duration::ZERO;
    // (seconds into the window, calls in flight), every 10 ms of the window.
    let mut samples: Vec<(f64, usize)> = Vec::new();
    let mut next_sample = window_start;
    let mut i = 0u64;
    while i < total {
        let now = Instant::now();
        let due_at = start + Duration::from_secs_f64(i as f64 / rate);
        if due_at > now {
            std::thread::sleep(due_at - now);
            continue;
        }
        // Send every request due by now, each at its own scheduled time.
        while i < total {
            let scheduled = start + Duration::from_secs_f64(i as f64 / rate);
            if scheduled > now {
                break;
            }
            max_lag = max_lag.max(now - scheduled);
            let measured = i >= warmup_n;
            if shared.in_flight.load(Ordering::Relaxed) >= args.max_in_flight {
                if measured {
                    dropped += 1;
                }
                i += 1;
                continue;
            }
            shared.in_flight.fetch_add(1, Ordering::Relaxed);
            let mut client = clients[usize::try_from(i).unwrap_or(0) % clients.len()].clone();
            let req = request(args, &values, i);
            let shared = Arc::clone(&shared);
            handle.spawn(async move {
                let sent = Instant::now();
                let result = tokio::time::timeout(timeout, client.should_rate_limit(req)).await;
                let done = Instant::now();
                shared.in_flight.fetch_sub(1, Ordering::Relaxed);
                if !measured {
                    return;
                }
                match result {
                    Ok(Ok(_)) => {
                        shared.ok.fetch_add(1, Ordering::Relaxed);
                        let corrected = micros(done - scheduled);
                        let service = micros(done - sent);
                        if let Ok(mut h) = shared.corrected.lock() {
                            h.saturating_record(corrected);
                        }
                        if let Ok(mut h) = shared.service.lock() {
                            h.saturating_record(service);
                        }
                        let at = micros(done.saturating_duration_since(window_start));
                        shared.last_answer_us.fetch_max(at, Ordering::Relaxed);
                    }
                    Ok(Err(_)) | Err(_) => {
                        shared.errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
            i += 1;
        }
        if now >= next_sample {
            samples.push((
                (now - window_start).as_secs_f64(),
                shared.in_flight.load(Ordering::Relaxed),
            ));
            next_sample = now + Duration::from_millis(10);
        }
    }
    let schedule_end = Instant::now();
    // Drain: bounded by the call deadline plus one second.
    let drain_deadline = schedule_end + timeout + Duration::from_secs(1);
    while shared.in_flight.load(Ordering::Relaxed) > 0 && Instant::now() < drain_deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let window_secs = window_n as f64 / rate;
    let ok = shared.ok.load(Ordering::Relaxed);
    let errors = shared.errors.load(Ordering::Relaxed)
        + dropped
        + u64::try_from(shared.in_flight.load(Ordering::Relaxed)).unwrap_or(0);
    let last = shared.last_answer_us.load(Ordering::Relaxed) as f64 / 1e6;
    let achieved = ok as f64 / window_secs.max(last);
    let (corrected, service) = match (shared.corrected.lock(), shared.service.lock()) {
        (Ok(c), Ok(s)) => (c.clone(), s.clone()),
        _ => (histogram(), histogram()),
    };
    let ms = |us: u64| us as f64 / 1000.0;
    let quarter = |lo: f64, hi: f64| {
        let v: Vec<usize> = samples
            .iter()
            .filter(|(t, _)| *t >= lo * window_secs && *t < hi * window_secs)
            .map(|(_, n)| *n)
            .collect();
        if v.is_empty() {
            0.0
        } else {
            v.iter().sum::<usize>() as f64 / v.len() as f64
        }
    };
    let in_flight_first = quarter(0.0, 0.25);
    let in_flight_last = quarter(0.75, 1.01);
    let mut not_sustained = Vec::new();
    if achieved < 0.95 * rate {
        not_sustained.push(format!(
            "achieved {:.0}% of target",
            100.0 * achieved / rate
        ));
    }
    if errors as f64 > 0.001 * window_n as f64 {
        not_sustained.push(format!("{errors} errors"));
    }
    if in_flight_last > 2.0 * in_flight_first + 0.005 * rate {
        not_sustained.push(format!(
            "backlog grew ({in_flight_first:.0} -> {in_flight_last:.0} in flight)"
        ));
    }
    Summary {
        target: args.rate,
        achieved,
        ok,
        errors,
        p50_ms: ms(corrected.value_at_quantile(0.5)),
        p99_ms: ms(corrected.value_at_quantile(0.99)),
        p999_ms: ms(corrected.value_at_quantile(0.999)),
        max_ms: ms(corrected.max()),
        service_p99_ms: ms(service.value_at_quantile(0.99)),
        max_dispatch_lag_ms: max_lag.as_secs_f64() * 1000.0,
        in_flight_first,
        in_flight_last,
        not_sustained,
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

fn print(args: &Args, s: &Summary) {
    let verdict = if s.not_sustained.is_empty() {
        "yes".to_owned()
    } else {
        format!("no: {}", s.not_sustained.join(", "))
    };
    if args.tsv {
        println!(
            "{}\t{}\t{:.0}\t{:.3}\t{:.3}\t{:.3}\t{:.3}\t{}\t{}",
            args.label,
            s.target,
            s.achieved,
            s.p50_ms,
            s.p99_ms,
            s.p999_ms,
            s.max_ms,
            s.errors,
            verdict
        );
        return;
    }
    println!(
        "target {}/s over {} connection(s), {} key(s): achieved {:.0}/s ({} ok, {} errors)",
        s.target, args.connections, args.keys, s.achieved, s.ok, s.errors
    );
    println!(
        "latency from the scheduled send: p50 {:.3} ms, p99 {:.3} ms, p99.9 {:.3} ms, max {:.3} ms",
        s.p50_ms, s.p99_ms, s.p999_ms, s.max_ms
    );
    println!(
        "service time p99 {:.3} ms; dispatcher lag max {:.3} ms; in flight {:.1} (first quarter) -> {:.1} (last quarter)",
        s.service_p99_ms, s.max_dispatch_lag_ms, s.in_flight_first, s.in_flight_last
    );
    println!("sustained: {verdict}");
}
