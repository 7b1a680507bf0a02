//! What every check future of a [`RedisStore`](super::RedisStore) shares (the script call,
//! the clocks, the breaker, the negative cache, the counters), and the calls made through it:
//! a check or reservation across key groups (all-or-nothing, reserve-then-refund), refunds,
//! and the deadline, latency histogram and breaker accounting around each call.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use redis::FromRedisValue;

use super::breaker::Breaker;
use super::error::{BadReply, unavailable};
use super::failure::Outage;
use super::group::Group;
use super::invalidate::Invalidation;
use super::negative::NegativeCache;
use super::protocol::FLEET_SCRIPT;
use super::reply::{Row, Rows};
use super::script::{Mode, ScriptRunner, send_script};
use crate::Decision;
use crate::clock::Clock;
use crate::store::{Decisions, Receipt, StoreError};

/// How often an instance renews its fleet registration (and so how late it learns of an
/// instance that joined).
pub(super) const FLEET_EVERY: Duration = Duration::from_millis(250);
/// How long a registration lives without renewal (ms): four renewals.
pub(super) const FLEET_TTL_MS: u64 = 1_000;

/// What every check future shares: the script call, the clocks, the breaker, the negative
/// cache and the counters.
pub(super) struct Shared {
    pub(super) script: ScriptRunner,
    pub(super) prefix: String,
    pub(super) deadline: Duration,
    /// Decision-side time in ns (injected, or the app clock): the negative cache and the
    /// local fallback.
    pub(super) clock: Arc<dyn Clock>,
    /// The app's monotonic clock: the breaker (never the injected clock: Redis fails in real
    /// time).
    pub(super) app: Arc<dyn Clock>,
    pub(super) breaker: Breaker,
    /// Where an outage stands (shared with the failure policy).
    pub(super) outage: Arc<Outage>,
    /// This instance's id in the fleet registry.
    pub(super) instance_id: String,
    /// Whether this instance registers in the fleet registry (fail-soft without a
    /// configured fleet size).
    pub(super) learns_fleet: bool,
    pub(super) negative: Option<NegativeCache>,
    /// The fleet invalidation channel (resets by other instances).
    pub(super) invalidation: Invalidation,
    /// The policies registered through any handle (clone) of the store.
    pub(super) registry: std::sync::Mutex<super::Registry>,
    /// How many policies `registry` holds, read without its lock.
    pub(super) registered: std::sync::atomic::AtomicUsize,
    pub(super) redis_decisions: AtomicU64,
    pub(super) negative_hits: AtomicU64,
    pub(super) degraded: AtomicU64,
    pub(super) errors: AtomicU64,
}

impl Shared {
    /// The registry of policies, locked (a poisoned lock is taken over: a registration
    /// changes it only once it cannot fail any more).
    pub(super) fn lock_registry(&self) -> std::sync::MutexGuard<'_, super::Registry> {
        self.registry
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Runs one Redis call within the deadline: times it in the
    /// `ratekeeper_store_latency_seconds` histogram (label `outcome`), and tells the breaker
    /// how it went (a failure is counted, may open the breaker, logged with the failure
    /// policy `action` that answers meanwhile, and starts the prober).
    pub(super) async fn timed<T>(
        self: &Arc<Self>,
        call: impl Future<Output = Result<T, StoreError>>,
        action: &str,
    ) -> Result<T, StoreError> {
        self.timed_within(call, action, self.deadline).await
    }

    /// [`Shared::timed`] with what is left of the deadline (a request that waited for
    /// another's probe first).
    pub(super) async fn timed_within<T>(
        &self,
        call: impl Future<Output = Result<T, StoreError>>,
        action: &str,
        left: Duration,
    ) -> Result<T, StoreError> {
        let started = std::time::Instant::now();
        let result = match tokio::time::timeout(left, call).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::Timeout),
        };
        // One literal label set per branch: the metrics key is built at compile time.
        let histogram = if result.is_ok() {
            metrics::histogram!("ratekeeper_store_latency_seconds", "outcome" => "ok")
        } else {
            metrics::histogram!("ratekeeper_store_latency_seconds", "outcome" => "error")
        };
        histogram.record(started.elapsed().as_secs_f64());
        match &result {
            Ok(_) => {
                self.breaker.success();
                self.outage.end();
                self.redis_decisions.fetch_add(1, Ordering::Relaxed);
            }
            Err(err) => {
                self.breaker.failure(self.app.now(), err, action);
                self.count_error();
                self.start_prober();
            }
        }
        result
    }

    /// Makes a fresh connection ready and puts it in use
    /// ([`Link::reconnect`](super::link::Link::reconnect)); teaches the stale guard Redis's
    /// time.
    ///
    /// # Errors
    ///
    /// As [`Link::reconnect`](super::link::Link::reconnect).
    pub(super) async fn reconnect(&self) -> Result<(), StoreError> {
        let (server, sent) = self.script.conn.link().reconnect().await?;
        self.learn_time(server, sent.elapsed());
        Ok(())
    }

    /// Teaches the stale guard Redis `TIME` `server` (µs), read by a command sent `ago`.
    pub(super) fn learn_time(&self, server: u64, ago: Duration) {
        let ago_us = u64::try_from(ago.as_micros()).unwrap_or(u64::MAX);
        let sent = self.script.app_micros().saturating_sub(ago_us);
        self.script.guard.learn(sent, server);
    }

    /// Starts the link's prober (see
    /// [`Link::start_prober`](super::link::Link::start_prober)); when it made a new
    /// connection ready, the hook set at build closes the breaker.
    pub(super) fn start_prober(&self) {
        self.script.conn.link().start_prober();
    }

    /// The prober made a new connection ready: learn Redis's time, close the breaker, end
    /// the outage, and register this instance again (in the background).
    pub(super) fn prober_succeeded(self: &Arc<Self>, server: u64, ago: Duration) {
        self.learn_time(server, ago);
        self.breaker.success();
        self.outage.end();
        if !self.learns_fleet {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let shared = Arc::clone(self);
            runtime.spawn(async move { shared.register_instance().await });
        }
    }

    /// Registers this instance in the fleet registry (`lua/fleet.lua`) within the deadline and
    /// learns the fleet size; a failure leaves the size learned before.
    pub(super) async fn register_instance(&self) {
        let key = format!("{}:v2:{{fleet}}:instances", self.prefix);
        static SCRIPT: std::sync::OnceLock<redis::Script> = std::sync::OnceLock::new();
        let script = SCRIPT.get_or_init(|| redis::Script::new(FLEET_SCRIPT));
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.get_hash())
            .arg(1)
            .arg(key)
            .arg(&self.instance_id)
            .arg(FLEET_TTL_MS);
        let link = self.script.conn.link();
        let call = async {
            send_script(link, script, FLEET_SCRIPT, &cmd)
                .await
                .and_then(|v| Ok(u32::from_redis_value(v)?))
        };
        match tokio::time::timeout(self.deadline, call).await {
            Ok(Ok(n)) if n > 0 => {
                self.outage.instances.store(n, Ordering::Relaxed);
            }
            Ok(Ok(_)) => {}
            Ok(Err(err)) => tracing::debug!(error = %err, "redis store fleet registration failed"),
            Err(_) => tracing::debug!("redis store fleet registration timed out"),
        }
    }

    /// Keeps this instance registered: every [`FLEET_EVERY`] while the breaker is closed,
    /// on the current tokio runtime, until the store is dropped.
    pub(super) fn start_registration(self: &Arc<Self>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let weak: Weak<Self> = Arc::downgrade(self);
        runtime.spawn(async move {
            loop {
                tokio::time::sleep(FLEET_EVERY).await;
                let Some(shared) = weak.upgrade() else {
                    return;
                };
                if !shared.breaker.is_open() {
                    shared.register_instance().await;
                }
            }
        });
    }

    /// A decision the negative cache answered: counted, then returned.
    pub(super) fn hit(&self, decisions: Decisions) -> Decisions {
        self.negative_hits.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("ratekeeper_negative_cache_hits_total").increment(1);
        decisions
    }

    pub(super) fn count_error(&self) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("ratekeeper_store_errors_total").increment(1);
    }

    /// Runs every group; reserve-then-refund across groups: when a later group denies, the
    /// groups already charged are refunded with the receipts they just took. Also returns
    /// how long the answer's fields change only with elapsed time (the shortest hold of its
    /// rows; `None`: unbounded), for the negative cache.
    pub(super) async fn run(
        &self,
        groups: &[Group],
        len: usize,
    ) -> Result<(Decisions, Option<Duration>), StoreError> {
        if let [group] = groups {
            // One client key: one call, its rows in charge order, nothing to undo.
            let rows = self.script.call(group, Mode::Check).await?;
            let hold = rows.iter().filter_map(|r| r.2).min();
            let decisions = Decisions::with_receipts(rows.iter().map(|r| (r.0, r.1)));
            return Ok((decisions, hold));
        }
        let mut results: Vec<Option<Row>> = vec![None; len];
        let mut charged = 0;
        let mut denied = false;
        for group in groups {
            let rows = self.script.call(group, Mode::Check).await?;
            let allowed = rows.iter().all(|(d, _, _)| d.is_allowed());
            place(&mut results, group, rows);
            if !allowed {
                denied = true;
                break;
            }
            charged += 1;
        }
        if denied {
            self.undo(groups, charged, &mut results).await?;
        }
        let hold = results.iter().flatten().filter_map(|r| r.2).min();
        collect(results).map(|d| (d, hold))
    }

    /// After a denial in group `charged`: refunds the groups charged before it with the
    /// receipts they just took and peeks the groups not reached, so every charge reports its
    /// state as it now is.
    pub(super) async fn undo(
        &self,
        groups: &[Group],
        charged: usize,
        results: &mut [Option<Row>],
    ) -> Result<(), StoreError> {
        for (g, group) in groups.iter().enumerate() {
            let rows = if g < charged {
                let receipts = group.slots().map(|s| {
                    results
                        .get(s)
                        .copied()
                        .flatten()
                        .map_or(Receipt::NONE, |r| r.1)
                });
                self.script
                    .call(&group.refund_of(receipts), Mode::Refund)
                    .await?
            } else if group
                .slots()
                .any(|s| results.get(s).is_some_and(Option::is_none))
            {
                self.script.call(group, Mode::Peek).await?
            } else {
                continue;
            };
            place(results, group, rows);
        }
        Ok(())
    }

    /// Reserves every group (the Delay mode), all-or-nothing like [`Shared::run`]: the
    /// delay is the longest of the groups'; a denial undoes the groups already reserved
    /// (their reservations are the latest, so their refunds give back the whole slot) and
    /// is final when the denying group says so.
    pub(super) async fn reserve(
        &self,
        groups: &[Group],
        len: usize,
        max_wait: Duration,
    ) -> Result<Decisions, StoreError> {
        let mut results: Vec<Option<Row>> = vec![None; len];
        let mut charged = 0;
        let mut delay = Duration::ZERO;
        let mut denied = None;
        for group in groups {
            let answer = self.script.reserve(group, max_wait).await?;
            let allowed = answer.rows.iter().all(|(d, _, _)| d.is_allowed());
            place(&mut results, group, answer.rows);
            if !allowed {
                denied = Some(answer.is_final);
                break;
            }
            delay = delay.max(answer.delay);
            charged += 1;
        }
        match denied {
            Some(is_final) => {
                self.undo(groups, charged, &mut results).await?;
                let all: Option<Vec<Decision>> =
                    results.into_iter().map(|r| r.map(|r| r.0)).collect();
                all.map(|d| Decisions::new(d).with_final(is_final))
                    .ok_or_else(|| unavailable(BadReply("missing decision")))
            }
            None => collect(results).map(|d| d.with_delay(delay)),
        }
    }
}

pub(super) fn collect(results: Vec<Option<Row>>) -> Result<Decisions, StoreError> {
    let all: Option<Vec<(Decision, Receipt)>> = results
        .into_iter()
        .map(|r| r.map(|(d, receipt, _)| (d, receipt)))
        .collect();
    all.map(Decisions::with_receipts)
        .ok_or_else(|| unavailable(BadReply("missing decision")))
}

pub(super) fn place(results: &mut [Option<Row>], group: &Group, rows: Rows) {
    for (slot, row) in group.slots().zip(rows) {
        if let Some(r) = results.get_mut(slot) {
            *r = Some(row);
        }
    }
}

/// Sends each refund group within the deadline; counts and logs failures and returns the
/// first.
pub(super) async fn refund_groups(shared: &Shared, groups: &[Group]) -> Result<(), StoreError> {
    settle_groups(shared, groups, Mode::Refund).await
}

/// Sends each correction group within the deadline, as [`refund_groups`].
pub(super) async fn correct_groups(shared: &Shared, groups: &[Group]) -> Result<(), StoreError> {
    settle_groups(shared, groups, Mode::Correct).await
}

async fn settle_groups(shared: &Shared, groups: &[Group], mode: Mode) -> Result<(), StoreError> {
    let mut first = None;
    for group in groups {
        let call = shared.script.call(group, mode);
        let result = match tokio::time::timeout(shared.deadline, call).await {
            Ok(Ok(_)) => continue,
            Ok(Err(err)) => err,
            Err(_) => StoreError::Timeout,
        };
        shared.count_error();
        if mode == Mode::Correct {
            tracing::debug!(error = %result, "redis store correction failed");
        } else {
            tracing::debug!(error = %result, "redis store refund failed");
        }
        first.get_or_insert(result);
    }
    first.map_or(Ok(()), Err)
}
