//! The memory store's check beside governor's keyed limiter, in the same run.
//!
//! ```text
//! cargo bench -p ratekeeper-core --bench memory_store
//! ```
//!
//! Every case runs each limiter on the same quota and the same key type:
//!
//! - groups `allow/*`: 1 per second with burst 10^9 (`T` = 1 s, `tau` = 10^9 s), so every
//!   check is allowed and both limiters do the full update (one compare-and-swap). Each check
//!   moves the key's TAT 1 s ahead, so no key ever becomes idle and the memory store never
//!   evicts one: the `100k_keys` cases measure existing keys;
//! - groups `deny/*`: 1 per hour with burst 1; every key is exhausted before measuring, so
//!   every check is denied (no write);
//! - `*/hot_key`: one key, checked over and over;
//! - `*/100k_keys`: 100 000 distinct keys, all inserted before measuring, checked in turn.
//!
//! Limiters: `ratekeeper/u64` and `governor/u64` (`RateLimiter::keyed`, the default
//! `DefaultKeyedRateLimiter` with its default SipHash hasher and quanta clock) are the pair the
//! ratio is taken on. `ratekeeper/Key` uses [`ratekeeper_core::Key::Ip`] keys as the HTTP layer
//! does, beside `governor/IpAddr` (what `tower_governor` keys by). `governor+foldhash/u64` is
//! governor on the same hasher as ours, for reference. The fixed-count mode below also has
//! `ratekeeper-api`: 32-byte API keys (`Key::Str`), for the cost of a long string key.
//!
//! After the run, the medians criterion wrote are read back and printed as a ratio table
//! (ours / governor, lower is faster). Then an interleaved pass runs every limiter of a case
//! in turn, 200 000 checks at a time, 21 rounds, and prints the median of the per-round
//! ratios: on a busy machine this is the ratio to quote (see `BENCHMARKS.md`).
//!
//! `RK_BENCH_INTERLEAVED_ONLY=1` skips criterion and runs only the interleaved pass.
//! `RK_BENCH_CASE=<group>/<limiter> RK_BENCH_ITERS=<n>` runs one case `n` times without
//! criterion (for `valgrind --tool=callgrind`, see `scripts/callgrind_store.sh`). Its allow
//! quota is 1 per hour with burst 4 000 000 instead: under valgrind, priming 100 000 keys
//! takes seconds, so with 1 per second the keys primed first would go idle, be swept and be
//! inserted again during the measured loop, and the two sides would do different work. With
//! a 1-hour emission interval every key's TAT stays an hour ahead of the clock for the whole
//! run (the mode refuses a run that took an hour or more), so the memory store never sweeps
//! a key and both sides do the same steady-state update.

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use criterion::{BenchmarkGroup, Criterion, measurement::WallTime};
use governor::{DefaultKeyedRateLimiter, RateLimiter};
use ratekeeper_core::store::{Charge, Checked, MemoryStore, PolicyId, Store};
use ratekeeper_core::{Key, Policy, Quota};

/// Distinct keys in the `100k_keys` cases.
const MANY: usize = 100_000;
/// Allow quota: 1 per second (T = 1 s) with this burst, more than any run checks one key.
const ALLOW_BURST: u32 = 1_000_000_000;
/// Allow quota of the fixed-count (callgrind) mode: 1 per hour (T = 1 h) with this burst
/// (`tau` = 4 * 10^6 h, within `u64::MAX` ns). A run checks one key at most this many times.
const FIXED_ALLOW_BURST: u32 = 4_000_000;
/// The fixed-count mode's emission interval: no key can go idle in a shorter run.
const FIXED_ALLOW_PERIOD: Duration = Duration::from_secs(3600);

/// One limiter under test: checks one unit for `key`, answers whether it was allowed.
trait Limiter<K> {
    fn check(&self, key: &K) -> bool;
}

struct Ours<K> {
    store: MemoryStore<K>,
    id: PolicyId,
}

impl<K: std::hash::Hash + Eq + Clone + Send + Sync + 'static> Ours<K> {
    fn new(quota: Quota) -> Self {
        let mut store = MemoryStore::new();
        let id = match store.register(&Policy::new("bench", quota)) {
            Ok(id) => id,
            Err(err) => panic!("bench policy refused: {err}"),
        };
        Self { store, id }
    }
}

impl<K: std::hash::Hash + Eq + Clone + Send + Sync + 'static> Limiter<K> for Ours<K> {
    #[inline]
    fn check(&self, key: &K) -> bool {
        // The same call the HTTP layer makes.
        match self.store.check(&[Charge::new(self.id, key, 1)]) {
            Checked::Ready(Ok(decisions)) => decisions.is_allowed(),
            Checked::Ready(Err(_)) | Checked::Pending(_) => false,
        }
    }
}

/// Two policies on one key, charged all-or-nothing in one call (a layer with two policies,
/// such as a per-second and a per-minute limit). Callgrind only (`ratekeeper-Key-2policies`).
struct OursTwo<K> {
    store: MemoryStore<K>,
    ids: [PolicyId; 2],
}

impl<K: std::hash::Hash + Eq + Clone + Send + Sync + 'static> OursTwo<K> {
    fn new(quota: Quota) -> Self {
        let mut store = MemoryStore::new();
        let mut register = |name: &str| match store.register(&Policy::new(name, quota)) {
            Ok(id) => id,
            Err(err) => panic!("bench policy refused: {err}"),
        };
        let ids = [register("first"), register("second")];
        Self { store, ids }
    }
}

impl<K: std::hash::Hash + Eq + Clone + Send + Sync + 'static> Limiter<K> for OursTwo<K> {
    #[inline]
    fn check(&self, key: &K) -> bool {
        let charges = [
            Charge::new(self.ids[0], key, 1),
            Charge::new(self.ids[1], key, 1),
        ];
        match self.store.check(&charges) {
            Checked::Ready(Ok(decisions)) => decisions.is_allowed(),
            Checked::Ready(Err(_)) | Checked::Pending(_) => false,
        }
    }
}

impl<K: std::hash::Hash + Eq + Clone> Limiter<K> for DefaultKeyedRateLimiter<K> {
    #[inline]
    fn check(&self, key: &K) -> bool {
        self.check_key(key).is_ok()
    }
}

type GovernorFoldhash<K> = DefaultKeyedRateLimiter<
    K,
    governor::middleware::NoOpMiddleware<governor::clock::QuantaInstant>,
    foldhash::fast::RandomState,
>;

struct Foldhash<K: std::hash::Hash + Eq + Clone>(GovernorFoldhash<K>);

impl<K: std::hash::Hash + Eq + Clone> Limiter<K> for Foldhash<K> {
    #[inline]
    fn check(&self, key: &K) -> bool {
        self.0.check_key(key).is_ok()
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Allow,
    Deny,
}

impl Verdict {
    fn ours(self) -> Quota {
        match self {
            Verdict::Allow => match Quota::per_second(NonZeroU32::MIN).with_burst(ALLOW_BURST) {
                Ok(q) => q,
                Err(err) => panic!("bench quota refused: {err}"),
            },
            Verdict::Deny => Quota::per_hour(NonZeroU32::MIN),
        }
    }

    fn governor(self) -> governor::Quota {
        match self {
            Verdict::Allow => {
                governor::Quota::per_second(NonZeroU32::MIN).allow_burst(nz(ALLOW_BURST))
            }
            Verdict::Deny => governor::Quota::per_hour(NonZeroU32::MIN),
        }
    }

    /// The fixed-count mode's quota: allow is 1 per hour with burst [`FIXED_ALLOW_BURST`], so
    /// no key goes idle during the run (deny is unchanged, 1 per hour).
    fn ours_fixed(self) -> Quota {
        match self {
            Verdict::Allow => {
                match Quota::per_hour(NonZeroU32::MIN).with_burst(FIXED_ALLOW_BURST) {
                    Ok(q) => q,
                    Err(err) => panic!("bench quota refused: {err}"),
                }
            }
            Verdict::Deny => self.ours(),
        }
    }

    /// Governor's side of [`Verdict::ours_fixed`].
    fn governor_fixed(self) -> governor::Quota {
        match self {
            Verdict::Allow => {
                governor::Quota::per_hour(NonZeroU32::MIN).allow_burst(nz(FIXED_ALLOW_BURST))
            }
            Verdict::Deny => self.governor(),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Verdict::Allow => "allow",
            Verdict::Deny => "deny",
        }
    }
}

fn nz(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).unwrap_or(NonZeroU32::MIN)
}

fn u64_keys(n: usize) -> Vec<u64> {
    // Spread-out distinct values (an odd multiplier is a bijection on u64).
    (0..n as u64)
        .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .collect()
}

/// 32-byte API keys (`Key::Str`), as the memory-scale bench makes them.
fn api_keys(n: usize) -> Vec<Key> {
    (0..n)
        .map(|i| Key::from(format!("rk_live_{i:024}")))
        .collect()
}

fn ips(n: usize) -> Vec<IpAddr> {
    (0..n as u32)
        .map(|i| IpAddr::V4(Ipv4Addr::from(0x0A00_0000 + i)))
        .collect()
}

/// Inserts every key (and, for `Deny`, exhausts it), checking that the limiter then gives
/// the verdict the case is about.
fn prime<K, L: Limiter<K>>(limiter: &L, keys: &[K], verdict: Verdict) {
    for k in keys {
        assert!(limiter.check(k), "first check of a key must pass");
    }
    for k in keys.iter().take(16) {
        assert_eq!(limiter.check(k), verdict == Verdict::Allow);
    }
}

fn bench_one<K, L: Limiter<K>>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    limiter: &L,
    keys: &[K],
    verdict: Verdict,
) {
    prime(limiter, keys, verdict);
    let mut i = 0;
    group.bench_function(name, |b| {
        b.iter(|| {
            let k = &keys[i];
            i += 1;
            if i == keys.len() {
                i = 0;
            }
            black_box(limiter.check(black_box(k)))
        });
    });
}

/// The limiters of one case, built and primed lazily.
struct Case {
    verdict: Verdict,
    keys: usize,
}

impl Case {
    fn group_name(&self) -> String {
        let keys = if self.keys == 1 {
            "hot_key"
        } else {
            "100k_keys"
        };
        format!("{}/{keys}", self.verdict.name())
    }

    fn run(&self, c: &mut Criterion) {
        let v = self.verdict;
        let (u64s, ips) = (u64_keys(self.keys), ips(self.keys));
        let keys: Vec<Key> = ips.iter().copied().map(Key::Ip).collect();
        let mut group = c.benchmark_group(self.group_name());
        // Interleave the pair the ratio is taken on between the reference rows.
        bench_one(
            &mut group,
            "governor/u64",
            &governor_default(v.governor()),
            &u64s,
            v,
        );
        bench_one(&mut group, "ratekeeper/u64", &Ours::new(v.ours()), &u64s, v);
        bench_one(
            &mut group,
            "governor/IpAddr",
            &governor_default(v.governor()),
            &ips,
            v,
        );
        bench_one(&mut group, "ratekeeper/Key", &Ours::new(v.ours()), &keys, v);
        bench_one(
            &mut group,
            "governor+foldhash/u64",
            &governor_foldhash(v.governor()),
            &u64s,
            v,
        );
        group.finish();
    }
}

fn governor_default<K: std::hash::Hash + Eq + Clone>(
    quota: governor::Quota,
) -> DefaultKeyedRateLimiter<K> {
    RateLimiter::keyed(quota)
}

fn governor_foldhash<K: std::hash::Hash + Eq + Clone>(quota: governor::Quota) -> Foldhash<K> {
    Foldhash(RateLimiter::dashmap_with_hasher(
        quota,
        foldhash::fast::RandomState::default(),
    ))
}

const CASES: [Case; 4] = [
    Case {
        verdict: Verdict::Allow,
        keys: 1,
    },
    Case {
        verdict: Verdict::Allow,
        keys: MANY,
    },
    Case {
        verdict: Verdict::Deny,
        keys: 1,
    },
    Case {
        verdict: Verdict::Deny,
        keys: MANY,
    },
];

/// `(ours, reference)` rows the ratio table shows.
const PAIRS: [(&str, &str); 3] = [
    ("ratekeeper/u64", "governor/u64"),
    ("ratekeeper/Key", "governor/IpAddr"),
    ("ratekeeper/u64", "governor+foldhash/u64"),
];

/// Rounds of the interleaved pass, and checks per limiter per round.
const ROUNDS: usize = 21;
const BATCH: usize = 200_000;

/// A primed limiter with its keys, timed `BATCH` checks at a time (ns per check).
type Timed = (&'static str, Box<dyn FnMut() -> f64>);

fn timed<K: 'static, L: Limiter<K> + 'static>(
    name: &'static str,
    limiter: L,
    keys: Vec<K>,
    verdict: Verdict,
) -> Timed {
    prime(&limiter, &keys, verdict);
    let mut i = 0;
    let run = move || {
        let start = Instant::now();
        for _ in 0..BATCH {
            black_box(limiter.check(black_box(&keys[i])));
            i += 1;
            if i == keys.len() {
                i = 0;
            }
        }
        start.elapsed().as_secs_f64() * 1e9 / BATCH as f64
    };
    (name, Box::new(run))
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs.get(xs.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The ratio on a busy machine: every limiter of a case runs `BATCH` checks in turn (the
/// order rotating each round), `ROUNDS` times, and each round gives one ours/reference
/// ratio; the median of those ratios is printed. Load that drifts over seconds hits both
/// sides of a ratio alike, unlike criterion's one-benchmark-after-another runs.
fn interleaved() {
    println!();
    println!(
        "interleaved: {ROUNDS} rounds x {BATCH} checks per limiter; median ns per check and \
         median of per-round ratios"
    );
    println!(
        "{:<16} {:<16} {:>8} {:<22} {:>8} {:>7}",
        "case", "ours", "ns", "reference", "ns", "ratio"
    );
    for case in &CASES {
        let v = case.verdict;
        let (u64s, ips) = (u64_keys(case.keys), ips(case.keys));
        let keys: Vec<Key> = ips.iter().copied().map(Key::Ip).collect();
        let mut limiters: Vec<Timed> = vec![
            timed(
                "governor/u64",
                governor_default(v.governor()),
                u64s.clone(),
                v,
            ),
            timed("ratekeeper/u64", Ours::new(v.ours()), u64s.clone(), v),
            timed("governor/IpAddr", governor_default(v.governor()), ips, v),
            timed("ratekeeper/Key", Ours::new(v.ours()), keys, v),
            timed(
                "governor+foldhash/u64",
                governor_foldhash(v.governor()),
                u64s,
                v,
            ),
        ];
        let mut ns: Vec<Vec<f64>> = vec![Vec::new(); limiters.len()];
        for round in 0..ROUNDS {
            let n = limiters.len();
            for j in 0..n {
                let k = (j + round) % n;
                if let (Some((_, run)), Some(out)) = (limiters.get_mut(k), ns.get_mut(k)) {
                    out.push(run());
                }
            }
        }
        let index = |name: &str| limiters.iter().position(|(n, _)| *n == name);
        for (ours, reference) in PAIRS {
            let (Some(a), Some(b)) = (index(ours), index(reference)) else {
                continue;
            };
            let ratios = ns[a].iter().zip(&ns[b]).map(|(x, y)| x / y).collect();
            println!(
                "{:<16} {ours:<16} {:>8.2} {reference:<22} {:>8.2} {:>7.3}",
                case.group_name(),
                median(ns[a].clone()),
                median(ns[b].clone()),
                median(ratios)
            );
        }
    }
}

/// Criterion's output directory, found the way criterion finds it.
fn criterion_dir() -> PathBuf {
    if let Some(home) = std::env::var_os("CRITERION_HOME") {
        return PathBuf::from(home);
    }
    if let Some(target) = std::env::var_os("CARGO_TARGET_DIR") {
        return Path::new(&target).join("criterion");
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/criterion")
}

/// The median (ns per check) criterion wrote for `group/name` during this run.
fn median_ns(dir: &Path, group: &str, name: &str, since: SystemTime) -> Option<f64> {
    let path = dir
        .join(group.replace('/', "_"))
        .join(name.replace('/', "_"))
        .join("new/estimates.json");
    let fresh = std::fs::metadata(&path).ok()?.modified().ok()? >= since;
    if !fresh {
        return None;
    }
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).ok()?).ok()?;
    json["median"]["point_estimate"].as_f64()
}

fn print_ratios(since: SystemTime) {
    let dir = criterion_dir();
    let mut rows = Vec::new();
    for case in &CASES {
        let group = case.group_name();
        for (ours, reference) in PAIRS {
            if let (Some(a), Some(b)) = (
                median_ns(&dir, &group, ours, since),
                median_ns(&dir, &group, reference, since),
            ) {
                rows.push(format!(
                    "{group:<16} {ours:<16} {a:>8.2} {reference:<22} {b:>8.2} {:>7.3}",
                    a / b
                ));
            }
        }
    }
    if rows.is_empty() {
        return;
    }
    println!();
    println!("criterion medians (ours / reference; < 1.0 means ratekeeper is faster)");
    println!(
        "{:<16} {:<16} {:>8} {:<22} {:>8} {:>7}",
        "case", "ours", "ns", "reference", "ns", "ratio"
    );
    for row in rows {
        println!("{row}");
    }
}

/// The checks callgrind counts (`--toggle-collect=*measured_loop*`): setup is excluded.
#[inline(never)]
fn measured_loop<K, L: Limiter<K>>(l: &L, keys: &[K], iters: usize) -> usize {
    let (mut allowed, mut i) = (0usize, 0usize);
    for _ in 0..iters {
        allowed += usize::from(l.check(black_box(&keys[i])));
        i += 1;
        if i == keys.len() {
            i = 0;
        }
    }
    allowed
}

/// Callgrind mode: one case, a fixed number of checks, no criterion.
fn run_fixed(case: &str, iters: usize) {
    let Some((group, limiter)) = case.split_once('/') else {
        panic!("RK_BENCH_CASE must be <allow|deny>-<hot|many>/<limiter>, got {case}");
    };
    let (verdict, n) = match group {
        "allow-hot" => (Verdict::Allow, 1),
        "allow-many" => (Verdict::Allow, MANY),
        "deny-hot" => (Verdict::Deny, 1),
        "deny-many" => (Verdict::Deny, MANY),
        _ => panic!("unknown group {group}"),
    };
    // Priming checks each key 17 times at most; the rest of the burst is the measured loop's.
    let per_key = iters.div_ceil(n) + 17;
    if verdict == Verdict::Allow && per_key >= FIXED_ALLOW_BURST as usize {
        panic!("RK_BENCH_ITERS={iters} checks a key more than the burst allows");
    }
    fn go<K, L: Limiter<K>>(l: &L, keys: &[K], verdict: Verdict, iters: usize) {
        let start = Instant::now();
        prime(l, keys, verdict);
        let allowed = measured_loop(l, keys, iters);
        // An allow run shorter than one emission interval never lets a key go idle.
        if verdict == Verdict::Allow && start.elapsed() >= FIXED_ALLOW_PERIOD {
            panic!("the run took an hour or more: keys may have gone idle and been swept");
        }
        println!("{allowed} of {iters} allowed");
    }
    let (ours, gov) = (verdict.ours_fixed(), verdict.governor_fixed());
    match limiter {
        "ratekeeper-u64" => go(&Ours::new(ours), &u64_keys(n), verdict, iters),
        "ratekeeper-Key" => {
            let keys: Vec<Key> = ips(n).into_iter().map(Key::Ip).collect();
            go(&Ours::new(ours), &keys, verdict, iters);
        }
        "ratekeeper-api" => go(&Ours::new(ours), &api_keys(n), verdict, iters),
        "ratekeeper-Key-2policies" => {
            let keys: Vec<Key> = ips(n).into_iter().map(Key::Ip).collect();
            go(&OursTwo::new(ours), &keys, verdict, iters);
        }
        "governor-u64" => go(&governor_default(gov), &u64_keys(n), verdict, iters),
        "governor-IpAddr" => go(&governor_default(gov), &ips(n), verdict, iters),
        "governor+foldhash-u64" => go(&governor_foldhash(gov), &u64_keys(n), verdict, iters),
        _ => panic!("unknown limiter {limiter}"),
    }
}

fn main() {
    if let (Ok(case), Ok(iters)) = (
        std::env::var("RK_BENCH_CASE"),
        std::env::var("RK_BENCH_ITERS"),
    ) {
        let iters = iters.parse().unwrap_or(0);
        run_fixed(&case, iters);
        return;
    }
    if std::env::var_os("RK_BENCH_INTERLEAVED_ONLY").is_some() {
        interleaved();
        return;
    }
    let start = SystemTime::now();
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    for case in &CASES {
        case.run(&mut c);
    }
    c.final_summary();
    print_ratios(start);
    if std::env::args().any(|a| a == "--bench") {
        interleaved();
    }
}
