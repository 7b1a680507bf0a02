//! The gradient controller: the in-flight limit from observed latency, on a caller-supplied
//! clock.
//!
//! # Algorithm
//!
//! The controller follows the gradient controller of Envoy's adaptive concurrency filter
//! (`envoy.filters.http.adaptive_concurrency`, "Gradient controller" in the Envoy docs),
//! with the limit smoothing of Netflix concurrency-limits' `Gradient2Limit`:
//!
//! 1. **Minimum latency** (`minRTT`, the latency with no queue): measured by holding the
//!    limit at [`ControllerSettings::min_limit`] until
//!    [`ControllerSettings::min_rtt_requests`] requests *admitted during the measurement*
//!    have completed, and taking the [`ControllerSettings::percentile`] of their latencies.
//!    It is measured when the controller starts and again every
//!    [`ControllerSettings::min_rtt_interval`] plus a random jitter of up to
//!    [`ControllerSettings::jitter`] of the interval (so a fleet started at once does not
//!    measure at once). Requests admitted before the measurement began are left out, so the
//!    queue they were in does not count as "no load" (Envoy counts every completion).
//! 2. **Sample latency** (`sampleRTT`): every [`ControllerSettings::update_interval`], the
//!    percentile of the latencies that completed in the interval.
//! 3. **Gradient**: `gradient = clamp((minRTT × (1 + buffer)) / sampleRTT, 0.5, 2.0)`, where
//!    `buffer` ([`ControllerSettings::min_rtt_buffer`]) is the latency rise tolerated
//!    before the limit falls.
//! 4. **New limit**: `target = gradient × limit`, plus a headroom of `√(gradient × limit)`
//!    when `gradient ≥ 1` (Envoy's headroom, which lets the limit probe upward while
//!    latency shows no queue beyond the buffer), then
//!    `limit ← (1 − smoothing) × limit + smoothing × target`
//!    ([`ControllerSettings::smoothing`], as in Gradient2), clamped to
//!    `[min_limit, max_limit]`. While the requests in flight stayed below half the limit in
//!    the whole interval the limit does not rise (Gradient2's rule: a limit no traffic
//!    reached says nothing about the service).
//! 5. **Stale baseline**: when the limit has sat at `min_limit` for
//!    [`ControllerSettings::floor_windows`] updates in a row, the latency at the lowest
//!    concurrency is far above `minRTT`, so the service itself got slower (a deploy, a slow
//!    downstream): `minRTT` is measured again at once instead of at the next interval.
//!
//! Envoy adds the headroom at every update, so its limit settles about `√limit` above the
//! point where the queue reaches the buffer (`limit − √limit ≈ (1 + buffer) × N` for a
//! service of `N` workers with a fixed service time), and the p99 latency sits about
//! `(1 + buffer + 1/√N)` above the unloaded one. Here the headroom is only added while the
//! gradient is at least 1, so the limit moves between `(1 + buffer) × N` and that plus the
//! smoothed headroom: the queue, and the latency it adds, stay near the buffer.
//!
//! The controller never reads a clock: every call takes the time (`now_ns`, nanoseconds on
//! any monotonic clock) and latencies in nanoseconds, so tests drive it on a virtual clock.

use std::time::Duration;

use crate::BuildError;

/// The settings of a [`GradientController`]. The defaults are Envoy's where Envoy has one
/// (p50, 25 % buffer, 60 s minRTT interval with 15 % jitter, 50 requests at concurrency 3),
/// the 100 ms update interval of Envoy's documented example (Envoy requires the field),
/// Gradient2's initial limit (20), and a smoothing weight of 0.5 (Gradient2 uses 0.2; 0.5
/// settles after a capacity change within about 1 s at the default interval).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ControllerSettings {
    /// The lowest limit, also the limit while `minRTT` is measured (default 3, at least 1).
    pub min_limit: u32,
    /// The highest limit (default 1000).
    pub max_limit: u32,
    /// The limit before the first update (default 20).
    pub initial_limit: u32,
    /// How often the limit is recomputed from the latencies of the interval (default
    /// 100 ms, more than 0).
    pub update_interval: Duration,
    /// The latency percentile that sums up an interval and the minRTT measurement, in
    /// `(0, 1]` (default 0.5, the median).
    pub percentile: f64,
    /// The latency rise over `minRTT` tolerated before the limit falls, as a fraction of
    /// `minRTT`, in `[0, 10]` (default 0.25).
    pub min_rtt_buffer: f64,
    /// The weight of the new limit against the old one at each update, in `(0, 1]` (default
    /// 0.5; 1 takes the new limit as it is).
    pub smoothing: f64,
    /// Time between `minRTT` measurements (default 60 s, more than 0).
    pub min_rtt_interval: Duration,
    /// Random extra delay before each measurement, as a fraction of the interval, in
    /// `[0, 1]` (default 0.15).
    pub jitter: f64,
    /// Requests a `minRTT` measurement waits for (default 50, at least 1). A measurement that
    /// has at least one sample ends after [`ControllerSettings::min_rtt_timeout`] anyway.
    pub min_rtt_requests: u32,
    /// Longest a `minRTT` measurement waits for its requests once it has one sample
    /// (default 2 s).
    pub min_rtt_timeout: Duration,
    /// Updates in a row at `min_limit` after which `minRTT` is measured again (default 10,
    /// at least 1).
    pub floor_windows: u32,
}

impl Default for ControllerSettings {
    fn default() -> Self {
        Self {
            min_limit: 3,
            max_limit: 1000,
            initial_limit: 20,
            update_interval: Duration::from_millis(100),
            percentile: 0.5,
            min_rtt_buffer: 0.25,
            smoothing: 0.5,
            min_rtt_interval: Duration::from_secs(60),
            jitter: 0.15,
            min_rtt_requests: 50,
            min_rtt_timeout: Duration::from_secs(2),
            floor_windows: 10,
        }
    }
}

impl ControllerSettings {
    /// Checks that the settings fit together.
    ///
    /// # Errors
    ///
    /// [`BuildError::Config`] naming the field: a zero `min_limit`, `min_rtt_requests`,
    /// `floor_windows`, `update_interval` or `min_rtt_interval`; `max_limit` below
    /// `min_limit`; `initial_limit` outside `[min_limit, max_limit]`; a fraction outside its
    /// range (or NaN).
    pub fn validate(&self) -> Result<(), BuildError> {
        let err = |field: &str, message: String| BuildError::Config {
            field: format!("adaptive.{field}"),
            message,
        };
        if self.min_limit == 0 {
            return Err(err("min_limit", "must be at least 1".into()));
        }
        if self.max_limit < self.min_limit {
            return Err(err(
                "max_limit",
                format!("{} is below min_limit {}", self.max_limit, self.min_limit),
            ));
        }
        if !(self.min_limit..=self.max_limit).contains(&self.initial_limit) {
            return Err(err(
                "initial_limit",
                format!(
                    "{} is outside [min_limit, max_limit] = [{}, {}]",
                    self.initial_limit, self.min_limit, self.max_limit
                ),
            ));
        }
        for (field, d) in [
            ("update_interval", self.update_interval),
            ("min_rtt_interval", self.min_rtt_interval),
        ] {
            if d.is_zero() {
                return Err(err(field, "must be longer than 0".into()));
            }
        }
        let fractions = [
            ("percentile", self.percentile, 0.0, 1.0, false),
            ("min_rtt_buffer", self.min_rtt_buffer, 0.0, 10.0, true),
            ("smoothing", self.smoothing, 0.0, 1.0, false),
            ("jitter", self.jitter, 0.0, 1.0, true),
        ];
        for (field, v, lo, hi, lo_inclusive) in fractions {
            let above_lo = if lo_inclusive { v >= lo } else { v > lo };
            if !(above_lo && v <= hi) {
                let open = if lo_inclusive { '[' } else { '(' };
                return Err(err(field, format!("{v} is outside {open}{lo}, {hi}]")));
            }
        }
        if self.min_rtt_requests == 0 {
            return Err(err("min_rtt_requests", "must be at least 1".into()));
        }
        if self.floor_windows == 0 {
            return Err(err("floor_windows", "must be at least 1".into()));
        }
        Ok(())
    }
}

/// Most latencies kept per interval; beyond it a uniform random sample of them is kept
/// (reservoir sampling), so memory stays bounded at any request rate.
const RESERVOIR: usize = 1024;

/// A change of the limit, returned by the call that made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitChange {
    /// The limit before.
    pub from: u32,
    /// The limit after.
    pub to: u32,
}

#[derive(Debug, Clone)]
enum Phase {
    /// Measuring `minRTT` since `since` (ns): the limit is `min_limit`.
    Measuring { since: u64 },
    /// Adjusting the limit; the next measurement starts at `next_measurement` (ns).
    Running { next_measurement: u64 },
}

/// The gradient controller (see the [module docs](self)): feed it each admitted request's
/// latency with [`GradientController::sample`], read [`GradientController::limit`] before
/// admitting one. Not synchronised: the layer keeps it behind a lock.
///
/// ```
/// use std::time::Duration;
/// use ratekeeper_tower::adaptive::{ControllerSettings, GradientController};
///
/// let settings = ControllerSettings { min_rtt_requests: 5, ..ControllerSettings::default() };
/// let mut c = GradientController::new(settings, 7, 0);
/// assert_eq!(c.limit(), 3); // measuring minRTT at the lowest concurrency first
/// let ms = 1_000_000;
/// for i in 0..5 {
///     c.sample(10 * ms, 0, 1, 10 * ms + i);
/// }
/// assert_eq!(c.min_rtt_ns(), Some(10 * ms));
/// assert_eq!(c.limit(), 20); // back to the initial limit
/// ```
#[derive(Debug, Clone)]
pub struct GradientController {
    settings: ControllerSettings,
    /// The limit while running (kept during a measurement).
    limit: f64,
    phase: Phase,
    min_rtt: Option<u64>,
    /// The last interval's percentile latency (ns).
    sample_rtt: Option<u64>,
    /// Latencies of the current interval, or of the measurement.
    samples: Vec<u64>,
    /// How many latencies the current interval saw (the reservoir keeps at most
    /// [`RESERVOIR`]).
    seen: u64,
    window_start: u64,
    /// Most requests in flight seen in the current interval.
    peak_in_flight: u32,
    at_floor: u32,
    rng: u64,
}

impl GradientController {
    /// A controller starting at `now_ns` with a `minRTT` measurement. `seed` drives the jitter
    /// of the measurement times (any value; the layer draws one per controller).
    ///
    /// The settings are expected to pass [`ControllerSettings::validate`]; out-of-range values
    /// are clamped into range rather than causing a panic.
    pub fn new(settings: ControllerSettings, seed: u64, now_ns: u64) -> Self {
        let settings = sanitize(settings);
        Self {
            limit: f64::from(settings.initial_limit),
            settings,
            phase: Phase::Measuring { since: now_ns },
            min_rtt: None,
            sample_rtt: None,
            samples: Vec::new(),
            seen: 0,
            window_start: now_ns,
            peak_in_flight: 0,
            at_floor: 0,
            // xorshift needs a non-zero state.
            rng: seed | 1,
        }
    }

    /// The settings in force.
    pub fn settings(&self) -> &ControllerSettings {
        &self.settings
    }

    /// The number of requests that may be in flight now: `min_limit` while `minRTT` is being
    /// measured, the adjusted limit otherwise.
    pub fn limit(&self) -> u32 {
        match self.phase {
            Phase::Measuring { .. } => self.settings.min_limit,
            Phase::Running { .. } => self.running_limit(),
        }
    }

    fn running_limit(&self) -> u32 {
        // `limit` stays within [min_limit, max_limit], both u32.
        (self.limit.floor() as u32).clamp(self.settings.min_limit, self.settings.max_limit)
    }

    /// Whether `minRTT` is being measured now.
    pub fn is_measuring(&self) -> bool {
        matches!(self.phase, Phase::Measuring { .. })
    }

    /// The measured minimum latency (ns), `None` before the first measurement ends.
    pub fn min_rtt_ns(&self) -> Option<u64> {
        self.min_rtt
    }

    /// The latency estimate (ns) of the last interval that had samples, `None` before one.
    pub fn sample_rtt_ns(&self) -> Option<u64> {
        self.sample_rtt
    }

    /// Moves time to `now_ns` with no sample: starts a due `minRTT` measurement. Call it
    /// before reading [`limit`](Self::limit) to admit a request. Returns the change of
    /// [`limit`](Self::limit), if any.
    pub fn tick(&mut self, now_ns: u64) -> Option<LimitChange> {
        let before = self.limit();
        if let Phase::Running { next_measurement } = self.phase {
            if now_ns >= next_measurement {
                self.start_measurement(now_ns);
            }
        }
        self.change(before)
    }

    /// Records one request's latency (`latency_ns`), for a request admitted at `started_ns`
    /// with `in_flight` requests in flight (itself included) at admission, completed at
    /// `now_ns`. Returns the change of [`limit`](Self::limit), if this sample ended an
    /// interval or a measurement and moved it.
    pub fn sample(
        &mut self,
        latency_ns: u64,
        started_ns: u64,
        in_flight: u32,
        now_ns: u64,
    ) -> Option<LimitChange> {
        let before = self.limit();
        match self.phase {
            Phase::Measuring { since } => {
                if started_ns >= since {
                    self.push(latency_ns);
                }
                let enough = self.samples.len() >= self.settings.min_rtt_requests as usize;
                let timed_out = !self.samples.is_empty()
                    && now_ns.saturating_sub(since) >= nanos(self.settings.min_rtt_timeout);
                if enough || timed_out {
                    self.min_rtt = percentile(&mut self.samples, self.settings.percentile);
                    self.samples.clear();
                    self.seen = 0;
                    self.at_floor = 0;
                    self.window_start = now_ns;
                    self.peak_in_flight = 0;
                    let next = now_ns.saturating_add(self.next_interval());
                    self.phase = Phase::Running {
                        next_measurement: next,
                    };
                }
            }
            Phase::Running { next_measurement } => {
                if now_ns >= next_measurement {
                    self.start_measurement(now_ns);
                    return self.change(before);
                }
                self.push(latency_ns);
                self.peak_in_flight = self.peak_in_flight.max(in_flight);
                if now_ns.saturating_sub(self.window_start) >= nanos(self.settings.update_interval)
                {
                    self.update(now_ns);
                }
            }
        }
        self.change(before)
    }

    /// Ends an interval: the gradient step (see the [module docs](self)).
    fn update(&mut self, now_ns: u64) {
        let sample = percentile(&mut self.samples, self.settings.percentile);
        let peak = self.peak_in_flight;
        self.samples.clear();
        self.seen = 0;
        self.peak_in_flight = 0;
        self.window_start = now_ns;
        let (Some(sample), Some(min_rtt)) = (sample, self.min_rtt) else {
            return;
        };
        self.sample_rtt = Some(sample);
        let s = &self.settings;
        let reference = min_rtt as f64 * (1.0 + s.min_rtt_buffer);
        let gradient = (reference / (sample.max(1) as f64)).clamp(0.5, 2.0);
        let base = gradient * self.limit;
        let target = if gradient >= 1.0 {
            base + base.sqrt()
        } else {
            base
        };
        let mut next = (1.0 - s.smoothing) * self.limit + s.smoothing * target;
        if next > self.limit && f64::from(peak) < self.limit / 2.0 {
            // Application-limited: the traffic never came near the limit.
            next = self.limit;
        }
        self.limit = next.clamp(f64::from(s.min_limit), f64::from(s.max_limit));
        if self.running_limit() <= s.min_limit {
            self.at_floor += 1;
            if self.at_floor >= s.floor_windows {
                self.start_measurement(now_ns);
            }
        } else {
            self.at_floor = 0;
        }
    }

    fn start_measurement(&mut self, now_ns: u64) {
        self.samples.clear();
        self.seen = 0;
        self.at_floor = 0;
        self.phase = Phase::Measuring { since: now_ns };
    }

    fn change(&self, before: u32) -> Option<LimitChange> {
        let to = self.limit();
        (to != before).then_some(LimitChange { from: before, to })
    }

    fn push(&mut self, latency_ns: u64) {
        self.seen += 1;
        if self.samples.len() < RESERVOIR {
            self.samples.push(latency_ns);
        } else {
            // Algorithm R: the new latency replaces a kept one with probability RESERVOIR/seen.
            let j = self.next_random() % self.seen;
            if let Some(slot) = usize::try_from(j)
                .ok()
                .and_then(|j| self.samples.get_mut(j))
            {
                *slot = latency_ns;
            }
        }
    }

    /// The time to the next measurement: the interval plus up to `jitter` of it.
    fn next_interval(&mut self) -> u64 {
        let interval = nanos(self.settings.min_rtt_interval);
        let fraction = (self.next_random() >> 11) as f64 / (1u64 << 53) as f64;
        let extra = interval as f64 * self.settings.jitter * fraction;
        interval.saturating_add(extra as u64)
    }

    /// xorshift64* (Vigna, "An experimental exploration of Marsaglia's xorshift generators").
    fn next_random(&mut self) -> u64 {
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The `p`-th percentile by the nearest-rank method (`None` for no samples).
fn percentile(samples: &mut [u64], p: f64) -> Option<u64> {
    if samples.is_empty() {
        return None;
    }
    let n = samples.len();
    let rank = ((p * n as f64).ceil() as usize).clamp(1, n);
    let (_, v, _) = samples.select_nth_unstable(rank - 1);
    Some(*v)
}

/// Clamps every setting into its valid range, so a controller built without
/// [`ControllerSettings::validate`] still never panics or divides by zero.
fn sanitize(mut s: ControllerSettings) -> ControllerSettings {
    let finite = |v: f64, lo: f64, hi: f64, default: f64| {
        if v.is_nan() { default } else { v.clamp(lo, hi) }
    };
    let d = ControllerSettings::default();
    s.min_limit = s.min_limit.max(1);
    s.max_limit = s.max_limit.max(s.min_limit);
    s.initial_limit = s.initial_limit.clamp(s.min_limit, s.max_limit);
    if s.update_interval.is_zero() {
        s.update_interval = d.update_interval;
    }
    if s.min_rtt_interval.is_zero() {
        s.min_rtt_interval = d.min_rtt_interval;
    }
    s.percentile = finite(s.percentile, f64::MIN_POSITIVE, 1.0, d.percentile);
    s.min_rtt_buffer = finite(s.min_rtt_buffer, 0.0, 10.0, d.min_rtt_buffer);
    s.smoothing = finite(s.smoothing, f64::MIN_POSITIVE, 1.0, d.smoothing);
    s.jitter = finite(s.jitter, 0.0, 1.0, d.jitter);
    s.min_rtt_requests = s.min_rtt_requests.max(1);
    s.floor_windows = s.floor_windows.max(1);
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: u64 = 1_000_000;

    /// A controller whose minRTT measurement (`rtt`) is done at `t` = returned time.
    fn measured(settings: ControllerSettings, rtt: u64) -> (GradientController, u64) {
        let mut c = GradientController::new(settings, 42, 0);
        let mut t = rtt;
        for _ in 0..settings.min_rtt_requests {
            c.sample(rtt, 0, 1, t);
            t += 1;
        }
        assert!(!c.is_measuring());
        assert_eq!(c.min_rtt_ns(), Some(rtt));
        (c, t)
    }

    /// Feeds one update interval of samples of latency `rtt` with `in_flight` requests in
    /// flight, ending the interval; returns the time after it.
    fn interval(c: &mut GradientController, t: u64, rtt: u64, in_flight: u32) -> u64 {
        let step = nanos(c.settings().update_interval) / 10;
        let mut t = t;
        for _ in 0..10 {
            t += step;
            c.sample(rtt, t.saturating_sub(rtt), in_flight, t);
        }
        t
    }

    /// The queueing latency of a pool of `workers` with `service` ns per request, with
    /// `limit` requests in flight.
    fn pool_latency(workers: u32, service: u64, limit: u32) -> u64 {
        service * u64::from(limit.max(workers)) / u64::from(workers)
    }

    #[test]
    fn starts_by_measuring_min_rtt_at_the_lowest_limit() {
        let mut c = GradientController::new(ControllerSettings::default(), 1, 0);
        assert!(c.is_measuring());
        assert_eq!(c.limit(), 3);
        // Requests admitted before the measurement began are not counted.
        let mut c2 = GradientController::new(ControllerSettings::default(), 1, 100);
        for i in 0..100 {
            c2.sample(50 * MS, 0, 1, 200 + i);
        }
        assert!(c2.is_measuring());
        assert_eq!(c2.min_rtt_ns(), None);
        // Counted ones end it, at the configured percentile (median of 1..=50 ms).
        for i in 1..=50 {
            c.sample(i * MS, 0, 1, 1_000 + i);
        }
        assert_eq!(c.min_rtt_ns(), Some(25 * MS));
        assert_eq!(c.limit(), 20);
    }

    #[test]
    fn a_measurement_with_few_requests_ends_at_its_timeout() {
        let mut c = GradientController::new(ControllerSettings::default(), 1, 0);
        c.sample(10 * MS, 0, 1, 10 * MS);
        assert!(c.is_measuring());
        let change = c.sample(12 * MS, 0, 1, 2_000 * MS);
        assert!(!c.is_measuring());
        assert_eq!(c.min_rtt_ns(), Some(10 * MS));
        assert_eq!(change, Some(LimitChange { from: 3, to: 20 }));
    }

    #[test]
    fn rising_latency_lowers_the_limit() {
        let (mut c, mut t) = measured(ControllerSettings::default(), 10 * MS);
        let start = c.limit();
        let mut last = start;
        for _ in 0..5 {
            t = interval(&mut c, t, 30 * MS, last);
            assert!(c.limit() < last, "{} !< {last}", c.limit());
            last = c.limit();
        }
        assert_eq!(c.sample_rtt_ns(), Some(30 * MS));
    }

    #[test]
    fn latency_at_min_rtt_raises_the_limit_up_to_max() {
        let settings = ControllerSettings {
            max_limit: 60,
            ..ControllerSettings::default()
        };
        let (mut c, mut t) = measured(settings, 10 * MS);
        let mut last = c.limit();
        for _ in 0..50 {
            t = interval(&mut c, t, 10 * MS, last);
            assert!(c.limit() >= last);
            last = c.limit();
        }
        assert_eq!(c.limit(), 60);
    }

    #[test]
    fn an_unused_limit_does_not_grow() {
        let (mut c, mut t) = measured(ControllerSettings::default(), 10 * MS);
        for _ in 0..20 {
            t = interval(&mut c, t, 10 * MS, 2);
        }
        assert_eq!(c.limit(), 20);
    }

    #[test]
    fn converges_on_a_worker_pool_and_follows_it_when_halved() {
        // 16 workers, 10 ms each: latency rises once more than 16 are in flight.
        let (mut c, mut t) = measured(ControllerSettings::default(), 10 * MS);
        for _ in 0..100 {
            let rtt = pool_latency(16, 10 * MS, c.limit());
            let limit = c.limit();
            t = interval(&mut c, t, rtt, limit);
        }
        // Between (1 + buffer) × 16 = 20 and that plus √20.
        let settled = c.limit();
        assert!((20..=24).contains(&settled), "limit {settled}");
        // Half the workers: the limit falls within 5 s (50 intervals) to half as much.
        for _ in 0..50 {
            let rtt = pool_latency(8, 10 * MS, c.limit());
            let limit = c.limit();
            t = interval(&mut c, t, rtt, limit);
        }
        let halved = c.limit();
        assert!((10..=13).contains(&halved), "limit {halved}");
        assert!(halved < settled);
    }

    #[test]
    fn min_rtt_is_measured_again_after_the_interval() {
        let (mut c, mut t) = measured(ControllerSettings::default(), 10 * MS);
        assert_eq!(c.tick(t + 59_000 * MS), None);
        assert!(!c.is_measuring());
        // 60 s + at most 15 % jitter.
        t += 69_000 * MS;
        let change = c.tick(t);
        assert!(c.is_measuring());
        assert_eq!(change.map(|ch| ch.to), Some(3));
        for i in 0..50 {
            c.sample(20 * MS, t, 1, t + 20 * MS + i);
        }
        assert_eq!(c.min_rtt_ns(), Some(20 * MS));
    }

    #[test]
    fn a_limit_stuck_at_the_floor_measures_min_rtt_again() {
        // The service became 5 times slower for good: the stale minRTT pins the limit at 3
        // until a new measurement.
        let (mut c, mut t) = measured(ControllerSettings::default(), 10 * MS);
        let mut measured_again = false;
        for _ in 0..40 {
            let limit = c.limit();
            t = interval(&mut c, t, 50 * MS, limit);
            if c.is_measuring() {
                measured_again = true;
                break;
            }
        }
        assert!(measured_again);
        for i in 0..50 {
            c.sample(50 * MS, t, 1, t + 50 * MS + i);
        }
        assert_eq!(c.min_rtt_ns(), Some(50 * MS));
    }

    #[test]
    fn invalid_settings_are_named() {
        let bad = |s: ControllerSettings| match s.validate() {
            Err(BuildError::Config { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        let d = ControllerSettings::default();
        assert_eq!(
            bad(ControllerSettings { min_limit: 0, ..d }),
            "adaptive.min_limit"
        );
        assert_eq!(
            bad(ControllerSettings { max_limit: 2, ..d }),
            "adaptive.max_limit"
        );
        assert_eq!(
            bad(ControllerSettings {
                initial_limit: 2000,
                ..d
            }),
            "adaptive.initial_limit"
        );
        assert_eq!(
            bad(ControllerSettings {
                percentile: f64::NAN,
                ..d
            }),
            "adaptive.percentile"
        );
        assert_eq!(
            bad(ControllerSettings {
                smoothing: 0.0,
                ..d
            }),
            "adaptive.smoothing"
        );
        assert_eq!(
            bad(ControllerSettings {
                update_interval: Duration::ZERO,
                ..d
            }),
            "adaptive.update_interval"
        );
        assert!(d.validate().is_ok());
    }

    #[test]
    fn the_reservoir_keeps_memory_bounded() {
        let (mut c, t) = measured(ControllerSettings::default(), 10 * MS);
        for i in 0..10_000 {
            c.sample(10 * MS, t, 5, t + i);
        }
        assert!(c.samples.len() <= RESERVOIR);
        assert_eq!(c.seen, 10_000);
    }

    proptest! {
        /// Whatever the latencies, the limit stays within [min_limit, max_limit]; a latency at
        /// or below minRTT never lowers it, one at twice the tolerated latency or more never
        /// raises it, and from the same state a higher latency never gives a higher limit.
        #[test]
        fn limit_stays_in_bounds_and_moves_with_latency(
            min in 1u32..20,
            span in 0u32..500,
            initial_off in 0u32..500,
            smoothing in 0.05f64..=1.0,
            buffer in 0.0f64..1.0,
            rtts in proptest::collection::vec((1u64..200, 1u64..200), 1..80),
        ) {
            let max = min + span;
            let settings = ControllerSettings {
                min_limit: min,
                max_limit: max,
                initial_limit: min + initial_off.min(span),
                smoothing,
                min_rtt_buffer: buffer,
                min_rtt_interval: Duration::from_secs(3600),
                floor_windows: u32::MAX,
                ..ControllerSettings::default()
            };
            prop_assert!(settings.validate().is_ok());
            let (mut c, mut t) = measured(settings, 10 * MS);
            let tolerated = 10.0 * MS as f64 * (1.0 + buffer);
            for (rtt_ms, other_ms) in rtts {
                let before = c.limit();
                let (rtt, other) = (rtt_ms * MS, other_ms * MS);
                let mut alt = c.clone();
                interval(&mut alt, t, other, before);
                t = interval(&mut c, t, rtt, before);
                let after = c.limit();
                prop_assert!((min..=max).contains(&after));
                if rtt as f64 >= 2.0 * tolerated {
                    prop_assert!(after <= before, "rtt {rtt_ms} ms raised {before} -> {after}");
                }
                if rtt <= 10 * MS {
                    prop_assert!(after >= before, "rtt {rtt_ms} ms lowered {before} -> {after}");
                }
                if rtt < other {
                    prop_assert!(after >= alt.limit(), "{rtt_ms} ms -> {after}, {other_ms} ms -> {}", alt.limit());
                }
            }
        }

        /// Any settings, even invalid ones, and any samples: no panic, limit in bounds.
        #[test]
        fn never_panics(
            min in 0u32..50,
            max in 0u32..50,
            initial in 0u32..100,
            percentile in proptest::num::f64::ANY,
            smoothing in proptest::num::f64::ANY,
            samples in proptest::collection::vec((0u64..u64::MAX, 0u64..u64::MAX, 0u32..100), 0..200),
        ) {
            let settings = ControllerSettings {
                min_limit: min,
                max_limit: max,
                initial_limit: initial,
                percentile,
                smoothing,
                ..ControllerSettings::default()
            };
            let mut c = GradientController::new(settings, 3, 0);
            let lo = c.settings().min_limit;
            let hi = c.settings().max_limit;
            for (lat, now, inflight) in samples {
                c.tick(now);
                c.sample(lat, now.saturating_sub(lat), inflight, now);
                prop_assert!((lo..=hi).contains(&c.limit()));
            }
        }
    }
}
