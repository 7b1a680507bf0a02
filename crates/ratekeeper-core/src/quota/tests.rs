//! Unit tests of `quota.rs`.

use super::*;

#[test]
fn parses_the_documented_forms() {
    let q: Quota = "100/min".parse().unwrap();
    assert_eq!(
        (q.limit(), q.period_nanos(), q.burst()),
        (100, 60 * NS_PER_SEC, 100)
    );
    let q: Quota = "5000 per second".parse().unwrap();
    assert_eq!((q.limit(), q.period_nanos()), (5000, NS_PER_SEC));
    let q: Quota = "  60/m burst 10 ".parse().unwrap();
    assert_eq!(
        (q.limit(), q.period_nanos(), q.burst()),
        (60, 60 * NS_PER_SEC, 10)
    );
    let q: Quota = "1000/day".parse().unwrap();
    assert_eq!(q.period(), Duration::from_secs(86_400));
    let q: Quota = "1_000 PER 10 Seconds BURST 5".parse().unwrap();
    assert_eq!(
        (q.limit(), q.period_nanos(), q.burst()),
        (1000, 10 * NS_PER_SEC, 5)
    );
    let q: Quota = "3/1500ms".parse().unwrap();
    assert_eq!(q.period(), Duration::from_millis(1500));
}

#[test]
fn errors_name_the_bad_part() {
    let cases = [
        ("", QuotaPart::Limit),
        ("-1/min", QuotaPart::Limit),
        ("0/min", QuotaPart::Limit),
        ("4294967296/min", QuotaPart::Limit),
        ("ten/min", QuotaPart::Limit),
        ("10 min", QuotaPart::Separator),
        ("10/0s", QuotaPart::PeriodCount),
        ("10/99999999999d", QuotaPart::PeriodCount),
        ("10/fortnight", QuotaPart::Unit),
        ("10/", QuotaPart::Unit),
        ("10/min burst 0", QuotaPart::Burst),
        ("10/min burst -3", QuotaPart::Burst),
        ("10/min burst", QuotaPart::Burst),
        ("10/min please", QuotaPart::Trailing),
    ];
    for (input, part) in cases {
        let e = input.parse::<Quota>().unwrap_err();
        assert_eq!(e.part(), part, "{input:?}: {e}");
        assert_eq!(e.input(), input);
        assert!(e.to_string().starts_with("invalid quota"), "{e}");
    }
    let e = "-1/min".parse::<Quota>().unwrap_err();
    assert_eq!(
        e.to_string(),
        "invalid quota \"-1/min\": invalid limit \"-1\" (expected a whole number from 1 to 4294967295)"
    );
}

#[test]
fn display_round_trips() {
    for text in [
        "10/min",
        "100/10s",
        "7/1500ms",
        "60/min burst 10",
        "1/day",
        "5/3ns",
        "9/h",
    ] {
        let q: Quota = text.parse().unwrap();
        assert_eq!(q.to_string(), text);
        assert_eq!(q.to_string().parse::<Quota>().unwrap(), q);
    }
}

#[test]
fn invalid_values_are_typed_errors() {
    assert_eq!(
        Quota::new(0, Duration::from_secs(1)),
        Err(QuotaError::ZeroLimit)
    );
    assert_eq!(Quota::new(1, Duration::ZERO), Err(QuotaError::ZeroPeriod));
    assert_eq!(
        Quota::new(1, Duration::from_secs(u64::MAX)),
        Err(QuotaError::PeriodTooLong)
    );
    let q = Quota::new(1, Duration::from_secs(1)).unwrap();
    assert_eq!(q.with_burst(0), Err(QuotaError::ZeroBurst));
    assert!(QuotaError::ZeroBurst.is_burst());
    assert!(QuotaError::PeriodTooLong.is_period());
    assert!(QuotaError::ZeroLimit.is_limit());
}

#[test]
fn emission_interval_rounds_up_and_is_never_zero() {
    let q = Quota::new(3, Duration::from_secs(1)).unwrap();
    assert_eq!(q.emission_interval_nanos(), 333_333_334);
    // The quota's own refill time is exact: 3 per second refills in 1 s, not 1.000000002 s.
    assert_eq!(q.refill_nanos(), NS_PER_SEC);
    assert_eq!(q.tolerance_nanos(), NS_PER_SEC + 2);
    let q = Quota::new(u32::MAX, Duration::from_nanos(1)).unwrap();
    assert_eq!(q.emission_interval_nanos(), 1);
    let q = Quota::new(2_000_000_000, Duration::from_secs(1)).unwrap();
    assert_eq!(q.emission_interval_nanos(), 1);
    assert_eq!(q.refill_nanos(), NS_PER_SEC);
}

/// Item 1 of the sweep: a burst whose refill time `burst × T` would saturate `u64` ns is
/// refused when the quota is built (in every constructor and in the parser), so the
/// tolerance of every quota is exact and its capacity is `burst`.
#[test]
fn sweep_saturated_tolerance_is_a_build_time_error() {
    let daily = Quota::per_day(NonZeroU32::MIN);
    assert_eq!(daily.max_burst(), 213_503);
    assert_eq!(
        daily.with_burst(u32::MAX),
        Err(QuotaError::ToleranceTooLong)
    );
    assert_eq!(daily.with_burst(213_504), Err(QuotaError::ToleranceTooLong));
    let edge = daily.with_burst(213_503).unwrap();
    assert_eq!(edge.tolerance_nanos(), 213_503 * 86_400 * NS_PER_SEC);
    let e = "1/day burst 4294967295".parse::<Quota>().unwrap_err();
    assert_eq!(e.part(), QuotaPart::Burst, "{e}");
    assert!(e.to_string().contains("at most 213503"), "{e}");
    assert_eq!("1/day burst 213503".parse::<Quota>(), Ok(edge));
    // 2 per u64::MAX ns: T = 2^63 ns, so even the default burst (2) would saturate.
    let longest = Duration::from_nanos(u64::MAX);
    assert_eq!(Quota::new(2, longest), Err(QuotaError::ToleranceTooLong));
    assert_eq!(
        Quota::from_nanos(NonZeroU32::new(2).unwrap(), u64::MAX),
        None
    );
    let e = "2/18446744073709551615ns".parse::<Quota>().unwrap_err();
    assert_eq!(e.part(), QuotaPart::PeriodCount, "{e}");
    assert!(QuotaError::ToleranceTooLong.is_burst());
    assert!(QuotaError::ToleranceTooLong.is_period());
    // The edges that fit: 1 per u64::MAX ns (burst 1), u32::MAX per u64::MAX ns.
    let one = Quota::new(1, longest).unwrap();
    assert_eq!((one.max_burst(), one.tolerance_nanos()), (1, u64::MAX));
    let many = Quota::new(u32::MAX, longest).unwrap();
    assert_eq!(many.tolerance_nanos(), u64::MAX);
    // Every accepted quota: tau = burst × T exactly.
    for text in [
        "1/day burst 213503",
        "7/1500ms burst 4294967295",
        "3/h burst 9",
    ] {
        let q: Quota = text.parse().unwrap();
        let exact = u128::from(q.emission_interval_nanos()) * u128::from(q.burst());
        assert_eq!(u128::from(q.tolerance_nanos()), exact, "{text}");
    }
}
