//! The bounded adversarial-input sweep: the generators and properties of
//! `ratekeeper_tests::sweep` (shared with the `cargo fuzz` targets in `fuzz/`) run for a fixed
//! number of cases from a fixed seed, so every run checks the same inputs and a failure
//! reproduces. proptest shrinks a failing case to its smallest byte string.
//!
//! `SWEEP_CASES` multiplies the number of cases (default 1) for a longer local run, and
//! `SWEEP_SEED` (a number) picks another seed; CI uses neither.

use proptest::collection::vec;
use proptest::prelude::any;
use ratekeeper_tests::sweep;

/// Runs `target` on `cases` byte strings (up to `max_len` bytes) from the fixed seed.
fn run(name: &str, cases: u32, max_len: usize, target: fn(&[u8])) {
    let (mut runner, seed) = sweep::seeded_runner(cases, 0x7261_7465_6b65_6570, 2_000);
    let result = runner.run(&vec(any::<u8>(), 0..max_len), |data| {
        target(&data);
        Ok(())
    });
    if let Err(e) = result {
        panic!("sweep target {name} failed (seed {seed}): {e}");
    }
}

#[test]
fn sweep_quota_strings() {
    run("quota_string", 40_000, 64, sweep::quota_string);
}

#[test]
fn sweep_policy_documents() {
    run("policy_document", 20_000, 64, sweep::policy_document);
}

#[test]
fn sweep_forwarded_headers() {
    run("forwarded", 40_000, 128, sweep::forwarded);
}

#[test]
fn sweep_header_keys() {
    run("header_key", 10_000, 32, sweep::header_key);
}

#[test]
fn sweep_header_merge() {
    run("header_merge", 10_000, 32, sweep::header_merge);
}

#[test]
fn sweep_layer_traces() {
    run("layer_trace", 15_000, 256, sweep::layer_trace);
}

#[test]
fn sweep_refund_receipts() {
    run("refund_receipts", 4_000, 160, sweep::refund_receipts);
}

#[test]
fn sweep_config_documents() {
    run("config_document", 3_000, 64, sweep::config_document);
}

#[test]
fn sweep_polite_headers() {
    run("polite_headers", 2_000, 48, sweep::polite_headers);
}

#[test]
fn sweep_compact_keys() {
    run("compact_keys", 300, 2_048, sweep::compact_keys);
}
