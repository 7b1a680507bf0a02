//! Helpers for the end-to-end tests: real servers on 127.0.0.1, port 0, and a client for them.
//!
//! Most tests need three lines: an app, a server for it, requests to it.
//!
//! ```text
//! let server = TestServer::start(ok_app().layer(layer)).await;
//! let res = server.get("/").send().await.unwrap();
//! assert_eq!(res.status(), 200);
//! ```
//!
//! Nothing here hides a failure: a port that cannot be bound panics in the test's own task
//! with the OS error; a server that stops shows as a failed request in the test.

pub mod differential;
pub mod fleet;
pub mod flood;
pub mod keys;
pub mod logs;
pub mod readme;
pub mod redis;
pub mod slots;
pub mod streams;
pub mod sweep;
pub mod turns;

use std::convert::Infallible;
use std::net::SocketAddr;

use axum::Router;
use axum::extract::Request;
use axum::response::Response;
use axum::routing::get;
use tokio::net::TcpListener;

/// Binds a listener on `127.0.0.1` with a port the OS picks; returns it and its address.
///
/// # Panics
///
/// When no loopback port can be bound or its address cannot be read (a test environment
/// failure): the calling test fails with the OS error.
pub async fn bind_loopback() -> (TcpListener, SocketAddr) {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("cannot bind a test server to 127.0.0.1:0: {e}"));
    let addr = listener
        .local_addr()
        .unwrap_or_else(|e| panic!("cannot read the test server's bound address: {e}"));
    (listener, addr)
}

/// Serves `app` with connect info (`ConnectInfo<SocketAddr>`, so peer-IP keys work) on
/// `127.0.0.1:0` in a background task; returns its address.
///
/// # Panics
///
/// As [`bind_loopback`]. Should the server itself fail later, its task panics with the
/// error and the test's next request to it fails.
pub async fn spawn(app: Router) -> SocketAddr {
    spawn_service(app).await
}

/// [`spawn`] for any `Request -> Response` service, such as a router wrapped in an outer
/// layer (`NormalizePathLayer::trim_trailing_slash().layer(router)`).
///
/// # Panics
///
/// As [`spawn`].
pub async fn spawn_service<S>(svc: S) -> SocketAddr
where
    S: tower_service::Service<Request, Response = Response, Error = Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send,
{
    let (listener, addr) = bind_loopback().await;
    let make = axum::ServiceExt::<Request>::into_make_service_with_connect_info::<SocketAddr>(svc);
    tokio::spawn(async move {
        axum::serve(listener, make)
            .await
            .unwrap_or_else(|e| panic!("test server on {addr} failed: {e}"));
    });
    addr
}

/// A router with one route, `GET /`, answering `200 ok`: the app most tests put a limiter
/// in front of with `.layer(layer)`.
pub fn ok_app() -> Router {
    Router::new().route("/", get(|| async { "ok" }))
}

/// A server under test on loopback and the `reqwest` client that talks to it.
///
/// Clones share the server and the client's connection pool.
#[derive(Clone, Debug)]
pub struct TestServer {
    addr: SocketAddr,
    client: reqwest::Client,
}

impl TestServer {
    /// Serves `app` as [`spawn`] does, with a default `reqwest::Client`.
    ///
    /// # Panics
    ///
    /// As [`spawn`].
    pub async fn start(app: Router) -> Self {
        Self::at(spawn(app).await)
    }

    /// A server already listening on `addr` (say, from [`spawn_service`]), with a default
    /// `reqwest::Client`.
    pub fn at(addr: SocketAddr) -> Self {
        Self {
            addr,
            client: reqwest::Client::new(),
        }
    }

    /// The same server, reached through `client` (say, [`fresh_connection_client`]).
    #[must_use]
    pub fn with_client(self, client: reqwest::Client) -> Self {
        Self { client, ..self }
    }

    /// `http://127.0.0.1:<port>` followed by `path` (a path and query, starting with `/`).
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// A `GET` of `path` on this server.
    pub fn get(&self, path: &str) -> reqwest::RequestBuilder {
        self.client.get(self.url(path))
    }

    /// A `POST` of `path` on this server.
    pub fn post(&self, path: &str) -> reqwest::RequestBuilder {
        self.client.post(self.url(path))
    }

    /// A request with any `method` of `path` on this server.
    pub fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.client.request(method, self.url(path))
    }
}

/// A client that opens a new TCP connection for every request (no keep-alive pool).
///
/// # Panics
///
/// When the client cannot be built.
pub fn fresh_connection_client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .expect("client")
}
