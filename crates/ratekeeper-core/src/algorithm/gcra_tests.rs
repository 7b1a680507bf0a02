//! Unit tests of `gcra.rs`.

use super::*;
use std::num::NonZeroU32;

const S: u64 = 1_000_000_000;

fn gcra(limit: u32, period: Duration, burst: u32) -> Gcra {
    Gcra::new(
        &Quota::new(limit, period)
            .unwrap()
            .with_burst(burst)
            .unwrap(),
    )
}

/// Runs `cost` at `now` against `tat`, storing the new TAT when allowed.
fn run(g: &Gcra, tat: &mut u64, now: u64, cost: u64) -> Decision {
    let (d, next) = g.decide(*tat, now, cost);
    if let Some(n) = next {
        *tat = n;
    }
    d
}

#[test]
fn burst_then_deny_with_exact_retry_after() {
    let g = gcra(10, Duration::from_secs(60), 10);
    let mut tat = 0;
    for rem in (0..10).rev() {
        let d = run(&g, &mut tat, 0, 1);
        assert!(d.is_allowed());
        assert_eq!(d.remaining(), rem);
        assert_eq!(d.limit(), 10);
    }
    let d = run(&g, &mut tat, 0, 1);
    assert_eq!(d.retry_after(), Some(Duration::from_secs(6)));
    assert_eq!(d.remaining(), 0);
    assert_eq!(d.reset_after(), Duration::from_secs(60));
    // Exactly at retry_after it passes; one ns earlier it does not.
    assert!(run(&g, &mut tat.clone(), 6 * S - 1, 1).is_denied());
    assert!(run(&g, &mut tat, 6 * S, 1).is_allowed());
}

#[test]
fn refill_after_idle_gives_no_extra_request() {
    let g = gcra(10, Duration::from_secs(60), 10);
    let mut tat = 0;
    run(&g, &mut tat, 0, 1);
    // Idle for an hour: the bucket is full (burst 10), not 10 + 600.
    let now = 3_600 * S;
    for rem in (0..10).rev() {
        assert_eq!(run(&g, &mut tat, now, 1).remaining(), rem);
    }
    assert!(run(&g, &mut tat, now, 1).is_denied());
}

#[test]
fn cost_n_charges_n_and_denial_charges_nothing() {
    let g = gcra(10, Duration::from_secs(10), 10);
    let mut tat = 0;
    let d = run(&g, &mut tat, 0, 4);
    assert_eq!(d.remaining(), 6);
    assert_eq!(d.reset_after(), Duration::from_secs(4));
    let d = run(&g, &mut tat, 0, 7);
    assert_eq!(d.retry_after(), Some(Duration::from_secs(1)));
    assert_eq!(d.remaining(), 6);
    assert_eq!(run(&g, &mut tat, 0, 6).remaining(), 0);
}

/// A cost above the burst can never fit (the report
/// <https://github.com/boinkor-net/governor/issues/11>: it was answered "not yet"): burst 10,
/// 1 per 100 ms, cost 11.
#[test]
fn cost_larger_than_burst_can_never_fit_and_changes_nothing() {
    let g = gcra(10, Duration::from_secs(1), 10);
    let mut tat = 0;
    let d = run(&g, &mut tat, 0, 11);
    assert!(d.is_cannot_fit());
    assert_eq!(d.retry_after(), None);
    assert_eq!(d.remaining(), 10);
    assert_eq!(tat, 0);
    assert_eq!(run(&g, &mut tat, 1_000_000, 1).remaining(), 9);
    let d = run(&g, &mut tat, 2_000_000, 11);
    assert!(d.is_cannot_fit());
    assert_eq!(d.remaining(), 9);
    assert_eq!(run(&g, &mut tat, 3_000_000, 1).remaining(), 8);
    assert!(run(&g, &mut tat, 0, u64::MAX).is_cannot_fit());
}

#[test]
fn cost_zero_is_a_free_probe() {
    let g = gcra(2, Duration::from_secs(1), 2);
    let mut tat = 0;
    assert_eq!(run(&g, &mut tat, 0, 0).remaining(), 2);
    assert_eq!(tat, 0);
}

#[test]
fn remaining_never_negative_and_never_above_burst() {
    let g = gcra(5, Duration::from_secs(1), 3);
    let mut tat = 0;
    for i in 0..100u64 {
        let d = run(&g, &mut tat, i * 7_000_000, 1 + i % 3);
        assert!(d.remaining() <= 3);
    }
}

#[test]
fn saturating_at_extreme_quotas_and_clocks() {
    let extremes = [
        gcra(1, Duration::from_nanos(1), 1),
        gcra(u32::MAX, Duration::from_nanos(1), u32::MAX),
        gcra(1, Duration::from_nanos(u64::MAX), 1),
        gcra(u32::MAX, Duration::from_nanos(u64::MAX), 1),
        gcra(u32::MAX, Duration::from_nanos(u64::MAX), u32::MAX),
        // The largest burst 1 per day accepts (u64::MAX / T): tau just below u64::MAX.
        gcra(1, Duration::from_secs(86_400), 213_503),
    ];
    for g in extremes {
        for now in [0, 1, u64::MAX / 2, u64::MAX - 1, u64::MAX] {
            for tat0 in [0, now, u64::MAX] {
                for cost in [0, 1, 2, u64::from(u32::MAX), u64::MAX] {
                    let mut tat = tat0;
                    let d = run(&g, &mut tat, now, cost);
                    assert!(d.remaining() <= g.burst);
                    if let Some(r) = d.retry_after() {
                        assert!(r > Duration::ZERO);
                    }
                    let _ = g.refunded(tat, now, cost, tat0);
                }
            }
        }
    }
}

/// A huge period (configuration values of
/// <https://github.com/spring-cloud/spring-cloud-gateway/issues/168>): 1 per ~584 years
/// (the most u64 ns hold) denies the second request with a finite retry.
#[test]
fn limit_one_per_huge_period_denies_second_with_finite_retry() {
    let g = gcra(1, Duration::from_nanos(u64::MAX), 1);
    let mut tat = 0;
    assert!(run(&g, &mut tat, 0, 1).is_allowed());
    let d = run(&g, &mut tat, 0, 1);
    assert_eq!(d.retry_after(), Some(Duration::from_nanos(u64::MAX)));
}

/// A huge rate (configuration values of
/// <https://github.com/spring-cloud/spring-cloud-gateway/issues/168>): 2e9 per second with
/// burst 2e9 admits them all at t = 0.
#[test]
fn huge_rate_admits_all_at_frozen_time() {
    let q = Quota::per_second(NonZeroU32::new(2_000_000_000).unwrap());
    let g = Gcra::new(&q);
    let mut tat = 0;
    for _ in 0..100_000 {
        assert!(run(&g, &mut tat, 0, 1).is_allowed());
    }
}

/// The decision as first written, entirely in u128: the u64 fast paths must agree.
fn reference(g: &Gcra, stored: u64, now: u64, cost: u64) -> (Decision, Option<u64>) {
    let (t, tau) = (u128::from(g.t.get()), u128::from(g.tau));
    let tat = stored.clamp(now, now.saturating_add(g.tau));
    let report = |outcome, tat: u64| {
        let room = (u128::from(now) + tau).saturating_sub(u128::from(tat));
        let remaining = (room / t).min(u128::from(g.burst)) as u32;
        let reset = Duration::from_nanos(tat.saturating_sub(now));
        Decision::new(outcome, g.burst, remaining, reset)
    };
    if cost > u64::from(g.burst) {
        return (report(Outcome::CannotFit, tat), None);
    }
    if cost == 0 {
        return (report(Outcome::Allowed, tat), None);
    }
    let new_tat = u128::from(tat) + u128::from(cost) * t;
    let allow_at = new_tat.saturating_sub(tau);
    if allow_at > u128::from(now) {
        let wait = u64::try_from(allow_at - u128::from(now)).unwrap_or(u64::MAX);
        let retry_after = Duration::from_nanos(wait);
        (report(Outcome::Denied { retry_after }, tat), None)
    } else {
        let new_tat = u64::try_from(new_tat).unwrap_or(u64::MAX);
        (report(Outcome::Allowed, new_tat), Some(new_tat))
    }
}

proptest::proptest! {
    /// The decision agrees with the u128 reference, and the memory store's keyed check (its
    /// ns-only fast path) with the general path, state included.
    #[test]
    fn fast_paths_agree_with_u128_reference(
        limit in 1u32..,
        period in proptest::prop_oneof![1u64..1_000_000_000_000, proptest::num::u64::ANY],
        burst in 1u32..,
        stored in proptest::prop_oneof![0u64..1 << 40, proptest::num::u64::ANY],
        now in proptest::prop_oneof![0u64..1 << 40, proptest::num::u64::ANY],
        cost in proptest::prop_oneof![0u64..4, proptest::num::u64::ANY],
    ) {
        let Ok(q) = Quota::new(limit, Duration::from_nanos(period)) else {
            return Ok(());
        };
        let g = Gcra::new(&q.with_burst(burst.min(q.max_burst())).unwrap());
        proptest::prop_assert_eq!(g.decide(stored, now, cost), reference(&g, stored, now, cost));

        let (fast, general) = (AtomicU64::new(stored), AtomicU64::new(stored));
        proptest::prop_assert_eq!(
            g.check(&fast, now, cost),
            g.check_general(&general, now, cost)
        );
        proptest::prop_assert_eq!(fast.load(Ordering::Relaxed), general.load(Ordering::Relaxed));
    }
}

#[test]
fn atomic_check_and_refund() {
    let g = gcra(2, Duration::from_secs(1), 2);
    let s = AtomicU64::new(0);
    let (d, receipt) = g.check(&s, 0, 2);
    assert!(d.is_allowed());
    assert_eq!(receipt, Receipt::new(S));
    let (denied, nothing) = g.check(&s, 0, 1);
    assert!(denied.is_denied());
    assert_eq!(nothing, Receipt::NONE);
    assert_eq!(KeyedAlgorithm::peek(&g, &s, 0, 1).remaining(), 0);
    // Half of the charge (one of its two units) is given back.
    g.refund(&s, 0, 1, S);
    assert_eq!(KeyedAlgorithm::peek(&g, &s, 0, 1).remaining(), 1);
    assert!(!g.is_idle(&s, 0));
    assert!(g.is_idle(&s, S));
}

/// The refund rules of [`Gcra::refunded`], one by one (burst 2, T = 30 s, tau = 60 s).
#[test]
fn refunds_give_back_only_what_the_charge_still_holds() {
    let g = gcra(2, Duration::from_secs(60), 2);
    let t = 30 * S;
    // The latest charge, refunded before it drained: undone.
    assert_eq!(g.refunded(t, 0, 1, t), 0);
    // Partly drained (10 s later): the TAT goes back to 0, which reads as "now": the
    // 20 s still outstanding come back, the 10 s already drained do not.
    let after = g.refunded(t, 10 * S, 1, t);
    assert_eq!(g.in_force(after, 10 * S), 10 * S);
    // Fully drained: nothing.
    assert_eq!(g.refunded(t, 30 * S, 1, t), t);
    // A later charge (stamp 60 s) that already proceeded: give back the undrained part
    // of the first charge (20 s at t = 10 s), never moving the TAT below now.
    assert_eq!(g.refunded(2 * t, 10 * S, 1, t), 40 * S);
    // A late refund (as in https://github.com/express-rate-limit/express-rate-limit/pull/647):
    // the charge of t = 0 was drained long ago; the bucket is full of new charges at 120 s
    // (TAT 180 s): the refund gives back nothing.
    assert_eq!(g.refunded(180 * S, 120 * S, 1, t), 180 * S);
    // Burst 1, T = 1 s: a reservation waits behind the charge (TAT 2 s - tau > now):
    // nothing, or a newcomer would pass at the waiter's instant.
    let one = gcra(1, Duration::from_secs(1), 1);
    assert_eq!(one.refunded(2 * S, 0, 1, S), 2 * S);
    // Cost larger than the charge held, at the end of time: saturates, never panics.
    assert_eq!(one.refunded(u64::MAX, u64::MAX - 1, u64::MAX, u64::MAX), 0);
}

/// A quota changed between deploys (<https://github.com/3scale/APIcast/issues/667>), on the
/// pure algorithm: a TAT written under "1 per 3,600,000 ms, burst 1", read at t = 1,000 ms
/// under "100 per 60,000 ms, burst 100", is clamped to now + tau: no wait longer than the new
/// quota needs from empty (60 s), Reset at most 60 s.
#[test]
fn state_from_an_old_quota_is_clamped_to_the_quota_in_force() {
    let old = gcra(1, Duration::from_secs(3_600), 1);
    let (first, tat) = old.decide(0, 0, 1);
    assert!(first.is_allowed());
    let tat = tat.unwrap();
    assert_eq!(tat, 3_600 * S);
    let new = gcra(100, Duration::from_secs(60), 100);
    let now = S;
    let (d, _) = new.decide(tat, now, 1);
    let retry = d.retry_after().unwrap();
    assert_eq!(retry, Duration::from_millis(600));
    assert!(retry <= Duration::from_secs(60));
    assert_eq!((d.remaining(), d.limit()), (0, 100));
    assert_eq!(d.reset_after(), Duration::from_secs(60));
    assert_eq!(new.peek(tat, now, 1), d);
    // Within the new quota's horizon the state is read as is.
    assert_eq!(new.in_force(30 * S, now), 30 * S);
    assert_eq!(new.in_force(0, now), now);
}

/// A decision's limit is the capacity, so Remaining never exceeds it.
#[test]
fn a_decisions_limit_is_the_burst() {
    // P1: 1 per 1,000 ms, burst 10. P2: 100 per 60,000 ms, burst 10.
    for g in [
        gcra(1, Duration::from_secs(1), 10),
        gcra(100, Duration::from_secs(60), 10),
    ] {
        let mut tat = 0;
        for expected in (0..10).rev() {
            let d = run(&g, &mut tat, 0, 1);
            assert_eq!((d.limit(), d.remaining()), (10, expected));
        }
        let d = run(&g, &mut tat, 0, 1);
        assert!(d.is_denied());
        assert_eq!((d.limit(), d.remaining()), (10, 0));
    }
}

/// A correction's give-back reads a TAT beyond the tolerance as a debt and pays it off,
/// where a refund keeps it (it would be turns booked by reservations); both give back only
/// the undrained part of their own charge, and the latest charge comes off whole.
#[test]
fn a_give_back_pays_off_a_debt_a_refund_keeps_booked_turns() {
    // 10 per 10 s, burst 10: T = 1 s, tau = 10 s.
    let g = gcra(10, Duration::from_secs(10), 10);
    let (_, tat) = g.decide(0, 0, 4);
    let stamp = tat.unwrap();
    let in_debt = g.debited(stamp, 0, 10);
    assert_eq!(in_debt, 14 * S);
    assert_eq!(g.refunded(in_debt, 0, 3, stamp), in_debt);
    assert_eq!(g.given_back(in_debt, 0, 3, stamp), 11 * S);
    // At 2 s half the charge drained: only its undrained 2 s come back.
    assert_eq!(g.given_back(in_debt, 2 * S, 4, stamp), 12 * S);
    // The latest charge: undone whole, as a refund does.
    assert_eq!(
        g.given_back(stamp, 0, 4, stamp),
        g.refunded(stamp, 0, 4, stamp)
    );
    // Drained: nothing.
    assert_eq!(g.given_back(3 * S, 5 * S, 1, 3 * S), 3 * S);
}

/// An extra charge starts from `now` on an idle bucket, stacks on a busy one, and
/// saturates rather than overflowing.
#[test]
fn a_debit_is_charged_from_now_and_saturates() {
    let g = gcra(10, Duration::from_secs(10), 10);
    assert_eq!(g.debited(0, 5 * S, 3), 8 * S);
    assert_eq!(g.debited(20 * S, 5 * S, 3), 23 * S);
    assert_eq!(g.debited(u64::MAX - S, 0, u64::MAX), u64::MAX);
    // Then refused for exactly the debt: 23 s + 1 s - 10 s = 14 s, 9 s after 5 s.
    let (d, _) = g.decide_from(23 * S, 5 * S, 1);
    assert_eq!(d.retry_after(), Some(Duration::from_secs(9)));
}
