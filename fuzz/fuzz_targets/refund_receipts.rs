//! `cargo +nightly fuzz run refund_receipts`: the `refund_receipts` generator and properties of
//! `ratekeeper_tests::sweep` (the stable sweep in `tests/sweep/main.rs` runs the same).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ratekeeper_tests::sweep::refund_receipts(data));
