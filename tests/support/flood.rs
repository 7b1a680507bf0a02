//! A bounded flood of one client key through several Redis store handles: `instances` app
//! instances (tokio tasks, each with its own [`RedisStore`], default deadline and failure
//! policy `Allow`), each offering `rate` checks per second for `duration`, every check its
//! own task as in a server. Reports what was admitted, in fixed and sliding 1 s windows,
//! and how each instance decided (Redis, negative cache, failure policy).
//!
//! Used by the `flood` binary (`cargo run -p ratekeeper-tests --bin flood -- <redis url>`),
//! which the fleet harness runs as one of its rows.

use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ratekeeper_core::store::Store;
use ratekeeper_core::store::redis::{RedisStats, RedisStore};
use ratekeeper_core::{Key, Policy, Quota};

/// What a flood offers.
#[derive(Debug, Clone)]
pub struct FloodConfig {
    /// App instances (Redis store handles).
    pub instances: usize,
    /// Checks per second offered by each instance.
    pub rate: u32,
    /// How long the flood lasts.
    pub duration: Duration,
    /// The policy every instance enforces on the one key.
    pub policy: Policy,
}

impl Default for FloodConfig {
    /// 8 instances × 1 500 checks/s (12 000/s) for 5 s against GCRA 1 000/s, burst 100 (so
    /// a 1 s window may hold at most 1 100 admissions).
    fn default() -> Self {
        let quota = Quota::per_second(std::num::NonZeroU32::new(1_000).expect("non-zero"))
            .with_burst(100)
            .expect("valid burst");
        Self {
            instances: 8,
            rate: 1_500,
            duration: Duration::from_secs(5),
            policy: Policy::new("flood", quota),
        }
    }
}

/// What a flood admitted.
#[derive(Debug, Clone)]
pub struct FloodReport {
    /// Checks sent.
    pub offered: u64,
    /// Checks admitted.
    pub admitted: u64,
    /// Most admissions in any 1 s window (sliding over admission times).
    pub worst_window: u64,
    /// Admissions in each whole second from the start.
    pub per_second: Vec<u64>,
    /// Each instance's store counters at the end.
    pub stats: Vec<RedisStats>,
    /// Check latency (as the caller sees it): median, 99th percentile, worst.
    pub latency: [Duration; 3],
}

impl FloodReport {
    /// The sum of the instances' counters.
    pub fn total(&self) -> (u64, u64, u64) {
        self.stats.iter().fold((0, 0, 0), |(r, n, d), s| {
            (
                r + s.redis_decisions,
                n + s.negative_cache_hits,
                d + s.degraded,
            )
        })
    }
}

/// Runs the flood against the Redis at `url` (keys under `prefix`).
///
/// # Panics
///
/// When a store cannot be built or refuses the policy.
pub async fn flood(url: &str, prefix: &str, config: &FloodConfig) -> FloodReport {
    let mut stores = Vec::new();
    for _ in 0..config.instances {
        let mut store = RedisStore::builder()
            .prefix(prefix)
            .standalone(url)
            .await
            .expect("redis store");
        let id = store.register(&config.policy).expect("policy");
        // One check to connect and learn Redis's clock before the flood starts.
        let _ = store.check_async(&[(id, Key::from("warm-up"), 1)]).await;
        stores.push((Arc::new(store), id));
    }
    let start = Instant::now();
    let admitted: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let latencies: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let mut instances = Vec::new();
    for (store, id) in &stores {
        let (store, id, admitted) = (Arc::clone(store), *id, Arc::clone(&admitted));
        let latencies = Arc::clone(&latencies);
        let (rate, duration) = (config.rate, config.duration);
        instances.push(tokio::spawn(async move {
            let key = Key::from("flooded");
            let mut sent = 0u64;
            let mut checks = Vec::new();
            let mut tick = tokio::time::interval(Duration::from_millis(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            loop {
                tick.tick().await;
                let elapsed = start.elapsed();
                if elapsed >= duration {
                    break;
                }
                let due = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX) * u64::from(rate)
                    / 1_000_000;
                while sent < due {
                    sent += 1;
                    let (store, key, admitted) =
                        (Arc::clone(&store), key.clone(), Arc::clone(&admitted));
                    let latencies = Arc::clone(&latencies);
                    checks.push(tokio::spawn(async move {
                        let asked = Instant::now();
                        let allowed = store
                            .check_async(&[(id, key, 1)])
                            .await
                            .map_or(true, |d| d.is_allowed());
                        latencies.lock().expect("latencies").push(asked.elapsed());
                        if allowed {
                            admitted.lock().expect("admissions").push(start.elapsed());
                        }
                    }));
                }
            }
            for c in checks {
                let _ = c.await;
            }
            sent
        }));
    }
    let mut offered = 0;
    for i in instances {
        offered += i.await.expect("instance task");
    }
    let mut times = admitted.lock().expect("admissions").clone();
    times.sort_unstable();
    let mut worst = 0u64;
    let mut lo = 0;
    for (hi, t) in times.iter().enumerate() {
        while *t - times[lo] >= Duration::from_secs(1) {
            lo += 1;
        }
        worst = worst.max(u64::try_from(hi - lo + 1).unwrap_or(u64::MAX));
    }
    let seconds = usize::try_from(config.duration.as_secs()).unwrap_or(0) + 1;
    let mut per_second = vec![0u64; seconds];
    for t in &times {
        let s = usize::try_from(t.as_secs()).unwrap_or(usize::MAX);
        if let Some(n) = per_second.get_mut(s) {
            *n += 1;
        }
    }
    let mut lat = latencies.lock().expect("latencies").clone();
    lat.sort_unstable();
    let at = |q: usize| {
        lat.get(lat.len().saturating_sub(1) * q / 100)
            .copied()
            .unwrap_or_default()
    };
    FloodReport {
        latency: [at(50), at(99), at(100)],
        offered,
        admitted: u64::try_from(times.len()).unwrap_or(u64::MAX),
        worst_window: worst,
        per_second,
        stats: stores.iter().map(|(s, _)| s.stats()).collect(),
    }
}
