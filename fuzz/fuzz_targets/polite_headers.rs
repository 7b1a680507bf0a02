//! `cargo +nightly fuzz run polite_headers`: the `polite_headers` generator and properties of
//! `ratekeeper_tests::sweep` (the stable sweep in `tests/sweep/main.rs` runs the same).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ratekeeper_tests::sweep::polite_headers(data));
