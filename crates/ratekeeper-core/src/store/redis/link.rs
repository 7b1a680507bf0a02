//! The store's connection to Redis: made ready when the store is built (connected, every
//! script loaded, Redis `TIME` read), and replaced by a fresh, ready one when the circuit
//! breaker's prober reconnects after a fault.
//!
//! Ready means: every script loaded (`SCRIPT LOAD`), the function library loaded where
//! Redis has functions (`FUNCTION LOAD`, Redis 7; on a Cluster on every primary), and Redis
//! `TIME` read. The link remembers whether the library is there, so calls are `FCALL`s
//! (Redis defines the library's functions once, when it loads) or, on Redis 6, `EVALSHA`s.
//!
//! A [`Link`] holds the current connection (a multiplexed connection to a standalone Redis,
//! or a Cluster connection with its slot map) behind a lock that is only taken to clone the
//! handle or to swap in a new one. It implements [`redis::aio::ConnectionLike`], so every
//! script call sends through whatever connection is current. It never reconnects by itself:
//! a call that finds the connection broken fails at once and starts the prober
//! ([`Link::start_prober`]; a failed decision starts it too), which makes a new connection
//! ready ([`Link::ready`]), swaps it in when Redis answers and tells the store (the
//! [`Link::on_ready`] hook, which closes the breaker). So recovery never waits for a
//! request to probe a dead connection.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, RwLock, Weak};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, FromRedisValue, Pipeline, RedisFuture, Value};

use super::error::redis_failure;
use super::protocol;
use crate::store::StoreError;

/// The SHA1 of every script [`Link::ready`] loads (what `SCRIPT EXISTS` checks).
pub(super) fn script_hashes() -> Vec<String> {
    protocol::scripts()
        .iter()
        .map(|s| redis::Script::new(s).get_hash().to_owned())
        .collect()
}

/// `FUNCTION LOAD REPLACE` of the store's library (on a Cluster the `redis` crate sends it
/// to every primary): the same text under the same name, so replacing it changes nothing
/// for the instances already calling it.
fn load_library_cmd() -> Cmd {
    let mut cmd = redis::cmd("FUNCTION");
    cmd.arg("LOAD").arg("REPLACE").arg(protocol::library());
    cmd
}

/// What answering a `FUNCTION LOAD` says: `Ok(true)` loaded, `Ok(false)` Redis answered an
/// error (no functions: Redis 6, or not allowed to this user), an error when Redis could
/// not be asked.
fn library_loaded(result: redis::RedisResult<Value>) -> redis::RedisResult<bool> {
    match result {
        Ok(Value::ServerError(_)) => Ok(false),
        Ok(_) => Ok(true),
        Err(err) if matches!(err.kind(), redis::ErrorKind::Server(_)) => Ok(false),
        Err(err) => Err(err),
    }
}

/// How to reach Redis, and the connection in use.
enum Target {
    Single {
        client: redis::Client,
        config: redis::AsyncConnectionConfig,
        current: RwLock<Option<MultiplexedConnection>>,
    },
    Cluster {
        client: ClusterClient,
        current: RwLock<Option<ClusterConnection>>,
    },
}

/// What the prober does when it made a connection ready: told Redis `TIME` (µs) and how
/// long ago the `TIME` command was sent.
type OnReady = Box<dyn Fn(u64, Duration) + Send + Sync>;

/// How long connecting and making ready may take, and the pause between failed probes.
#[derive(Debug, Clone, Copy)]
pub(super) struct Timing {
    /// One connection attempt (TCP connect; on a Cluster, the slot map too).
    pub(super) connect: Duration,
    /// Scripts loaded and `TIME` read on a fresh connection (the decision deadline: a Redis
    /// slower than that is not back).
    pub(super) ready: Duration,
    /// Pause between two failed probes.
    pub(super) every: Duration,
}

struct Inner {
    target: Target,
    timing: Timing,
    /// Whether the prober runs.
    probing: AtomicBool,
    /// Whether the Redis in use has the store's function library (calls are `FCALL`s).
    functions: AtomicBool,
    on_ready: OnceLock<OnReady>,
}

/// A connection that can be replaced while clones of it are in use. Cheap to clone.
#[derive(Clone)]
pub(super) struct Link(Arc<Inner>);

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.0.target {
            Target::Single { .. } => "standalone",
            Target::Cluster { .. } => "cluster",
        };
        f.debug_tuple("Link").field(&kind).finish()
    }
}

/// A fresh connection, not yet in use.
pub(super) enum Fresh {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

/// The error of a call on a link whose connection is not (yet) made.
fn not_connected() -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::Io,
        "not connected to Redis (the store is reconnecting)",
    ))
}

impl Link {
    /// A link to a standalone Redis with no connection yet; each connection attempt gives up
    /// after `connect_timeout`.
    pub(super) fn single(client: redis::Client, timing: Timing) -> Self {
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timing.connect))
            .set_response_timeout(None);
        Self::new(
            Target::Single {
                client,
                config,
                current: RwLock::new(None),
            },
            timing,
        )
    }

    /// A link to a Redis Cluster with no connection yet.
    pub(super) fn cluster(client: ClusterClient, timing: Timing) -> Self {
        Self::new(
            Target::Cluster {
                client,
                current: RwLock::new(None),
            },
            timing,
        )
    }

    fn new(target: Target, timing: Timing) -> Self {
        Self(Arc::new(Inner {
            target,
            timing,
            probing: AtomicBool::new(false),
            functions: AtomicBool::new(false),
            on_ready: OnceLock::new(),
        }))
    }

    /// Sets what the prober does when it made a new connection ready (close the store's
    /// breaker, teach its stale guard Redis's time).
    pub(super) fn on_ready(&self, hook: impl Fn(u64, Duration) + Send + Sync + 'static) {
        let _ = self.0.on_ready.set(Box::new(hook));
    }

    /// Starts the prober when `result` says the connection is broken (an I/O error, a
    /// dropped or refused connection, no connection), whoever made the call (decisions,
    /// leases, concurrency slots).
    fn check<T>(&self, result: redis::RedisResult<T>) -> redis::RedisResult<T> {
        if let Err(e) = &result {
            if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() {
                self.start_prober();
            }
        }
        result
    }

    /// Opens a fresh connection within the connect timeout, makes it ready
    /// ([`Link::ready`]) within the ready timeout and puts it in use.
    ///
    /// Returns Redis `TIME` (µs) and when its command was sent.
    ///
    /// # Errors
    ///
    /// Why Redis could not be reached or did not answer ([`StoreError::Timeout`] when it was
    /// too slow).
    pub(super) async fn reconnect(&self) -> Result<(u64, Instant), StoreError> {
        let timing = self.0.timing;
        let mut fresh = tokio::time::timeout(timing.connect, self.connect())
            .await
            .map_err(|_| StoreError::Timeout)??;
        let sent = Instant::now();
        let (server, functions) = tokio::time::timeout(timing.ready, Self::ready(&mut fresh))
            .await
            .map_err(|_| StoreError::Timeout)??;
        self.install(fresh);
        self.0.functions.store(functions, Ordering::Release);
        Ok((server, sent))
    }

    /// Starts the prober unless it runs: on the current tokio runtime, it reconnects
    /// ([`Link::reconnect`]) every `every` until Redis answers on a fresh connection, then
    /// calls the `on_ready` hook. It holds the link weakly (ends when every user dropped it).
    pub(super) fn start_prober(&self) {
        if self.0.probing.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.0.probing.store(false, Ordering::Release);
            return;
        };
        let weak: Weak<Inner> = Arc::downgrade(&self.0);
        runtime.spawn(async move {
            let mut attempts = 0u64;
            loop {
                let Some(inner) = weak.upgrade() else {
                    return;
                };
                let link = Link(inner);
                attempts += 1;
                match link.reconnect().await {
                    Ok((server, sent)) => {
                        link.0.probing.store(false, Ordering::Release);
                        tracing::debug!(
                            attempts,
                            "redis store prober: Redis answered on a fresh connection"
                        );
                        if let Some(hook) = link.0.on_ready.get() {
                            hook(server, sent.elapsed());
                        }
                        return;
                    }
                    Err(err) => {
                        tracing::debug!(
                            attempts,
                            error = %err,
                            "redis store prober: Redis not back yet"
                        );
                    }
                }
                let pause = link.0.timing.every;
                drop(link);
                tokio::time::sleep(pause).await;
            }
        });
    }

    /// Opens a new connection (a Cluster connection reads the slot map anew).
    pub(super) async fn connect(&self) -> Result<Fresh, StoreError> {
        match &self.0.target {
            Target::Single { client, config, .. } => client
                .get_multiplexed_async_connection_with_config(config)
                .await
                .map(Fresh::Single)
                .map_err(redis_failure),
            Target::Cluster { client, .. } => client
                .get_async_connection()
                .await
                .map(Fresh::Cluster)
                .map_err(redis_failure),
        }
    }

    /// Makes `fresh` ready in two round trips (on a Cluster, a few per primary): loads every
    /// script (`SCRIPT LOAD`; on a Cluster on every primary it reached) and reads Redis
    /// `TIME` (µs), which it returns; then loads the function library (`FUNCTION LOAD`) and
    /// says whether Redis took it (false: Redis has no functions, calls are `EVALSHA`s).
    ///
    /// On a Cluster it also checks that every slot is served ([`every_slot_served`]), so it
    /// fails while a primary is down and its replica not yet promoted: a connection that
    /// reaches only the other primaries is not ready.
    pub(super) async fn ready(fresh: &mut Fresh) -> Result<(u64, bool), StoreError> {
        let mut pipe = redis::pipe();
        for script in protocol::scripts() {
            pipe.cmd("SCRIPT").arg("LOAD").arg(script).ignore();
        }
        let (time, functions): ((u64, u64), bool) = match fresh {
            Fresh::Single(c) => {
                pipe.cmd("TIME");
                let (time,): ((u64, u64),) = pipe.query_async(c).await.map_err(redis_failure)?;
                let loaded = c.send_packed_command(&load_library_cmd()).await;
                (time, library_loaded(loaded).map_err(redis_failure)?)
            }
            Fresh::Cluster(c) => {
                // A Cluster connection routes each command by itself (no pipelines across
                // nodes): `SCRIPT LOAD` and `FUNCTION LOAD` go to every primary.
                for script in protocol::scripts() {
                    let _: String = redis::cmd("SCRIPT")
                        .arg("LOAD")
                        .arg(script)
                        .query_async(c)
                        .await
                        .map_err(redis_failure)?;
                }
                let loaded = c.req_packed_command(&load_library_cmd()).await;
                let functions = library_loaded(loaded).map_err(redis_failure)?;
                every_slot_served(c).await?;
                let time = redis::cmd("TIME")
                    .query_async(c)
                    .await
                    .map_err(redis_failure)?;
                (time, functions)
            }
        };
        Ok((
            time.0.saturating_mul(1_000_000).saturating_add(time.1),
            functions,
        ))
    }

    /// Whether calls are `FCALL`s of the function library (the Redis in use took it).
    pub(super) fn functions(&self) -> bool {
        self.0.functions.load(Ordering::Acquire)
    }

    /// Loads the function library on the connection in use (after Redis lost it: a
    /// `FUNCTION FLUSH`); whether Redis took it. When it did not, calls are `EVALSHA`s from
    /// now on.
    pub(super) async fn load_library(&self) -> redis::RedisResult<bool> {
        let result = match self.current() {
            Ok(Current::Single(mut c)) => c.send_packed_command(&load_library_cmd()).await,
            Ok(Current::Cluster(mut c)) => c.req_packed_command(&load_library_cmd()).await,
            Err(e) => Err(e),
        };
        let loaded = library_loaded(self.check(result))?;
        self.0.functions.store(loaded, Ordering::Release);
        Ok(loaded)
    }

    /// Puts `fresh` in use: later calls go through it (calls in flight finish on the old one).
    pub(super) fn install(&self, fresh: Fresh) {
        match (&self.0.target, fresh) {
            (Target::Single { current, .. }, Fresh::Single(c)) => {
                if let Ok(mut slot) = current.write() {
                    *slot = Some(c);
                }
            }
            (Target::Cluster { current, .. }, Fresh::Cluster(c)) => {
                if let Ok(mut slot) = current.write() {
                    *slot = Some(c);
                }
            }
            // A link never makes a connection of the other kind.
            _ => {}
        }
    }

    /// Whether a connection is in use.
    pub(super) fn is_connected(&self) -> bool {
        match &self.0.target {
            Target::Single { current, .. } => current.read().is_ok_and(|c| c.is_some()),
            Target::Cluster { current, .. } => current.read().is_ok_and(|c| c.is_some()),
        }
    }

    fn current(&self) -> Result<Current, redis::RedisError> {
        let current = match &self.0.target {
            Target::Single { current, .. } => current
                .read()
                .ok()
                .and_then(|c| c.clone())
                .map(Current::Single),
            Target::Cluster { current, .. } => current
                .read()
                .ok()
                .and_then(|c| c.clone())
                .map(Current::Cluster),
        };
        current.ok_or_else(not_connected)
    }

    /// Sends one command on the connection in use and returns its reply, a server error
    /// (`ERR`, `NOSCRIPT`, ...) as an error. The lean form of
    /// [`ConnectionLike::req_packed_command`] for the decision path: the standalone
    /// connection's own send, with no boxed future of the link's.
    pub(super) async fn query(&self, cmd: &Cmd) -> redis::RedisResult<Value> {
        let result = match self.current() {
            Ok(Current::Single(mut c)) => c.send_packed_command(cmd).await,
            Ok(Current::Cluster(mut c)) => c.req_packed_command(cmd).await,
            Err(e) => Err(e),
        };
        match self.check(result)? {
            Value::ServerError(err) => Err(err.into()),
            value => Ok(value),
        }
    }
}

/// The number of hash slots of a Redis Cluster.
const CLUSTER_SLOTS: u64 = 16_384;

/// Checks that every slot of the Cluster behind `c` is served: the slot map (`CLUSTER
/// SLOTS`, from any node) covers all 16 384 slots, and each primary it names answers
/// `CLUSTER INFO` on the connection's own link to it with `cluster_state:ok`.
///
/// The Cluster connection keeps no link to a primary it could not reach, and its fan-out
/// commands (`SCRIPT LOAD`) skip such a primary, so only this check notices one that is
/// down: its slots stay mapped to it until its replica is promoted, and the probe sent to
/// its address fails. Once the live nodes agree it failed they report `cluster_state:fail`
/// until the promotion, which fails the check too.
///
/// # Errors
///
/// A store-unavailable [`StoreError`] naming how much of the slot map is covered or which
/// primary does not serve, or the failure of a command.
async fn every_slot_served(c: &mut ClusterConnection) -> Result<(), StoreError> {
    let slots: Value = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query_async(c)
        .await
        .map_err(redis_failure)?;
    let (covered, primaries) = primaries_of(&slots)?;
    if covered != CLUSTER_SLOTS {
        return Err(not_served(format!(
            "the Cluster serves {covered} of {CLUSTER_SLOTS} slots"
        )));
    }
    for (host, port) in primaries {
        let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
            host: host.clone(),
            port,
        });
        let mut info = redis::cmd("CLUSTER");
        info.arg("INFO");
        let reply = c
            .route_command(info, routing)
            .await
            .map_err(|e| not_served(format!("primary {host}:{port} unreachable: {e}")))?;
        let text = String::from_redis_value(reply)
            .map_err(|e| not_served(format!("primary {host}:{port}: {e}")))?;
        if !text.lines().any(|l| l.trim() == "cluster_state:ok") {
            return Err(not_served(format!(
                "primary {host}:{port} reports the Cluster down"
            )));
        }
    }
    Ok(())
}

/// The number of slots a `CLUSTER SLOTS` reply covers, and the address of each primary it
/// names (each once).
fn primaries_of(slots: &Value) -> Result<(u64, Vec<(String, u16)>), StoreError> {
    let malformed = || not_served("malformed CLUSTER SLOTS reply".to_owned());
    let Value::Array(ranges) = slots else {
        return Err(malformed());
    };
    let mut covered = 0u64;
    let mut primaries: Vec<(String, u16)> = Vec::new();
    for range in ranges {
        let Value::Array(fields) = range else {
            return Err(malformed());
        };
        let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(primary))) =
            (fields.first(), fields.get(1), fields.get(2))
        else {
            return Err(malformed());
        };
        let host: String = primary
            .first()
            .and_then(|h| String::from_redis_value_ref(h).ok())
            .ok_or_else(malformed)?;
        let port = match primary.get(1) {
            Some(Value::Int(p)) => u16::try_from(*p).map_err(|_| malformed())?,
            _ => return Err(malformed()),
        };
        let width = u64::try_from(end.saturating_sub(*start).saturating_add(1)).unwrap_or(0);
        covered = covered.saturating_add(width);
        if !primaries.iter().any(|(h, p)| *h == host && *p == port) {
            primaries.push((host, port));
        }
    }
    Ok((covered, primaries))
}

/// The error of a Cluster with a slot that is not served.
fn not_served(why: String) -> StoreError {
    redis_failure(redis::RedisError::from((
        redis::ErrorKind::Client,
        "Redis Cluster not ready",
        why,
    )))
}

/// A clone of the connection in use, for one call.
enum Current {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Link {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let current = self.current();
        Box::pin(async move {
            let result = match current {
                Ok(Current::Single(mut c)) => c.req_packed_command(cmd).await,
                Ok(Current::Cluster(mut c)) => c.req_packed_command(cmd).await,
                Err(e) => Err(e),
            };
            self.check(result)
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let current = self.current();
        Box::pin(async move {
            let result = match current {
                Ok(Current::Single(mut c)) => c.req_packed_commands(cmd, offset, count).await,
                Ok(Current::Cluster(mut c)) => c.req_packed_commands(cmd, offset, count).await,
                Err(e) => Err(e),
            };
            self.check(result)
        })
    }

    fn get_db(&self) -> i64 {
        match &self.0.target {
            Target::Single { client, .. } => client.get_connection_info().redis_settings().db(),
            Target::Cluster { .. } => 0,
        }
    }
}
