//! The middleware's own time, measured on a server that runs on its own OS thread.
//!
//! A test that bounds how long the middleware takes on a request (say, "at most the store's
//! deadline and a margin") cannot bound the client's round trip: on a loaded machine the
//! client, the HTTP stack and any load tasks share the cores with the server, and their
//! queueing is not the middleware's latency. Nor is the time the operating system keeps the
//! server's thread waiting for a CPU: with two busy loops on two cores a thread whose timer
//! expired can wait tens of ms, now and then more than 100 ms, before it runs, and its
//! run-queue delay (Linux `/proc/thread-self/schedstat`) accounts for nearly all of that
//! lateness.
//!
//! So such a server runs on [`OwnThread`], one thread with a current-thread runtime that
//! records its run-queue delay whenever it goes to sleep, and [`timed`], the router's
//! outermost middleware, takes out the delay between the event that woke the thread (a
//! timer, a reply from the store) and the answer. What stays is what the middleware itself
//! takes: its CPU time and its waits for a deadline or for the store, so a request that
//! waits for the store beyond its deadline still fails the bound. [`Timing`] reads both
//! figures back from the response's headers.
//!
//! ```text
//! let (server, layer) = OwnThread::serve(move || async move {
//!     let layer = layer(store_builder.standalone(&url).await.expect("store"));
//!     (app(layer.clone()).layer(axum::middleware::from_fn(timed)), layer)
//! })
//! .await;
//! let res = client.get(format!("http://{}/", server.addr())).send().await?;
//! let timing = Timing::from_headers(res.headers()).expect("timed");
//! assert!(timing.middleware <= Duration::from_millis(300), "{timing:?}");
//! ```

use std::cell::Cell;
use std::future::Future;
use std::net::SocketAddr;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Request};
use axum::middleware::Next;
use axum::response::Response;
use tokio::sync::oneshot;

/// Response header carrying the middleware's own time ([`timed`]), µs.
pub const MIDDLEWARE_US: &str = "x-test-middleware-us";
/// Response header carrying the wall-clock time [`timed`] measured, run-queue delay
/// included, µs.
pub const WALL_US: &str = "x-test-wall-us";

/// How long the calling thread has waited for a CPU while runnable since it started: the
/// second field of Linux `/proc/thread-self/schedstat` (ns). `None` where the file is
/// missing or unreadable (then [`timed`] reports wall-clock time).
fn run_queue_delay() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns = stat.split_whitespace().nth(1)?.parse().ok()?;
    Some(Duration::from_nanos(ns))
}

thread_local! {
    /// The thread's [`run_queue_delay`] when it last parked (went to sleep waiting for a
    /// timer or I/O); recorded on [`OwnThread`]'s runtime only.
    static PARKED_AT: Cell<Option<Duration>> = const { Cell::new(None) };
}

/// Middleware (for `axum::middleware::from_fn`, layered outermost): times everything inside
/// it and reports the middleware's own time in [`MIDDLEWARE_US`] and the wall-clock time in
/// [`WALL_US`], both in µs.
///
/// On [`OwnThread`] the operating system's part is taken out: the run-queue delay of the
/// server's thread since it last went to sleep (or since the request started, if it has
/// not slept since). That is the delay between the timer or the store's reply that woke it
/// and the answer; the sleep itself (the wait for a deadline or for the store) stays in.
/// Elsewhere (a multi-thread runtime, where a request may move between threads) the
/// middleware's time is the wall-clock time.
pub async fn timed(req: Request<Body>, next: Next) -> Response {
    let thread = std::thread::current().id();
    let delay_at_start = run_queue_delay();
    let start = Instant::now();
    let mut res = next.run(req).await;
    let wall = start.elapsed();
    let delays = (delay_at_start, PARKED_AT.get(), run_queue_delay());
    let own = match delays {
        (Some(at_start), Some(parked), Some(now)) if std::thread::current().id() == thread => {
            wall.saturating_sub(now.saturating_sub(parked.max(at_start)))
        }
        _ => wall,
    };
    for (name, time) in [(MIDDLEWARE_US, own), (WALL_US, wall)] {
        if let Ok(v) = HeaderValue::from_str(&time.as_micros().to_string()) {
            res.headers_mut().insert(name, v);
        }
    }
    res
}

/// What [`timed`] measured for one response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// Time inside [`timed`] (the layers below it and the handler), less the run-queue
    /// delay of the server's thread on [`OwnThread`].
    pub middleware: Duration,
    /// The same span in wall-clock time, run-queue delay included.
    pub wall: Duration,
}

impl Timing {
    /// Reads [`MIDDLEWARE_US`] and [`WALL_US`] from a response's headers; `None` when
    /// either is missing or not a number of µs (the response did not pass through
    /// [`timed`]).
    pub fn from_headers(headers: &HeaderMap) -> Option<Self> {
        let micros = |name: &str| {
            headers
                .get(name)?
                .to_str()
                .ok()?
                .parse()
                .ok()
                .map(Duration::from_micros)
        };
        Some(Self {
            middleware: micros(MIDDLEWARE_US)?,
            wall: micros(WALL_US)?,
        })
    }
}

/// A server on its own OS thread and current-thread runtime, on `127.0.0.1` (a port the OS
/// picks), with connect info (`ConnectInfo<SocketAddr>`).
///
/// Everything the router needs is built on that thread (see [`OwnThread::serve`]), so a
/// store's connections and background tasks run there with every request, and the thread
/// records its run-queue delay whenever it parks: [`timed`] can then take out the time the
/// operating system kept a woken request waiting for a CPU. Dropping it stops the runtime
/// and joins the thread.
#[derive(Debug)]
pub struct OwnThread {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl OwnThread {
    /// Starts the thread, runs `build` on its runtime and serves the router it returns;
    /// returns once the server listens, with the value `build` returned beside the router
    /// (say, a clone of the rate-limit layer, for its store's stats). Layer [`timed`]
    /// outermost on the router for the middleware's time.
    ///
    /// # Panics
    ///
    /// With `build`'s own panic (say, a store that cannot connect), or when no loopback port
    /// can be bound. Should the server fail later, the thread panics with the error and the
    /// test's next request to it fails.
    pub async fn serve<B, F, T>(build: B) -> (Self, T)
    where
        B: FnOnce() -> F + Send + 'static,
        F: Future<Output = (Router, T)>,
        T: Send + 'static,
    {
        let (ready_tx, ready_rx) = oneshot::channel();
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .on_thread_park(|| PARKED_AT.set(run_queue_delay()))
                .build()
                .expect("server runtime");
            runtime.block_on(async move {
                let (router, value) = build().await;
                let (listener, addr) = super::bind_loopback().await;
                if ready_tx.send((addr, value)).is_err() {
                    return;
                }
                let make = router.into_make_service_with_connect_info::<SocketAddr>();
                tokio::select! {
                    served = axum::serve(listener, make) => {
                        served.unwrap_or_else(|e| panic!("test server on {addr} failed: {e}"));
                    }
                    _ = stopped => {}
                }
            });
        });
        let (addr, value) = match ready_rx.await {
            Ok(ready) => ready,
            // The thread ended before it listened: pass its panic on.
            Err(_) => match thread.join() {
                Err(panic) => std::panic::resume_unwind(panic),
                Ok(()) => panic!("the server thread ended before it listened"),
            },
        };
        let served = Self {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        };
        (served, value)
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for OwnThread {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
