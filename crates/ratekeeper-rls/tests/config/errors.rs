//! Every negative case: the reference's negative fixtures (`TestEmptyDomain`,
//! `TestDuplicateKey`, `TestBadLimitUnit`, ...) and the type errors of its second parse, each
//! with the exact error kind and its `line:column`.

use ratekeeper_rls::config::{ConfigError, ConfigErrorKind, LoadOptions, RateLimitConfig};

use super::fixture;

/// Loads `bad/<name>`, which must fail, and checks the file, line and column.
fn err(name: &str, line: u32, column: u32) -> ConfigError {
    let path = fixture(&format!("bad/{name}"));
    let e = match RateLimitConfig::load_path(&path, &LoadOptions::default()) {
        Ok(c) => panic!("{name} loaded: {c:?}"),
        Err(e) => e,
    };
    assert_eq!(e.file(), path.display().to_string());
    assert_eq!((e.line(), e.column()), (Some(line), Some(column)), "{e}");
    assert!(
        e.to_string()
            .starts_with(&format!("{}:{line}:{column}: ", path.display())),
        "{e}"
    );
    e
}

fn wrong_type(e: &ConfigError, want_field: &str) {
    match e.kind() {
        ConfigErrorKind::WrongType { field, .. } => assert_eq!(*field, want_field, "{e}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn empty_domain() {
    assert_eq!(
        err("empty_domain.yaml", 1, 9).kind(),
        &ConfigErrorKind::EmptyDomain
    );
}

#[test]
fn missing_domain() {
    assert_eq!(
        err("no_domain.yaml", 1, 1).kind(),
        &ConfigErrorKind::EmptyDomain
    );
}

#[test]
fn domain_not_a_string() {
    wrong_type(&err("domain_not_a_string.yaml", 2, 3), "domain");
}

#[test]
fn empty_key() {
    assert_eq!(
        err("empty_key.yaml", 3, 10).kind(),
        &ConfigErrorKind::EmptyKey
    );
}

#[test]
fn missing_key() {
    assert_eq!(
        err("missing_key.yaml", 3, 5).kind(),
        &ConfigErrorKind::EmptyKey
    );
}

#[test]
fn duplicate_key() {
    assert_eq!(
        err("duplicate_key.yaml", 6, 10).kind(),
        &ConfigErrorKind::DuplicateKey {
            path: "shop.tenant_acme".to_owned()
        }
    );
}

#[test]
fn duplicate_default_key_nested() {
    assert_eq!(
        err("duplicate_default_key_nested.yaml", 6, 14).kind(),
        &ConfigErrorKind::DuplicateKey {
            path: "shop.a.b".to_owned()
        }
    );
}

#[test]
fn bad_limit_unit() {
    assert_eq!(
        err("bad_unit.yaml", 5, 13).kind(),
        &ConfigErrorKind::InvalidUnit {
            unit: "fortnight".to_owned()
        }
    );
}

#[test]
fn unknown_is_not_a_unit() {
    assert_eq!(
        err("unknown_unit.yaml", 5, 13).kind(),
        &ConfigErrorKind::InvalidUnit {
            unit: "unknown".to_owned()
        }
    );
}

#[test]
fn missing_unit() {
    assert_eq!(
        err("missing_unit.yaml", 5, 7).kind(),
        &ConfigErrorKind::InvalidUnit {
            unit: String::new()
        }
    );
}

#[test]
fn unlimited_with_unit() {
    assert_eq!(
        err("unlimited_with_unit.yaml", 6, 13).kind(),
        &ConfigErrorKind::UnlimitedWithUnit
    );
}

#[test]
fn replaces_self() {
    assert_eq!(
        err("replaces_self.yaml", 10, 17).kind(),
        &ConfigErrorKind::ReplacesSelf {
            name: "mine".to_owned()
        }
    );
}

#[test]
fn replaces_empty() {
    assert_eq!(
        err("replaces_empty.yaml", 9, 17).kind(),
        &ConfigErrorKind::EmptyReplaces
    );
}

#[test]
fn replaces_without_name() {
    assert_eq!(
        err("replaces_no_name.yaml", 8, 11).kind(),
        &ConfigErrorKind::EmptyReplaces
    );
}

#[test]
fn bad_yaml() {
    let e = err("bad_yaml.yaml", 5, 1);
    assert!(e.is_syntax(), "{e}");
    assert!(matches!(e.kind(), ConfigErrorKind::Syntax { .. }));
}

#[test]
fn misspelled_key() {
    assert_eq!(
        err("unknown_key.yaml", 4, 5).kind(),
        &ConfigErrorKind::UnknownKey {
            key: "ratelimit".to_owned()
        }
    );
}

#[test]
fn misspelled_nested_key() {
    assert_eq!(
        err("unknown_key_nested.yaml", 6, 7).kind(),
        &ConfigErrorKind::UnknownKey {
            key: "requestsperunit".to_owned()
        }
    );
}

#[test]
fn non_string_key() {
    assert_eq!(
        err("non_string_key.yaml", 6, 7).kind(),
        &ConfigErrorKind::NonStringKey {
            key: "0.25".to_owned()
        }
    );
}

#[test]
fn non_map_list_element() {
    assert_eq!(
        err("non_map_list.yaml", 4, 5).kind(),
        &ConfigErrorKind::NonMapListElement {
            element: "b".to_owned()
        }
    );
}

#[test]
fn float_leaf() {
    assert_eq!(
        err("float_leaf.yaml", 4, 12).kind(),
        &ConfigErrorKind::InvalidLeaf {
            value: "1.5".to_owned(),
            found: "float"
        }
    );
}

#[test]
fn share_threshold_without_wildcard() {
    assert_eq!(
        err("share_without_wildcard.yaml", 5, 22).kind(),
        &ConfigErrorKind::ShareThresholdWithoutWildcard {
            value: "exact".to_owned()
        }
    );
}

#[test]
fn quoted_requests_per_unit() {
    wrong_type(
        &err("quoted_requests_per_unit.yaml", 4, 52),
        "requests_per_unit",
    );
}

#[test]
fn negative_requests_per_unit() {
    wrong_type(
        &err("negative_requests_per_unit.yaml", 4, 52),
        "requests_per_unit",
    );
}

#[test]
fn requests_per_unit_above_u32() {
    wrong_type(
        &err("too_large_requests_per_unit.yaml", 4, 52),
        "requests_per_unit",
    );
}

#[test]
fn quoted_bool() {
    wrong_type(&err("quoted_bool.yaml", 4, 18), "shadow_mode");
}

#[test]
fn rate_limit_not_a_map() {
    wrong_type(&err("rate_limit_not_a_map.yaml", 4, 17), "rate_limit");
}

#[test]
fn descriptors_not_a_list() {
    wrong_type(&err("descriptors_not_a_list.yaml", 3, 3), "descriptors");
}

#[test]
fn root_is_a_list() {
    wrong_type(&err("root_is_a_list.yaml", 1, 1), "the file");
}

#[test]
fn repeated_map_key() {
    assert_eq!(
        err("repeated_map_key.yaml", 4, 5).kind(),
        &ConfigErrorKind::DuplicateMapKey {
            key: "key".to_owned()
        }
    );
}

#[test]
fn two_documents() {
    let e = err("two_documents.yaml", 2, 1);
    assert_eq!(e.kind(), &ConfigErrorKind::SeveralDocuments);
    assert!(e.is_syntax());
}

#[test]
fn metadata_nan() {
    assert!(matches!(
        err("metadata_nan.yaml", 4, 20).kind(),
        ConfigErrorKind::InvalidMetadata { .. }
    ));
}

#[test]
fn missing_path_is_an_io_error_without_position() {
    let path = fixture("bad/does-not-exist");
    let e = RateLimitConfig::load_path(&path, &LoadOptions::default()).unwrap_err();
    assert!(e.is_io());
    assert_eq!(e.line(), None);
    assert!(
        e.to_string()
            .starts_with(&format!("{}: cannot read", path.display()))
    );
}

#[test]
fn check_path_reports_every_file() {
    let errors = RateLimitConfig::check_path(&fixture("bad"), &LoadOptions::default())
        .expect_err("the bad fixtures do not load");
    // One error per fixture file (each has exactly one problem).
    let files = std::fs::read_dir(fixture("bad"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(errors.len(), files, "{errors:#?}");
}
