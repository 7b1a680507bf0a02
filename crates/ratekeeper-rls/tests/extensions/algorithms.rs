//! `algorithm` and `period` per limit, on an injected clock: the reference's fixed window
//! admits twice its limit around a window boundary; GCRA, the leaky bucket and the sliding
//! windows do not.

use std::time::Duration;

use crate::on_both_stores;
use crate::support::*;

/// 10 per minute under each algorithm (the key names the algorithm).
const CONFIG: &str = "\
domain: alg
descriptors:
  - key: fixed_window
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: gcra
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: gcra}
  - key: leaky_bucket
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: leaky_bucket}
  - key: sliding_window
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: sliding_window}
  - key: sliding_log
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: sliding_log}
  - key: ten_seconds
    rate_limit: {period: 10s, requests_per_unit: 5}
  - key: ten_seconds_gcra
    rate_limit: {period: 10s, requests_per_unit: 5, algorithm: gcra}
";

/// The next minute boundary after the harness's start time (30 s into a minute).
const BOUNDARY: u64 = START_UNIX_SECS + 30;

/// Hits admitted for `key` out of 10 sent 500 ms before the minute boundary `boundary`
/// (Unix seconds; later than the clock, which never goes back) and 10 sent 500 ms after it.
async fn admitted_around_a_boundary(rls: &mut Rls, key: &str, boundary: u64) -> u32 {
    let mut admitted = 0;
    for at in [
        Duration::from_millis(boundary * 1_000 - 500),
        Duration::from_millis(boundary * 1_000 + 500),
    ] {
        rls.clock.set_elapsed(at);
        for _ in 0..10 {
            let r = rls
                .call(req("alg", vec![desc(&[(key, "client")])], 1))
                .await;
            if r.overall_code == ok() {
                admitted += 1;
            }
        }
    }
    admitted
}

/// The reference's fixed window admits 10 before the boundary and 10 after it: 20 within
/// one second, for a limit of 10 per minute (reproduced: it stays the default).
async fn fixed_window_admits_twice_the_limit_across_a_boundary(b: Backend) {
    let mut rls = Rls::start(b, CONFIG, &[]).await;
    assert_eq!(
        admitted_around_a_boundary(&mut rls, "fixed_window", BOUNDARY).await,
        20
    );
}
on_both_stores!(
    fixed_window_admits_twice_the_limit_across_a_boundary,
    fixed_window_admits_twice_the_limit_across_a_boundary
);

/// GCRA, the leaky bucket and both sliding windows admit the first 10 and refuse the 10
/// sent one second later: at most 10 in any 60 s.
async fn other_algorithms_admit_the_limit_across_a_boundary(b: Backend) {
    let mut rls = Rls::start(b, CONFIG, &[]).await;
    // One boundary per key, a minute apart (the clock only moves forward).
    for (i, key) in ["gcra", "leaky_bucket", "sliding_window", "sliding_log"]
        .into_iter()
        .enumerate()
    {
        let boundary = BOUNDARY + 60 * i as u64;
        assert_eq!(
            admitted_around_a_boundary(&mut rls, key, boundary).await,
            10,
            "{key}"
        );
    }
}
on_both_stores!(
    other_algorithms_admit_the_limit_across_a_boundary,
    other_algorithms_admit_the_limit_across_a_boundary
);

/// A 10 s period: the window turns over every 10 s, `current_limit` reports the limit per
/// MINUTE (the shortest unit covering 10 s, which never overstates it) and
/// `duration_until_reset` is within [1, 10] s.
async fn a_ten_second_period_resets_within_ten_seconds(b: Backend) {
    let mut rls = Rls::start(b, CONFIG, &[]).await;
    // One 10 s window each, 3 s into it (the clock only moves forward).
    for (start, key) in [
        (BOUNDARY + 3, "ten_seconds"),
        (BOUNDARY + 23, "ten_seconds_gcra"),
    ] {
        rls.clock.set_elapsed(Duration::from_secs(start));
        for i in 0..6u32 {
            let r = rls.call(req("alg", vec![desc(&[(key, "c")])], 1)).await;
            let s = &r.statuses[0];
            let limit = s.current_limit.as_ref().expect("a current limit");
            assert_eq!(
                (limit.requests_per_unit, limit.unit),
                (5, 2),
                "{key}: 5 per MINUTE"
            );
            let reset = s.duration_until_reset.as_ref().expect("a reset").seconds;
            assert!((1..=10).contains(&reset), "{key} hit {i}: reset {reset}");
            let want = if i < 5 { (ok(), 4 - i) } else { (over(), 0) };
            assert_eq!(cr(s), want, "{key} hit {}", i + 1);
            if key == "ten_seconds" {
                assert_eq!(reset, 7, "the fixed window ends 7 s later");
            }
        }
        // 10 s later the whole limit is back under both algorithms.
        rls.clock.set_elapsed(Duration::from_secs(start + 10));
        let r = rls.call(req("alg", vec![desc(&[(key, "c")])], 1)).await;
        assert_eq!(cr(&r.statuses[0]), (ok(), 4), "{key} after one period");
    }
}
on_both_stores!(
    a_ten_second_period_resets_within_ten_seconds,
    a_ten_second_period_resets_within_ten_seconds
);
