//! The boilerplate every runnable example shares: the listen address, the tracing
//! subscriber and serving with connect info. Each app, with its rate-limit code, lives in
//! its own file: the in-memory axum apps in this package (`examples/quickstart.rs`, ...), the
//! ones with heavier dependencies in packages beside it (`examples/redis/`, `examples/grpc/`,
//! `examples/client/`, `examples/config/`, `examples/chart/`), which depend on this one. The
//! end-to-end tests include those files, so they exercise exactly what `cargo run --example
//! ...` serves.
//!
//! ```no_run
//! use axum::{Router, routing::get};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> std::io::Result<()> {
//! ratekeeper_examples::init_tracing();
//! let app = Router::new().route("/", get(|| async { "hello\n" }));
//! ratekeeper_examples::serve(app, &ratekeeper_examples::listen_addr()).await
//! # }
//! ```

use std::net::SocketAddr;

use axum::Router;

/// The address examples listen on when `ADDR` is not set.
pub const DEFAULT_ADDR: &str = "127.0.0.1:3000";

/// The address an example listens on: the `ADDR` environment variable, or
/// [`DEFAULT_ADDR`] (`127.0.0.1:3000`; [`serve`] then takes a free port when it is taken).
///
/// ```
/// let addr = ratekeeper_examples::listen_addr();
/// if std::env::var_os("ADDR").is_none() {
///     assert_eq!(addr, "127.0.0.1:3000");
/// }
/// ```
pub fn listen_addr() -> String {
    std::env::var("ADDR").unwrap_or_else(|_| DEFAULT_ADDR.to_owned())
}

/// Binds `addr`; when it is in use and `fall_back` is set, a free port on 127.0.0.1
/// instead (with a line on stderr saying so), so two examples run side by side without a
/// port of their own each. [`serve`] falls back only when `ADDR` is not set: an address
/// asked for explicitly is an error when taken.
///
/// # Errors
///
/// When neither can be bound (or `addr` is taken and `fall_back` is off).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::io::Result<()> {
/// let taken = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
/// let addr = taken.local_addr()?.to_string();
/// let other = ratekeeper_examples::bind(&addr, true).await?;
/// assert_ne!(other.local_addr()?, taken.local_addr()?);
/// assert!(ratekeeper_examples::bind(&addr, false).await.is_err());
/// # Ok(())
/// # }
/// ```
pub async fn bind(addr: &str, fall_back: bool) -> std::io::Result<tokio::net::TcpListener> {
    match tokio::net::TcpListener::bind(addr).await {
        Err(err) if fall_back && err.kind() == std::io::ErrorKind::AddrInUse => {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            eprintln!(
                "{addr} is in use; listening on {} instead (set ADDR to choose)",
                listener.local_addr()?
            );
            Ok(listener)
        }
        other => other,
    }
}

/// Installs a `tracing` subscriber that prints to stdout, filtered by `RUST_LOG` (default
/// `info`), so the layer's log lines (a missing peer address, a store error) are visible.
/// `RUST_LOG` is a list of `target=level` directives and at most one bare default level, such
/// as `info,ratekeeper::decision=debug` (`tracing_subscriber::filter::Targets`); a value that
/// does not parse falls back to `info`. Does nothing when a subscriber is already installed.
///
/// ```
/// ratekeeper_examples::init_tracing();
/// ratekeeper_examples::init_tracing(); // a second call is harmless
/// ```
pub fn init_tracing() {
    use tracing_subscriber::filter::{LevelFilter, Targets};
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;

    let filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|directives| directives.parse::<Targets>().ok())
        .unwrap_or_else(|| Targets::new().with_default(LevelFilter::INFO));
    let _ = tracing_subscriber::registry()
        .with(tracing_subscriber::fmt::layer())
        .with(filter)
        .try_init();
}

/// Binds `addr`, prints `listening on <addr>` once connections are accepted, and serves
/// `app` with connect info (so the peer IP is known) until Ctrl-C. When `ADDR` is not set
/// and `addr` is in use (another example on port 3000), it serves on a free port instead
/// and prints that one ([`bind`]).
///
/// # Errors
///
/// When the address cannot be bound or the server fails.
///
/// ```no_run
/// use axum::{Router, routing::get};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::io::Result<()> {
/// let app = Router::new().route("/", get(|| async { "hello\n" }));
/// ratekeeper_examples::serve(app, "127.0.0.1:3000").await
/// # }
/// ```
pub async fn serve(app: Router, addr: &str) -> std::io::Result<()> {
    let listener = bind(addr, std::env::var_os("ADDR").is_none()).await?;
    println!("listening on {}", listener.local_addr()?);
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await
}

/// Prints `error: <err>` (its `Display`, one sentence: never the `Debug` form that `main`
/// returning `Err` would print) to stderr and returns the failure exit code.
///
/// ```
/// let err = std::io::Error::other("the address is already in use");
/// assert_eq!(ratekeeper_examples::fail(&err), std::process::ExitCode::FAILURE);
/// ```
pub fn fail(err: &dyn std::error::Error) -> std::process::ExitCode {
    eprintln!("error: {err}");
    std::process::ExitCode::FAILURE
}

/// `main`'s exit code for what the example's `run` returned: success, or `error: <err>` (its
/// `Display`, as [`fail`] prints it) and the failure exit code.
///
/// ```
/// use std::process::ExitCode;
/// assert_eq!(ratekeeper_examples::exit(Ok::<(), std::io::Error>(())), ExitCode::SUCCESS);
/// let err = std::io::Error::other("the address is already in use");
/// assert_eq!(ratekeeper_examples::exit(Err::<(), _>(err)), ExitCode::FAILURE);
/// ```
pub fn exit<E: std::fmt::Display>(result: Result<(), E>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            std::process::ExitCode::FAILURE
        }
    }
}
