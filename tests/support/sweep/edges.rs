//! Generator families at the edges: refunds with receipts against a reference model of the
//! memory store (with `max_keys`, its overflow state and resets), configuration documents,
//! the response headers a polite client reads, and compact keys at many distinct keys.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use ratekeeper_axum::client::{OverDeadline, PoliteLayer, announced_wait};
use ratekeeper_axum::config::LayerConfig;
use ratekeeper_core::algorithm::{
    Concurrency, FixedWindow, FixedWindowState, Gcra, LeakyBucket, SlidingLog, SlidingLogState,
    SlidingWindow, SlidingWindowState,
};
use ratekeeper_core::clock::ManualClock;
use ratekeeper_core::store::{
    Charge, Decisions, MemoryStore, PolicyId, Receipt, Refund, Store, StoreError,
};
use ratekeeper_core::{Algorithm, Decision, Key, Policy, Quota};
use tower::{Layer, ServiceExt};

use super::Gen;

const MS: u64 = 1_000_000;

// ---------------------------------------------------------------------------------------
// Refunds with receipts against a reference model
// ---------------------------------------------------------------------------------------

/// One life of a state in the reference model: the algorithm's pure functions over a plain
/// value, in real time, with the stamps they hand out.
#[derive(Debug, Clone)]
enum Life {
    Tat(u64),
    /// GCRA, leaky bucket: a key's schedule after a refund out of its middle.
    Ledger(Sched),
    Fixed(FixedWindowState),
    Counter(SlidingWindowState),
    Log(SlidingLogState),
    Held(u64),
}

/// A GCRA or leaky-bucket schedule as a FIFO ledger, as the memory store keeps one for a
/// key after a refund out of the middle of its schedule: live spans `(from, to]` in the
/// coordinates of its stamps, oldest first, drained from the front up to `at`; new slots
/// are placed from `next` on (from `now` at the earliest when the schedule is empty).
#[derive(Debug, Clone)]
struct Sched {
    spans: Vec<(u64, u64)>,
    at: u64,
    next: u64,
}

impl Sched {
    fn drain(&mut self, now: u64) {
        let mut left = now.saturating_sub(self.at);
        self.at = self.at.max(now);
        while left > 0 && !self.spans.is_empty() {
            let (a, b) = self.spans[0];
            if left >= b - a {
                left -= b - a;
                self.spans.remove(0);
            } else {
                self.spans[0].0 = a + left;
                left = 0;
            }
        }
    }

    fn live(&self) -> u64 {
        self.spans.iter().map(|(a, b)| b - a).sum()
    }

    fn tat(&mut self, now: u64) -> u64 {
        self.drain(now);
        self.at + self.live()
    }

    /// Appends a slot of `len`; its stamp.
    fn push(&mut self, now: u64, len: u64) -> u64 {
        self.drain(now);
        let from = if self.spans.is_empty() {
            self.next.max(now)
        } else {
            self.next
        };
        let to = from + len;
        match self.spans.last_mut() {
            Some(last) if last.1 == from => last.1 = to,
            _ => self.spans.push((from, to)),
        }
        self.next = to;
        to
    }

    /// A refund of `len` by the charge stamped `stamp`: nothing while a later slot waits
    /// beyond `now + tau`; else the live time at or below `stamp`, from the top down.
    fn refund(&mut self, now: u64, len: u64, stamp: u64, tau: u64) {
        self.drain(now);
        if self.spans.last().is_some_and(|l| l.1 > stamp) && self.live() > tau {
            return;
        }
        let mut left = len;
        let mut kept = Vec::new();
        for &(a, b) in self.spans.iter().rev() {
            let hi = b.min(stamp);
            if a >= hi || left == 0 {
                kept.push((a, b));
                continue;
            }
            let lo = hi.saturating_sub(left).max(a);
            left -= hi - lo;
            if hi < b {
                kept.push((hi, b));
            }
            if a < lo {
                kept.push((a, lo));
            }
        }
        kept.reverse();
        self.spans = kept;
    }
}

/// The algorithm of the policy under test, bound to its quota.
#[derive(Debug, Clone, Copy)]
enum Pure {
    Gcra(Gcra),
    /// The leaky bucket, and the GCRA it meters with.
    Leaky(LeakyBucket, Gcra),
    Fixed(FixedWindow),
    Counter(SlidingWindow),
    Log(SlidingLog),
    Concurrency(Concurrency),
}

impl Pure {
    fn new(algorithm: Algorithm, quota: &Quota) -> Self {
        match algorithm {
            Algorithm::LeakyBucket => Pure::Leaky(LeakyBucket::new(quota), Gcra::new(quota)),
            Algorithm::FixedWindow => Pure::Fixed(FixedWindow::new(quota)),
            Algorithm::SlidingWindow => Pure::Counter(SlidingWindow::new(quota)),
            Algorithm::SlidingLog => Pure::Log(SlidingLog::new(quota)),
            Algorithm::Concurrency => Pure::Concurrency(Concurrency::new(quota)),
            _ => Pure::Gcra(Gcra::new(quota)),
        }
    }

    /// The state of a key never seen.
    fn absent(self) -> Life {
        match self {
            Pure::Gcra(_) | Pure::Leaky(..) => Life::Tat(0),
            Pure::Fixed(_) => Life::Fixed(FixedWindowState::default()),
            Pure::Counter(_) => Life::Counter(SlidingWindowState::default()),
            Pure::Log(_) => Life::Log(SlidingLogState::new()),
            Pure::Concurrency(_) => Life::Held(0),
        }
    }

    /// Decides and charges; the stamp of an allowed charge (the model's own receipt).
    ///
    /// GCRA and the leaky bucket (a meter) read the stored TAT as it is, not clamped to
    /// `now + tau` as [`Gcra::decide`] does: in the memory store a TAT beyond it is a turn a
    /// reservation booked. A reservation with no wait allowed is that check.
    fn check(self, life: &mut Life, now: u64, cost: u64) -> (Decision, Option<u64>) {
        match (self, life) {
            (Pure::Gcra(a) | Pure::Leaky(_, a), Life::Tat(tat)) => {
                let (shaped, next) = a.reserve(*tat, now, cost, Duration::ZERO);
                if let Some(next) = next {
                    *tat = next;
                }
                (shaped.decision(), next)
            }
            (Pure::Gcra(a) | Pure::Leaky(_, a), Life::Ledger(s)) => {
                let tat = s.tat(now);
                let (shaped, next) = a.reserve(tat, now, cost, Duration::ZERO);
                (shaped.decision(), next.map(|next| s.push(now, next - tat)))
            }
            (Pure::Fixed(a), Life::Fixed(s)) => {
                let (d, next) = a.decide(*s, now, cost);
                if let Some(next) = next {
                    *s = next;
                }
                (d, next.map(|n| n.window))
            }
            (Pure::Counter(a), Life::Counter(s)) => {
                let (d, next) = a.decide(*s, now, cost);
                if let Some(next) = next {
                    *s = next;
                }
                (d, next.map(|n| n.window))
            }
            (Pure::Log(a), Life::Log(s)) => a.decide_stamped(s, now, cost),
            (Pure::Concurrency(a), Life::Held(held)) => {
                let (d, next) = a.decide(*held, cost);
                if let Some(next) = next {
                    *held = next;
                }
                (d, next.map(|_| now))
            }
            (pure, life) => panic!("model mismatch: {pure:?} over {life:?}"),
        }
    }

    /// Reserves for a request that may wait up to `max_wait`: GCRA and the leaky bucket (the
    /// shaper) book a turn; the others check. The decision, the delay of an allowed one and
    /// the stamp.
    fn reserve(
        self,
        life: &mut Life,
        now: u64,
        cost: u64,
        max_wait: Duration,
    ) -> (Decision, Option<Duration>, Option<u64>) {
        let shaped = match (self, &mut *life) {
            (Pure::Gcra(a), Life::Tat(tat)) => Some(a.reserve(*tat, now, cost, max_wait)),
            (Pure::Leaky(a, _), Life::Tat(tat)) => Some(a.shape(*tat, now, cost, max_wait)),
            (Pure::Gcra(a), Life::Ledger(s)) => {
                let tat = s.tat(now);
                let (shaped, next) = a.reserve(tat, now, cost, max_wait);
                let stamp = next.map(|next| s.push(now, next - tat));
                return (shaped.decision(), shaped.delay(), stamp);
            }
            (Pure::Leaky(a, _), Life::Ledger(s)) => {
                let tat = s.tat(now);
                let (shaped, next) = a.shape(tat, now, cost, max_wait);
                let stamp = next.map(|next| s.push(now, next - tat));
                return (shaped.decision(), shaped.delay(), stamp);
            }
            _ => None,
        };
        match (shaped, life) {
            (Some((shaped, next)), Life::Tat(tat)) => {
                if let Some(next) = next {
                    *tat = next;
                }
                (shaped.decision(), shaped.delay(), next)
            }
            (_, life) => {
                let (d, stamp) = self.check(life, now, cost);
                (d, d.is_allowed().then_some(Duration::ZERO), stamp)
            }
        }
    }

    /// Gives back what the charge with model stamp `stamp` still holds. GCRA and the leaky
    /// bucket: a refund out of the middle of the schedule (an earlier charge, partly
    /// undrained) turns a key's own life into a ledger, and gives back nothing on the shared
    /// overflow state (`shared`).
    fn refund(self, life: &mut Life, now: u64, cost: u64, stamp: u64, shared: bool) {
        match (self, life) {
            (Pure::Gcra(a) | Pure::Leaky(_, a), life @ Life::Tat(_)) => {
                let Life::Tat(tat) = *life else {
                    unreachable!("matched a TAT")
                };
                let next = a.refunded(tat, now, cost, stamp);
                if next == tat || tat == stamp {
                    *life = Life::Tat(next);
                } else if !shared {
                    let mut sched = Sched {
                        spans: if tat > now {
                            vec![(now, tat)]
                        } else {
                            Vec::new()
                        },
                        at: now,
                        next: tat,
                    };
                    let len = cost * a.emission_interval_nanos();
                    sched.refund(now, len, stamp, a.tolerance_nanos());
                    *life = Life::Ledger(sched);
                }
            }
            (Pure::Gcra(a) | Pure::Leaky(_, a), Life::Ledger(s)) => {
                let len = cost * a.emission_interval_nanos();
                s.refund(now, len, stamp, a.tolerance_nanos());
            }
            (Pure::Fixed(a), Life::Fixed(s)) => *s = a.refunded(*s, now, cost, stamp),
            (Pure::Counter(a), Life::Counter(s)) => *s = a.refunded(*s, now, cost, stamp),
            (Pure::Log(a), Life::Log(s)) => a.refund(s, now, cost, stamp),
            (Pure::Concurrency(a), Life::Held(held)) => *held = a.released(*held, cost),
            (pure, life) => panic!("model mismatch: {pure:?} over {life:?}"),
        }
    }

    /// Whether the state equals "absent" at `now`.
    fn is_idle(self, life: &Life, now: u64) -> bool {
        match (self, life) {
            (Pure::Gcra(_) | Pure::Leaky(..), Life::Tat(tat)) => *tat <= now,
            (Pure::Gcra(_) | Pure::Leaky(..), Life::Ledger(s)) => s.at + s.live() <= now,
            (Pure::Fixed(a), Life::Fixed(s)) => a.is_idle(*s, now),
            (Pure::Counter(a), Life::Counter(s)) => a.is_idle(*s, now),
            (Pure::Log(a), Life::Log(s)) => a.is_idle(s, now),
            (Pure::Concurrency(_), Life::Held(held)) => *held == 0,
            (pure, life) => panic!("model mismatch: {pure:?} over {life:?}"),
        }
    }
}

/// An allowed charge not yet refunded: the store's receipt and the model's.
#[derive(Debug)]
struct Outstanding {
    key: usize,
    cost: u64,
    receipt: Receipt,
    /// The model life it was charged on (0: the overflow state).
    life: usize,
    stamp: u64,
}

/// Keys of every compact lane.
fn model_keys() -> [Key; 5] {
    [
        Key::Int(7),
        Key::from("user-1"),
        Key::from("k_live_0123456789abcdef0123456789"),
        Key::Ip(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1))),
        Key::Net(
            IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 1, 0, 0, 0, 0)),
            64,
        ),
    ]
}

/// A memory store on a manual clock (one policy of any algorithm, small quotas, sometimes
/// `with_max_keys` of 1 to 3) driven by a trace of checks (costs 0 to beyond the capacity),
/// refunds of earlier receipts in any order, resets, sweeps and clock steps, against a
/// reference model: per key, the life of its own state (a new one after a reset, or after
/// the store let an idle state go) and one shared overflow state, each run by the
/// algorithm's pure functions.
///
/// Properties: every decision equals the model's (outcome, remaining, reset, retry), so a
/// refund never gives back more, or less, than its charge still holds on the state and
/// in the life it was charged on: a receipt from the overflow state goes back there, one
/// from an earlier life (before a reset, before an eviction) gives back nothing. The store
/// lets a key's state go only when it is idle, and holds a key only when the model does.
pub fn refund_receipts(data: &[u8]) {
    let mut g = Gen::new(data);
    let algorithm = g.pick(&Algorithm::ALL);
    let limit = 1 + g.below(4) as u32;
    let period = g.pick(&[MS, 1_000 * MS, 60_000 * MS]);
    let Ok(mut quota) = Quota::new(limit, Duration::from_nanos(period)) else {
        panic!("a small quota is valid");
    };
    // A burst only for the algorithms that take one (the others refuse it).
    let takes_burst = matches!(algorithm, Algorithm::Gcra | Algorithm::LeakyBucket);
    if g.flip() && takes_burst {
        if let Ok(q) = quota.with_burst(1 + g.below(limit as usize + 1) as u32) {
            quota = q;
        }
    }
    let policy = Policy::new("p", quota).with_algorithm(algorithm);
    let capacity = u64::from(policy.capacity());
    let max_keys = g.pick(&[None, Some(1), Some(2), Some(3)]);
    let clock = ManualClock::new();
    let mut store = MemoryStore::<Key, _>::with_clock(clock.clone());
    if let Some(n) = max_keys.and_then(NonZeroUsize::new) {
        store = store.with_max_keys(n);
    }
    let Ok(p) = store.register(&policy) else {
        panic!("a valid policy registers");
    };
    let pure = Pure::new(algorithm, &quota);
    let keys = model_keys();
    // Life 0 is the overflow state; `own[k]` is key k's current life, if it holds one.
    let mut lives = vec![pure.absent()];
    let mut own: [Option<usize>; 5] = [None; 5];
    let mut outstanding: Vec<Outstanding> = Vec::new();
    let steps = [
        0,
        1,
        period / 3,
        period / 2,
        period,
        period + 1,
        2 * period,
        100 * period,
    ];
    let mut now = 0u64;
    let ops = 8 + g.below(56);
    for op in 0..ops {
        match g.below(11) {
            0..=3 => {
                let k = g.below(keys.len());
                let cost = g.pick(&[0, 1, 1, 1, 2, capacity, capacity + 1]);
                sync(&store, p, &keys, &mut own, &lives, pure, now, op);
                let mut full = max_keys.is_some_and(|m| store.len() >= m);
                let held = store.holds(p, &keys[k]);
                let decisions = check(&store, p, &keys[k], cost);
                let d = decisions.as_slice()[0];
                let after = store.holds(p, &keys[k]);
                if held && !after {
                    // The key's state went during the check (a reset key's fence is let go
                    // once its state is idle and every old stamp stale), before a check
                    // that charged nothing: it read the overflow state or "absent".
                    if let Some(life) = own[k].take() {
                        assert!(
                            pure.is_idle(&lives[life], now),
                            "op {op}: let go while not idle"
                        );
                    }
                    full = max_keys.is_some_and(|m| store.len() >= m);
                }
                let target = match own[k] {
                    Some(life) => Some(life),
                    None if after => {
                        lives.push(pure.absent());
                        own[k] = Some(lives.len() - 1);
                        own[k]
                    }
                    None if full => Some(0),
                    None => None,
                };
                let (expected, stamp) = match target {
                    Some(life) => pure.check(&mut lives[life], now, cost),
                    None => pure.check(&mut pure.absent(), now, cost),
                };
                assert_eq!(
                    d, expected,
                    "op {op}: {algorithm} {quota} max_keys {max_keys:?}, key {k} cost {cost} at {now} on life {target:?}"
                );
                assert!(
                    target.is_some() || !d.is_allowed() || cost == 0,
                    "op {op}: an allowed charge on no state"
                );
                match (target, stamp) {
                    (Some(life), Some(stamp)) if d.is_allowed() && cost > 0 => {
                        let receipt = decisions.receipt(0);
                        assert!(
                            receipt.is_some(),
                            "op {op}: an allowed charge without a receipt"
                        );
                        outstanding.push(Outstanding {
                            key: k,
                            cost,
                            receipt,
                            life,
                            stamp,
                        });
                    }
                    _ => assert!(
                        !decisions.receipt(0).is_some(),
                        "op {op}: a receipt for nothing"
                    ),
                }
            }
            9 if max_keys.is_none() => {
                // A reservation (Delay mode): booked by GCRA and the leaky bucket on a
                // key's own state, a check anywhere else.
                let k = g.below(keys.len());
                let cost = g.pick(&[0, 1, 1, 2, capacity + 1]);
                let max_wait = g.pick(&[0, period, 10 * period, u64::MAX]);
                let max_wait = Duration::from_nanos(max_wait);
                sync(&store, p, &keys, &mut own, &lives, pure, now, op);
                let Ok(decisions) = store.reserve_now(&[Charge::new(p, &keys[k], cost)], max_wait)
                else {
                    panic!("a registered policy answers");
                };
                let d = decisions.as_slice()[0];
                let before = own[k];
                if before.is_none() && store.holds(p, &keys[k]) {
                    lives.push(pure.absent());
                    own[k] = Some(lives.len() - 1);
                }
                let target = own[k];
                let (expected, delay, stamp) = match (before, target) {
                    // A key holding state books; a new key is absent, where a reservation
                    // is a check.
                    (Some(life), _) => pure.reserve(&mut lives[life], now, cost, max_wait),
                    (None, Some(life)) => {
                        let (d, stamp) = pure.check(&mut lives[life], now, cost);
                        (d, d.is_allowed().then_some(Duration::ZERO), stamp)
                    }
                    (None, None) => {
                        let (d, stamp) = pure.check(&mut pure.absent(), now, cost);
                        (d, d.is_allowed().then_some(Duration::ZERO), stamp)
                    }
                };
                assert_eq!(
                    d, expected,
                    "op {op}: reserve {algorithm} {quota}, key {k} cost {cost} wait {max_wait:?} at {now}"
                );
                if d.is_allowed() {
                    assert_eq!(Some(decisions.delay()), delay, "op {op}: the delay");
                }
                if let (Some(life), Some(stamp), true) = (target, stamp, d.is_allowed() && cost > 0)
                {
                    outstanding.push(Outstanding {
                        key: k,
                        cost,
                        receipt: decisions.receipt(0),
                        life,
                        stamp,
                    });
                }
            }
            4 | 5 if !outstanding.is_empty() => {
                let o = outstanding.swap_remove(g.below(outstanding.len()));
                sync(&store, p, &keys, &mut own, &lives, pure, now, op);
                let charge = Charge::new(p, &keys[o.key], o.cost);
                store.refund(&[Refund::new(charge, o.receipt)]);
                if o.life == 0 || own[o.key] == Some(o.life) {
                    pure.refund(&mut lives[o.life], now, o.cost, o.stamp, o.life == 0);
                }
            }
            6 => {
                let k = g.below(keys.len());
                sync(&store, p, &keys, &mut own, &lives, pure, now, op);
                match store.forget(p, &keys[k]) {
                    Ok(()) => {
                        own[k] = None;
                        // A key held, or charged on the overflow state, gets a fresh state.
                        if store.holds(p, &keys[k]) {
                            lives.push(pure.absent());
                            own[k] = Some(lives.len() - 1);
                        }
                    }
                    // At the cap with no key idle, a key on the overflow state keeps it.
                    Err(StoreError::KeysFull(_)) => assert!(
                        own[k].is_none() && max_keys.is_some_and(|m| store.len() >= m),
                        "op {op}: a reset refused for a key with room for its own state"
                    ),
                    Err(e) => panic!("op {op}: {e}"),
                }
            }
            7 => store.sweep(),
            _ => {
                now = now.saturating_add(g.pick(&steps));
                clock.set(now);
            }
        }
        sync(&store, p, &keys, &mut own, &lives, pure, now, op);
    }
}

/// Ends the model life of every key whose state the store let go; the state must have
/// been idle.
#[allow(clippy::too_many_arguments)]
fn sync(
    store: &MemoryStore<Key, ManualClock>,
    p: PolicyId,
    keys: &[Key],
    own: &mut [Option<usize>],
    lives: &[Life],
    pure: Pure,
    now: u64,
    op: usize,
) {
    for (k, key) in keys.iter().enumerate() {
        if let Some(life) = own[k] {
            if !store.holds(p, key) {
                assert!(
                    pure.is_idle(&lives[life], now),
                    "op {op}: key {k} let go while not idle: {:?} at {now}",
                    lives[life]
                );
                own[k] = None;
            }
        }
    }
}

fn check(store: &MemoryStore<Key, ManualClock>, p: PolicyId, key: &Key, cost: u64) -> Decisions {
    match store.check_now(&[Charge::new(p, key, cost)]) {
        Ok(d) => d,
        Err(e) => panic!("a registered policy answers: {e}"),
    }
}

// ---------------------------------------------------------------------------------------
// Compact keys at many distinct keys
// ---------------------------------------------------------------------------------------

/// One key of any lane, built to sit next to others: neighbouring addresses, an IPv4
/// address and its IPv4-mapped form, prefixes of every length with and without host bits,
/// strings around the 15/16-byte boundary differing in one byte, integers, tuples.
fn any_key(g: &mut Gen<'_>) -> Key {
    let n = g.byte();
    let low = u32::from(g.byte());
    match g.below(9) {
        0 => Key::Ip(IpAddr::V4(Ipv4Addr::from(0xC000_0200 | low))),
        1 => Key::Ip(IpAddr::V6(
            Ipv4Addr::from(0xC000_0200 | low).to_ipv6_mapped(),
        )),
        2 => Key::Net(IpAddr::V4(Ipv4Addr::from(0xC000_0200 | low)), n % 40),
        3 => {
            let prefix = u128::from(0x2001_0db8u32) << 96 | u128::from(low) << 64;
            let host = if g.flip() { u128::from(n) } else { 0 };
            Key::Net(
                IpAddr::V6(Ipv6Addr::from(prefix | host)),
                g.pick(&[48, 56, 63, 64, 65, 127, 128, 129]),
            )
        }
        4 => Key::Ip(IpAddr::V6(Ipv6Addr::from(
            u128::from(0x2001_0db8u32) << 96 | u128::from(low),
        ))),
        5 => Key::Int(u64::from(low) | u64::from(n) << 56),
        6 => {
            let len = g.pick(&[0usize, 1, 14, 15, 16, 17, 40]);
            let mut s: String = (0..len)
                .map(|i| char::from(b'a' + (i % 26) as u8))
                .collect();
            if !s.is_empty() {
                s.pop();
                s.push(char::from(b'a' + n % 26));
            }
            Key::from(s)
        }
        7 => Key::Global,
        _ => Key::tuple([
            Key::Int(u64::from(low)),
            Key::from(if g.flip() { "a" } else { "b" }),
        ]),
    }
}

/// Up to 600 keys of every lane (many of them distinct, some repeated) through a memory
/// store with no cap, each charged once or more under "3 per day" (nothing refills during
/// the trace), against a map of counts by key.
///
/// Properties: two distinct keys never share a budget and a key always meets its own
/// (every decision matches its count), the store holds exactly the keys charged, and a
/// cost-0 probe of a key never charged reads a full budget.
pub fn compact_keys(data: &[u8]) {
    let mut g = Gen::new(data);
    let algorithm = g.pick(&[
        Algorithm::Gcra,
        Algorithm::FixedWindow,
        Algorithm::SlidingLog,
    ]);
    let Ok(quota) = Quota::new(3, Duration::from_secs(86_400)) else {
        panic!("a valid quota");
    };
    let mut store = MemoryStore::<Key, _>::with_clock(ManualClock::new());
    let Ok(p) = store.register(&Policy::new("p", quota).with_algorithm(algorithm)) else {
        panic!("a valid policy registers");
    };
    let mut counts: HashMap<Key, u32> = HashMap::new();
    let n = g.below(600);
    for i in 0..n {
        let key = if i > 0 && g.byte() < 32 {
            // Repeat a key seen before (its own budget, not a new one).
            let seen: Vec<&Key> = counts.keys().collect();
            if seen.is_empty() {
                any_key(&mut g)
            } else {
                seen[g.below(seen.len())].clone()
            }
        } else {
            any_key(&mut g)
        };
        let count = counts.get(&key).copied().unwrap_or(0);
        if count == 0 {
            let probe = check(&store, p, &key, 0);
            assert_eq!(
                probe.as_slice()[0].remaining(),
                3,
                "{key:?}: a fresh key shares a budget"
            );
        }
        let d = check(&store, p, &key, 1).as_slice()[0];
        if count < 3 {
            assert!(d.is_allowed(), "{key:?}: denied after {count} of 3");
            assert_eq!(d.remaining(), 2 - count, "{key:?}");
            counts.insert(key.clone(), count + 1);
        } else {
            assert!(!d.is_allowed(), "{key:?}: a fourth unit in a day");
        }
        assert!(store.holds(p, &key), "{key:?} not held after a charge");
    }
    assert_eq!(
        store.len(),
        counts.len(),
        "keys held != distinct keys charged"
    );
}

// ---------------------------------------------------------------------------------------
// Configuration documents
// ---------------------------------------------------------------------------------------

/// Tokens of a layer configuration document (TOML).
const CONFIG_TOKENS: &[&str] = &[
    "[[policies]]\n",
    "[[routes]]\n",
    "[tiers]\n",
    "[exempt]\n",
    "name = \"api\"\n",
    "name = \"login\"\n",
    "name = \"\"\n",
    "quota = \"100/m\"\n",
    "quota = \"5/m burst 2\"\n",
    "quota = \"0/m\"\n",
    "quota = \"1/day burst 4294967296\"\n",
    "quota = 5\n",
    "algorithm = \"sliding_window\"\n",
    "algorithm = \"leaky\"\n",
    "algorithm = \"concurrency\"\n",
    "method = \"GET\"\n",
    "method = \"G T\"\n",
    "path = \"/search\"\n",
    "path = \"/items/{id}\"\n",
    "path = \"search\"\n",
    "path = \"/a\\nb\"\n",
    "cost = 5\n",
    "cost = 0\n",
    "cost = -1\n",
    "cost = 18446744073709551616\n",
    "policies = [\"login\"]\n",
    "policies = [\"nope\"]\n",
    "key = { kind = \"forwarded\", trusted = [\"10.0.0.0/8\"] }\n",
    "key = { kind = \"header\", header = \"x-api-key\" }\n",
    "key = { kind = \"header\", header = \"bad header\" }\n",
    "key = { kind = \"global\" }\n",
    "key = \"peer_ip\"\n",
    "headers = \"ietf\"\n",
    "headers = \"sideways\"\n",
    "mode = \"delay\"\n",
    "mode = \"shadow\"\n",
    "max_wait_ms = 5\n",
    "max_wait_ms = 18446744073709551615\n",
    "header = \"x-api-key\"\n",
    "default = \"api\"\n",
    "values = { \"k\" = \"login\" }\n",
    "networks = [\"192.0.2.0/24\"]\n",
    "networks = [\"192.0.2.0/33\"]\n",
    "preflight = true\n",
    "unknown = 1\n",
    "# a comment\n",
    "\"\"\"\n",
    "=",
    "[",
    "\n",
    "\u{feff}",
    "é",
];

/// A layer configuration document built from `data` (mostly well-formed lines, every field
/// varied) read with [`LayerConfig::from_toml`], then built.
///
/// Properties: no panic; every error, at reading or at building, is one line of text
/// (no line break: logs and terminals show it whole) naming the file when reading, with a
/// line and column inside the document when it gives them.
pub fn config_document(data: &[u8]) {
    let mut g = Gen::new(data);
    let mut text = String::new();
    if g.flip() {
        text.push_str("[[policies]]\nname = \"api\"\nquota = \"100/m\"\n");
    }
    text.push_str(&g.text(CONFIG_TOKENS, 12));
    match LayerConfig::from_toml("limits.toml", &text) {
        Err(e) => {
            let shown = e.to_string();
            assert!(
                !shown.contains(['\n', '\r']),
                "a config error of several lines: {shown:?}\nfor {text:?}"
            );
            assert!(
                shown.starts_with("limits.toml"),
                "the error names no file: {shown:?}"
            );
            if let Some(line) = e.line() {
                assert!(
                    line >= 1 && line <= text.lines().count() + 1,
                    "line {line} of {text:?}"
                );
            }
            if let Some(column) = e.column() {
                assert!(column >= 1, "column {column}");
            }
        }
        Ok(config) => {
            if let Err(e) = config.build() {
                let shown = e.to_string();
                assert!(
                    !shown.contains(['\n', '\r']),
                    "a build error of several lines: {shown:?}\nfor {text:?}"
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Polite-client response headers
// ---------------------------------------------------------------------------------------

thread_local! {
    static PAUSED: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread tokio runtime with paused time");
}

/// What the polite client's test server answers: a status and header lines.
#[derive(Debug, Clone)]
struct Answer {
    status: StatusCode,
    headers: Vec<(&'static str, String)>,
}

/// A rate-limit announcement: the fields a server sends, with values in every unit a
/// server uses (delta seconds, Unix seconds, Unix milliseconds, in the past, malformed).
fn announcement(g: &mut Gen<'_>, unix_s: u64) -> Answer {
    let status = g.pick(&[
        StatusCode::OK,
        StatusCode::TOO_MANY_REQUESTS,
        StatusCode::SERVICE_UNAVAILABLE,
    ]);
    let delta = g.pick(&[0u64, 1, 2, 5, 30, 59, 61, 120, 3_600]);
    let reset = match g.below(6) {
        0 => delta.to_string(),
        1 => (unix_s + delta).to_string(),
        2 => (unix_s * 1_000 + delta * 1_000).to_string(),
        3 => unix_s.saturating_sub(delta + 5).to_string(),
        4 => ((unix_s + delta) * 1_000_000).to_string(),
        _ => g
            .pick(&["-1", "1.5", "", "99999999999999999999999"])
            .to_owned(),
    };
    let mut headers = Vec::new();
    if g.flip() {
        headers.push((
            "x-ratelimit-remaining",
            g.pick(&["0", "0", "1", "10"]).to_owned(),
        ));
        headers.push(("x-ratelimit-reset", reset.clone()));
    }
    if g.flip() {
        headers.push((
            "ratelimit",
            format!("\"p\";r={};t={delta}", g.pick(&[0, 0, 3])),
        ));
    }
    if g.flip() {
        let value = if g.flip() { delta.to_string() } else { reset };
        headers.push(("retry-after", value));
    }
    Answer { status, headers }
}

/// How long the polite client reads `answer` as asking to wait (`None`: it does not ask).
fn asked(answer: &Answer) -> Option<Duration> {
    announced_wait(answer.status, &header_map(answer))
}

fn header_map(answer: &Answer) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in &answer.headers {
        if let Ok(v) = HeaderValue::from_str(value) {
            map.append(*name, v);
        }
    }
    map
}

/// The longest wait a reset value may plausibly ask: the delta it encodes in any unit
/// (seconds, or a Unix time in s, ms or µs), rounded up to whole seconds; 0 for a time past.
fn plausible_reset(value: &str, unix: Duration) -> Option<Duration> {
    let v: u64 = value.parse().ok()?;
    let now_s = unix.as_secs();
    let secs = if v >= 1_000_000_000_000_000 {
        (v / 1_000_000).saturating_sub(now_s) + 1
    } else if v >= 1_000_000_000_000 {
        (v / 1_000).saturating_sub(now_s) + 1
    } else if v >= 1_000_000_000 {
        v.saturating_sub(now_s)
    } else {
        v
    };
    Some(Duration::from_secs(secs))
}

/// A [`PoliteLayer`] (`max_wait` of 1 s to 10 min, failing or sending anyway beyond it)
/// over a server on tokio's paused clock that answers two announcements built from `data`,
/// then plain 200s; three requests one after the other.
///
/// Properties of the polite client:
/// - a reset is read by plausibility: whatever the unit a server used (delta, Unix s, ms
///   or µs, a time in the past), no announcement asks for longer than its most plausible
///   reading (`plausible_reset`, the longest of the fields it sends);
/// - never longer than the configured maximum: every request is sent after waiting at most
///   `max_wait`, or fails at once with `WaitTooLong` without reaching the server;
/// - a later answer shortens a recorded wait: the answer to a request sent after an
///   announcement replaces it, shorter included (the recorded wait is at most what the
///   latest answer asks), so the third request waits no longer than the second answer asks.
pub fn polite_headers(data: &[u8]) {
    let mut g = Gen::new(data);
    let unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let first = announcement(&mut g, unix.as_secs());
    let second = announcement(&mut g, unix.as_secs());
    let max_wait = Duration::from_secs(g.pick(&[1, 10, 60, 600]));
    for answer in [&first, &second] {
        let Some(asked) = asked(answer) else {
            continue;
        };
        let longest = answer
            .headers
            .iter()
            .filter_map(|(name, value)| match *name {
                "x-ratelimit-reset" | "retry-after" => plausible_reset(value, unix),
                "ratelimit" => value
                    .rsplit("t=")
                    .next()?
                    .parse()
                    .ok()
                    .map(Duration::from_secs),
                _ => None,
            })
            .max()
            .unwrap_or(Duration::ZERO);
        assert!(
            asked <= longest + Duration::from_secs(1),
            "{answer:?} asks {asked:?}, longer than any plausible reading ({longest:?})"
        );
    }
    let send_anyway = g.flip();
    PAUSED.with(|rt| rt.block_on(polite_trace(first, second, max_wait, send_anyway)));
}

/// The polite client's test server.
const ORIGIN: &str = "http://127.0.0.1:3000";

/// The three requests of [`polite_headers`] and their properties.
async fn polite_trace(first: Answer, second: Answer, max_wait: Duration, send_anyway: bool) {
    let seen = Arc::new(Mutex::new(0usize));
    let log = Arc::clone(&seen);
    let answers = [first.clone(), second.clone()];
    let server = tower::service_fn(move |_req: Request<()>| {
        let n = {
            let mut n = log
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            *n += 1;
            *n - 1
        };
        let answer = answers.get(n).cloned().unwrap_or(Answer {
            status: StatusCode::OK,
            headers: Vec::new(),
        });
        let mut res = Response::new(());
        *res.status_mut() = answer.status;
        *res.headers_mut() = header_map(&answer);
        std::future::ready(Ok::<_, Infallible>(res))
    });
    let over = if send_anyway {
        OverDeadline::SendAnyway
    } else {
        OverDeadline::Fail
    };
    let client = PoliteLayer::new()
        .max_wait(max_wait)
        .over_deadline(over)
        .layer(server);
    let req = || {
        Request::get("http://127.0.0.1:3000/")
            .body(())
            .unwrap_or_default()
    };
    let sent = || {
        *seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    };
    let mut last_answer = None;
    for n in 0..3 {
        let before = sent();
        let at = tokio::time::Instant::now();
        let result = client.clone().oneshot(req()).await;
        let waited = at.elapsed();
        match result {
            Ok(_) => {
                assert_eq!(
                    sent(),
                    before + 1,
                    "request {n}: answered without reaching the server"
                );
                assert!(
                    waited <= max_wait,
                    "request {n} waited {waited:?}, more than max_wait {max_wait:?}"
                );
                if n == 2 {
                    if let Some(asked) = last_answer.as_ref().and_then(asked) {
                        assert!(
                            waited <= asked + Duration::from_secs(1),
                            "the third request waited {waited:?}, though the latest answer asked {asked:?}: {first:?} then {second:?}"
                        );
                    }
                }
                last_answer = [&first, &second].get(before).map(|a| (*a).clone());
                // This request was sent after every recorded announcement: its answer is
                // the latest word, shorter included.
                if let Some(asked) = last_answer.as_ref().and_then(asked) {
                    // A Unix-time reset is read against the wall clock a moment apart.
                    let recorded = client.polite_layer().wait_for(ORIGIN).unwrap_or_default();
                    assert!(
                        recorded <= asked + Duration::from_secs(1),
                        "after answer {n} ({last_answer:?}, asking {asked:?}) the recorded wait is {recorded:?}: {first:?} then {second:?}"
                    );
                }
            }
            Err(e) => {
                assert!(e.is_wait_too_long() && !send_anyway, "request {n}: {e}");
                assert_eq!(sent(), before, "request {n} failed, yet was sent");
                assert_eq!(waited, Duration::ZERO, "request {n} failed after waiting");
                last_answer = None;
            }
        }
    }
}
