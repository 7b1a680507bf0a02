//! The reference's end-to-end expectations (its integration test against real Redis),
//! with fixtures of our own: a limit counting down, two descriptors charged independently,
//! `duration_until_reset` on the service's clock.

use std::time::Duration;

use crate::on_both_stores;
use crate::support::*;

/// The fixture for `domain` (one per store, so metric series do not mix).
fn config(domain: &str) -> String {
    format!(
        r#"
domain: {domain}
descriptors:
  - key: fast
    rate_limit: {{unit: second, requests_per_unit: 50}}
  - key: key2
    rate_limit: {{unit: minute, requests_per_unit: 20}}
  - key: key3
    rate_limit: {{unit: hour, requests_per_unit: 10}}
  - key: weekly
    rate_limit: {{unit: week, requests_per_unit: 1}}
"#
    )
}

fn domain(b: Backend) -> &'static str {
    match b {
        Backend::Memory => "e2e_memory",
        Backend::Redis => "e2e_redis",
        Backend::Tiered => "e2e_tiered",
        Backend::Cluster => "e2e_cluster",
    }
}

async fn fifty_per_second_answers_49_left_body(b: Backend) {
    let d = domain(b);
    let mut rls = Rls::start(b, &config(d), &[]).await;
    let r = rls.call(req(d, vec![desc(&[("fast", "x")])], 0)).await;
    assert_eq!(r.overall_code, ok());
    assert_eq!(cr(&r.statuses[0]), (ok(), 49));
    assert_eq!(r.statuses[0].duration_until_reset.unwrap().seconds, 1);
}
on_both_stores!(
    fifty_per_second_answers_49_left,
    fifty_per_second_answers_49_left_body
);

async fn twenty_per_minute_counts_down_then_refuses_body(b: Backend) {
    // A domain of its own: its metric series count this test's hits only.
    let d = &format!("{}_count", domain(b));
    let mut rls = Rls::start(b, &config(d), &[]).await;
    let labels = format!("domain=\"{d}\",key1=\"key2\",key2=\"\"");
    for i in 0..25u32 {
        let r = rls
            .call(req(d, vec![desc(&[("key2", "client-7")])], 0))
            .await;
        if i < 20 {
            assert_eq!(
                (r.overall_code, cr(&r.statuses[0])),
                (ok(), (ok(), 19 - i)),
                "hit {}",
                i + 1
            );
        } else {
            assert_eq!(
                (r.overall_code, cr(&r.statuses[0])),
                (over(), (over(), 0)),
                "hit {}",
                i + 1
            );
        }
        let limit = r.statuses[0].current_limit.as_ref().unwrap();
        assert_eq!((limit.requests_per_unit, limit.unit), (20, 2));
        let m = rls.debug_get("/metrics").await.1;
        assert_eq!(
            sample(&m, "ratelimit_service_rate_limit_total_hits", &labels),
            f64::from(i + 1)
        );
        assert_eq!(
            sample(&m, "ratelimit_service_rate_limit_over_limit", &labels),
            f64::from(i.saturating_sub(19))
        );
        assert_eq!(
            sample(&m, "ratelimit_service_rate_limit_within_limit", &labels),
            f64::from((i + 1).min(20))
        );
        // Near the limit: hits above floor(20 × 0.8) = 16 while within it.
        assert_eq!(
            sample(&m, "ratelimit_service_rate_limit_near_limit", &labels),
            f64::from((i + 1).clamp(16, 20) - 16)
        );
    }
}
on_both_stores!(
    twenty_per_minute_counts_down_then_refuses,
    twenty_per_minute_counts_down_then_refuses_body
);

async fn two_descriptors_are_charged_independently_body(b: Backend) {
    let d = domain(b);
    let mut rls = Rls::start(b, &config(d), &[]).await;
    for i in 0..15u32 {
        let r = rls
            .call(req(
                d,
                vec![desc(&[("key2", "c")]), desc(&[("key3", "c")])],
                0,
            ))
            .await;
        // key2 (20 per minute) keeps counting even once key3 (10 per hour) refuses.
        assert_eq!(cr(&r.statuses[0]), (ok(), 19 - i), "hit {}", i + 1);
        if i < 10 {
            assert_eq!(r.overall_code, ok(), "hit {}", i + 1);
            assert_eq!(cr(&r.statuses[1]), (ok(), 9 - i));
        } else {
            assert_eq!(r.overall_code, over(), "hit {}", i + 1);
            assert_eq!(cr(&r.statuses[1]), (over(), 0));
        }
    }
}
on_both_stores!(
    two_descriptors_are_charged_independently,
    two_descriptors_are_charged_independently_body
);

async fn duration_until_reset_counts_down_and_is_never_zero_body(b: Backend) {
    let d = domain(b);
    let mut rls = Rls::start(b, &config(d), &[]).await;
    let reset = |r: &envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse| {
        r.statuses[0].duration_until_reset.unwrap().seconds
    };
    let r = rls
        .call(req(d, vec![desc_hits(&[("key2", "r")], 20)], 0))
        .await;
    assert_eq!((reset(&r), r.statuses[0].limit_remaining), (30, 0));
    rls.clock.advance(Duration::from_secs(2));
    let r = rls.call(req(d, vec![desc(&[("key2", "r")])], 0)).await;
    assert_eq!((reset(&r), r.overall_code), (28, over()));
    rls.clock.advance(Duration::from_millis(27_999));
    let r = rls.call(req(d, vec![desc(&[("key2", "r")])], 0)).await;
    assert_eq!((reset(&r), r.overall_code), (1, over()));
    // At the boundary: a whole new window, never 0.
    rls.clock.advance(Duration::from_millis(1));
    let r = rls.call(req(d, vec![desc(&[("key2", "r")])], 0)).await;
    assert_eq!((reset(&r), cr(&r.statuses[0])), (60, (ok(), 19)));
}
on_both_stores!(
    duration_until_reset_counts_down_and_is_never_zero,
    duration_until_reset_counts_down_and_is_never_zero_body
);

async fn a_week_starts_on_thursday_midnight_utc_body(b: Backend) {
    let d = domain(b);
    let mut rls = Rls::start(b, &config(d), &[]).await;
    // The clock starts 30 s after Thursday 00:00 UTC.
    let r = rls.call(req(d, vec![desc(&[("weekly", "w")])], 0)).await;
    assert_eq!(
        r.statuses[0].duration_until_reset.unwrap().seconds,
        604_800 - 30
    );
    assert_eq!(
        rls.call(req(d, vec![desc(&[("weekly", "w")])], 0))
            .await
            .overall_code,
        over()
    );
    rls.clock.advance(Duration::from_secs(604_800 - 30));
    let r = rls.call(req(d, vec![desc(&[("weekly", "w")])], 0)).await;
    assert_eq!(cr(&r.statuses[0]), (ok(), 0));
    assert_eq!(r.statuses[0].duration_until_reset.unwrap().seconds, 604_800);
}
on_both_stores!(
    a_week_starts_on_thursday_midnight_utc,
    a_week_starts_on_thursday_midnight_utc_body
);

/// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true`: a refused request charges none of its
/// descriptors, so key2's remaining stays at 10 once key3 refuses (the reference's
/// integration expectation for this setting).
async fn stop_increment_when_over_limit_keeps_the_other_counters_body(b: Backend) {
    let d = domain(b);
    let env = [("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true")];
    let mut rls = Rls::start(b, &config(d), &env).await;
    for i in 0..15u32 {
        let r = rls
            .call(req(
                d,
                vec![desc(&[("key2", "s")]), desc(&[("key3", "s")])],
                0,
            ))
            .await;
        if i < 10 {
            assert_eq!(r.overall_code, ok(), "hit {}", i + 1);
            assert_eq!(cr(&r.statuses[0]), (ok(), 19 - i));
            assert_eq!(cr(&r.statuses[1]), (ok(), 9 - i));
        } else {
            assert_eq!(r.overall_code, over(), "hit {}", i + 1);
            assert_eq!(cr(&r.statuses[0]), (ok(), 10), "hit {}", i + 1);
            assert_eq!(cr(&r.statuses[1]), (over(), 0));
        }
    }
}
on_both_stores!(
    stop_increment_when_over_limit_keeps_the_other_counters,
    stop_increment_when_over_limit_keeps_the_other_counters_body
);
