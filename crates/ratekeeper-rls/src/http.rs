//! The HTTP listeners: `/healthcheck` and `/json` (main), `/rlconfig` and `/metrics`
//! (debug), `/metrics` (Prometheus).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use serde_json::{Map, Value, json};

use crate::service::Shared;

/// What `/healthcheck` reads.
#[derive(Debug, Clone)]
pub(crate) struct Health {
    pub(crate) shared: Arc<Shared>,
    pub(crate) serving: Arc<AtomicBool>,
    /// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`: unhealthy until a config with a domain is
    /// in force.
    pub(crate) need_config: bool,
}

impl Health {
    /// Serving (no SIGTERM yet), the store reachable, and a config in force when required.
    pub(crate) fn is_healthy(&self) -> bool {
        let config_ok = !self.need_config
            || self
                .shared
                .config
                .load()
                .as_ref()
                .is_some_and(|c| !c.is_empty());
        self.serving.load(Ordering::SeqCst) && self.shared.limiter.is_healthy() && config_ok
    }
}

async fn healthcheck(State(h): State<Health>) -> Response {
    if h.is_healthy() {
        (StatusCode::OK, "OK").into_response()
    } else {
        (StatusCode::INTERNAL_SERVER_ERROR, "NOT OK").into_response()
    }
}

async fn rlconfig(State(h): State<Health>) -> Response {
    let config = h.shared.config.load_full();
    let body = match config {
        Some(c) => serde_json::to_value(&*c).unwrap_or(Value::Null),
        None => Value::Null,
    };
    axum::Json(body).into_response()
}

async fn metrics() -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        crate::stats::prometheus().render(),
    )
        .into_response()
}

/// `POST /json`: a `RateLimitRequest` in protobuf JSON; 200 (`OK`), 429 (`OVER_LIMIT`) or
/// 400 (a body that does not parse, or a request the service refuses), with the response in
/// protobuf JSON.
async fn json_check(State(h): State<Health>, body: Bytes) -> Response {
    let Some(request) = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|v| request_from_json(&v))
    else {
        return (StatusCode::BAD_REQUEST, "bad request").into_response();
    };
    match h.shared.should_rate_limit(&request).await {
        Ok(response) => {
            let status = if response.overall_code == Code::OverLimit as i32 {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::OK
            };
            (status, axum::Json(response_to_json(&response))).into_response()
        }
        Err(e) => (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    }
}

/// The field `camel` or `snake` of `v` (protobuf JSON accepts both).
fn field<'a>(v: &'a Value, camel: &str, snake: &str) -> Option<&'a Value> {
    v.get(camel).or_else(|| v.get(snake))
}

fn number(v: &Value) -> Option<u64> {
    v.as_u64()
        .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
}

fn request_from_json(v: &Value) -> Option<RateLimitRequest> {
    let domain = v.get("domain").map_or(Some(""), Value::as_str)?.to_owned();
    let hits_addend = match field(v, "hitsAddend", "hits_addend") {
        Some(n) => u32::try_from(number(n)?).ok()?,
        None => 0,
    };
    let mut descriptors = Vec::new();
    for d in v
        .get("descriptors")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let mut entries = Vec::new();
        for e in d
            .get("entries")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            entries.push(Entry {
                key: e.get("key").map_or(Some(""), Value::as_str)?.to_owned(),
                value: e.get("value").map_or(Some(""), Value::as_str)?.to_owned(),
            });
        }
        let limit = match d.get("limit") {
            Some(l) => Some(RateLimitOverride {
                requests_per_unit: u32::try_from(
                    field(l, "requestsPerUnit", "requests_per_unit").map_or(Some(0), number)?,
                )
                .ok()?,
                unit: unit_from_json(l.get("unit"))?,
            }),
            None => None,
        };
        let hits = match field(d, "hitsAddend", "hits_addend") {
            Some(n) => Some(UInt64Value { value: number(n)? }),
            None => None,
        };
        descriptors.push(RateLimitDescriptor {
            entries,
            limit,
            hits_addend: hits,
            ..RateLimitDescriptor::default()
        });
    }
    Some(RateLimitRequest {
        domain,
        descriptors,
        hits_addend,
    })
}

fn unit_from_json(v: Option<&Value>) -> Option<i32> {
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
    match v {
        None => Some(0),
        Some(Value::String(s)) => Unit::from_str_name(s).map(|u| u as i32),
        Some(n) => i32::try_from(n.as_i64()?).ok(),
    }
}

fn code_name(code: i32) -> &'static str {
    Code::try_from(code).map_or("UNKNOWN", |c| c.as_str_name())
}

/// The response in protobuf JSON (default values left out, as protojson does).
fn response_to_json(r: &RateLimitResponse) -> Value {
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
    let mut out = Map::new();
    if r.overall_code != 0 {
        out.insert("overallCode".into(), json!(code_name(r.overall_code)));
    }
    let statuses: Vec<Value> = r
        .statuses
        .iter()
        .map(|s| {
            let mut o = Map::new();
            if s.code != 0 {
                o.insert("code".into(), json!(code_name(s.code)));
            }
            if let Some(l) = &s.current_limit {
                let mut lim = Map::new();
                if !l.name.is_empty() {
                    lim.insert("name".into(), json!(l.name));
                }
                if l.requests_per_unit != 0 {
                    lim.insert("requestsPerUnit".into(), json!(l.requests_per_unit));
                }
                if l.unit != 0 {
                    let unit = Unit::try_from(l.unit).map_or("UNKNOWN", |u| u.as_str_name());
                    lim.insert("unit".into(), json!(unit));
                }
                o.insert("currentLimit".into(), Value::Object(lim));
            }
            if s.limit_remaining != 0 {
                o.insert("limitRemaining".into(), json!(s.limit_remaining));
            }
            if let Some(d) = &s.duration_until_reset {
                o.insert(
                    "durationUntilReset".into(),
                    json!(format!("{}s", d.seconds)),
                );
            }
            Value::Object(o)
        })
        .collect();
    if !statuses.is_empty() {
        out.insert("statuses".into(), Value::Array(statuses));
    }
    if !r.response_headers_to_add.is_empty() {
        let headers: Vec<Value> = r
            .response_headers_to_add
            .iter()
            .map(|h| json!({"key": h.key, "value": h.value}))
            .collect();
        out.insert("responseHeadersToAdd".into(), Value::Array(headers));
    }
    if let Some(m) = &r.dynamic_metadata {
        out.insert("dynamicMetadata".into(), struct_to_json(m));
    }
    Value::Object(out)
}

/// A protobuf `Struct` as the JSON object it stands for.
fn struct_to_json(s: &envoy_types::pb::google::protobuf::Struct) -> Value {
    Value::Object(
        s.fields
            .iter()
            .map(|(k, v)| (k.clone(), value_to_json(v)))
            .collect(),
    )
}

fn value_to_json(v: &envoy_types::pb::google::protobuf::Value) -> Value {
    use envoy_types::pb::google::protobuf::value::Kind;
    match &v.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::NumberValue(n)) => json!(n),
        Some(Kind::StringValue(s)) => json!(s),
        Some(Kind::BoolValue(b)) => json!(b),
        Some(Kind::StructValue(s)) => struct_to_json(s),
        Some(Kind::ListValue(l)) => Value::Array(l.values.iter().map(value_to_json).collect()),
    }
}

/// `/healthcheck` and `/json`.
pub(crate) fn main_router(health: Health) -> Router {
    Router::new()
        .route("/healthcheck", get(healthcheck))
        .route("/json", post(json_check))
        .with_state(health)
}

/// `/rlconfig`, `/healthcheck` and the metrics at `metrics_path`.
pub(crate) fn debug_router(health: Health, metrics_path: &str) -> Router {
    Router::new()
        .route("/rlconfig", get(rlconfig))
        .route("/healthcheck", get(healthcheck))
        .route(metrics_path, get(metrics))
        .with_state(health)
}

/// The Prometheus listener: the metrics at `path`.
pub(crate) fn metrics_router(path: &str) -> Router {
    let path = if path.starts_with('/') {
        path.to_owned()
    } else {
        format!("/{path}")
    };
    Router::new().route(&path, get(metrics))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_requests_read_camel_and_snake_case_fields() {
        let v = json!({
            "domain": "d",
            "hitsAddend": 3,
            "descriptors": [
                {"entries": [{"key": "k", "value": "v"}], "hits_addend": "0",
                 "limit": {"requestsPerUnit": 5, "unit": "MINUTE"}},
                {"entries": [{"key": "only"}]}
            ]
        });
        let r = request_from_json(&v).unwrap();
        assert_eq!((r.domain.as_str(), r.hits_addend), ("d", 3));
        assert_eq!(r.descriptors[0].hits_addend, Some(UInt64Value { value: 0 }));
        let limit = r.descriptors[0].limit.unwrap();
        assert_eq!((limit.requests_per_unit, limit.unit), (5, 2));
        assert_eq!(r.descriptors[1].entries[0].value, "");
        assert!(request_from_json(&json!({"domain": 7})).is_none());
        assert!(request_from_json(&json!({"descriptors": [{"entries": [{"key": 1}]}]})).is_none());
    }
}
