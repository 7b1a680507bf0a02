//! Unit tests of the memory store's edges: a full `max_keys` cap and its overflow state,
//! refunds across a reset, an eviction or the overflow, and the cost of a small cap.

use std::num::NonZeroUsize;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::keyed::Slot;
use super::*;
use crate::clock::ManualClock;
use crate::{Algorithm, Key, Quota};

const S: u64 = 1_000_000_000;

/// 5 per minute, burst 5, under `algorithm`, in a store capped at `max_keys` keys.
fn capped(
    algorithm: Algorithm,
    max_keys: usize,
) -> (MemoryStore<Key, ManualClock>, PolicyId, ManualClock) {
    let clock = ManualClock::new();
    let mut s =
        MemoryStore::with_clock(clock.clone()).with_max_keys(NonZeroUsize::new(max_keys).unwrap());
    let quota = Quota::new(5, Duration::from_secs(60)).unwrap();
    let p = s
        .register(&Policy::new("p", quota).with_algorithm(algorithm))
        .unwrap();
    (s, p, clock)
}

fn store_on_own_clock() -> MemoryStore<Key, ManualClock> {
    MemoryStore::with_clock(ManualClock::new())
}

fn check(s: &MemoryStore<Key, ManualClock>, p: PolicyId, k: u64, cost: u64) -> Decisions {
    s.check_now(&[Charge::new(p, &Key::Int(k), cost)]).unwrap()
}

fn refund(s: &MemoryStore<Key, ManualClock>, p: PolicyId, k: u64, cost: u64, d: &Decisions) {
    s.refund(&[Refund::new(
        Charge::new(p, &Key::Int(k), cost),
        d.receipt(0),
    )]);
}

fn remaining(s: &MemoryStore<Key, ManualClock>, p: PolicyId, k: u64) -> u32 {
    check(s, p, k, 0).as_slice()[0].remaining()
}

/// With `max_keys` full, a free probe (cost 0) of a key that is not held reads the overflow
/// state, as a cost-1 request of that key does (not the full limit while the charge is
/// denied); below the cap both read "absent".
#[test]
fn a_free_probe_of_a_key_not_held_reports_the_state_a_charge_would_go_to() {
    for algorithm in Algorithm::ALL {
        let (s, p, _) = capped(algorithm, 1);
        assert_eq!(remaining(&s, p, 9), 5, "{algorithm}: below the cap, absent");
        assert!(check(&s, p, 0, 1).is_allowed());
        // Key 1 exhausts the shared overflow state.
        assert!(check(&s, p, 1, 5).is_allowed(), "{algorithm}");
        assert_eq!(s.overflowed(), 1);
        let probe = check(&s, p, 2, 0);
        assert!(probe.is_allowed());
        assert_eq!(probe.as_slice()[0].remaining(), 0, "{algorithm}");
        assert!(!check(&s, p, 2, 1).is_allowed(), "{algorithm}");
        // A cost that can never fit is reported from the same state.
        let never = check(&s, p, 2, 6);
        assert!(never.is_cannot_fit() && never.as_slice()[0].remaining() == 0);
        // Nothing was inserted or charged by the probes.
        assert_eq!(s.len(), 1);
    }
}

/// With `max_keys`, a charge made on the shared overflow state and refunded after the key
/// got its own entry goes back to the overflow state it was charged on, never to the key's
/// own later charges (which would move remaining from 1 to 5).
#[test]
fn an_overflow_charge_refunded_after_the_key_got_its_own_entry_leaves_that_entry_alone() {
    for algorithm in Algorithm::ALL {
        let (s, p, _) = capped(algorithm, 1);
        let zero = check(&s, p, 0, 1);
        // Key 1 is charged 4 on the overflow state.
        let on_overflow = check(&s, p, 1, 4);
        assert!(on_overflow.is_allowed());
        assert_eq!(s.overflowed(), 1, "{algorithm}");
        // Key 0 gives its charge back and goes: key 1 takes its place.
        refund(&s, p, 0, 1, &zero);
        s.sweep();
        assert_eq!(s.len(), 0, "{algorithm}");
        assert!(check(&s, p, 1, 4).is_allowed());
        assert!(s.holds(p, &Key::Int(1)));
        assert_eq!(remaining(&s, p, 1), 1, "{algorithm}");
        refund(&s, p, 1, 4, &on_overflow);
        assert_eq!(
            remaining(&s, p, 1),
            1,
            "{algorithm}: the own entry kept its charges"
        );
        // The overflow state got its 4 units back (key 2 is not held; the cap is full).
        assert_eq!(remaining(&s, p, 2), 5, "{algorithm}: the overflow state");
    }
}

/// A charge on a key's own state that was refunded after the state went (and the key
/// shares the overflow state now) gives back nothing: it never reaches the overflow state.
#[test]
fn a_refund_of_a_charge_on_a_state_that_went_never_reaches_the_overflow_state() {
    for algorithm in Algorithm::ALL {
        let (s, p, clock) = capped(algorithm, 1);
        let own = check(&s, p, 0, 1);
        // Much later: key 0 is idle and goes, key 1 takes the place, key 0 overflows.
        clock.set(600 * S);
        if algorithm == Algorithm::Concurrency {
            // A permit is idle only once released; a second permit shows the rule.
            refund(&s, p, 0, 1, &own);
        }
        s.sweep();
        assert!(check(&s, p, 1, 1).is_allowed());
        assert!(check(&s, p, 0, 3).is_allowed());
        assert_eq!(remaining(&s, p, 0), 2, "{algorithm}");
        refund(&s, p, 0, 1, &own);
        assert_eq!(
            remaining(&s, p, 0),
            2,
            "{algorithm}: the overflow state is untouched"
        );
    }
}

/// A refund made after [`MemoryStore::forget`] never frees charges made after the reset
/// (GCRA, fixed window, sliding log, concurrency): a receipt from before a reset gives back
/// nothing; receipts from after it work as usual; and once the old receipts are stale the
/// key leaves its fence unseen.
#[test]
fn a_refund_after_a_reset_never_frees_charges_made_after_it() {
    for algorithm in Algorithm::ALL {
        let (s, p, clock) = capped(algorithm, 100);
        let before = check(&s, p, 7, 2);
        assert!(before.is_allowed());
        s.forget(p, &Key::Int(7)).unwrap();
        assert_eq!(
            remaining(&s, p, 7),
            5,
            "{algorithm}: the reset forgot the charge"
        );
        let after: Vec<Decisions> = (0..5).map(|_| check(&s, p, 7, 1)).collect();
        assert!(after.iter().all(Decisions::is_allowed), "{algorithm}");
        assert_eq!(remaining(&s, p, 7), 0);
        refund(&s, p, 7, 2, &before);
        assert_eq!(
            remaining(&s, p, 7),
            0,
            "{algorithm}: the old receipt freed nothing"
        );
        assert!(!check(&s, p, 7, 1).is_allowed(), "{algorithm}");
        // A receipt from after the reset still gives back.
        refund(&s, p, 7, 1, &after[4]);
        assert_eq!(
            remaining(&s, p, 7),
            1,
            "{algorithm}: the new receipt gives back"
        );
        // A second reset: receipts of both earlier lives give back nothing.
        s.forget(p, &Key::Int(7)).unwrap();
        let third = check(&s, p, 7, 5);
        assert!(third.is_allowed());
        refund(&s, p, 7, 1, &after[3]);
        refund(&s, p, 7, 2, &before);
        assert_eq!(
            remaining(&s, p, 7),
            0,
            "{algorithm}: no earlier life gives back"
        );
        refund(&s, p, 7, 5, &third);
        assert_eq!(remaining(&s, p, 7), 5, "{algorithm}");
        // Long after, with every permit back, the fence goes and the key is new again.
        if algorithm == Algorithm::Concurrency {
            for d in &after[..3] {
                refund(&s, p, 7, 1, d);
            }
        }
        clock.set(1_000 * S);
        s.sweep();
        assert_eq!(s.len(), 0, "{algorithm}: the fence went");
        let fresh = check(&s, p, 7, 1);
        assert_eq!(fresh.as_slice()[0].remaining(), 4, "{algorithm}");
        refund(&s, p, 7, 1, &fresh);
        assert_eq!(remaining(&s, p, 7), 5, "{algorithm}");
    }
}

/// A reset of a concurrency key: the permits held before it give nothing back when they
/// are released (so the new permits stay counted), and the key's fence goes once they are
/// all back.
#[test]
fn permits_taken_before_a_reset_release_nothing_after_it() {
    let (s, p, _) = capped(Algorithm::Concurrency, 10);
    let old: Vec<Decisions> = (0..5).map(|_| check(&s, p, 1, 1)).collect();
    s.forget(p, &Key::Int(1)).unwrap();
    let new: Vec<Decisions> = (0..5).map(|_| check(&s, p, 1, 1)).collect();
    assert!(new.iter().all(Decisions::is_allowed));
    for d in &old {
        refund(&s, p, 1, 1, d);
    }
    assert_eq!(remaining(&s, p, 1), 0);
    assert_eq!(s.len(), 1);
    for d in &new {
        refund(&s, p, 1, 1, d);
    }
    assert_eq!(remaining(&s, p, 1), 5);
    s.sweep();
    assert_eq!(s.len(), 0, "every permit is back: the fence went");
}

/// GCRA, burst 2: charges A and B at t = 0, A refunded at once (the TAT moves back under
/// B's stamp). At t = T the bucket is full again; a sweep must not evict the key, or B's
/// receipt would meet a new state (whose first charge stores B's very stamp) and undo it.
#[test]
fn eviction_after_a_later_refund_is_invisible_to_refunds() {
    for algorithm in [Algorithm::Gcra, Algorithm::LeakyBucket] {
        let quota = Quota::new(2, Duration::from_secs(2)).unwrap();
        let policy = Policy::new("p", quota).with_algorithm(algorithm);
        let (mut s, mut no_sweep) = (store_on_own_clock(), store_on_own_clock());
        let (p, q) = (
            s.register(&policy).unwrap(),
            no_sweep.register(&policy).unwrap(),
        );
        let mut outcomes = Vec::new();
        for (store, id, sweep) in [(&s, p, true), (&no_sweep, q, false)] {
            let clock = store.clock();
            let a = check(store, id, 1, 1);
            let b = check(store, id, 1, 1);
            refund(store, id, 1, 1, &a);
            clock.set(S);
            if sweep {
                store.sweep();
            }
            let c = check(store, id, 1, 1);
            refund(store, id, 1, 1, &b);
            outcomes.push((c.as_slice()[0].remaining(), remaining(store, id, 1)));
        }
        assert_eq!(
            outcomes[0], outcomes[1],
            "{algorithm}: a sweep changed a refund"
        );
        // Once the bucket has been full for a tolerance, the key goes.
        s.clock().set(10 * S);
        s.sweep();
        assert_eq!(s.len(), 0, "{algorithm}");
    }
}

/// With `max_keys` of 1 or 2, requests on the overflow state do not sweep every lane each
/// (3 to 50 us per check against 0.1 to 0.5 us at 1,000 if they did): sweeps to make room
/// run at most once per 256 new keys or overflowed decisions.
#[test]
fn a_small_cap_does_not_sweep_on_every_overflowed_request() {
    for max_keys in [1, 2, 3] {
        let (s, p, _) = capped(Algorithm::Gcra, max_keys);
        for k in 0..2_000u64 {
            check(&s, p, k, 1);
        }
        assert!(s.overflowed() >= 1_990);
        let Slot::Gcra(keyed) = &s.reg.policies[0].1 else {
            unreachable!("a GCRA policy")
        };
        let sweeps = keyed.sweeps.load(Ordering::Relaxed);
        assert!(
            sweeps <= 2_000 / 256 + 1,
            "max_keys {max_keys}: {sweeps} sweeps"
        );
    }
}
