//! YAML 1.1 scalars as the reference (yaml.v2) reads them, quoted and unquoted.

use ratekeeper_rls::config::{ConfigErrorKind, LoadOptions, Lookup, RateLimitConfig};

fn one(yaml: &str) -> Result<RateLimitConfig, ratekeeper_rls::config::ConfigError> {
    RateLimitConfig::from_sources([("t.yaml", yaml)], &LoadOptions::default())
}

fn rule_with(flag_line: &str) -> String {
    format!(
        "domain: d\ndescriptors:\n  - key: k\n    {flag_line}\n    rate_limit: {{unit: second, requests_per_unit: 1}}\n"
    )
}

fn shadow(yaml: &str) -> bool {
    let c = one(yaml).expect("loads");
    match c.lookup("d", &[("k", "v")]) {
        Lookup::Limit(m) => m.rule.shadow_mode,
        other => panic!("{other:?}"),
    }
}

#[test]
fn unquoted_yaml_1_1_booleans_are_booleans() {
    for t in ["true", "True", "TRUE", "yes", "Yes", "on", "ON", "y", "Y"] {
        assert!(shadow(&rule_with(&format!("shadow_mode: {t}"))), "{t}");
    }
    for f in ["false", "no", "off", "n", "N", "~", ""] {
        assert!(!shadow(&rule_with(&format!("shadow_mode: {f}"))), "{f}");
    }
}

#[test]
fn quoted_booleans_are_strings_and_refused_for_a_bool_field() {
    for q in ["'true'", "\"yes\"", "'on'"] {
        let e = one(&rule_with(&format!("shadow_mode: {q}"))).unwrap_err();
        assert!(
            matches!(
                e.kind(),
                ConfigErrorKind::WrongType {
                    field: "shadow_mode",
                    ..
                }
            ),
            "{q}: {e}"
        );
        assert_eq!((e.line(), e.column()), (Some(4), Some(18)));
    }
}

#[test]
fn a_string_field_takes_any_scalar_as_written() {
    // Unquoted yes/on/010/0x1F are bool/int in YAML 1.1, but a value is a string: the text.
    for (written, value) in [
        ("yes", "yes"),
        ("on", "on"),
        ("010", "010"),
        ("0x1F", "0x1F"),
        ("1_000", "1_000"),
        ("'1.5'", "1.5"),
        ("\"yes\"", "yes"),
        ("2026-01-01", "2026-01-01"),
    ] {
        let yaml = format!(
            "domain: d\ndescriptors:\n  - key: k\n    value: {written}\n    rate_limit: {{unit: second, requests_per_unit: 1}}\n"
        );
        let c = one(&yaml).unwrap_or_else(|e| panic!("{written}: {e}"));
        assert!(
            matches!(c.lookup("d", &[("k", value)]), Lookup::Limit(_)),
            "{written} should be the value {value:?}"
        );
    }
}

#[test]
fn unquoted_floats_are_refused_outside_metadata() {
    for f in ["1.5", "1e3", ".5", "-0.0", ".inf", ".NaN", "08"] {
        let yaml = format!("domain: d\ndescriptors:\n  - key: k\n    value: {f}\n");
        let e = one(&yaml).unwrap_err();
        assert!(
            matches!(
                e.kind(),
                ConfigErrorKind::InvalidLeaf { found: "float", .. }
            ),
            "{f}: {e}"
        );
    }
}

#[test]
fn integers_in_yaml_1_1_forms_for_requests_per_unit() {
    for (written, n) in [
        ("10", 10),
        ("0x10", 16),
        ("010", 8),
        ("1_000", 1000),
        ("+5", 5),
        ("0b11", 3),
    ] {
        let yaml = format!(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{unit: second, requests_per_unit: {written}}}\n"
        );
        let c = one(&yaml).unwrap_or_else(|e| panic!("{written}: {e}"));
        let Lookup::Limit(m) = c.lookup("d", &[("k", "v")]) else {
            panic!("{written}")
        };
        assert_eq!(m.rule.requests_per_unit, n, "{written}");
    }
}

#[test]
fn a_bool_key_is_not_a_string() {
    // `on:` is a boolean key in YAML 1.1, so the key check refuses it.
    let e = one("domain: d\non: 1\n").unwrap_err();
    assert_eq!(
        e.kind(),
        &ConfigErrorKind::NonStringKey {
            key: "on".to_owned()
        }
    );
    assert_eq!((e.line(), e.column()), (Some(2), Some(1)));
}

#[test]
fn anchors_aliases_and_merge_keys() {
    let yaml = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: &rl {unit: minute, requests_per_unit: 5}\n  - key: b\n    rate_limit:\n      <<: *rl\n      requests_per_unit: 7\n";
    let c = one(yaml).expect("loads");
    let Lookup::Limit(a) = c.lookup("d", &[("a", "x")]) else {
        panic!()
    };
    let Lookup::Limit(b) = c.lookup("d", &[("b", "x")]) else {
        panic!()
    };
    assert_eq!(a.rule.requests_per_unit, 5);
    assert_eq!(b.rule.requests_per_unit, 7);
    assert_eq!(b.rule.unit, a.rule.unit);
}

#[test]
fn tagged_str_is_a_string() {
    let yaml = "domain: d\ndescriptors:\n  - key: k\n    value: !!str 1.5\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
    let c = one(yaml).expect("loads");
    assert!(matches!(c.lookup("d", &[("k", "1.5")]), Lookup::Limit(_)));
}

#[test]
fn misplaced_keys_load_with_a_warning() {
    // `requests_per_unit` beside `rate_limit` is in the allow-list, so it loads (as in the
    // reference), but it has no effect there: a warning says so.
    let yaml = "domain: d\ndescriptors:\n  - key: k\n    requests_per_unit: 5\n    rate_limit: {unit: second}\n";
    let c = one(yaml).expect("loads");
    let w = c.warnings();
    assert_eq!(w.len(), 1, "{w:?}");
    assert_eq!(
        w[0].position,
        Some(ratekeeper_rls::config::Position { line: 4, column: 5 })
    );
    assert!(
        w[0].to_string()
            .starts_with("t.yaml:4:5: 'requests_per_unit'"),
        "{}",
        w[0]
    );
    let Lookup::Limit(m) = c.lookup("d", &[("k", "v")]) else {
        panic!()
    };
    assert_eq!(m.rule.requests_per_unit, 0);
}

#[test]
fn an_empty_file_has_no_domain() {
    let e = one("").unwrap_err();
    assert_eq!(e.kind(), &ConfigErrorKind::EmptyDomain);
    assert_eq!((e.line(), e.column()), (Some(1), Some(1)));
}
