//! The config reader: lookups on our fixtures (the reference's test tables, with our own
//! files), every error with its place, YAML scalar reading, and hot reload.

mod errors;
mod lookup;
mod share;
mod watch;
mod yaml;

use std::path::PathBuf;

use ratekeeper_rls::config::{LoadOptions, Lookup, Match, RateLimitConfig};

/// A fixture's path.
pub(crate) fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/config/fixtures")
        .join(name)
}

/// Loads a fixture that must load.
pub(crate) fn load(name: &str) -> RateLimitConfig {
    match RateLimitConfig::load_path(&fixture(name), &LoadOptions::default()) {
        Ok(c) => c,
        Err(e) => panic!("{name} does not load: {e}"),
    }
}

/// The match for a descriptor, or a panic naming what came back.
pub(crate) fn limit<'a>(
    config: &'a RateLimitConfig,
    domain: &str,
    entries: &'a [(&'a str, &'a str)],
) -> Match<'a> {
    match config.lookup(domain, entries) {
        Lookup::Limit(m) => m,
        other => panic!("{entries:?} in {domain}: expected a limit, got {other:?}"),
    }
}

/// Asserts that no rule applies.
pub(crate) fn no_limit(config: &RateLimitConfig, domain: &str, entries: &[(&str, &str)]) {
    let got = config.lookup(domain, entries);
    assert!(
        matches!(got, Lookup::NoLimit),
        "{entries:?} in {domain}: expected no limit, got {got:?}"
    );
}
