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

fn check_cost(s: &MemoryStore<Key, ManualClock>, p: PolicyId, k: &Key, cost: u64) -> Decision {
    ready(Store::check(s, &[Charge::new(p, k, cost)]))
        .unwrap()
        .as_slice()[0]
}

/// A key charged on the shared overflow state (its policy held `max_keys` keys) gets a
/// state of its own from a reset, made by sweeping idle keys, so its next requests see the
/// whole burst; a refund of its charge on the overflow state still goes there.
#[test]
fn a_reset_gives_a_key_on_the_overflow_state_a_state_of_its_own() {
    let (s, ids, _, clock) = store();
    let s = s.with_max_keys(std::num::NonZeroUsize::new(2).unwrap());
    let (a, b, c) = (Key::from("a"), Key::from("b"), Key::from("c"));
    for &p in &ids {
        check(&s, p, &a);
        check(&s, p, &b);
    }
    // Two periods on, `a` and `b` are idle under every algorithm, but not swept yet.
    clock.advance(Duration::from_secs(120));
    for &p in &ids {
        let spent = ready(Store::check(&s, &[Charge::new(p, &c, 3)])).unwrap();
        assert!(spent.is_allowed(), "{p:?}");
        assert!(!s.holds(p, &c), "{p:?}: on the overflow state");
        assert!(!check(&s, p, &c).is_allowed(), "{p:?}");

        let after = ready(Store::reset(&s, Some(p), &c)).unwrap();
        assert_eq!(after.as_slice()[0].remaining(), 3, "{p:?}");
        assert!(s.holds(p, &c), "{p:?}: a state of its own");
        for n in 0..3 {
            assert!(check(&s, p, &c).is_allowed(), "{p:?}: charge {n}");
        }
        assert!(!check(&s, p, &c).is_allowed(), "{p:?}");
        // The charge on the overflow state goes back there, not to the key's new state.
        let refund = Refund::new(Charge::new(p, &c, 3), spent.receipt(0));
        Store::refund(&s, &[refund]);
        assert!(
            !check(&s, p, &c).is_allowed(),
            "{p:?}: refunded to the new state"
        );
        let held = with_keyed!(&s.reg.entries()[p.index()].1, k => k.len());
        assert!(held <= 2, "{p:?}: {held} keys over the cap");
    }
}

/// At the cap with every key live, a key on the overflow state cannot get a state of its
/// own: the reset is an error and resets nothing, under any policy (room taken under an
/// earlier policy is given back), and it succeeds once keys are idle.
#[test]
fn a_reset_at_a_cap_of_live_keys_is_refused_and_resets_nothing() {
    let clock = ManualClock::new();
    let mut s = MemoryStore::<Key, _>::with_clock(clock.clone())
        .with_max_keys(std::num::NonZeroUsize::new(2).unwrap());
    let three = NonZeroU32::new(3).unwrap();
    let roomy = s
        .register(&Policy::new("roomy", Quota::per_second(three)))
        .unwrap();
    let full = s
        .register(&Policy::new("full", Quota::per_hour(three)))
        .unwrap();
    let (a, b, c) = (Key::from("a"), Key::from("b"), Key::from("c"));
    for p in [roomy, full] {
        check(&s, p, &a);
        check(&s, p, &b);
    }
    clock.advance(Duration::from_secs(1)); // `a` and `b` are idle under `roomy` only
    assert!(check_cost(&s, roomy, &c, 3).is_allowed());
    assert!(check_cost(&s, full, &c, 1).is_allowed());
    assert!(!s.holds(roomy, &c) && !s.holds(full, &c));

    for policy in [None, Some(full)] {
        let err = ready(Store::reset(&s, policy, &c)).unwrap_err();
        assert!(matches!(err, StoreError::KeysFull(p) if p == full), "{err}");
    }
    assert!(matches!(s.forget(full, &c), Err(StoreError::KeysFull(_))));
    // Nothing was reset: `c` still shares the overflow states.
    assert!(!s.holds(roomy, &c) && !s.holds(full, &c));
    assert_eq!(peek(&s, full, &c).remaining(), 2);
    assert!(!check_cost(&s, full, &c, 3).is_allowed());
    // The room taken under `roomy` went back: two new keys get states of their own there.
    let (d, e, f) = (Key::from("d"), Key::from("e"), Key::from("f"));
    s.sweep();
    for k in [&d, &e, &f] {
        check(&s, roomy, k);
    }
    assert!(s.holds(roomy, &d) && s.holds(roomy, &e) && !s.holds(roomy, &f));

    // Once `a` and `b` are idle under `full`, the reset makes room and succeeds.
    clock.advance(Duration::from_secs(3_600));
    let after = ready(Store::reset(&s, Some(full), &c)).unwrap();
    assert_eq!(after.as_slice()[0].remaining(), 3);
    assert!(s.holds(full, &c));
    assert!(check_cost(&s, full, &c, 3).is_allowed());
}
