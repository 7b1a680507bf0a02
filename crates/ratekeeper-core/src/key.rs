//! [`Key`]: who is limited.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::net::IpAddr;
use std::sync::Arc;

use compact_str::CompactString;

/// A partition key: the identity one budget belongs to.
///
/// A `Key` is a small value (no allocation for IP addresses, prefixes, integers and
/// strings up to 24 bytes) that hashes fast. Keys of different kinds never collide:
/// `Key::from("192.0.2.1")` and `Key::from(ip)` are different keys.
///
/// `Hash` is written by hand so that the common keys (an IPv4 address, an integer, global)
/// feed the hasher one or two words instead of a chain of enum discriminants, which keeps
/// memory-store checks cheap. It agrees with the derived `Eq`: equal keys write the same
/// words.
///
/// # Example
///
/// ```
/// use std::net::{IpAddr, Ipv4Addr};
/// use ratekeeper_core::Key;
///
/// let ip = Key::Ip(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)));
/// assert_eq!(ip.to_string(), "ip:192.0.2.1");
/// assert_ne!(ip, Key::from("192.0.2.1"));
/// assert_eq!(Key::from("alice").to_string(), "alice");
/// assert_eq!(Key::tuple([Key::from("api"), Key::from(7u64)]).to_string(), "(api,7)");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Key {
    /// One budget for everyone.
    Global,
    /// A single IP address.
    Ip(IpAddr),
    /// A network: the address with host bits cleared, and the prefix length.
    Net(IpAddr, u8),
    /// An integer id.
    Int(u64),
    /// A string id (API key, user name). Stored inline up to 24 bytes.
    Str(CompactString),
    /// Several keys together, e.g. (user, route).
    Tuple(Arc<[Key]>),
}

impl Key {
    /// A tuple key.
    pub fn tuple(parts: impl IntoIterator<Item = Key>) -> Self {
        Key::Tuple(parts.into_iter().collect())
    }
}

/// Variant tags of the hash words (bits 48..56; bits 40..48 hold the IP family, 32..40 a
/// prefix length, 0..32 an IPv4 address).
const TAG_GLOBAL: u64 = 1 << 48;
const TAG_IP: u64 = 2 << 48;
const TAG_NET: u64 = 3 << 48;
const TAG_INT: u64 = 4 << 48;
const TAG_STR: u64 = 5 << 48;
const TAG_TUPLE: u64 = 6 << 48;

#[inline]
fn hash_ip<H: Hasher>(tag: u64, ip: &IpAddr, prefix_len: u8, state: &mut H) {
    let head = tag | u64::from(prefix_len) << 32;
    match ip {
        IpAddr::V4(v4) => state.write_u64(head | 4 << 40 | u64::from(v4.to_bits())),
        IpAddr::V6(v6) => {
            state.write_u64(head | 6 << 40);
            state.write_u128(v6.to_bits());
        }
    }
}

impl Hash for Key {
    #[inline]
    fn hash<H: Hasher>(&self, state: &mut H) {
        // The per-IP key of the HTTP layer inlines into the map lookup; the rest is a call.
        if let Key::Ip(IpAddr::V4(v4)) = self {
            state.write_u64(TAG_IP | 4 << 40 | u64::from(v4.to_bits()));
        } else {
            self.hash_other(state);
        }
    }
}

impl Key {
    fn hash_other<H: Hasher>(&self, state: &mut H) {
        match self {
            Key::Global => state.write_u64(TAG_GLOBAL),
            Key::Ip(ip) => hash_ip(TAG_IP, ip, 0, state),
            Key::Net(ip, len) => hash_ip(TAG_NET, ip, *len, state),
            Key::Int(n) => {
                state.write_u64(TAG_INT);
                state.write_u64(*n);
            }
            Key::Str(s) => {
                state.write_u64(TAG_STR);
                s.as_str().hash(state);
            }
            Key::Tuple(parts) => {
                state.write_u64(TAG_TUPLE);
                parts.hash(state);
            }
        }
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Key::Global => f.write_str("global"),
            Key::Ip(ip) => write!(f, "ip:{ip}"),
            Key::Net(ip, len) => write!(f, "net:{ip}/{len}"),
            Key::Int(n) => write!(f, "{n}"),
            Key::Str(s) => f.write_str(s),
            Key::Tuple(parts) => {
                f.write_str("(")?;
                for (i, p) in parts.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    fmt::Display::fmt(p, f)?;
                }
                f.write_str(")")
            }
        }
    }
}

impl From<IpAddr> for Key {
    fn from(ip: IpAddr) -> Self {
        Key::Ip(ip)
    }
}

impl From<u64> for Key {
    fn from(n: u64) -> Self {
        Key::Int(n)
    }
}

impl From<&str> for Key {
    fn from(s: &str) -> Self {
        Key::Str(CompactString::new(s))
    }
}

impl From<String> for Key {
    fn from(s: String) -> Self {
        Key::Str(CompactString::from(s))
    }
}

impl From<CompactString> for Key {
    fn from(s: CompactString) -> Self {
        Key::Str(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn h(k: &Key) -> u64 {
        BuildHasherDefault::<DefaultHasher>::default().hash_one(k)
    }

    #[test]
    fn hash_agrees_with_eq_and_keeps_kinds_apart() {
        let v4 = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1));
        let v6 = IpAddr::V6(Ipv6Addr::LOCALHOST);
        let keys = [
            Key::Global,
            Key::Ip(v4),
            Key::Ip(v6),
            Key::Net(v4, 32),
            Key::Net(v4, 24),
            Key::Net(v6, 128),
            Key::Int(0),
            Key::Int(0xC000_0201),
            Key::from("192.0.2.1"),
            Key::from(""),
            Key::tuple([Key::from("a"), Key::Int(1)]),
            Key::tuple([Key::Int(1), Key::from("a")]),
        ];
        for (i, a) in keys.iter().enumerate() {
            assert_eq!(h(a), h(&a.clone()), "{a}");
            for b in &keys[i + 1..] {
                assert_ne!(a, b);
                assert_ne!(h(a), h(b), "{a} and {b}");
            }
        }
    }
}
