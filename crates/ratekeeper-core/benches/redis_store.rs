//! Redis store throughput and the negative cache under an abusive client.
//!
//! Starts its own `redis-server` on a free loopback port (killed on exit) and prints:
//! - decisions per second of `RedisStore` (GCRA script, one round trip per decision) with
//!   1 and 64 concurrent callers over distinct keys;
//! - the share of an abusive client's requests that the negative cache answers without Redis.
//!
//! Run: `cargo bench -p ratekeeper-core --features redis --bench redis_store`
//! (`RATEKEEPER_BENCH_SECS` sets the length of each throughput run, default 3 s).

use std::net::TcpListener;
use std::num::NonZeroU32;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ratekeeper_core::store::Store;
use ratekeeper_core::store::redis::RedisStore;
use ratekeeper_core::{Key, Policy, Quota};

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_redis() -> (Server, u16) {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port");
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
        ])
        .args(["--appendonly", "no"])
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server (apt-get install redis-server)");
    let server = Server(child);
    for _ in 0..500 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return (server, port);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("redis-server did not start");
}

async fn throughput(
    store: &Arc<RedisStore>,
    id: ratekeeper_core::store::PolicyId,
    tasks: usize,
    secs: u64,
) -> f64 {
    let start = Instant::now();
    let until = start + Duration::from_secs(secs);
    let mut handles = Vec::new();
    for t in 0..tasks {
        let store = Arc::clone(store);
        handles.push(tokio::spawn(async move {
            let mut n = 0u64;
            while Instant::now() < until {
                let key = Key::from(format!("bench:{t}:{}", n % 1_000));
                store
                    .check_async(&[(id, key, 1)])
                    .await
                    .expect("redis decides");
                n += 1;
            }
            n
        }));
    }
    let mut total = 0;
    for h in handles {
        total += h.await.expect("task");
    }
    total as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    let secs: u64 = std::env::var("RATEKEEPER_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let (_server, port) = start_redis();
    let url = format!("redis://127.0.0.1:{port}/");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let mut store = RedisStore::builder()
            .deadline(Duration::from_secs(1))
            .standalone(&url)
            .await
            .expect("store");
        let big = store
            .register(&Policy::new("big", Quota::per_second(NonZeroU32::new(1_000_000_000).expect("n"))))
            .expect("register");
        let small = store
            .register(&Policy::new("small", Quota::per_minute(NonZeroU32::new(10).expect("n"))))
            .expect("register");
        let store = Arc::new(store);
        // Warm up (connect, load the script).
        throughput(&store, big, 4, 1).await;
        let one = throughput(&store, big, 1, secs).await;
        let many = throughput(&store, big, 64, secs).await;
        println!("redis store, 1 caller:   {one:>10.0} decisions/s");
        println!("redis store, 64 callers: {many:>10.0} decisions/s");

        // An abusive client: 20 000 requests back to back on one key, quota 10 per minute.
        let before = store.stats();
        let abuser = Key::from("abuser");
        let n = 20_000u64;
        let start = Instant::now();
        let mut allowed = 0;
        for _ in 0..n {
            if store
                .check_async(&[(small, abuser.clone(), 1)])
                .await
                .expect("decides")
                .is_allowed()
            {
                allowed += 1;
            }
        }
        let took = start.elapsed();
        let after = store.stats();
        let hits = after.negative_cache_hits - before.negative_cache_hits;
        let trips = after.redis_decisions - before.redis_decisions;
        println!(
            "abusive client: {n} requests, {allowed} allowed, {hits} answered by the negative cache ({:.2} %), {trips} Redis round trips, {:.0} requests/s",
            100.0 * hits as f64 / n as f64,
            n as f64 / took.as_secs_f64()
        );
    });
}
