//! `share_threshold` (the reference's `TestShareThreshold`), `value_to_metric` and
//! `detailed_metric`: which values share a counter, and the stats keys.

use ratekeeper_rls::config::Unit;

use super::{limit, load, no_limit};

#[test]
fn shared_wildcard_gives_one_counter_for_all_matches() {
    let c = load("ok/share_threshold.yaml");
    let keys: Vec<_> = ["docs/a.pdf", "docs/b.csv", "docs/c.txt"]
        .iter()
        .map(|v| {
            let entries = [("file", *v)];
            let m = limit(&c, "share", &entries);
            assert_eq!((m.rule.requests_per_unit, m.rule.unit), (100, Unit::Minute));
            assert_eq!(m.stats_key(), "share.file_docs/*");
            assert_eq!(m.shared_pattern(0), Some("docs/*"));
            m.counter_key()
        })
        .collect();
    assert!(keys.windows(2).all(|w| w[0] == w[1]), "{keys:?}");
    no_limit(&c, "share", &[("file", "img/a.png")]);
}

#[test]
fn exact_value_beats_a_shared_wildcard_and_counts_apart() {
    let c = load("ok/share_threshold.yaml");
    let bob = limit(&c, "share", &[("user", "bob")]);
    assert_eq!(bob.rule.requests_per_unit, 50);
    assert_eq!(bob.shared_pattern(0), None);
    let bill = limit(&c, "share", &[("user", "bill")]);
    let ben = limit(&c, "share", &[("user", "ben")]);
    assert_eq!(bill.rule.requests_per_unit, 100);
    assert_eq!(bill.counter_key(), ben.counter_key());
    assert_ne!(bill.counter_key(), bob.counter_key());
    assert_eq!(bill.stats_key(), "share.user_b*");
}

#[test]
fn shared_middle_and_multiple_wildcards() {
    let c = load("ok/share_threshold.yaml");
    let a = limit(&c, "share", &[("route", "/v1/items")]);
    let b = limit(&c, "share", &[("route", "/v22/items")]);
    assert_eq!(a.rule.requests_per_unit, 3);
    assert_eq!(a.counter_key(), b.counter_key());
    assert_eq!(a.stats_key(), "share.route_/v*/items");
    no_limit(&c, "share", &[("route", "/v1/other")]);
    let a = limit(&c, "share", &[("svc", "a1b2c")]);
    let b = limit(&c, "share", &[("svc", "abc")]);
    assert_eq!(a.counter_key(), b.counter_key());
    no_limit(&c, "share", &[("svc", "ab")]);
}

#[test]
fn wildcard_without_share_threshold_counts_each_value() {
    let c = load("ok/share_threshold.yaml");
    let a = limit(&c, "share", &[("host", "a.example.com")]);
    let b = limit(&c, "share", &[("host", "b.example.com")]);
    assert_ne!(a.counter_key(), b.counter_key());
    assert_eq!(a.stats_key(), b.stats_key());
    assert_eq!(a.stats_key(), "share.host_*.example.com");
}

#[test]
fn shared_at_two_levels() {
    let c = load("ok/share_threshold.yaml");
    let e1 = [("team", "t1"), ("res", "r1v2")];
    let e2 = [("team", "t2"), ("res", "rXv2")];
    let a = limit(&c, "share", &e1);
    let b = limit(&c, "share", &e2);
    assert_eq!((a.rule.requests_per_unit, a.rule.unit), (6, Unit::Hour));
    assert_eq!(a.counter_key(), b.counter_key());
    assert_eq!(a.stats_key(), "share.team_t*.res_r*v2");
    no_limit(&c, "share", &[("team", "t1"), ("res", "r1v3")]);
}

#[test]
fn shared_parent_with_a_detailed_child() {
    let c = load("ok/share_threshold.yaml");
    let a1 = [("org", "o1"), ("member", "alice")];
    let a2 = [("org", "o2"), ("member", "alice")];
    let b1 = [("org", "o1"), ("member", "bob")];
    let (a1, a2, b1) = (
        limit(&c, "share", &a1),
        limit(&c, "share", &a2),
        limit(&c, "share", &b1),
    );
    assert_eq!(a1.counter_key(), a2.counter_key());
    assert_ne!(a1.counter_key(), b1.counter_key());
    // detailed_metric with share_threshold: the pattern for shared entries, values elsewhere.
    assert_eq!(a1.stats_key(), "share.org_o*.member_alice");
}

#[test]
fn value_to_metric_puts_the_value_of_its_level_in_the_stats_key() {
    let c = load("ok/value_to_metric.yaml");
    let e = [("route", "/home"), ("method", "GET")];
    assert_eq!(
        limit(&c, "metrics", &e).stats_key(),
        "metrics.route_/home.method"
    );
    assert_eq!(
        limit(&c, "metrics", &[("path", "/u/42")]).stats_key(),
        "metrics.path_/u/42"
    );
    assert_eq!(
        limit(&c, "metrics", &[("plainwild", "p1")]).stats_key(),
        "metrics.plainwild_p*"
    );
    let e = [("exact", "e1"), ("sub", "s")];
    assert_eq!(limit(&c, "metrics", &e).stats_key(), "metrics.exact_e1.sub");
}

#[test]
fn detailed_metric_with_empty_values() {
    let c = load("ok/value_to_metric.yaml");
    let e = [("detailed", "d1"), ("leaf", "x")];
    assert_eq!(
        limit(&c, "metrics", &e).stats_key(),
        "metrics.detailed_d*.leaf_x"
    );
    // With a shared entry, an empty value gives `key` alone ...
    let e = [("detailed", "d1"), ("leaf", "")];
    assert_eq!(
        limit(&c, "metrics", &e).stats_key(),
        "metrics.detailed_d*.leaf"
    );
    // ... without one, `key_` (the reference's detailed key always joins with `_`).
    let c = load("ok/basic.yaml");
    assert_eq!(limit(&c, "shop", &[("ip", "")]).stats_key(), "shop.ip_");
}

#[test]
fn metric_keys_are_the_first_two_segments() {
    let c = load("ok/value_to_metric.yaml");
    let e = [("dotted", "a.b"), ("next", "c.d"), ("third", "e")];
    let m = limit(&c, "metrics", &e);
    assert_eq!(m.stats_key(), "metrics.dotted_a.b.next_c.d.third");
    assert_eq!(
        m.metric_keys(),
        ("dotted_a.b".to_owned(), Some("next_c.d".to_owned()))
    );
}
