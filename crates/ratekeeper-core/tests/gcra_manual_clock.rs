//! GCRA through the memory store on a `ManualClock`: burst, refill after idle, cost n, cost
//! larger than the burst, exact `retry_after`, `remaining` never negative, saturation.

use std::time::Duration;

use ratekeeper_core::clock::ManualClock;
use ratekeeper_core::store::{Charge, MemoryStore, PolicyId, Store};
use ratekeeper_core::{Decision, Key, Outcome, Policy, Quota};

fn setup(
    limit: u32,
    period: Duration,
    burst: u32,
) -> (MemoryStore<Key, ManualClock>, PolicyId, ManualClock) {
    let clock = ManualClock::new();
    let mut store = MemoryStore::with_clock(clock.clone());
    let quota = Quota::new(limit, period)
        .unwrap()
        .with_burst(burst)
        .unwrap();
    let id = store.register(&Policy::new("p", quota)).unwrap();
    (store, id, clock)
}

fn check(store: &MemoryStore<Key, ManualClock>, id: PolicyId, cost: u64) -> Decision {
    let key = Key::from("client");
    let decisions = store.check_now(&[Charge::new(id, &key, cost)]).unwrap();
    decisions.as_slice()[0]
}

#[test]
fn burst_then_exact_retry_after_then_one_per_interval() {
    // 10 per minute, burst 10: T = 6 s.
    let (store, id, clock) = setup(10, Duration::from_secs(60), 10);
    for expected in (0..10).rev() {
        let d = check(&store, id, 1);
        assert_eq!(
            (d.is_allowed(), d.remaining(), d.limit()),
            (true, expected, 10)
        );
    }
    let denied = check(&store, id, 1);
    assert_eq!(
        denied.outcome(),
        Outcome::Denied {
            retry_after: Duration::from_secs(6)
        }
    );
    assert_eq!(denied.remaining(), 0);
    assert_eq!(denied.reset_after(), Duration::from_secs(60));
    // One nanosecond before retry_after: still denied, with 1 ns left. At it: allowed.
    clock.advance(Duration::from_secs(6) - Duration::from_nanos(1));
    assert_eq!(
        check(&store, id, 1).retry_after(),
        Some(Duration::from_nanos(1))
    );
    clock.advance(Duration::from_nanos(1));
    let d = check(&store, id, 1);
    assert!(d.is_allowed());
    assert_eq!(d.remaining(), 0);
}

#[test]
fn refill_after_idle_gives_no_extra_free_request() {
    let (store, id, clock) = setup(10, Duration::from_secs(60), 10);
    for _ in 0..10 {
        assert!(check(&store, id, 1).is_allowed());
    }
    // A day idle refills to the burst, never beyond it.
    clock.advance(Duration::from_secs(86_400));
    for expected in (0..10).rev() {
        assert_eq!(check(&store, id, 1).remaining(), expected);
    }
    assert!(check(&store, id, 1).is_denied());
}

#[test]
fn cost_n_and_cost_larger_than_burst() {
    let (store, id, clock) = setup(10, Duration::from_secs(1), 10);
    let d = check(&store, id, 4);
    assert_eq!((d.is_allowed(), d.remaining()), (true, 6));
    // Denied cost 7 charges nothing and says exactly when it would fit (1 unit = 100 ms).
    let d = check(&store, id, 7);
    assert_eq!(d.retry_after(), Some(Duration::from_millis(100)));
    assert_eq!(d.remaining(), 6);
    // Cost 11 > burst 10: never fits, no retry time, state unchanged.
    let d = check(&store, id, 11);
    assert!(d.is_cannot_fit());
    assert_eq!((d.retry_after(), d.remaining()), (None, 6));
    assert!(check(&store, id, u64::MAX).is_cannot_fit());
    clock.advance(Duration::from_millis(100));
    assert!(check(&store, id, 7).is_allowed());
}

#[test]
fn remaining_never_negative_under_a_random_walk() {
    let (store, id, clock) = setup(5, Duration::from_secs(1), 3);
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for _ in 0..5_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        clock.advance(Duration::from_nanos(x % 300_000_000));
        let d = check(&store, id, x % 5);
        assert!(d.remaining() <= 3);
        if let Some(wait) = d.retry_after() {
            assert!(wait > Duration::ZERO);
        }
    }
}

#[test]
fn saturating_at_extreme_quotas_and_clock_values() {
    let quotas = [
        (1, Duration::from_nanos(1), 1),
        // The fastest rate a quota holds (1 per ns) with the largest burst.
        (1, Duration::from_nanos(1), u32::MAX),
        (1, Duration::from_nanos(u64::MAX), 1),
        (u32::MAX, Duration::from_nanos(u64::MAX), u32::MAX),
        (1, Duration::from_secs(86_400), 213_503),
        (u32::MAX, Duration::from_nanos(u64::MAX), 1),
    ];
    for (limit, period, burst) in quotas {
        let (store, id, clock) = setup(limit, period, burst);
        for at in [0, 1, u64::MAX / 2, u64::MAX - 1, u64::MAX] {
            clock.set(at);
            for cost in [0, 1, 2, u64::from(u32::MAX), u64::MAX] {
                let d = check(&store, id, cost);
                assert!(d.remaining() <= burst);
                if let Some(wait) = d.retry_after() {
                    assert!(wait > Duration::ZERO);
                }
            }
        }
    }
    // 1 per u64::MAX ns: the second request waits a finite, saturated time.
    let (store, id, _clock) = setup(1, Duration::from_nanos(u64::MAX), 1);
    assert!(check(&store, id, 1).is_allowed());
    assert_eq!(
        check(&store, id, 1).retry_after(),
        Some(Duration::from_nanos(u64::MAX))
    );
}
