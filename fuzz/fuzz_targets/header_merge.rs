//! `cargo +nightly fuzz run header_merge`: the `header_merge` generator and properties of
//! `ratekeeper_tests::sweep` (the stable sweep in `tests/sweep/main.rs` runs the same).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ratekeeper_tests::sweep::header_merge(data));
