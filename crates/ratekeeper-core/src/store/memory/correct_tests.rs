//! Unit tests of corrections in the memory store (`Store::correct`): for every algorithm, a
//! give-back is exact, an extra charge is forced and later requests wait out exactly the
//! debt, a later charge's receipt is unaffected, a give-back after the charge expired gives
//! nothing; and property tests: after every correction the units used equal the sum of the
//! true costs, and the units admitted beyond the quota stay within the stated bound.

use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::clock::ManualClock;
use crate::{Algorithm, Key, Quota};

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000 * MS;

/// The algorithms that charge units (the concurrency counter counts permits).
const METERED: [Algorithm; 5] = [
    Algorithm::Gcra,
    Algorithm::LeakyBucket,
    Algorithm::FixedWindow,
    Algorithm::SlidingWindow,
    Algorithm::SlidingLog,
];

type Mem = MemoryStore<Key, ManualClock>;

/// A store with one policy of `algorithm`: `limit` units per `secs` seconds (burst
/// `limit`), and its clock.
fn store(algorithm: Algorithm, limit: u32, secs: u64) -> (Mem, PolicyId, ManualClock) {
    let clock = ManualClock::new();
    let mut s = MemoryStore::with_clock(clock.clone());
    let quota = Quota::new(limit, Duration::from_secs(secs)).unwrap();
    let p = s
        .register(&Policy::new("p", quota).with_algorithm(algorithm))
        .unwrap();
    (s, p, clock)
}

fn remaining(s: &Mem, p: PolicyId, k: &Key) -> u32 {
    s.check_now(&[Charge::new(p, k, 0)]).unwrap().as_slice()[0].remaining()
}

/// Charges `cost` and returns the correction of it to `actual`.
fn charged<'k>(s: &Mem, p: PolicyId, k: &'k Key, cost: u64, actual: u64) -> Correction<'k, Key> {
    let charge = Charge::new(p, k, cost);
    let d = s.check_now(&[charge]).unwrap();
    assert!(d.is_allowed(), "{d:?}");
    Correction::new(charge, d.receipt(0), actual)
}

/// An estimate of 6 corrected to 2 gives back exactly 4, on every algorithm (10 per 10 s).
#[test]
fn a_lower_true_cost_gives_back_exactly_the_difference() {
    for algorithm in Algorithm::ALL {
        let (s, p, clock) = store(algorithm, 10, 10);
        let k = Key::from("client");
        clock.set(SEC);
        let c = charged(&s, p, &k, 6, 2);
        assert_eq!(remaining(&s, p, &k), 4, "{algorithm}");
        s.correct(&[c]);
        assert_eq!(remaining(&s, p, &k), 8, "{algorithm}");
        // A true cost equal to the estimate changes nothing.
        let same = charged(&s, p, &k, 3, 3);
        s.correct(&[same]);
        assert_eq!(remaining(&s, p, &k), 5, "{algorithm}");
    }
}

/// An estimate of 2 at t = 0 corrected to 13 at t = 2 s (10 per 10 s): the 11 extra units
/// are charged although they do not fit (3 units of debt), and a request of 1 then waits
/// exactly what the debt makes it wait under each algorithm.
#[test]
fn a_higher_true_cost_is_charged_without_refusal_and_the_debt_is_waited_out() {
    let wait_of = |algorithm| {
        let (s, p, clock) = store(algorithm, 10, 10);
        let k = Key::from("client");
        let c = charged(&s, p, &k, 2, 13);
        clock.set(2 * SEC);
        s.correct(&[c]);
        clock.set(3 * SEC);
        let d = s.check_now(&[Charge::new(p, &k, 1)]).unwrap();
        assert_eq!(d.as_slice()[0].remaining(), 0, "{algorithm}");
        d.retry_after().expect("refused while in debt")
    };
    // T = 1 s: the correction at 2 s leaves TAT = 2 s + 11 s = 13 s, one unit beyond
    // now + tau; at 3 s the bucket is exactly full, and a unit passes at 14 - 10 = 4 s.
    assert_eq!(wait_of(Algorithm::Gcra), Duration::from_secs(1));
    assert_eq!(wait_of(Algorithm::LeakyBucket), Duration::from_secs(1));
    // The window holds 13: full until it ends at 10 s.
    assert_eq!(wait_of(Algorithm::FixedWindow), Duration::from_secs(7));
    // The next window starts with previous = 13 (not 10): one unit fits once
    // 13 * (1 - e) + 1 <= 10, e >= 1 - 9/13 of the window: 7 s + (10 s - 90 s / 13).
    assert_eq!(
        wait_of(Algorithm::SlidingWindow),
        Duration::from_nanos(7 * SEC + (10 * SEC - 90 * SEC / 13))
    );
    // 13 live units: the 2 of t = 0 leave at 10 s, the 11 of t = 2 s at 12 s; 4 must leave.
    assert_eq!(wait_of(Algorithm::SlidingLog), Duration::from_secs(9));
}

/// The debt is exact for the token bucket: without it a unit would pass at once. With a
/// smaller debt the wait is smaller by exactly `T` per unit (GCRA, 10 per 10 s, at t = 0).
#[test]
fn each_unit_of_debt_waits_one_emission_interval() {
    for algorithm in [Algorithm::Gcra, Algorithm::LeakyBucket] {
        for debt in 0..5u64 {
            let (s, p, _clock) = store(algorithm, 10, 10);
            let k = Key::Global;
            let c = charged(&s, p, &k, 10, 10 + debt);
            s.correct(&[c]);
            let d = s.check_now(&[Charge::new(p, &k, 1)]).unwrap();
            assert_eq!(
                d.retry_after(),
                Some(Duration::from_secs(debt + 1)),
                "{algorithm}, debt {debt}"
            );
        }
    }
}

/// The leaky-bucket shaper (the Delay mode's reservation) waits the debt out exactly too: a
/// bucket 3 units beyond its depth refuses a unit for 4 T, and queues it after that.
#[test]
fn the_shaper_waits_out_a_debt() {
    let (s, p, clock) = store(Algorithm::LeakyBucket, 10, 10);
    let k = Key::Global;
    let c = charged(&s, p, &k, 10, 13);
    s.correct(&[c]);
    let one = [Charge::new(p, &k, 1)];
    let d = s.reserve_now(&one, Duration::from_secs(60)).unwrap();
    assert!(!d.is_allowed());
    assert_eq!(d.retry_after(), Some(Duration::from_secs(4)));
    clock.set(4 * SEC);
    let d = s.reserve_now(&one, Duration::from_secs(60)).unwrap();
    assert!(d.is_allowed(), "{d:?}");
    // Queued behind the 9 units still in the bucket (TAT 13 s at 4 s): 9 s.
    assert_eq!(d.delay(), Duration::from_secs(9));
}

/// A correction between a later charge and its refund leaves the later charge's receipt
/// good: refunding it gives back exactly its units, on every algorithm.
#[test]
fn a_correction_leaves_later_receipts_good() {
    for algorithm in METERED {
        // 20 per 10 s, at one instant.
        let (s, p, _clock) = store(algorithm, 20, 10);
        let k = Key::from("client");
        let first = charged(&s, p, &k, 4, 9);
        let later = charged(&s, p, &k, 3, 3);
        s.correct(&[first]);
        assert_eq!(remaining(&s, p, &k), 8, "{algorithm}");
        s.refund(&[Refund::new(later.charge, later.receipt)]);
        assert_eq!(remaining(&s, p, &k), 11, "{algorithm}");
    }
}

/// A give-back that arrives after its charge no longer counts (the window closed, the log
/// entry expired, the bucket drained it) gives back nothing, and never frees units charged
/// since (10 per 10 s).
#[test]
fn a_give_back_after_the_charge_expired_gives_nothing() {
    for algorithm in METERED {
        let (s, p, clock) = store(algorithm, 10, 10);
        let k = Key::from("client");
        clock.set(9 * SEC);
        let old = charged(&s, p, &k, 5, 0);
        // Long after: the old charge counts for nothing, a new one holds 7.
        clock.set(40 * SEC);
        let _new = charged(&s, p, &k, 7, 7);
        s.correct(&[old]);
        assert_eq!(remaining(&s, p, &k), 3, "{algorithm}");
    }
    // Fixed window, at the next window's start: nothing comes back either.
    let (s, p, clock) = store(Algorithm::FixedWindow, 10, 10);
    let k = Key::Global;
    clock.set(9 * SEC);
    let old = charged(&s, p, &k, 5, 0);
    clock.set(10 * SEC);
    let _new = charged(&s, p, &k, 7, 7);
    s.correct(&[old]);
    assert_eq!(remaining(&s, p, &k), 3);
}

/// A give-back pays off a debt left by another correction (token bucket: a TAT beyond the
/// tolerance is a debt, not a waiting reservation; windows: a count above the limit is kept
/// whole, not read as the limit), and the key ends exactly as full as the true costs say.
#[test]
fn a_give_back_pays_off_a_debt() {
    for algorithm in METERED {
        // 20 per hour, at one instant: nothing refills.
        let (s, p, _clock) = store(algorithm, 20, 3_600);
        let k = Key::Global;
        let a = charged(&s, p, &k, 5, 1);
        let b = charged(&s, p, &k, 5, 16);
        let c = charged(&s, p, &k, 10, 0);
        // b first: 31 units used, 11 of debt.
        s.correct(&[b]);
        assert_eq!(remaining(&s, p, &k), 0, "{algorithm}");
        s.correct(&[a]);
        // 27 used: still 7 of debt, so a unit is refused.
        assert!(!s.check_now(&[Charge::new(p, &k, 1)]).unwrap().is_allowed());
        s.correct(&[c]);
        // 17 used: 1 + 16 + 0.
        assert_eq!(remaining(&s, p, &k), 3, "{algorithm}");
    }
}

/// The concurrency counter: a correction of a permit count only gives back; an extra
/// charge is nothing (a permit is a permit).
#[test]
fn concurrency_corrections_only_give_back() {
    let (s, p, _clock) = store(Algorithm::Concurrency, 10, 1);
    let k = Key::Global;
    let c = charged(&s, p, &k, 4, 9);
    s.correct(&[c]);
    assert_eq!(remaining(&s, p, &k), 6);
    let c = charged(&s, p, &k, 4, 1);
    s.correct(&[c]);
    assert_eq!(remaining(&s, p, &k), 5);
}

/// An extra charge on a key that holds no state of its own (its charge was long drained and
/// the key swept) is still charged: it lands on the key's new state.
#[test]
fn an_extra_charge_lands_on_a_swept_key() {
    for algorithm in METERED {
        let (s, p, clock) = store(algorithm, 10, 10);
        let k = Key::from("client");
        let c = charged(&s, p, &k, 1, 4);
        clock.set(100 * SEC);
        s.sweep();
        assert!(!s.holds(p, &k), "{algorithm}");
        s.correct(&[c]);
        assert_eq!(remaining(&s, p, &k), 7, "{algorithm}");
    }
}

/// Corrections of a charge on the shared overflow state go back to (and are charged on)
/// the overflow state.
#[test]
fn corrections_of_overflowed_charges_stay_on_the_overflow_state() {
    let clock = ManualClock::new();
    let mut s = MemoryStore::<Key, _>::with_clock(clock.clone())
        .with_max_keys(std::num::NonZeroUsize::new(1).unwrap());
    let p = s
        .register(&Policy::new(
            "p",
            Quota::new(10, Duration::from_secs(3_600)).unwrap(),
        ))
        .unwrap();
    let (a, b) = (Key::from("a"), Key::from("b"));
    let _held = charged(&s, p, &a, 1, 1);
    let over = charged(&s, p, &b, 6, 2);
    assert!(!s.holds(p, &b));
    assert_eq!(remaining(&s, p, &b), 4);
    s.correct(&[over]);
    assert_eq!(remaining(&s, p, &b), 8);
    assert_eq!(remaining(&s, p, &a), 9);
}

/// A store with only the required methods (the memory store's), so `correct` is the
/// trait's default.
struct Plain(Mem);

impl Store<Key> for Plain {
    type Future = std::future::Ready<Result<Decisions, StoreError>>;

    fn register(&mut self, policy: &Policy) -> Result<PolicyId, StoreError> {
        self.0.register(policy)
    }
    fn check(&self, charges: &[Charge<'_, Key>]) -> Checked<Self::Future> {
        self.0.check(charges)
    }
    fn refund(&self, refunds: &[Refund<'_, Key>]) {
        self.0.refund(refunds);
    }
}

/// The default `correct`: a give-back is a refund of the difference; an extra charge is a
/// check, charged when it fits and lost when it does not (GCRA, 10 per hour, frozen).
#[test]
fn the_default_correct_refunds_and_checks() {
    let (s, p, _clock) = store(Algorithm::Gcra, 10, 3_600);
    let s = Plain(s);
    let k = Key::Global;
    let first = charged(&s.0, p, &k, 6, 2);
    s.correct(&[first]);
    assert_eq!(remaining(&s.0, p, &k), 8);
    let second = charged(&s.0, p, &k, 2, 7);
    s.correct(&[second]);
    assert_eq!(remaining(&s.0, p, &k), 1);
    let third = charged(&s.0, p, &k, 1, 3);
    s.correct(&[third]);
    // The 2 extra units did not fit in the 0 left: lost, so the bucket holds exactly 10
    // (T = 360 s: the next unit waits one T, not three).
    let d = s.0.check_now(&[Charge::new(p, &k, 1)]).unwrap();
    assert_eq!(d.retry_after(), Some(Duration::from_secs(360)));
}

/// Four threads charge and correct 200 requests each on one key at once (the clock frozen,
/// nothing refills, the quota holds them all): the compare-and-swap and locked paths of
/// every algorithm lose no correction, so the key ends using the sum of the true costs.
#[test]
fn concurrent_corrections_leave_the_sum_of_true_costs() {
    const THREADS: u64 = 4;
    const EACH: u64 = 200;
    for algorithm in METERED {
        let capacity = u32::try_from(THREADS * EACH * (8 + 16)).unwrap();
        let (s, p, clock) = store(algorithm, capacity, 3_600);
        clock.set(1_800 * SEC);
        let k = Key::from("client");
        let totals: Vec<u64> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..THREADS)
                .map(|t| {
                    let (s, k) = (&s, &k);
                    scope.spawn(move || {
                        let mut total = 0;
                        let mut open = Vec::new();
                        for i in 0..EACH {
                            let (estimate, actual) = (1 + (i * 7 + t) % 8, (i * 13 + t * 5) % 17);
                            open.push(charged(s, p, k, estimate, actual));
                            total += actual;
                            // Correct in batches, latest first, while others charge.
                            if i % 3 == 2 {
                                s.correct(&open);
                                open.clear();
                            }
                        }
                        s.correct(&open);
                        total
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let used = u64::from(capacity - remaining(&s, p, &k));
        assert_eq!(used, totals.iter().sum::<u64>(), "{algorithm}");
    }
}

/// One request of a simulated run: its estimate and its true cost.
#[derive(Debug, Clone, Copy)]
struct Request {
    estimate: u64,
    actual: u64,
}

/// `n` requests with estimates in `1..=max_estimate` and true costs in `0..=max_actual`,
/// and an interleaving of their starts and ends: each request index appears twice, its
/// first appearance is its start (the charge), its second its end (the correction).
fn run_strategy(
    n: usize,
    max_estimate: u64,
    max_actual: u64,
) -> impl Strategy<Value = (Vec<Request>, Vec<usize>)> {
    let requests = prop::collection::vec(
        (1..=max_estimate, 0..=max_actual)
            .prop_map(|(estimate, actual)| Request { estimate, actual }),
        n,
    );
    let order = Just((0..n).flat_map(|i| [i, i]).collect::<Vec<_>>()).prop_shuffle();
    (requests, order)
}

/// What a run admitted.
struct Run {
    /// The true costs of the admitted requests, summed.
    admitted_actual: u64,
    /// The most requests in flight (charged, not yet corrected) at once.
    most_in_flight: u64,
}

/// Runs `requests` in `order` on one key at one instant (a frozen clock: nothing refills,
/// so the quota's capacity is all there is).
fn simulate(s: &Mem, p: PolicyId, k: &Key, requests: &[Request], order: &[usize]) -> Run {
    let mut started = vec![false; requests.len()];
    let mut open: Vec<Option<Correction<'_, Key>>> = vec![None; requests.len()];
    let mut run = Run {
        admitted_actual: 0,
        most_in_flight: 0,
    };
    let mut in_flight = 0u64;
    for &i in order {
        let r = requests[i];
        if !started[i] {
            started[i] = true;
            let charge = Charge::new(p, k, r.estimate);
            let d = s.check_now(&[charge]).unwrap();
            if d.is_allowed() {
                open[i] = Some(Correction::new(charge, d.receipt(0), r.actual));
                in_flight += 1;
                run.most_in_flight = run.most_in_flight.max(in_flight);
                run.admitted_actual += r.actual;
            }
        } else if let Some(c) = open[i].take() {
            s.correct(&[c]);
            in_flight -= 1;
        }
    }
    run
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    /// 60 requests on one key, started and corrected in a random interleaving, on a quota
    /// that never refills during the run and holds them all: after every correction the
    /// units the key uses (capacity - remaining) equal the sum of the true costs.
    #[test]
    fn after_all_corrections_the_units_used_are_the_true_costs(
        (requests, order) in run_strategy(60, 40, 80),
        algorithm in prop::sample::select(METERED.to_vec()),
    ) {
        let capacity = 60 * 80 + 60 * 40;
        let (s, p, clock) = store(algorithm, capacity, 3_600);
        clock.set(1_800 * SEC);
        let k = Key::from("client");
        let run = simulate(&s, p, &k, &requests, &order);
        let total: u64 = requests.iter().map(|r| r.actual).sum();
        prop_assert_eq!(run.admitted_actual, total);
        let used = u64::from(capacity - remaining(&s, p, &k));
        prop_assert_eq!(used, total, "{}", algorithm);
    }

    /// 40 requests on a quota of 100 that never refills during the run, so that estimates
    /// are refused and corrections leave debts: the true costs admitted stay within the
    /// quota plus `R × C` (`R` the most requests in flight, `C` the largest extra charge),
    /// and within the quota alone when every estimate is an upper bound.
    #[test]
    fn units_admitted_beyond_the_quota_stay_within_in_flight_times_largest_correction(
        (requests, order) in run_strategy(40, 20, 30),
        algorithm in prop::sample::select(METERED.to_vec()),
        upper_bounds in any::<bool>(),
    ) {
        let requests: Vec<Request> = requests
            .into_iter()
            .map(|r| if upper_bounds {
                Request { estimate: r.estimate.max(r.actual).min(20), actual: r.actual.min(20) }
            } else {
                r
            })
            .collect();
        let (s, p, clock) = store(algorithm, 100, 3_600);
        clock.set(1_800 * SEC);
        let k = Key::Global;
        let run = simulate(&s, p, &k, &requests, &order);
        let largest = requests
            .iter()
            .map(|r| r.actual.saturating_sub(r.estimate))
            .max()
            .unwrap_or(0);
        prop_assert!(
            run.admitted_actual <= 100 + run.most_in_flight * largest,
            "{}: {} admitted, {} in flight, largest extra {}",
            algorithm, run.admitted_actual, run.most_in_flight, largest
        );
        if upper_bounds {
            prop_assert!(run.admitted_actual <= 100, "{}", run.admitted_actual);
        }
    }

    /// The token bucket's debt is exact: after a random run on a tight quota, the time a
    /// unit waits shows the TAT, which is the sum of the admitted requests' true costs.
    #[test]
    fn token_bucket_debt_equals_the_true_costs_beyond_the_burst(
        (requests, order) in run_strategy(30, 10, 25),
        algorithm in prop::sample::select(vec![Algorithm::Gcra, Algorithm::LeakyBucket]),
    ) {
        // 50 per 50 s: T = 1 s, tau = 50 s; the clock is frozen at 0.
        let (s, p, _clock) = store(algorithm, 50, 50);
        let k = Key::Global;
        let run = simulate(&s, p, &k, &requests, &order);
        let left = remaining(&s, p, &k);
        let used = if left > 0 {
            50 - u64::from(left)
        } else {
            // Refused: TAT + T - tau = retry_after, so TAT / T = retry_after + tau - T.
            let d = s.check_now(&[Charge::new(p, &k, 1)]).unwrap();
            let wait = d.retry_after().expect("a full bucket refuses");
            prop_assert_eq!(wait.subsec_nanos(), 0);
            wait.as_secs() + 50 - 1
        };
        prop_assert_eq!(used, run.admitted_actual);
    }
}
