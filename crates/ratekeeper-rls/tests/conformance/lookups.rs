//! Which rule applies to a descriptor: unknown domains, no match, defaults and exact values,
//! wildcards, nesting, `share_threshold`, `replaces`, `unlimited`, a zero limit, overrides.

use crate::on_both_stores;
use crate::support::*;

pub(crate) const SHOP: &str = r#"
domain: shop
descriptors:
  - key: client
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: client
    value: premium
    rate_limit: {unit: minute, requests_per_unit: 50}
  - key: path
    value: "/api/*"
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: file
    value: "docs/*"
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: tenant
    value: acme
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 4}
  - key: partner
    rate_limit: {unlimited: true}
  - key: blocked
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: tight
    rate_limit: {unit: minute, requests_per_unit: 1, name: tight}
  - key: loose
    rate_limit:
      unit: minute
      requests_per_unit: 100
      name: loose
      replaces: [{name: tight}]
  - key: allow
    value: listed
"#;

/// Minute (2), hour (3) in `RateLimitResponse.RateLimit.Unit` numbers.
const MINUTE: i32 = 2;
const HOUR: i32 = 3;

async fn unknown_domain_answers_ok_body(b: Backend) {
    let mut rls = Rls::start(b, SHOP, &[]).await;
    let r = rls
        .call(req("no-such-domain", vec![desc(&[("client", "bob")])], 0))
        .await;
    assert_eq!(r.overall_code, ok());
    assert_eq!(r.statuses.len(), 1);
    let s = &r.statuses[0];
    assert_eq!(cr(s), (ok(), 0));
    assert!(s.current_limit.is_none() && s.duration_until_reset.is_none());
}
on_both_stores!(unknown_domain_answers_ok, unknown_domain_answers_ok_body);

async fn unmatched_descriptor_answers_ok_without_limit_body(b: Backend) {
    let mut rls = Rls::start(b, SHOP, &[]).await;
    for d in [
        desc(&[("nothing", "x")]),
        // A node without rate_limit allow-lists its value.
        desc(&[("allow", "listed")]),
        // Shallower than the rule, and deeper than the config.
        desc(&[("tenant", "acme")]),
        desc(&[("tenant", "acme"), ("user", "u"), ("extra", "e")]),
        // An empty descriptor.
        desc(&[]),
    ] {
        let r = rls.call(req("shop", vec![d], 0)).await;
        assert_eq!(r.overall_code, ok());
        assert_eq!(cr(&r.statuses[0]), (ok(), 0));
        assert!(r.statuses[0].current_limit.is_none());
    }
}
on_both_stores!(
    unmatched_descriptor_answers_ok_without_limit,
    unmatched_descriptor_answers_ok_without_limit_body
);

async fn exact_value_beats_the_default_body(b: Backend) {
    let mut rls = Rls::start(b, SHOP, &[]).await;
    let r = rls
        .call(req("shop", vec![desc(&[("client", "bob")])], 0))
        .await;
    let limit = r.statuses[0].current_limit.clone().unwrap();
    assert_eq!((limit.requests_per_unit, limit.unit), (5, MINUTE));
    assert_eq!(r.statuses[0].limit_remaining, 4);
    let r = rls
        .call(req("shop", vec![desc(&[("client", "premium")])], 0))
        .await;
    assert_eq!(
        r.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        50
    );
    assert_eq!(r.statuses[0].limit_remaining, 49);
    // Each value of the default rule has its own counter.
    let r = rls
        .call(req("shop", vec![desc(&[("client", "carol")])], 0))
        .await;
    assert_eq!(r.statuses[0].limit_remaining, 4);
}
on_both_stores!(
    exact_value_beats_the_default,
    exact_value_beats_the_default_body
);

async fn wildcard_values_match_with_a_counter_per_value_body(b: Backend) {
    let mut rls = Rls::start(b, SHOP, &[]).await;
    let r = rls
        .call(req("shop", vec![desc(&[("path", "/api/users")])], 0))
        .await;
    assert_eq!(
        r.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        3
    );
    assert_eq!(r.statuses[0].limit_remaining, 2);
    let r = rls
        .call(req("shop", vec![desc(&[("path", "/api/orders")])], 0))
        .await;
    assert_eq!(r.statuses[0].limit_remaining, 2);
    let r = rls
        .call(req("shop", vec![desc(&[("path", "/other")])], 0))
        .await;
    assert!(r.statuses[0].current_limit.is_none());
}
on_both_stores!(
    wildcard_values_match_with_a_counter_per_value,
    wildcard_values_match_with_a_counter_per_value_body
);

async fn share_threshold_values_share_one_counter_body(b: Backend) {
    let mut rls = Rls::start(b, SHOP, &[]).await;
    let mut got = Vec::new();
    for f in ["docs/a.pdf", "docs/b.csv", "docs/c.txt"] {
        let r = rls.call(req("shop", vec![desc(&[("file", f)])], 0)).await;
        got.push(cr(&r.statuses[0]));
    }
    assert_eq!(got, [(ok(), 1), (ok(), 0), (over(), 0)]);
}
on_both_stores!(
    share_threshold_values_share_one_counter,
    share_threshold_values_share_one_counter_body
);

async fn nested_descriptors_match_at_the_rule_depth_body(b: Backend) {
    let mut rls = Rls::start(b, SHOP, &[]).await;
    let r = rls
        .call(req(
            "shop",
            vec![desc(&[("tenant", "acme"), ("user", "u1")])],
            0,
        ))
        .await;
    assert_eq!(
        r.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        4
    );
    assert_eq!(r.statuses[0].limit_remaining, 3);
    let r = rls
        .call(req(
            "shop",
            vec![desc(&[("tenant", "other"), ("user", "u1")])],
            0,
        ))
        .await;
    assert!(r.statuses[0].current_limit.is_none());
}
on_both_stores!(
    nested_descriptors_match_at_the_rule_depth,
    nested_descriptors_match_at_the_rule_depth_body
);

async fn replaces_drops_the_named_rule_body(b: Backend) {
    let mut rls = Rls::start(b, SHOP, &[]).await;
    // Together: `loose` replaces `tight`, which is neither counted nor reported.
    for i in 0..3u32 {
        let r = rls
            .call(req(
                "shop",
                vec![desc(&[("tight", "t")]), desc(&[("loose", "t")])],
                0,
            ))
            .await;
        assert_eq!(r.overall_code, ok());
        assert_eq!(cr(&r.statuses[0]), (ok(), 0));
        assert!(r.statuses[0].current_limit.is_none());
        assert_eq!(r.statuses[1].limit_remaining, 99 - i);
        assert_eq!(r.statuses[1].current_limit.as_ref().unwrap().name, "loose");
    }
    // Alone, `tight` applies, and was never charged above.
    let r = rls
        .call(req("shop", vec![desc(&[("tight", "t")])], 0))
        .await;
    assert_eq!(cr(&r.statuses[0]), (ok(), 0));
    assert_eq!(r.statuses[0].current_limit.as_ref().unwrap().name, "tight");
    let r = rls
        .call(req("shop", vec![desc(&[("tight", "t")])], 0))
        .await;
    assert_eq!(r.overall_code, over());
}
on_both_stores!(
    replaces_drops_the_named_rule,
    replaces_drops_the_named_rule_body
);

async fn unlimited_answers_max_remaining_without_counting_body(b: Backend) {
    let mut rls = Rls::start(b, SHOP, &[]).await;
    for _ in 0..3 {
        let r = rls
            .call(req("shop", vec![desc(&[("partner", "p")])], 1_000))
            .await;
        assert_eq!(r.overall_code, ok());
        assert_eq!(cr(&r.statuses[0]), (ok(), u32::MAX));
        assert!(r.statuses[0].current_limit.is_none());
        assert!(r.statuses[0].duration_until_reset.is_none());
    }
}
on_both_stores!(
    unlimited_answers_max_remaining_without_counting,
    unlimited_answers_max_remaining_without_counting_body
);

async fn zero_requests_per_unit_refuses_every_request_body(b: Backend) {
    let mut rls = Rls::start(b, SHOP, &[]).await;
    for hits in [1, 0, 5] {
        let r = rls
            .call(req("shop", vec![desc_hits(&[("blocked", "x")], hits)], 0))
            .await;
        assert_eq!(r.overall_code, over());
        let s = &r.statuses[0];
        assert_eq!(cr(s), (over(), 0));
        let limit = s.current_limit.as_ref().unwrap();
        assert_eq!((limit.requests_per_unit, limit.unit), (0, MINUTE));
        assert_eq!(s.duration_until_reset.unwrap().seconds, 30);
    }
}
on_both_stores!(
    zero_requests_per_unit_refuses_every_request,
    zero_requests_per_unit_refuses_every_request_body
);

async fn override_limit_is_used_as_given_body(b: Backend) {
    let mut rls = Rls::start(b, SHOP, &[]).await;
    let r = rls
        .call(req(
            "shop",
            vec![desc_override(&[("client", "bob")], 2, HOUR)],
            0,
        ))
        .await;
    let s = &r.statuses[0];
    let limit = s.current_limit.as_ref().unwrap();
    assert_eq!((limit.requests_per_unit, limit.unit), (2, HOUR));
    assert_eq!(s.limit_remaining, 1);
    // Seconds to the end of the hour: the clock is 30 s into it.
    assert_eq!(s.duration_until_reset.unwrap().seconds, 3_570);
    let r = rls
        .call(req(
            "shop",
            vec![desc_override(&[("client", "bob")], 2, HOUR)],
            0,
        ))
        .await;
    assert_eq!(cr(&r.statuses[0]), (ok(), 0));
    let r = rls
        .call(req(
            "shop",
            vec![desc_override(&[("client", "bob")], 2, HOUR)],
            0,
        ))
        .await;
    assert_eq!(r.overall_code, over());
    // Applies to descriptors the config does not match too, but not to unknown domains.
    let r = rls
        .call(req(
            "shop",
            vec![desc_override(&[("nothing", "x")], 7, MINUTE)],
            0,
        ))
        .await;
    assert_eq!(r.statuses[0].limit_remaining, 6);
    let r = rls
        .call(req(
            "elsewhere",
            vec![desc_override(&[("client", "bob")], 7, MINUTE)],
            0,
        ))
        .await;
    assert!(r.statuses[0].current_limit.is_none());
}
on_both_stores!(
    override_limit_is_used_as_given,
    override_limit_is_used_as_given_body
);
