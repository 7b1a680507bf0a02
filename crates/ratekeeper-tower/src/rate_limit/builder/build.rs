//! [`RateLimitBuilder::build`](crate::RateLimitBuilder::build): the checks of the settings, the policies registered with
//! the store, and the layer assembled from them.

use ratekeeper_core::store::{PolicyId, Store};
use ratekeeper_core::{Algorithm, Key, Quota};
use smallvec::SmallVec;

use super::RateLimitBuilder;
use crate::error::BuildError;
use crate::policy::Resolve;
use crate::rate_limit::diag::{self, Diagnostics, short_type_name};
use crate::rate_limit::layer::RateLimitLayer;
use crate::rate_limit::limiter::Limiter;
use crate::rate_limit::meter::Meter;
use crate::rate_limit::mode::Mode;
use crate::report::{DEFAULT_UNAVAILABLE_RETRY_AFTER, Reporter, Unavailable};
use crate::usage::UsageRules;

impl RateLimitBuilder {
    /// The layer of [`RateLimitLayer::new`]: one GCRA policy named `"default"` on a new
    /// memory store, which needs none of [`RateLimitBuilder::build`]'s checks (one valid
    /// policy name, cost 1 within any burst, the peer IP key, every request charged to the
    /// policy). The memory store refuses only a policy that fails
    /// [`Policy::validate`](ratekeeper_core::Policy::validate), which a GCRA policy with a
    /// valid name and no ban passes for every quota.
    pub(in crate::rate_limit) fn single_quota_layer(self, quota: Quota) -> RateLimitLayer {
        let mut builder = self.quota(quota);
        let mut ids = SmallVec::new();
        for p in &builder.settings.policies {
            match builder.store.register(p) {
                Ok(id) => ids.push(id),
                // Not reached (see above); were it reached, the error is told, not dropped.
                Err(error) => tracing::error!(
                    %error,
                    policy = p.name(),
                    "rate limit layer: the memory store refused the policy; requests are not limited by it"
                ),
            }
        }
        builder.assemble(ids, UsageRules::default())
    }
}

impl<K, Co, St, R> RateLimitBuilder<K, Co, St, R> {
    /// Registers the policies with the store and builds the layer.
    ///
    /// Logs one INFO event (target `ratekeeper`) naming the policies (name, quota,
    /// algorithm), the key extractor, the store, the header style and the mode, so the
    /// limits in force are in the startup log.
    ///
    /// # Errors
    ///
    /// [`BuildError`] when there is no policy, a name is reused or invalid, the key
    /// extractor refuses its settings ([`KeyExtractor::check`](crate::key::KeyExtractor::check):
    /// a header name that is not a valid field name), the store
    /// refuses a policy, a fixed cost is 0 or larger than a policy's burst, or the resolver
    /// refuses the policies (a [`RouteTable`](crate::route::RouteTable) route template that
    /// can never match, an unknown policy name, a route cost above a burst).
    pub fn build(self) -> Result<RateLimitLayer<K, Co, St, R>, BuildError>
    where
        K: crate::key::KeyExtractor,
        St: Store<Key>,
        R: Resolve,
    {
        let Self {
            mut settings,
            key,
            cost,
            mut store,
            resolver,
        } = self;
        let policies = &settings.policies;
        if policies.is_empty() {
            return Err(BuildError::NoPolicy);
        }
        for (i, p) in policies.iter().enumerate() {
            if policies[..i].iter().any(|q| q.name() == p.name()) {
                return Err(BuildError::DuplicatePolicy(p.name().to_owned()));
            }
        }
        if let Some(p) = policies
            .iter()
            .find(|p| p.algorithm() == Algorithm::Concurrency)
        {
            return Err(BuildError::ConcurrencyPolicy(p.name().to_owned()));
        }
        if let Some(cost) = settings.fixed_cost {
            if cost == 0 {
                return Err(BuildError::ZeroCost);
            }
            if let Some(p) = policies.iter().find(|p| cost > u64::from(p.capacity())) {
                return Err(BuildError::CostExceedsBurst {
                    policy: p.name().to_owned(),
                    cost,
                    burst: p.capacity(),
                });
            }
        }
        for (name, settle) in &settings.settle {
            let index = policies
                .iter()
                .position(|p| p.name() == name)
                .and_then(|i| u32::try_from(i).ok())
                .ok_or_else(|| BuildError::UnknownPolicy(name.clone()))?;
            settings.rules.settle.push((index, *settle));
        }
        let mut usage = UsageRules::default();
        for (name, rule) in std::mem::take(&mut settings.usage) {
            let index = policies
                .iter()
                .position(|p| p.name() == name)
                .and_then(|i| u32::try_from(i).ok())
                .ok_or(BuildError::UnknownPolicy(name))?;
            let capacity = policies
                .get(index as usize)
                .map_or(u32::MAX, ratekeeper_core::Policy::capacity);
            usage.set(index, rule, capacity);
        }
        key.check()?;
        resolver.check(policies)?;
        let mut ids = SmallVec::new();
        for p in policies {
            ids.push(store.register(p)?);
        }
        Ok(Self {
            settings,
            key,
            cost,
            store,
            resolver,
        }
        .assemble(ids, usage))
    }

    /// The layer from settings whose checks passed and whose policies the store registered
    /// as `ids` (in order): [`RateLimitBuilder::build`] after its checks, and
    /// [`RateLimitLayer::new`], whose settings need none. Cannot fail.
    pub(in crate::rate_limit) fn assemble(
        self,
        ids: SmallVec<[PolicyId; 4]>,
        usage: UsageRules,
    ) -> RateLimitLayer<K, Co, St, R>
    where
        K: crate::key::KeyExtractor,
    {
        let Self {
            mut settings,
            key,
            cost,
            store,
            resolver,
        } = self;
        let rules = &mut settings.rules;
        if rules.exempt_networks.is_empty() {
            rules.exempt_trust = None;
        } else if rules.exempt_trust.is_none() {
            rules.exempt_trust = key.trusted_proxies().cloned();
        }
        // The trust rules' NAT64 prefixes read the addresses they resolve: the networks
        // are read with them too.
        if let Some(trust) = &rules.exempt_trust {
            for prefix in trust.nat64_prefixes() {
                if !rules.nat64.contains(prefix) {
                    rules.nat64.push(*prefix);
                }
            }
        }
        let exempt = std::mem::take(&mut rules.exempt_networks);
        rules.exempt_networks = crate::key::normalize_nets(exempt, &rules.nat64);
        let policies = &settings.policies;
        for p in policies.iter().filter(|p| p.ban().is_some()) {
            // The bans counter at 0 (a Prometheus series should exist before its first
            // event); a no-op without a recorder installed.
            metrics::counter!(crate::metrics::BANS_TOTAL, "policy" => p.name().to_owned())
                .increment(0);
        }
        let mut reporter = Reporter::new(policies, settings.style, settings.reset);
        reporter.rejection = settings.rejection;
        reporter.partition_key = settings.partition_key;
        reporter.grpc = settings.grpc;
        diag::built(
            policies,
            &key.describe(),
            &short_type_name::<St>(),
            settings.style,
            settings.mode,
        );
        let diag = Diagnostics::new(
            !settings.quiet_forwarded && key.keys_by_peer(),
            settings.raw_keys,
        );
        RateLimitLayer::from_limiter(Limiter {
            store,
            ids,
            diag,
            meter: Meter::new(reporter.names.clone(), settings.mode == Mode::Shadow),
            reporter,
            key,
            cost,
            resolver,
            rules: settings.rules,
            mode: settings.mode,
            request_info: settings.request_info,
            usage,
            unavailable: Unavailable::rate_limit(
                settings
                    .unavailable_retry_after
                    .unwrap_or(DEFAULT_UNAVAILABLE_RETRY_AFTER),
            ),
        })
    }
}
