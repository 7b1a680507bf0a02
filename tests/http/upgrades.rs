//! WebSocket sessions and the concurrency limit (the report
//! <https://github.com/wavelens/gradient/pull/197>: upgrades were not held by the limit),
//! over real HTTP/1.1 on loopback: a WebSocket-style upgrade holds its concurrency slot
//! until the upgraded connection closes, through the `UpgradeSlot` the layer hands the
//! handler, not only until the `101` has been sent.

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::http::header::{CONNECTION, UPGRADE};
use axum::response::Response;
use axum::routing::get;
use hyper_util::rt::TokioIo;
use ratekeeper_axum::concurrency::{ConcurrencyLimitLayer, UpgradeSlot};
use ratekeeper_axum::key::GlobalKey;
use ratekeeper_tests::spawn;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Bounds every wait of these tests.
const LIMIT: Duration = Duration::from_secs(10);

/// Answers `101` and serves the upgraded connection until the client closes it, holding the
/// concurrency slot (when `keep`) for as long as the session runs.
async fn ws(mut req: Request, keep: bool) -> Response {
    let permit = keep
        .then(|| {
            req.extensions()
                .get::<UpgradeSlot>()
                .and_then(UpgradeSlot::keep)
        })
        .flatten();
    let on_upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        let _slot = permit;
        if let Ok(upgraded) = on_upgrade.await {
            let mut io = TokioIo::new(upgraded);
            let mut buf = [0u8; 256];
            // Echo until the client closes the connection (bounded by the test's timeouts).
            while let Ok(Ok(n)) = tokio::time::timeout(LIMIT, io.read(&mut buf)).await {
                if n == 0
                    || io
                        .write_all(buf.get(..n).unwrap_or_default())
                        .await
                        .is_err()
                {
                    break;
                }
            }
        }
    });
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(CONNECTION, "upgrade")
        .header(UPGRADE, "websocket")
        .body(Body::empty())
        .unwrap()
}

/// `GET /ws` under a concurrency limit of 1 for everyone.
async fn server(keep: bool) -> SocketAddr {
    let app = Router::new()
        .route("/ws", get(move |req: Request| ws(req, keep)))
        .layer(ConcurrencyLimitLayer::new(NonZeroU32::MIN).key(GlobalKey));
    spawn(app).await
}

/// A raw upgrade request; returns the open socket and the response head.
async fn upgrade(addr: SocketAddr) -> (TcpStream, String) {
    let mut socket = tokio::time::timeout(LIMIT, TcpStream::connect(addr))
        .await
        .expect("connect in time")
        .expect("connect");
    let request = format!(
        "GET /ws HTTP/1.1\r\nHost: {addr}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    );
    socket.write_all(request.as_bytes()).await.expect("send");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(LIMIT, socket.read(&mut byte))
            .await
            .expect("response in time")
            .expect("read");
        assert!(n == 1 && head.len() < 16_384, "bad response head: {head:?}");
        head.push(byte[0]);
    }
    (socket, String::from_utf8(head).expect("ASCII head"))
}

fn status(head: &str) -> u16 {
    head.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn header<'h>(head: &'h str, name: &str) -> Option<&'h str> {
    head.lines().find_map(|line| {
        let (n, v) = line.split_once(':')?;
        n.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// An upgrade holds its slot (<https://github.com/wavelens/gradient/pull/197>): A gets 101 and
/// keeps the session open; B (t=200 ms) and C (t=400 ms) get 429 with `Retry-After: 1`; after A
/// closes, the next upgrade gets 101.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_holds_its_slot_until_the_session_closes() {
    let addr = server(true).await;
    let (mut a, head) = upgrade(addr).await;
    assert_eq!(status(&head), 101, "{head}");
    // The session works: an echo over the upgraded connection.
    a.write_all(b"ping").await.unwrap();
    let mut echo = [0u8; 4];
    tokio::time::timeout(LIMIT, a.read_exact(&mut echo))
        .await
        .expect("echo in time")
        .unwrap();
    assert_eq!(&echo, b"ping");

    for _ in ["B", "C"] {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let (_, head) = upgrade(addr).await;
        assert_eq!(status(&head), 429, "{head}");
        assert_eq!(header(&head, "retry-after"), Some("1"), "{head}");
    }

    drop(a);
    // The session task sees EOF and drops the permit; the next upgrade gets in (bounded).
    let mut next = 0;
    for _ in 0..100 {
        let (_socket, head) = upgrade(addr).await;
        next = status(&head);
        if next == 101 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(next, 101, "the slot came back after the session closed");
}

/// Without `keep` (<https://github.com/wavelens/gradient/pull/197>), the slot is freed once the 101
/// has gone: what the docs say a handler that does not keep the slot gets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_keep_the_slot_ends_with_the_101() {
    let addr = server(false).await;
    let (_a, head) = upgrade(addr).await;
    assert_eq!(status(&head), 101, "{head}");
    let mut second = 0;
    for _ in 0..100 {
        let (_b, head) = upgrade(addr).await;
        second = status(&head);
        if second == 101 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(second, 101);
}

/// A tunnel holds its slot too (<https://github.com/wavelens/gradient/pull/197>): a `CONNECT`
/// tunnel (HTTP/1.1 here; HTTP/2 extended CONNECT, RFC 8441, is how WebSockets run over HTTP/2)
/// carries no `Upgrade` header field, yet its session also outlives the response: its handler gets
/// an `UpgradeSlot` too and holds the slot until the tunnel closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_tunnel_holds_its_slot_until_the_tunnel_closes() {
    async fn tunnel(mut req: Request) -> Response {
        let permit = req
            .extensions()
            .get::<UpgradeSlot>()
            .and_then(UpgradeSlot::keep);
        let kept = permit.is_some();
        let on_upgrade = hyper::upgrade::on(&mut req);
        tokio::spawn(async move {
            let _slot = permit;
            if let Ok(upgraded) = on_upgrade.await {
                let mut io = TokioIo::new(upgraded);
                let mut buf = [0u8; 64];
                // Until the client closes the tunnel (bounded by the test's timeouts).
                while let Ok(Ok(n)) = tokio::time::timeout(LIMIT, io.read(&mut buf)).await {
                    if n == 0 {
                        break;
                    }
                }
            }
        });
        Response::builder()
            .status(StatusCode::OK)
            .header("x-slot-kept", if kept { "yes" } else { "no" })
            .body(Body::empty())
            .unwrap()
    }
    let app = Router::new()
        .fallback(tunnel)
        .layer(ConcurrencyLimitLayer::new(NonZeroU32::MIN).key(GlobalKey));
    let addr = spawn(app).await;
    let connect = async || {
        let mut socket = tokio::time::timeout(LIMIT, TcpStream::connect(addr))
            .await
            .expect("connect in time")
            .expect("connect");
        let request = "CONNECT 192.0.2.1:443 HTTP/1.1\r\nHost: 192.0.2.1:443\r\n\r\n";
        socket.write_all(request.as_bytes()).await.expect("send");
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            let n = tokio::time::timeout(LIMIT, socket.read(&mut byte))
                .await
                .expect("response in time")
                .expect("read");
            assert!(n == 1 && head.len() < 16_384, "bad response head: {head:?}");
            head.push(byte[0]);
        }
        (socket, String::from_utf8(head).expect("ASCII head"))
    };

    let (a, head) = connect().await;
    assert_eq!(status(&head), 200, "{head}");
    assert_eq!(header(&head, "x-slot-kept"), Some("yes"), "{head}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (_b, head) = connect().await;
    assert_eq!(
        status(&head),
        429,
        "a second tunnel while the first is open: {head}"
    );
    assert_eq!(header(&head, "retry-after"), Some("1"), "{head}");

    drop(a);
    let mut next = 0;
    for _ in 0..100 {
        let (_socket, head) = connect().await;
        next = status(&head);
        if next == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(next, 200, "the slot came back after the tunnel closed");
}
