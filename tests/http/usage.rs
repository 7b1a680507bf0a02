//! Reserve, then settle, on the memory store: 100 streamed responses of one key, each
//! charged a random estimate when it arrives and settled from its body to a random true
//! cost (read to its end, or dropped by the client part-way: charged what it produced),
//! in random interleavings. After every step the units charged equal the model's (admitted
//! estimates, settled ones replaced by their true costs); after all, the sum of the true
//! costs; and the overshoot beyond the capacity never exceeds the requests in flight × the
//! largest correction above an estimate (zero when estimates are upper bounds).
//!
//! The driver is `ratekeeper_tests::streams` (shared with `tests/redis/usage.rs`); the
//! store's clock is a `ManualClock` that does not move, so nothing refills.

use std::time::Duration;

use proptest::prelude::*;
use ratekeeper_axum::core::Key;
use ratekeeper_axum::core::clock::ManualClock;
use ratekeeper_axum::core::store::MemoryStore;
use ratekeeper_tests::streams::{Outcome, Scenario, Stream, check, run, scenario};

fn memory_run(scenario: &Scenario) -> Result<Outcome, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let store = MemoryStore::with_clock(ManualClock::new());
    runtime.block_on(run(store, Key::from("client"), scenario, Duration::ZERO))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn streamed_responses_are_charged_their_true_cost_within_the_bound(scenario in scenario()) {
        let outcome = memory_run(&scenario).map_err(TestCaseError::fail)?;
        check(&scenario, &outcome)?;
    }
}

/// The bound is reached: 100 requests of estimate 1 all admitted on a capacity of 100,
/// each then costing 11, take 100 × 10 units beyond the capacity.
#[test]
fn the_overshoot_reaches_requests_in_flight_times_the_largest_correction() {
    let streams = vec![
        Stream {
            estimate: 1,
            frames: vec![11],
            dropped_after: None,
        };
        100
    ];
    // Every request first, then every body.
    let mut order: Vec<usize> = (0..100).collect();
    order.extend((0..100).flat_map(|i| [i, i]));
    let scenario = Scenario {
        capacity: 100,
        streams,
        order,
    };
    let outcome = memory_run(&scenario).unwrap();
    assert_eq!(outcome.admitted, 100);
    assert_eq!(outcome.in_flight, 100);
    assert_eq!(outcome.overshoot, 100 * 10);
    assert_eq!(outcome.charged, 1100);
}

/// With estimates that are upper bounds, nothing is ever charged beyond the capacity.
#[test]
fn upper_bound_estimates_never_overshoot() {
    let streams: Vec<Stream> = (0..100)
        .map(|i| Stream {
            estimate: 30,
            frames: vec![i % 31],
            dropped_after: None,
        })
        .collect();
    let order = Scenario::sequential(&streams);
    let scenario = Scenario {
        capacity: 100,
        streams,
        order,
    };
    let outcome = memory_run(&scenario).unwrap();
    assert_eq!(outcome.overshoot, 0);
    assert_eq!(outcome.charged, outcome.actual);
    assert!(
        outcome.admitted > 3,
        "settling frees the unused part of each estimate"
    );
}
