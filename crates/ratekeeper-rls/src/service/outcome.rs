//! What one descriptor's check found: the rule that applied and the status, shared by the
//! decision and the response built from it.

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    DescriptorStatus, RateLimit,
};

use crate::config::{Algorithm, OnStoreFailure, Unit};

/// The rule that applies to one descriptor, with what its status and stats need.
pub(super) struct Applied<'a> {
    pub(super) requests_per_unit: u32,
    pub(super) unit: Unit,
    /// The window in seconds (the unit's length unless the rule gives a `period`).
    pub(super) period_secs: u64,
    pub(super) algorithm: Algorithm,
    /// The rule's `on_store_failure`, if it has one.
    pub(super) on_failure: Option<OnStoreFailure>,
    pub(super) name: Option<&'a str>,
    pub(super) unlimited: bool,
    pub(super) shadow: bool,
    pub(super) quota: bool,
    pub(super) replaces: &'a [String],
    pub(super) metadata: Option<&'a serde_json::Map<String, serde_json::Value>>,
    /// The counter's identity in clear (hashed before it reaches the store).
    pub(super) counter: String,
    pub(super) key1: String,
    pub(super) key2: String,
}

impl Applied<'_> {
    pub(super) fn current_limit(&self) -> RateLimit {
        RateLimit {
            name: self.name.unwrap_or_default().to_owned(),
            requests_per_unit: self.requests_per_unit,
            unit: self.unit.to_proto() as i32,
        }
    }
}

/// What one descriptor's check found.
pub(super) struct Outcome<'a> {
    pub(super) status: DescriptorStatus,
    pub(super) rule: Option<Applied<'a>>,
    pub(super) unlimited: bool,
}
