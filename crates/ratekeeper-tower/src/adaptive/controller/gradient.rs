//! The algorithm: the gradient step that ends an update interval (see the
//! [module docs](super)), and the latency statistics and the jitter it reads.

use std::time::Duration;

use super::GradientController;

/// Most latencies kept per interval; beyond it a uniform random sample of them is kept
/// (reservoir sampling), so memory stays bounded at any request rate.
pub(super) const RESERVOIR: usize = 1024;

impl GradientController {
    /// Ends an interval: the gradient step (see the [module docs](super)).
    pub(super) fn update(&mut self, now_ns: u64) {
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

    pub(super) fn push(&mut self, latency_ns: u64) {
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
    pub(super) fn next_interval(&mut self) -> u64 {
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

pub(super) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The `p`-th percentile by the nearest-rank method (`None` for no samples).
pub(super) fn percentile(samples: &mut [u64], p: f64) -> Option<u64> {
    if samples.is_empty() {
        return None;
    }
    let n = samples.len();
    let rank = ((p * n as f64).ceil() as usize).clamp(1, n);
    let (_, v, _) = samples.select_nth_unstable(rank - 1);
    Some(*v)
}
