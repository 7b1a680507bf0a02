//! `cargo +nightly fuzz run compact_keys`: the `compact_keys` generator and properties of
//! `ratekeeper_tests::sweep` (the stable sweep in `tests/sweep/main.rs` runs the same).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ratekeeper_tests::sweep::compact_keys(data));
