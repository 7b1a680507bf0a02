//! The memory store at internet scale, beside governor's keyed limiter in the same run:
//! bytes per key, a flood of distinct keys against `max_keys`, and two threads at once.
//!
//! ```text
//! cargo bench -p ratekeeper-core --bench memory_scale                 # all three parts
//! RK_SCALE_PART=memory cargo bench -p ratekeeper-core --bench memory_scale
//! RK_SCALE_PART=flood cargo bench -p ratekeeper-core --bench memory_scale
//! RK_SCALE_PART=contention cargo bench -p ratekeeper-core --bench memory_scale
//! ```
//!
//! Each part prints a markdown table.
//!
//! **Memory.** Every cell runs in a fresh child process (this binary, `RK_MEM_CASE` set), so
//! one cell's freed memory cannot flatter the next. The child reads its resident set from
//! `/proc/self/statm`, builds the limiter, inserts `n` distinct keys (one allowed check each,
//! 1 per hour, so no key is idle or evicted), reads the resident set again and prints
//! (growth / n): bytes per key, everything included (map, state, heap copies of long keys,
//! allocator overhead). Keys are made on the fly, never held in a vector. Key kinds:
//! `ipv4` (`Key::Ip` / `IpAddr::V4`), `ipv6` (the client's /64 prefix: `Key::Net(_, 64)`, and
//! for governor the `IpAddr::V6` with the host bits cleared, as tower_governor users key it),
//! `api` (32-byte API keys: `Key::Str` / governor with `String` keys), `int` (`Key::Int`) and
//! `u64` (a `MemoryStore<u64>`), both beside governor with `u64` keys. `RK_MEM_KINDS` picks
//! kinds (comma-separated; default all).
//!
//! **Flood.** One thread sends `RK_FLOOD_KEYS` (default 10 000 000) distinct keys, one
//! request each (IPv4 keys; 32-byte API keys with `RK_FLOOD_KIND=api`), at a store with `max_keys` = `RK_FLOOD_CAP` (default 1 000 000) on a
//! `RK_FLOOD_PER_MIN` per minute quota (default 60: a key stays non-idle for 1 s after its
//! request, so the map fills to the cap, new keys overflow, and the oldest go idle and are
//! swept to make room). Per window of 500 000 requests:
//! resident set, keys held, overflowed and allowed decisions, and the p50/p99/max of the
//! check's time. A legitimate client's key, created before the flood, is checked once per
//! window: it keeps its own budget (its first request is made before the flood).
//!
//! **Contention.** Two threads at once, each doing `BATCH` checks, on one hot key (both on
//! the same key) and on disjoint keys (1024 keys each, checked in turn), ours (`Key::Ip`) and governor
//! (`IpAddr`) in turn, 15 rounds, the order rotating; ns per pair of checks (wall time of the
//! two threads / `BATCH`) and the median of the per-round ratios.

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::num::{NonZeroU32, NonZeroUsize};
use std::process::Command;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use governor::{DefaultKeyedRateLimiter, RateLimiter};
use ratekeeper_core::store::{Charge, Checked, MemoryStore, PolicyId, Store};
use ratekeeper_core::{Key, Policy, Quota};

/// The resident set in bytes, from `/proc/self/statm` (pages; 4 KiB here).
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

struct Ours {
    store: MemoryStore<Key>,
    id: PolicyId,
}

impl Ours {
    fn new(quota: Quota, max_keys: Option<NonZeroUsize>) -> Self {
        let mut store = MemoryStore::new();
        if let Some(cap) = max_keys {
            store = store.with_max_keys(cap);
        }
        let id = match store.register(&Policy::new("bench", quota)) {
            Ok(id) => id,
            Err(err) => panic!("bench policy refused: {err}"),
        };
        Self { store, id }
    }

    #[inline]
    fn check(&self, key: &Key) -> bool {
        match self.store.check(&[Charge::new(self.id, key, 1)]) {
            Checked::Ready(Ok(d)) => d.is_allowed(),
            Checked::Ready(Err(_)) | Checked::Pending(_) => false,
        }
    }
}

fn ipv4(i: u64) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(0x0A00_0000u32.wrapping_add(i as u32)))
}

/// The /64 prefix number `i` (host bits clear).
fn ipv6_64(i: u64) -> IpAddr {
    IpAddr::V6(Ipv6Addr::from(
        (0x2001_0db8_0000_0000u128 | u128::from(i)) << 64,
    ))
}

/// A 32-byte API key.
fn api(i: u64) -> String {
    format!("rk_live_{i:024}")
}

fn per_hour() -> Quota {
    Quota::per_hour(NonZeroU32::MIN)
}

fn gov_per_hour() -> governor::Quota {
    governor::Quota::per_hour(NonZeroU32::MIN)
}

/// Child process: one memory cell. Prints "bytes_per_key".
fn memory_cell(case: &str) {
    let mut parts = case.split('/');
    let (Some(limiter), Some(kind), Some(n)) = (parts.next(), parts.next(), parts.next()) else {
        panic!("RK_MEM_CASE must be <ours|governor>/<ipv4|ipv6|api|int|u64>/<n>, got {case}");
    };
    let n: u64 = n.parse().unwrap_or(0);
    let before = rss();
    let after = match (limiter, kind) {
        ("ours", "u64") => {
            let mut store = MemoryStore::<u64>::new();
            let id = match store.register(&Policy::new("bench", per_hour())) {
                Ok(id) => id,
                Err(err) => panic!("bench policy refused: {err}"),
            };
            for i in 0..n {
                let allowed = matches!(
                    store.check(&[Charge::new(id, &i, 1)]),
                    Checked::Ready(Ok(d)) if d.is_allowed()
                );
                assert!(allowed, "first request of a key");
            }
            let after = rss();
            assert_eq!(store.len() as u64, n);
            black_box(&store);
            after
        }
        ("ours", _) => {
            let ours = Ours::new(per_hour(), None);
            let key = |i: u64| match kind {
                "ipv4" => Key::Ip(ipv4(i)),
                "ipv6" => Key::Net(ipv6_64(i), 64),
                "int" => Key::Int(i),
                _ => Key::from(api(i)),
            };
            for i in 0..n {
                assert!(ours.check(&key(i)), "first request of a key");
            }
            let after = rss();
            assert_eq!(ours.store.len() as u64, n);
            black_box(&ours);
            after
        }
        ("governor", "api") => {
            let gov: DefaultKeyedRateLimiter<String> = RateLimiter::keyed(gov_per_hour());
            for i in 0..n {
                assert!(gov.check_key(&api(i)).is_ok());
            }
            let after = rss();
            assert_eq!(gov.len() as u64, n);
            black_box(&gov);
            after
        }
        ("governor", "int" | "u64") => {
            let gov: DefaultKeyedRateLimiter<u64> = RateLimiter::keyed(gov_per_hour());
            for i in 0..n {
                assert!(gov.check_key(&i).is_ok());
            }
            let after = rss();
            assert_eq!(gov.len() as u64, n);
            black_box(&gov);
            after
        }
        ("governor", _) => {
            let gov: DefaultKeyedRateLimiter<IpAddr> = RateLimiter::keyed(gov_per_hour());
            let key = |i: u64| if kind == "ipv4" { ipv4(i) } else { ipv6_64(i) };
            for i in 0..n {
                assert!(gov.check_key(&key(i)).is_ok());
            }
            let after = rss();
            assert_eq!(gov.len() as u64, n);
            black_box(&gov);
            after
        }
        _ => panic!("unknown limiter {limiter}"),
    };
    println!("{:.1}", after.saturating_sub(before) as f64 / n as f64);
}

/// Runs one memory cell in a child process; bytes per key.
fn spawn_cell(case: &str) -> f64 {
    let exe = std::env::current_exe().unwrap_or_default();
    let out = Command::new(exe)
        .env("RK_MEM_CASE", case)
        .output()
        .unwrap_or_else(|err| panic!("spawning {case}: {err}"));
    let text = String::from_utf8_lossy(&out.stdout);
    text.trim().parse().unwrap_or_else(|_| {
        panic!(
            "{case}: no result ({})",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn memory() {
    let sizes: Vec<u64> = std::env::var("RK_MEM_SIZES")
        .ok()
        .map(|s| s.split(',').filter_map(|x| x.parse().ok()).collect())
        .unwrap_or_else(|| vec![1_000_000, 10_000_000]);
    let kinds: Vec<String> = std::env::var("RK_MEM_KINDS")
        .ok()
        .map(|s| s.split(',').map(str::to_owned).collect())
        .unwrap_or_else(|| {
            ["ipv4", "ipv6", "api", "int", "u64"]
                .map(str::to_owned)
                .to_vec()
        });
    println!("\n### Bytes per key (resident set growth / keys)\n");
    println!("| keys | kind | ratekeeper `Key` | governor | ours / governor |");
    println!("|---:|---|---:|---:|---:|");
    for &n in &sizes {
        for kind in &kinds {
            let ours = spawn_cell(&format!("ours/{kind}/{n}"));
            let gov = spawn_cell(&format!("governor/{kind}/{n}"));
            let gov_key = match kind.as_str() {
                "api" => "String",
                "int" | "u64" => "u64",
                _ => "IpAddr",
            };
            println!(
                "| {n} | {kind} | {ours:.1} | {gov:.1} (`{gov_key}`) | {:.2} |",
                ours / gov
            );
        }
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn flood() {
    let keys = env_u64("RK_FLOOD_KEYS", 10_000_000);
    let api_keys = std::env::var("RK_FLOOD_KIND").is_ok_and(|kind| kind == "api");
    let cap = env_u64("RK_FLOOD_CAP", 1_000_000);
    const WINDOW: u64 = 500_000;
    let per_min = env_u64("RK_FLOOD_PER_MIN", 60);
    let quota = Quota::per_minute(
        NonZeroU32::new(u32::try_from(per_min).unwrap_or(60)).unwrap_or(NonZeroU32::MIN),
    );
    // The window's timings, touched before the first resident-set reading.
    let mut times = vec![1u64; WINDOW as usize];
    let before = rss();
    let ours = Ours::new(
        quota,
        Some(NonZeroUsize::new(cap as usize).unwrap_or(NonZeroUsize::MIN)),
    );
    let legit = Key::from("legit-client");
    assert!(ours.check(&legit), "the legitimate client's first request");
    let mut legit_allowed = 1;
    println!(
        "\n### Flood: {keys} distinct {} keys, one request each, `max_keys` = {cap}, {per_min}/min\n",
        if api_keys { "32-byte API" } else { "IPv4" }
    );
    println!(
        "| requests | seconds | RSS growth MiB | keys held | overflowed | allowed in window | \
         p50 ns | p99 ns | max µs | legit client |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    let start = Instant::now();
    let mut allowed = 0;
    let mut peak = 0;
    for i in 0..keys {
        let key = if api_keys {
            Key::from(api(i))
        } else {
            Key::Ip(ipv4(i))
        };
        let t = Instant::now();
        let ok = ours.check(black_box(&key));
        times[(i % WINDOW) as usize] = t.elapsed().as_nanos() as u64;
        allowed += u64::from(ok);
        if (i + 1) % WINDOW == 0 {
            let legit_ok = ours.check(&legit);
            legit_allowed += u64::from(legit_ok);
            times.sort_unstable();
            let grown = rss().saturating_sub(before);
            peak = peak.max(grown);
            println!(
                "| {} | {:.1} | {:.1} | {} | {} | {} | {} | {} | {:.0} | {} |",
                i + 1,
                start.elapsed().as_secs_f64(),
                grown as f64 / 1048576.0,
                ours.store.len(),
                ours.store.overflowed(),
                allowed,
                percentile(&times, 0.5),
                percentile(&times, 0.99),
                times.last().copied().unwrap_or(0) as f64 / 1000.0,
                if legit_ok { "allowed" } else { "denied" },
            );
            allowed = 0;
        }
    }
    println!(
        "\npeak RSS growth {:.1} MiB = {:.1} bytes x max_keys; legit client allowed {legit_allowed} \
         times ({per_min}/min budget of its own)",
        peak as f64 / 1048576.0,
        peak as f64 / cap as f64
    );
}

const BATCH: u64 = 400_000;
const ROUNDS: usize = 15;
/// Keys per thread in the disjoint case.
const DISJOINT: u64 = 1024;

/// One thread's check: the limiter and the iteration index (which key to take).
type CheckFn<'a, T> = &'a (dyn Fn(&T, usize) -> bool + Sync);

/// Two threads, `BATCH` checks each, at once; ns per pair of checks.
fn pair<T: Sync>(limiter: &T, keys: [CheckFn<'_, T>; 2]) -> f64 {
    let barrier = Barrier::new(3);
    std::thread::scope(|s| {
        for f in keys {
            let barrier = &barrier;
            s.spawn(move || {
                barrier.wait();
                for i in 0..BATCH as usize {
                    black_box(f(limiter, i));
                }
                barrier.wait();
            });
        }
        barrier.wait();
        let t = Instant::now();
        barrier.wait();
        t.elapsed().as_secs_f64() * 1e9 / BATCH as f64
    })
}

/// One thread, `2 * BATCH` checks: ns per two checks, the baseline a pair is read against.
fn alone<T>(limiter: &T, f: &dyn Fn(&T, usize) -> bool) -> f64 {
    let t = Instant::now();
    for i in 0..2 * BATCH as usize {
        black_box(f(limiter, i));
    }
    t.elapsed().as_secs_f64() * 1e9 / BATCH as f64
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs.get(xs.len() / 2).copied().unwrap_or(f64::NAN)
}

fn contention() {
    let allow = Quota::per_second(NonZeroU32::MIN)
        .with_burst(1_000_000_000)
        .unwrap_or_else(|err| panic!("{err}"));
    let gov_allow = governor::Quota::per_second(NonZeroU32::MIN)
        .allow_burst(NonZeroU32::new(1_000_000_000).unwrap_or(NonZeroU32::MIN));
    // The hot key, and two disjoint sets of keys (one per thread, checked in turn), so that
    // which dashmap shard a key falls in (random per process) averages out.
    let hot = ipv4(0);
    let ip_sets: [Vec<IpAddr>; 2] = [
        (1..=DISJOINT).map(ipv4).collect(),
        (DISJOINT + 1..=2 * DISJOINT).map(ipv4).collect(),
    ];
    let key_sets = ip_sets
        .clone()
        .map(|set| set.into_iter().map(Key::Ip).collect::<Vec<_>>());
    let ours = Ours::new(allow, None);
    let gov: DefaultKeyedRateLimiter<IpAddr> = RateLimiter::keyed(gov_allow);
    let hot_key = Key::Ip(hot);
    for k in key_sets.iter().flatten().chain([&hot_key]) {
        assert!(ours.check(k));
    }
    for k in ip_sets.iter().flatten().chain([&hot]) {
        assert!(gov.check_key(k).is_ok());
    }
    let n = DISJOINT as usize;
    let oh = |o: &Ours, _: usize| o.check(&hot_key);
    let oa = |o: &Ours, i: usize| o.check(&key_sets[0][i % n]);
    let ob = |o: &Ours, i: usize| o.check(&key_sets[1][i % n]);
    let gh = |g: &DefaultKeyedRateLimiter<IpAddr>, _: usize| g.check_key(&hot).is_ok();
    let ga =
        |g: &DefaultKeyedRateLimiter<IpAddr>, i: usize| g.check_key(&ip_sets[0][i % n]).is_ok();
    let gb =
        |g: &DefaultKeyedRateLimiter<IpAddr>, i: usize| g.check_key(&ip_sets[1][i % n]).is_ok();
    type Run<'a> = Box<dyn FnMut() -> f64 + 'a>;
    let mut runs: Vec<(&str, Run<'_>)> = vec![
        ("ours/hot", Box::new(|| pair(&ours, [&oh, &oh]))),
        ("governor/hot", Box::new(|| pair(&gov, [&gh, &gh]))),
        ("ours/disjoint", Box::new(|| pair(&ours, [&oa, &ob]))),
        ("governor/disjoint", Box::new(|| pair(&gov, [&ga, &gb]))),
        ("ours/alone", Box::new(|| alone(&ours, &oh))),
        ("governor/alone", Box::new(|| alone(&gov, &gh))),
    ];
    let mut ns = vec![Vec::new(); runs.len()];
    for round in 0..ROUNDS {
        let n = runs.len();
        for j in 0..n {
            let k = (j + round) % n;
            ns[k].push((runs[k].1)());
        }
    }
    println!(
        "\n### Two threads at once ({ROUNDS} rounds x {BATCH} checks per thread, ns per pair of checks)\n"
    );
    println!("| case | ratekeeper `Key` | governor `IpAddr` | ratio (median of rounds) |");
    println!("|---|---:|---:|---:|");
    for (case, o, g) in [
        ("one hot key", 0, 1),
        ("disjoint keys", 2, 3),
        ("one thread, one key (two checks in a row)", 4, 5),
    ] {
        let ratios = ns[o].iter().zip(&ns[g]).map(|(x, y)| x / y).collect();
        println!(
            "| {case} | {:.1} | {:.1} | {:.3} |",
            median(ns[o].clone()),
            median(ns[g].clone()),
            median(ratios)
        );
    }
}

fn main() {
    if let Ok(case) = std::env::var("RK_MEM_CASE") {
        memory_cell(&case);
        return;
    }
    let part = std::env::var("RK_SCALE_PART").unwrap_or_default();
    let started = Instant::now();
    if part.is_empty() || part == "memory" {
        memory();
    }
    if part.is_empty() || part == "flood" {
        flood();
    }
    if part.is_empty() || part == "contention" {
        contention();
    }
    eprintln!(
        "memory_scale: {:?}",
        Duration::from_secs(started.elapsed().as_secs())
    );
}
