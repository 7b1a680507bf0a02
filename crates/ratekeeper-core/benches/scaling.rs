//! Time per check against the state one key holds: every algorithm, one key holding `n` and
//! `4n` entries (sliding log) or units (the others), `n` from 1,024 to 65,536.
//!
//! ```text
//! cargo bench -p ratekeeper-core --bench scaling
//! ```
//!
//! Each case fills one key of a [`MemoryStore`] on a manual clock (so nothing expires while
//! measuring), then measures:
//!
//! - `check`: a cost-1 check of the full key (denied, so the state never changes). The
//!   sliding log holds `n` entries of one unit each, at `n` distinct instants; the other
//!   algorithms hold `n` units (GCRA and the leaky bucket: burst `n`; fixed window, sliding
//!   window counter: limit `n`; concurrency: `n` permits held);
//! - `sliding-log/deep`: a check of cost `n / 2` (denied), whose wait is the expiry of the
//!   entry in the middle of the log;
//! - `sliding-log/peeked`: a two-policy check where a spent GCRA policy decides and the
//!   sliding log (holding `n` entries) is peeked for the report.
//!
//! Criterion measures every case; then a plain pass (15 rounds of 20,000 checks per case,
//! the median round) prints the table: ns per check at each `n` and the ratio of the time at
//! 65,536 to the time at 1,024 (1.0 = flat; a check that read the whole log would be 64).

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::Criterion;
use ratekeeper_core::clock::ManualClock;
use ratekeeper_core::store::{Charge, MemoryStore, PolicyId, Store};
use ratekeeper_core::{Algorithm, Key, Policy, Quota};

/// Entries (or units) held by the key: n and 4n, from 1k to 64k.
const SIZES: [u32; 4] = [1_024, 4_096, 16_384, 65_536];
/// The plain pass: rounds per case and checks per round.
const ROUNDS: usize = 15;
const CHECKS: u32 = 20_000;

/// One measured case: a store whose key is full, and the charges of the check measured.
struct Case {
    store: MemoryStore<Key, ManualClock>,
    ids: Vec<PolicyId>,
    cost: u64,
}

impl Case {
    fn check(&self, key: &Key) -> bool {
        let result = match self.ids[..] {
            [only] => self.store.check_now(&[Charge::new(only, key, self.cost)]),
            [first, second] => self.store.check_now(&[
                Charge::new(first, key, self.cost),
                Charge::new(second, key, self.cost),
            ]),
            _ => return true,
        };
        result.is_ok_and(|d| d.is_allowed())
    }
}

/// One key holding `n` entries or units under `algorithm`; checks of `cost` measured; with
/// `peeked`, a spent GCRA policy is charged first so the algorithm under test is peeked.
fn case(algorithm: Algorithm, n: u32, cost: u64, peeked: bool) -> Case {
    let clock = ManualClock::new();
    let mut store = MemoryStore::with_clock(clock.clone());
    let hour = Duration::from_secs(3_600);
    let quota = Quota::new(n, hour)
        .and_then(|q| q.with_burst(n))
        .expect("valid quota");
    let key = Key::Int(7);
    let mut ids = Vec::new();
    if peeked {
        let gate = Quota::new(1, hour).expect("valid quota");
        let gate = store
            .register(&Policy::new("gate", gate))
            .expect("registered");
        let _ = store.check_now(&[Charge::new(gate, &key, 1)]);
        ids.push(gate);
    }
    let id = store
        .register(&Policy::new("p", quota).with_algorithm(algorithm))
        .expect("registered");
    if algorithm == Algorithm::SlidingLog {
        // n entries at n distinct instants, 1 ns apart (the window is an hour).
        for _ in 0..n {
            let _ = store.check_now(&[Charge::new(id, &key, 1)]);
            clock.advance(Duration::from_nanos(1));
        }
    } else {
        let _ = store.check_now(&[Charge::new(id, &key, u64::from(n))]);
    }
    ids.push(id);
    Case { store, ids, cost }
}

/// Builds a case for a given `n`.
type MakeCase = fn(u32) -> Case;

/// The cases of the table: a name and the case at a given `n`.
fn cases() -> Vec<(&'static str, MakeCase)> {
    vec![
        ("gcra", |n| case(Algorithm::Gcra, n, 1, false)),
        ("leaky-bucket", |n| {
            case(Algorithm::LeakyBucket, n, 1, false)
        }),
        ("fixed-window", |n| {
            case(Algorithm::FixedWindow, n, 1, false)
        }),
        ("sliding-window", |n| {
            case(Algorithm::SlidingWindow, n, 1, false)
        }),
        ("concurrency", |n| case(Algorithm::Concurrency, n, 1, false)),
        ("sliding-log", |n| case(Algorithm::SlidingLog, n, 1, false)),
        ("sliding-log/deep", |n| {
            case(Algorithm::SlidingLog, n, u64::from(n / 2), false)
        }),
        ("sliding-log/peeked", |n| {
            case(Algorithm::SlidingLog, n, 1, true)
        }),
    ]
}

/// Median ns per check over the plain pass.
fn ns_per_check(case: &Case) -> f64 {
    let key = Key::Int(7);
    let mut rounds: Vec<f64> = (0..ROUNDS)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..CHECKS {
                black_box(case.check(black_box(&key)));
            }
            start.elapsed().as_secs_f64() * 1e9 / f64::from(CHECKS)
        })
        .collect();
    rounds.sort_by(f64::total_cmp);
    rounds[ROUNDS / 2]
}

fn main() {
    let mut c = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .configure_from_args();
    for (name, make) in cases() {
        let mut group = c.benchmark_group(format!("scaling/{name}"));
        for n in SIZES {
            let case = make(n);
            let key = Key::Int(7);
            assert!(!case.check(&key), "{name} at {n}: the key must be full");
            group.bench_function(n.to_string(), |b| b.iter(|| case.check(black_box(&key))));
        }
        group.finish();
    }
    c.final_summary();

    println!();
    println!("ns per check, one key holding n entries (sliding log) or units (others)");
    print!("| case |");
    for n in SIZES {
        print!(" n = {n} |");
    }
    println!(" {} / {} |", SIZES[SIZES.len() - 1], SIZES[0]);
    println!("|---|{}---|", "---|".repeat(SIZES.len()));
    for (name, make) in cases() {
        let times: Vec<f64> = SIZES.iter().map(|&n| ns_per_check(&make(n))).collect();
        print!("| {name} |");
        for t in &times {
            print!(" {t:.0} |");
        }
        println!(" {:.2} |", times[times.len() - 1] / times[0]);
    }
}
