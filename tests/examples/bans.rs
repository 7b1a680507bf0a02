//! The `bans` example over real HTTP on a manual clock: three failed logins are answered
//! `401`, the fourth attempt is refused and bans the address, so the right password gets
//! `429` with `Retry-After: 900` until the ban ends 15 minutes later; good logins cost
//! nothing.

use std::time::Duration;

use ratekeeper_axum::core::clock::ManualClock;
use ratekeeper_tests::TestServer;

// The example app itself, not a copy; its `main` and the items this file does not use
// are dead code here.
#[allow(dead_code, unreachable_pub)]
#[path = "../../examples/bans.rs"]
mod bans;

async fn login(server: &TestServer, password: &str) -> reqwest::Response {
    server
        .post("/login")
        .header("x-password", password)
        .send()
        .await
        .expect("POST /login")
}

#[tokio::test]
async fn failed_logins_ban_the_address_for_fifteen_minutes() {
    let clock = ManualClock::new();
    let server = TestServer::start(bans::app_with(clock.clone())).await;
    // Good logins cost nothing.
    for _ in 0..5 {
        assert_eq!(login(&server, bans::PASSWORD).await.status(), 200);
    }
    for _ in 0..3 {
        assert_eq!(login(&server, "guess").await.status(), 401);
    }
    let refused = login(&server, "guess").await;
    assert_eq!(refused.status(), 429);
    // Banned: even the right password is refused, for the ban's 15 minutes.
    let banned = login(&server, bans::PASSWORD).await;
    assert_eq!(banned.status(), 429);
    assert_eq!(banned.headers()["retry-after"], "900");
    clock.advance(Duration::from_secs(14 * 60));
    let still = login(&server, bans::PASSWORD).await;
    assert_eq!(still.status(), 429);
    assert_eq!(still.headers()["retry-after"], "60");
    clock.advance(Duration::from_secs(60));
    assert_eq!(login(&server, bans::PASSWORD).await.status(), 200);
}
