//! One normal form for addresses: every comparison (the TCP peer, forwarded entries,
//! trusted-proxy networks, exempt networks) and every IP key goes through [`normalize_ip`]
//! or [`normalize_nets`], so two spellings of one IPv4 client can never be two clients, and
//! a network configured in one spelling matches the other.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// A NAT64 prefix (RFC 6052 §2.2): IPv6 addresses inside it are an IPv4 address as a
/// translator writes it, and are read as that IPv4 address.
///
/// The well-known prefix `64:ff9b::/96` ([`Nat64Prefix::WELL_KNOWN`], RFC 6052 §2.1) is always
/// read this way; configure a network-specific prefix (your translator's pool, or the
/// local-use `64:ff9b:1::/48` of RFC 8215) with [`Nat64Prefix::new`]. Without this, every
/// IPv4 client of an IPv6-only service behind a translator would arrive from inside one /64
/// and share one budget.
///
/// ```
/// use ratekeeper_axum::key::{Nat64Prefix, normalize_ip};
///
/// let nsp = Nat64Prefix::new("2001:db8:64::/96".parse().unwrap()).unwrap();
/// let ip = normalize_ip("2001:db8:64::c000:24d".parse().unwrap(), &[nsp]);
/// assert_eq!(ip.to_string(), "192.0.2.77");
/// // A length RFC 6052 does not define is refused.
/// assert!(Nat64Prefix::new("2001:db8::/80".parse().unwrap()).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Nat64Prefix {
    bits: u128,
    len: u8,
}

/// A prefix that is not a NAT64 prefix: RFC 6052 §2.2 defines the lengths 32, 40, 48, 56, 64
/// and 96 only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "{0} is not a NAT64 prefix: RFC 6052 prefixes are /32, /40, /48, /56, /64 or /96 \
     (the well-known prefix is 64:ff9b::/96)"
)]
pub struct Nat64PrefixError(pub Ipv6Net);

impl Nat64Prefix {
    /// The well-known prefix `64:ff9b::/96` (RFC 6052 §2.1).
    pub const WELL_KNOWN: Self = Self {
        bits: 0x0064_ff9b_u128 << 96,
        len: 96,
    };

    /// A network-specific prefix.
    ///
    /// # Errors
    ///
    /// [`Nat64PrefixError`] when the length is not one RFC 6052 §2.2 defines (32, 40, 48, 56,
    /// 64, 96).
    pub fn new(net: Ipv6Net) -> Result<Self, Nat64PrefixError> {
        let len = net.prefix_len();
        if !matches!(len, 32 | 40 | 48 | 56 | 64 | 96) {
            return Err(Nat64PrefixError(net));
        }
        Ok(Self {
            bits: u128::from(net.trunc().network()),
            len,
        })
    }

    /// The prefix as a network.
    pub fn net(&self) -> Ipv6Net {
        // `len` is one of the lengths `new` accepts, so this cannot fail; fall back to the
        // well-known prefix's shape rather than panic.
        Ipv6Net::new(Ipv6Addr::from(self.bits), self.len)
            .unwrap_or_else(|_| Ipv6Net::from(Ipv6Addr::from(self.bits)))
    }

    fn contains(&self, v6: Ipv6Addr) -> bool {
        let mask = u128::MAX << (128 - u32::from(self.len));
        u128::from(v6) & mask == self.bits
    }

    /// The IPv4 address embedded in `v6` (RFC 6052 §2.2: the 32 bits after the prefix,
    /// skipping bits 64..72, the `u` octet), if `v6` is inside this prefix.
    fn extract(&self, v6: Ipv6Addr) -> Option<Ipv4Addr> {
        if !self.contains(v6) {
            return None;
        }
        let octets = v6.octets();
        let mut v4 = [0u8; 4];
        let mut at = usize::from(self.len / 8);
        for byte in &mut v4 {
            if at == 8 {
                at += 1;
            }
            *byte = *octets.get(at)?;
            at += 1;
        }
        Some(Ipv4Addr::from(v4))
    }
}

/// The normal form of an address: an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`, recognised
/// by range, not by notation) and an address inside the well-known NAT64 prefix or one of
/// `nat64` become the IPv4 address they carry; anything else is returned unchanged.
///
/// Every key extractor that reads addresses, the trusted-proxy check and the exempt networks
/// use this one function.
///
/// ```
/// use ratekeeper_axum::key::normalize_ip;
///
/// for spelling in ["192.0.2.77", "::ffff:192.0.2.77", "64:ff9b::192.0.2.77", "64:ff9b::c000:24d"] {
///     assert_eq!(normalize_ip(spelling.parse().unwrap(), &[]).to_string(), "192.0.2.77");
/// }
/// assert_eq!(normalize_ip("2001:db8::1".parse().unwrap(), &[]).to_string(), "2001:db8::1");
/// ```
pub fn normalize_ip(ip: IpAddr, nat64: &[Nat64Prefix]) -> IpAddr {
    let IpAddr::V6(v6) = ip else { return ip };
    if let Some(v4) = v6.to_ipv4_mapped() {
        return IpAddr::V4(v4);
    }
    std::iter::once(&Nat64Prefix::WELL_KNOWN)
        .chain(nat64)
        .find_map(|p| p.extract(v6))
        .map_or(ip, IpAddr::V4)
}

/// Configured networks in the normal form of [`normalize_ip`], so that a network written in
/// either spelling matches an address in either spelling: a network inside the IPv4-mapped
/// range or a /96 NAT64 prefix (`::ffff:10.0.0.0/104`, `64:ff9b::10.0.0.0/104`) becomes its
/// IPv4 network (`10.0.0.0/8`); a network that holds such a whole range (`::/0`,
/// `64:ff9b::/96`) is kept and also matches every IPv4 address. Host bits are cleared.
pub(crate) fn normalize_nets(
    nets: impl IntoIterator<Item = IpNet>,
    nat64: &[Nat64Prefix],
) -> Vec<IpNet> {
    let mapped = Nat64Prefix {
        bits: 0xffff_u128 << 32,
        len: 96,
    };
    let embeddings: Vec<Nat64Prefix> = std::iter::once(mapped)
        .chain(std::iter::once(Nat64Prefix::WELL_KNOWN))
        .chain(nat64.iter().copied())
        .collect();
    let mut out = Vec::new();
    for net in nets {
        let net = net.trunc();
        let IpNet::V6(v6) = net else {
            out.push(net);
            continue;
        };
        let mut replaced = false;
        for p in &embeddings {
            let whole = p.net();
            if v6.prefix_len() <= whole.prefix_len() && v6.contains(&whole) {
                // Every IPv4 address is inside once normalised.
                out.push(IpNet::V4(Ipv4Net::default()));
            } else if p.len == 96 && whole.contains(&v6) {
                // Inside a /96: the IPv4 network it spells.
                if let (Some(v4), Ok(v4_net)) = (
                    p.extract(v6.network()),
                    Ipv4Net::new(Ipv4Addr::UNSPECIFIED, v6.prefix_len() - 96),
                ) {
                    let v4_net = Ipv4Net::new(v4, v4_net.prefix_len()).map(|n| n.trunc());
                    if let Ok(v4_net) = v4_net {
                        out.push(IpNet::V4(v4_net));
                        replaced = true;
                    }
                }
            }
        }
        if !replaced {
            out.push(net);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn every_rfc6052_length_embeds_the_same_address() {
        // RFC 6052 §2.4, the table of 192.0.2.33 under 2001:db8::/32 ... /96.
        for (prefix, addr) in [
            ("2001:db8::/32", "2001:db8:c000:221::"),
            ("2001:db8:100::/40", "2001:db8:1c0:2:21::"),
            ("2001:db8:122::/48", "2001:db8:122:c000:2:2100::"),
            ("2001:db8:122:300::/56", "2001:db8:122:3c0:0:221::"),
            ("2001:db8:122:344::/64", "2001:db8:122:344:c0:2:2100:0"),
            ("2001:db8:122:344::/96", "2001:db8:122:344::192.0.2.33"),
        ] {
            let p = Nat64Prefix::new(prefix.parse().unwrap()).unwrap();
            assert_eq!(normalize_ip(ip(addr), &[p]), ip("192.0.2.33"), "{prefix}");
            // Without the prefix configured, the address is left alone.
            assert_eq!(normalize_ip(ip(addr), &[]), ip(addr));
        }
    }

    #[test]
    fn networks_in_either_spelling_match_both_spellings() {
        for spelling in ["10.0.0.0/8", "::ffff:10.0.0.0/104", "64:ff9b::a00:0/104"] {
            let nets = normalize_nets([spelling.parse().unwrap()], &[]);
            for client in ["10.1.2.3", "::ffff:10.1.2.3", "64:ff9b::10.1.2.3"] {
                let client = normalize_ip(ip(client), &[]);
                assert!(nets.iter().any(|n| n.contains(&client)), "{spelling}");
            }
            let other = normalize_ip(ip("64:ff9b::11.1.2.3"), &[]);
            assert!(!nets.iter().any(|n| n.contains(&other)), "{spelling}");
        }
        // A network holding the whole mapped or NAT64 range holds every IPv4 client.
        let all = normalize_nets(["::/0".parse().unwrap()], &[]);
        assert!(all.iter().any(|n| n.contains(&ip("192.0.2.1"))));
        assert!(all.iter().any(|n| n.contains(&ip("2001:db8::1"))));
        let nat = normalize_nets(["64:ff9b::/96".parse().unwrap()], &[]);
        assert!(nat.iter().any(|n| n.contains(&ip("192.0.2.1"))));
        // An ordinary IPv6 network is unchanged.
        let v6 = normalize_nets(["2001:db8::/32".parse().unwrap()], &[]);
        assert_eq!(v6, ["2001:db8::/32".parse::<IpNet>().unwrap()]);
    }

    #[test]
    fn other_prefix_lengths_are_refused() {
        for bad in ["2001:db8::/80", "2001:db8::/128", "::/0"] {
            assert!(Nat64Prefix::new(bad.parse().unwrap()).is_err(), "{bad}");
        }
        assert_eq!(
            Nat64Prefix::new("64:ff9b::/96".parse().unwrap()).unwrap(),
            Nat64Prefix::WELL_KNOWN
        );
    }
}
