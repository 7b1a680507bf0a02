//! Real `redis-server` processes for the tests: standalone servers and a 3-primary,
//! 3-replica cluster, each on free loopback ports, stopped (SIGKILL) when dropped.
//!
//! Nothing here skips: when `redis-server` is missing or does not start, the test fails with
//! a message naming the fix (`apt-get install redis-server redis-tools`, which `.ci/run`
//! does by itself).

use std::collections::HashSet;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The decision deadline of every test store that checks *decisions* (not the failure
/// policy): 30 s.
///
/// The stores' default (50 ms) is a production figure; on a test machine at load 25 (a
/// parallel build beside the tests) one round trip can take longer, and a decision the
/// failure policy answers proves nothing about the store's decisions. Tests *about*
/// deadlines inject their own fault (a stopped or killed `redis-server`) and keep a short
/// deadline of their own.
pub const DECISION_DEADLINE: Duration = Duration::from_secs(30);

/// Ports this process has handed out: the tests of one binary run concurrently, and a
/// port the OS hands out twice (bound, released, bound again) must not start two servers
/// on one port.
static HANDED_OUT: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

/// A free TCP port on 127.0.0.1 (bound, read, released), never one this process handed out
/// before.
///
/// # Panics
///
/// When no loopback port can be bound.
pub fn free_port() -> u16 {
    for _ in 0..1_000 {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("bind 127.0.0.1:0");
        let mut handed = HANDED_OUT.lock().unwrap_or_else(PoisonError::into_inner);
        if handed.get_or_insert_with(HashSet::new).insert(port) {
            return port;
        }
    }
    panic!("no loopback port this process has not handed out yet");
}

/// A free port `p` such that `p + 10000` (Redis Cluster's bus port) is free too; both are
/// marked handed out.
fn free_cluster_port() -> u16 {
    for _ in 0..200 {
        let p = free_port();
        if p < 55_000 && TcpListener::bind(("127.0.0.1", p + 10_000)).is_ok() {
            let mut handed = HANDED_OUT.lock().unwrap_or_else(PoisonError::into_inner);
            if handed.get_or_insert_with(HashSet::new).insert(p + 10_000) {
                return p;
            }
        }
    }
    panic!("no free port pair (p, p + 10000) on 127.0.0.1");
}

/// One `redis-server` process on 127.0.0.1. Killed (SIGKILL) on drop.
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    cluster: bool,
}

impl RedisServer {
    /// Starts a standalone server on a free port and waits until it answers `PING`.
    ///
    /// # Panics
    ///
    /// When `redis-server` cannot be started or does not answer within 10 s.
    pub fn start() -> Self {
        Self::start_fresh(false)
    }

    /// Starts a server (cluster-enabled or not) on a free port, and on another one should a process outside
    /// this one take the port between [`free_port`] and the server's bind (other test runs
    /// on the machine start servers too).
    fn start_fresh(cluster: bool) -> Self {
        let mut last = String::new();
        for _ in 0..5 {
            let port = if cluster {
                free_cluster_port()
            } else {
                free_port()
            };
            let dir = std::env::temp_dir()
                .join(format!("ratekeeper-redis-{}-{port}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("create redis dir");
            let mut server = Self {
                child: None,
                port,
                dir,
                cluster,
            };
            match server.try_spawn() {
                Ok(()) => return server,
                Err(e) => last = e,
            }
        }
        panic!("{last}");
    }

    /// Starts `redis-server` on `self.port` and waits until it answers `PING`.
    ///
    /// # Panics
    ///
    /// As [`RedisServer::try_spawn`] fails.
    fn spawn(&mut self) {
        if let Err(e) = self.try_spawn() {
            panic!("{e}");
        }
    }

    /// Starts `redis-server` on `self.port` and waits until it answers `PING` with its own
    /// process id in `INFO` (not another server that holds the port).
    ///
    /// # Errors
    ///
    /// When the server exits at start (its port is taken) or another process answers on the
    /// port.
    ///
    /// # Panics
    ///
    /// When `redis-server` cannot be started or does not answer within 10 s.
    fn try_spawn(&mut self) -> Result<(), String> {
        let mut cmd = Command::new("redis-server");
        cmd.arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--protected-mode", "no", "--loglevel", "warning"])
            .arg("--dir")
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if self.cluster {
            cmd.args(["--cluster-enabled", "yes", "--cluster-node-timeout", "1000"])
                .args(["--cluster-replica-validity-factor", "0"])
                .arg("--cluster-config-file")
                .arg(format!("nodes-{}.conf", self.port));
        }
        let child = cmd.spawn().unwrap_or_else(|e| {
            panic!(
                "cannot start redis-server ({e}); install it: apt-get install -y redis-server redis-tools"
            )
        });
        self.child = Some(child);
        self.wait_ready()
    }

    fn wait_ready(&mut self) -> Result<(), String> {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                self.child = None;
                return Err(format!(
                    "redis-server on port {} exited at start ({status}): the port is taken",
                    self.port
                ));
            }
            if self.cli(&["PING"]).is_some_and(|o| o.trim() == "PONG") {
                let pid = self.pid().map(|p| format!("process_id:{p}"));
                let info = self.cli(&["INFO", "server"]).unwrap_or_default();
                if pid.is_some_and(|p| info.lines().any(|l| l.trim() == p)) {
                    return Ok(());
                }
                self.kill();
                return Err(format!(
                    "another process answers on port {} (not the redis-server started here)",
                    self.port
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!(
            "redis-server on port {} did not answer PING within 10 s",
            self.port
        );
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// A URL for a user who may run every command but `SUBSCRIBE` (created here with
    /// `ACL SETUSER`): a store connected with it cannot hear the fleet's invalidations, as
    /// an instance whose invalidation channel is down.
    ///
    /// # Panics
    ///
    /// When the server refuses the `ACL SETUSER`.
    pub fn url_without_subscribe(&self) -> String {
        let acl = self.cli(&[
            "ACL",
            "SETUSER",
            "nosub",
            "on",
            ">pw",
            "~*",
            "&*",
            "+@all",
            "-subscribe",
        ]);
        assert_eq!(
            acl.as_deref().map(str::trim),
            Some("OK"),
            "ACL SETUSER on port {}",
            self.port
        );
        format!("redis://nosub:pw@127.0.0.1:{}/", self.port)
    }

    /// The process id, while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Runs `redis-cli -p <port> <args>` (1 s timeout); its stdout, or `None` on failure.
    pub fn cli(&self, args: &[&str]) -> Option<String> {
        let out = Command::new("timeout")
            .args(["2", "redis-cli", "-h", "127.0.0.1", "-p"])
            .arg(self.port.to_string())
            .args(args)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Every key matching `pattern` with its PTTL (ms; -1: no TTL), read in one script so
    /// no key expires between being listed and being read (on a loaded machine two
    /// `redis-cli` calls can be far apart).
    ///
    /// # Panics
    ///
    /// When the server does not answer or the reply does not parse.
    pub fn key_ttls(&self, pattern: &str) -> Vec<(String, i64)> {
        const SCRIPT: &str = "local r = {} \
            for _, k in ipairs(redis.call('KEYS', ARGV[1])) do \
            r[#r + 1] = k; r[#r + 1] = redis.call('PTTL', k) end return r";
        let out = self
            .cli(&["EVAL", SCRIPT, "0", pattern])
            .unwrap_or_else(|| panic!("EVAL of KEYS and PTTL on port {}", self.port));
        let lines: Vec<&str> = out.lines().filter(|l| !l.is_empty()).collect();
        lines
            .chunks(2)
            .map(|pair| {
                let ttl = pair
                    .get(1)
                    .and_then(|t| t.trim().parse().ok())
                    .unwrap_or_else(|| panic!("no PTTL for {pair:?} in {out:?}"));
                (pair[0].to_owned(), ttl)
            })
            .collect()
    }

    /// `kill -9` the server (it stays down until [`RedisServer::restart`]).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port (empty: nothing is persisted).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Sends a signal (`"STOP"`, `"CONT"`) to the server process.
    ///
    /// # Panics
    ///
    /// When the server is not running or `kill` fails.
    pub fn signal(&self, sig: &str) {
        let pid = self.pid().expect("server running");
        let ok = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(pid.to_string())
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill -{sig} {pid} failed");
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(pid) = self.pid() {
            // A stopped process must be continued to die cleanly on some kernels.
            let _ = Command::new("kill")
                .arg("-CONT")
                .arg(pid.to_string())
                .status();
        }
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Attempts at creating a Redis Cluster in [`RedisCluster::start`].
const CLUSTER_ATTEMPTS: usize = 3;

/// A Redis Cluster of 3 primaries and 3 replicas on loopback.
#[derive(Debug)]
pub struct RedisCluster {
    /// The six nodes (the first three start as primaries).
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts six cluster-enabled servers and joins them with
    /// `redis-cli --cluster create ... --cluster-replicas 1 --cluster-yes`, then waits until
    /// every node reports `cluster_state:ok`.
    ///
    /// On a loaded machine `redis-cli` can give up while the nodes are still meeting (it
    /// waits on gossip): a failed creation is retried on six fresh servers, at most 3
    /// times in all. This is set-up, not a check of ratekeeper.
    ///
    /// # Panics
    ///
    /// When a server does not start, every creation failed, or the cluster is not ok within
    /// 20 s.
    pub fn start() -> Self {
        let mut failures = Vec::new();
        for _ in 0..CLUSTER_ATTEMPTS {
            let nodes: Vec<RedisServer> = (0..6).map(|_| RedisServer::start_fresh(true)).collect();
            let addrs: Vec<String> = nodes
                .iter()
                .map(|n| format!("127.0.0.1:{}", n.port()))
                .collect();
            let out = Command::new("timeout")
                .args(["60", "redis-cli", "--cluster", "create"])
                .args(&addrs)
                .args(["--cluster-replicas", "1", "--cluster-yes"])
                .output()
                .expect("run redis-cli --cluster create");
            if out.status.success() {
                let cluster = Self { nodes };
                cluster.wait_ok(Duration::from_secs(20));
                return cluster;
            }
            failures.push(format!(
                "{}: {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        panic!(
            "redis-cli --cluster create failed {CLUSTER_ATTEMPTS} times: {}",
            failures.join("\n---\n")
        );
    }

    /// Waits until every running node reports `cluster_state:ok` and the slot map is stable.
    ///
    /// # Panics
    ///
    /// When that does not happen within `limit`.
    pub fn wait_ok(&self, limit: Duration) {
        let start = Instant::now();
        while start.elapsed() < limit {
            let ok = self.nodes.iter().filter(|n| n.pid().is_some()).all(|n| {
                n.cli(&["CLUSTER", "INFO"])
                    .is_some_and(|i| i.contains("cluster_state:ok"))
            });
            if ok {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("redis cluster not ok within {limit:?}");
    }

    /// `redis://127.0.0.1:<port>` of every node.
    pub fn urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("redis://127.0.0.1:{}", n.port()))
            .collect()
    }

    /// The node serving `key`'s slot as primary.
    ///
    /// # Panics
    ///
    /// When no running node claims the slot.
    pub fn primary_for(&self, key: &str) -> usize {
        let slot: u16 = self.nodes[0]
            .cli(&["CLUSTER", "KEYSLOT", key])
            .and_then(|s| s.trim().parse().ok())
            .expect("CLUSTER KEYSLOT");
        for (i, n) in self.nodes.iter().enumerate() {
            let Some(role) = n.cli(&["ROLE"]) else {
                continue;
            };
            if !role.starts_with("master") {
                continue;
            }
            // CLUSTER NODES "myself" line lists this node's slot ranges.
            let Some(nodes) = n.cli(&["CLUSTER", "NODES"]) else {
                continue;
            };
            let Some(me) = nodes.lines().find(|l| l.contains("myself")) else {
                continue;
            };
            for range in me.split_whitespace().skip(8) {
                let mut ends = range.split('-').map(|x| x.parse::<u16>().ok());
                let (Some(Some(a)), b) = (ends.next(), ends.next()) else {
                    continue;
                };
                let b = b.flatten().unwrap_or(a);
                if (a..=b).contains(&slot) {
                    return i;
                }
            }
        }
        panic!("no primary serves slot {slot}");
    }
}
