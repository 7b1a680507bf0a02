use std::time::Duration;

use proptest::prelude::*;

use super::gradient::{RESERVOIR, nanos};
use super::*;
use crate::BuildError;

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
