//! Unit tests of the memory store.

use super::keyed::{EVICTED_TOTAL, KEYS, OVERFLOWED_TOTAL};
use super::*;
use crate::Algorithm;
use crate::clock::ManualClock;
use crate::store::Receipt;
use crate::{Key, Quota};
use std::collections::HashMap;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

fn store() -> (MemoryStore<Key, ManualClock>, ManualClock) {
    let clock = ManualClock::new();
    (MemoryStore::with_clock(clock.clone()), clock)
}

fn q(limit: u32, secs: u64) -> Quota {
    Quota::new(limit, Duration::from_secs(secs)).unwrap()
}

#[test]
fn several_policies_are_all_or_nothing() {
    let (mut s, _) = store();
    let wide = s.register(&Policy::new("wide", q(100, 60))).unwrap();
    let narrow = s.register(&Policy::new("narrow", q(1, 10))).unwrap();
    let k = Key::from("k");
    let both = [Charge::new(wide, &k, 1), Charge::new(narrow, &k, 1)];
    let d = s.check_now(&both).unwrap();
    assert!(d.is_allowed());
    assert_eq!(d.as_slice()[0].remaining(), 99);
    assert_eq!(d.deciding(), Some(1));
    let d = s.check_now(&both).unwrap();
    assert!(!d.is_allowed());
    assert_eq!(d.retry_after(), Some(Duration::from_secs(10)));
    // The wide policy was refunded: still 99, not 98.
    assert_eq!(d.as_slice()[0].remaining(), 99);
    assert_eq!(d.deciding(), Some(1));
}

/// Three charges on keys A, B, A are taken key by key (A, A, then B): the second charge of A
/// is the refusal (two charges of 1 never fit a burst of 1), and B, spent beforehand, only
/// reports its state. In request order B would be the refusal, with A's second charge
/// untried.
#[test]
fn charges_are_taken_key_by_key_so_a_later_charge_of_the_first_key_is_refused() {
    let (mut s, _) = store();
    let p = s.register(&Policy::new("p", q(1, 60))).unwrap();
    let (a, b) = (Key::from("a"), Key::from("b"));
    assert!(s.check_now(&[Charge::new(p, &b, 1)]).unwrap().is_allowed());
    let charges = [
        Charge::new(p, &a, 1),
        Charge::new(p, &b, 1),
        Charge::new(p, &a, 1),
    ];
    let d = s.check_now(&charges).unwrap();
    let [first, second, third] = d.as_slice() else {
        panic!("three decisions expected, got {d:?}");
    };
    assert!(third.is_cannot_fit(), "A's second charge is the refusal");
    assert!(second.is_denied() && !second.is_cannot_fit());
    // A's first charge was given back.
    assert_eq!(first.remaining(), 1);
    assert!(s.check_now(&[Charge::new(p, &a, 1)]).unwrap().is_allowed());
}

/// Charges taken out of request order (key by key) answer in request order, receipts too.
#[test]
fn decisions_of_charges_taken_key_by_key_are_in_request_order() {
    let (mut s, _) = store();
    let ids: Vec<PolicyId> = [5, 3, 2]
        .iter()
        .map(|&n| s.register(&Policy::new(format!("p{n}"), q(n, 60))).unwrap())
        .collect();
    let (a, b) = (Key::from("a"), Key::from("b"));
    let charges = [
        Charge::new(ids[0], &a, 1),
        Charge::new(ids[1], &b, 1),
        Charge::new(ids[2], &a, 1),
    ];
    let d = s.check_now(&charges).unwrap();
    assert!(d.is_allowed());
    let limits: Vec<u32> = d.as_slice().iter().map(Decision::limit).collect();
    assert_eq!(limits, [5, 3, 2]);
    // Each receipt gives back its own charge: every policy is full again.
    let refunds: Vec<Refund<'_, Key>> = charges
        .iter()
        .zip(d.receipts())
        .map(|(&charge, receipt)| Refund { charge, receipt })
        .collect();
    s.refund(&refunds);
    for (c, full) in charges.iter().zip([5, 3, 2]) {
        assert_eq!(s.peek_now(c.policy, c.key).unwrap().remaining(), full);
    }
}

const MS: u64 = 1_000_000;

fn reserve(s: &MemoryStore<Key, ManualClock>, charges: &[Charge<'_, Key>]) -> Decisions {
    match Store::reserve(s, charges, Duration::from_secs(2)) {
        Checked::Ready(r) => r.unwrap(),
        Checked::Pending(_) => unreachable!("the memory store answers at once"),
    }
}

#[test]
fn gcra_reservations_are_spaced_in_order_and_denials_are_final() {
    let (mut s, clock) = store();
    // 2 per second, burst 1: T = 500 ms; max_wait 2 s.
    let p = s
        .register(&Policy::new("p", q(2, 1).with_burst(1).unwrap()))
        .unwrap();
    let k = Key::Global;
    let c = [Charge::new(p, &k, 1)];
    let mut last = Receipt::NONE;
    for expected in [0, 500, 1_000, 1_500, 2_000] {
        let d = reserve(&s, &c);
        assert!(d.is_allowed());
        last = d.receipt(0);
        assert_eq!(d.delay(), Duration::from_millis(expected));
        assert_eq!(d.as_slice()[0].remaining(), 0);
        assert_eq!(
            d.as_slice()[0].reset_after(),
            Duration::from_millis(expected + 500)
        );
    }
    for _ in 0..2 {
        let d = reserve(&s, &c);
        assert!(!d.is_allowed() && d.is_final());
        assert_eq!(d.delay(), Duration::ZERO);
        // allow_at 2.5 s - max_wait 2 s.
        assert_eq!(d.retry_after(), Some(Duration::from_millis(500)));
    }
    // A refund without a receipt gives back nothing.
    s.refund(&[Refund::new(c[0], Receipt::NONE)]);
    assert!(!reserve(&s, &c).is_allowed());
    // The last reservation, dropped, is refunded: the next one takes its turn.
    s.refund(&[Refund::new(c[0], last)]);
    assert_eq!(reserve(&s, &c).delay(), Duration::from_millis(2_000));
    clock.advance(Duration::from_millis(500));
    // Half a second later the next turn (2.5 s) is within 2 s again.
    assert_eq!(reserve(&s, &c).delay(), Duration::from_millis(2_000));
}

#[test]
fn reservations_are_all_or_nothing_across_policies() {
    let (mut s, _) = store();
    // a: 1 per second, burst 1. b: 1 per 10 s, burst 2 (T = 10 s, tau = 20 s).
    let a = s
        .register(&Policy::new("a", q(1, 1).with_burst(1).unwrap()))
        .unwrap();
    let b = s
        .register(&Policy::new("b", q(1, 10).with_burst(2).unwrap()))
        .unwrap();
    let k = Key::Global;
    let both = [Charge::new(a, &k, 1), Charge::new(b, &k, 1)];
    assert_eq!(reserve(&s, &both).delay(), Duration::ZERO);
    let d = reserve(&s, &both);
    assert!(d.is_allowed());
    assert_eq!(d.delay(), Duration::from_secs(1));
    // a could wait 2 s, but b would need 10 s > 2 s: denied, final, a refunded.
    let d = reserve(&s, &both);
    assert!(!d.is_allowed() && d.is_final());
    assert_eq!(d.retry_after(), Some(Duration::from_secs(8)));
    assert_eq!(d.deciding(), Some(1));
    let only_a = reserve(&s, &[Charge::new(a, &k, 1)]);
    assert_eq!(only_a.delay(), Duration::from_secs(2), "a was not refunded");
}

#[test]
fn leaky_bucket_reserves_as_a_shaper() {
    let (mut s, _) = store();
    // 10 per second, queue of 3.
    let p = s
        .register(
            &Policy::new("p", q(10, 1).with_burst(3).unwrap())
                .with_algorithm(Algorithm::LeakyBucket),
        )
        .unwrap();
    let k = Key::Global;
    let c = [Charge::new(p, &k, 1)];
    for expected in [0, 100 * MS, 200 * MS] {
        assert_eq!(reserve(&s, &c).delay(), Duration::from_nanos(expected));
    }
    let d = reserve(&s, &c);
    assert!(!d.is_allowed() && d.is_final());
    assert_eq!(d.retry_after(), Some(Duration::from_millis(100)));
}

#[test]
fn window_algorithms_fall_back_to_check_and_retry() {
    let (mut s, _) = store();
    let g = s
        .register(&Policy::new("g", q(1, 1).with_burst(1).unwrap()))
        .unwrap();
    let w = s
        .register(&Policy::new("w", q(1, 10)).with_algorithm(Algorithm::FixedWindow))
        .unwrap();
    let k = Key::Global;
    let both = [Charge::new(g, &k, 1), Charge::new(w, &k, 1)];
    assert_eq!(reserve(&s, &both).delay(), Duration::ZERO);
    // The window denies: not final (retry after it), and the GCRA reservation is refunded.
    let d = reserve(&s, &both);
    assert!(!d.is_allowed() && !d.is_final());
    assert_eq!(d.retry_after(), Some(Duration::from_secs(10)));
    assert_eq!(
        reserve(&s, &[Charge::new(g, &k, 1)]).delay(),
        Duration::from_secs(1)
    );
}

/// A reservation whose cost exceeds the burst can never fit (the report
/// <https://github.com/boinkor-net/governor/issues/11>): it fails at once, final and without a
/// retry time, and leaves no state behind.
#[test]
fn reserving_more_than_the_burst_fails_at_once() {
    let (mut s, _) = store();
    let p = s
        .register(&Policy::new("p", q(1, 1).with_burst(1).unwrap()))
        .unwrap();
    let k = Key::Global;
    let d = reserve(&s, &[Charge::new(p, &k, 2)]);
    assert!(d.is_cannot_fit() && d.is_final());
    assert_eq!(d.retry_after(), None);
    assert!(s.is_empty());
    assert_eq!(
        reserve(&s, &[Charge::new(p, &k, 1)]).as_slice()[0].remaining(),
        0
    );
}

#[test]
fn unknown_policy_is_an_error_and_charges_nothing() {
    let (mut s, _) = store();
    let p = s.register(&Policy::new("p", q(1, 1))).unwrap();
    let k = Key::Global;
    let bad = PolicyId::from_index(9);
    assert!(matches!(
        s.check_now(&[Charge::new(p, &k, 1), Charge::new(bad, &k, 1)]),
        Err(StoreError::UnknownPolicy(_))
    ));
    assert!(s.check_now(&[Charge::new(p, &k, 1)]).unwrap().is_allowed());
}

#[test]
fn invalid_policy_name_is_refused() {
    let (mut s, _) = store();
    let err = s.register(&Policy::new("bad name", q(1, 1))).unwrap_err();
    assert!(err.is_config());
}

#[test]
fn denied_unseen_key_inserts_nothing() {
    let (mut s, _) = store();
    let p = s.register(&Policy::new("p", q(1, 1))).unwrap();
    let k = Key::Global;
    assert!(!s.check_now(&[Charge::new(p, &k, 5)]).unwrap().is_allowed());
    assert!(s.is_empty());
}

#[test]
fn idle_keys_are_swept_automatically_and_eviction_is_invisible() {
    let (mut s, clock) = store();
    let p = s.register(&Policy::new("p", q(10, 1))).unwrap();
    let keys: Vec<Key> = (0..20_000u64).map(Key::Int).collect();
    for k in &keys {
        assert_eq!(
            s.check_now(&[Charge::new(p, k, 1)]).unwrap().as_slice()[0].remaining(),
            9
        );
    }
    clock.advance(Duration::from_secs(2));
    // New keys trigger sweeps that drop the now-idle ones.
    for k in (100_000..100_000 + 20_000u64).map(Key::Int) {
        s.check_now(&[Charge::new(p, &k, 1)]).unwrap();
    }
    assert!(s.len() < 40_000, "idle keys were not swept: {}", s.len());
    clock.advance(Duration::from_secs(2));
    s.sweep();
    assert_eq!(s.len(), 0);
    let again = s.check_now(&[Charge::new(p, &keys[1], 1)]).unwrap();
    assert_eq!(again.as_slice()[0].remaining(), 9);
}

#[test]
fn concurrent_checks_never_over_admit() {
    let (mut s, _) = store();
    let p = s.register(&Policy::new("p", q(4, 86_400))).unwrap();
    let s = Arc::new(s);
    let keys: Vec<Key> = (1..=10u64).map(Key::Int).collect();
    let keys = Arc::new(keys);
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let s = Arc::clone(&s);
            let keys = Arc::clone(&keys);
            std::thread::spawn(move || {
                let mut remaining = Vec::new();
                for i in 0..250 {
                    let k = &keys[i % 10];
                    let d = s.check_now(&[Charge::new(p, k, 1)]).unwrap();
                    if d.is_allowed() {
                        remaining.push((i % 10, d.as_slice()[0].remaining()));
                    } else {
                        assert_eq!(d.as_slice()[0].remaining(), 0);
                    }
                }
                remaining
            })
        })
        .collect();
    let mut all: Vec<(usize, u32)> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    all.sort();
    let expected: Vec<(usize, u32)> = (0..10).flat_map(|k| (0..4).map(move |r| (k, r))).collect();
    assert_eq!(all, expected);
}

#[test]
fn reset_forgets_a_key() {
    let (mut s, _) = store();
    let p = s
        .register(&Policy::new("p", Quota::per_minute(NonZeroU32::MIN)))
        .unwrap();
    let k = Key::Global;
    assert!(s.check_now(&[Charge::new(p, &k, 1)]).unwrap().is_allowed());
    assert!(!s.check_now(&[Charge::new(p, &k, 1)]).unwrap().is_allowed());
    s.forget(p, &k).unwrap();
    assert!(s.check_now(&[Charge::new(p, &k, 1)]).unwrap().is_allowed());
}

/// Unbounded memory with many distinct keys
/// (<https://github.com/boinkor-net/governor/issues/171>): 1,000,000 distinct keys (token
/// bucket 10 per 1,000 ms, burst 10), one request each over t = 0..999 ms; with a hard cap
/// C = 200,000 keys (the keys live at once are the last 100 ms: 100,000). Every request: 200,
/// Remaining 9; the store never holds more than C; after a sweep at t = 1,000 ms + S (S = 100
/// ms, the time a bucket takes to refill after one request, so the last keys are idle) it holds
/// 0; a returning key at t = 2,000 ms + S sees Remaining 9.
#[test]
fn many_distinct_keys_stay_bounded_and_idle_ones_are_evicted() {
    const C: usize = 200_000;
    let clock = ManualClock::new();
    let mut s = MemoryStore::with_clock(clock.clone()).with_max_keys(NonZeroUsize::new(C).unwrap());
    let p = s
        .register(&Policy::new(
            "b03",
            Quota::new(10, Duration::from_secs(1)).unwrap(),
        ))
        .unwrap();
    let mut max_len = 0;
    for i in 0..1_000_000u64 {
        clock.set(i * 1_000);
        let key = Key::from(format!("k{i:07}"));
        let d = s.check_now(&[Charge::new(p, &key, 1)]).unwrap();
        let d = d.as_slice()[0];
        assert!(d.is_allowed() && d.remaining() == 9, "key {i}: {d:?}");
        if i % 1_000 == 0 {
            max_len = max_len.max(s.len());
        }
    }
    assert!(max_len <= C, "held {max_len} keys");
    assert_eq!(s.overflowed(), 0, "live keys never exceeded the cap");
    clock.set(1_100_000_000);
    s.sweep();
    assert_eq!(s.len(), 0);
    clock.set(2_100_000_000);
    let d = s
        .check_now(&[Charge::new(p, &Key::from("k0000001"), 1)])
        .unwrap();
    assert_eq!(d.as_slice()[0].remaining(), 9);
}

#[test]
fn max_keys_overflow_shares_one_budget_and_never_stops_limiting() {
    let clock = ManualClock::new();
    let mut s = MemoryStore::with_clock(clock.clone()).with_max_keys(NonZeroUsize::new(3).unwrap());
    let p = s.register(&Policy::new("p", q(2, 60))).unwrap();
    let check = |s: &MemoryStore<Key, ManualClock>, k: u64| {
        s.check_now(&[Charge::new(p, &Key::Int(k), 1)])
            .unwrap()
            .as_slice()[0]
    };
    for k in 0..3 {
        assert_eq!(check(&s, k).remaining(), 1);
    }
    assert_eq!(s.len(), 3);
    // Keys 3, 4, 5 share one overflow budget of 2: the third is denied.
    assert!(check(&s, 3).is_allowed());
    assert!(check(&s, 4).is_allowed());
    assert!(check(&s, 5).is_denied());
    assert_eq!(s.len(), 3);
    assert_eq!(s.overflowed(), 3);
    // Stored keys keep their own budget.
    assert_eq!(check(&s, 0).remaining(), 0);
    // Once the stored keys are idle, the next sweep (automatic after at most
    // max(ceil(max_keys / 2), 256) new keys or overflowed decisions, or on demand) makes
    // room: new keys get their own entries again.
    clock.advance(Duration::from_secs(60));
    let mut k = 6;
    let stored = loop {
        let d = check(&s, k);
        k += 1;
        if s.len() != 3 {
            break d;
        }
        assert!(k < 6 + 256, "no sweep made room");
    };
    // The sweep evicted keys 0, 1 and 2; the key that triggered it is stored on its own.
    assert_eq!(s.len(), 1);
    assert_eq!(stored.remaining(), 1);
    assert_eq!(check(&s, k - 1).remaining(), 0);
    assert_eq!(s.overflowed(), 3 + (k - 7));
}

/// The metrics of policy "p" that changed since the previous snapshot (the debugging
/// recorder reports each counter and gauge by its change), by name.
fn changed(snapshotter: &Snapshotter) -> HashMap<String, DebugValue> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| {
            key.key()
                .labels()
                .any(|l| l.key() == "policy" && l.value() == "p")
        })
        .map(|(key, _, _, value)| (key.key().name().to_owned(), value))
        .collect()
}

#[test]
fn overflow_decisions_are_counted_in_metrics() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let mut s =
        MemoryStore::with_clock(ManualClock::new()).with_max_keys(NonZeroUsize::new(1).unwrap());
    let p = s.register(&Policy::new("p", q(5, 60))).unwrap();
    metrics::with_local_recorder(&recorder, || {
        for k in 0..4 {
            s.check_now(&[Charge::new(p, &Key::Int(k), 1)]).unwrap();
        }
    });
    // Key 0 is stored; keys 1, 2 and 3 go to the overflow state.
    assert_eq!(s.overflowed(), 3);
    assert_eq!(
        changed(&snapshotter).get(OVERFLOWED_TOTAL),
        Some(&DebugValue::Counter(3))
    );
}

#[test]
fn keys_held_and_evictions_are_in_metrics() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let keys = |n: f64| DebugValue::Gauge(n.into());
    let (mut s, clock) = store();
    let p = s.register(&Policy::new("p", q(10, 1))).unwrap();
    metrics::with_local_recorder(&recorder, || {
        for k in 0..5 {
            s.check_now(&[Charge::new(p, &Key::Int(k), 1)]).unwrap();
        }
        // An existing key adds nothing.
        s.check_now(&[Charge::new(p, &Key::Int(0), 1)]).unwrap();
        assert_eq!(changed(&snapshotter).get(KEYS), Some(&keys(5.0)));
        // A reset key keeps its place behind a fence until its old receipts are stale.
        s.forget(p, &Key::Int(4)).unwrap();
        let after_reset = changed(&snapshotter);
        let gauge = after_reset.get(KEYS);
        assert!(gauge.is_none() || gauge == Some(&keys(0.0)), "{gauge:?}");
        assert_eq!(s.len(), 5);
        clock.advance(Duration::from_secs(2));
        s.sweep();
    });
    assert_eq!(s.len(), 0);
    let swept = changed(&snapshotter);
    assert_eq!(swept.get(KEYS), Some(&keys(-5.0)));
    assert_eq!(swept.get(EVICTED_TOTAL), Some(&DebugValue::Counter(4)));
}

#[test]
fn the_cap_holds_under_concurrent_inserts() {
    let mut s =
        MemoryStore::with_clock(ManualClock::new()).with_max_keys(NonZeroUsize::new(100).unwrap());
    let p = s.register(&Policy::new("p", q(1, 60))).unwrap();
    let s = Arc::new(s);
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let s = Arc::clone(&s);
            std::thread::spawn(move || {
                for i in 0..1_000u64 {
                    let k = Key::Int(t * 1_000_000 + i);
                    s.check_now(&[Charge::new(p, &k, 1)]).unwrap();
                    assert!(s.len() <= 100);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(s.len(), 100);
}

/// Item 6 of the sweep: with `max_keys` full, a new key is charged to the shared overflow
/// state, and the decisions of the other policies (peeked, not charged) must read that same
/// state, or the `Retry-After` of a denial is not honoured (max_keys 1, policies 1/s and
/// 1/day: the third key was told 1 s, then 86,399 s after waiting it).
#[test]
fn sweep_overflow_state_peeked_retry_after_is_honoured() {
    for (first, second) in [
        (Algorithm::Gcra, Algorithm::Gcra),
        (Algorithm::SlidingLog, Algorithm::FixedWindow),
        (Algorithm::LeakyBucket, Algorithm::SlidingWindow),
    ] {
        let clock = ManualClock::new();
        let mut s =
            MemoryStore::with_clock(clock.clone()).with_max_keys(NonZeroUsize::new(1).unwrap());
        let sec = s
            .register(&Policy::new("sec", q(1, 1)).with_algorithm(first))
            .unwrap();
        let day = s
            .register(&Policy::new("day", q(1, 86_400)).with_algorithm(second))
            .unwrap();
        let check = |s: &MemoryStore<Key, ManualClock>, k: &str| {
            let key = Key::from(k);
            s.check_now(&[Charge::new(sec, &key, 1), Charge::new(day, &key, 1)])
                .unwrap()
        };
        assert!(check(&s, "a").is_allowed()); // stored
        assert!(check(&s, "b").is_allowed()); // the overflow state, in both policies
        let denied = check(&s, "c");
        assert!(!denied.is_allowed());
        // The daily policy's overflow state is spent: its report says so.
        let daily = denied.as_slice()[1];
        assert_eq!(daily.remaining(), 0, "{first}/{second}: {daily:?}");
        let retry = denied.retry_after().unwrap();
        assert!(
            retry > Duration::from_secs(86_000),
            "{first}/{second}: {retry:?}"
        );
        // Waiting exactly the Retry-After admits the same request.
        clock.advance(retry);
        assert!(check(&s, "c").is_allowed(), "{first}/{second}");
    }
}
