use std::num::NonZeroU32;
use std::time::Duration;

use super::*;
use crate::Quota;

fn login(ban: Ban) -> Policy {
    Policy::new("login", Quota::per_minute(NonZeroU32::MIN)).with_ban(ban)
}

fn minute() -> Duration {
    Duration::from_secs(60)
}

/// A `within` or `duration` past [`Ban::MAX_DURATION`] is too long, up to `Duration::MAX`
/// (beyond `u64::MAX` ns, where a count of ns saturates to one that is not whole µs).
#[test]
fn bans_past_the_longest_are_too_long_up_to_duration_max() {
    for long in [
        Ban::MAX_DURATION + Duration::from_micros(1),
        Ban::MAX_DURATION + Duration::from_nanos(1),
        Duration::from_nanos(u64::MAX),
        Duration::from_secs(u64::MAX),
        Duration::MAX,
    ] {
        let lasting = login(Ban::after(NonZeroU32::MIN, minute()).lasting(long));
        assert_eq!(
            lasting.validate().unwrap_err().to_string(),
            "invalid ban of policy \"login\": `duration` is longer than 365 days",
            "{long:?}"
        );
        let within = login(Ban::after(NonZeroU32::MIN, long).lasting(minute()));
        assert_eq!(
            within.validate().unwrap_err().to_string(),
            "invalid ban of policy \"login\": `within` is longer than 365 days",
            "{long:?}"
        );
    }
}

/// The longest ban is valid; a fraction of a µs within it, and zero, say so.
#[test]
fn bans_up_to_the_longest_are_checked_for_zero_and_fractions() {
    let longest = login(Ban::after(NonZeroU32::MIN, Ban::MAX_DURATION).lasting(Ban::MAX_DURATION));
    assert_eq!(longest.validate(), Ok(()));
    for (duration, says) in [
        (Duration::ZERO, "`duration` is zero"),
        (
            Ban::MAX_DURATION - Duration::from_nanos(1),
            "`duration` is not a whole number of microseconds",
        ),
        (
            Duration::from_nanos(1),
            "`duration` is not a whole number of microseconds",
        ),
    ] {
        let policy = login(Ban::after(NonZeroU32::MIN, minute()).lasting(duration));
        assert_eq!(
            policy.validate().unwrap_err().to_string(),
            format!("invalid ban of policy \"login\": {says}"),
        );
    }
}

/// A burst other than the limit pairs only with GCRA and the leaky bucket: with a window
/// algorithm or the concurrency counter (which hold `limit`) it is an error naming the
/// policy and the algorithms that take a burst.
#[test]
fn a_burst_with_an_algorithm_that_takes_none_is_refused() {
    let quota: Quota = "10/m burst 3".parse().unwrap();
    for algorithm in Algorithm::ALL {
        let policy = Policy::new("search", quota).with_algorithm(algorithm);
        match algorithm {
            Algorithm::Gcra | Algorithm::LeakyBucket => {
                assert_eq!(policy.validate(), Ok(()), "{algorithm}");
            }
            _ => {
                let err = policy.validate().unwrap_err();
                assert!(err.is_burst() && !err.is_ban(), "{algorithm}");
                assert_eq!(
                    err.to_string(),
                    format!(
                        "policy \"search\" sets burst 3 but algorithm {algorithm} takes no \
                         burst (it holds the limit, 10): remove the burst, or use gcra or \
                         leaky-bucket, the algorithms that take one"
                    )
                );
            }
        }
        // Without a burst (or with burst = limit) every algorithm is fine.
        let plain = Policy::new("search", "10/m burst 10".parse().unwrap());
        assert_eq!(plain.with_algorithm(algorithm).validate(), Ok(()));
    }
    // A burst above the limit is refused the same way.
    let big =
        Policy::new("w", "10/m burst 50".parse().unwrap()).with_algorithm(Algorithm::FixedWindow);
    assert!(big.validate().unwrap_err().is_burst());
}

/// GCRA and the leaky bucket advertise the quota's own refill time, not the sum of the
/// rounded-up emission intervals (7/s is 7 per 1 s, not per 1.000000001 s).
#[test]
fn the_advertised_window_is_the_exact_refill_time() {
    for (text, want) in [
        ("7/s", (7, Duration::from_secs(1))),
        ("3/s", (3, Duration::from_secs(1))),
        ("1000000000/s", (1_000_000_000, Duration::from_secs(1))),
        ("3/s burst 1", (1, Duration::from_nanos(333_333_334))),
        ("1/s burst 10", (10, Duration::from_secs(10))),
    ] {
        let policy = Policy::new("p", text.parse().unwrap());
        assert_eq!(policy.advertised(), want, "{text}");
    }
}

/// A ban or policy of the wrong type names what is expected, not an internal type.
#[cfg(feature = "serde")]
#[test]
fn a_ban_or_policy_of_the_wrong_type_says_what_is_expected() {
    let err = serde_json::from_str::<Ban>("true").unwrap_err().to_string();
    assert_eq!(
        err,
        "invalid type: boolean `true`, expected a ban such as \
         { after = 10, within = \"15m\", duration = \"15m\" } at line 1 column 4"
    );
    let err = serde_json::from_str::<Policy>("[]")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("expected a policy such as { name = \"api\", quota = \"100/min\" }"),
        "{err}"
    );
}

/// A ban duration too large for the count of ns reads as too long, not as unreadable.
#[cfg(feature = "serde")]
#[test]
fn enormous_ban_durations_read_as_too_long() {
    for within in [
        "400d",
        "213503d",
        "99999999999d",
        "184467440737095516160000s",
    ] {
        let json = format!(r#"{{"after": 3, "within": "{within}", "duration": "15m"}}"#);
        let err = serde_json::from_str::<Ban>(&json).unwrap_err().to_string();
        assert!(
            err.starts_with("`within` is longer than 365 days"),
            "{within}: {err}"
        );
    }
    let json = r#"{"after": 3, "within": "1m", "duration": "1 fortnight"}"#;
    let err = serde_json::from_str::<Ban>(json).unwrap_err().to_string();
    assert!(err.starts_with("invalid duration \"1 fortnight\""), "{err}");
}
