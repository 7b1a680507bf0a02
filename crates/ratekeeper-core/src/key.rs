//! Keys: who is limited.
//!
//! A [`Key`] is a small value (no allocation for IP addresses, prefixes, integers and
//! strings up to 24 bytes) that hashes fast. Keys of different kinds never collide:
//! `Key::from("192.0.2.1")` and `Key::from(ip)` are different keys.
//!
//! # Example
//!
//! ```
//! use std::net::{IpAddr, Ipv4Addr};
//! use ratekeeper_core::Key;
//!
//! let ip = Key::Ip(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)));
//! assert_eq!(ip.to_string(), "ip:192.0.2.1");
//! assert_ne!(ip, Key::from("192.0.2.1"));
//! assert_eq!(Key::from("alice").to_string(), "alice");
//! assert_eq!(Key::tuple([Key::from("api"), Key::from(7u64)]).to_string(), "(api,7)");
//! ```

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use compact_str::CompactString;

/// A partition key: the identity one budget belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
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
