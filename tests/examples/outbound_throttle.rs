//! The `outbound_throttle` example against a local ratekeeper server. In its own test binary
//! so that no CPU-heavy test of another file runs beside it and starves the client.

use std::time::Duration;

use ratekeeper_tests::spawn;

// The example app itself, not a copy; its `main` and the items this file does not use
// are dead code here.
#[allow(dead_code, unreachable_pub)]
#[path = "../../examples/outbound_throttle.rs"]
mod outbound_throttle;

/// The `outbound_throttle` example against a local ratekeeper server: zero 429s and an
/// observed rate within 5% of the quota (50 per second, over 4 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbound_throttle_never_gets_a_429_and_keeps_the_rate() {
    let addr = spawn(outbound_throttle::upstream_app()).await;
    let report =
        outbound_throttle::run_client(&format!("http://{addr}"), Duration::from_secs(4), 4)
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
