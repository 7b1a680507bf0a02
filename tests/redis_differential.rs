//! Memory ≡ Redis: seeded, bounded random sequences of check / reserve / refund / peek run on
//! the memory store (the reference) and on a standalone Redis store with an aligned clock,
//! every algorithm the Redis store takes, the answers compared field by field after every
//! step (see `ratekeeper_tests::differential`). proptest shrinks a failing sequence to its
//! smallest form.
//!
//! `SWEEP_CASES` multiplies the number of sequences (default 1) and `SWEEP_SEED` (a number)
//! picks another seed, as for the other sweeps; CI uses neither.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use proptest::collection::vec;
use proptest::prelude::any;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use ratekeeper_core::clock::ManualClock;
use ratekeeper_core::store::redis::RedisStore;
use ratekeeper_tests::differential::{Pair, sequence, start_ns};
use ratekeeper_tests::redis::RedisServer;

/// Sequences per run (times `SWEEP_CASES`).
const CASES: u32 = 300;
/// Steps per sequence, at most.
const MAX_STEPS: usize = 40;

#[test]
fn memory_and_redis_answer_every_sequence_alike() {
    let server = RedisServer::start();
    let url = server.url();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let factor: u32 = std::env::var("SWEEP_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let seed: u64 = std::env::var("SWEEP_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x6469_6666_6572_656e);
    let mut bytes = [0u8; 32];
    for (i, chunk) in bytes.chunks_mut(8).enumerate() {
        chunk.copy_from_slice(&seed.wrapping_add(i as u64).to_le_bytes());
    }
    let config = Config {
        cases: CASES.saturating_mul(factor),
        failure_persistence: None,
        rng_algorithm: RngAlgorithm::ChaCha,
        max_shrink_iters: 500,
        ..Config::default()
    };
    let mut runner = TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &bytes));
    let case = AtomicU64::new(0);
    let result = runner.run(&vec(any::<u8>(), 0..MAX_STEPS * 12), |data| {
        let n = case.fetch_add(1, Ordering::Relaxed);
        let steps = sequence(&data, MAX_STEPS);
        let clock = ManualClock::new();
        rt.block_on(async {
            let redis = RedisStore::builder()
                .prefix(format!("diff{n}"))
                .clock(clock.clone())
                .deadline(Duration::from_secs(5))
                // Longer than the test: Redis's real-time expiry never acts on the
                // injected timeline.
                .min_ttl(Duration::from_secs(3_600))
                .standalone(&url)
                .await
                .expect("standalone");
            Pair::new(redis, clock, start_ns(n)).run(&steps).await
        })
        .map_err(TestCaseError::fail)
    });
    if let Err(e) = result {
        panic!("memory and Redis differ (seed {seed}): {e}");
    }
}
