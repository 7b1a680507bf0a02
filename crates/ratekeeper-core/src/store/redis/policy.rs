//! A registered policy as the limiter script sees it: the algorithm code, its parameters in µs,
//! the capacity, how it reserves and its ban; the checks that keep its arithmetic exact.

use std::sync::Arc;

pub(super) use super::protocol::{
    ALGO_FIXED_WINDOW, ALGO_GCRA, RESERVE_GCRA, RESERVE_NONE, RESERVE_SHAPER,
};
use super::protocol::{ALGO_SLIDING_LOG, ALGO_SLIDING_WINDOW, MAX_EXACT};
use crate::store::StoreError;
use crate::{Algorithm, Policy};

/// Largest state span the Redis store accepts (GCRA tolerance `burst * T`, fixed-window
/// length `W`), in µs: 2^48 µs, about 8.9 years.
/// Lua numbers are doubles, exact up to 2^53; Unix time in µs is below 2^51 until 2041, so
/// `now + tau` stays exact.
pub const MAX_TOLERANCE_MICROS: u64 = 1 << 48;

/// A registered policy as the script sees it.
#[derive(Debug, Clone)]
pub(super) struct RedisPolicy {
    pub(super) name: Arc<str>,
    /// The limit decisions report: [`Policy::advertised`].
    pub(super) limit: u32,
    /// Largest cost that can ever fit (burst for GCRA, limit for the windows); also the most
    /// `remaining` can be.
    pub(super) capacity: u32,
    /// Script algorithm code and its three parameters (GCRA: T µs, tau µs, burst; windows:
    /// W µs, limit, 0).
    pub(super) algo: u64,
    pub(super) params: [u64; 3],
    /// How the policy reserves for the Delay mode ([`RESERVE_GCRA`], [`RESERVE_SHAPER`] or
    /// [`RESERVE_NONE`]: a check).
    pub(super) reserve: i64,
    /// The policy's [`Ban`](crate::Ban) as the script reads it: refusals, `within` µs,
    /// `duration` µs (`None`: no ban).
    pub(super) ban: Option<[u64; 3]>,
}

impl RedisPolicy {
    /// The script parameters of `policy`.
    ///
    /// # Errors
    ///
    /// [`StoreError::UnsupportedAlgorithm`] for the concurrency counter (see
    /// `RedisStore::concurrency` for shared concurrency slots);
    /// [`StoreError::UnsupportedQuota`] when the state would span more than
    /// [`MAX_TOLERANCE_MICROS`], a sliding window's `2 * limit * W` reaches 2^53 µs, or the
    /// quota's time step (GCRA and leaky bucket: the emission interval `T`; the windows and
    /// the log: the period `W`) is not a whole µs, the script's time unit: the memory store
    /// keeps it to the ns, and a rounded step would be a silently different rate.
    pub(super) fn new(policy: &Policy) -> Result<Self, StoreError> {
        let quota = policy.quota();
        let (step, what) = match policy.algorithm() {
            Algorithm::Gcra | Algorithm::LeakyBucket => (
                quota.emission_interval_nanos(),
                "its emission interval (period / limit)",
            ),
            _ => (quota.period_nanos(), "its period"),
        };
        if step % 1_000 != 0 {
            return Err(StoreError::UnsupportedQuota(format!(
                "policy {:?}: {what} is {step} ns, not a whole µs; the Redis store keeps time in \
                 µs and would run a different rate than {} per {:?}; choose a limit and period \
                 whose ratio is a whole µs",
                policy.name(),
                quota.limit(),
                quota.period(),
            )));
        }
        let reserve = match policy.algorithm() {
            Algorithm::Gcra => RESERVE_GCRA,
            Algorithm::LeakyBucket => RESERVE_SHAPER,
            _ => RESERVE_NONE,
        };
        let (algo, params, capacity, span_us) = match policy.algorithm() {
            // The leaky-bucket meter is GCRA with capacity = queue depth (= burst).
            Algorithm::Gcra | Algorithm::LeakyBucket => {
                let t_us = quota.emission_interval_nanos().div_ceil(1_000).max(1);
                let tau_us = t_us.saturating_mul(u64::from(quota.burst()));
                (
                    ALGO_GCRA,
                    [t_us, tau_us, u64::from(quota.burst())],
                    quota.burst(),
                    tau_us,
                )
            }
            Algorithm::FixedWindow => {
                let w_us = quota.period_nanos().div_ceil(1_000).max(1);
                (
                    ALGO_FIXED_WINDOW,
                    [w_us, u64::from(quota.limit()), 0],
                    quota.limit(),
                    w_us,
                )
            }
            Algorithm::SlidingWindow => {
                let w_us = quota.period_nanos().div_ceil(1_000).max(1);
                let limit = u64::from(quota.limit());
                // The estimate multiplies counts by W: keep 2 * limit * W exact in a double.
                if w_us.saturating_mul(limit).saturating_mul(2) > MAX_EXACT {
                    return Err(StoreError::UnsupportedQuota(format!(
                        "policy {:?}: 2 * limit * window is more than 2^53 µs, the Redis store's \
                         sliding window counter cannot compute it exactly",
                        policy.name()
                    )));
                }
                (ALGO_SLIDING_WINDOW, [w_us, limit, 0], quota.limit(), w_us)
            }
            Algorithm::SlidingLog => {
                let w_us = quota.period_nanos().div_ceil(1_000).max(1);
                (
                    ALGO_SLIDING_LOG,
                    [w_us, u64::from(quota.limit()), 0],
                    quota.limit(),
                    w_us,
                )
            }
            other => return Err(StoreError::UnsupportedAlgorithm(other)),
        };
        if span_us > MAX_TOLERANCE_MICROS {
            return Err(StoreError::UnsupportedQuota(format!(
                "policy {:?}: its state spans {span_us} µs, more than the Redis store's {MAX_TOLERANCE_MICROS} µs",
                policy.name()
            )));
        }
        Ok(Self {
            name: Arc::from(policy.name()),
            // The advertised quota (the burst for GCRA and the leaky bucket), so that
            // `remaining` never exceeds the reported limit.
            limit: policy.advertised().0,
            capacity,
            algo,
            params,
            reserve,
            // Whole µs (checked by `Policy::validate`), at most 365 days: exact in a double.
            ban: policy.ban().map(|b| {
                [
                    u64::from(b.refusals().get()),
                    b.within_nanos() / 1_000,
                    b.duration_nanos() / 1_000,
                ]
            }),
        })
    }
}
