//! Concurrency slots in Redis (`lua/concurrency.lua`): leases renewed while their request runs.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use redis::FromRedisValue;

use super::error::{BadReply, redis_failure, unavailable};
use super::keys;
use super::protocol::CONCURRENCY_SCRIPT;
use super::script::{Conn, send_script};
use crate::Key;
use crate::store::slots::{AcquireFuture, Acquired, SharedSlots, SlotLease};
use crate::store::{FailurePolicy, StoreError};

/// Concurrency slots shared through Redis by every instance that uses the same Redis and
/// prefix: at most `max` requests in flight per client key across the fleet.
///
/// Made by [`RedisStore::slots`](super::RedisStore::slots) (same connection, prefix,
/// deadline and failure policy as the store) and given to the keyed concurrency layer of
/// `ratekeeper-tower` (`ConcurrencyLimitLayer::shared`).
///
/// # How a slot is held
///
/// - Per client key one sorted set, `<prefix>:v2:{<client key>}:conc:<name>`, whose members
///   are slot ids scored by the expiry of their **lease**, in Redis `TIME` ms. Taking a slot
///   is one script call: drop the members whose lease expired (score <= now), count the
///   rest, add this slot with expiry `now + lease` when fewer than `max` are held.
/// - While the request runs, its instance **renews** the lease every `renew = lease / 5`
///   (expiry := Redis `TIME` + lease), so a live request keeps its slot however long it runs.
/// - When the response body ends (or the request is dropped), the slot is **released** (one
///   `ZREM`). When an instance dies (`kill -9`, a crash, a network partition), its renewals
///   stop and its slots expire on their own: **every slot of a dead instance is free at most
///   `lease` after its last renewal**, so at most `lease` after its death on Redis's clock
///   (default lease 2.5 s, renewal every 0.5 s; set it with [`RedisSlots::lease`]).
/// - **Pauses of a live holder** (a stop-the-world pause, `SIGSTOP`, a VM migration, a
///   starved runtime): a slot survives as long as one of its renewals reaches Redis within
///   `lease` of the previous one. A renewal is due `lease / 5` after the previous one, so a
///   pause of up to `lease - lease / 5 - r` (`r` the renewal's round trip; **2 s** less `r`
///   with the default lease) never hands the slot to someone else; a longer pause can (the
///   slot expires, another instance may take it, and the paused request then runs
///   uncounted, logged as a warning). The default lease of 2.5 s renewed every 0.5 s is the
///   trade between these two: a crashed holder's slots are free within 2.5 s, and a pause of
///   1 s still leaves 1 s of margin. A renewal that fails (Redis slow or down) is retried at
///   the next period.
/// - **Cost**: one round trip to take a slot, one per held slot every `lease / 5` (a task
///   per held slot on the current tokio runtime; 200 per second for 100 slots held with the
///   default lease), one to release it. A longer lease means fewer renewals, a slower
///   recovery from a dead instance and a longer pause tolerated.
/// - **TTL**: every write sets `PX = lease`; no member expires later than that, so the key
///   never outlives its slots and never lacks a TTL.
/// - **Failures**: a slot that Redis cannot give within the store's deadline is answered
///   with [`StoreError::Failed`] carrying the store's failure policy (the layer fails open
///   for `Allow`, `Local` and `Degrade`, and answers 503 for `Deny`).
/// - **Abandoned acquisitions**: a guard is armed before the acquire call is sent. If the
///   call fails or times out (it may still have reached Redis), or if the acquire future is
///   dropped before it answers (the client disconnected, an outer timeout, a `select!`), the
///   slot id is released at once in the background: the release goes out on the same
///   connection after the acquire, so a slot the script added is removed as soon as Redis
///   runs it. (At the latest it expires after `lease`.)
///
/// Time is Redis `TIME` only (the store's injected clock does not apply): leases expire in
/// real time.
#[derive(Clone)]
pub struct RedisSlots {
    cfg: Arc<Config>,
}

#[derive(Clone)]
struct Config {
    conn: Conn,
    script: redis::Script,
    prefix: String,
    name: String,
    lease: Duration,
    deadline: Duration,
    on_failure: FailurePolicy,
    /// Unique per `RedisSlots` (process id, start time): slot ids never collide across
    /// instances.
    instance: String,
    next: Arc<AtomicU64>,
    outage: Arc<OutageLog>,
}

/// Logs a Redis outage of the slots once per transition, as the store's circuit breaker does:
/// WARN at the first failure after a success, INFO with the count of failures when a call
/// succeeds again; every failure in between (acquire, renew, release) is a DEBUG event. So an
/// outage under load logs two lines, not one per request.
#[derive(Debug, Default)]
struct OutageLog {
    failing: AtomicBool,
    failures: AtomicU64,
}

impl OutageLog {
    fn failed(&self, err: &StoreError, op: &str, on_failure: FailurePolicy) {
        let failures = self
            .failures
            .fetch_add(1, Ordering::Relaxed)
            .saturating_add(1);
        if self.failing.swap(true, Ordering::AcqRel) {
            tracing::debug!(error = %err, op, failures, "redis concurrency slot call failed");
        } else {
            tracing::warn!(
                target: "ratekeeper",
                error = %err,
                op,
                failure_policy = on_failure.as_str(),
                "redis concurrency slots unavailable; the failure policy answers until a call \
                 succeeds (logged once per outage, each failure at DEBUG)"
            );
        }
    }

    fn succeeded(&self) {
        if self.failing.load(Ordering::Relaxed) && self.failing.swap(false, Ordering::AcqRel) {
            let failures = self.failures.swap(0, Ordering::Relaxed);
            tracing::info!(target: "ratekeeper", failures, "redis concurrency slots recovered");
        }
    }
}

impl fmt::Debug for RedisSlots {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisSlots")
            .field("name", &self.cfg.name)
            .field("lease", &self.cfg.lease)
            .field("renew", &self.renew_period())
            .field("on_failure", &self.cfg.on_failure)
            .finish_non_exhaustive()
    }
}

impl RedisSlots {
    /// The default lease: 2.5 s, renewed every 0.5 s (see "Pauses of a live holder" above
    /// for why).
    pub const DEFAULT_LEASE: Duration = Duration::from_millis(2_500);

    /// The longest lease, one day. Redis refuses an expiry beyond its range (a lease of
    /// `Duration::MAX` ms), and the script has then already added the slot: it would stay
    /// held with no TTL, forever, while the request failed.
    pub const MAX_LEASE: Duration = Duration::from_secs(24 * 60 * 60);

    /// The default name of the slot sets: `concurrency` (the policy name the layer reports).
    pub const DEFAULT_NAME: &'static str = "concurrency";

    pub(super) fn new(
        conn: Conn,
        prefix: String,
        deadline: Duration,
        on_failure: FailurePolicy,
    ) -> Self {
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        Self {
            cfg: Arc::new(Config {
                conn,
                script: redis::Script::new(CONCURRENCY_SCRIPT),
                prefix,
                name: Self::DEFAULT_NAME.to_owned(),
                lease: Self::DEFAULT_LEASE,
                deadline,
                on_failure,
                instance: format!("{:x}-{started:x}", std::process::id()),
                next: Arc::new(AtomicU64::new(0)),
                outage: Arc::default(),
            }),
        }
    }

    /// Names the slot sets (the `<name>` of the key), so several limits can share one
    /// client key. Default [`RedisSlots::DEFAULT_NAME`].
    #[must_use]
    pub fn name(mut self, name: impl Into<String>) -> Self {
        Arc::make_mut(&mut self.cfg).name = name.into();
        self
    }

    /// Sets the lease (at least 5 ms and at most [`RedisSlots::MAX_LEASE`]; values outside
    /// are raised or lowered to these): a dead instance's slots are free at most this long
    /// after its death; a running request renews its lease every `lease / 5`, so a pause of
    /// a live holder up to `lease * 4 / 5` less one round trip keeps its slots. Default
    /// [`RedisSlots::DEFAULT_LEASE`].
    #[must_use]
    pub fn lease(mut self, lease: Duration) -> Self {
        Arc::make_mut(&mut self.cfg).lease = lease.clamp(Duration::from_millis(5), Self::MAX_LEASE);
        self
    }

    /// The lease in force.
    pub fn lease_time(&self) -> Duration {
        self.cfg.lease
    }

    /// How often a running request renews its lease: `lease / 5`.
    pub fn renew_period(&self) -> Duration {
        self.cfg.renew_period()
    }

    /// The Redis key of `key`'s slots: `<prefix>:v2:{<encoded key>}:conc:<name>`.
    pub fn redis_key(&self, key: &Key) -> String {
        self.cfg.key(key)
    }
}

impl Config {
    fn key(&self, key: &Key) -> String {
        keys::full(
            &self.prefix,
            &keys::tag(key),
            &format!("conc:{}", self.name),
        )
    }

    /// `lease / 5`: a renewal may come up to four periods late before the slot expires.
    fn renew_period(&self) -> Duration {
        self.lease / RENEWALS_PER_LEASE
    }

    fn lease_ms(&self) -> u64 {
        u64::try_from(self.lease.as_millis()).unwrap_or(u64::MAX)
    }

    /// One script call: `{ok, held}`.
    async fn run(&self, key: &str, op: &str, id: &str, max: u32) -> Result<(i64, i64), StoreError> {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.script.get_hash())
            .arg(1)
            .arg(key)
            .arg(op)
            .arg(id)
            .arg(max)
            .arg(self.lease_ms());
        let reply = send_script(self.conn.link(), &self.script, CONCURRENCY_SCRIPT, &cmd)
            .await
            .and_then(|v| Ok(Vec::<i64>::from_redis_value(v)?))
            .map_err(redis_failure)?;
        match reply.as_slice() {
            &[ok, held] => Ok((ok, held)),
            _ => Err(unavailable(BadReply("concurrency script: wrong reply"))),
        }
    }

    async fn run_within_deadline(
        &self,
        key: &str,
        op: &str,
        id: &str,
        max: u32,
    ) -> Result<(i64, i64), StoreError> {
        let result = match tokio::time::timeout(self.deadline, self.run(key, op, id, max)).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::Timeout),
        };
        match &result {
            Ok(_) => self.outage.succeeded(),
            Err(err) => self.outage.failed(err, op, self.on_failure),
        }
        result
    }

    /// Releases `id` in the background (on the current runtime, if any).
    fn release_later(self: &Arc<Self>, key: String, id: String) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(
                "redis concurrency slot released outside a tokio runtime; it expires with its lease"
            );
            return;
        };
        let cfg = Arc::clone(self);
        runtime.spawn(async move {
            // A failure is in the outage log; the slot expires with its lease.
            let _ = cfg.run_within_deadline(&key, "release", &id, 0).await;
        });
    }
}

/// Renewals per lease: a held slot is renewed every `lease / 5`.
const RENEWALS_PER_LEASE: u32 = 5;

/// Releases a slot id whose acquire call was sent but did not become a [`Lease`]: the call
/// failed, timed out, or its future was dropped before the answer. Disarmed when the answer
/// is known (a slot held, or the key full).
struct AcquireGuard {
    cfg: Arc<Config>,
    key: String,
    id: String,
    armed: bool,
}

impl AcquireGuard {
    /// The slot is held: the [`Lease`] takes over the release.
    fn into_lease(mut self) -> Lease {
        self.armed = false;
        Lease::start(
            Arc::clone(&self.cfg),
            std::mem::take(&mut self.key),
            std::mem::take(&mut self.id),
        )
    }

    /// The script answered without adding the slot.
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for AcquireGuard {
    fn drop(&mut self) {
        if self.armed {
            self.cfg
                .release_later(std::mem::take(&mut self.key), std::mem::take(&mut self.id));
        }
    }
}

/// A held slot: renews its lease every `lease / 5` until dropped, then releases it.
struct Lease {
    cfg: Arc<Config>,
    key: String,
    id: String,
    renewer: tokio::task::JoinHandle<()>,
}

impl Lease {
    fn start(cfg: Arc<Config>, key: String, id: String) -> Self {
        let renewer = {
            let (cfg, key, id) = (Arc::clone(&cfg), key.clone(), id.clone());
            tokio::spawn(async move {
                let period = cfg.renew_period();
                let mut tick =
                    tokio::time::interval_at(tokio::time::Instant::now() + period, period);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    match cfg.run_within_deadline(&key, "renew", &id, 0).await {
                        Ok((1, _)) => {}
                        Ok(_) => {
                            tracing::warn!(
                                "redis concurrency slot expired before its renewal; the request runs uncounted"
                            );
                            return;
                        }
                        // In the outage log; retried next period.
                        Err(_) => {}
                    }
                }
            })
        };
        Self {
            cfg,
            key,
            id,
            renewer,
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.renewer.abort();
        self.cfg
            .release_later(std::mem::take(&mut self.key), std::mem::take(&mut self.id));
    }
}

impl SharedSlots for RedisSlots {
    fn acquire(&self, key: &Key, max: u32) -> AcquireFuture {
        let cfg = Arc::clone(&self.cfg);
        let redis_key = cfg.key(key);
        let id = format!(
            "{}:{}",
            cfg.instance,
            cfg.next.fetch_add(1, Ordering::Relaxed)
        );
        Box::pin(async move {
            // Armed before the call is sent: from here on, a drop of this future releases
            // the id (the call may have reached Redis, or be on its way).
            let guard = AcquireGuard {
                cfg: Arc::clone(&cfg),
                key: redis_key.clone(),
                id: id.clone(),
                armed: true,
            };
            match cfg
                .run_within_deadline(&redis_key, "acquire", &id, max)
                .await
            {
                Ok((1, held)) => {
                    let held = u32::try_from(held).unwrap_or(u32::MAX);
                    let free = max.saturating_sub(held);
                    Ok(Acquired::Held {
                        lease: SlotLease::new(guard.into_lease()),
                        free,
                    })
                }
                Ok(_) => {
                    guard.disarm();
                    Ok(Acquired::Full)
                }
                // The call may have reached Redis (a timeout, a connection lost after the
                // write): the guard gives the slot back.
                Err(err) => Err(StoreError::Failed {
                    policy: cfg.on_failure,
                    source: Box::new(err),
                }),
            }
        })
    }
}
