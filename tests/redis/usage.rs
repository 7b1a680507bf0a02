//! Reserve, then settle, on Redis: the property of `tests/http/usage.rs` (100 streamed
//! responses of one key, random estimates, random true costs, random interleavings; the
//! units charged match the model after every step, equal the sum of the true costs after
//! all, and the overshoot stays within requests in flight × the largest correction) on a
//! standalone `redis-server` this test starts, with the store's time injected from a
//! `ManualClock` that does not move. The store settles in the background (like its
//! refunds), so each step gives it a bounded time to show the settlement.

use std::time::Duration;

use proptest::prelude::*;
use ratekeeper_axum::core::Key;
use ratekeeper_axum::core::clock::ManualClock;
use ratekeeper_axum::core::store::redis::RedisStore;
use ratekeeper_tests::redis::{DECISION_DEADLINE, RedisServer};
use ratekeeper_tests::streams::{check, run, scenario};

/// The longest a settlement may take to show in Redis.
const SETTLE_WAIT: Duration = Duration::from_secs(2);

proptest! {
    // Few cases, and a failure shrinks for a minute at most (each failing step waits
    // `SETTLE_WAIT`).
    #![proptest_config(ProptestConfig {
        cases: 12,
        max_shrink_time: 60_000,
        ..ProptestConfig::default()
    })]

    #[test]
    fn streamed_responses_are_charged_their_true_cost_within_the_bound_on_redis(
        scenario in scenario(),
    ) {
        let server = RedisServer::start();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let outcome = runtime.block_on(async {
            let store = RedisStore::builder()
                .clock(ManualClock::new())
                .deadline(DECISION_DEADLINE)
                .standalone(&server.url())
                .await
                .map_err(|e| e.to_string())?;
            run(store, Key::from("client"), &scenario, SETTLE_WAIT).await
        });
        let outcome = outcome.map_err(TestCaseError::fail)?;
        check(&scenario, &outcome)?;
    }
}
