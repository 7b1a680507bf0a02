//! Unit tests of receipts in the memory store: every refund rule, the all-or-nothing
//! rollback, dropped Delay-mode waiters, and late refunds on the store.

use std::num::NonZeroUsize;
use std::time::Duration;

use super::*;
use crate::clock::ManualClock;
use crate::{Algorithm, Key, Quota};

const MS: u64 = 1_000_000;

fn store() -> (MemoryStore<Key, ManualClock>, ManualClock) {
    let clock = ManualClock::new();
    (MemoryStore::with_clock(clock.clone()), clock)
}

fn q(limit: u32, secs: u64) -> Quota {
    Quota::new(limit, Duration::from_secs(secs)).unwrap()
}

fn reserve_for(
    s: &MemoryStore<Key, ManualClock>,
    charges: &[Charge<'_, Key>],
    max_wait: Duration,
) -> Decisions {
    s.reserve_now(charges, max_wait).unwrap()
}

/// Three waiters W1, W2, W3 reserve behind a first request (1 per second, burst 1: T = 1 s)
/// and are dropped, one, two or all three, in every order, while newcomers keep arriving
/// (reserving, or checking as Reject mode does). No two requests that reach the service,
/// waiters that proceeded and newcomers alike, are ever closer than T: a dropped waiter
/// with others queued behind it never hands its slot to a newcomer.
#[test]
fn dropped_waiters_never_let_two_requests_in_closer_than_the_emission_interval() {
    const T: u64 = 1_000 * MS;
    let orders = [
        [0, 1, 2],
        [0, 2, 1],
        [1, 0, 2],
        [1, 2, 0],
        [2, 0, 1],
        [2, 1, 0],
    ];
    let max_wait = Duration::from_secs(10);
    for order in orders {
        for dropped in 1..=3 {
            let (mut s, clock) = store();
            let p = s
                .register(&Policy::new("p", q(1, 1).with_burst(1).unwrap()))
                .unwrap();
            let k = Key::Global;
            let c = [Charge::new(p, &k, 1)];
            assert_eq!(reserve_for(&s, &c, max_wait).delay(), Duration::ZERO);
            let mut admitted = vec![0];
            let waiters: Vec<(u64, Receipt)> = (1..=3u64)
                .map(|i| {
                    let d = reserve_for(&s, &c, max_wait);
                    assert_eq!(d.delay(), Duration::from_nanos(i * T));
                    (i * T, d.receipt(0))
                })
                .collect();
            let mut gone = [false; 3];
            for tick in 1..=24u64 {
                let now = tick * 250 * MS;
                clock.set(now);
                // Drops happen before W1's turn (1 s), one per tick, in `order`.
                if let Some(&w) = order[..dropped].get(tick as usize - 1) {
                    gone[w] = true;
                    s.refund(&[Refund::new(c[0], waiters[w].1)]);
                }
                if tick % 2 == 0 {
                    let d = reserve_for(&s, &c, max_wait);
                    if d.is_allowed() {
                        admitted.push(now + u64::try_from(d.delay().as_nanos()).unwrap());
                    }
                } else if s.check_now(&c).unwrap().is_allowed() {
                    admitted.push(now);
                }
            }
            admitted.extend(
                waiters
                    .iter()
                    .zip(gone)
                    .filter(|(_, gone)| !gone)
                    .map(|((at, _), _)| *at),
            );
            admitted.sort_unstable();
            assert!(admitted.len() >= 5, "{order:?} {dropped}: {admitted:?}");
            for pair in admitted.windows(2) {
                assert!(
                    pair[1] - pair[0] >= T,
                    "order {order:?}, {dropped} dropped: {admitted:?}"
                );
            }
        }
    }
}

/// One algorithm's run of a late refund on the store (limit 2 per 60,000 ms): R1 at `r1`, R2
/// and R3 at `r23`, R1 refunded at `refund`, R4 at `r4`. Returns R4's decision.
fn late_refund_run(policy: Policy, r1: u64, r23: u64, refund: u64, r4: u64) -> Decision {
    let (mut s, clock) = store();
    let p = s.register(&policy).unwrap();
    let k = Key::from("client");
    let c = [Charge::new(p, &k, 1)];
    clock.set(r1 * MS);
    let first = s.check_now(&c).unwrap();
    assert!(first.is_allowed() && first.receipt(0).is_some());
    clock.set(r23 * MS);
    for expected in [1, 0] {
        let d = s.check_now(&c).unwrap();
        assert!(d.is_allowed(), "{policy:?}");
        assert_eq!(d.as_slice()[0].remaining(), expected, "{policy:?}");
    }
    clock.set(refund * MS);
    s.refund(&[Refund::new(c[0], first.receipt(0))]);
    clock.set(r4 * MS);
    s.check_now(&c).unwrap().as_slice()[0]
}

/// For every algorithm, a refund that arrives after its charge expired (the window closed,
/// the log entry left, the bucket drained it) gives back nothing: the report
/// <https://github.com/express-rate-limit/express-rate-limit/pull/647>, where such a refund
/// freed another request's quota.
#[test]
fn a_refund_after_its_charge_expired_gives_back_nothing() {
    let two = q(2, 60);
    let denied = |d: Decision| d.retry_after().expect("R4 must be denied");
    let fw = Policy::new("p", two).with_algorithm(Algorithm::FixedWindow);
    let d = late_refund_run(fw, 59_000, 60_500, 61_000, 62_000);
    assert_eq!(denied(d), Duration::from_millis(58_000));
    assert_eq!(d.remaining(), 0);
    let log = Policy::new("p", two).with_algorithm(Algorithm::SlidingLog);
    let d = late_refund_run(log, 0, 60_500, 61_000, 62_000);
    // The entry of t = 60,500 leaves at 120,500.
    assert_eq!(denied(d), Duration::from_millis(58_500));
    let counter = Policy::new("p", two).with_algorithm(Algorithm::SlidingWindow);
    let d = late_refund_run(counter, 0, 120_500, 121_000, 122_000);
    // Window 2 holds 2: the next window starts with previous = 2, and one more fits once
    // 2 * (1 - e) + 1 <= 2, e >= 0.5: 58 s + 30 s.
    assert_eq!(denied(d), Duration::from_millis(88_000));
    for algorithm in [Algorithm::Gcra, Algorithm::LeakyBucket] {
        // Burst 2, one unit per 30,000 ms.
        let bucket = Policy::new("p", two).with_algorithm(algorithm);
        let d = late_refund_run(bucket, 0, 120_000, 120_000, 120_001);
        assert_eq!(denied(d), Duration::from_millis(29_999), "{algorithm}");
        assert_eq!(d.remaining(), 0);
    }
}

/// Control for the late refund: a refund inside its charge's window still gives the charge
/// back.
#[test]
fn an_in_window_refund_still_gives_back() {
    let (mut s, clock) = store();
    let p = s
        .register(&Policy::new("p", q(2, 60)).with_algorithm(Algorithm::FixedWindow))
        .unwrap();
    let k = Key::from("client");
    let c = [Charge::new(p, &k, 1)];
    clock.set(1_000 * MS);
    let r1 = s.check_now(&c).unwrap();
    clock.set(1_500 * MS);
    assert_eq!(s.check_now(&c).unwrap().as_slice()[0].remaining(), 0);
    assert!(!s.check_now(&c).unwrap().is_allowed());
    clock.set(2_000 * MS);
    s.refund(&[Refund::new(c[0], r1.receipt(0))]);
    clock.set(3_000 * MS);
    let r4 = s.check_now(&c).unwrap();
    assert!(r4.is_allowed());
    assert_eq!(r4.as_slice()[0].remaining(), 0);
}

#[test]
fn sliding_window_refunds_follow_the_estimate() {
    let (mut s, clock) = store();
    // 4 per 100 ms.
    let p = s
        .register(
            &Policy::new("p", Quota::new(4, Duration::from_millis(100)).unwrap())
                .with_algorithm(Algorithm::SlidingWindow),
        )
        .unwrap();
    let k = Key::Global;
    let c = |n| [Charge::new(p, &k, n)];
    let remaining =
        |s: &MemoryStore<Key, ManualClock>| s.check_now(&c(0)).unwrap().as_slice()[0].remaining();
    let w0 = s.check_now(&c(4)).unwrap();
    // In the next window at 50 ms: previous 4 weighs 2; refunding the charge takes 2 of
    // them off `previous` (2 * 0.5 = 1 unit of the estimate).
    clock.set(150 * MS);
    assert_eq!(remaining(&s), 2);
    s.refund(&[Refund::new(c(2)[0], w0.receipt(0))]);
    assert_eq!(remaining(&s), 3);
    // In the same window the charge's units come off `current`.
    let w1 = s.check_now(&c(3)).unwrap();
    assert_eq!(remaining(&s), 0);
    s.refund(&[Refund::new(c(3)[0], w1.receipt(0))]);
    assert_eq!(remaining(&s), 3);
    // Two windows later the charge of window 0 counts for nothing: nothing comes back.
    let w1 = s.check_now(&c(2)).unwrap();
    clock.set(250 * MS);
    let before = remaining(&s);
    s.refund(&[Refund::new(c(2)[0], w0.receipt(0))]);
    assert_eq!(remaining(&s), before);
    s.refund(&[Refund::new(c(2)[0], w1.receipt(0))]);
    assert_eq!(remaining(&s), 4);
}

#[test]
fn sliding_log_refunds_only_their_own_unexpired_entry() {
    let (mut s, clock) = store();
    let p = s
        .register(&Policy::new("p", q(3, 1)).with_algorithm(Algorithm::SlidingLog))
        .unwrap();
    let k = Key::Global;
    let c = [Charge::new(p, &k, 1)];
    let first = s.check_now(&c).unwrap();
    clock.set(400 * MS);
    let second = s.check_now(&c).unwrap();
    // A refund of cost 2 on a charge of cost 1 takes at most its entry's one unit.
    s.refund(&[Refund::new(Charge::new(p, &k, 2), second.receipt(0))]);
    assert_eq!(
        s.check_now(&[Charge::new(p, &k, 0)]).unwrap().as_slice()[0].remaining(),
        2
    );
    // After the first entry expired (1 s), its refund gives back nothing.
    clock.set(1_000 * MS);
    s.check_now(&c).unwrap();
    s.check_now(&c).unwrap();
    s.refund(&[Refund::new(c[0], first.receipt(0))]);
    let d = s.check_now(&c).unwrap();
    assert!(d.is_allowed());
    assert_eq!(d.as_slice()[0].remaining(), 0);
}

#[test]
fn concurrency_permits_come_back_with_their_receipt() {
    let (mut s, _) = store();
    let p = s
        .register(&Policy::new("p", q(2, 1)).with_algorithm(Algorithm::Concurrency))
        .unwrap();
    let k = Key::Global;
    let c = [Charge::new(p, &k, 2)];
    let held = s.check_now(&c).unwrap();
    assert!(held.is_allowed() && held.receipt(0).is_some());
    let denied = s.check_now(&[Charge::new(p, &k, 1)]).unwrap();
    assert_eq!(denied.receipt(0), Receipt::NONE);
    s.refund(&[Refund::new(c[0], Receipt::NONE)]);
    assert!(!s.check_now(&[Charge::new(p, &k, 1)]).unwrap().is_allowed());
    s.refund(&[Refund::new(c[0], held.receipt(0))]);
    assert!(s.check_now(&c).unwrap().is_allowed());
}

#[test]
fn overflow_refunds_follow_the_same_rules() {
    let clock = ManualClock::new();
    let mut s = MemoryStore::with_clock(clock.clone()).with_max_keys(NonZeroUsize::new(1).unwrap());
    let p = s
        .register(&Policy::new("p", q(2, 60)).with_algorithm(Algorithm::FixedWindow))
        .unwrap();
    let check = |s: &MemoryStore<Key, ManualClock>, k: u64| {
        s.check_now(&[Charge::new(p, &Key::Int(k), 1)]).unwrap()
    };
    check(&s, 0);
    // Keys 1 and 2 share the overflow state.
    let one = check(&s, 1);
    assert_eq!(check(&s, 2).as_slice()[0].remaining(), 0);
    assert_eq!(s.overflowed(), 2);
    // In the same window, key 1's refund gives its unit back to the overflow state.
    let refund = Refund::new(Charge::new(p, &Key::Int(1), 1), one.receipt(0));
    s.refund(&[refund]);
    let three = check(&s, 3);
    assert!(three.is_allowed());
    assert_eq!(three.as_slice()[0].remaining(), 0);
    // In the next window (after a sweep) key 4 takes the stored place of the idle key 0,
    // keys 5 and 6 fill the overflow state again, and the late refund of key 3's charge
    // gives nothing back.
    clock.set(60_000 * MS);
    s.sweep();
    for k in 4..=6 {
        assert!(check(&s, k).is_allowed());
    }
    assert_eq!(s.overflowed(), 5);
    s.refund(&[Refund::new(
        Charge::new(p, &Key::Int(3), 1),
        three.receipt(0),
    )]);
    assert!(!check(&s, 7).is_allowed());
}

#[test]
fn all_or_nothing_rollback_gives_back_with_the_receipts_just_taken() {
    let (mut s, _) = store();
    // a: fixed window 2 per minute; b: GCRA 1 per minute, burst 1.
    let a = s
        .register(&Policy::new("a", q(2, 60)).with_algorithm(Algorithm::FixedWindow))
        .unwrap();
    let b = s
        .register(&Policy::new("b", q(1, 60).with_burst(1).unwrap()))
        .unwrap();
    let k = Key::Global;
    let both = [Charge::new(a, &k, 1), Charge::new(b, &k, 1)];
    let first = s.check_now(&both).unwrap();
    assert!(first.is_allowed());
    assert!(first.receipts().all(Receipt::is_some));
    let denied = s.check_now(&both).unwrap();
    assert!(!denied.is_allowed());
    assert!(denied.receipts().all(|r| !r.is_some()));
    // a was rolled back: one unit left, taken now on its own.
    let d = s.check_now(&[both[0]]).unwrap();
    assert_eq!(d.as_slice()[0].remaining(), 0);
}

/// 5 per second, burst 5 (T = 200 ms): charges A and B, A refunded out of the middle (B's
/// slot moves up to [t, t + 200 ms]), C charged at t (its slot after B's). 1 ms later B
/// holds 199 ms, and its refund gives back exactly that, not C's time; C's refund then
/// gives back its whole slot. Both GCRA and the leaky bucket; the key goes back to its
/// lane once its schedule is empty and every stamp it handed out is stale.
#[test]
fn a_refund_out_of_the_middle_leaves_every_later_charge_exactly_its_own() {
    for algorithm in [Algorithm::Gcra, Algorithm::LeakyBucket] {
        let (mut s, clock) = store();
        let p = s
            .register(&Policy::new("p", q(5, 1)).with_algorithm(algorithm))
            .unwrap();
        let k = Key::from("client");
        let c = [Charge::new(p, &k, 1)];
        let reset_ns = |s: &MemoryStore<Key, ManualClock>| {
            let d = s.peek_now(p, &k).unwrap();
            u64::try_from(d.reset_after().as_nanos()).unwrap()
        };
        let t = 1_000_000 * MS;
        clock.set(t);
        let a = s.check_now(&c).unwrap().receipt(0);
        let b = s.check_now(&c).unwrap().receipt(0);
        s.refund(&[Refund::new(c[0], a)]);
        assert_eq!(reset_ns(&s), 200 * MS);
        let third = s.check_now(&c).unwrap();
        assert_eq!(
            third.as_slice()[0].reset_after(),
            Duration::from_millis(400)
        );
        clock.set(t + MS);
        s.refund(&[Refund::new(c[0], b)]);
        assert_eq!(reset_ns(&s), 200 * MS, "{algorithm:?}: B gives back 199 ms");
        s.refund(&[Refund::new(c[0], third.receipt(0))]);
        assert_eq!(reset_ns(&s), 0, "{algorithm:?}: C gives back its 200 ms");
        assert_eq!(s.len(), 1);
        // Idle, and every stamp stale: a sweep lets the key go; its next charge is a new
        // key's, in its lane.
        clock.set(t + 2_000 * MS);
        s.sweep();
        assert_eq!(s.len(), 0);
        let fresh = s.check_now(&c).unwrap();
        assert_eq!(fresh.as_slice()[0].remaining(), 4);
        s.refund(&[Refund::new(c[0], b)]);
        assert_eq!(
            reset_ns(&s),
            200 * MS,
            "{algorithm:?}: an old receipt gives nothing"
        );
    }
}
