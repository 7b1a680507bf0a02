//! One `ShouldRateLimit` call: rules, replaces, charges, statuses, overall code.

use std::collections::HashSet;
use std::num::NonZeroU32;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use futures_util::future::join_all;
use ratekeeper_core::Decision;
use ratekeeper_core::store::{FailurePolicy, StoreError};

use super::outcome::{Applied, Outcome};
use super::{Shared, response};
use crate::config::{Algorithm, Charging, Lookup, OnStoreFailure, Unit};
use crate::limiter::{Hit, counter_key, reset_secs, until_reset};
use crate::stats::hit_counts;

/// Why a call is answered with a gRPC error instead of a response.
///
/// `Display` is the message sent in the gRPC status (the reference's texts for the first
/// three). None of them carries a descriptor value.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServiceError {
    /// The request's `domain` is empty (gRPC `INVALID_ARGUMENT`).
    #[error("rate limit domain must not be empty")]
    EmptyDomain,
    /// The request has no descriptor (gRPC `INVALID_ARGUMENT`).
    #[error("rate limit descriptor list must not be empty")]
    NoDescriptors,
    /// No config has loaded yet (gRPC `UNAVAILABLE`).
    #[error("no rate limit configuration loaded")]
    NoConfig,
    /// The store could not decide and its failure policy lets Envoy decide (gRPC
    /// `UNAVAILABLE`; Envoy's `failure_mode_deny` then allows or refuses).
    #[error("the store could not decide: {0}")]
    Store(#[source] StoreError),
}

impl ServiceError {
    /// The `err_type` label of `ratelimit_service_should_rate_limit_error`: `redis_error`
    /// for a store that was unreachable or too slow, `service_error` otherwise.
    pub fn err_type(&self) -> &'static str {
        match self {
            Self::Store(e) if e.is_unavailable() => "redis_error",
            _ => "service_error",
        }
    }

    /// The gRPC status sent for this error.
    pub fn into_status(self) -> tonic::Status {
        let message = self.to_string();
        match self {
            Self::EmptyDomain | Self::NoDescriptors => tonic::Status::invalid_argument(message),
            Self::NoConfig | Self::Store(_) => tonic::Status::unavailable(message),
        }
    }
}

fn push_len_prefixed(out: &mut String, s: &str) {
    out.push_str(&s.len().to_string());
    out.push(':');
    out.push_str(s);
}

/// The rule of a descriptor that carries Envoy's `RateLimitOverride`: used as given, with no
/// shadow or quota mode of its own; its counter is the one a config rule for the same
/// entries uses; its stats labels hold the entries' keys, never their values.
fn override_rule<'a>(
    domain: &str,
    d: &'a RateLimitDescriptor,
    entries: &[(&str, &str)],
) -> Option<Applied<'a>> {
    let o = d.limit.as_ref()?;
    let unit = Unit::from_proto_i32(o.unit)?;
    let mut counter = String::new();
    push_len_prefixed(&mut counter, domain);
    for (k, v) in entries {
        push_len_prefixed(&mut counter, k);
        push_len_prefixed(&mut counter, v);
    }
    let mut keys = entries.iter().map(|(k, _)| (*k).to_owned());
    Some(Applied {
        requests_per_unit: o.requests_per_unit,
        unit,
        period_secs: unit.seconds(),
        algorithm: Algorithm::FixedWindow,
        on_failure: None,
        name: None,
        unlimited: false,
        shadow: false,
        quota: false,
        replaces: &[],
        metadata: None,
        counter,
        key1: keys.next().unwrap_or_default(),
        key2: keys.next().unwrap_or_default(),
    })
}

fn duration(secs: u64) -> PbDuration {
    PbDuration {
        seconds: i64::try_from(secs).unwrap_or(i64::MAX),
        nanos: 0,
    }
}

/// The hits of descriptor `d`: its own `hits_addend` as given (0 included), else the
/// request's, where 0 counts as 1.
fn hits_of(d: &RateLimitDescriptor, request_hits: u32) -> u64 {
    d.hits_addend
        .as_ref()
        .map_or_else(|| u64::from(request_hits.max(1)), |h| h.value)
}

pub(super) async fn decide(
    shared: &Shared,
    request: &RateLimitRequest,
) -> Result<RateLimitResponse, ServiceError> {
    if request.domain.is_empty() {
        return Err(ServiceError::EmptyDomain);
    }
    if request.descriptors.is_empty() {
        return Err(ServiceError::NoDescriptors);
    }
    let Some(config) = shared.config.load_full() else {
        return Err(ServiceError::NoConfig);
    };
    let domain = request.domain.as_str();
    let entries: Vec<Vec<(&str, &str)>> = request
        .descriptors
        .iter()
        .map(|d| {
            d.entries
                .iter()
                .map(|e| (e.key.as_str(), e.value.as_str()))
                .collect()
        })
        .collect();

    // 1. The rule of each descriptor.
    let has_override = request.descriptors.iter().any(|d| d.limit.is_some());
    let known_domain = has_override && config.domains().any(|d| d == domain);
    let mut rules: Vec<Option<Applied<'_>>> = Vec::with_capacity(entries.len());
    for (d, e) in request.descriptors.iter().zip(&entries) {
        let rule = if d.limit.is_some() {
            if known_domain {
                override_rule(domain, d, e)
            } else {
                shared.stats.domain_not_found(domain);
                None
            }
        } else {
            match config.lookup(domain, e) {
                Lookup::DomainNotFound => {
                    shared.stats.domain_not_found(domain);
                    None
                }
                Lookup::NoLimit => None,
                Lookup::Limit(m) => {
                    let (key1, key2) = m.metric_keys();
                    Some(Applied {
                        requests_per_unit: m.rule.requests_per_unit,
                        unit: m.rule.unit,
                        period_secs: m.rule.period_secs(),
                        algorithm: m.rule.algorithm,
                        on_failure: m.rule.on_store_failure,
                        name: m.rule.name.as_deref(),
                        unlimited: m.rule.unlimited,
                        shadow: m.rule.shadow_mode,
                        quota: m.rule.quota_mode,
                        replaces: &m.rule.replaces,
                        metadata: m.rule.metadata.as_ref(),
                        counter: m.counter_key(),
                        key1,
                        key2: key2.unwrap_or_default(),
                    })
                }
            }
        };
        rules.push(rule);
    }

    // 2. Replaces: the names every matched rule (unlimited ones included) replaces.
    let replaced: HashSet<&str> = rules
        .iter()
        .flatten()
        .flat_map(|r| r.replaces.iter().map(String::as_str))
        .collect();
    for slot in &mut rules {
        if slot
            .as_ref()
            .is_some_and(|r| !r.unlimited && r.name.is_some_and(|n| replaced.contains(n)))
        {
            *slot = None;
        }
    }

    // 3-5. Charges: unlimited and zero limits never reach the store.
    let now = shared.limiter.unix_now();
    let hits: Vec<u64> = request
        .descriptors
        .iter()
        .map(|d| hits_of(d, request.hits_addend))
        .collect();
    let to_charge: Vec<Option<Hit>> = rules
        .iter()
        .zip(&hits)
        .map(|(rule, &cost)| {
            let rule = rule.as_ref().filter(|r| !r.unlimited)?;
            Some(Hit {
                limit: NonZeroU32::new(rule.requests_per_unit)?,
                period_secs: rule.period_secs,
                algorithm: rule.algorithm,
                on_failure: rule.on_failure.unwrap_or(shared.options.on_store_failure),
                key: counter_key(&shared.options.cache_key_prefix, domain, &rule.counter),
                cost,
            })
        })
        .collect();
    let all_or_nothing = shared.options.stop_increment_when_over_limit
        || config.charging(domain) == Charging::AllOrNothing;
    let (charged, batch_refused) = if all_or_nothing {
        charge_all_or_nothing(shared, &rules, &hits, &to_charge).await?
    } else {
        let each = to_charge.iter().map(|hit| async move {
            match hit {
                None => Charged::NotSent,
                Some(hit) => match shared.limiter.charge(hit).await {
                    Ok(d) => Charged::Decided(d),
                    Err(e) => on_failure(hit, e),
                },
            }
        });
        (join_all(each).await, false)
    };
    // A store that failed closed: the call is answered (refused), and counted once as the
    // reference counts a store failure.
    if charged
        .iter()
        .any(|c| matches!(c, Charged::Refused | Charged::Open))
    {
        crate::stats::should_rate_limit_error("redis_error");
    }

    let mut outcomes = Vec::with_capacity(rules.len());
    for ((rule, charged), &cost) in rules.into_iter().zip(charged).zip(&hits) {
        let outcome = match rule {
            None => Outcome {
                status: status(Code::Ok, None, 0, None),
                rule: None,
                unlimited: false,
            },
            Some(rule) if rule.unlimited => Outcome {
                status: status(Code::Ok, None, u32::MAX, None),
                rule: Some(rule),
                unlimited: true,
            },
            Some(rule) => {
                // From the store's decision (its clock: Redis `TIME` on Redis); without
                // one, from the window that holds `now`.
                let reset = duration(match &charged {
                    Charged::Decided(d) => reset_secs(d, rule.period_secs),
                    _ => until_reset(now, rule.period_secs),
                });
                // (over, remaining, units held before the charge)
                let (over, remaining, before) = match charged {
                    // `requests_per_unit: 0`: every request is over, nothing is counted.
                    Charged::NotSent => (true, 0, 0),
                    Charged::Decided(d) => {
                        let limit = u64::from(d.limit());
                        let remaining = d.remaining();
                        let held = limit.saturating_sub(u64::from(remaining));
                        // A check (0 hits) of a full counter is over, and so is a descriptor
                        // whose hits do not fit what is left (all-or-nothing reports).
                        let over = !d.is_allowed()
                            || (cost == 0 && remaining == 0)
                            || (batch_refused && cost > u64::from(remaining));
                        if over {
                            (true, 0, held)
                        } else {
                            (false, remaining, held.saturating_sub(cost))
                        }
                    }
                    Charged::Refused => (true, 0, u64::from(rule.requests_per_unit)),
                    // Failed open: allowed without a limit, not counted.
                    Charged::Open => {
                        outcomes.push(Outcome {
                            status: status(Code::Ok, None, 0, None),
                            rule: Some(rule),
                            unlimited: false,
                        });
                        continue;
                    }
                    Charged::Failed(e) => return Err(ServiceError::Store(e)),
                };
                let counts = hit_counts(
                    rule.requests_per_unit,
                    before,
                    cost,
                    over,
                    rule.shadow,
                    shared.options.near_limit_ratio,
                );
                shared
                    .stats
                    .record_hits(domain, &rule.key1, &rule.key2, counts);
                let code = if over && !rule.shadow {
                    Code::OverLimit
                } else {
                    Code::Ok
                };
                Outcome {
                    status: status(code, Some(rule.current_limit()), remaining, Some(reset)),
                    rule: Some(rule),
                    unlimited: false,
                }
            }
        };
        outcomes.push(outcome);
    }
    Ok(response::build(shared, request, outcomes, now))
}

/// What the store said about one descriptor.
enum Charged {
    /// Not sent: no rule, an unlimited rule, or a limit of 0.
    NotSent,
    /// The store's decision.
    Decided(Decision),
    /// The store failed and its failure policy refuses (fail closed).
    Refused,
    /// The store failed and the limit's `on_store_failure` is `allow` (fail open).
    Open,
    /// The store failed; Envoy decides (`failure_mode_deny`).
    Failed(StoreError),
}

/// A store failure for one hit: refused when the store fails closed or the limit's
/// `on_store_failure` is `deny`, open for `allow`, else the call's error (`UNAVAILABLE`).
fn on_failure(hit: &Hit, e: StoreError) -> Charged {
    if e.failure_policy() == FailurePolicy::Deny {
        return Charged::Refused;
    }
    match hit.on_failure {
        OnStoreFailure::Deny => Charged::Refused,
        OnStoreFailure::Allow => Charged::Open,
        _ => Charged::Failed(e),
    }
}

/// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`: every descriptor of the request in one
/// all-or-nothing store call, so that a refused request charges none of its counters. A
/// zero limit hit by the request refuses it without the store: the others are read, not
/// charged. Returns each descriptor's answer and whether the request was refused.
async fn charge_all_or_nothing(
    shared: &Shared,
    rules: &[Option<Applied<'_>>],
    hits: &[u64],
    to_charge: &[Option<Hit>],
) -> Result<(Vec<Charged>, bool), ServiceError> {
    let zero_refuses = rules.iter().zip(hits).any(|(r, &cost)| {
        r.as_ref()
            .is_some_and(|r| !r.unlimited && r.requests_per_unit == 0 && cost > 0)
    });
    let mut batch: Vec<Hit> = to_charge.iter().flatten().cloned().collect();
    if zero_refuses {
        for h in &mut batch {
            h.cost = 0;
        }
    }
    // Through the fail-soft handle only when every limit of the request fails soft.
    let soft = !batch.is_empty()
        && batch
            .iter()
            .all(|h| h.on_failure == OnStoreFailure::FailSoft);
    let decided = if batch.is_empty() {
        Ok(Vec::new())
    } else {
        shared.limiter.charge_all(&batch, soft).await
    };
    match decided {
        Ok(decisions) => {
            let refused = zero_refuses || decisions.iter().any(|d| !d.is_allowed());
            let mut it = decisions.into_iter();
            let charged = to_charge
                .iter()
                .map(|h| match (h, h.as_ref().and_then(|_| it.next())) {
                    (Some(_), Some(d)) => Charged::Decided(d),
                    _ => Charged::NotSent,
                })
                .collect();
            Ok((charged, refused))
        }
        // Each limit answers as its `on_store_failure` says, unless one of them leaves the
        // call to Envoy (`unavailable`, or `fail_soft` mixed with other policies).
        Err(e) => {
            let closed = e.failure_policy() == FailurePolicy::Deny;
            let mut charged = Vec::with_capacity(to_charge.len());
            for h in to_charge {
                charged.push(match h {
                    None => Charged::NotSent,
                    Some(_) if closed => Charged::Refused,
                    Some(h) => match h.on_failure {
                        OnStoreFailure::Deny => Charged::Refused,
                        OnStoreFailure::Allow => Charged::Open,
                        _ => return Err(ServiceError::Store(e)),
                    },
                });
            }
            let refused = charged.iter().any(|c| matches!(c, Charged::Refused));
            Ok((charged, refused))
        }
    }
}

fn status(
    code: Code,
    current_limit: Option<RateLimit>,
    limit_remaining: u32,
    duration_until_reset: Option<PbDuration>,
) -> DescriptorStatus {
    DescriptorStatus {
        code: code as i32,
        current_limit,
        limit_remaining,
        duration_until_reset,
        ..DescriptorStatus::default()
    }
}
