//! One test per row of the `ratekeeper_rls::compat` table: each difference from
//! envoyproxy/ratelimit, shown on a config that behaves differently there.

use std::fs;

use ratekeeper_rls::config::{ConfigError, ConfigErrorKind, LoadOptions, Lookup, RateLimitConfig};

fn one(yaml: &str) -> Result<RateLimitConfig, ConfigError> {
    RateLimitConfig::from_sources([("t.yaml", yaml)], &LoadOptions::default())
}

fn rpu(c: &RateLimitConfig, entries: &[(&str, &str)]) -> Option<u32> {
    c.lookup("d", entries)
        .into_match()
        .map(|m| m.rule.requests_per_unit)
}

#[test]
fn c1_entries_match_structurally() {
    // The reference looks (a, b) up as "a_b" first, which hits `key: a_b`.
    let c = one("domain: d\ndescriptors:\n  - key: a_b\n    rate_limit: {unit: second, requests_per_unit: 1}\n").unwrap();
    assert_eq!(rpu(&c, &[("a", "b")]), None);
    assert_eq!(rpu(&c, &[("a_b", "anything")]), Some(1));
}

#[test]
fn c2_no_duplicate_through_the_join() {
    let c = one("domain: d\ndescriptors:\n  - key: a_b\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: a\n    value: b\n    rate_limit: {unit: second, requests_per_unit: 2}\n").unwrap();
    assert_eq!(rpu(&c, &[("a_b", "x")]), Some(1));
    assert_eq!(rpu(&c, &[("a", "b")]), Some(2));
}

#[test]
fn c3_star_in_a_key_is_literal() {
    let c = one("domain: d\ndescriptors:\n  - key: \"a*\"\n    rate_limit: {unit: second, requests_per_unit: 1}\n").unwrap();
    assert_eq!(rpu(&c, &[("abc", "x")]), None);
    assert_eq!(rpu(&c, &[("a*", "x")]), Some(1));
    let e = one("domain: d\ndescriptors:\n  - key: \"a*\"\n    value: v\n    share_threshold: true\n    rate_limit: {unit: second, requests_per_unit: 1}\n").unwrap_err();
    assert_eq!(
        e.kind(),
        &ConfigErrorKind::ShareThresholdWithoutWildcard {
            value: "v".to_owned()
        }
    );
}

#[test]
fn c5_repeated_map_key_is_an_error() {
    let e = one("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n    rate_limit: {unit: hour, requests_per_unit: 1}\n").unwrap_err();
    assert_eq!(
        e.kind(),
        &ConfigErrorKind::DuplicateMapKey {
            key: "rate_limit".to_owned()
        }
    );
    assert_eq!((e.line(), e.column()), (Some(5), Some(5)));
}

#[test]
fn c6_second_document_is_an_error() {
    let e = one("domain: d\n---\ndomain: e\n").unwrap_err();
    assert_eq!(e.kind(), &ConfigErrorKind::SeveralDocuments);
    assert_eq!(e.line(), Some(2));
}

#[test]
fn c7_only_yaml_files_of_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path();
    let rule = |d: &str| format!("domain: {d}\ndescriptors: []\n");
    fs::write(p.join("a.yaml"), rule("a")).unwrap();
    fs::write(p.join("b.YML"), rule("b")).unwrap();
    fs::write(p.join("c.json"), rule("c")).unwrap();
    fs::write(p.join("a.yaml~"), rule("backup")).unwrap();
    fs::write(p.join(".hidden.yaml"), rule("hidden")).unwrap();
    fs::create_dir(p.join("sub")).unwrap();
    fs::write(p.join("sub/d.yaml"), rule("d")).unwrap();
    let c = RateLimitConfig::load_path(p, &LoadOptions::default()).unwrap();
    assert_eq!(c.domains().collect::<Vec<_>>(), ["a", "b", "hidden"]);
    let warned: Vec<_> = c.warnings().iter().map(|w| w.file.clone()).collect();
    assert_eq!(warned.len(), 2, "{warned:?}");
    assert!(warned.iter().any(|f| f.ends_with("c.json")));
    assert!(warned.iter().any(|f| f.ends_with("a.yaml~")));
    // RUNTIME_IGNOREDOTFILES skips the dot file.
    let c = RateLimitConfig::load_path(p, &LoadOptions::default().ignore_dotfiles(true)).unwrap();
    assert_eq!(c.domains().collect::<Vec<_>>(), ["a", "b"]);
}

#[test]
fn c8_files_load_in_name_order() {
    let dir = tempfile::tempdir().unwrap();
    // Written in the other order: the error still names b.yaml as the second.
    fs::write(dir.path().join("b.yaml"), "domain: same\n").unwrap();
    fs::write(dir.path().join("a.yaml"), "domain: same\n").unwrap();
    let e = RateLimitConfig::load_path(dir.path(), &LoadOptions::default()).unwrap_err();
    assert!(e.file().ends_with("b.yaml"), "{e}");
    assert!(
        matches!(e.kind(), ConfigErrorKind::DuplicateDomain { first_file, .. } if first_file.ends_with("a.yaml")),
        "{e}"
    );
    assert!(e.to_string().contains("a.yaml"), "{e}");
}

#[test]
fn c9_non_finite_metadata_is_an_error() {
    let e = one("domain: d\ndescriptors:\n  - key: a\n    metadata: {w: .inf}\n    rate_limit: {unit: second, requests_per_unit: 1}\n").unwrap_err();
    assert!(
        matches!(e.kind(), ConfigErrorKind::InvalidMetadata { .. }),
        "{e}"
    );
    assert_eq!((e.line(), e.column()), (Some(4), Some(19)));
}

#[test]
fn c10_dots_stay_in_their_label() {
    let c = one("domain: d\ndescriptors:\n  - key: host\n    value_to_metric: true\n    descriptors:\n      - key: path\n        rate_limit: {unit: second, requests_per_unit: 1}\n").unwrap();
    let entries = [("host", "api.example.com"), ("path", "/")];
    let Lookup::Limit(m) = c.lookup("d", &entries) else {
        panic!()
    };
    // The reference's split of "d.host_api.example.com.path" would give "host_api", "example".
    assert_eq!(m.stats_key(), "d.host_api.example.com.path");
    assert_eq!(
        m.metric_keys(),
        ("host_api.example.com".to_owned(), Some("path".to_owned()))
    );
}

#[test]
fn c11_counter_keys_are_unambiguous() {
    let c = one("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: a_b\n    rate_limit: {unit: second, requests_per_unit: 2}\n").unwrap();
    // The reference's keys are both "d_a_b_c_<window>".
    let e1 = [("a", "b_c")];
    let e2 = [("a_b", "c")];
    let m1 = c.lookup("d", &e1).into_match().unwrap();
    let m2 = c.lookup("d", &e2).into_match().unwrap();
    assert_eq!(
        (m1.rule.requests_per_unit, m2.rule.requests_per_unit),
        (1, 2)
    );
    assert_ne!(m1.counter_key(), m2.counter_key());
    assert_eq!(m1.counter_key(), "1:d1:a3:b_c");
}
