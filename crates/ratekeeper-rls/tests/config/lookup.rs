//! Positive lookups: the reference's `TestBasicConfig`, `TestShadowModeConfig`,
//! `TestWildcardConfig`, `TestMetadata` and `TestDomainMerge` tables, on our fixtures.

use ratekeeper_rls::config::{ConfigErrorKind, LoadOptions, Lookup, RateLimitConfig, Unit};
use serde_json::json;

use super::{fixture, limit, load, no_limit};

#[test]
fn unknown_domain_is_domain_not_found() {
    let c = load("ok/basic.yaml");
    assert!(matches!(
        c.lookup("nowhere", &[("client", "x")]),
        Lookup::DomainNotFound
    ));
    assert!(matches!(c.lookup("nowhere", &[]), Lookup::DomainNotFound));
}

#[test]
fn empty_descriptor_has_no_limit() {
    no_limit(&load("ok/basic.yaml"), "shop", &[]);
}

#[test]
fn node_without_rate_limit_has_no_limit() {
    let c = load("ok/basic.yaml");
    no_limit(&c, "shop", &[("tenant", "acme")]);
    no_limit(&c, "shop", &[("tenant", "other")]);
    // Allow-listed value: no rate_limit, no children.
    no_limit(&c, "shop", &[("client", "internal")]);
}

#[test]
fn request_deeper_than_config_has_no_limit() {
    let c = load("ok/basic.yaml");
    no_limit(&c, "shop", &[("client", "partner"), ("route", "x")]);
    no_limit(&c, "shop", &[("batch", "nightly"), ("other", "x")]);
    no_limit(
        &c,
        "shop",
        &[("batch", "nightly"), ("step", "1"), ("more", "x")],
    );
}

#[test]
fn default_and_exact_values_on_a_nested_level() {
    let c = load("ok/basic.yaml");
    let entries = [("tenant", "acme"), ("route", "anything")];
    let m = limit(&c, "shop", &entries);
    assert_eq!((m.rule.requests_per_unit, m.rule.unit), (5, Unit::Second));
    assert_eq!(m.stats_key(), "shop.tenant_acme.route");
    let entries = [("tenant", "acme"), ("route", "checkout")];
    let m = limit(&c, "shop", &entries);
    assert_eq!((m.rule.requests_per_unit, m.rule.unit), (10, Unit::Second));
    assert_eq!(m.stats_key(), "shop.tenant_acme.route_checkout");
}

#[test]
fn exact_value_beats_the_default() {
    let c = load("ok/basic.yaml");
    let m = limit(&c, "shop", &[("client", "someone")]);
    assert_eq!((m.rule.requests_per_unit, m.rule.unit), (20, Unit::Minute));
    assert_eq!(m.stats_key(), "shop.client");
    let m = limit(&c, "shop", &[("client", "partner")]);
    assert_eq!((m.rule.requests_per_unit, m.rule.unit), (30, Unit::Minute));
    assert_eq!(m.stats_key(), "shop.client_partner");
}

#[test]
fn default_descriptor_counts_each_value_apart() {
    let c = load("ok/basic.yaml");
    let a = limit(&c, "shop", &[("client", "a")]);
    let b = limit(&c, "shop", &[("client", "b")]);
    assert_ne!(a.counter_key(), b.counter_key());
    assert_eq!(a.stats_key(), b.stats_key());
}

#[test]
fn names_units_and_unlimited() {
    let c = load("ok/basic.yaml");
    let m = limit(&c, "shop", &[("region", "eu")]);
    assert_eq!((m.rule.requests_per_unit, m.rule.unit), (1, Unit::Hour));
    assert_eq!(m.rule.name, None);
    let m = limit(&c, "shop", &[("plan", "pro")]);
    assert_eq!((m.rule.requests_per_unit, m.rule.unit), (1, Unit::Day));
    assert_eq!(m.rule.name.as_deref(), Some("plan_daily"));
    let m = limit(&c, "shop", &[("health", "probe")]);
    assert!(m.rule.unlimited);
    let m = limit(&c, "shop", &[("seats", "x")]);
    assert_eq!((m.rule.requests_per_unit, m.rule.unit), (3, Unit::Week));
}

#[test]
fn missing_requests_per_unit_is_zero() {
    let c = load("ok/basic.yaml");
    let m = limit(&c, "shop", &[("blocked", "x")]);
    assert_eq!((m.rule.requests_per_unit, m.rule.unit), (0, Unit::Second));
    assert!(!m.rule.unlimited);
}

#[test]
fn limit_applies_only_at_the_last_entry_depth() {
    let c = load("ok/basic.yaml");
    let m = limit(&c, "shop", &[("batch", "nightly")]);
    assert_eq!((m.rule.requests_per_unit, m.rule.unit), (100, Unit::Hour));
    let entries = [("batch", "nightly"), ("step", "load")];
    let m = limit(&c, "shop", &entries);
    assert_eq!((m.rule.requests_per_unit, m.rule.unit), (7, Unit::Minute));
    assert_eq!(m.stats_key(), "shop.batch_nightly.step");
}

#[test]
fn detailed_metric_puts_the_values_in_the_stats_key() {
    let c = load("ok/basic.yaml");
    let m = limit(&c, "shop", &[("ip", "10.0.0.1")]);
    assert_eq!((m.rule.requests_per_unit, m.rule.unit), (70, Unit::Minute));
    assert!(m.rule.detailed_metric);
    assert_eq!(m.stats_key(), "shop.ip_10.0.0.1");
    // The labels keep the dotted value whole.
    assert_eq!(m.metric_keys(), ("ip_10.0.0.1".to_owned(), None));
}

#[test]
fn shadow_mode_is_per_descriptor_and_not_inherited() {
    let c = load("ok/shadow.yaml");
    let m = limit(&c, "shadow", &[("app", "web"), ("route", "home")]);
    assert_eq!(m.rule.requests_per_unit, 5);
    assert!(!m.rule.shadow_mode);
    let m = limit(&c, "shadow", &[("app", "web"), ("route", "search")]);
    assert_eq!(m.rule.requests_per_unit, 10);
    assert!(m.rule.shadow_mode);
    let m = limit(&c, "shadow", &[("user", "u1")]);
    assert_eq!((m.rule.requests_per_unit, m.rule.unit), (20, Unit::Minute));
    assert!(m.rule.shadow_mode);
    let m = limit(&c, "shadow", &[("user", "u1"), ("action", "post")]);
    assert_eq!(m.rule.requests_per_unit, 2);
    assert!(
        !m.rule.shadow_mode,
        "a parent's shadow_mode is not inherited"
    );
    let m = limit(&c, "shadow", &[("user", "admin")]);
    assert_eq!(m.rule.requests_per_unit, 30);
    assert!(!m.rule.shadow_mode);
}

#[test]
fn trailing_wildcard_matches_and_keeps_the_pattern_in_stats() {
    let c = load("ok/wildcard.yaml");
    let a = limit(&c, "wild", &[("path", "/api/users")]);
    let b = limit(&c, "wild", &[("path", "/api/")]);
    assert_eq!(a.rule.requests_per_unit, 1);
    assert!(std::ptr::eq(a.rule, b.rule));
    assert_eq!(a.stats_key(), "wild.path_/api/*");
    // Without share_threshold each value has its own counter.
    assert_ne!(a.counter_key(), b.counter_key());
    no_limit(&c, "wild", &[("path", "/other")]);
    // A value without `*` is exact: no prefix match.
    no_limit(&c, "wild", &[("path", "/plainer")]);
    assert_eq!(
        limit(&c, "wild", &[("path", "/plain")])
            .rule
            .requests_per_unit,
        2
    );
}

#[test]
fn middle_and_multiple_wildcards() {
    let c = load("ok/wildcard.yaml");
    for v in ["barab", "bar123b", "barb"] {
        assert_eq!(
            limit(&c, "wild", &[("sku", v)]).rule.requests_per_unit,
            3,
            "{v}"
        );
    }
    for v in ["bara", "xbarb"] {
        no_limit(&c, "wild", &[("sku", v)]);
    }
    for v in ["foo123bar456baz", "foobarbaz"] {
        let entries = [("sku", v)];
        let m = limit(&c, "wild", &entries);
        assert_eq!(m.rule.requests_per_unit, 4, "{v}");
        assert_eq!(m.stats_key(), "wild.sku_foo*bar*baz");
    }
    for v in ["foo123baz", "bar456baz"] {
        no_limit(&c, "wild", &[("sku", v)]);
    }
}

#[test]
fn exact_beats_wildcards_and_wildcards_go_in_config_order() {
    let c = load("ok/wildcard.yaml");
    assert_eq!(
        limit(&c, "wild", &[("code", "abc")]).rule.requests_per_unit,
        7
    );
    // "abd" matches both "a*" and "ab*": the first in the file wins.
    assert_eq!(
        limit(&c, "wild", &[("code", "abd")]).rule.requests_per_unit,
        5
    );
    assert_eq!(
        limit(&c, "wild", &[("code", "a")]).rule.requests_per_unit,
        5
    );
    no_limit(&c, "wild", &[("code", "b")]);
}

#[test]
fn wildcard_beats_the_default() {
    let c = load("ok/wildcard.yaml");
    assert_eq!(
        limit(&c, "wild", &[("tier", "gold-plus")])
            .rule
            .requests_per_unit,
        8
    );
    let m = limit(&c, "wild", &[("tier", "silver")]);
    assert_eq!(m.rule.requests_per_unit, 9);
    assert_eq!(m.stats_key(), "wild.tier");
}

#[test]
fn nested_wildcard() {
    let c = load("ok/wildcard.yaml");
    let entries = [("group", "g1"), ("path", "/x2")];
    let m = limit(&c, "wild", &entries);
    assert_eq!((m.rule.requests_per_unit, m.rule.unit), (10, Unit::Day));
    assert_eq!(m.stats_key(), "wild.group_g1.path_/x*");
    assert_eq!(
        m.metric_keys(),
        ("group_g1".to_owned(), Some("path_/x*".to_owned()))
    );
}

#[test]
fn metadata_is_json() {
    let c = load("ok/metadata.yaml");
    let m = limit(&c, "meta", &[("api", "v1"), ("method", "GET")]);
    let md = serde_json::Value::Object(m.metadata().cloned().unwrap_or_default());
    assert_eq!(
        md,
        json!({"name": "service_a", "weight": 2, "ratio": 0.5, "tags": ["read", "cheap"], "1": "one"})
    );
    let m = limit(&c, "meta", &[("quota", "q")]);
    assert!(m.rule.quota_mode);
    let md = serde_json::Value::Object(m.rule.metadata.clone().unwrap_or_default());
    assert_eq!(md, json!({"owner": {"team": "payments", "page": true}}));
}

#[test]
fn domains_merge_when_asked() {
    let opts = LoadOptions::default().merge_domains(true);
    let c = RateLimitConfig::load_path(&fixture("merge"), &opts).expect("merged");
    assert_eq!(c.domains().collect::<Vec<_>>(), ["merged"]);
    assert_eq!(
        limit(&c, "merged", &[("tenant", "t1")])
            .rule
            .requests_per_unit,
        10
    );
    assert_eq!(
        limit(&c, "merged", &[("client", "c1")])
            .rule
            .requests_per_unit,
        20
    );
}

#[test]
fn domains_in_two_files_are_an_error_without_merge() {
    let err = RateLimitConfig::load_path(&fixture("merge"), &LoadOptions::default()).unwrap_err();
    assert!(err.file().ends_with("b_clients.yaml"), "{err}");
    assert_eq!((err.line(), err.column()), (Some(1), Some(9)));
    match err.kind() {
        ConfigErrorKind::DuplicateDomain { domain, first_file } => {
            assert_eq!(domain, "merged");
            assert!(first_file.ends_with("a_tenants.yaml"));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn merged_domains_still_refuse_a_descriptor_defined_twice() {
    let opts = LoadOptions::default().merge_domains(true);
    let err = RateLimitConfig::load_path(&fixture("merge_dup"), &opts).unwrap_err();
    assert!(err.file().ends_with("b.yaml"), "{err}");
    assert_eq!((err.line(), err.column()), (Some(6), Some(10)));
    assert_eq!(
        err.kind(),
        &ConfigErrorKind::DuplicateKey {
            path: "merged.tenant_t1".to_owned()
        }
    );
}

#[test]
fn json_dump_lists_domains_and_descriptors() {
    let c = load("ok/shadow.yaml");
    let v = serde_json::to_value(&c).expect("serializes");
    let d = &v["domains"][0];
    assert_eq!(d["domain"], "shadow");
    assert_eq!(d["descriptors"][0]["key"], "app");
    assert_eq!(d["descriptors"][0]["value"], "web");
    let route = &d["descriptors"][0]["descriptors"][1];
    assert_eq!(route["rate_limit"]["requests_per_unit"], 10);
    assert_eq!(route["rate_limit"]["unit"], "second");
    assert_eq!(route["rate_limit"]["shadow_mode"], true);
    // An unlimited rule has no unit; a deny rule keeps its 0.
    let c = load("ok/basic.yaml");
    let v = serde_json::to_value(&c).expect("serializes");
    let find = |key: &str| {
        v["domains"][0]["descriptors"]
            .as_array()
            .and_then(|a| a.iter().find(|d| d["key"] == key))
            .map(|d| d["rate_limit"].clone())
            .unwrap_or_default()
    };
    let flags = json!({"shadow_mode": false, "quota_mode": false, "detailed_metric": false});
    let with_flags = |mut v: serde_json::Value| {
        if let (Some(o), Some(f)) = (v.as_object_mut(), flags.as_object()) {
            o.extend(f.clone());
        }
        v
    };
    assert_eq!(find("health"), with_flags(json!({"unlimited": true})));
    assert_eq!(
        find("blocked"),
        with_flags(json!({"unit": "second", "requests_per_unit": 0, "unlimited": false}))
    );
    assert_eq!(
        find("plan"),
        with_flags(
            json!({"unit": "day", "requests_per_unit": 1, "unlimited": false, "name": "plan_daily"})
        )
    );
}

#[test]
fn match_debug_hides_request_values() {
    let c = load("ok/basic.yaml");
    let m = limit(&c, "shop", &[("client", "sk-live-secret")]);
    let shown = format!("{m:?}");
    assert!(shown.contains("client"), "{shown}");
    assert!(!shown.contains("sk-live-secret"), "{shown}");
}

#[test]
fn a_directory_loads_its_yaml_files_in_name_order() {
    let c = load("ok");
    assert_eq!(
        c.domains().collect::<Vec<_>>(),
        ["meta", "metrics", "shadow", "share", "shop", "wild"]
    );
}
