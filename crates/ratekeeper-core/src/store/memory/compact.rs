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
//! | `ascii` | `Str` of 16 to 32 bytes, ASCII without NUL (API keys) | [`Packed`]: 7 bits per character, 28 bytes | a 4-byte slot number in a table, the form and the state in slabs (`slab`): 36 B + 5 B per bucket |
//! | `long` | other `Str` of more than 15 bytes | `Box<str>`: the full key | 24 B + the string on the heap |
//! | `full` | tuples, networks with host bits set or a length of 128 or more, and every key of a type other than [`Key`] | the key itself | as before |
//!
//! Every lane keeps the key in full (the `ascii` lane in a one-to-one packed form, the long
//! lane on the heap, beside the hash the map keeps): two distinct keys can have equal hashes, never equal map keys, so collisions
//! cannot merge budgets. There is no 128-bit fingerprint whose collision would have to be
//! argued away.
//!
//! Which lane a key goes to depends only on the key, so one key always meets its own state.

use std::any::{Any, TypeId};
use std::hash::{Hash, Hasher};

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

/// The longest string of the `ascii` lane: 32 characters of 7 bits fill [`PACKED_LEN`] bytes.
pub(super) const ASCII_MAX: usize = 32;
/// The bytes of an `ascii` lane form.
pub(super) const PACKED_LEN: usize = 28;

/// An ASCII string of at most [`ASCII_MAX`] bytes without NUL, 7 bits per character
/// (character `i` at bits `7i..7i + 7`, little-endian), then 0 codes to the end.
///
/// One-to-one: the string has no NUL, so its length is one past its last code that is not 0,
/// and every character is its own 7-bit code.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) struct Packed(pub(super) [u8; PACKED_LEN]);

impl Hash for Packed {
    #[inline(always)]
    fn hash<H: Hasher>(&self, state: &mut H) {
        // Three words and the last four bytes (cheaper than the bytes as a slice).
        let (words, tail) = self.0.split_at(24);
        for w in words.chunks_exact(8) {
            state.write_u64(u64::from_le_bytes(w.try_into().unwrap_or([0; 8])));
        }
        state.write_u32(u32::from_le_bytes(tail.try_into().unwrap_or([0; 4])));
    }
}

/// Eight ASCII bytes of a little-endian word as 56 bits: byte `i` at bits `7i..7i + 7`
/// (every byte below 0x80; a swar compaction in three steps: pairs, quads, the whole).
#[inline(always)]
fn pack7(w: u64) -> u64 {
    let w = (w & 0x007F_007F_007F_007F) | (w >> 1 & 0x3F80_3F80_3F80_3F80);
    let w = (w & 0x0000_3FFF_0000_3FFF) | (w >> 2 & 0x0FFF_C000_0FFF_C000);
    (w & 0x0000_0000_0FFF_FFFF) | (w >> 4 & 0x00FF_FFFF_F000_0000)
}

/// The high bit of every byte of a word.
const HIGH: u64 = 0x8080_8080_8080_8080;
/// 1 in every byte of a word.
const ONES: u64 = 0x0101_0101_0101_0101;

/// The [`Packed`] form of `bytes`, or `None` when they are longer than [`ASCII_MAX`] or hold
/// a byte outside 1..=0x7F.
fn pack_ascii(bytes: &[u8]) -> Option<Packed> {
    let len = bytes.len();
    if len > ASCII_MAX {
        return None;
    }
    // The string, then 0x01 bytes: no byte is 0 unless the string has a NUL (the padding's
    // codes are cleared below).
    let mut text = [1u8; ASCII_MAX];
    text.get_mut(..len)?.copy_from_slice(bytes);
    let word = |i: usize| {
        let mut w = [0; 8];
        w.copy_from_slice(&text[8 * i..8 * i + 8]);
        u64::from_le_bytes(w)
    };
    let [a, b, c, d] = [word(0), word(1), word(2), word(3)];
    // A byte of 0x80 or more; with every byte below 0x80, `(w - ONES) & !w` has a high bit
    // set exactly when a byte is 0.
    let nul = |w: u64| w.wrapping_sub(ONES) & !w;
    if (a | b | c | d | nul(a) | nul(b) | nul(c) | nul(d)) & HIGH != 0 {
        return None;
    }
    // Each word's characters in 56 bits, the padding's codes cleared.
    let chars = |i: usize, w: u64| pack7(w) & ((1 << (7 * len.saturating_sub(8 * i).min(8))) - 1);
    let [a, b, c, d] = [chars(0, a), chars(1, b), chars(2, c), chars(3, d)];
    // The four 56-bit words one after the other.
    let mut form = [0u8; PACKED_LEN];
    let (head, tail) = form.split_at_mut(24);
    for (out, w) in head
        .chunks_exact_mut(8)
        .zip([a | b << 56, b >> 8 | c << 48, c >> 16 | d << 40])
    {
        out.copy_from_slice(&w.to_le_bytes());
    }
    tail.copy_from_slice(&((d >> 24) as u32).to_le_bytes());
    Some(Packed(form))
}

/// Where one key lives, with its compact form (or a borrow of it).
pub(super) enum Lane<'a, K> {
    V4(u64),
    P64(u64),
    V6(Wide),
    V6Net(Wide),
    Short(Wide),
    Ascii(Packed),
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
        Key::Str(s) => match pack_ascii(s.as_bytes()) {
            Some(packed) => Lane::Ascii(packed),
            None => Lane::Long(s.as_str()),
        },
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
            Lane::Ascii(p) => format!("ascii {p:?}"),
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
            Key::from("rk_live_000000000000000000000000"),
            Key::from("rk_live_000000000000000000000001"),
            Key::from("rk_live_00000000000000000000000"),
            Key::from("rk_live_0000000000000000000000000"),
            Key::from("rk_live_00000000000000000000000\u{7f}"),
            Key::from("rk_live_00000000000000000000000\u{1}"),
            Key::from("rk_live_00000000000000000000000\0"),
            Key::from("rk_live_0000000000000000000000é"),
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
        assert!(form(&Key::from("abcdefghijklmnop")).starts_with("ascii"));
        assert!(form(&Key::from("rk_live_000000000000000000000000")).starts_with("ascii"));
        // Over 32 bytes, a NUL, a byte above 0x7F: the full string.
        assert!(form(&Key::from("k_live_0123456789abcdef0123456789ab")).starts_with("long"));
        assert!(form(&Key::from("rk_live_00000000000000000000000\0")).starts_with("long"));
        assert!(form(&Key::from("rk_live_0000000000000000000000é")).starts_with("long"));
    }

    /// The string back from its [`Packed`] form: 32 codes of 7 bits, the 0 codes at the end
    /// dropped.
    fn unpack(p: &Packed) -> String {
        let mut bits = [0u8; 32];
        bits[..PACKED_LEN].copy_from_slice(&p.0);
        let words: Vec<u128> = [0usize, 16]
            .iter()
            .map(|&at| u128::from_le_bytes(bits[at..at + 16].try_into().unwrap()))
            .collect();
        let code = |i: usize| {
            let bit = 7 * i;
            let (word, at) = (bit / 128, bit % 128);
            let mut c = words[word] >> at;
            if at > 121 {
                c |= words[word + 1] << (128 - at);
            }
            (c & 0x7F) as u8
        };
        let mut text: Vec<u8> = (0..ASCII_MAX).map(code).collect();
        while text.last() == Some(&0) {
            text.pop();
        }
        String::from_utf8(text).unwrap()
    }

    #[test]
    fn the_packed_form_gives_the_string_back() {
        for s in [
            "abcdefghijklmnop",
            "rk_live_000000000000000000000000",
            "\u{7f}\u{1}~ ABCDEFGHIJKLMNOPQRSTUVWXYZ_-",
            "0123456789abcdef0123456789abcde",
        ] {
            let p = pack_ascii(s.as_bytes()).unwrap();
            assert_eq!(unpack(&p), s);
        }
        assert!(pack_ascii(&[b'a'; 33]).is_none());
        assert!(pack_ascii(&[0x80; 16]).is_none());
        assert!(pack_ascii(&[0; 16]).is_none());
        // A NUL or a high byte at any position, the last one included.
        for at in 0..32 {
            for bad in [0u8, 0x80, 0xFF] {
                let mut text = [b'1'; 32];
                text[at] = bad;
                assert!(pack_ascii(&text).is_none(), "{bad:#x} at {at}");
                assert!(
                    pack_ascii(&text[..=at]).is_none(),
                    "{bad:#x} at the end, {at}"
                );
            }
            // 0x01 after a NUL-free prefix is fine (no borrow from a 0 byte before it).
            let mut text = [b'1'; 32];
            text[at] = 1;
            assert_eq!(unpack(&pack_ascii(&text).unwrap()).as_bytes(), &text);
        }
    }

    proptest::proptest! {
        /// Any ASCII string of 16 to 32 bytes without NUL: packed one-to-one, and in the
        /// `ascii` lane.
        #[test]
        fn ascii_strings_pack_one_to_one(s in "[\\x01-\\x7f]{16,32}", t in "[\\x01-\\x7f]{16,32}") {
            let (p, q) = (pack_ascii(s.as_bytes()).unwrap(), pack_ascii(t.as_bytes()).unwrap());
            proptest::prop_assert_eq!(unpack(&p), s.clone());
            proptest::prop_assert_eq!(p == q, s == t);
            let key = Key::from(s.as_str());
            proptest::prop_assert!(matches!(lane(&key), Lane::Ascii(f) if f == p));
        }

        /// Any bytes: packed exactly when at most 32 of them, each in 1..=0x7F, and then
        /// given back.
        #[test]
        fn only_nul_free_ascii_packs(bytes in proptest::collection::vec(0u8..=0xFF, 0..40)) {
            let ascii = bytes.len() <= ASCII_MAX && bytes.iter().all(|&b| (1..0x80).contains(&b));
            let packed = pack_ascii(&bytes);
            proptest::prop_assert_eq!(packed.is_some(), ascii);
            if let Some(p) = packed {
                let back = unpack(&p);
                proptest::prop_assert_eq!(back.as_bytes(), &bytes[..]);
            }
        }
    }

    #[test]
    fn other_key_types_stay_whole() {
        assert!(matches!(lane(&7u64), Lane::Full(7)));
        let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
        assert!(matches!(lane(&ip), Lane::Full(k) if *k == ip));
    }
}
