//! The README's admin recipe ("Unblocking a customer: an admin route") over real HTTP: a
//! customer limited by API key is shown and reset through a route behind a bearer token;
//! without the token nothing is shown or reset.

use std::num::NonZeroU32;

use axum::Router;
use axum::routing::get;
use ratekeeper_axum::key::HeaderKey;
use ratekeeper_axum::{RateLimitLayer, core::Algorithm, core::Policy, core::Quota};
use ratekeeper_tests::{TestServer, readme};
use reqwest::StatusCode;

// The README's recipe, exactly as the README shows it (checked below).
#[allow(dead_code, unreachable_pub)]
#[path = "../../examples/recipes/admin_route.rs"]
mod recipe;

const TOKEN: &str = "s3cret-admin-token";

/// `/api` limited per customer (3 per minute by GCRA, 10 per minute in fixed windows), the
/// customer read from `X-Api-Key` (`key-<name>`), and the admin routes merged after the
/// limit.
async fn app() -> TestServer {
    let per_minute = |n| Quota::per_minute(NonZeroU32::new(n).expect("non-zero"));
    let limit = RateLimitLayer::builder()
        .policy(Policy::new("api", per_minute(3)))
        .policy(Policy::new("daily", per_minute(10)).with_algorithm(Algorithm::FixedWindow))
        .key(HeaderKey::validated("X-Api-Key", |raw: &str| {
            raw.strip_prefix("key-").map(recipe::customer_key)
        }))
        .build()
        .expect("layer");
    let app = Router::new()
        .route("/api", get(|| async { "ok" }))
        .layer(limit.clone())
        .merge(recipe::admin_routes(&limit, TOKEN));
    TestServer::start(app).await
}

async fn call(server: &TestServer, customer: &str) -> StatusCode {
    server
        .get("/api")
        .header("x-api-key", format!("key-{customer}"))
        .send()
        .await
        .expect("request")
        .status()
}

/// `(policy, remaining)` of every policy in an admin answer.
async fn remaining(response: reqwest::Response) -> Vec<(String, u64)> {
    assert_eq!(response.status(), StatusCode::OK);
    let text = response.text().await.expect("body");
    let body: serde_json::Value = serde_json::from_str(&text).expect("json");
    body["policies"]
        .as_array()
        .expect("policies")
        .iter()
        .map(|p| {
            (
                p["policy"].as_str().expect("name").to_owned(),
                p["remaining"].as_u64().expect("remaining"),
            )
        })
        .collect()
}

fn pairs(v: &[(&str, u64)]) -> Vec<(String, u64)> {
    v.iter().map(|(p, n)| ((*p).to_owned(), *n)).collect()
}

/// The recipe end to end: alice is limited; the admin route shows her usage (twice, without
/// charging her), resets her, and she gets her whole burst back, exactly; bob is untouched.
#[tokio::test]
async fn an_admin_route_shows_and_resets_a_customer() {
    let server = app().await;
    for _ in 0..3 {
        assert_eq!(call(&server, "alice").await, StatusCode::OK);
    }
    assert_eq!(call(&server, "alice").await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(call(&server, "bob").await, StatusCode::OK);

    let show = || server.get("/admin/limits/alice").bearer_auth(TOKEN).send();
    let expected = pairs(&[("api", 0), ("daily", 7)]);
    assert_eq!(remaining(show().await.expect("show")).await, expected);
    assert_eq!(remaining(show().await.expect("show")).await, expected);

    // One policy: unknown names are 404 and reset nothing.
    let nope = server
        .request(reqwest::Method::DELETE, "/admin/limits/alice/nope")
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("reset");
    assert_eq!(nope.status(), StatusCode::NOT_FOUND);
    let one = server
        .request(reqwest::Method::DELETE, "/admin/limits/alice/api")
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("reset");
    assert_eq!(remaining(one).await, pairs(&[("api", 3)]));
    assert_eq!(
        remaining(show().await.expect("show")).await,
        pairs(&[("api", 3), ("daily", 7)])
    );
    for _ in 0..3 {
        assert_eq!(call(&server, "alice").await, StatusCode::OK);
    }
    assert_eq!(call(&server, "alice").await, StatusCode::TOO_MANY_REQUESTS);

    // Every policy.
    let all = server
        .request(reqwest::Method::DELETE, "/admin/limits/alice")
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("reset");
    assert_eq!(remaining(all).await, pairs(&[("api", 3), ("daily", 10)]));
    let bob = server
        .get("/admin/limits/bob")
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("show");
    assert_eq!(remaining(bob).await, pairs(&[("api", 2), ("daily", 9)]));
}

/// Without the admin token (none, another scheme, a wrong or a longer token) the route
/// answers 401 and neither shows nor resets anything.
#[tokio::test]
async fn the_admin_route_refuses_requests_without_the_token() {
    let server = app().await;
    for _ in 0..4 {
        call(&server, "alice").await;
    }
    let wrong = [
        None,
        Some(format!("Basic {TOKEN}")),
        Some("Bearer wrong".to_owned()),
        Some(format!("Bearer {TOKEN}x")),
        Some("Bearer ".to_owned()),
    ];
    for auth in &wrong {
        for method in [reqwest::Method::GET, reqwest::Method::DELETE] {
            for path in ["/admin/limits/alice", "/admin/limits/alice/api"] {
                let mut req = server.request(method.clone(), path);
                if let Some(auth) = auth {
                    req = req.header("authorization", auth);
                }
                let status = req.send().await.expect("request").status();
                // GET of the one-policy path is not a route: 405, still nothing shown.
                assert!(
                    status == StatusCode::UNAUTHORIZED || status == StatusCode::METHOD_NOT_ALLOWED,
                    "{method} {path} with {auth:?}: {status}"
                );
            }
        }
    }
    assert_eq!(call(&server, "alice").await, StatusCode::TOO_MANY_REQUESTS);
}

/// The README shows the recipe exactly as this test compiles it.
#[test]
fn the_readme_shows_the_admin_recipe() {
    assert_eq!(
        readme::recipe("admin-route"),
        include_str!("../../examples/recipes/admin_route.rs").trim(),
        "README.md and examples/recipes/admin_route.rs differ"
    );
}

/// A store of one's own that implements only the trait's required methods: the admin
/// handle peeks through the default method (a free probe) and reports a reset as
/// unsupported, a store error, not an unknown policy.
#[tokio::test]
async fn the_admin_handle_works_with_a_store_of_ones_own() {
    use std::future::Ready;

    use ratekeeper_axum::core::store::{
        Charge, Checked, Decisions, MemoryStore, PolicyId, Refund, Store, StoreError,
    };
    use ratekeeper_axum::{core::Key, key::GlobalKey};

    struct Mine(MemoryStore<Key>);
    impl Store<Key> for Mine {
        type Future = Ready<Result<Decisions, StoreError>>;
        fn register(&mut self, policy: &Policy) -> Result<PolicyId, StoreError> {
            self.0.register(policy)
        }
        fn check(&self, charges: &[Charge<'_, Key>]) -> Checked<Self::Future> {
            self.0.check(charges)
        }
        fn refund(&self, refunds: &[Refund<'_, Key>]) {
            self.0.refund(refunds);
        }
    }

    let limit = RateLimitLayer::builder()
        .policy(Policy::new(
            "api",
            Quota::per_minute(NonZeroU32::new(3).expect("3")),
        ))
        .key(GlobalKey)
        .store(Mine(MemoryStore::new()))
        .build()
        .expect("layer");
    let server = TestServer::start(
        Router::new()
            .route("/api", get(|| async { "ok" }))
            .layer(limit.clone()),
    )
    .await;
    assert_eq!(
        server.get("/api").send().await.expect("request").status(),
        StatusCode::OK
    );
    let admin = limit.admin();
    assert_eq!(admin.policies().collect::<Vec<_>>(), ["api"]);
    for _ in 0..2 {
        let state = admin.peek("api", &Key::Global).await.expect("peek");
        assert_eq!((state.limit(), state.remaining()), (3, 2));
    }
    let err = admin
        .reset("api", &Key::Global)
        .await
        .expect_err("no reset");
    assert!(!err.is_unknown_policy());
    assert!(matches!(
        err,
        ratekeeper_axum::rate_limit::AdminError::Store(StoreError::UnsupportedOperation(_))
    ));
    assert!(
        admin
            .reset("nope", &Key::Global)
            .await
            .expect_err("unknown")
            .is_unknown_policy()
    );
}

/// A ban on a route-scoped policy (the failed-login recipe) is shown and lifted through the
/// admin handle with the route's key, [`RouteTable::scoped_key`]; the client key alone names
/// only the layer-wide policies' buckets, which were never touched.
#[tokio::test]
async fn a_route_scoped_ban_is_shown_and_lifted_by_the_routes_key() {
    use std::time::Duration;

    use axum::http::Method;
    use axum::routing::post;
    use ratekeeper_axum::route::RouteTable;
    use ratekeeper_axum::{core::Ban, core::Key};

    let per_minute = |n| Quota::per_minute(NonZeroU32::new(n).expect("non-zero"));
    let once = NonZeroU32::new(1).expect("non-zero");
    let limit =
        RateLimitLayer::builder()
            .policy(Policy::new("api", per_minute(100)))
            .policy(Policy::new("login", per_minute(2)).with_ban(
                Ban::after(once, Duration::from_secs(60)).lasting(Duration::from_secs(900)),
            ))
            .resolver(RouteTable::new().limit(Method::POST, "/login", "login"))
            .key(HeaderKey::validated("X-Api-Key", |raw: &str| {
                Some(Key::from(format!("customer:{raw}")))
            }))
            .build()
            .expect("layer");
    let admin = limit.admin();
    let app = Router::new()
        .route("/login", post(|| async { "ok" }))
        .layer(limit);
    let server = TestServer::start(app).await;
    let login = || async {
        server
            .post("/login")
            .header("x-api-key", "alice")
            .send()
            .await
            .expect("request")
            .status()
    };
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(login().await);
    }
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    let client = Key::from("customer:alice");
    let route = RouteTable::scoped_key(&Method::POST, "/login", &client);
    let banned = admin.peek("login", &route).await.expect("peek");
    assert!(banned.is_banned(), "{banned:?}");
    // The client key alone is the layer-wide bucket: untouched by "login".
    assert!(
        !admin
            .peek("login", &client)
            .await
            .expect("peek")
            .is_banned()
    );
    let after = admin.reset("login", &route).await.expect("reset");
    assert_eq!(after.remaining(), 2);
    assert_eq!(login().await, StatusCode::OK);
}
