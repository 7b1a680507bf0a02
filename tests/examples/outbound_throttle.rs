//! The `outbound_throttle` example against a local ratekeeper server, on tokio's paused
//! clock: the client's throttle and the server's limiter both read it, so the observed rate
//! is the throttle's pacing, not how much CPU a loaded machine left the client (on the real
//! clock, a client starved by other processes falls behind the quota through no fault of
//! the throttle). Loopback I/O completes within the sending call, so the paused clock only
//! moves when every task waits for a timer: the throttle's sleeps.

use std::time::Duration;

use ratekeeper_axum::core::clock::TokioClock;
use ratekeeper_tests::spawn;

// The example app itself, not a copy; its `main` and the items this file does not use
// are dead code here.
#[allow(dead_code, unreachable_pub)]
#[path = "../../examples/client/outbound_throttle.rs"]
mod outbound_throttle;

/// The `outbound_throttle` example against a local ratekeeper server: zero 429s and an
/// observed rate within 5% of the quota (50 per second, over 4 s).
#[tokio::test(start_paused = true)]
async fn outbound_throttle_never_gets_a_429_and_keeps_the_rate() {
    let app = outbound_throttle::upstream_app_on(TokioClock::new()).unwrap();
    let addr = spawn(app).await;
    let base = format!("http://{addr}");
    let report =
        outbound_throttle::run_client_on(&base, Duration::from_secs(4), 4, TokioClock::new())
            .await
            .unwrap();
    assert_eq!(report.limited, 0, "{report:?}");
    assert_eq!(report.failed, 0, "{report:?}");
    let quota = f64::from(outbound_throttle::UPSTREAM_QUOTA.limit());
    let rate = report.rate();
    assert!(
        (rate - quota).abs() <= 0.05 * quota,
        "observed {rate:.2}/s against {quota}/s: {report:?}"
    );
}
