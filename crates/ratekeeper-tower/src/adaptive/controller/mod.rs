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
//!    percentile of the latencies that completed in the interval. A request that got no
//!    response (the service failed: a timeout, a reset connection; or the request was
//!    dropped) counts with its elapsed time, a lower bound of its latency, as Netflix
//!    concurrency-limits counts a dropped request; so a service that fails slowly lowers
//!    the limit. Failures never count toward `minRTT`.
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

mod gradient;
mod settings;
#[cfg(test)]
mod tests;

use self::gradient::{nanos, percentile};
use self::settings::sanitize;

pub use self::settings::ControllerSettings;

/// A change of the limit, returned by the call that made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitChange {
    /// The limit before.
    pub from: u32,
    /// The limit after.
    pub to: u32,
}

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Completion {
    /// The service answered (any status).
    Answered,
    /// The service failed or the request was dropped before an answer.
    Failed,
}

#[derive(Debug, Clone)]
enum Phase {
    /// Measuring `minRTT` since `since` (ns): the limit is `min_limit`.
    Measuring { since: u64 },
    /// Adjusting the limit; the next measurement starts at `next_measurement` (ns).
    Running { next_measurement: u64 },
}

/// The gradient controller (see the [module docs](self)): feed it each admitted request's
/// latency with [`GradientController::sample`] (or its elapsed time with
/// [`GradientController::failure`] when it got no response), read [`GradientController::limit`] before
/// admitting one. Not synchronised: the layer keeps it behind a lock.
///
/// ```
/// use std::time::Duration;
/// use ratekeeper_tower::adaptive::controller::{ControllerSettings, GradientController};
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
    /// [`RESERVOIR`](gradient::RESERVOIR)).
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
        self.record(
            latency_ns,
            started_ns,
            in_flight,
            now_ns,
            Completion::Answered,
        )
    }

    /// Records a request that got no response: the service failed (an error, such as a
    /// timeout or a reset connection) or the request was dropped (its caller gave up, an
    /// outer timeout fired) after `elapsed_ns`, for a request admitted at `started_ns` with
    /// `in_flight` requests in flight at admission, ended at `now_ns`. Returns the change of
    /// [`limit`](Self::limit), if any.
    ///
    /// The elapsed time is a lower bound of the latency the request would have had, and
    /// counts as a latency of the running interval (as Netflix concurrency-limits counts a
    /// dropped request's time): a service that fails slowly lowers the limit as a slow one
    /// does, down to [`ControllerSettings::min_limit`]. It never counts toward a `minRTT`
    /// measurement (a failure says nothing about the latency with no queue), so a
    /// measurement during which every request fails keeps the limit at `min_limit` until
    /// requests succeed again.
    pub fn failure(
        &mut self,
        elapsed_ns: u64,
        started_ns: u64,
        in_flight: u32,
        now_ns: u64,
    ) -> Option<LimitChange> {
        self.record(
            elapsed_ns,
            started_ns,
            in_flight,
            now_ns,
            Completion::Failed,
        )
    }

    fn record(
        &mut self,
        latency_ns: u64,
        started_ns: u64,
        in_flight: u32,
        now_ns: u64,
        completion: Completion,
    ) -> Option<LimitChange> {
        let before = self.limit();
        match self.phase {
            Phase::Measuring { since } => {
                if started_ns >= since && completion == Completion::Answered {
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
}
