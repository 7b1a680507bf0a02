//! The compact forms the memory store keeps its keys in ("lanes").
//!
//! A [`Key`] is a 40-byte enum; most of it is room for the largest variant. In the map, each
//! kind of key goes to its own lane, a map whose key type is just large enough for it, so no
//! tag is needed and two different keys never have the same map key:
//!
//! | lane | holds | map key | entry (key + 8-byte state) |
//! |---|---|---|---:|
//! | `v4` | `Ip(V4)`, `Net(V4, len)`, `Global` | `u64`: the address, tag bits above it | 16 B |
//! | `p64` | `Net(V6, 64)` with the low 64 bits zero | `u64`: the upper 64 bits | 16 B |
//! | `v6` | `Ip(V6)` | [`Wide`]: the 128 bits | 24 B |
//! | `v6net` | `Net(V6, len)`, other lengths below 128, host bits clear | [`Wide`]: the prefix bits, then a 1 bit at position `127 - len` | 24 B |
//! | `short` | `Int`, `Str` of at most 15 bytes | [`Wide`]: a length byte and the bytes inline | 24 B |
//! | `long` | `Str` of more than 15 bytes (API keys) | `Box<str>`: the full key | 24 B + the string on the heap |
//! | `full` | tuples, networks with host bits set or a length of 128 or more, and every key of a type other than [`Key`] | the key itself | as before |
//!
//! Every lane keeps the key in full (the long lane on the heap, beside the hash the map
//! keeps): two distinct keys can have equal hashes, never equal map keys, so collisions
//! cannot merge budgets. There is no 128-bit fingerprint whose collision would have to be
//! argued away.
//!
//! Which lane a key goes to depends only on the key, so one key always meets its own state.

use std::any::{Any, TypeId};

use crate::Key;
use std::net::IpAddr;

/// 128 bits kept inline as two words (8-byte alignment, so a 24-byte entry with a `u64`
/// state; a `u128` would align the entry to 16 and make it 32 bytes).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(super) struct Wide(pub(super) u64, pub(super) u64);

/// Tag bits of the `v4` lane (bits 40..48; 32..40 hold a prefix length, 0..32 the address).
const V4_NET: u64 = 1 << 40;
const V4_GLOBAL: u64 = 2 << 40;

/// The length byte of an `Int` in the `short` lane (strings use 0..=15).
const SHORT_INT: u8 = 0xFF;
/// The longest string kept inline in the `short` lane.
pub(super) const SHORT_MAX: usize = 15;

/// Where one key lives, with its compact form (or a borrow of it).
pub(super) enum Lane<'a, K> {
    V4(u64),
    P64(u64),
    V6(Wide),
    V6Net(Wide),
    Short(Wide),
    Long(&'a str),
    Full(&'a K),
}

/// The lane of `key`. Keys of any type other than [`Key`] stay in the `full` lane (the
/// type test is resolved at compile time).
#[inline(always)]
pub(super) fn lane<K: 'static>(key: &K) -> Lane<'_, K> {
    if TypeId::of::<K>() == TypeId::of::<Key>() {
        if let Some(k) = (key as &dyn Any).downcast_ref::<Key>() {
            return of_key(k).unwrap_or(Lane::Full(key));
        }
    }
    Lane::Full(key)
}

/// The compact lane of a [`Key`], or `None` for the `full` lane.
#[inline(always)]
fn of_key<K>(key: &Key) -> Option<Lane<'_, K>> {
    match key {
        Key::Ip(IpAddr::V4(v4)) => Some(Lane::V4(u64::from(v4.to_bits()))),
        _ => of_other(key),
    }
}

fn of_other<K>(key: &Key) -> Option<Lane<'_, K>> {
    Some(match key {
        Key::Global => Lane::V4(V4_GLOBAL),
        Key::Ip(IpAddr::V4(v4)) => Lane::V4(u64::from(v4.to_bits())),
        Key::Net(IpAddr::V4(v4), len) => {
            Lane::V4(V4_NET | u64::from(*len) << 32 | u64::from(v4.to_bits()))
        }
        Key::Ip(IpAddr::V6(v6)) => {
            let bits = v6.to_bits();
            Lane::V6(Wide((bits >> 64) as u64, bits as u64))
        }
        Key::Net(IpAddr::V6(v6), 64) if v6.to_bits() as u64 == 0 => {
            Lane::P64((v6.to_bits() >> 64) as u64)
        }
        Key::Net(IpAddr::V6(v6), len) if *len < 128 => {
            // The prefix bits and a terminating 1 bit just below them: the lowest set bit
            // gives the length back, so the form is one-to-one while the host bits are clear.
            let bits = v6.to_bits();
            let host = u128::MAX.checked_shr(u32::from(*len)).unwrap_or(0);
            if bits & host != 0 {
                return None;
            }
            let form = bits | 1u128 << (127 - len);
            Lane::V6Net(Wide((form >> 64) as u64, form as u64))
        }
        Key::Int(n) => Lane::Short(Wide(u64::from(SHORT_INT), *n)),
        Key::Str(s) if s.len() <= SHORT_MAX => Lane::Short(short_str(s.as_bytes())),
        Key::Str(s) => Lane::Long(s.as_str()),
        _ => return None,
    })
}

/// A string of at most [`SHORT_MAX`] bytes as its length byte and its bytes, little-endian.
fn short_str(bytes: &[u8]) -> Wide {
    let mut buf = [0u8; 16];
    buf[0] = bytes.len() as u8;
    buf[1..=bytes.len()].copy_from_slice(bytes);
    let (lo, hi) = buf.split_at(8);
    let word = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
    Wide(word(lo), word(hi))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    /// The lane name and compact form, for comparisons.
    fn form(key: &Key) -> String {
        match lane(key) {
            Lane::V4(x) => format!("v4 {x:x}"),
            Lane::P64(x) => format!("p64 {x:x}"),
            Lane::V6(w) => format!("v6 {w:?}"),
            Lane::V6Net(w) => format!("v6net {w:?}"),
            Lane::Short(w) => format!("short {w:?}"),
            Lane::Long(s) => format!("long {s}"),
            Lane::Full(k) => format!("full {k:?}"),
        }
    }

    #[test]
    fn distinct_keys_have_distinct_compact_forms() {
        let v4 = Ipv4Addr::new(192, 0, 2, 1);
        let mapped = IpAddr::V6(v4.to_ipv6_mapped());
        let p1: Ipv6Addr = "2001:db8:0:1::".parse().unwrap();
        let p2: Ipv6Addr = "2001:db8:0:2::".parse().unwrap();
        let keys = [
            Key::Global,
            Key::Ip(IpAddr::V4(v4)),
            Key::Ip(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
            Key::Ip(mapped),
            Key::Net(IpAddr::V4(v4), 32),
            Key::Net(IpAddr::V4(v4), 24),
            Key::Net(IpAddr::V6(p1), 64),
            Key::Net(IpAddr::V6(p2), 64),
            Key::Net(IpAddr::V6(p1), 48),
            Key::Net(IpAddr::V6(p1), 47),
            Key::Net(IpAddr::V6("2001:db8::".parse().unwrap()), 32),
            Key::Net(IpAddr::V6("2001:db8::".parse().unwrap()), 33),
            Key::Net(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0),
            Key::Net(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 1),
            Key::Net(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 127),
            Key::Net(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 128),
            Key::Net(IpAddr::V6("2001:db8:0:1:8000::".parse().unwrap()), 65),
            Key::Net(IpAddr::V6(p1), 56),
            Key::Net(IpAddr::V6("2001:db8:0:100::".parse().unwrap()), 56),
            Key::Net(IpAddr::V6("2001:db8:0:100::".parse().unwrap()), 55),
            Key::Net(IpAddr::V6("2001:db8:1::".parse().unwrap()), 48),
            Key::Net(IpAddr::V6("2001:db8:0:1::5".parse().unwrap()), 64),
            Key::Ip(IpAddr::V6(p1)),
            Key::Int(0),
            Key::Int(u64::MAX),
            Key::from(""),
            Key::from("\0"),
            Key::from("a"),
            Key::from("a\0"),
            Key::from("abcdefghijklmno"),
            Key::from("abcdefghijklmnop"),
            Key::from("k_live_0123456789abcdef0123456789ab"),
            Key::tuple([Key::from("a"), Key::Int(1)]),
        ];
        for (i, a) in keys.iter().enumerate() {
            assert_eq!(form(a), form(&a.clone()));
            for b in &keys[i + 1..] {
                assert_ne!(form(a), form(b), "{a:?} and {b:?} share a map key");
            }
        }
        // The HTTP layer's keys take the compact lanes.
        assert!(form(&Key::Ip(IpAddr::V4(v4))).starts_with("v4"));
        assert!(form(&Key::Net(IpAddr::V6(p1), 64)).starts_with("p64"));
        let p56: Ipv6Addr = "2001:db8:0:100::".parse().unwrap();
        let p48: Ipv6Addr = "2001:db8:1::".parse().unwrap();
        assert!(form(&Key::Net(IpAddr::V6(p56), 56)).starts_with("v6net"));
        assert!(form(&Key::Net(IpAddr::V6(p48), 48)).starts_with("v6net"));
        assert_ne!(
            form(&Key::Net(IpAddr::V6(p48), 48)),
            form(&Key::Net(IpAddr::V6(p48), 47))
        );
        // Host bits set: kept whole.
        assert!(form(&Key::Net(IpAddr::V6(p1), 32)).starts_with("full"));
        assert!(form(&Key::from("abcdefghijklmno")).starts_with("short"));
        assert!(form(&Key::from("abcdefghijklmnop")).starts_with("long"));
    }

    #[test]
    fn other_key_types_stay_whole() {
        assert!(matches!(lane(&7u64), Lane::Full(7)));
        let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
        assert!(matches!(lane(&ip), Lane::Full(k) if *k == ip));
    }
}
