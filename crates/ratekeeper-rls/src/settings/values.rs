//! Parsers for setting values, as the reference (Go, `envconfig`) reads them.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

/// Go's `strconv.ParseBool`: `1 t T TRUE true True` and `0 f F FALSE false False`.
pub(crate) fn parse_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Go's `time.ParseDuration`: a sequence of decimal numbers with units (`ns us µs ms s m h`),
/// such as `10s`, `1.5h`, `1m30s`, `250ms`; `0` alone needs no unit. Negative durations are
/// refused (no setting takes one).
pub(crate) fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.strip_prefix('+').unwrap_or(s);
    if s == "0" {
        return Some(Duration::ZERO);
    }
    if s.is_empty() || s.starts_with('-') {
        return None;
    }
    let mut rest = s;
    let mut total_ns: f64 = 0.0;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (num, tail) = rest.split_at(num_len);
        if num.is_empty() || num == "." {
            return None;
        }
        let value: f64 = num.parse().ok()?;
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let scale = match unit {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return None,
        };
        total_ns += value * scale;
        rest = tail;
    }
    // Go's limit: about 290 years.
    if !total_ns.is_finite() || total_ns > 9.2e18 {
        return None;
    }
    // Truncation to whole nanoseconds, as Go does.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Some(Duration::from_nanos(total_ns as u64))
}

/// A host as the reference's `HOST` / `GRPC_HOST` / `DEBUG_HOST`: an IP address (`::` for
/// every IPv6 and IPv4 address, `0.0.0.0` for every IPv4 one), `localhost`, or empty (every
/// address, as Go's `net.Listen(":port")`).
pub(crate) fn parse_host(s: &str) -> Option<IpAddr> {
    let s = s.trim();
    let s = s
        .strip_prefix('[')
        .and_then(|x| x.strip_suffix(']'))
        .unwrap_or(s);
    match s {
        "" => Some(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
        "localhost" => Some(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        "ip6-localhost" => Some(IpAddr::V6(Ipv6Addr::LOCALHOST)),
        _ => s.parse().ok(),
    }
}

/// A listen address: `host:port`, `[v6]:port`, `:port` (every address) or a bare port.
pub(crate) fn parse_addr(s: &str) -> Option<SocketAddr> {
    let s = s.trim();
    if let Ok(port) = s.parse::<u16>() {
        return Some(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port));
    }
    if let Ok(addr) = s.parse::<SocketAddr>() {
        return Some(addr);
    }
    let (host, port) = s.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    Some(SocketAddr::new(parse_host(host)?, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bools_read_as_go_parse_bool() {
        for t in ["1", "t", "T", "TRUE", "true", "True"] {
            assert_eq!(parse_bool(t), Some(true), "{t}");
        }
        for f in ["0", "f", "F", "FALSE", "false", "False"] {
            assert_eq!(parse_bool(f), Some(false), "{f}");
        }
        for bad in ["yes", "on", "tRuE", "", " true", "2"] {
            assert_eq!(parse_bool(bad), None, "{bad}");
        }
    }

    #[test]
    fn durations_read_as_go_parse_duration() {
        assert_eq!(parse_duration("10s"), Some(Duration::from_secs(10)));
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_duration("1.5h"), Some(Duration::from_secs(5400)));
        assert_eq!(parse_duration("0"), Some(Duration::ZERO));
        assert_eq!(parse_duration("2us"), Some(Duration::from_micros(2)));
        for bad in ["10", "", "s", "-1s", "1x", "1.s.", "ms"] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
    }

    #[test]
    fn addresses_take_go_forms() {
        assert_eq!(parse_addr(":9090"), "0.0.0.0:9090".parse().ok());
        assert_eq!(parse_addr("8081"), "0.0.0.0:8081".parse().ok());
        assert_eq!(parse_addr("[::]:8081"), "[::]:8081".parse().ok());
        assert_eq!(parse_addr("127.0.0.1:1"), "127.0.0.1:1".parse().ok());
        assert_eq!(parse_addr("localhost:80"), "127.0.0.1:80".parse().ok());
        assert_eq!(parse_addr("example.com:80"), None);
        assert_eq!(parse_addr(":99999"), None);
        assert_eq!(parse_host("::"), Some(IpAddr::V6(Ipv6Addr::UNSPECIFIED)));
    }
}
