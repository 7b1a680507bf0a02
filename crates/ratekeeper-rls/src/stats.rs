//! The reference's Prometheus metrics (`ratelimit_service_*`), with a cap on label series.
//!
//! Names and labels follow envoyproxy/ratelimit's Prometheus mapping:
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `ratelimit_service_rate_limit_total_hits` | counter | `domain`, `key1`, `key2` |
//! | `ratelimit_service_rate_limit_over_limit` | counter | `domain`, `key1`, `key2` |
//! | `ratelimit_service_rate_limit_near_limit` | counter | `domain`, `key1`, `key2` |
//! | `ratelimit_service_rate_limit_within_limit` | counter | `domain`, `key1`, `key2` |
//! | `ratelimit_service_rate_limit_shadow_mode` | counter | `domain`, `key1`, `key2` |
//! | `ratelimit_service_should_rate_limit_error` | counter | `err_type` (`service_error`, `redis_error`) |
//! | `ratelimit_service_config_load_success` | counter | |
//! | `ratelimit_service_config_load_error` | counter | |
//! | `ratelimit_service_total_requests` | counter | `grpc_method` |
//! | `ratelimit_service_response_time_seconds` | histogram (s) | `grpc_method` |
//! | `ratelimit_service_global_shadow_mode` | counter | |
//! | `ratelimit_service_domain_not_found` | counter | `domain` |
//!
//! `key1`/`key2` are the first two segments of a rule's stats key (descriptor values appear
//! in them only under `detailed_metric`/`value_to_metric`). At most [`MAX_SERIES`] distinct
//! (`domain`, `key1`, `key2`) label sets are kept; hits of further ones are counted under
//! `domain="_overflow", key1="_overflow", key2="_overflow"`.

use std::collections::HashSet;
use std::sync::{OnceLock, PoisonError, RwLock};

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// The most distinct label sets of the per-rule counters (and of `domain_not_found`).
pub const MAX_SERIES: usize = 2_000;

/// The label value every series past the cap is counted under.
pub const OVERFLOW: &str = "_overflow";

/// What one descriptor's hits add to the per-rule counters, as the reference counts them
/// (its `checkOverLimitThreshold`, `checkNearLimitThreshold` and shadow-mode accounting).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct HitCounts {
    pub(crate) total: u64,
    pub(crate) over: u64,
    pub(crate) near: u64,
    pub(crate) within: u64,
    pub(crate) shadow: u64,
}

/// The counts of `hits` units on a counter that held `before` units under `limit`, where
/// `over` tells whether the descriptor was refused; `near_ratio` is `NEAR_LIMIT_RATIO`
/// (0.8 by default), and `shadow` whether the rule is in shadow mode.
pub(crate) fn hit_counts(
    limit: u32,
    before: u64,
    hits: u64,
    over: bool,
    shadow: bool,
    near_ratio: f32,
) -> HitCounts {
    let limit = u64::from(limit);
    // floor(limit × ratio) in f32, as the reference computes the threshold.
    let near_threshold = (limit as f32 * near_ratio).floor().max(0.0) as u64;
    let after = before.saturating_add(hits);
    let mut c = HitCounts {
        total: hits,
        ..HitCounts::default()
    };
    if over {
        let over_units = if before >= limit {
            hits
        } else {
            c.near = limit - near_threshold.max(before).min(limit);
            after.saturating_sub(limit)
        };
        c.over = over_units;
        if shadow {
            c.shadow = over_units;
        }
    } else {
        c.within = hits;
        if after > near_threshold {
            c.near = if before >= near_threshold {
                hits
            } else {
                after - near_threshold
            };
        }
    }
    c
}

/// The process's Prometheus recorder, installed on first use. When another recorder is
/// already installed (an application embedding the service), the handle renders only what
/// reaches this one.
pub(crate) fn prometheus() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let builder = PrometheusBuilder::new()
            .set_buckets_for_metric(
                metrics_exporter_prometheus::Matcher::Full(
                    "ratelimit_service_response_time_seconds".to_owned(),
                ),
                &[
                    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                    10.0,
                ],
            )
            .unwrap_or_else(|_| PrometheusBuilder::new());
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        if metrics::set_global_recorder(recorder).is_err() {
            tracing::warn!(
                "a metrics recorder was already installed: /metrics shows only this service's own"
            );
        }
        handle
    })
}

/// The per-rule counters and the other service counters.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    series: RwLock<HashSet<(String, String, String)>>,
}

impl Stats {
    /// Labels for (`domain`, `key1`, `key2`), or the overflow labels past [`MAX_SERIES`].
    fn labels(&self, domain: &str, key1: &str, key2: &str) -> [(&'static str, String); 3] {
        let tuple = (domain.to_owned(), key1.to_owned(), key2.to_owned());
        let known = self
            .series
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(&tuple);
        let kept = known || {
            let mut series = self.series.write().unwrap_or_else(PoisonError::into_inner);
            series.len() < MAX_SERIES && {
                series.insert(tuple.clone());
                true
            }
        };
        if kept {
            [("domain", tuple.0), ("key1", tuple.1), ("key2", tuple.2)]
        } else {
            [
                ("domain", OVERFLOW.to_owned()),
                ("key1", OVERFLOW.to_owned()),
                ("key2", OVERFLOW.to_owned()),
            ]
        }
    }

    /// Adds one descriptor's counts to the rule's series.
    pub(crate) fn record_hits(&self, domain: &str, key1: &str, key2: &str, c: HitCounts) {
        let labels = self.labels(domain, key1, key2);
        let add = |name: &'static str, n: u64| {
            metrics::counter!(name, &labels).increment(n);
        };
        add("ratelimit_service_rate_limit_total_hits", c.total);
        add("ratelimit_service_rate_limit_over_limit", c.over);
        add("ratelimit_service_rate_limit_near_limit", c.near);
        add("ratelimit_service_rate_limit_within_limit", c.within);
        add("ratelimit_service_rate_limit_shadow_mode", c.shadow);
    }

    /// A request for a domain the config does not have.
    pub(crate) fn domain_not_found(&self, domain: &str) {
        let [(_, d), _, _] = self.labels(domain, "", "");
        metrics::counter!("ratelimit_service_domain_not_found", "domain" => d).increment(1);
    }
}

/// A refused request (`service_error`) or a store failure (`redis_error`).
pub(crate) fn should_rate_limit_error(err_type: &'static str) {
    metrics::counter!("ratelimit_service_should_rate_limit_error", "err_type" => err_type)
        .increment(1);
}

/// A config (re)load: success or error.
pub(crate) fn config_load(ok: bool) {
    if ok {
        metrics::counter!("ratelimit_service_config_load_success").increment(1);
    } else {
        metrics::counter!("ratelimit_service_config_load_error").increment(1);
    }
}

/// A request turned `OK` by the global shadow mode.
pub(crate) fn global_shadow_mode() {
    metrics::counter!("ratelimit_service_global_shadow_mode").increment(1);
}

/// One call of `grpc_method` that took `seconds`.
pub(crate) fn call(grpc_method: &'static str, seconds: f64) {
    metrics::counter!("ratelimit_service_total_requests", "grpc_method" => grpc_method)
        .increment(1);
    metrics::histogram!("ratelimit_service_response_time_seconds", "grpc_method" => grpc_method)
        .record(seconds);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn within_limit_below_the_near_threshold_counts_within_only() {
        let c = hit_counts(10, 2, 1, false, false, 0.8);
        assert_eq!(
            c,
            HitCounts {
                total: 1,
                within: 1,
                ..HitCounts::default()
            }
        );
    }

    #[test]
    fn hits_crossing_the_near_threshold_count_the_part_above_it() {
        // Threshold floor(10 × 0.8) = 8; 7 → 10 puts 2 units above it.
        let c = hit_counts(10, 7, 3, false, false, 0.8);
        assert_eq!((c.within, c.near), (3, 2));
        let c = hit_counts(10, 8, 1, false, false, 0.8);
        assert_eq!((c.within, c.near), (1, 1));
    }

    #[test]
    fn refused_hits_count_the_part_over_the_limit_and_the_near_part_below_it() {
        // 9 used of 10, 3 more: 2 over, 1 near (9 → 10), as the reference counts them.
        let c = hit_counts(10, 9, 3, true, false, 0.8);
        assert_eq!(
            (c.total, c.over, c.near, c.within, c.shadow),
            (3, 2, 1, 0, 0)
        );
        // Already full: every hit is over.
        let c = hit_counts(10, 10, 4, true, true, 0.8);
        assert_eq!((c.over, c.near, c.shadow), (4, 0, 4));
    }

    #[test]
    fn series_past_the_cap_share_the_overflow_labels() {
        let stats = Stats::default();
        for i in 0..MAX_SERIES {
            let l = stats.labels("d", &format!("k{i}"), "");
            assert_eq!(l[1].1, format!("k{i}"));
        }
        let l = stats.labels("d", "one_too_many", "");
        assert_eq!(
            l.map(|(_, v)| v),
            [
                OVERFLOW.to_owned(),
                OVERFLOW.to_owned(),
                OVERFLOW.to_owned()
            ]
        );
        // A series kept before the cap keeps its labels.
        assert_eq!(stats.labels("d", "k0", "")[1].1, "k0");
    }
}
