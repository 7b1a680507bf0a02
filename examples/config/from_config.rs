//! An axum app whose limits come from a TOML file: `examples/config/ratekeeper.toml` (policies with
//! their algorithms, per-route costs, a route-scoped login limit, tiers by API key, an exempt
//! network, the header style and the mode), or the file named on the command line.
//!
//! ```text
//! ADDR=127.0.0.1:3000 cargo run -p ratekeeper-examples-config --example from_config
//! ADDR=127.0.0.1:3000 cargo run -p ratekeeper-examples-config --example from_config -- path/to/ratekeeper.toml
//! curl -si http://127.0.0.1:3000/search | grep -i x-ratelimit-remaining    # 5 (api: 10 - 5)
//! ```
//!
//! A mistake in the file stops the app with one line naming the file, line, column and field:
//!
//! ```text
//! error: examples/config/ratekeeper.toml:15:9: policies[0].quota: invalid quota "60/mn burst 10": ...
//! ```

use std::path::{Path, PathBuf};

use axum::Router;
use axum::routing::{get, post};
use ratekeeper_axum::config::{ConfigError, LayerConfig};
use ratekeeper_axum::key::KeyExtractor;
use ratekeeper_axum::policy::Resolve;
use ratekeeper_axum::{RateLimitLayer, core::Key};

/// The checked-in configuration: `ratekeeper.toml` beside this file (`examples/config/`).
/// `file!()` is this file's path from the workspace root, which is an ancestor of the
/// directory of whichever package compiles the file (this example's, or the tests' that
/// include it), so the first ancestor holding the file is the root.
pub fn default_path() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let root = manifest_dir
        .ancestors()
        .find(|dir| dir.join(file!()).is_file())
        .unwrap_or(manifest_dir);
    root.join(file!()).with_file_name("ratekeeper.toml")
}

/// Reads the configuration at `path`.
///
/// # Errors
///
/// [`ConfigError`] naming the file, line, column and field of the first mistake.
pub fn load(path: &Path) -> Result<LayerConfig, ConfigError> {
    LayerConfig::from_toml_file(path)
}

/// The app's routes without limits: `/`, `GET /search`, `POST /login`, `GET /items/{id}`.
pub fn routes() -> Router {
    Router::new()
        .route("/", get(|| async { "hello\n" }))
        .route("/search", get(|| async { "search results\n" }))
        .route("/login", post(|| async { "welcome\n" }))
        .route("/items/{id}", get(|| async { "an item\n" }))
}

/// [`routes`] under `layer` (built from the file, or in code: the tests compare both).
/// `Router::layer`, so the route template (`MatchedPath`) is known to the route costs.
pub fn app_with<K, St, R>(layer: RateLimitLayer<K, u64, St, R>) -> Router
where
    K: KeyExtractor,
    St: ratekeeper_axum::core::store::Store<Key>,
    R: Resolve,
{
    routes().layer(layer)
}

/// The app with the limits of `config`.
///
/// # Errors
///
/// The [`BuildError`](ratekeeper_axum::BuildError) of a configuration whose parts do not fit
/// together (an unknown policy in a route, a cost above a burst).
pub fn app(config: &LayerConfig) -> Result<Router, ratekeeper_axum::BuildError> {
    Ok(app_with(config.build()?))
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    ratekeeper_examples::init_tracing();
    let path = std::env::args_os()
        .nth(1)
        .map_or_else(default_path, PathBuf::from);
    let app = match load(&path) {
        Ok(config) => match app(&config) {
            Ok(app) => app,
            Err(err) => return ratekeeper_examples::fail(&err),
        },
        Err(err) => return ratekeeper_examples::fail(&err),
    };
    match ratekeeper_examples::serve(app, &ratekeeper_examples::listen_addr()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => ratekeeper_examples::fail(&err),
    }
}
