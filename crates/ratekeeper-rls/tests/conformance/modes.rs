//! Shadow and quota modes (per rule and global), response headers and dynamic metadata.

use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};

use crate::on_both_stores;
use crate::support::*;

const MODES: &str = r#"
domain: modes
descriptors:
  - key: shadowed
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: wide
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: quota_a
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: quota_b
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: meta
    metadata: {team: {name: search, tier: gold}, owner: a}
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: meta2
    metadata: {team: {name: other, region: eu}, cost: 3}
    rate_limit: {unit: minute, requests_per_unit: 5}
"#;

async fn rule_shadow_mode_answers_ok_with_the_limit_body(b: Backend) {
    let mut rls = Rls::start(b, MODES, &[]).await;
    for _ in 0..3 {
        let r = rls
            .call(req("modes", vec![desc(&[("shadowed", "s")])], 0))
            .await;
        assert_eq!(r.overall_code, ok());
        let s = &r.statuses[0];
        assert_eq!(cr(s), (ok(), 0));
        assert_eq!(s.current_limit.as_ref().unwrap().requests_per_unit, 1);
        assert_eq!(s.duration_until_reset.unwrap().seconds, 30);
    }
}
on_both_stores!(
    rule_shadow_mode_answers_ok_with_the_limit,
    rule_shadow_mode_answers_ok_with_the_limit_body
);

async fn global_shadow_mode_keeps_statuses_body(b: Backend) {
    let mut rls = Rls::start(b, MODES, &[("SHADOW_MODE", "true")]).await;
    let first = rls
        .call(req("modes", vec![desc(&[("plain", "p")])], 0))
        .await;
    assert_eq!(cr(&first.statuses[0]), (ok(), 0));
    let r = rls
        .call(req("modes", vec![desc(&[("plain", "p")])], 0))
        .await;
    assert_eq!(r.overall_code, ok());
    assert_eq!(cr(&r.statuses[0]), (over(), 0));
}
on_both_stores!(
    global_shadow_mode_keeps_statuses,
    global_shadow_mode_keeps_statuses_body
);

async fn quota_mode_only_all_over_refuses_body(b: Backend) {
    let mut rls = Rls::start(b, MODES, &[]).await;
    let both = || vec![desc(&[("quota_a", "q")]), desc(&[("quota_b", "q")])];
    let codes = |r: &envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse| {
        (
            r.overall_code,
            r.statuses.iter().map(|s| s.code).collect::<Vec<_>>(),
        )
    };
    let r = rls.call(req("modes", both(), 0)).await;
    assert_eq!(codes(&r), (ok(), vec![ok(), ok()]));
    // Some over: allowed, the over status kept.
    let r = rls.call(req("modes", both(), 0)).await;
    assert_eq!(codes(&r), (ok(), vec![over(), ok()]));
    // All over: refused.
    let r = rls.call(req("modes", both(), 0)).await;
    assert_eq!(codes(&r), (over(), vec![over(), over()]));
}
on_both_stores!(
    quota_mode_only_all_over_refuses,
    quota_mode_only_all_over_refuses_body
);

async fn a_plain_limit_over_refuses_beside_quota_mode_body(b: Backend) {
    let mut rls = Rls::start(b, MODES, &[]).await;
    let two = || vec![desc(&[("plain", "x")]), desc(&[("quota_b", "x")])];
    assert_eq!(rls.call(req("modes", two(), 0)).await.overall_code, ok());
    let r = rls.call(req("modes", two(), 0)).await;
    assert_eq!(r.overall_code, over());
    assert_eq!((r.statuses[0].code, r.statuses[1].code), (over(), ok()));
}
on_both_stores!(
    a_plain_limit_over_refuses_beside_quota_mode,
    a_plain_limit_over_refuses_beside_quota_mode_body
);

async fn global_quota_mode_makes_every_limit_quota_body(b: Backend) {
    let mut rls = Rls::start(b, MODES, &[("QUOTA_MODE", "true")]).await;
    let two = || vec![desc(&[("plain", "g")]), desc(&[("wide", "g")])];
    assert_eq!(rls.call(req("modes", two(), 0)).await.overall_code, ok());
    let r = rls.call(req("modes", two(), 0)).await;
    assert_eq!(r.overall_code, ok());
    assert_eq!(r.statuses[0].code, over());
    // Alone, the one over limit is every quota descriptor of the request: refused.
    let r = rls
        .call(req("modes", vec![desc(&[("plain", "g")])], 0))
        .await;
    assert_eq!(r.overall_code, over());
}
on_both_stores!(
    global_quota_mode_makes_every_limit_quota,
    global_quota_mode_makes_every_limit_quota_body
);

fn headers(
    r: &envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse,
) -> Vec<(String, String)> {
    r.response_headers_to_add
        .iter()
        .map(|h| (h.key.clone(), h.value.clone()))
        .collect()
}

fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
    p.iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

async fn response_headers_describe_the_tightest_descriptor_body(b: Backend) {
    let mut rls = Rls::start(b, MODES, &[("LIMIT_RESPONSE_HEADERS_ENABLED", "true")]).await;
    let r = rls
        .call(req(
            "modes",
            vec![desc(&[("wide", "h")]), desc(&[("plain", "h")])],
            0,
        ))
        .await;
    assert_eq!(r.overall_code, ok());
    assert_eq!(
        headers(&r),
        pairs(&[
            ("RateLimit-Limit", "1"),
            ("RateLimit-Remaining", "0"),
            ("RateLimit-Reset", "30")
        ])
    );
    // No limit, no headers.
    let r = rls
        .call(req("modes", vec![desc(&[("nothing", "h")])], 0))
        .await;
    assert!(r.response_headers_to_add.is_empty());
}
on_both_stores!(
    response_headers_describe_the_tightest_descriptor,
    response_headers_describe_the_tightest_descriptor_body
);

async fn an_over_limit_descriptor_wins_the_headers_body(b: Backend) {
    let mut rls = Rls::start(b, MODES, &[("LIMIT_RESPONSE_HEADERS_ENABLED", "true")]).await;
    rls.call(req("modes", vec![desc(&[("plain", "w")])], 0))
        .await;
    // `wide` ends at remaining 0 first in order, but `plain` is the one refusing.
    let r = rls
        .call(req(
            "modes",
            vec![desc_hits(&[("wide", "w")], 5), desc(&[("plain", "w")])],
            0,
        ))
        .await;
    assert_eq!(r.overall_code, over());
    assert_eq!(
        headers(&r),
        pairs(&[
            ("RateLimit-Limit", "1"),
            ("RateLimit-Remaining", "0"),
            ("RateLimit-Reset", "30")
        ])
    );
}
on_both_stores!(
    an_over_limit_descriptor_wins_the_headers,
    an_over_limit_descriptor_wins_the_headers_body
);

async fn response_header_names_are_configurable_body(b: Backend) {
    let env = [
        ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
        ("LIMIT_LIMIT_HEADER", "X-Lim"),
        ("LIMIT_REMAINING_HEADER", "X-Rem"),
        ("LIMIT_RESET_HEADER", "X-Reset"),
    ];
    let mut rls = Rls::start(b, MODES, &env).await;
    let r = rls
        .call(req("modes", vec![desc(&[("wide", "n")])], 2))
        .await;
    assert_eq!(
        headers(&r),
        pairs(&[("X-Lim", "5"), ("X-Rem", "3"), ("X-Reset", "30")])
    );
}
on_both_stores!(
    response_header_names_are_configurable,
    response_header_names_are_configurable_body
);

async fn no_headers_or_metadata_unless_enabled_body(b: Backend) {
    let mut rls = Rls::start(b, MODES, &[]).await;
    let r = rls
        .call(req("modes", vec![desc(&[("meta", "x")])], 0))
        .await;
    assert!(r.response_headers_to_add.is_empty());
    assert!(r.dynamic_metadata.is_none());
}
on_both_stores!(
    no_headers_or_metadata_unless_enabled,
    no_headers_or_metadata_unless_enabled_body
);

fn field<'a>(s: &'a Struct, name: &str) -> &'a Kind {
    s.fields
        .get(name)
        .and_then(|v| v.kind.as_ref())
        .unwrap_or_else(|| panic!("no field {name} in {s:?}"))
}

fn strukt<'a>(s: &'a Struct, name: &str) -> &'a Struct {
    match field(s, name) {
        Kind::StructValue(v) => v,
        other => panic!("{name} is {other:?}"),
    }
}

fn list<'a>(s: &'a Struct, name: &str) -> &'a [Value] {
    match field(s, name) {
        Kind::ListValue(v) => &v.values,
        other => panic!("{name} is {other:?}"),
    }
}

fn text(s: &Struct, name: &str) -> String {
    match field(s, name) {
        Kind::StringValue(v) => v.clone(),
        other => panic!("{name} is {other:?}"),
    }
}

fn num(s: &Struct, name: &str) -> f64 {
    match field(s, name) {
        Kind::NumberValue(v) => *v,
        other => panic!("{name} is {other:?}"),
    }
}

async fn dynamic_metadata_has_the_reference_shape_body(b: Backend) {
    let mut rls = Rls::start(b, MODES, &[("RESPONSE_DYNAMIC_METADATA", "true")]).await;
    let r = rls
        .call(req(
            "modes",
            vec![
                desc_hits(&[("meta", "x"), ("sub", "y")], 1),
                desc(&[("meta2", "x")]),
            ],
            3,
        ))
        .await;
    let m = r.dynamic_metadata.expect("dynamic metadata");
    assert_eq!(text(&m, "domain"), "modes");
    assert_eq!(num(&m, "hitsAddend"), 3.0);
    let ds = list(&m, "descriptors");
    assert_eq!(ds.len(), 2);
    let Some(Kind::StructValue(d0)) = &ds[0].kind else {
        panic!("{:?}", ds[0])
    };
    let entries: Vec<_> = list(d0, "entries")
        .iter()
        .map(|v| match &v.kind {
            Some(Kind::StringValue(s)) => s.clone(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(entries, ["meta=x", "sub=y"]);
    assert_eq!(num(d0, "hitsAddend"), 1.0);
    let Some(Kind::StructValue(d1)) = &ds[1].kind else {
        panic!("{:?}", ds[1])
    };
    assert!(!d1.fields.contains_key("hitsAddend"));
    // (meta, x), (sub, y) matches no rule: only meta2's metadata is merged in.
    let merged = strukt(&m, "metadata");
    assert_eq!(num(merged, "cost"), 3.0);
    assert_eq!(text(strukt(merged, "team"), "name"), "other");
}
on_both_stores!(
    dynamic_metadata_has_the_reference_shape,
    dynamic_metadata_has_the_reference_shape_body
);

async fn metadata_merges_passed_descriptors_only_body(b: Backend) {
    let mut rls = Rls::start(b, MODES, &[("RESPONSE_DYNAMIC_METADATA", "true")]).await;
    let two = || vec![desc(&[("meta", "m")]), desc(&[("meta2", "m")])];
    let r = rls.call(req("modes", two(), 0)).await;
    let m = r.dynamic_metadata.expect("dynamic metadata");
    assert!(!m.fields.contains_key("hitsAddend"));
    let merged = strukt(&m, "metadata");
    // First value wins; maps merge.
    let team = strukt(merged, "team");
    assert_eq!(
        (text(team, "name"), text(team, "tier"), text(team, "region")),
        ("search".to_owned(), "gold".to_owned(), "eu".to_owned())
    );
    assert_eq!(text(merged, "owner"), "a");
    // `meta` (1 per minute) is refused now: its metadata is left out.
    let r = rls.call(req("modes", two(), 0)).await;
    let merged = strukt(r.dynamic_metadata.as_ref().unwrap(), "metadata").clone();
    assert!(!merged.fields.contains_key("owner"));
    assert_eq!(text(strukt(&merged, "team"), "name"), "other");
}
on_both_stores!(
    metadata_merges_passed_descriptors_only,
    metadata_merges_passed_descriptors_only_body
);
