//! The decision deadline, exactly, on a virtual clock: a Redis that stops answering (a TCP
//! listener that answers the store's start, then accepts and reads but never answers
//! anything) under tokio's paused time. Each decision sent to it comes at its deadline to
//! the ms (the timer's resolution): not before, not later; after the breaker's threshold of
//! failures the breaker answers at once, with no wait at all (the reported scenario's "R4, R5 do not
//! wait"). On the paused clock a loaded machine cannot blur either figure.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ratekeeper_axum::core::store::redis::RedisStore;
use ratekeeper_axum::core::store::{FailurePolicy, Store};
use ratekeeper_axum::core::{Key, Policy, Quota};
use tokio::time::Instant;

/// The decision deadline under test.
const DEADLINE: Duration = Duration::from_millis(50);
/// The timer's resolution: a deadline fires at the first ms tick at or after it.
const TICK: Duration = Duration::from_millis(1);

/// A listener on 127.0.0.1 that speaks just enough RESP to let a store start (every
/// command answered `+OK`, `TIME` with a time, `PING` with `PONG`; `SUBSCRIBE` closes the
/// connection), never answers a script call (`EVALSHA`, `EVAL`), and once `silent` is set
/// answers nothing at all, on any connection, old or new: a Redis that accepts and never
/// answers.
fn silent_redis(silent: Arc<AtomicBool>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().expect("local addr");
    std::thread::spawn(move || {
        // The store's connection, its subscription attempts and its prober's: a few dozen
        // at most in a test.
        for stream in listener.incoming().take(1_000) {
            let Ok(stream) = stream else {
                return;
            };
            let silent = Arc::clone(&silent);
            std::thread::spawn(move || answer(stream, &silent));
        }
    });
    addr
}

/// Serves one connection until the peer closes it (see [`silent_redis`]).
fn answer(stream: TcpStream, silent: &AtomicBool) {
    let Ok(mut out) = stream.try_clone() else {
        return;
    };
    let mut input = BufReader::new(stream);
    while let Some(command) = read_command(&mut input) {
        let name = command
            .first()
            .map(|c| c.to_ascii_uppercase())
            .unwrap_or_default();
        if silent.load(Ordering::SeqCst) || name == "EVALSHA" || name == "EVAL" {
            continue;
        }
        let reply: &[u8] = match name.as_str() {
            "SUBSCRIBE" => return,
            "PING" => b"+PONG\r\n",
            "TIME" => b"*2\r\n$10\r\n1700000000\r\n$1\r\n0\r\n",
            _ => b"+OK\r\n",
        };
        if out.write_all(reply).is_err() {
            return;
        }
    }
}

/// Reads one RESP command (an array of bulk strings); `None` at the end of the stream or on
/// anything else.
fn read_command(input: &mut impl BufRead) -> Option<Vec<String>> {
    let mut line = String::new();
    input.read_line(&mut line).ok()?;
    let n: usize = line.trim_end().strip_prefix('*')?.parse().ok()?;
    let mut parts = Vec::with_capacity(n.min(64));
    for _ in 0..n {
        line.clear();
        input.read_line(&mut line).ok()?;
        let len: usize = line.trim_end().strip_prefix('$')?.parse().ok()?;
        let mut data = vec![0; len + 2];
        input.read_exact(&mut data).ok()?;
        data.truncate(len);
        parts.push(String::from_utf8_lossy(&data).into_owned());
    }
    Some(parts)
}

/// Redis down or slow (<https://github.com/envoyproxy/ratelimit/issues/462>) on the virtual clock: R1..R3 to a Redis that never answers each come at the
/// deadline exactly (50 ms of paused time, to the timer's 1 ms tick), answered by the
/// failure policy; the third failure opens the breaker, and R4, R5 come at once (0 ms).
#[tokio::test(flavor = "current_thread")]
async fn a_decision_comes_at_its_deadline_exactly_then_the_breaker_answers_at_once() {
    let silent = Arc::new(AtomicBool::new(false));
    let addr = silent_redis(Arc::clone(&silent));
    // Started on the wall clock: the listener answers the start (scripts, TIME).
    let mut store = RedisStore::builder()
        .deadline(DEADLINE)
        .on_failure(FailurePolicy::Allow)
        .breaker(3, Duration::from_secs(60))
        .standalone(&format!("redis://{addr}/"))
        .await
        .expect("the listener answers the store's start");
    let api = store
        .register(&Policy::new(
            "api",
            Quota::per_minute(NonZeroU32::new(3).unwrap()),
        ))
        .unwrap();
    // From now on nothing answers, and time is virtual: it moves only to the next timer
    // when every task waits.
    silent.store(true, Ordering::SeqCst);
    tokio::time::pause();
    let key = Key::from("client");
    for r in 1..=5 {
        let sent = Instant::now();
        let result = store.check_async(&[(api, key.clone(), 1)]).await;
        let took = sent.elapsed();
        let err = result.expect_err("nothing answers: the failure policy decides");
        assert!(err.is_unavailable(), "R{r}: {err:?}");
        if r <= 3 {
            assert!(
                DEADLINE <= took && took <= DEADLINE + TICK,
                "R{r} answered after {took:?}, not at its {DEADLINE:?} deadline"
            );
        } else {
            assert_eq!(took, Duration::ZERO, "R{r} waited with the breaker open");
            assert!(store.is_breaker_open());
        }
    }
    assert_eq!(store.stats().degraded, 5);
}
