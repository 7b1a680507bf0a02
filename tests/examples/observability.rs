//! The `observability` example over real HTTP: a few requests, then a scrape of `/metrics`
//! (Prometheus text format) finds the decision counter, the usage histogram, the store
//! latency histogram (a `redis-server` this test starts), the memory store's key gauge and
//! the shadow-mode counters, each with its labels; with Redis killed, the store's error and
//! failure-policy counters. Every metric of the README's metrics table is in the scrape
//! (counters of events that did not happen at 0; all but the fallback's, which this app does
//! not use), and every metric the test finds is one the README's table names. Every query of
//! the Grafana dashboard (`dashboards/ratekeeper.json`) names metrics of that scrape.

use std::time::Duration;

use ratekeeper_axum::core::store::redis::RedisStore;
use ratekeeper_tests::TestServer;
use ratekeeper_tests::redis::RedisServer;

#[allow(dead_code, unreachable_pub)]
#[path = "../../examples/redis/observability.rs"]
mod observability;

/// The value of the sample `line_start` (a metric name with its labels, as rendered), if
/// the scrape has it.
fn sample(scrape: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    scrape
        .lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| {
            let Some(rest) = l.strip_prefix(name) else {
                return false;
            };
            let (label_text, _) = rest.rsplit_once(' ').unwrap_or((rest, ""));
            (label_text.is_empty() || label_text.starts_with('{'))
                && labels
                    .iter()
                    .all(|(k, v)| label_text.contains(&format!("{k}=\"{v}\"")))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// The metric names of the README's table (between the `metrics:begin`/`end` markers).
fn readme_metrics() -> Vec<String> {
    let readme = include_str!("../../README.md");
    let start = readme
        .find("<!-- metrics:begin -->")
        .expect("README metrics table");
    let end = readme
        .find("<!-- metrics:end -->")
        .expect("README metrics table end");
    readme[start..end]
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .map(str::to_owned)
        .collect()
}

/// Every query of the Grafana dashboard (`dashboards/ratekeeper.json`): the `expr` of each
/// panel target and the `query`/`definition` of each template variable, each with the
/// `ratekeeper_*` metric names it reads (as rendered: a histogram's `_bucket` series).
fn dashboard_queries() -> Vec<(String, Vec<String>)> {
    fn walk(value: &serde_json::Value, out: &mut Vec<String>) {
        match value {
            serde_json::Value::Object(map) => {
                for (key, v) in map {
                    match (key.as_str(), v) {
                        ("expr" | "definition", serde_json::Value::String(q)) => {
                            out.push(q.clone())
                        }
                        _ => walk(v, out),
                    }
                }
            }
            serde_json::Value::Array(items) => items.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let dashboard: serde_json::Value =
        serde_json::from_str(include_str!("../../dashboards/ratekeeper.json"))
            .expect("the dashboard is JSON");
    let mut queries = Vec::new();
    walk(&dashboard, &mut queries);
    queries
        .into_iter()
        .map(|q| {
            let names = q
                .match_indices("ratekeeper_")
                .map(|(at, _)| {
                    let rest = &q[at..];
                    let end = rest
                        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                        .unwrap_or(rest.len());
                    rest[..end].to_owned()
                })
                .collect();
            (q, names)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_scraped_with_their_labels() {
    let mut redis = RedisServer::start();
    // A deadline no round trip misses on a loaded machine (the default is 50 ms), so the
    // counts below are the decisions' own, not the failure policy's. Once Redis is killed
    // calls fail at once (connection refused), deadline or not.
    let store = RedisStore::builder().deadline(Duration::from_secs(5));
    let app = observability::app_with(&redis.url(), store).await.unwrap();
    let server = TestServer::start(app).await;
    let mut statuses = Vec::new();
    for _ in 0..8 {
        let res = server.get("/").send().await.unwrap();
        statuses.push(res.status().as_u16());
    }
    // The shadow-mode "candidate" (5 per minute) refuses nothing.
    assert_eq!(statuses, [200; 8]);

    let res = server.get("/metrics").send().await.unwrap();
    assert_eq!(res.status(), 200);
    let scrape = res.text().await.unwrap();
    let find = |name: &str, labels: &[(&str, &str)]| {
        sample(&scrape, name, labels)
            .unwrap_or_else(|| panic!("{name} {labels:?} not in the scrape:\n{scrape}"))
    };

    // The decision counter, per policy and outcome.
    assert_eq!(
        find(
            "ratekeeper_decisions_total",
            &[("policy", "per-ip"), ("outcome", "allowed")]
        ),
        8.0
    );
    assert_eq!(
        find(
            "ratekeeper_decisions_total",
            &[("policy", "daily"), ("outcome", "allowed")]
        ),
        8.0
    );
    assert_eq!(
        find(
            "ratekeeper_decisions_total",
            &[("policy", "candidate"), ("outcome", "allowed")]
        ),
        5.0
    );
    assert_eq!(
        find(
            "ratekeeper_decisions_total",
            &[("policy", "candidate"), ("outcome", "denied")]
        ),
        3.0
    );
    // The usage histogram: 8 observations per policy; "candidate" (5 per minute) was full
    // from the fifth request on, so 4 of its 8 observations are above 0.9.
    assert_eq!(
        find("ratekeeper_usage_ratio_count", &[("policy", "per-ip")]),
        8.0
    );
    assert_eq!(
        find(
            "ratekeeper_usage_ratio_bucket",
            &[("policy", "candidate"), ("le", "0.9")]
        ),
        4.0
    );
    assert_eq!(
        find(
            "ratekeeper_usage_ratio_bucket",
            &[("policy", "candidate"), ("le", "1")]
        ),
        8.0
    );
    // The store latency histogram (Redis answered every decision).
    assert_eq!(
        find(
            "ratekeeper_store_latency_seconds_count",
            &[("outcome", "ok")]
        ),
        8.0
    );
    assert!(
        find(
            "ratekeeper_store_latency_seconds_bucket",
            &[("outcome", "ok"), ("le", "+Inf")]
        ) >= 8.0
    );
    // The memory store's key gauge: one client, one key per memory policy.
    assert_eq!(
        find("ratekeeper_memory_store_keys", &[("policy", "per-ip")]),
        1.0
    );
    assert_eq!(
        find("ratekeeper_memory_store_keys", &[("policy", "candidate")]),
        1.0
    );
    // Shadow mode: the share that would have been refused, 3 of 8.
    assert_eq!(
        find(
            "ratekeeper_shadow_checked_total",
            &[("policy", "candidate")]
        ),
        8.0
    );
    assert_eq!(
        find(
            "ratekeeper_shadow_would_refuse_total",
            &[("policy", "candidate")]
        ),
        3.0
    );

    // Redis goes away: the store's error counter, its failure-policy counter and the error
    // side of the latency histogram appear; requests still pass (fail open).
    redis.kill();
    for _ in 0..4 {
        let res = server.get("/").send().await.unwrap();
        assert_eq!(res.status(), 200);
    }
    let scrape = server
        .get("/metrics")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let find = |name: &str, labels: &[(&str, &str)]| {
        sample(&scrape, name, labels)
            .unwrap_or_else(|| panic!("{name} {labels:?} not in the scrape:\n{scrape}"))
    };
    assert!(find("ratekeeper_store_errors_total", &[]) >= 1.0);
    assert_eq!(
        find("ratekeeper_store_degraded_total", &[("action", "allow")]),
        4.0
    );
    assert!(
        find(
            "ratekeeper_store_latency_seconds_count",
            &[("outcome", "error")]
        ) >= 1.0
    );

    // Every metric of the README's table is in the scrape (the counters of events that did
    // not happen, such as evictions or negative-cache hits, at 0), except the fallback's
    // `ratekeeper_degraded_total` and `ratekeeper_bans_total`: this app has no
    // degraded-response fallback and no policy with a ban.
    let documented = readme_metrics();
    assert!(documented.len() >= 12, "{documented:?}");
    for name in documented
        .iter()
        .filter(|d| *d != "ratekeeper_degraded_total" && *d != "ratekeeper_bans_total")
    {
        assert!(
            scrape.lines().any(|l| l
                .strip_prefix(name.as_str())
                .is_some_and(|rest| rest.starts_with(['{', ' ', '_']))),
            "{name} (in the README's table) is not in the scrape:\n{scrape}"
        );
    }
    assert_eq!(
        find(
            "ratekeeper_memory_store_evicted_total",
            &[("policy", "per-ip")]
        ),
        0.0
    );
    assert_eq!(
        find(
            "ratekeeper_memory_store_overflowed_total",
            &[("policy", "candidate")]
        ),
        0.0
    );
    assert_eq!(find("ratekeeper_negative_cache_hits_total", &[]), 0.0);
    // The Grafana dashboard reads only metrics this app exports.
    let queries = dashboard_queries();
    assert!(queries.len() >= 10, "{queries:?}");
    for (query, names) in &queries {
        assert!(
            !names.is_empty(),
            "dashboard query reads no ratekeeper metric: {query}"
        );
        for name in names {
            assert!(
                scrape.lines().any(|l| l
                    .strip_prefix(name.as_str())
                    .is_some_and(|rest| rest.starts_with(['{', ' ']))),
                "dashboard query `{query}` reads {name}, which the observability example does not export:\n{scrape}"
            );
        }
    }
    for line in scrape.lines().filter(|l| l.starts_with("ratekeeper_")) {
        let name = line.split(['{', ' ']).next().unwrap_or("");
        let base = ["_bucket", "_count", "_sum"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(name);
        assert!(
            documented.iter().any(|d| d == base),
            "{base} is not in the README's table"
        );
    }
}
