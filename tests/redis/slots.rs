//! The concurrency limit across instances. Three instances (each its own Redis
//! connection, layer and server) share "100 concurrent requests per merchant" through
//! `RedisStore::slots`, on standalone Redis and on Cluster; a `kill -9`ed instance's slots
//! free within the lease. With the default lease, a killed holder's slots are free within
//! 3 s on Redis's clock and a holder paused for 1 s keeps them; a slot whose acquire was on
//! the wire when its request was dropped is released.

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
/// dies (renewed every lease / 5 while a request runs).
const LEASE: Duration = Duration::from_millis(1_500);
/// The lease of the tests where no instance dies: renewals (every lease / 5) that a loaded
/// machine delays by seconds never let a live request's slot expire, which would hand it to
/// another request (the documented pause that can hand slots away, not what these tests
/// are about).
const STEADY_LEASE: Duration = Duration::from_secs(30);
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
        let app = instance(
            &backend,
            prefix,
            MAX,
            STEADY_LEASE,
            HOLD,
            Arc::clone(&gauge),
        )
        .await;
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
    /// `lease` zero: the default lease.
    fn start(backend: &Backend, prefix: &str, lease: Duration, hold: Duration) -> Self {
        let [kind, urls] = backend.to_args();
        let mut child = Command::new(env!("CARGO_BIN_EXE_slots_instance"))
            .args([
                kind,
                urls,
                prefix.to_owned(),
                MAX.to_string(),
                lease.as_millis().to_string(),
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

    /// Sends `sig` (`"STOP"`, `"CONT"`) to the process.
    fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .args([format!("-{sig}"), self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success(), "kill -{sig}");
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
        // A stopped process is continued first, so it dies cleanly.
        let _ = Command::new("kill")
            .args(["-CONT", &self.child.id().to_string()])
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An instance in its own process takes all 100 slots of a merchant with requests that
/// would run for a minute; the other instance refuses the merchant; after `kill -9` of the
/// process (no release, no renewal) the slots are still taken at first, and free within
/// the lease.
async fn killed_instance_frees_its_slots_within_the_lease(backend: Backend, prefix: &str) {
    let mut child = ChildInstance::start(&backend, prefix, LEASE, Duration::from_secs(60));
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

/// Redis `TIME` in ms.
fn redis_ms(server: &RedisServer) -> u64 {
    let out = server.cli(&["TIME"]).expect("TIME");
    let mut lines = out
        .lines()
        .map(|l| l.trim().parse::<u64>().expect("TIME number"));
    let (s, us) = (lines.next().expect("seconds"), lines.next().expect("µs"));
    s * 1_000 + us / 1_000
}

/// The expiries (Redis `TIME` ms) of every slot of the one slot set under `prefix`.
fn slot_expiries(server: &RedisServer, prefix: &str) -> Vec<u64> {
    let keys = server.cli(&["KEYS", &format!("{prefix}:*")]).expect("KEYS");
    let keys: Vec<&str> = keys.lines().filter(|l| !l.is_empty()).collect();
    let [key] = keys.as_slice() else {
        panic!("expected one slot set under {prefix}, found {keys:?}");
    };
    let out = server
        .cli(&["ZRANGE", key, "0", "-1", "WITHSCORES"])
        .expect("ZRANGE");
    out.lines()
        .filter(|l| !l.is_empty())
        .skip(1)
        .step_by(2)
        .map(|score| score.trim().parse().expect("score"))
        .collect()
}

/// A child instance (default lease) takes all 100 slots of merchant `m-3` with requests
/// that would run a minute; `survivor` refuses the merchant once it has them.
async fn child_holding_all_slots(
    server: &RedisServer,
    prefix: &str,
    client: &reqwest::Client,
    survivor: std::net::SocketAddr,
) -> (ChildInstance, Vec<tokio::task::JoinHandle<u16>>) {
    let backend = Backend::Standalone(server.url());
    let child = ChildInstance::start(&backend, prefix, Duration::ZERO, Duration::from_secs(60));
    let hanging: Vec<_> = (0..MAX)
        .map(|_| {
            let (client, addr) = (client.clone(), child.addr);
            tokio::spawn(async move { get(&client, addr, "m-3").await })
        })
        .collect();
    let started = Instant::now();
    while slot_count(server, prefix) < MAX as usize {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the child never took the 100 slots"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        get(client, survivor, "m-3").await,
        429,
        "the child holds them all"
    );
    (child, hanging)
}

fn slot_count(server: &RedisServer, prefix: &str) -> usize {
    let keys = server
        .cli(&["KEYS", &format!("{prefix}:*")])
        .unwrap_or_default();
    keys.lines()
        .filter(|l| !l.is_empty())
        .map(|k| {
            server
                .cli(&["ZCARD", k])
                .and_then(|n| n.trim().parse::<usize>().ok())
                .unwrap_or(0)
        })
        .sum()
}

/// With the default lease (2.5 s, renewed every 0.5 s), the slots of a `kill -9`ed holder of
/// 100 expire within 3 s of the kill on Redis's clock (every slot's expiry, read against
/// Redis `TIME` right after the kill), and another instance (its own store and connection)
/// has taken all 100 soon after (wall-clock outer limit 6 s; the former 10 s lease took 8 to
/// 10 s), never more than 100 held at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_holder_of_100_slots_has_them_all_taken_by_another_instance_within_3_s() {
    let server = RedisServer::start();
    let prefix = "k9default";
    let backend = Backend::Standalone(server.url());
    let survivor = spawn(
        instance(
            &backend,
            prefix,
            MAX,
            Duration::ZERO,
            Duration::from_millis(10),
            Arc::new(InFlight::default()),
        )
        .await,
    )
    .await;
    let client = client();
    let (mut child, hanging) = child_holding_all_slots(&server, prefix, &client, survivor).await;
    // The other instance, taking slots itself (one acquire at a time: light load).
    let taker = backend.store(prefix).await.slots();
    let merchant = Key::tuple([Key::from("x-merchant"), Key::from("m-3")]);
    let keys = server.cli(&["KEYS", &format!("{prefix}:*")]).expect("KEYS");
    assert_eq!(
        keys.trim(),
        taker.redis_key(&merchant),
        "the layer's slot set"
    );
    // Several renewals later, still all held.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(
        slot_count(&server, prefix),
        MAX as usize,
        "slots lost while renewed"
    );

    child.kill9();
    let killed = Instant::now();
    let killed_at = redis_ms(&server);
    let expiries = slot_expiries(&server, prefix);
    assert_eq!(expiries.len(), MAX as usize);
    let last = expiries.iter().max().copied().unwrap_or(0);
    assert!(
        expiries.iter().all(|e| *e > killed_at),
        "every slot was still held at the kill"
    );
    assert!(
        last <= killed_at + 3_000,
        "a slot expires {} ms after the kill on Redis's clock",
        last - killed_at
    );
    let mut taken = Vec::new();
    while taken.len() < MAX as usize {
        assert!(
            killed.elapsed() < Duration::from_secs(6),
            "{} of {MAX} slots taken {:?} after kill -9",
            taken.len(),
            killed.elapsed()
        );
        match taker.acquire(&merchant, MAX).await {
            Ok(Acquired::Held { lease, .. }) => taken.push(lease),
            Ok(Acquired::Full) => tokio::time::sleep(Duration::from_millis(10)).await,
            Err(err) => panic!("acquire failed: {err}"),
        }
    }
    let all_taken = killed.elapsed();
    let full_at = redis_ms(&server);
    assert_eq!(slot_count(&server, prefix), MAX as usize);
    for t in hanging {
        assert_ne!(t.await.expect("request task"), 200);
    }
    eprintln!(
        "kill -9, default lease: last slot expiry {} ms after the kill (Redis TIME), all {MAX} \
         taken by another instance {all_taken:?} after it ({} ms on Redis's clock)",
        last - killed_at,
        full_at - killed_at
    );
}

/// With the default lease, a holder of 100 slots stopped (`SIGSTOP`) for 1 s keeps them:
/// every request to another instance during the pause and after it is refused (never more
/// than 100 in flight), and no slot's expiry ever falls behind Redis `TIME`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_holder_paused_for_1_s_keeps_its_slots() {
    let server = RedisServer::start();
    let prefix = "pause";
    let gauge = Arc::new(InFlight::default());
    let backend = Backend::Standalone(server.url());
    let survivor = spawn(
        instance(
            &backend,
            prefix,
            MAX,
            Duration::ZERO,
            Duration::from_secs(30),
            Arc::clone(&gauge),
        )
        .await,
    )
    .await;
    let client = client();
    let (child, hanging) = child_holding_all_slots(&server, prefix, &client, survivor).await;
    tokio::time::sleep(Duration::from_millis(700)).await;

    child.signal("STOP");
    let stopped = Instant::now();
    let mut probes = 0;
    let mut continued = None;
    while stopped.elapsed() < Duration::from_millis(3_000) {
        if continued.is_none() && stopped.elapsed() >= Duration::from_secs(1) {
            child.signal("CONT");
            continued = Some(stopped.elapsed());
        }
        assert_eq!(
            get(&client, survivor, "m-3").await,
            429,
            "another instance got a slot {:?} after the holder was stopped",
            stopped.elapsed()
        );
        let now = redis_ms(&server);
        let expiries = slot_expiries(&server, prefix);
        assert_eq!(expiries.len(), MAX as usize, "{:?}", stopped.elapsed());
        assert!(expiries.iter().all(|e| *e > now), "a slot expired");
        probes += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(gauge.max_seen(), 0, "the survivor never ran a request");
    drop(child);
    for t in hanging {
        assert_ne!(t.await.expect("request task"), 200);
    }
    eprintln!("SIGSTOP: continued after {continued:?}; {probes} probes, all refused");
}

/// A slot taken by a request cancelled in flight (<https://github.com/rapina-rs/rapina/issues/516>:
/// the in-flight count leaked when the client disconnected):
/// `ConcurrencyLimitLayer::new(1).key(GlobalKey).shared(store.slots())` on a Redis store (deadline
/// 2 s, slot lease 10 s). Redis is paused while request A's acquire call is on the wire; A's client
/// disconnects after 200 ms (the request future is dropped); Redis resumes. 500 ms later the slot
/// set holds 0 slots and request B gets 200 (not a 429 for the whole 10 s lease).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_whose_request_was_dropped_while_its_acquire_was_on_the_wire_is_released() {
    use axum::Router;
    use axum::routing::get as route_get;
    use ratekeeper_axum::concurrency::ConcurrencyLimitLayer;
    use ratekeeper_axum::key::GlobalKey;

    let server = RedisServer::start();
    let store = RedisStore::builder()
        .deadline(Duration::from_secs(2))
        .standalone(&server.url())
        .await
        .expect("store");
    let slots = store.slots().lease(Duration::from_secs(10));
    let slot_key = slots.redis_key(&Key::Global);
    let one = std::num::NonZeroU32::new(1).expect("non-zero");
    let app = Router::new()
        .route("/", route_get(|| async { "ok" }))
        .layer(ConcurrencyLimitLayer::new(one).key(GlobalKey).shared(slots));
    let addr = spawn(app).await;
    let url = format!("http://{addr}/");
    let client = client();
    let status = |r: reqwest::Result<reqwest::Response>| r.map(|r| r.status().as_u16());
    assert_eq!(
        status(client.get(&url).send().await).ok(),
        Some(200),
        "warm-up"
    );

    server.signal("STOP");
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(200))
        .build()
        .expect("client");
    let a = impatient.get(&url).send().await;
    assert!(
        a.as_ref().is_err_and(reqwest::Error::is_timeout),
        "A's client gave up after 200 ms: {a:?}"
    );
    server.signal("CONT");
    tokio::time::sleep(Duration::from_millis(500)).await;

    let held: i64 = server
        .cli(&["ZCARD", &slot_key])
        .expect("ZCARD")
        .trim()
        .parse()
        .expect("number");
    assert_eq!(held, 0, "slots held in {slot_key} after A was dropped");
    assert_eq!(status(client.get(&url).send().await).ok(), Some(200), "B");
}
