//! `algorithm` and `period` in a config file: what loads, what is reported, and the errors
//! (with file, line and column).

use std::time::Duration;

use ratekeeper_rls::config::{
    Algorithm, ConfigErrorKind, LoadOptions, Lookup, RateLimitConfig, Unit,
};

fn load(rate_limit: &str) -> Result<RateLimitConfig, ratekeeper_rls::config::ConfigError> {
    let yaml = format!("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {rate_limit}\n");
    RateLimitConfig::from_sources([("d.yaml", yaml.as_str())], &LoadOptions::default())
}

fn rule(rate_limit: &str) -> ratekeeper_rls::config::RateLimitRule {
    let config = load(rate_limit).expect("the config loads");
    let Lookup::Limit(m) = config.lookup("d", &[("k", "v")]) else {
        panic!("no limit")
    };
    m.rule.clone()
}

#[test]
fn without_the_extensions_a_rule_is_the_references_fixed_window() {
    let r = rule("{unit: minute, requests_per_unit: 10}");
    assert_eq!(r.algorithm, Algorithm::FixedWindow);
    assert_eq!(
        (r.period, r.period_secs(), r.unit),
        (None, 60, Unit::Minute)
    );
}

#[test]
fn every_algorithm_name_loads_in_any_case_with_underscores_or_dashes() {
    for (name, algorithm) in [
        ("fixed_window", Algorithm::FixedWindow),
        ("gcra", Algorithm::Gcra),
        ("Sliding_Window", Algorithm::SlidingWindow),
        ("sliding-log", Algorithm::SlidingLog),
        ("LEAKY_BUCKET", Algorithm::LeakyBucket),
    ] {
        let r = rule(&format!(
            "{{unit: second, requests_per_unit: 3, algorithm: {name}}}"
        ));
        assert_eq!(r.algorithm, algorithm, "{name}");
    }
}

#[test]
fn a_period_alone_reports_the_shortest_unit_that_covers_it() {
    for (period, secs, unit) in [
        ("10s", 10, Unit::Minute),
        ("1", 1, Unit::Second),
        ("90", 90, Unit::Hour),
        ("5m", 300, Unit::Hour),
        ("1h", 3_600, Unit::Hour),
        ("2d", 172_800, Unit::Week),
        ("365d", 31_536_000, Unit::Year),
    ] {
        let r = rule(&format!("{{period: {period}, requests_per_unit: 100}}"));
        assert_eq!(r.period, Some(Duration::from_secs(secs)), "{period}");
        assert_eq!((r.period_secs(), r.unit), (secs, unit), "{period}");
        assert_eq!(r.requests_per_unit, 100);
    }
}

#[test]
fn a_period_with_the_same_unit_loads() {
    let r = rule("{unit: minute, period: 60s, requests_per_unit: 10}");
    assert_eq!((r.period_secs(), r.unit), (60, Unit::Minute));
}

fn error(rate_limit: &str) -> (String, ConfigErrorKind) {
    let e = load(rate_limit).expect_err("the config is refused");
    (e.to_string(), e.kind().clone())
}

#[test]
fn an_unknown_algorithm_is_an_error_at_its_value() {
    let (text, kind) = error("{unit: minute, requests_per_unit: 1, algorithm: concurrency}");
    assert!(
        matches!(kind, ConfigErrorKind::InvalidAlgorithm { algorithm } if algorithm == "concurrency")
    );
    assert!(
        text.starts_with("d.yaml:4:65: invalid rate limit algorithm 'concurrency'"),
        "{text}"
    );
}

#[test]
fn a_bad_period_is_an_error_at_its_value() {
    for (period, col) in [
        ("0s", 26),
        ("10ms", 26),
        ("1.5s", 26),
        ("366d", 26),
        ("x", 26),
        ("''", 26),
    ] {
        let (text, kind) = error(&format!("{{period: {period}, requests_per_unit: 1}}"));
        assert!(
            matches!(kind, ConfigErrorKind::InvalidPeriod { .. }),
            "{period}: {text}"
        );
        assert!(
            text.starts_with(&format!("d.yaml:4:{col}: invalid rate limit period")),
            "{period}: {text}"
        );
    }
}

#[test]
fn a_period_that_disagrees_with_the_unit_is_an_error_at_the_period() {
    let (text, kind) = error("{unit: minute, period: 10s, requests_per_unit: 1}");
    assert_eq!(
        kind,
        ConfigErrorKind::PeriodUnitMismatch {
            period_secs: 10,
            unit: "minute".to_owned(),
            unit_secs: 60
        }
    );
    assert!(
        text.starts_with("d.yaml:4:40: period 10s and unit 'minute' (60s) disagree"),
        "{text}"
    );
}

#[test]
fn neither_unit_nor_period_is_the_references_unit_error() {
    let (_, kind) = error("{requests_per_unit: 1, algorithm: gcra}");
    assert!(matches!(kind, ConfigErrorKind::InvalidUnit { unit } if unit.is_empty()));
}

#[test]
fn rlconfig_json_shows_the_extensions_only_when_given() {
    let plain = serde_json::to_value(rule("{unit: minute, requests_per_unit: 10}")).unwrap();
    assert!(plain.get("algorithm").is_none() && plain.get("period").is_none());
    let ext = serde_json::to_value(rule(
        "{period: 10s, requests_per_unit: 10, algorithm: sliding_log}",
    ))
    .unwrap();
    assert_eq!(ext["algorithm"], "sliding_log");
    assert_eq!(ext["period"], "10s");
    assert_eq!(ext["unit"], "minute");
}

#[test]
fn header_format_and_problem_details_settings() {
    use ratekeeper_rls::settings::{HeaderFormat, Settings, SettingsError};
    let parse = |args: &[&str], vars: &'static [(&'static str, &'static str)]| {
        let mut all = vec!["ratekeeper-rls"];
        all.extend_from_slice(args);
        Settings::parse(all, move |name: &str| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        })
    };
    let (s, _) = parse(&[], &[]).unwrap();
    assert_eq!(s.response_headers_format, HeaderFormat::Reference);
    assert!(!s.problem_details);
    let (s, _) = parse(
        &[],
        &[
            ("LIMIT_RESPONSE_HEADERS_FORMAT", "IETF"),
            ("OVER_LIMIT_PROBLEM_DETAILS", "true"),
        ],
    )
    .unwrap();
    assert_eq!(s.response_headers_format, HeaderFormat::Ietf);
    assert!(s.problem_details);
    let (s, _) = parse(
        &["--response-headers-format", "both", "--problem-details"],
        &[("LIMIT_RESPONSE_HEADERS_FORMAT", "ietf")],
    )
    .unwrap();
    assert_eq!(s.response_headers_format, HeaderFormat::Both);
    assert!(s.problem_details);
    let e = parse(&[], &[("LIMIT_RESPONSE_HEADERS_FORMAT", "draft-03")]).unwrap_err();
    assert!(
        matches!(
            e,
            SettingsError::InvalidEnv {
                name: "LIMIT_RESPONSE_HEADERS_FORMAT",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn charging_is_a_root_key_per_domain() {
    use ratekeeper_rls::config::Charging;
    let file = |charging: &str| {
        format!(
            "domain: d\n{charging}descriptors:\n  - key: k\n    rate_limit: {{unit: second, requests_per_unit: 1}}\n"
        )
    };
    let load =
        |yaml: &str| RateLimitConfig::from_sources([("d.yaml", yaml)], &LoadOptions::default());
    assert_eq!(
        load(&file("")).unwrap().charging("d"),
        Charging::PerDescriptor
    );
    let aon = load(&file("charging: all_or_nothing\n")).unwrap();
    assert_eq!(aon.charging("d"), Charging::AllOrNothing);
    assert_eq!(aon.charging("other"), Charging::PerDescriptor);
    assert_eq!(
        serde_json::to_value(&aon).unwrap()["domains"][0]["charging"],
        "all_or_nothing"
    );
    assert_eq!(
        load(&file("charging: per_descriptor\n"))
            .unwrap()
            .charging("d"),
        Charging::PerDescriptor
    );
    let e = load(&file("charging: all\n")).unwrap_err();
    assert!(matches!(e.kind(), ConfigErrorKind::InvalidCharging { charging } if charging == "all"));
    assert_eq!((e.line(), e.column()), (Some(2), Some(11)));
    // Merged files: all-or-nothing when any of them says so.
    let merged = RateLimitConfig::from_sources(
        [
            ("a.yaml", file("charging: all_or_nothing\n").as_str()),
            ("b.yaml", "domain: d\ndescriptors:\n  - key: j\n    rate_limit: {unit: second, requests_per_unit: 1}\n"),
        ],
        &LoadOptions::default().merge_domains(true),
    )
    .unwrap();
    assert_eq!(merged.charging("d"), Charging::AllOrNothing);
}

#[test]
fn on_store_failure_per_limit_and_its_default() {
    use ratekeeper_rls::config::OnStoreFailure;
    use ratekeeper_rls::settings::{Settings, SettingsError};
    for (text, want) in [
        ("unavailable", OnStoreFailure::Unavailable),
        ("allow", OnStoreFailure::Allow),
        ("DENY", OnStoreFailure::Deny),
        ("fail-soft", OnStoreFailure::FailSoft),
    ] {
        let r = rule(&format!(
            "{{unit: second, requests_per_unit: 1, on_store_failure: {text}}}"
        ));
        assert_eq!(r.on_store_failure, Some(want), "{text}");
    }
    assert_eq!(
        rule("{unit: second, requests_per_unit: 1}").on_store_failure,
        None
    );
    let (text, kind) = error("{unit: second, requests_per_unit: 1, on_store_failure: open}");
    assert!(matches!(kind, ConfigErrorKind::InvalidStoreFailure { value } if value == "open"));
    assert!(
        text.starts_with("d.yaml:4:72: invalid on_store_failure 'open'"),
        "{text}"
    );
    let parse = |args: Vec<&str>, var: Option<&'static str>| {
        Settings::parse(args, move |name: &str| {
            (name == "ON_STORE_FAILURE")
                .then(|| var.map(str::to_owned))
                .flatten()
        })
    };
    assert_eq!(
        parse(vec!["rls"], None).unwrap().0.on_store_failure,
        OnStoreFailure::Unavailable
    );
    assert_eq!(
        parse(vec!["rls"], Some("fail_soft"))
            .unwrap()
            .0
            .on_store_failure,
        OnStoreFailure::FailSoft
    );
    assert_eq!(
        parse(vec!["rls", "--on-store-failure", "allow"], Some("deny"))
            .unwrap()
            .0
            .on_store_failure,
        OnStoreFailure::Allow
    );
    assert!(matches!(
        parse(vec!["rls"], Some("maybe")).unwrap_err(),
        SettingsError::InvalidEnv {
            name: "ON_STORE_FAILURE",
            ..
        }
    ));
}
