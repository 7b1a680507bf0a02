//! The `admin` example over real HTTP: a customer spends their budget, the admin route
//! (behind the bearer token) shows it and gives it back; without the token nothing is shown
//! or reset.

use ratekeeper_axum::core::clock::ManualClock;
use ratekeeper_tests::TestServer;

// The example app itself, not a copy; its `main` and the items this file does not use
// are dead code here.
#[allow(dead_code, unreachable_pub)]
#[path = "../../examples/admin.rs"]
mod admin;

const TOKEN: &str = "test-admin-token";

async fn api(server: &TestServer, customer: &str) -> u16 {
    server
        .get("/api")
        .header("x-api-key", format!("key-{customer}"))
        .send()
        .await
        .expect("GET /api")
        .status()
        .as_u16()
}

/// The remaining budget the admin route shows for `customer` under `api`.
async fn shown(server: &TestServer, customer: &str) -> u64 {
    let res = server
        .get(&format!("/admin/limits/{customer}"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("GET admin");
    assert_eq!(res.status(), 200);
    let body: serde_json::Value =
        serde_json::from_str(&res.text().await.expect("body")).expect("json");
    body["policies"][0]["remaining"]
        .as_u64()
        .expect("remaining")
}

#[tokio::test]
async fn the_admin_route_shows_and_resets_a_customer() {
    let server = TestServer::start(admin::app_with(ManualClock::new(), TOKEN)).await;
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(api(&server, "alice").await);
    }
    assert_eq!(statuses, [200, 200, 200, 429]);
    assert_eq!(shown(&server, "alice").await, 0);
    assert_eq!(shown(&server, "bob").await, 3, "bob has spent nothing");

    let reset = server
        .request(reqwest::Method::DELETE, "/admin/limits/alice")
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("DELETE admin");
    assert_eq!(reset.status(), 200);
    assert_eq!(shown(&server, "alice").await, 3);
    assert_eq!(api(&server, "alice").await, 200);
}

#[tokio::test]
async fn without_the_token_nothing_is_shown_or_reset() {
    let server = TestServer::start(admin::app_with(ManualClock::new(), TOKEN)).await;
    for _ in 0..3 {
        assert_eq!(api(&server, "alice").await, 200);
    }
    let shown_without = server
        .get("/admin/limits/alice")
        .send()
        .await
        .expect("GET admin");
    assert_eq!(shown_without.status(), 401);
    let reset = server
        .request(reqwest::Method::DELETE, "/admin/limits/alice")
        .bearer_auth("wrong-token")
        .send()
        .await
        .expect("DELETE admin");
    assert_eq!(reset.status(), 401);
    assert_eq!(api(&server, "alice").await, 429, "nothing was reset");
    // No API key at all: the problem+json 400.
    let res = server.get("/api").send().await.expect("GET /api");
    assert_eq!(res.status(), 400);
    assert_eq!(res.headers()["content-type"], "application/problem+json");
}
