//! Reading environment variables: an empty value counts as unset, and each value is parsed
//! as the reference reads it.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use super::SettingsError;
use super::values::{parse_bool, parse_host};

/// Looks variables up; an empty value counts as unset.
pub(super) struct Env<F> {
    pub(super) get: F,
}

impl<F: Fn(&str) -> Option<String>> Env<F> {
    /// The variable's value; empty counts as unset.
    pub(super) fn var(&self, name: &str) -> Option<String> {
        (self.get)(name).filter(|v| !v.is_empty())
    }

    pub(super) fn bool(&self, name: &'static str, default: bool) -> Result<bool, SettingsError> {
        match self.var(name) {
            None => Ok(default),
            Some(v) => parse_bool(&v).ok_or(SettingsError::InvalidEnv {
                name,
                value: v,
                expected: "a boolean (true/false, 1/0, t/f)",
            }),
        }
    }

    pub(super) fn string(&self, name: &'static str, default: &str) -> String {
        self.var(name).unwrap_or_else(|| default.to_owned())
    }

    pub(super) fn port(&self, name: &'static str, default: u16) -> Result<u16, SettingsError> {
        match self.var(name) {
            None => Ok(default),
            Some(v) => v.trim().parse().map_err(|_| SettingsError::InvalidEnv {
                name,
                value: v,
                expected: "a port number (0-65535)",
            }),
        }
    }

    pub(super) fn host_port(
        &self,
        host: &'static str,
        port: &'static str,
        default_port: u16,
    ) -> Result<SocketAddr, SettingsError> {
        let ip = match self.var(host) {
            None => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            Some(v) => parse_host(&v).ok_or(SettingsError::InvalidEnv {
                name: host,
                value: v,
                expected: "an IP address, `::`, `0.0.0.0` or `localhost`",
            })?,
        };
        Ok(SocketAddr::new(ip, self.port(port, default_port)?))
    }
}
