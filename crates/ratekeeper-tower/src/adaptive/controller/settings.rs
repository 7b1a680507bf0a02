//! The settings of a [`GradientController`](super::GradientController): defaults, their
//! check, and the clamping that keeps a controller built from unchecked ones from panicking.

use std::time::Duration;

use crate::BuildError;

/// The settings of a [`GradientController`](super::GradientController). The defaults are
/// Envoy's where Envoy has one (p50, 25 % buffer, 60 s minRTT interval with 15 % jitter, 50
/// requests at concurrency 3), the 100 ms update interval of Envoy's documented example
/// (Envoy requires the field), Gradient2's initial limit (20), and a smoothing weight of 0.5
/// (Gradient2 uses 0.2; 0.5 settles after a capacity change within about 1 s at the default
/// interval).
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

/// Clamps every setting into its valid range, so a controller built without
/// [`ControllerSettings::validate`] still never panics or divides by zero.
pub(super) fn sanitize(mut s: ControllerSettings) -> ControllerSettings {
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
