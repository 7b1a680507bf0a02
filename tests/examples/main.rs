//! Every example's end-to-end test: the example's own code (included from `examples/`) served
//! on loopback and driven by a real client.

// Each module includes the example it tests under the example's own name
// (`quickstart::quickstart`), so the module path says which example a test drives.
#![allow(clippy::module_inception)]

mod adaptive;
mod admin;
mod bans;
mod from_config;
mod grpc;
mod llm_tokens;
mod observability;
mod outbound_throttle;
mod polite_client;
mod production;
mod quickstart;
