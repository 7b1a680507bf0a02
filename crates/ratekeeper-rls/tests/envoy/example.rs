//! The README's Envoy configuration is one Envoy 1.40 accepts.

use std::path::Path;

use crate::harness;

/// `envoy --mode validate` accepts `examples/envoy.yaml` as written (the tests run it with
/// other ports, so this checks the file users copy).
#[test]
fn envoy_accepts_the_example_configuration() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/envoy.yaml");
    if let Err(output) = harness::validate(&example) {
        panic!("Envoy rejects {}:\n{output}", example.display());
    }
}
