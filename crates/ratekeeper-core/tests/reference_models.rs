//! Every algorithm against a plain reference model, decision by decision, on random traces
//! (times, costs, keys) run through the memory store; and the meaning of `remaining`,
//! `reset_after` and `retry_after` (see `Decision`) checked on the models by brute force.

use std::collections::HashMap;
use std::time::Duration;

use proptest::prelude::*;
use ratekeeper_core::algorithm::{Concurrency, LeakyBucket, SlidingLog, SlidingLogState};
use ratekeeper_core::clock::ManualClock;
use ratekeeper_core::store::{Charge, MemoryStore, PolicyId, Receipt, Refund, Store};
use ratekeeper_core::{Algorithm, Decision, Key, Outcome, Policy, Quota};

/// A reference model: the simplest code that is obviously right. `decide` is derived from
/// these primitives in one generic function, and `remaining` is computed by trying cost-1
/// requests one by one.
trait Model: Clone + std::fmt::Debug {
    fn new(q: &Quota) -> Self;
    fn capacity(&self) -> u64;
    fn limit(&self) -> u32;
    /// Whether `cost` fits at `now` (`now` never goes back).
    fn fits(&self, now: u64, cost: u64) -> bool;
    fn charge(&mut self, now: u64, cost: u64);
    /// Time until the state equals "absent".
    fn reset_after(&self, now: u64) -> u64;
    /// Smallest d > 0 with `fits(now + d, cost)` (only called when `cost <= capacity`).
    fn retry_after(&self, now: u64, cost: u64) -> u64;
    fn is_absent(&self, now: u64) -> bool;
    /// Whether this model can judge a refund at `now` of a charge whose receipt stamp is
    /// `stamp`. The bucket models only judge stale receipts (a charge the bucket drained,
    /// `stamp <= now`), which give back nothing; the event models judge every refund.
    fn judges(&self, now: u64, stamp: u64) -> bool {
        stamp <= now
    }
    /// Gives back the charge of `cost` made at `at`, as far as it still counts at `now`.
    /// The default is for stale receipts: nothing.
    fn refund(&mut self, now: u64, at: u64, cost: u64) {
        let _ = (now, at, cost);
    }
}

fn model_decide<M: Model>(m: &mut M, now: u64, cost: u64) -> Decision {
    let outcome = if cost > m.capacity() {
        Outcome::CannotFit
    } else if cost == 0 {
        Outcome::Allowed
    } else if m.fits(now, cost) {
        m.charge(now, cost);
        Outcome::Allowed
    } else {
        Outcome::Denied {
            retry_after: Duration::from_nanos(m.retry_after(now, cost)),
        }
    };
    let mut probe = m.clone();
    let mut remaining = 0;
    while probe.fits(now, 1) {
        probe.charge(now, 1);
        remaining += 1;
    }
    Decision::new(
        outcome,
        m.limit(),
        remaining,
        Duration::from_nanos(m.reset_after(now)),
    )
}

fn model_peek<M: Model>(m: &M, now: u64, cost: u64) -> Decision {
    let d = model_decide(&mut m.clone(), now, cost);
    let state = model_decide(&mut m.clone(), now, 0);
    Decision::new(
        d.outcome(),
        d.limit(),
        state.remaining(),
        state.reset_after(),
    )
}

/// `Decision`'s meaning on the model: retry_after is exact, reset_after is the time to "absent",
/// remaining never exceeds the capacity.
fn check_semantics<M: Model>(m: &M, d: &Decision, now: u64, cost: u64) {
    assert!(u64::from(d.remaining()) <= m.capacity());
    // The advertised quota bounds Remaining.
    assert!(d.remaining() <= d.limit(), "remaining above limit: {d:?}");
    if let Some(r) = d.retry_after() {
        let r = u64::try_from(r.as_nanos()).unwrap();
        assert!(r > 0, "retry_after 0 on a denial");
        assert!(m.fits(now + r, cost), "not admitted at now + retry_after");
        assert!(!m.fits(now + r - 1, cost), "admitted before retry_after");
    }
    let reset = u64::try_from(d.reset_after().as_nanos()).unwrap();
    assert!(m.is_absent(now + reset), "not absent at now + reset_after");
    if reset > 0 {
        assert!(!m.is_absent(now + reset - 1), "absent before reset_after");
    }
}

/// Token bucket with the level in ns of credit (`tokens * T`), refilled 1 ns per ns up to
/// `tau = burst * T`: the textbook formulation GCRA must agree with.
#[derive(Clone, Debug)]
struct TokenBucket {
    t: u64,
    tau: u64,
    burst: u64,
    limit: u32,
    level: u64,
    last: u64,
}

impl TokenBucket {
    fn level_at(&self, now: u64) -> u64 {
        (self.level + (now - self.last)).min(self.tau)
    }
}

impl Model for TokenBucket {
    fn new(q: &Quota) -> Self {
        let t = q.emission_interval_nanos();
        let tau = t * u64::from(q.burst());
        Self {
            t,
            tau,
            burst: q.burst().into(),
            // The advertised limit of the token-bucket family is the capacity.
            limit: q.burst(),
            level: tau,
            last: 0,
        }
    }
    fn capacity(&self) -> u64 {
        self.burst
    }
    fn limit(&self) -> u32 {
        self.limit
    }
    fn fits(&self, now: u64, cost: u64) -> bool {
        self.level_at(now) >= cost * self.t
    }
    fn charge(&mut self, now: u64, cost: u64) {
        self.level = self.level_at(now) - cost * self.t;
        self.last = now;
    }
    fn reset_after(&self, now: u64) -> u64 {
        self.tau - self.level_at(now)
    }
    fn retry_after(&self, now: u64, cost: u64) -> u64 {
        cost * self.t - self.level_at(now)
    }
    fn is_absent(&self, now: u64) -> bool {
        self.level_at(now) == self.tau
    }
}

/// Leaky bucket as water: `water` ns of queued work drains 1 ns per ns; capacity `tau`.
#[derive(Clone, Debug)]
struct Water {
    t: u64,
    tau: u64,
    burst: u64,
    limit: u32,
    water: u64,
    last: u64,
}

impl Water {
    fn water_at(&self, now: u64) -> u64 {
        self.water.saturating_sub(now - self.last)
    }
}

impl Model for Water {
    fn new(q: &Quota) -> Self {
        let t = q.emission_interval_nanos();
        Self {
            t,
            tau: t * u64::from(q.burst()),
            burst: q.burst().into(),
            // The advertised limit of the token-bucket family is the capacity.
            limit: q.burst(),
            water: 0,
            last: 0,
        }
    }
    fn capacity(&self) -> u64 {
        self.burst
    }
    fn limit(&self) -> u32 {
        self.limit
    }
    fn fits(&self, now: u64, cost: u64) -> bool {
        self.water_at(now) + cost * self.t <= self.tau
    }
    fn charge(&mut self, now: u64, cost: u64) {
        self.water = self.water_at(now) + cost * self.t;
        self.last = now;
    }
    fn reset_after(&self, now: u64) -> u64 {
        self.water_at(now)
    }
    fn retry_after(&self, now: u64, cost: u64) -> u64 {
        self.water_at(now) + cost * self.t - self.tau
    }
    fn is_absent(&self, now: u64) -> bool {
        self.water_at(now) == 0
    }
}

/// Every admitted event `(time, cost)`, kept for ever.
#[derive(Clone, Debug)]
struct Events {
    w: u64,
    limit: u32,
    events: Vec<(u64, u64)>,
}

impl Events {
    fn new(q: &Quota) -> Self {
        Self {
            w: q.period_nanos(),
            limit: q.limit(),
            events: Vec::new(),
        }
    }
    /// Takes `cost` units off the charge made at `at` (each charge is refunded at most once,
    /// with its own cost).
    /// Gives back `cost` units charged at `at`. Units charged at one instant are one count
    /// (as in every store), so they come from the events at `at` together: two charges of 8
    /// and 1 at the same time, refunded 1 then 8, leave nothing.
    fn take(&mut self, at: u64, cost: u64) {
        let mut left = cost;
        for e in self.events.iter_mut().filter(|e| e.0 == at) {
            let n = e.1.min(left);
            e.1 -= n;
            left -= n;
        }
    }
    fn sum(&self, pred: impl Fn(u64) -> bool) -> u64 {
        self.events
            .iter()
            .filter(|(t, _)| pred(*t))
            .map(|(_, n)| n)
            .sum()
    }
}

/// Fixed window: the units of the events in the same aligned window `[iW, (i+1)W)`.
#[derive(Clone, Debug)]
struct Fixed(Events);

impl Model for Fixed {
    fn new(q: &Quota) -> Self {
        Self(Events::new(q))
    }
    fn capacity(&self) -> u64 {
        self.0.limit.into()
    }
    fn limit(&self) -> u32 {
        self.0.limit
    }
    fn fits(&self, now: u64, cost: u64) -> bool {
        let w = self.0.w;
        self.0.sum(|t| t / w == now / w) + cost <= u64::from(self.0.limit)
    }
    fn charge(&mut self, now: u64, cost: u64) {
        self.0.events.push((now, cost));
    }
    fn reset_after(&self, now: u64) -> u64 {
        if self.is_absent(now) {
            0
        } else {
            (now / self.0.w + 1) * self.0.w - now
        }
    }
    fn retry_after(&self, now: u64, _cost: u64) -> u64 {
        (now / self.0.w + 1) * self.0.w - now
    }
    fn is_absent(&self, now: u64) -> bool {
        let w = self.0.w;
        self.0.sum(|t| t / w == now / w) == 0
    }
    fn judges(&self, _now: u64, _stamp: u64) -> bool {
        true
    }
    /// Only in the window the charge counted in.
    fn refund(&mut self, now: u64, at: u64, cost: u64) {
        if at / self.0.w == now / self.0.w {
            self.0.take(at, cost);
        }
    }
}

/// Sliding log: the units of the events in `(now - W, now]`.
#[derive(Clone, Debug)]
struct Log(Events);

impl Log {
    fn used(&self, now: u64) -> u64 {
        let w = self.0.w;
        self.0.sum(|t| t + w > now)
    }
}

impl Model for Log {
    fn new(q: &Quota) -> Self {
        Self(Events::new(q))
    }
    fn capacity(&self) -> u64 {
        self.0.limit.into()
    }
    fn limit(&self) -> u32 {
        self.0.limit
    }
    fn fits(&self, now: u64, cost: u64) -> bool {
        self.used(now) + cost <= u64::from(self.0.limit)
    }
    fn charge(&mut self, now: u64, cost: u64) {
        self.0.events.push((now, cost));
    }
    fn reset_after(&self, now: u64) -> u64 {
        let w = self.0.w;
        self.0
            .events
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(t, _)| (t + w).saturating_sub(now))
            .max()
            .unwrap_or(0)
    }
    fn retry_after(&self, now: u64, cost: u64) -> u64 {
        // Admission only changes when an entry leaves: try each departure time in order.
        let w = self.0.w;
        let mut departures: Vec<u64> = self
            .0
            .events
            .iter()
            .map(|(t, _)| t + w)
            .filter(|&d| d > now)
            .collect();
        departures.sort_unstable();
        departures
            .into_iter()
            .find(|&d| self.fits(d, cost))
            .map(|d| d - now)
            .unwrap()
    }
    fn is_absent(&self, now: u64) -> bool {
        self.used(now) == 0
    }
    fn judges(&self, _now: u64, _stamp: u64) -> bool {
        true
    }
    /// Only while the charge's entry has not expired.
    fn refund(&mut self, now: u64, at: u64, cost: u64) {
        if at + self.0.w > now {
            self.0.take(at, cost);
        }
    }
}

/// Sliding window counter: `prev * (W - e) / W + cur`, with brute-force waits.
#[derive(Clone, Debug)]
struct Counter(Events);

impl Counter {
    fn counts(&self, now: u64) -> (u64, u64, u64) {
        let w = self.0.w;
        let i = now / w;
        let cur = self.0.sum(|t| t / w == i);
        let prev = if i == 0 {
            0
        } else {
            self.0.sum(|t| t / w == i - 1)
        };
        (prev, cur, now - i * w)
    }
}

impl Model for Counter {
    fn new(q: &Quota) -> Self {
        Self(Events::new(q))
    }
    fn capacity(&self) -> u64 {
        self.0.limit.into()
    }
    fn limit(&self) -> u32 {
        self.0.limit
    }
    fn fits(&self, now: u64, cost: u64) -> bool {
        let (prev, cur, e) = self.counts(now);
        let w = u128::from(self.0.w);
        let est_w = u128::from(prev) * (w - u128::from(e)) + u128::from(cur + cost) * w;
        est_w <= u128::from(self.0.limit) * w
    }
    fn charge(&mut self, now: u64, cost: u64) {
        self.0.events.push((now, cost));
    }
    fn reset_after(&self, now: u64) -> u64 {
        (0..=2 * self.0.w)
            .find(|&d| self.is_absent(now + d))
            .unwrap()
    }
    fn retry_after(&self, now: u64, cost: u64) -> u64 {
        (1..=2 * self.0.w + 1)
            .find(|&d| self.fits(now + d, cost))
            .unwrap()
    }
    fn is_absent(&self, now: u64) -> bool {
        let (prev, cur, _) = self.counts(now);
        prev == 0 && cur == 0
    }
    fn judges(&self, _now: u64, _stamp: u64) -> bool {
        true
    }
    /// In the charge's window and the next (where the estimate still weighs it).
    fn refund(&mut self, now: u64, at: u64, cost: u64) {
        let (i, j) = (at / self.0.w, now / self.0.w);
        if i == j || i + 1 == j {
            self.0.take(at, cost);
        }
    }
}

#[derive(Debug, Clone)]
struct Step {
    key: u64,
    dt: u64,
    cost: u64,
    sweep: bool,
    /// Before the request, refund an earlier admitted charge (picked by this number).
    refund: Option<usize>,
}

fn steps(max_dt: u64, max_cost: u64) -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        (
            0..3u64,
            0..=max_dt,
            0..=max_cost,
            prop::bool::weighted(0.05),
            prop::option::weighted(0.3, any::<usize>()),
        )
            .prop_map(|(key, dt, cost, sweep, refund)| Step {
                key,
                dt,
                cost,
                sweep,
                refund,
            }),
        1..60,
    )
}

/// An admitted charge that may be refunded later.
struct Admitted {
    key: u64,
    at: u64,
    cost: u64,
    receipt: Receipt,
}

/// Runs `trace` through a memory store and a model per key; every decision must match.
/// Refunds in the trace give back earlier charges with their receipts (each at most once,
/// only those the model can judge), in the store and in the model.
fn compare<M: Model>(algorithm: Algorithm, quota: Quota, trace: &[Step]) {
    let clock = ManualClock::new();
    let mut store = MemoryStore::with_clock(clock.clone());
    let id = store
        .register(&Policy::new("p", quota).with_algorithm(algorithm))
        .unwrap();
    let mut models: HashMap<u64, M> = HashMap::new();
    let mut admitted: Vec<Admitted> = Vec::new();
    let mut now = 0;
    for (i, s) in trace.iter().enumerate() {
        now += s.dt;
        clock.set(now);
        if s.sweep {
            store.sweep();
        }
        if let Some(pick) = s.refund.filter(|_| !admitted.is_empty()) {
            let a = admitted.swap_remove(pick % admitted.len());
            let model = models.get_mut(&a.key).expect("a charged key has a model");
            let stamp = a.receipt.stamp().expect("an admitted charge has a receipt");
            if model.judges(now, stamp) {
                let key = Key::Int(a.key);
                store.refund(&[Refund::new(Charge::new(id, &key, a.cost), a.receipt)]);
                model.refund(now, a.at, a.cost);
            }
        }
        let key = Key::Int(s.key);
        let real = store.check_now(&[Charge::new(id, &key, s.cost)]).unwrap();
        if real.is_allowed() && s.cost > 0 {
            admitted.push(Admitted {
                key: s.key,
                at: now,
                cost: s.cost,
                receipt: real.receipt(0),
            });
        }
        let model = models.entry(s.key).or_insert_with(|| M::new(&quota));
        let expected = model_decide(model, now, s.cost);
        assert_eq!(
            real.as_slice(),
            &[expected],
            "step {i} at {now} ns: {s:?} {quota:?}"
        );
        // `model` is the state after the decision (a denial left it unchanged).
        check_semantics(model, &expected, now, s.cost);
    }
}

/// `limit` per `period` ns with `burst`, the burst clamped to [`Quota::max_burst`] and the
/// limit to 1 where `limit × ceil(period / limit)` would exceed `u64::MAX` ns (quotas refuse
/// a tolerance that does not fit), so generated edges stay at the largest valid values.
fn quota(limit: u32, period: u64, burst: u32) -> Quota {
    let period = Duration::from_nanos(period);
    let q = Quota::new(limit, period)
        .or_else(|_| Quota::new(1, period))
        .unwrap();
    q.with_burst(burst.min(q.max_burst())).unwrap()
}

/// [`quota`] without a burst (burst = its limit), for the algorithms that take none.
fn window_quota(limit: u32, period: u64) -> Quota {
    let q = quota(limit, period, 1);
    q.with_burst(q.limit()).unwrap()
}

/// `q` as `algorithm` takes it: GCRA and the leaky bucket with its burst, the others
/// (which take no burst) with burst = limit.
fn for_algorithm(q: Quota, algorithm: Algorithm) -> Quota {
    match algorithm {
        Algorithm::Gcra | Algorithm::LeakyBucket => q,
        _ => q.with_burst(q.limit()).unwrap(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn gcra_matches_the_token_bucket_model(
        limit in 1..12u32, period in 1..3_000u64, burst in 1..12u32, trace in steps(400, 13)
    ) {
        compare::<TokenBucket>(Algorithm::Gcra, quota(limit, period, burst), &trace);
    }

    #[test]
    fn leaky_bucket_matches_the_water_model(
        limit in 1..12u32, period in 1..3_000u64, burst in 1..12u32, trace in steps(400, 13)
    ) {
        compare::<Water>(Algorithm::LeakyBucket, quota(limit, period, burst), &trace);
    }

    #[test]
    fn fixed_window_matches_the_event_model(
        limit in 1..12u32, period in 1..3_000u64, trace in steps(1_000, 13)
    ) {
        compare::<Fixed>(Algorithm::FixedWindow, window_quota(limit, period), &trace);
    }

    #[test]
    fn sliding_log_matches_the_event_model(
        limit in 1..12u32, period in 1..3_000u64, trace in steps(1_000, 13)
    ) {
        compare::<Log>(Algorithm::SlidingLog, window_quota(limit, period), &trace);
    }

    #[test]
    fn sliding_window_matches_the_event_model(
        limit in 1..12u32, period in 1..300u64, trace in steps(200, 13)
    ) {
        compare::<Counter>(Algorithm::SlidingWindow, window_quota(limit, period), &trace);
    }

    /// The shaper: every admitted request's delay keeps outputs at least `T` apart, and
    /// the queue never holds more than `burst` units.
    #[test]
    fn shaper_output_is_smooth_and_bounded(
        limit in 1..12u32, period in 1..3_000u64, burst in 1..12u32,
        trace in steps(400, 3), max_wait in 0..5_000u64,
    ) {
        let q = quota(limit, period, burst);
        let bucket = LeakyBucket::new(&q);
        let t = q.emission_interval_nanos();
        let mut water = Water::new(&q);
        let mut tat = 0;
        let mut now = 0;
        let mut last_out: Option<(u64, u64)> = None;
        for s in &trace {
            now += s.dt;
            let (shaped, next) = bucket.shape(tat, now, s.cost, Duration::from_nanos(max_wait));
            let queued = water.water_at(now);
            let fits = s.cost <= water.capacity() && water.fits(now, s.cost);
            if s.cost > 0 && fits && queued <= max_wait {
                let delay = u64::try_from(shaped.delay().unwrap().as_nanos()).unwrap();
                prop_assert_eq!(delay, queued);
                let out = now + delay;
                if let Some((prev_out, prev_cost)) = last_out {
                    prop_assert!(out >= prev_out + prev_cost * t);
                }
                last_out = Some((out, s.cost));
                water.charge(now, s.cost);
                tat = next.unwrap();
            } else if s.cost > 0 {
                prop_assert!(shaped.decision().is_denied());
                prop_assert_eq!(next, None);
            }
        }
    }

    /// Two policies with different algorithms on one key: all-or-nothing, matching the
    /// models (a denial by either charges neither).
    #[test]
    fn two_policies_are_all_or_nothing(
        limit in 1..8u32, period in 1..2_000u64, trace in steps(500, 9)
    ) {
        let q = window_quota(limit, period);
        let clock = ManualClock::new();
        let mut store = MemoryStore::with_clock(clock.clone());
        let a = store.register(&Policy::new("a", q).with_algorithm(Algorithm::SlidingLog)).unwrap();
        let b = store.register(&Policy::new("b", quota(limit + 1, period * 2, 2))).unwrap();
        let mut ma = Log::new(&q);
        let mut mb = TokenBucket::new(&quota(limit + 1, period * 2, 2));
        let key = Key::Global;
        let mut now = 0;
        for s in &trace {
            now += s.dt;
            clock.set(now);
            let real = store
                .check_now(&[Charge::new(a, &key, s.cost), Charge::new(b, &key, s.cost)])
                .unwrap();
            let (pa, pb) = (model_peek(&ma, now, s.cost), model_peek(&mb, now, s.cost));
            if pa.is_allowed() && pb.is_allowed() {
                let da = model_decide(&mut ma, now, s.cost);
                let db = model_decide(&mut mb, now, s.cost);
                prop_assert_eq!(real.as_slice(), &[da, db]);
            } else {
                prop_assert_eq!(real.as_slice(), &[pa, pb]);
            }
        }
    }

    /// The concurrency counter against a list of held permits.
    #[test]
    fn concurrency_matches_the_permit_list(
        limit in 1..10u32,
        ops in prop::collection::vec((0..2u64, 0..12u64, prop::bool::ANY), 1..80),
    ) {
        let q = quota(limit, 1_000, limit);
        let mut store = MemoryStore::with_clock(ManualClock::new());
        let id = store.register(&Policy::new("c", q).with_algorithm(Algorithm::Concurrency)).unwrap();
        let pure = Concurrency::new(&q);
        let mut held: HashMap<u64, Vec<(u64, Receipt)>> = HashMap::new();
        for (k, cost, release) in ops {
            let key = Key::Int(k);
            let permits = held.entry(k).or_default();
            if release {
                if let Some((c, receipt)) = permits.pop() {
                    // A refund without a receipt gives back nothing; with it, the permits.
                    store.refund(&[Refund::new(Charge::new(id, &key, c), Receipt::NONE)]);
                    let d = store.check_now(&[Charge::new(id, &key, 0)]).unwrap();
                    let used: u64 = permits.iter().map(|p| p.0).sum::<u64>() + c;
                    prop_assert_eq!(u64::from(d.as_slice()[0].remaining()), u64::from(limit) - used);
                    store.refund(&[Refund::new(Charge::new(id, &key, c), receipt)]);
                }
                continue;
            }
            let used: u64 = permits.iter().map(|p| p.0).sum();
            let decisions = store.check_now(&[Charge::new(id, &key, cost)]).unwrap();
            let d = decisions.as_slice()[0];
            if cost > u64::from(limit) {
                prop_assert!(d.is_cannot_fit());
            } else if used + cost <= u64::from(limit) {
                prop_assert!(d.is_allowed());
                if cost > 0 {
                    prop_assert!(decisions.receipt(0).is_some());
                    permits.push((cost, decisions.receipt(0)));
                }
            } else {
                prop_assert_eq!(d.retry_after(), Some(Duration::from_nanos(1_000)));
            }
            let now_used: u64 = permits.iter().map(|p| p.0).sum();
            prop_assert_eq!(u64::from(d.remaining()), u64::from(limit) - now_used);
            prop_assert_eq!(pure.peek(now_used, 0).remaining(), d.remaining());
        }
        store.sweep();
        let holding = held.values().filter(|p| !p.is_empty()).count();
        prop_assert_eq!(store.len(), holding, "a key holding permits was evicted");
    }
}

/// Quota values at the edges of their types.
fn extreme_quota() -> impl Strategy<Value = Quota> {
    let limits = prop_oneof![Just(1u32), Just(2), Just(u32::MAX), 1..u32::MAX];
    let bursts = prop_oneof![Just(1u32), Just(u32::MAX), 1..u32::MAX];
    let hundred_years = 100 * 365 * 86_400 * 1_000_000_000u64;
    let periods = prop_oneof![Just(1u64), Just(hundred_years), Just(u64::MAX), 1..u64::MAX];
    (limits, periods, bursts).prop_map(|(l, p, b)| quota(l, p, b))
}

fn extreme_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(u64::from(u32::MAX)),
        Just(u64::MAX / 2),
        Just(u64::MAX - 1),
        Just(u64::MAX),
        any::<u64>()
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, failure_persistence: None, ..ProptestConfig::default() })]

    /// Extreme configurations, costs and clocks (up to u64::MAX ns): no panic, no overflow,
    /// and the outcomes still mean what they say.
    #[test]
    fn extreme_values_never_panic(
        q in extreme_quota(),
        mut times in prop::collection::vec(extreme_u64(), 1..12),
        costs in prop::collection::vec(extreme_u64(), 12),
    ) {
        times.sort_unstable();
        for algorithm in Algorithm::ALL {
            let clock = ManualClock::new();
            let mut store = MemoryStore::with_clock(clock.clone());
            let policy = Policy::new("x", for_algorithm(q, algorithm)).with_algorithm(algorithm);
            let id = store.register(&policy).unwrap();
            let capacity = u64::from(policy.capacity());
            for (&t, &cost) in times.iter().zip(&costs) {
                clock.set(t);
                let decisions = store.check_now(&[Charge::new(id, &Key::Global, cost)]).unwrap();
                let d = decisions.as_slice()[0];
                prop_assert_eq!(d.is_cannot_fit(), cost > capacity, "{} cost {}", algorithm, cost);
                prop_assert!(u64::from(d.remaining()) <= capacity);
                // The advertised quota bounds Remaining, for every algorithm.
                prop_assert!(d.remaining() <= d.limit(), "{}: {:?}", algorithm, d);
                prop_assert_eq!(d.limit(), policy.advertised().0);
                if let Some(r) = d.retry_after() {
                    prop_assert!(r > Duration::ZERO, "{}: retry_after 0", algorithm);
                }
                let receipt = decisions.receipt(0);
                store.refund(&[Refund::new(Charge::new(id, &Key::Global, cost), receipt)]);
                store.sweep();
            }
            let bucket = LeakyBucket::new(&q);
            for (&t, &cost) in times.iter().zip(&costs) {
                let (shaped, next) = bucket.shape(t, t, cost, Duration::MAX);
                let _ = (shaped, next.map(|tat| bucket.refunded(tat, t, cost, tat)));
            }
        }
    }
}

#[test]
fn registration_rejects_nothing_valid_and_quota_rejects_everything_invalid() {
    // Invalid configurations (zero, negative, huge: the values of
    // https://github.com/spring-cloud/spring-cloud-gateway/issues/168) are typed errors, for
    // every algorithm.
    assert!(
        Quota::new(0, Duration::from_secs(1))
            .unwrap_err()
            .is_limit()
    );
    assert!(Quota::new(1, Duration::ZERO).unwrap_err().is_period());
    assert!(
        Quota::new(1, Duration::from_secs(1))
            .unwrap()
            .with_burst(0)
            .unwrap_err()
            .is_burst()
    );
    for algorithm in Algorithm::ALL {
        let mut store = MemoryStore::<Key, _>::with_clock(ManualClock::new());
        let p = Policy::new("ok", quota(1, 1, 1)).with_algorithm(algorithm);
        let id: PolicyId = store.register(&p).unwrap();
        assert_eq!(id.index(), 0);
        let bad = Policy::new("bad name", quota(1, 1, 1)).with_algorithm(algorithm);
        assert!(store.register(&bad).unwrap_err().is_config());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    /// Any input, including non-ASCII text, parses or fails with an error; never panics.
    #[test]
    fn quota_parsing_never_panics(input in "\\PC{0,24}|[0-9 /a-zA-Z_é-]{0,24}") {
        if let Err(e) = input.parse::<Quota>() {
            prop_assert!(e.to_string().starts_with("invalid quota"));
        }
    }

    /// `Display` writes a string that parses back to the same quota.
    #[test]
    fn quota_strings_round_trip(limit in 1..=u32::MAX, period in 1..=u64::MAX, burst in 1..=u32::MAX) {
        let q = quota(limit, period, burst);
        prop_assert_eq!(q.to_string().parse::<Quota>(), Ok(q));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, failure_persistence: None, ..ProptestConfig::default() })]

    /// The sliding log's memory per key is bounded: never more than `limit` entries, and
    /// a request of cost n adds at most one.
    #[test]
    fn sliding_log_holds_at_most_limit_entries(
        limit in 1..20u32, period in 1..5_000u64, trace in steps(300, 21)
    ) {
        let log = SlidingLog::new(&window_quota(limit, period));
        let mut state = SlidingLogState::new();
        let mut now = 0;
        for s in &trace {
            now += s.dt;
            let before = state.len();
            log.decide(&mut state, now, s.cost);
            prop_assert!(state.len() <= limit as usize);
            prop_assert!(state.len() <= before + 1);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, failure_persistence: None, ..ProptestConfig::default() })]

    /// Refunds of stale receipts (the charge's window closed, its log entry expired, the bucket
    /// drained it) give back nothing, so however many of them arrive the quota still holds over
    /// every admission, counted without any deduction: at most `limit` per aligned window
    /// (fixed window), at most `limit` in any `(t - W, t]` (sliding log), and
    /// `units * T <= tau + (t_j - t_i)` between any two admissions (GCRA, leaky bucket). (The
    /// sliding window counter only bounds an estimate; its refunds are compared with the event
    /// model above.)
    #[test]
    fn stale_refunds_never_let_more_than_the_limit_through(
        algorithm in prop::sample::select(vec![
            Algorithm::Gcra, Algorithm::LeakyBucket, Algorithm::FixedWindow, Algorithm::SlidingLog,
        ]),
        limit in 1..8u32, period in 1..2_000u64, burst in 1..8u32, trace in steps(400, 4),
    ) {
        let q = for_algorithm(quota(limit, period, burst), algorithm);
        let (w, t, tau) = (q.period_nanos(), q.emission_interval_nanos(), q.tolerance_nanos());
        let clock = ManualClock::new();
        let mut store = MemoryStore::with_clock(clock.clone());
        let id = store.register(&Policy::new("p", q).with_algorithm(algorithm)).unwrap();
        let key = Key::Global;
        let stale = |at: u64, stamp: u64, now: u64| match algorithm {
            Algorithm::FixedWindow => at / w != now / w,
            Algorithm::SlidingLog => at + w <= now,
            _ => stamp <= now,
        };
        let mut admitted: Vec<(u64, u64)> = Vec::new();
        let mut outstanding: Vec<(u64, u64, Receipt)> = Vec::new();
        let mut now = 0;
        let mut refunds = 0;
        for s in &trace {
            now += s.dt;
            clock.set(now);
            if s.refund.is_some() {
                outstanding.retain(|&(at, cost, receipt)| {
                    let stamp = receipt.stamp().unwrap_or(0);
                    if stale(at, stamp, now) {
                        store.refund(&[Refund::new(Charge::new(id, &key, cost), receipt)]);
                        refunds += 1;
                        false
                    } else {
                        true
                    }
                });
            }
            let d = store.check_now(&[Charge::new(id, &key, s.cost)]).unwrap();
            if d.is_allowed() && s.cost > 0 {
                admitted.push((now, s.cost));
                outstanding.push((now, s.cost, d.receipt(0)));
            }
        }
        for (i, &(ti, _)) in admitted.iter().enumerate() {
            let units = |pred: &dyn Fn(u64) -> bool| -> u64 {
                admitted.iter().filter(|(at, _)| pred(*at)).map(|(_, c)| c).sum()
            };
            match algorithm {
                Algorithm::FixedWindow => {
                    prop_assert!(units(&|at| at / w == ti / w) <= u64::from(limit));
                }
                Algorithm::SlidingLog => {
                    prop_assert!(units(&|at| at + w > ti && at <= ti) <= u64::from(limit));
                }
                _ => {
                    let mut sum = 0;
                    for &(tj, cost) in &admitted[i..] {
                        sum += cost;
                        prop_assert!(sum * t <= tau + (tj - ti), "{:?} refunds {}", admitted, refunds);
                    }
                }
            }
        }
    }
}

/// A case the proptest found: two charges at one instant (8, then 1), refunded in the other
/// order (1, then 8). The model used to give the second refund back from no event (it looked
/// for one event holding all 8 units) while the store counts both charges in one window count:
/// the model, not the store, was wrong.
#[test]
fn sliding_window_refunds_of_charges_at_one_instant() {
    let step = |dt, cost, refund| Step {
        key: 0,
        dt,
        cost,
        sweep: false,
        refund,
    };
    // Admitted: [8, 1]; pick 1 refunds the 1, then pick 0 the 8.
    let trace = [
        step(0, 8, None),
        step(0, 1, None),
        step(10, 0, Some(1)),
        step(10, 0, Some(0)),
        step(10, 0, None),
    ];
    compare::<Counter>(Algorithm::SlidingWindow, window_quota(9, 274), &trace);
    compare::<Log>(Algorithm::SlidingLog, window_quota(9, 274), &trace);
    compare::<Fixed>(Algorithm::FixedWindow, window_quota(9, 274), &trace);
}
