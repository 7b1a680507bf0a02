//! Issue 11: the concurrency limit across instances. Three instances (each its own Redis
//! connection, layer and server) share "100 concurrent requests per merchant" through
//! `RedisStore::slots`, on standalone Redis and on Cluster; a `kill -9`ed instance's slots
//! free within the lease.

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ratekeeper_axum::core::Key;
use ratekeeper_axum::core::store::redis::{RedisSlots, RedisStore};
use ratekeeper_axum::core::store::slots::{Acquired, SharedSlots};
use ratekeeper_tests::redis::{RedisCluster, RedisServer};
use ratekeeper_tests::slots::{Backend, InFlight, instance};
use ratekeeper_tests::spawn;

const MAX: u32 = 100;
/// The lease of these tests: a dead instance's slots are free at most this long after it
/// dies (renewed every lease / 3 while a request runs).
const LEASE: Duration = Duration::from_millis(1_500);
/// How long each admitted request stays in the handler.
const HOLD: Duration = Duration::from_millis(1_000);

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(400)
        .timeout(Duration::from_secs(30))
        .build()
        .expect("reqwest client")
}

async fn get(client: &reqwest::Client, addr: std::net::SocketAddr, merchant: &str) -> u16 {
    client
        .get(format!("http://{addr}/"))
        .header("x-merchant", merchant)
        .send()
        .await
        .map(|r| r.status().as_u16())
        .unwrap_or(0)
}

/// 3 instances, limit 100 per merchant, 300 concurrent slow requests (100 to each): at no
/// moment more than 100 in flight for the merchant; the 100 slots are all used; the rest
/// get 429; another merchant is not affected.
async fn three_instances_never_exceed_the_limit(backend: Backend, prefix: &str) {
    let gauge = Arc::new(InFlight::default());
    let mut addrs = Vec::new();
    for _ in 0..3 {
        let app = instance(&backend, prefix, MAX, LEASE, HOLD, Arc::clone(&gauge)).await;
        addrs.push(spawn(app).await);
    }
    let client = client();
    let mut tasks = Vec::new();
    for i in 0..300 {
        let (client, addr) = (client.clone(), addrs[i % 3]);
        tasks.push(tokio::spawn(async move { get(&client, addr, "m-1").await }));
    }
    let mut ok = 0;
    let mut limited = 0;
    for t in tasks {
        match t.await.expect("request task") {
            200 => ok += 1,
            429 => limited += 1,
            other => panic!("unexpected status {other}"),
        }
    }
    assert!(
        gauge.max_seen() <= MAX as usize,
        "{} in flight at once, limit {MAX}",
        gauge.max_seen()
    );
    assert!(ok >= MAX as usize, "only {ok} admitted");
    assert!(limited > 0, "nothing was limited");
    assert_eq!(ok + limited, 300);
    // Every slot was released at the end of its response: 100 fit again at once.
    let again: Vec<_> = (0..MAX)
        .map(|i| {
            let (client, addr) = (client.clone(), addrs[i as usize % 3]);
            tokio::spawn(async move { get(&client, addr, "m-1").await })
        })
        .collect();
    for t in again {
        assert_eq!(t.await.expect("request task"), 200);
    }
    eprintln!(
        "three instances: {ok} admitted, {limited} limited, at most {} in flight",
        gauge.max_seen()
    );
}

/// A child process instance, killed with SIGKILL on drop if still alive.
struct ChildInstance {
    child: Child,
    addr: std::net::SocketAddr,
}

impl ChildInstance {
    fn start(backend: &Backend, prefix: &str, hold: Duration) -> Self {
        let [kind, urls] = backend.to_args();
        let mut child = Command::new(env!("CARGO_BIN_EXE_slots_instance"))
            .args([
                kind,
                urls,
                prefix.to_owned(),
                MAX.to_string(),
                LEASE.as_millis().to_string(),
                hold.as_millis().to_string(),
            ])
            .stdout(Stdio::piped())
            .spawn()
            .expect("start slots_instance");
        let stdout = child.stdout.take().expect("child stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read child address");
        let addr = line
            .trim()
            .strip_prefix("ADDR ")
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("child said {line:?}"));
        Self { child, addr }
    }

    fn kill9(&mut self) {
        let status = Command::new("kill")
            .args(["-9", &self.child.id().to_string()])
            .status()
            .expect("kill -9");
        assert!(status.success());
        let _ = self.child.wait();
    }
}

impl Drop for ChildInstance {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An instance in its own process takes all 100 slots of a merchant with requests that
/// would run for a minute; the other instance refuses the merchant; after `kill -9` of the
/// process (no release, no renewal) the slots are still taken at first, and free within
/// the lease.
async fn killed_instance_frees_its_slots_within_the_lease(backend: Backend, prefix: &str) {
    let mut child = ChildInstance::start(&backend, prefix, Duration::from_secs(60));
    let gauge = Arc::new(InFlight::default());
    let survivor = spawn(
        instance(
            &backend,
            prefix,
            MAX,
            LEASE,
            Duration::from_millis(10),
            gauge,
        )
        .await,
    )
    .await;
    let client = client();
    let hanging: Vec<_> = (0..MAX)
        .map(|_| {
            let (client, addr) = (client.clone(), child.addr);
            tokio::spawn(async move { get(&client, addr, "m-2").await })
        })
        .collect();
    // Let the child take its slots.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        hanging.iter().all(|t| !t.is_finished()),
        "the child answered its requests instead of holding them"
    );
    // Wait (well past several renewals) until the child holds all 100 slots.
    let started = Instant::now();
    loop {
        if get(&client, survivor, "m-2").await == 429 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the child never took the 100 slots"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Its leases have been renewed: still full after more than one lease.
    tokio::time::sleep(LEASE + LEASE / 2).await;
    assert_eq!(
        get(&client, survivor, "m-2").await,
        429,
        "slots lost while renewed"
    );

    child.kill9();
    let killed = Instant::now();
    assert_eq!(
        get(&client, survivor, "m-2").await,
        429,
        "the slots freed at once: not a lease expiry"
    );
    let freed = loop {
        if get(&client, survivor, "m-2").await == 200 {
            break killed.elapsed();
        }
        assert!(
            killed.elapsed() < LEASE * 3,
            "slots still taken {:?} after kill -9",
            killed.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        freed <= LEASE + Duration::from_millis(300),
        "slots freed after {freed:?}, lease {LEASE:?}"
    );
    for t in hanging {
        // The killed instance's connections fail.
        assert_ne!(t.await.expect("request task"), 200);
    }
    eprintln!("kill -9: slots free {freed:?} after the kill (lease {LEASE:?})");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrency_across_three_instances_standalone() {
    let server = RedisServer::start();
    let backend = Backend::Standalone(server.url());
    three_instances_never_exceed_the_limit(backend.clone(), "c3").await;
    killed_instance_frees_its_slots_within_the_lease(backend, "k9").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrency_across_three_instances_cluster() {
    let cluster = RedisCluster::start();
    let backend = Backend::Cluster(cluster.urls());
    three_instances_never_exceed_the_limit(backend.clone(), "c3").await;
    killed_instance_frees_its_slots_within_the_lease(backend, "k9").await;
}

/// A lease longer than Redis can expire is lowered to `RedisSlots::MAX_LEASE`: the slot is
/// taken, and its set has a TTL. (Unbounded, the script added the slot, then PEXPIRE failed:
/// the request failed and the slot stayed held, with no TTL, forever.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_lease_is_capped_and_the_slot_still_expires() {
    let server = RedisServer::start();
    let store = RedisStore::builder()
        .deadline(Duration::from_secs(2))
        .standalone(&server.url())
        .await
        .expect("store");
    let slots = store.slots().lease(Duration::MAX);
    let key = Key::from("merchant-1");
    let held = slots.acquire(&key, 2).await;
    assert!(
        matches!(held, Ok(Acquired::Held { free: 1, .. })),
        "{:?}",
        held.as_ref().map(|_| ()).map_err(ToString::to_string)
    );
    let ttl: i64 = server
        .cli(&["PTTL", &slots.redis_key(&key)])
        .expect("redis-cli")
        .trim()
        .parse()
        .expect("PTTL");
    let max = i64::try_from(RedisSlots::MAX_LEASE.as_millis()).unwrap();
    assert!(ttl > 0 && ttl <= max, "PTTL {ttl}");
    assert_eq!(slots.lease_time(), RedisSlots::MAX_LEASE);
    drop(held);
}
