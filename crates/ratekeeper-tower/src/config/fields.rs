//! The checked field types of a configuration document: header names, networks, route
//! templates and methods, each read with an error that names the value and what is expected.

use std::fmt;

use http::{HeaderName, Method};
use ipnet::IpNet;
use serde::{Deserialize, Deserializer};

/// A header name, checked when it is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderField(pub HeaderName);

impl<'de> Deserialize<'de> for HeaderField {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        HeaderName::from_bytes(s.as_bytes())
            .map(HeaderField)
            .map_err(|_| serde::de::Error::custom(format!("\"{s}\" is not a valid header name")))
    }
}

/// A list of networks, each named in its error: `"192.0.2.1"` (no prefix length) or
/// `"10.0.0.0/33"` say what they are and what is expected.
pub(super) fn networks<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<IpNet>, D::Error> {
    struct Net(IpNet);
    struct NetVisitor;
    impl serde::de::Visitor<'_> for NetVisitor {
        type Value = Net;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a network such as \"192.0.2.0/24\"")
        }
        // Parsed inside the format's deserializer, so the error carries the element's place.
        fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Net, E> {
            s.parse().map(Net).map_err(|_| {
                E::custom(format!(
                    "invalid network {s:?}: expected an address and a prefix length, such as \
                     \"192.0.2.0/24\", \"2001:db8::/32\" or \"192.0.2.7/32\" for one address"
                ))
            })
        }
    }
    impl<'de> Deserialize<'de> for Net {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            deserializer.deserialize_str(NetVisitor)
        }
    }
    Ok(Vec::<Net>::deserialize(deserializer)?
        .into_iter()
        .map(|n| n.0)
        .collect())
}

/// A route template, checked when it is read (see
/// [`route::check_template`](crate::route::check_template)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutePath(pub String);

impl<'de> Deserialize<'de> for RoutePath {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        crate::route::check_template(&s).map_err(serde::de::Error::custom)?;
        Ok(RoutePath(s))
    }
}

/// An HTTP method, checked when it is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MethodField(pub Method);

impl<'de> Deserialize<'de> for MethodField {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        Method::from_bytes(s.to_ascii_uppercase().as_bytes())
            .map(MethodField)
            .map_err(|_| serde::de::Error::custom(format!("\"{s}\" is not an HTTP method")))
    }
}
