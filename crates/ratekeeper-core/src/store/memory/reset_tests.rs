//! Unit tests of the keyed-state API through the [`Store`] trait: peeks that charge
//! nothing, resets of one policy or of all, receipts from before a reset, and the trait's
//! default methods for a store of one's own.

use std::future::Ready;
use std::num::NonZeroU32;
use std::time::Duration;

use super::*;
use crate::clock::ManualClock;
use crate::{Algorithm, Key, Quota};

fn ready(checked: Checked<Ready<Result<Decisions, StoreError>>>) -> Result<Decisions, StoreError> {
    match checked {
        Checked::Ready(result) => result,
        Checked::Pending(future) => future.into_inner(),
    }
}

/// Every algorithm but the concurrency counter, capacity 3 per minute, plus a second GCRA
/// policy whose state a reset of the first must leave alone.
fn store() -> (
    MemoryStore<Key, ManualClock>,
    Vec<PolicyId>,
    PolicyId,
    ManualClock,
) {
    let clock = ManualClock::new();
    clock.set(1_000_000_000_000);
    let mut s = MemoryStore::with_clock(clock.clone());
    let quota = Quota::per_minute(NonZeroU32::new(3).unwrap());
    let ids = [
        Algorithm::Gcra,
        Algorithm::LeakyBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
    ]
    .iter()
    .enumerate()
    .map(|(i, a)| {
        s.register(&Policy::new(format!("p{i}"), quota).with_algorithm(*a))
            .unwrap()
    })
    .collect();
    let other = s.register(&Policy::new("other", quota)).unwrap();
    (s, ids, other, clock)
}

fn check(s: &MemoryStore<Key, ManualClock>, p: PolicyId, k: &Key) -> Decisions {
    ready(Store::check(s, &[Charge::new(p, k, 1)])).unwrap()
}

fn peek(s: &MemoryStore<Key, ManualClock>, p: PolicyId, k: &Key) -> Decision {
    ready(Store::peek(s, p, k)).unwrap().as_slice()[0]
}

/// A peek reports the state and charges nothing: two peeks, then a check sees the
/// remaining the peeks reported.
#[test]
fn a_peek_charges_nothing() {
    let (s, ids, _, _) = store();
    let k = Key::from("alice");
    for p in ids {
        let fresh = peek(&s, p, &k);
        assert_eq!((fresh.limit(), fresh.remaining()), (3, 3), "{p:?}");
        assert!(fresh.is_allowed());
        check(&s, p, &k);
        assert_eq!(peek(&s, p, &k).remaining(), 2, "{p:?}");
        assert_eq!(peek(&s, p, &k).remaining(), 2, "{p:?}");
        assert!(peek(&s, p, &k).reset_after() > Duration::ZERO, "{p:?}");
        assert_eq!(check(&s, p, &k).as_slice()[0].remaining(), 1, "{p:?}");
    }
    // A peek of a key never seen inserts nothing.
    assert!(!s.holds(PolicyId::from_index(0), &Key::from("nobody")));
    peek(&s, PolicyId::from_index(0), &Key::from("nobody"));
    assert!(!s.holds(PolicyId::from_index(0), &Key::from("nobody")));
}

/// After a reset of one policy the key gets its whole burst back, exactly; a refund or a
/// correction of a receipt from before the reset gives back nothing; the other policy keeps
/// its state.
#[test]
fn a_reset_gives_back_the_whole_burst_and_leaves_other_policies() {
    let (s, ids, other, _) = store();
    let k = Key::from("alice");
    check(&s, other, &k);
    for p in ids {
        let first = check(&s, p, &k);
        check(&s, p, &k);
        check(&s, p, &k);
        assert!(!check(&s, p, &k).is_allowed(), "{p:?}");
        let after = ready(Store::reset(&s, Some(p), &k)).unwrap();
        assert_eq!(after.len(), 1);
        assert_eq!(after.as_slice()[0].remaining(), 3, "{p:?}");
        for n in 0..3 {
            assert!(
                check(&s, p, &k).is_allowed(),
                "{p:?}: charge {n} after the reset"
            );
        }
        // The pre-reset receipt frees nothing of the charges made since.
        let receipt = first.receipt(0);
        assert!(receipt.is_some());
        Store::refund(&s, &[Refund::new(Charge::new(p, &k, 1), receipt)]);
        assert!(
            !check(&s, p, &k).is_allowed(),
            "{p:?}: the old refund gave back"
        );
        // Nor does a correction's give-back of it.
        Store::correct(&s, &[Correction::new(Charge::new(p, &k, 1), receipt, 0)]);
        assert!(
            !check(&s, p, &k).is_allowed(),
            "{p:?}: the old correction gave back"
        );
        assert_eq!(
            peek(&s, other, &k).remaining(),
            2,
            "{p:?}: other policy touched"
        );
    }
}

/// A reset of every policy (`None`) answers one full decision per policy, in registration
/// order; an unknown policy is an error and resets nothing.
#[test]
fn a_reset_of_every_policy_answers_each_in_order() {
    let (s, ids, other, _) = store();
    let k = Key::from("alice");
    for p in ids.iter().chain([&other]) {
        check(&s, *p, &k);
    }
    let bad = ready(Store::reset(&s, Some(PolicyId::from_index(99)), &k));
    assert!(matches!(bad, Err(StoreError::UnknownPolicy(_))));
    assert_eq!(peek(&s, other, &k).remaining(), 2);
    let after = ready(Store::reset(&s, None, &k)).unwrap();
    assert_eq!(after.len(), ids.len() + 1);
    assert!(after.as_slice().iter().all(|d| d.remaining() == 3));
    assert!(s.peek_now(PolicyId::from_index(99), &k).is_err());
}

/// A concurrency-counter reset: the key takes its whole limit again, and releases of
/// permits taken before (live or leaked) give back nothing, so they never free a permit
/// taken since.
#[test]
fn a_concurrency_reset_never_double_releases() {
    let clock = ManualClock::new();
    let mut s = MemoryStore::<Key, _>::with_clock(clock);
    let quota = Quota::per_second(NonZeroU32::new(2).unwrap());
    let p = s
        .register(&Policy::new("slots", quota).with_algorithm(Algorithm::Concurrency))
        .unwrap();
    let k = Key::from("alice");
    let old = s.check_now(&[Charge::new(p, &k, 1)]).unwrap();
    s.check_now(&[Charge::new(p, &k, 1)]).unwrap();
    assert!(!s.check_now(&[Charge::new(p, &k, 1)]).unwrap().is_allowed());
    assert_eq!(
        s.reset_now(Some(p), &k).unwrap().as_slice()[0].remaining(),
        2
    );
    assert!(s.check_now(&[Charge::new(p, &k, 1)]).unwrap().is_allowed());
    assert!(s.check_now(&[Charge::new(p, &k, 1)]).unwrap().is_allowed());
    // The release of a permit from before the reset frees nothing.
    Store::refund(&s, &[Refund::new(Charge::new(p, &k, 1), old.receipt(0))]);
    assert!(!s.check_now(&[Charge::new(p, &k, 1)]).unwrap().is_allowed());
}

/// A store of one's own that implements only the required methods: a peek is its free
/// probe (cost 0), a reset is unsupported.
#[test]
fn the_default_methods_peek_by_a_free_probe_and_cannot_reset() {
    struct Counting(MemoryStore<Key, ManualClock>);
    impl Store<Key> for Counting {
        type Future = Ready<Result<Decisions, StoreError>>;
        fn register(&mut self, policy: &Policy) -> Result<PolicyId, StoreError> {
            self.0.register(policy)
        }
        fn check(&self, charges: &[Charge<'_, Key>]) -> Checked<Self::Future> {
            Store::check(&self.0, charges)
        }
        fn refund(&self, refunds: &[Refund<'_, Key>]) {
            Store::refund(&self.0, refunds);
        }
    }
    let mut s = Counting(MemoryStore::with_clock(ManualClock::new()));
    let p = s
        .register(&Policy::new(
            "api",
            Quota::per_minute(NonZeroU32::new(3).unwrap()),
        ))
        .unwrap();
    let k = Key::from("alice");
    ready(s.check(&[Charge::new(p, &k, 1)])).unwrap();
    let peeked = ready(s.peek(p, &k)).unwrap();
    assert_eq!(peeked.as_slice()[0].remaining(), 2);
    assert_eq!(ready(s.peek(p, &k)).unwrap().as_slice()[0].remaining(), 2);
    let err = ready(s.reset(Some(p), &k)).unwrap_err();
    assert!(matches!(err, StoreError::UnsupportedOperation("reset")));
    assert!(!err.is_config() && !err.is_unavailable());
}

/// A reset ends a ban of the key under the policy (a peek reports the ban before, the
/// state after), and its count of refusals starts again.
#[test]
fn a_reset_ends_a_ban_and_a_peek_reports_it() {
    let clock = ManualClock::new();
    let mut s = MemoryStore::<Key, _>::with_clock(clock.clone());
    let ban = crate::Ban::after(NonZeroU32::new(2).unwrap(), Duration::from_secs(60))
        .lasting(Duration::from_secs(900));
    let p = s
        .register(
            &Policy::new("login", Quota::per_minute(NonZeroU32::new(1).unwrap())).with_ban(ban),
        )
        .unwrap();
    let k = Key::from("mallory");
    assert!(check(&s, p, &k).is_allowed());
    assert!(!check(&s, p, &k).is_allowed());
    let started = check(&s, p, &k).as_slice()[0];
    assert!(started.starts_ban());
    clock.advance(Duration::from_secs(100));
    let banned = peek(&s, p, &k);
    assert!(banned.is_banned(), "{banned:?}");
    assert_eq!(banned.retry_after(), Some(Duration::from_secs(800)));
    assert_eq!(s.ban_ends_in(p, &k), Some(Duration::from_secs(800)));

    let after = ready(Store::reset(&s, Some(p), &k)).unwrap().as_slice()[0];
    assert!(!after.is_banned() && after.is_allowed(), "{after:?}");
    assert_eq!(after.remaining(), 1);
    assert_eq!(s.ban_ends_in(p, &k), None);
    assert!(check(&s, p, &k).is_allowed());
    // The count starts again: one refusal does not ban, the second does.
    assert!(!check(&s, p, &k).as_slice()[0].starts_ban());
    assert!(check(&s, p, &k).as_slice()[0].starts_ban());
}
