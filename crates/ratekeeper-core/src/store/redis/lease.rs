//! Leases for the tiered store ([`TieredStore`](crate::store::tiered::TieredStore)): one
//! round trip of `lease.lua` charges a batch of units on a (policy, client key) state of the
//! Redis store (same keys, same state format as `limiter.lua`) and says how many it granted.
//! Unused units go back through the Redis store's refund (`limiter.lua`, mode `refund`,
//! with the grant's stamp as the receipt).

use std::sync::Arc;
use std::time::Duration;

use super::check::BreakerOpen;
use super::policy::{ALGO_FIXED_WINDOW, ALGO_GCRA};
use super::reply::BadReply;
use super::script::{ScriptRunner, unavailable};
use super::{OwnedCharge, RedisStore, keys};
use crate::store::{Decisions, PolicyId, Receipt, StoreError};
use crate::{Decision, Key, Outcome};

/// What one lease call got.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LeaseGrant {
    /// Units charged in Redis for the caller to spend (0 when denied).
    pub(crate) granted: u64,
    /// The decision for the request that asked (`need` units): allowed when `granted >= need`;
    /// `remaining` is what Redis has left after the grant.
    pub(crate) decision: Decision,
    /// The receipt of the whole grant (a refund of unused units uses it).
    pub(crate) receipt: Receipt,
}

/// The lease script (loaded once per process, sent with `EVALSHA`).
fn lease_script() -> &'static redis::Script {
    static SCRIPT: std::sync::OnceLock<redis::Script> = std::sync::OnceLock::new();
    SCRIPT.get_or_init(|| redis::Script::new(include_str!("lease.lua")))
}

impl ScriptRunner {
    /// One round trip of `lease.lua` for `key` (full Redis key name).
    async fn lease_call(&self, key: &str, args: [u64; 6]) -> Result<Option<[i64; 6]>, StoreError> {
        let now_arg = self
            .now
            .as_ref()
            .map_or_else(String::new, |c| (c.now() / 1_000).to_string());
        let sent = self.app_micros();
        let stale = self
            .guard
            .limit(sent)
            .map_or_else(String::new, |g| g.to_string());
        let mut invocation = lease_script().prepare_invoke();
        invocation
            .key(key)
            .arg(now_arg)
            .arg(stale)
            .arg(self.min_ttl_ms);
        for v in args {
            invocation.arg(v);
        }
        match self.invoke(&invocation, sent).await?.as_slice() {
            [1] => Ok(None),
            [0, a, b, c, d, e, f] => Ok(Some([*a, *b, *c, *d, *e, *f])),
            _ => Err(unavailable(BadReply("wrong lease reply"))),
        }
    }
}

impl RedisStore {
    /// Charges between `need` and `want` units of `policy` for `key` in one round trip
    /// (`want >= need`), within the store's deadline and through its circuit breaker.
    ///
    /// # Errors
    ///
    /// [`StoreError::UnknownPolicy`] for a policy that is not registered or cannot be leased
    /// (not GCRA or the fixed window); [`StoreError::Timeout`] /
    /// [`StoreError::Unavailable`] when Redis could not decide (the caller applies
    /// [`RedisStore::fail_over`]).
    pub(crate) async fn lease(
        &self,
        policy: PolicyId,
        key: &Key,
        need: u64,
        want: u64,
    ) -> Result<LeaseGrant, StoreError> {
        let Some(p) = self.policies.get(policy.index()) else {
            return Err(StoreError::UnknownPolicy(policy));
        };
        if p.algo != ALGO_GCRA && p.algo != ALGO_FIXED_WINDOW {
            return Err(StoreError::UnknownPolicy(policy));
        }
        let shared = &self.shared;
        if !shared.breaker.admit(shared.app.now()) {
            return Err(StoreError::Unavailable(Box::new(BreakerOpen)));
        }
        let name = keys::full(&shared.prefix, &keys::tag(key), &p.name);
        let [p1, p2, p3] = p.params;
        let args = [p.algo, p1, p2, p3, need, want.max(need)];
        // A stale call (it reached Redis after its deadline and did nothing) is a timeout.
        let call = async {
            shared
                .script
                .lease_call(&name, args)
                .await?
                .ok_or(StoreError::Timeout)
        };
        let row = shared.timed(call, self.failover.policy.as_str()).await?;
        let [granted, code, remaining, reset, retry, stamp] = row;
        let us = |v: i64| Duration::from_micros(u64::try_from(v).unwrap_or(0));
        let outcome = match code {
            0 => Outcome::Allowed,
            1 => Outcome::Denied {
                retry_after: us(retry),
            },
            2 => Outcome::CannotFit,
            _ => return Err(unavailable(BadReply("unknown outcome code"))),
        };
        let remaining = u32::try_from(remaining.clamp(0, i64::from(p.capacity))).unwrap_or(0);
        let receipt = match (code, u64::try_from(stamp)) {
            (0, Ok(stamp)) => Receipt::new(stamp),
            _ => Receipt::NONE,
        };
        Ok(LeaseGrant {
            granted: if code == 0 {
                u64::try_from(granted).unwrap_or(0)
            } else {
                0
            },
            decision: Decision::new(outcome, p.limit, remaining, us(reset)),
            receipt,
        })
    }

    /// The failure policy's answer for `charges` that Redis could not decide because of
    /// `err` (counted as degraded, like a failed check).
    pub(crate) fn fail_over(
        &self,
        charges: &[OwnedCharge],
        err: StoreError,
    ) -> Result<Decisions, StoreError> {
        self.failover.apply(charges, err, &self.shared.degraded)
    }

    /// Drops the negative-cache entry of (`policy`, `key`), if any: the tiered store's cold
    /// checks must not be denied locally for longer than leased units take to come back.
    pub(crate) fn forget_denial(&self, policy: PolicyId, key: &Key) {
        if let Some(cache) = &self.shared.negative {
            cache.forget([(policy, key)]);
        }
    }

    /// The store's decision clock (ns): injected, or the app's monotonic clock.
    pub(crate) fn decision_clock(&self) -> Arc<dyn crate::clock::Clock> {
        Arc::clone(&self.shared.clock)
    }
}
