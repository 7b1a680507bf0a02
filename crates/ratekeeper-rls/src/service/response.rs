//! The response: overall code, global shadow mode, response headers, dynamic metadata.

use std::collections::HashMap;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::{ListValue, Struct, Value, value::Kind};

use super::outcome::Outcome;
use super::{Shared, ietf};
use crate::limiter::until_reset;

pub(super) fn build(
    shared: &Shared,
    request: &RateLimitRequest,
    outcomes: Vec<Outcome<'_>>,
    now: Duration,
) -> RateLimitResponse {
    let opts = &shared.options;
    let mut minimum: Option<usize> = None;
    let mut min_remaining = u32::MAX;
    let mut passed = Vec::new();
    let (mut failed_limit, mut failed_quota, mut quota_total) = (0usize, 0usize, 0usize);
    for (i, o) in outcomes.iter().enumerate() {
        let s = &o.status;
        if o.unlimited {
            continue;
        }
        // The descriptor the headers describe: the smallest remaining among statuses with a
        // limit; a refusing descriptor outside quota mode always wins (the last such).
        if s.current_limit.is_some() && s.limit_remaining < min_remaining {
            minimum = Some(i);
            min_remaining = s.limit_remaining;
        }
        let quota = opts.quota_mode || o.rule.as_ref().is_some_and(|r| r.quota);
        if s.code == Code::OverLimit as i32 {
            if quota {
                failed_quota += 1;
            } else {
                failed_limit += 1;
                minimum = Some(i);
                min_remaining = 0;
            }
        } else {
            passed.push(i);
        }
        if quota {
            quota_total += 1;
        }
    }
    let mut over = failed_limit > 0 || (quota_total > 0 && quota_total == failed_quota);

    let mut response = RateLimitResponse::default();
    // The descriptor that decided: its limit, remaining and reset.
    let decided = minimum.and_then(|i| {
        let o = &outcomes[i];
        let limit = o.status.current_limit.as_ref()?;
        let rule = o.rule.as_ref()?;
        let reset = o.status.duration_until_reset.as_ref().map_or_else(
            || until_reset(now, rule.period_secs),
            |d| u64::try_from(d.seconds).unwrap_or(0),
        );
        Some((
            rule,
            limit.requests_per_unit,
            o.status.limit_remaining,
            reset,
        ))
    });
    let header = |key: &str, value: String| HeaderValue {
        key: key.to_owned(),
        value,
        ..HeaderValue::default()
    };
    if let (Some(names), Some((rule, limit, remaining, reset))) = (&opts.headers, &decided) {
        if opts.header_format.reference() {
            response.response_headers_to_add.extend([
                header(&names.limit, limit.to_string()),
                header(&names.remaining, remaining.to_string()),
                header(&names.reset, reset.to_string()),
            ]);
        }
        if opts.header_format.ietf() {
            response.response_headers_to_add.extend([
                header(
                    "RateLimit-Policy",
                    ietf::policy(rule.name, *limit, rule.period_secs),
                ),
                header("RateLimit", ietf::state(rule.name, *remaining, *reset)),
            ]);
        }
    }
    if over && opts.shadow_mode {
        over = false;
        crate::stats::global_shadow_mode();
    }
    if over
        && opts.problem_details
        && let Some((rule, _, _, reset)) = &decided
    {
        response.raw_body = ietf::problem(rule.name, *reset);
        response.response_headers_to_add.push(header(
            "Content-Type",
            "application/problem+json".to_owned(),
        ));
    }
    if opts.dynamic_metadata {
        response.dynamic_metadata = Some(metadata(request, &outcomes, &passed));
    }
    response.overall_code = if over { Code::OverLimit } else { Code::Ok } as i32;
    response.statuses = outcomes.into_iter().map(|o| o.status).collect();
    response
}

fn value(kind: Kind) -> Value {
    Value { kind: Some(kind) }
}

fn string(s: String) -> Value {
    value(Kind::StringValue(s))
}

/// `{domain, descriptors: [{entries: ["k=v", …], limit?, hitsAddend?}], hitsAddend?,
/// metadata?}`, the reference's shape; `metadata` merges the `metadata` of the rules of the
/// descriptors that were not refused (first value wins; maps merge recursively).
fn metadata(request: &RateLimitRequest, outcomes: &[Outcome<'_>], passed: &[usize]) -> Struct {
    let mut fields = HashMap::new();
    fields.insert("domain".to_owned(), string(request.domain.clone()));
    let descriptors = request
        .descriptors
        .iter()
        .map(|d| {
            let mut f = HashMap::new();
            let entries = d
                .entries
                .iter()
                .map(|e| string(format!("{}={}", e.key, e.value)))
                .collect();
            f.insert(
                "entries".to_owned(),
                value(Kind::ListValue(ListValue { values: entries })),
            );
            if let Some(limit) = &d.limit {
                f.insert("limit".to_owned(), string(override_text(limit)));
            }
            if let Some(h) = &d.hits_addend {
                f.insert(
                    "hitsAddend".to_owned(),
                    value(Kind::NumberValue(h.value as f64)),
                );
            }
            value(Kind::StructValue(Struct { fields: f }))
        })
        .collect();
    fields.insert(
        "descriptors".to_owned(),
        value(Kind::ListValue(ListValue {
            values: descriptors,
        })),
    );
    if request.hits_addend != 0 {
        fields.insert(
            "hitsAddend".to_owned(),
            value(Kind::NumberValue(f64::from(request.hits_addend))),
        );
    }
    let mut merged = serde_json::Map::new();
    for &i in passed {
        if let Some(m) = outcomes[i].rule.as_ref().and_then(|r| r.metadata) {
            merge(&mut merged, m);
        }
    }
    if !merged.is_empty() {
        fields.insert(
            "metadata".to_owned(),
            json_to_value(&serde_json::Value::Object(merged)),
        );
    }
    Struct { fields }
}

/// The override as protobuf text, as Go's `String()` writes it: `requests_per_unit:N unit:U`.
fn override_text(
    o: &envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride,
) -> String {
    let unit = crate::config::Unit::from_proto_i32(o.unit)
        .map_or("UNKNOWN", |u| u.to_proto().as_str_name());
    format!("requests_per_unit:{} unit:{unit}", o.requests_per_unit)
}

fn merge(
    dest: &mut serde_json::Map<String, serde_json::Value>,
    src: &serde_json::Map<String, serde_json::Value>,
) {
    for (k, v) in src {
        match (dest.get_mut(k), v) {
            (Some(serde_json::Value::Object(d)), serde_json::Value::Object(s)) => merge(d, s),
            (Some(_), _) => {}
            (None, _) => {
                dest.insert(k.clone(), v.clone());
            }
        }
    }
}

/// A JSON value as a protobuf `Value`.
pub(crate) fn json_to_value(v: &serde_json::Value) -> Value {
    match v {
        serde_json::Value::Null => value(Kind::NullValue(0)),
        serde_json::Value::Bool(b) => value(Kind::BoolValue(*b)),
        serde_json::Value::Number(n) => value(Kind::NumberValue(n.as_f64().unwrap_or(0.0))),
        serde_json::Value::String(s) => string(s.clone()),
        serde_json::Value::Array(a) => value(Kind::ListValue(ListValue {
            values: a.iter().map(json_to_value).collect(),
        })),
        serde_json::Value::Object(o) => value(Kind::StructValue(Struct {
            fields: o
                .iter()
                .map(|(k, v)| (k.clone(), json_to_value(v)))
                .collect(),
        })),
    }
}
