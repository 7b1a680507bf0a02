//! The negative cache's unit tests.

use std::num::NonZeroU32;

use super::*;
use crate::{Policy, Quota};

const MS: u64 = 1_000_000;

fn gcra() -> Vec<RedisPolicy> {
    // 1 per second, burst 2: T = 1 s, tau = 2 s.
    let quota = Quota::per_second(NonZeroU32::MIN).with_burst(2).unwrap();
    vec![RedisPolicy::new(&Policy::new("api", quota)).unwrap()]
}

fn charge(cost: u64) -> OwnedCharge {
    (PolicyId::from_index(0), Key::from("k"), cost)
}

/// A cache whose invalidation channel is live.
fn live_cache() -> NegativeCache {
    NegativeCache::new(
        Duration::from_millis(50),
        Arc::new(AtomicBool::new(true)),
        Arc::default(),
    )
}

fn denial(retry_after: Duration) -> Decisions {
    Decisions::one(Decision::new(
        Outcome::Denied { retry_after },
        2,
        0,
        Duration::from_secs(2),
    ))
}

/// While the invalidation channel is down a remembered denial lasts at most
/// `UNSUBSCRIBED_HOLD`, however long its `retry_after`; live, until its `retry_after`.
#[test]
fn a_denial_lasts_at_most_the_unsubscribed_hold_while_the_channel_is_down() {
    let policies = gcra();
    let live = Arc::new(AtomicBool::new(false));
    let cache = NegativeCache::new(Duration::from_millis(50), Arc::clone(&live), Arc::default());
    let charges = [charge(1)];
    cache.update(
        &charges,
        &denial(Duration::from_secs(3600)),
        None,
        &policies,
        (0, 0),
    );
    let hold = nanos(UNSUBSCRIBED_HOLD);
    assert!(matches!(
        cache.lookup(&charges, &policies, hold - 1),
        Lookup::Hit(_)
    ));
    assert!(matches!(
        cache.lookup(&charges, &policies, hold),
        Lookup::Probe
    ));
    // Live again: the entry lasts until its retry_after.
    live.store(true, Ordering::Release);
    cache.update(
        &charges,
        &denial(Duration::from_secs(3600)),
        None,
        &policies,
        (0, 0),
    );
    assert!(matches!(
        cache.lookup(&charges, &policies, 10 * hold),
        Lookup::Hit(_)
    ));
}

/// An answer to a check sent before an invalidation is not remembered; invalidations
/// forget the entries they name.
#[test]
fn an_answer_older_than_an_invalidation_is_not_remembered() {
    let policies = gcra();
    let cache = live_cache();
    let charges = [charge(1)];
    let sent = cache.epoch();
    cache.epoch.fetch_add(1, Ordering::AcqRel);
    cache.update(
        &charges,
        &denial(Duration::from_secs(60)),
        None,
        &policies,
        (sent, 0),
    );
    assert!(matches!(
        cache.lookup(&charges, &policies, MS),
        Lookup::Miss
    ));
    let now = cache.epoch();
    cache.update(
        &charges,
        &denial(Duration::from_secs(60)),
        None,
        &policies,
        (now, 0),
    );
    assert!(matches!(
        cache.lookup(&charges, &policies, MS),
        Lookup::Hit(_)
    ));
    cache.forget_where(|_, k| *k == Key::from("other"));
    assert!(matches!(
        cache.lookup(&charges, &policies, MS),
        Lookup::Hit(_)
    ));
    cache.forget_where(|p, k| p == PolicyId::from_index(0) && *k == Key::from("k"));
    assert!(matches!(
        cache.lookup(&charges, &policies, MS),
        Lookup::Miss
    ));
    assert!(cache.is_empty());
}

#[test]
fn a_lone_charge_that_took_the_last_unit_implies_its_denial() {
    let policies = gcra();
    // Empty after the charge: the TAT is 2 s ahead, so one more unit fits in 1 s.
    let empty = Decision::new(Outcome::Allowed, 2, 0, Duration::from_secs(2));
    let denial = implied_denial(&charge(1), &empty, &policies).unwrap();
    assert_eq!(denial.retry_after(), Some(Duration::from_secs(1)));
    assert_eq!(denial.remaining(), 0);
    // One unit left: the same request passes again, nothing is implied.
    let one_left = Decision::new(Outcome::Allowed, 2, 1, Duration::from_secs(1));
    assert!(implied_denial(&charge(1), &one_left, &policies).is_none());
    // A cost of 2 right after a charge that left one unit waits for the second: 1 s.
    let two = implied_denial(&charge(2), &one_left, &policies).unwrap();
    assert_eq!(two.retry_after(), Some(Duration::from_secs(1)));
}

#[test]
fn an_expired_denial_is_probed_by_one_request_while_the_others_wait() {
    let policies = gcra();
    let cache = live_cache();
    let charges = [charge(1)];
    let denied = Decisions::one(Decision::new(
        Outcome::Denied {
            retry_after: Duration::from_millis(10),
        },
        2,
        0,
        Duration::from_secs(2),
    ));
    cache.update(&charges, &denied, None, &policies, (0, 0));
    match cache.lookup(&charges, &policies, 4 * MS) {
        Lookup::Hit(d) => assert_eq!(d.retry_after(), Some(Duration::from_millis(6))),
        other => panic!("expected a hit, got {other:?}"),
    }
    // Expired: the first request probes, the next waits for it.
    assert!(matches!(
        cache.lookup(&charges, &policies, 10 * MS),
        Lookup::Probe
    ));
    let Lookup::Wait(mut turn) = cache.lookup(&charges, &policies, 11 * MS) else {
        panic!("expected to wait for the probe");
    };
    // The probe failed: the waiter is woken and the next request probes again.
    cache.release(&charges);
    assert!(turn.has_changed().unwrap());
    let _ = turn.borrow_and_update();
    assert!(matches!(
        cache.lookup(&charges, &policies, 12 * MS),
        Lookup::Probe
    ));
    // A probe whose caller went away is taken over after the deadline.
    assert!(matches!(
        cache.lookup(&charges, &policies, 70 * MS),
        Lookup::Probe
    ));
    // Its answer replaces the entry and wakes the waiters.
    let Lookup::Wait(turn) = cache.lookup(&charges, &policies, 71 * MS) else {
        panic!("expected to wait for the probe");
    };
    cache.update(&charges, &denied, None, &policies, (0, 72 * MS));
    assert!(
        turn.has_changed().is_err(),
        "the replaced entry closed its channel"
    );
    assert!(matches!(
        cache.lookup(&charges, &policies, 73 * MS),
        Lookup::Hit(_)
    ));
}
