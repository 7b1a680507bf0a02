//! The `from_config` example: its checked-in `examples/config/ratekeeper.toml` builds a layer that
//! behaves like the same layer built in code on one request trace (real HTTP on loopback);
//! a typo's error names its file, line, column and field; every TOML sample in the docs
//! (README and the `config` module) parses and builds.

use std::net::SocketAddr;
use std::num::NonZeroU32;

use axum::http::Method;
use ratekeeper_axum::config::LayerConfig;
use ratekeeper_axum::core::clock::ManualClock;
use ratekeeper_axum::core::store::MemoryStore;
use ratekeeper_axum::key::PeerIp;
use ratekeeper_axum::policy::resolve_fn;
use ratekeeper_axum::{
    RateLimitLayer, RequestParts, core::Algorithm, core::Key, core::Policy, core::Quota,
};
use ratekeeper_tests::TestServer;

#[allow(dead_code, unreachable_pub)]
#[path = "../../examples/config/from_config.rs"]
mod from_config;

fn quota(s: &str) -> Quota {
    s.parse().unwrap()
}

/// `examples/config/ratekeeper.toml`, written with the builder (on a manual clock).
fn in_code() -> axum::Router {
    let layer = RateLimitLayer::builder()
        .store(MemoryStore::<Key, _>::with_clock(ManualClock::new()))
        .policy(Policy::new("api", quota("60/m burst 10")))
        .policy(Policy::new("login", quota("5/m")).with_algorithm(Algorithm::SlidingWindow))
        .policy(Policy::new("free", quota("100/h")))
        .policy(Policy::new(
            "paid",
            Quota::per_hour(NonZeroU32::new(10_000).unwrap()),
        ))
        .key(PeerIp::new())
        .resolver(resolve_fn(|req: &RequestParts<'_>, plan| {
            let template = req
                .extensions()
                .get::<axum::extract::MatchedPath>()
                .map(|p| p.as_str().to_owned());
            let method = if req.method() == Method::HEAD {
                Method::GET
            } else {
                req.method().clone()
            };
            let cost = match (&method, template.as_deref()) {
                (&Method::GET, Some("/search")) => 5,
                (&Method::GET, Some("/items/{id}")) => 2,
                _ => 1,
            };
            plan.charge_cost("api", cost);
            if method == Method::POST && template.as_deref() == Some("/login") {
                let key = Key::tuple([Key::from("POST /login"), plan.key().clone()]);
                plan.charge_with("login", key, cost);
            }
            let tier = match req.headers().get("x-api-key").and_then(|v| v.to_str().ok()) {
                Some("key-acme") => "paid",
                _ => "free",
            };
            plan.charge_cost(tier, cost);
        }))
        .exempt_networks(["192.0.2.0/24".parse().unwrap()])
        .build()
        .unwrap();
    from_config::app_with(layer)
}

/// What a response says about the limit, for comparing two servers.
async fn run_trace(server: &TestServer) -> Vec<String> {
    let mut seen = Vec::new();
    let trace: Vec<(Method, &str, Option<&str>)> = [
        (Method::GET, "/", None),
        (Method::GET, "/search", None),
        (Method::GET, "/items/7", None),
        (Method::POST, "/login", None),
        (Method::GET, "/search", Some("key-acme")),
        (Method::POST, "/login", Some("key-acme")),
        (Method::GET, "/nope", None),
    ]
    .into_iter()
    .cycle()
    .take(28)
    .collect();
    for (method, path, api_key) in trace {
        let mut req = server.request(method.clone(), path);
        if let Some(k) = api_key {
            req = req.header("x-api-key", k);
        }
        let res = req.send().await.unwrap();
        let h = res.headers();
        let get = |name: &str| {
            h.get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("-")
                .to_owned()
        };
        seen.push(format!(
            "{method} {path} key={api_key:?}: {} limit={} remaining={} retry-after={}",
            res.status().as_u16(),
            get("x-ratelimit-limit"),
            get("x-ratelimit-remaining"),
            if res.status() == 429 { "yes" } else { "no" },
        ));
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_file_and_the_code_behave_alike_on_one_trace() {
    let config = from_config::load(&from_config::default_path()).unwrap();
    // Both layers on a manual clock that never moves: the trace's 28 requests meet the same
    // state in both however slowly a loaded machine sends them (on the real clock, units
    // refilled between requests differently in the two runs).
    let layer = config
        .builder()
        .unwrap()
        .store(MemoryStore::<Key, _>::with_clock(ManualClock::new()))
        .build()
        .unwrap();
    let from_file = TestServer::start(from_config::app_with(layer)).await;
    let from_code = TestServer::start(in_code()).await;
    let a = run_trace(&from_file).await;
    let b = run_trace(&from_code).await;
    assert_eq!(a, b);
    // The trace reaches the limits: login's 5 per minute and api's burst of 10.
    assert!(
        a.iter()
            .any(|l| l.starts_with("POST /login") && l.contains(": 429")),
        "{a:#?}"
    );
    assert!(a.iter().any(|l| l.contains(": 200")), "{a:#?}");
}

#[tokio::test(flavor = "current_thread")]
async fn the_exempt_network_of_the_file_is_not_limited() {
    use tower::ServiceExt;
    let config = from_config::load(&from_config::default_path()).unwrap();
    let app = from_config::app(&config).unwrap();
    let request = |peer: &str| {
        let mut req = axum::http::Request::get("/")
            .body(axum::body::Body::empty())
            .unwrap();
        req.extensions_mut().insert(axum::extract::ConnectInfo(
            peer.parse::<SocketAddr>().unwrap(),
        ));
        req
    };
    // A monitoring probe from 192.0.2.0/24: never limited, no headers.
    for _ in 0..15 {
        let res = app
            .clone()
            .oneshot(request("192.0.2.5:4000"))
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
        assert!(!res.headers().contains_key("x-ratelimit-limit"));
    }
    // Anyone else: limited (api's burst of 10).
    let mut statuses = Vec::new();
    for _ in 0..11 {
        let res = app
            .clone()
            .oneshot(request("198.51.100.5:4000"))
            .await
            .unwrap();
        statuses.push(res.status().as_u16());
    }
    assert_eq!(statuses[..10], [200; 10]);
    assert_eq!(statuses[10], 429);
}

#[test]
fn a_typo_names_its_file_line_column_and_field() {
    let text = std::fs::read_to_string(from_config::default_path()).unwrap();
    // A misspelt quota on one line of the checked-in file.
    let line = text
        .lines()
        .position(|l| l.starts_with("quota = \"5/m\""))
        .unwrap()
        + 1;
    let typo = text.replacen("quota = \"5/m\"", "quota = \"5/mn\"", 1);
    let err = LayerConfig::from_toml("ratekeeper.toml", &typo).unwrap_err();
    assert_eq!(err.line(), Some(line), "{err}");
    assert_eq!(err.column(), Some(9), "{err}");
    assert_eq!(err.field(), "policies[1].quota", "{err}");
    assert!(
        err.to_string().starts_with(&format!(
            "ratekeeper.toml:{line}:9: policies[1].quota: invalid quota \"5/mn\""
        )),
        "{err}"
    );
    assert!(!err.to_string().contains('\n'), "{err}");

    // A misspelt field name.
    let typo = text.replacen("algorithm = ", "algoritm = ", 1);
    let err = LayerConfig::from_toml("ratekeeper.toml", &typo).unwrap_err();
    let line = text
        .lines()
        .position(|l| l.starts_with("algorithm = "))
        .unwrap()
        + 1;
    assert_eq!(err.line(), Some(line), "{err}");
    assert!(err.to_string().contains("algoritm"), "{err}");

    // A legacy route template.
    let typo = text.replacen("/items/{id}", "/items/:id", 1);
    let err = LayerConfig::from_toml("ratekeeper.toml", &typo).unwrap_err();
    let line = text
        .lines()
        .position(|l| l.contains("/items/{id}"))
        .unwrap()
        + 1;
    assert_eq!(err.line(), Some(line), "{err}");
    assert_eq!(err.field(), "routes[2].path", "{err}");
    assert!(err.to_string().contains("write \"/items/{id}\""), "{err}");

    // A file that cannot be read names itself.
    let err = LayerConfig::from_toml_file("/nonexistent/ratekeeper.toml").unwrap_err();
    assert!(
        err.to_string()
            .starts_with("/nonexistent/ratekeeper.toml: cannot read"),
        "{err}"
    );

    // Parts that do not fit together name their line, column and field too.
    let err = LayerConfig::from_toml("x.toml", "[[policies]]\nname = \"a\"\nquota = \"1/s\"\n[[routes]]\nmethod = \"GET\"\npath = \"/\"\npolicies = [\"b\"]\n")
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "x.toml:7:13: routes[0].policies[0]: there is no policy named \"b\""
    );
}

/// The TOML code blocks of a Markdown or Rust doc text (```toml fences; in Rust sources the
/// `//! ` prefix removed).
fn toml_blocks(text: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        let line = line.trim_start();
        let line = line
            .strip_prefix("//!")
            .map_or(line, |l| l.strip_prefix(' ').unwrap_or(l));
        match (&mut current, line.trim_end()) {
            (None, "```toml") => current = Some(String::new()),
            (Some(block), "```") => {
                blocks.push(std::mem::take(block));
                current = None;
            }
            (Some(block), l) => {
                block.push_str(l);
                block.push('\n');
            }
            _ => {}
        }
    }
    blocks
}

#[test]
fn every_toml_sample_in_the_docs_parses_and_builds() {
    let sources = [
        ("README.md", include_str!("../../README.md")),
        (
            "config/mod.rs",
            include_str!("../../crates/ratekeeper-tower/src/config/mod.rs"),
        ),
        (
            "config/document.rs",
            include_str!("../../crates/ratekeeper-tower/src/config/document.rs"),
        ),
    ];
    let mut count = 0;
    for (file, text) in sources {
        for (i, block) in toml_blocks(text).into_iter().enumerate() {
            let name = format!("{file} sample {}", i + 1);
            let config =
                LayerConfig::from_toml(&name, &block).unwrap_or_else(|e| panic!("{e}\n{block}"));
            config
                .build()
                .unwrap_or_else(|e| panic!("{name}: {e}\n{block}"));
            count += 1;
        }
    }
    // The checked-in file too.
    from_config::load(&from_config::default_path())
        .unwrap()
        .build()
        .unwrap();
    assert!(count >= 3, "only {count} samples found");
}
