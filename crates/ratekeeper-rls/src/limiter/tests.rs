use std::sync::Arc;

use ratekeeper_core::clock::ManualClock;

use super::*;

fn memory(clock: &ManualClock) -> Limiter {
    let shared = SharedClock(Arc::new(clock.clone()));
    Limiter::new(
        Backend::Memory(MemoryStore::with_clock(shared.clone())),
        shared,
    )
}

fn hit(limit: u32, period_secs: u64, key: &Key, cost: u64) -> Hit {
    Hit {
        limit: NonZeroU32::new(limit).unwrap(),
        period_secs,
        algorithm: Algorithm::FixedWindow,
        on_failure: crate::config::OnStoreFailure::Unavailable,
        key: key.clone(),
        cost,
    }
}

#[tokio::test]
async fn a_week_window_turns_over_on_thursday_midnight_utc() {
    // 1970-01-01 was a Thursday: week i starts at i * 604800 s. Week 2900 starts on
    // Thursday 2025-07-31 00:00:00 UTC (1_753_920_000 s).
    let week_start = 2_900 * 604_800_u64;
    assert_eq!(week_start, 1_753_920_000);
    let clock = ManualClock::new();
    clock.set_elapsed(Duration::from_secs(week_start - 1));
    let limiter = memory(&clock);
    let key = counter_key("", "d", "k");
    assert!(
        limiter
            .charge(&hit(1, 604_800, &key, 1))
            .await
            .unwrap()
            .is_allowed()
    );
    assert!(
        !limiter
            .charge(&hit(1, 604_800, &key, 1))
            .await
            .unwrap()
            .is_allowed()
    );
    assert_eq!(until_reset(limiter.unix_now(), 604_800), 1);
    clock.advance(Duration::from_secs(1));
    assert_eq!(until_reset(limiter.unix_now(), 604_800), 604_800);
    assert!(
        limiter
            .charge(&hit(1, 604_800, &key, 1))
            .await
            .unwrap()
            .is_allowed()
    );
}

#[tokio::test]
async fn month_and_year_are_blocks_of_30_and_365_days_since_the_epoch() {
    for unit in [30 * 86_400_u64, 365 * 86_400] {
        let start = 20 * unit;
        let clock = ManualClock::new();
        clock.set_elapsed(Duration::from_secs(start - 2));
        let limiter = memory(&clock);
        let key = counter_key("", "d", "k");
        assert!(
            limiter
                .charge(&hit(1, unit, &key, 1))
                .await
                .unwrap()
                .is_allowed()
        );
        assert!(
            !limiter
                .charge(&hit(1, unit, &key, 1))
                .await
                .unwrap()
                .is_allowed()
        );
        assert_eq!(until_reset(limiter.unix_now(), unit), 2);
        clock.advance(Duration::from_secs(2));
        assert!(
            limiter
                .charge(&hit(1, unit, &key, 1))
                .await
                .unwrap()
                .is_allowed()
        );
    }
}

#[test]
fn until_reset_is_never_zero() {
    assert_eq!(until_reset(Duration::from_secs(120), 60), 60);
    assert_eq!(until_reset(Duration::from_millis(120_999), 60), 60);
    assert_eq!(until_reset(Duration::from_secs(121), 60), 59);
    assert_eq!(until_reset(Duration::from_secs(179), 60), 1);
}

#[test]
fn counter_keys_hide_the_values_and_differ_by_prefix_domain_and_counter() {
    let a = counter_key("", "d", "api_key_sk-live-123");
    assert!(!a.to_string().contains("sk-live"));
    assert_eq!(a.to_string().len(), 24);
    assert_eq!(a, counter_key("", "d", "api_key_sk-live-123"));
    assert_ne!(a, counter_key("p", "d", "api_key_sk-live-123"));
    assert_ne!(a, counter_key("", "e", "api_key_sk-live-123"));
    // Lengths are hashed too: moving a character between parts changes the key.
    assert_ne!(counter_key("", "da", "b"), counter_key("", "d", "ab"));
}

#[tokio::test]
async fn policies_are_registered_once_per_limit_and_unit() {
    let clock = ManualClock::new();
    let limiter = memory(&clock);
    let a = limiter
        .policy(NonZeroU32::new(5).unwrap(), 60, Algorithm::FixedWindow)
        .unwrap();
    let b = limiter
        .policy(NonZeroU32::new(5).unwrap(), 60, Algorithm::FixedWindow)
        .unwrap();
    let c = limiter
        .policy(NonZeroU32::new(5).unwrap(), 1, Algorithm::FixedWindow)
        .unwrap();
    let d = limiter
        .policy(NonZeroU32::new(5).unwrap(), 60, Algorithm::Gcra)
        .unwrap();
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert_ne!(a, d);
}
