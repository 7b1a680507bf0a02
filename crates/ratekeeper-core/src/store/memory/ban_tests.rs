//! Unit tests of bans in the memory store: the count of refusals, the ban's exact end,
//! other keys and policies, all-or-nothing, the Delay mode, reset, the cap and sweeping.

use std::num::{NonZeroU32, NonZeroUsize};
use std::time::Duration;

use super::*;
use crate::clock::ManualClock;
use crate::{Algorithm, Ban, Key, Outcome, Quota};

fn store() -> (MemoryStore<Key, ManualClock>, ManualClock) {
    let clock = ManualClock::new();
    (MemoryStore::with_clock(clock.clone()), clock)
}

fn n(v: u32) -> NonZeroU32 {
    NonZeroU32::new(v).unwrap()
}

/// 2 per minute; banned for 15 min after 3 refusals within 1 min.
fn banned_policy(algorithm: Algorithm) -> Policy {
    Policy::new("login", Quota::per_minute(n(2)))
        .with_algorithm(algorithm)
        .with_ban(Ban::after(n(3), Duration::from_secs(60)).lasting(Duration::from_secs(900)))
}

fn check(s: &MemoryStore<Key, ManualClock>, id: PolicyId, key: &Key) -> Decision {
    s.check_now(&[Charge::new(id, key, 1)]).unwrap().as_slice()[0]
}

/// Case BAN-1: after N refusals within W the key is refused until the ban's end with the
/// exact `retry_after`, the ban is reported started once, then the key is admitted.
#[test]
fn after_n_refusals_the_key_is_refused_until_the_ban_ends_then_admitted() {
    for algorithm in [
        Algorithm::Gcra,
        Algorithm::LeakyBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
    ] {
        let (mut s, clock) = store();
        let id = s.register(&banned_policy(algorithm)).unwrap();
        let alice = Key::from("alice");
        assert!(check(&s, id, &alice).is_allowed());
        assert!(check(&s, id, &alice).is_allowed());
        for _ in 0..2 {
            let d = check(&s, id, &alice);
            assert!(d.is_denied() && !d.is_banned(), "{algorithm:?}: {d:?}");
        }
        let start = check(&s, id, &alice);
        assert!(
            start.starts_ban() && start.is_banned(),
            "{algorithm:?}: {start:?}"
        );
        assert_eq!(start.retry_after(), Some(Duration::from_secs(900)));
        assert_eq!(start.remaining(), 0);

        // Well after the quota came back, the ban refuses with its exact end.
        clock.advance(Duration::from_millis(300_250));
        let d = check(&s, id, &alice);
        assert!(d.is_banned() && !d.starts_ban(), "{algorithm:?}: {d:?}");
        assert_eq!(d.retry_after(), Some(Duration::from_millis(599_750)));
        assert_eq!(d.reset_after(), Duration::from_millis(599_750));
        assert_eq!(d.remaining(), 0);
        assert_eq!(d.limit(), 2);
        assert_eq!(
            s.ban_ends_in(id, &alice),
            Some(Duration::from_millis(599_750))
        );

        // One ns before the end: still banned, for 1 ns.
        clock.advance(Duration::from_millis(599_750) - Duration::from_nanos(1));
        assert_eq!(
            check(&s, id, &alice).retry_after(),
            Some(Duration::from_nanos(1))
        );
        // At the end: admitted, with the quota whole (the refusals charged nothing).
        clock.advance(Duration::from_nanos(1));
        let d = check(&s, id, &alice);
        assert!(d.is_allowed(), "{algorithm:?}: {d:?}");
        assert_eq!(s.ban_ends_in(id, &alice), None);
    }
}

/// Refusals older than `within` (counted from the first) start a new count.
#[test]
fn refusals_spread_beyond_the_window_do_not_ban() {
    let (mut s, clock) = store();
    let policy = Policy::new("p", Quota::per_second(n(1)))
        .with_ban(Ban::after(n(2), Duration::from_secs(10)).lasting(Duration::from_secs(60)));
    let id = s.register(&policy).unwrap();
    let k = Key::from("k");
    assert!(check(&s, id, &k).is_allowed());
    assert!(!check(&s, id, &k).is_banned()); // refusal 1 at t = 0
    clock.advance(Duration::from_secs(10));
    assert!(check(&s, id, &k).is_allowed());
    assert!(!check(&s, id, &k).is_banned()); // at t = 10 s: a new count
    clock.advance(Duration::from_millis(9_999));
    assert!(check(&s, id, &k).is_allowed());
    assert!(check(&s, id, &k).starts_ban()); // 2nd within 10 s of the first
}

/// A ban does not outlive its duration, is not extended by the refusals it makes, and
/// leaves other keys and other policies alone.
#[test]
fn a_ban_does_not_outlive_its_duration_or_touch_other_keys() {
    let (mut s, clock) = store();
    let policy = Policy::new("p", Quota::per_hour(n(1)))
        .with_ban(Ban::after(n(1), Duration::from_secs(60)).lasting(Duration::from_secs(30)));
    let id = s.register(&policy).unwrap();
    let other = s
        .register(&Policy::new("q", Quota::per_second(n(5))))
        .unwrap();
    let (a, b) = (Key::from("a"), Key::from("b"));
    assert!(check(&s, id, &a).is_allowed());
    assert!(check(&s, id, &a).starts_ban());
    for _ in 0..100 {
        clock.advance(Duration::from_millis(250));
        assert!(check(&s, id, &a).is_banned() || s.ban_ends_in(id, &a).is_none());
    }
    // 25 s in: b and the other policy are untouched.
    assert!(check(&s, id, &b).is_allowed());
    assert!(check(&s, other, &a).is_allowed());
    clock.advance(Duration::from_secs(5));
    assert_eq!(s.ban_ends_in(id, &a), None);
    // The hourly quota still refuses (a denial, and a new ban after 1 refusal).
    let d = check(&s, id, &a);
    assert!(d.starts_ban());
    assert!(d.retry_after().unwrap() > Duration::from_secs(30 * 60));
}

/// All or nothing: a banned policy refuses the request and nothing is charged to the
/// others; a refusal by another policy does not count toward this policy's ban.
#[test]
fn a_ban_refuses_the_whole_request_and_other_refusals_do_not_count() {
    let (mut s, clock) = store();
    let banned = s
        .register(
            &Policy::new("b", Quota::per_minute(n(1))).with_ban(
                Ban::after(n(1), Duration::from_secs(60)).lasting(Duration::from_secs(600)),
            ),
        )
        .unwrap();
    let plain = s
        .register(&Policy::new("p", Quota::per_minute(n(3))))
        .unwrap();
    let k = Key::from("k");
    let both = [Charge::new(banned, &k, 1), Charge::new(plain, &k, 1)];
    assert!(s.check_now(&both).unwrap().is_allowed());
    let start = s.check_now(&both).unwrap();
    assert!(start.starts_ban());
    let d = s.check_now(&both).unwrap();
    assert!(!d.starts_ban() && d.as_slice()[0].is_banned());
    assert_eq!(d.deciding(), Some(0));
    // "p" was charged once only: 2 of 3 left.
    assert_eq!(d.as_slice()[1].remaining(), 2);

    // "p" refusing (its limit spent) does not ban under "b".
    clock.advance(Duration::from_secs(600));
    let other = Key::from("other");
    for _ in 0..3 {
        assert!(
            s.check_now(&[Charge::new(plain, &other, 1)])
                .unwrap()
                .is_allowed()
        );
    }
    let pair = [
        Charge::new(banned, &other, 1),
        Charge::new(plain, &other, 1),
    ];
    let d = s.check_now(&pair).unwrap();
    assert!(!d.is_allowed() && !d.starts_ban());
    assert!(check(&s, banned, &other).is_allowed());
}

/// Delay mode: a ban longer than `max_wait` is a final denial; one `max_wait` covers is
/// not (the caller waits for its end); a denial the request waits for does not count.
#[test]
fn delay_mode_waits_for_a_ban_only_when_max_wait_covers_it() {
    let (mut s, clock) = store();
    let policy = Policy::new("p", Quota::per_second(n(1)))
        .with_ban(Ban::after(n(1), Duration::from_secs(60)).lasting(Duration::from_secs(10)));
    let id = s.register(&policy).unwrap();
    let k = Key::from("k");
    let one = [Charge::new(id, &k, 1)];
    assert!(s.reserve_now(&one, Duration::ZERO).unwrap().is_allowed());
    // Waits 1 s within 2 s: reserved, not refused.
    let waited = s.reserve_now(&one, Duration::from_secs(2)).unwrap();
    assert!(waited.is_allowed() && waited.delay() == Duration::from_secs(1));
    // A wait of 2 s beyond max_wait 0: refused, final, and the ban starts.
    let start = s.reserve_now(&one, Duration::ZERO).unwrap();
    assert!(start.starts_ban() && start.is_final());
    assert_eq!(start.retry_after(), Some(Duration::from_secs(10)));
    clock.advance(Duration::from_secs(4));
    let short = s.reserve_now(&one, Duration::from_secs(1)).unwrap();
    assert!(short.is_final() && short.as_slice()[0].is_banned());
    let long = s.reserve_now(&one, Duration::from_secs(6)).unwrap();
    assert!(!long.is_final() && !long.is_allowed());
    assert_eq!(long.retry_after(), Some(Duration::from_secs(6)));
}

/// A reset ends the ban and the count; a sweep drops ended bans; the cap holds.
#[test]
fn reset_ends_a_ban_and_sweeps_and_the_cap_bound_the_map() {
    let (s, clock) = store();
    let mut s = s.with_max_keys(NonZeroUsize::new(300).unwrap());
    let policy = Policy::new("p", Quota::per_hour(n(1)))
        .with_ban(Ban::after(n(1), Duration::from_secs(1)).lasting(Duration::from_secs(5)));
    let id = s.register(&policy).unwrap();
    let k = Key::from("k");
    assert!(check(&s, id, &k).is_allowed());
    assert!(check(&s, id, &k).starts_ban());
    s.forget(id, &k).unwrap();
    assert_eq!(s.ban_ends_in(id, &k), None);
    assert!(check(&s, id, &k).is_allowed());

    for i in 0..2_000u64 {
        let key = Key::from(i);
        let _ = check(&s, id, &key);
        let _ = check(&s, id, &key);
        assert!(s.ban_len(id) <= 300);
    }
    clock.advance(Duration::from_secs(5));
    s.sweep();
    assert_eq!(s.ban_len(id), 0);
}

/// A policy without a ban keeps no ban map and never reports one.
#[test]
fn policies_without_a_ban_never_ban() {
    let (mut s, _clock) = store();
    let id = s
        .register(&Policy::new("p", Quota::per_second(n(1))))
        .unwrap();
    let k = Key::from("k");
    for _ in 0..50 {
        let d = check(&s, id, &k);
        assert!(!d.is_banned());
        if let Outcome::Denied { retry_after } = d.outcome() {
            assert!(retry_after <= Duration::from_secs(1));
        }
    }
    assert!(!s.reg.has_bans);
    assert_eq!(s.ban_len(id), 0);
}

/// Invalid bans are typed errors when the policy is registered.
#[test]
fn invalid_bans_are_refused_at_registration() {
    let (mut s, _clock) = store();
    for (within, duration) in [
        (Duration::ZERO, Duration::from_secs(1)),
        (Duration::from_secs(1), Duration::ZERO),
        (Duration::from_nanos(1_500), Duration::from_secs(1)),
        (
            Duration::from_secs(1),
            Ban::MAX_DURATION + Duration::from_secs(1),
        ),
    ] {
        let policy = Policy::new("p", Quota::per_second(n(1)))
            .with_ban(Ban::after(n(1), within).lasting(duration));
        match s.register(&policy) {
            Err(StoreError::Policy(e)) => assert!(e.is_ban(), "{e}"),
            other => panic!("{within:?} {duration:?}: {other:?}"),
        }
    }
}

/// A request that looked at the bans before a concurrent refusal started a ban, and is
/// charged after it started, is refused as banned and its charge is given back: no charge
/// lands after a ban's start, for a check as for a reservation.
#[test]
fn a_request_racing_the_start_of_a_ban_is_refused_and_charges_nothing() {
    use std::sync::{Arc, Mutex};
    for algorithm in [
        Algorithm::Gcra,
        Algorithm::LeakyBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
    ] {
        for reserving in [false, true] {
            let (mut s, _clock) = store();
            let policy = Policy::new("login", Quota::per_minute(n(3)))
                .with_algorithm(algorithm)
                .with_ban(
                    Ban::after(n(1), Duration::from_secs(60)).lasting(Duration::from_secs(900)),
                );
            let id = s.register(&policy).unwrap();
            let alice = Key::from("alice");
            assert!(
                s.check_now(&[Charge::new(id, &alice, 2)])
                    .unwrap()
                    .is_allowed()
            );
            // Between the next request's look at the bans and its charge, a request for 2
            // units (1 is left) is refused and starts the ban.
            let raced = Arc::new(Mutex::new(None));
            let seen = Arc::clone(&raced);
            *s.before_charge.lock().unwrap() = Some(Box::new(move |s: &MemoryStore<Key, _>| {
                let d = s.check_now(&[Charge::new(id, &Key::from("alice"), 2)]);
                *seen.lock().unwrap() = Some(d.unwrap());
            }));
            let one = [Charge::new(id, &alice, 1)];
            let d = if reserving {
                s.reserve_now(&one, Duration::from_secs(60)).unwrap()
            } else {
                s.check_now(&one).unwrap()
            };
            let start = raced
                .lock()
                .unwrap()
                .take()
                .expect("the racing request ran");
            let case = format!("{algorithm:?}, reserving {reserving}");
            assert!(start.starts_ban(), "{case}: {start:?}");
            assert!(
                !d.is_allowed() && d.as_slice()[0].is_banned(),
                "{case}: {d:?}"
            );
            assert_eq!(d.retry_after(), Some(Duration::from_secs(900)), "{case}");
            assert_eq!(d.is_final(), reserving, "{case}");
            // The key's state holds the first charge only: 1 of 3 left.
            let slot = s.slot(id).unwrap();
            let state = with_keyed!(slot, k => k.peek(&alice, s.clock.now(), 0));
            assert_eq!(state.remaining(), 1, "{case}: {state:?}");
        }
    }
}
