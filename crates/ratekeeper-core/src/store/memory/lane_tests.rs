//! Keys that are close in some form (same bytes in another family, same hash) never share
//! a budget in the memory store's compact lanes.

use std::hash::{BuildHasher, Hasher};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use super::compact::{Lane, lane};
use super::keyed::Keyed;
use super::*;
use crate::algorithm::Gcra;
use crate::clock::ManualClock;
use crate::{Key, Quota};

/// One request per hour per key: a second request on the same budget is denied.
fn one_per_hour() -> Quota {
    Quota::new(1, Duration::from_secs(3600)).unwrap()
}

/// Each key of `pair` gets its own single unit: both first requests pass, both second
/// requests are denied.
fn assert_apart(check: impl Fn(&Key) -> bool, pair: [&Key; 2]) {
    let [a, b] = pair;
    assert!(check(a), "first request of {a:?}");
    assert!(check(b), "{b:?} was charged to the budget of {a:?}");
    assert!(!check(a), "second request of {a:?}");
    assert!(!check(b), "second request of {b:?}");
}

fn ipv6(s: &str) -> IpAddr {
    IpAddr::V6(s.parse::<Ipv6Addr>().unwrap())
}

#[test]
fn close_ip_keys_never_share_a_budget() {
    let mut store = MemoryStore::<Key, _>::with_clock(ManualClock::new());
    let id = store.register(&Policy::new("ip", one_per_hour())).unwrap();
    let check = |k: &Key| {
        store
            .check_now(&[Charge::new(id, k, 1)])
            .unwrap()
            .is_allowed()
    };

    // Two /64 prefixes that differ in their last prefix bit.
    let p1 = Key::Net(ipv6("2001:db8:0:10::"), 64);
    let p2 = Key::Net(ipv6("2001:db8:0:11::"), 64);
    assert_apart(check, [&p1, &p2]);

    // The same bits as a /48 and as a /56 (other prefix lengths the HTTP layer can use).
    let n48 = Key::Net(ipv6("2001:db8:1::"), 48);
    let n56 = Key::Net(ipv6("2001:db8:1::"), 56);
    assert_apart(check, [&n48, &n56]);

    // An IPv4 address and its IPv4-mapped IPv6 form (::ffff:192.0.2.7).
    let v4 = Ipv4Addr::new(192, 0, 2, 7);
    let mapped = Key::Ip(IpAddr::V6(v4.to_ipv6_mapped()));
    assert_apart(check, [&Key::Ip(IpAddr::V4(v4)), &mapped]);

    // The /64 of the mapped form, the network 0.0.0.0/0 and the global key: all
    // different from the keys above and from each other.
    let net0 = Key::Net(ipv6("::"), 64);
    let v4_net = Key::Net(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0);
    assert_apart(check, [&net0, &v4_net]);
    assert!(check(&Key::Global));
    assert_eq!(store.len(), 9);
}

/// A test-only hasher with a 4-bit output: among a few dozen keys, many have equal hashes.
#[derive(Clone, Default)]
struct Tiny;

struct TinyHasher(std::hash::DefaultHasher);

impl BuildHasher for Tiny {
    type Hasher = TinyHasher;
    fn build_hasher(&self) -> TinyHasher {
        TinyHasher(std::hash::DefaultHasher::new())
    }
}

impl Hasher for TinyHasher {
    fn finish(&self) -> u64 {
        self.0.finish() & 0xF
    }
    fn write(&mut self, bytes: &[u8]) {
        self.0.write(bytes);
    }
}

#[test]
fn api_keys_with_equal_hashes_never_share_a_budget() {
    let clock = ManualClock::new();
    let now = || clock.now();
    let keyed: Keyed<Key, Gcra, Tiny> =
        Keyed::with_hasher(Gcra::new(&one_per_hour()), "api", usize::MAX, &Tiny);
    // Two 32-byte API keys whose hashes in their lane (the hash of the packed form) are
    // equal in the 4-bit space.
    let api = |i: u32| Key::from(format!("rk_live_{i:024}"));
    let hash = |k: &Key| match lane(k) {
        Lane::Ascii(form) => Tiny.hash_one(form),
        _ => unreachable!("32-byte ASCII API keys are in the ascii lane"),
    };
    let a = api(0);
    let b = (1..1000)
        .map(api)
        .find(|b| hash(b) == hash(&a))
        .expect("16 hash values: a match within 1000 keys");
    assert_eq!(a.to_string().len(), 32);
    assert_ne!(a, b);
    assert_eq!(hash(&a), hash(&b));

    let check = |k: &Key| keyed.check(k, now(), 1).0.is_allowed();
    assert_apart(check, [&a, &b]);
    assert_eq!(keyed.map.len(), 2);

    // Inline keys (integers, short strings): 40 keys, at most 16 hash values, so by
    // pigeonhole many share a hash; each still has its own budget.
    let inline: Vec<Key> = (0..20u64)
        .map(Key::Int)
        .chain((0..20).map(|i| Key::from(format!("user{i}"))))
        .collect();
    for k in &inline {
        assert!(check(k), "first request of {k:?}");
    }
    for k in &inline {
        assert!(!check(k), "second request of {k:?}");
    }
    assert_eq!(keyed.map.len(), 2 + 40);
}

/// A test-only hasher whose every hash is 0: every key of a lane collides with every other.
#[derive(Clone, Default)]
struct Zero;

struct ZeroHasher;

impl BuildHasher for Zero {
    type Hasher = ZeroHasher;
    fn build_hasher(&self) -> ZeroHasher {
        ZeroHasher
    }
}

impl Hasher for ZeroHasher {
    fn finish(&self) -> u64 {
        0
    }
    fn write(&mut self, _: &[u8]) {}
}

/// API keys whose hashes all collide keep their own budgets through sweeps (slots freed and
/// reused) and resets: a key never meets the state of another one, or of the key whose slot
/// it took.
#[test]
fn colliding_api_keys_keep_their_own_budgets_through_sweeps_and_resets() {
    let clock = ManualClock::new();
    let keyed: Keyed<Key, Gcra, Zero> =
        Keyed::with_hasher(Gcra::new(&one_per_hour()), "api", usize::MAX, &Zero);
    let api = |i: u32| Key::from(format!("rk_live_{i:024}"));
    for i in 0..96 {
        assert!(matches!(lane(&api(i)), Lane::Ascii(_)));
    }
    let check = |i: u32| keyed.check(&api(i), clock.now(), 1).0.is_allowed();

    // 0..32 now, 32..64 half an hour later: each key its own single unit.
    for i in 0..32 {
        assert!(check(i), "first request of key {i}");
    }
    clock.advance(Duration::from_secs(1800));
    for i in 32..64 {
        assert!(check(i), "first request of key {i}");
    }
    for i in 0..64 {
        assert!(!check(i), "second request of key {i}");
    }
    assert_eq!(keyed.len(), 64);

    // An hour after the first ones, they are idle and swept; their slots go to 64..96,
    // which start with a full budget, while 32..64 keep theirs (spent).
    clock.advance(Duration::from_secs(1860));
    keyed.sweep(clock.now());
    assert_eq!(keyed.len(), 32);
    for i in 64..96 {
        assert!(check(i), "first request of key {i} (in a reused slot)");
        assert!(!check(i), "second request of key {i}");
    }
    for i in 32..64 {
        assert!(!check(i), "key {i} kept its own budget");
    }

    // A reset forgets one key only.
    keyed.reset(&api(40), clock.now(), false);
    assert!(check(40), "key 40 after its reset");
    for i in (32..64).filter(|&i| i != 40) {
        assert!(!check(i), "key {i} after another key's reset");
    }
    assert_eq!(keyed.len(), 64);
}
