//! Leases for the tiered store ([`TieredStore`](crate::store::tiered::TieredStore)): one
//! round trip of the Lua library's `lease` entry (`lua/lease.lua`) charges a batch of units
//! on a (policy, client key) state of the Redis store (same keys, same state format, same
//! algorithm chunks as the limiter) and says how many it granted. Unused units go back
//! through the Redis store's refund (the limiter's refund op, with the grant's stamp as the
//! receipt).
//!
//! Each grant that takes units ahead of the request that asked also records them in the
//! key's lease record (`<state>#leased`, same hash tag): how many units leases may still
//! hold unspent and when they are back in Redis at the latest. A denial's `retry_after` is
//! bounded by it ([`RedisStore::bound_by_leases`]).

use std::sync::Arc;
use std::time::Duration;

use super::check::BreakerOpen;
use super::error::{BadReply, unavailable};
use super::policy::{ALGO_FIXED_WINDOW, ALGO_GCRA};
use super::protocol::{
    CODE_ALLOWED, CODE_CANNOT_FIT, CODE_DENIED, LEASE_ARG_BACK_WITHIN, LEASE_KEY_RECORD,
    LEASE_KEY_STATE, LEASE_REPLY_LEN, REPLY_HEAD,
};
use super::reply::int;
use super::script::{Entry, ScriptRunner};
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
    /// The key's lease record after the call.
    pub(crate) leased: Leased,
}

/// Units leases of a key may still hold unspent (granted ahead of the requests that asked,
/// on any instance), and how soon they are back in Redis at the latest. An upper bound:
/// units spent or given back since are not taken off.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Leased {
    pub(crate) units: u64,
    pub(crate) back_in: Duration,
}

impl ScriptRunner {
    /// One round trip of the lease for `keys` (the state's and the lease record's full
    /// names, in `LEASE_KEY_*` order) with `args` (`LEASE_ARG_ALGO` to
    /// `LEASE_ARG_BACK_WITHIN`); the reply's values after its head, or
    /// [`StoreError::Timeout`] when the call was stale.
    async fn lease_call(
        &self,
        keys: [&str; 2],
        args: [u64; 7],
    ) -> Result<[i64; LEASE_REPLY_LEN], StoreError> {
        const {
            assert!(LEASE_KEY_STATE == 1 && LEASE_KEY_RECORD == 2);
            assert!(LEASE_ARG_BACK_WITHIN == 3 + 7);
        }
        let sent = self.app_micros();
        let build = |functions: bool| {
            let bytes = keys[0].len() + keys[1].len() + 10 * 20;
            let mut cmd = Entry::Lease.command(functions, keys.len(), LEASE_ARG_BACK_WITHIN, bytes);
            cmd.arg(keys[0]).arg(keys[1]);
            self.write_now(&mut cmd);
            self.write_guard(&mut cmd, sent);
            cmd.arg(self.min_ttl_ms);
            for v in args {
                cmd.arg(v);
            }
            cmd
        };
        let value = self.send(Entry::Lease, build).await?;
        let values = self.read_head(value, sent)?;
        let mut out = [0; LEASE_REPLY_LEN];
        let tail = values.get(REPLY_HEAD..).unwrap_or_default();
        if tail.len() != LEASE_REPLY_LEN {
            return Err(unavailable(BadReply("wrong lease reply")));
        }
        for (slot, value) in out.iter_mut().zip(tail) {
            *slot = int(value)?;
        }
        Ok(out)
    }
}

impl RedisStore {
    /// Charges between `need` and `want` units of `policy` for `key` in one round trip
    /// (`want >= need`), within the store's deadline and through its circuit breaker.
    /// Units granted beyond `need` are recorded as leased until `back_within` (the caller's
    /// lease TTL and sweeper period) plus this store's deadline and stale tolerance (the
    /// give-back's own call) from now. A denial's `retry_after` is bounded by the lease
    /// record ([`RedisStore::bound_by_leases`]). `need = want = 0` writes nothing.
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
        back_within: Duration,
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
        let record = format!("{name}#leased");
        let [p1, p2, p3] = p.params;
        let back_within_us = u64::try_from(back_within.as_micros())
            .unwrap_or(u64::MAX)
            .saturating_add(shared.script.guard.allowance());
        let args = [p.algo, p1, p2, p3, need, want.max(need), back_within_us];
        // A stale call (it reached Redis after its deadline and did nothing) is a timeout.
        let call = shared.script.lease_call([&name, &record], args);
        let row = shared.timed(call, self.failover.policy.as_str()).await?;
        let [
            granted,
            code,
            remaining,
            reset,
            retry,
            stamp,
            out_units,
            out_for,
        ] = row;
        let us = |v: i64| Duration::from_micros(u64::try_from(v).unwrap_or(0));
        let outcome = match code {
            CODE_ALLOWED => Outcome::Allowed,
            CODE_DENIED => Outcome::Denied {
                retry_after: us(retry),
            },
            CODE_CANNOT_FIT => Outcome::CannotFit,
            _ => return Err(unavailable(BadReply("unknown outcome code"))),
        };
        let remaining = u32::try_from(remaining.clamp(0, i64::from(p.capacity))).unwrap_or(0);
        let receipt = match (code, u64::try_from(stamp)) {
            (CODE_ALLOWED, Ok(stamp)) => Receipt::new(stamp),
            _ => Receipt::NONE,
        };
        let leased = Leased {
            units: u64::try_from(out_units).unwrap_or(0),
            back_in: us(out_for),
        };
        let decision = Decision::new(outcome, p.limit, remaining, us(reset));
        Ok(LeaseGrant {
            granted: if code == CODE_ALLOWED {
                u64::try_from(granted).unwrap_or(0)
            } else {
                0
            },
            decision: self.bound_by_leases(policy, decision, need, leased),
            receipt,
            leased,
        })
    }

    /// `decision` (a denial of `need` units of `policy` on one key) with its `retry_after`
    /// bounded by the units leases of that key may still give back: no longer than until
    /// they are back (`leased.back_in`), unless the request needs longer even with them back
    /// (GCRA: `retry_after - units × T`; fixed window: they do not make up the difference, so
    /// the window's end). Other decisions, and a decision without leased units, unchanged.
    pub(crate) fn bound_by_leases(
        &self,
        policy: PolicyId,
        decision: Decision,
        need: u64,
        leased: Leased,
    ) -> Decision {
        let (Some(retry), Some(p)) = (decision.retry_after(), self.policies.get(policy.index()))
        else {
            return decision;
        };
        if leased.units == 0 || retry <= leased.back_in {
            return decision;
        }
        let bounded = if p.algo == ALGO_GCRA {
            // With the units back the state is `units × T` emptier.
            let t = Duration::from_micros(p.params[0]);
            let sooner = t.saturating_mul(u32::try_from(leased.units).unwrap_or(u32::MAX));
            retry.saturating_sub(sooner).max(leased.back_in)
        } else if u64::from(decision.remaining()).saturating_add(leased.units) >= need {
            leased.back_in
        } else {
            retry
        };
        Decision::new(
            Outcome::Denied {
                retry_after: bounded.min(retry),
            },
            decision.limit(),
            decision.remaining(),
            decision.reset_after(),
        )
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
