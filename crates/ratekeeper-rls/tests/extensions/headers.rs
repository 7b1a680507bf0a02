//! The IETF draft's `RateLimit-Policy` and `RateLimit` fields beside the reference's headers,
//! and the RFC 9457 problem details of a refusal.

use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;

use crate::on_both_stores;
use crate::support::*;

const CONFIG: &str = "\
domain: h
descriptors:
  - key: burst
    rate_limit: {period: 10s, requests_per_unit: 2, name: burst, algorithm: gcra}
  - key: window
    rate_limit: {unit: minute, requests_per_unit: 1}
";

fn headers(r: &RateLimitResponse) -> Vec<(String, String)> {
    r.response_headers_to_add
        .iter()
        .map(|h| (h.key.clone(), h.value.clone()))
        .collect()
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// `both`: the reference's three headers, then `RateLimit-Policy` with the exact window
/// (`w=10` for a 10 s period) and `RateLimit`; on the refusal, a `quota-exceeded` problem
/// body with its content type.
async fn both_formats_and_the_problem_body(b: Backend) {
    let env = [
        ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
        ("LIMIT_RESPONSE_HEADERS_FORMAT", "both"),
        ("OVER_LIMIT_PROBLEM_DETAILS", "true"),
    ];
    let mut rls = Rls::start(b, CONFIG, &env).await;
    // 60 s + 3 s past the start's minute: 3 s into a 10 s period.
    rls.clock
        .set_elapsed(Duration::from_secs(START_UNIX_SECS + 33));
    let r = rls.call(req("h", vec![desc(&[("burst", "c")])], 1)).await;
    assert_eq!(r.overall_code, ok());
    let reset = r.statuses[0].duration_until_reset.unwrap().seconds;
    assert!((1..=10).contains(&reset), "reset {reset}");
    assert_eq!(
        headers(&r),
        pairs(&[
            ("RateLimit-Limit", "2"),
            ("RateLimit-Remaining", "1"),
            ("RateLimit-Reset", &reset.to_string()),
            ("RateLimit-Policy", "\"burst\";q=2;w=10"),
            ("RateLimit", &format!("\"burst\";r=1;t={reset}")),
        ])
    );
    assert!(r.raw_body.is_empty(), "no body on OK");
    rls.call(req("h", vec![desc(&[("burst", "c")])], 1)).await;
    let r = rls.call(req("h", vec![desc(&[("burst", "c")])], 1)).await;
    assert_eq!(r.overall_code, over());
    let h = headers(&r);
    let reset = r.statuses[0].duration_until_reset.unwrap().seconds;
    assert!(
        h.contains(&("RateLimit".to_owned(), format!("\"burst\";r=0;t={reset}"))),
        "{h:?}"
    );
    assert!(h.contains(&(
        "Content-Type".to_owned(),
        "application/problem+json".to_owned()
    )));
    let body: serde_json::Value = serde_json::from_slice(&r.raw_body).expect("a JSON body");
    assert_eq!(
        body["type"],
        "https://iana.org/assignments/http-problem-types#quota-exceeded"
    );
    assert_eq!(body["title"], "Too Many Requests");
    assert_eq!(body["status"], 429);
    assert_eq!(body["violated-policies"], serde_json::json!(["burst"]));
}
on_both_stores!(
    both_formats_and_the_problem_body,
    both_formats_and_the_problem_body
);

/// `ietf`: only the two IETF fields; an unnamed rule is the policy `"default"`, and a
/// unit's window is its length (`w=60`).
async fn ietf_format_alone(b: Backend) {
    let env = [
        ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
        ("LIMIT_RESPONSE_HEADERS_FORMAT", "ietf"),
    ];
    let mut rls = Rls::start(b, CONFIG, &env).await;
    let r = rls.call(req("h", vec![desc(&[("window", "c")])], 1)).await;
    assert_eq!(
        headers(&r),
        pairs(&[
            ("RateLimit-Policy", "\"default\";q=1;w=60"),
            ("RateLimit", "\"default\";r=0;t=30"),
        ])
    );
    // Refused, without OVER_LIMIT_PROBLEM_DETAILS: no body.
    let r = rls.call(req("h", vec![desc(&[("window", "c")])], 1)).await;
    assert_eq!(r.overall_code, over());
    assert!(r.raw_body.is_empty());
    assert_eq!(headers(&r).len(), 2);
}
on_both_stores!(ietf_format_alone, ietf_format_alone);

/// Without the settings: the reference's answer, no IETF field and no body.
async fn the_default_is_the_references(b: Backend) {
    let env = [("LIMIT_RESPONSE_HEADERS_ENABLED", "true")];
    let mut rls = Rls::start(b, CONFIG, &env).await;
    rls.call(req("h", vec![desc(&[("window", "c")])], 1)).await;
    let r = rls.call(req("h", vec![desc(&[("window", "c")])], 1)).await;
    assert_eq!(r.overall_code, over());
    assert_eq!(
        headers(&r),
        pairs(&[
            ("RateLimit-Limit", "1"),
            ("RateLimit-Remaining", "0"),
            ("RateLimit-Reset", "30"),
        ])
    );
    assert!(r.raw_body.is_empty());
}
on_both_stores!(the_default_is_the_references, the_default_is_the_references);
