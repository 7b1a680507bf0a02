//! Every `metrics` name the crate records, defined once, as constants.
//!
//! With a `metrics` recorder installed (the `metrics` crate's facade, for example
//! `metrics-exporter-prometheus`), the rate limit records [`DECISIONS_TOTAL`],
//! [`USAGE_RATIO`], [`BANS_TOTAL`], the shadow-mode counters and [`DEGRADED_TOTAL`]; an
//! [adaptive](crate::adaptive) concurrency limit records the `ADAPTIVE_*` gauges and
//! counters. The Redis store's own metrics (`ratekeeper_store_*`) are named in
//! `ratekeeper_core::store::redis`.
//!
//! ```
//! use ratekeeper_tower::metrics::DECISIONS_TOTAL;
//!
//! assert_eq!(DECISIONS_TOTAL, "ratekeeper_decisions_total");
//! ```

/// The counter's name: one count per charged policy per decision, labels `policy` (the
/// policy's name) and `outcome` (`allowed`, `denied`, or `cannot_fit` for a cost larger than
/// the burst). Each policy's own decision is counted: with several policies, a request one
/// of them denies counts as allowed for the others, which were not charged (all or
/// nothing). Every request is counted once, by the decision that settled what happens to it,
/// whether the store answered at once or later: shadow-mode overruns and requests a fallback
/// answers as denied (so a shadow rollout shows how many requests a limit would deny), a
/// [`Mode::Delay`](crate::rate_limit::Mode::Delay) reservation as allowed when it is made, a Delay-mode
/// request that re-checks after sleeping by its last answer only.
pub const DECISIONS_TOTAL: &str = "ratekeeper_decisions_total";

/// The usage histogram's name: for every charged policy of every decision, the share of the
/// policy's capacity the key had used once it was checked, `(limit - remaining) / limit`
/// (`limit` and `remaining` as in the rate-limit headers: the capacity
/// ([`Policy::capacity`](ratekeeper_core::Policy::capacity)) and the units left after the
/// decision), from `0.0` (untouched) to `1.0` (nothing left), label `policy`. Its p99 near
/// 1.0 says the busiest clients live at the limit; near 0 says the limit is far above the
/// traffic. Recorded in every mode.
pub const USAGE_RATIO: &str = "ratekeeper_usage_ratio";

/// In [`Mode::Shadow`](crate::rate_limit::Mode::Shadow) only: every decision of a charged policy
/// (label `policy`). With [`SHADOW_WOULD_REFUSE_TOTAL`], the share of requests the policy
/// would refuse: `rate(ratekeeper_shadow_would_refuse_total[5m]) /
/// rate(ratekeeper_shadow_checked_total[5m])`.
pub const SHADOW_CHECKED_TOTAL: &str = "ratekeeper_shadow_checked_total";

/// In [`Mode::Shadow`](crate::rate_limit::Mode::Shadow) only: decisions the policy denied, which the
/// layer let through (label `policy`; a cost that can never fit counts too).
pub const SHADOW_WOULD_REFUSE_TOTAL: &str = "ratekeeper_shadow_would_refuse_total";

/// One count per ban a policy starts (label `policy`): a key the policy refused as often as
/// its [`Ban`](ratekeeper_core::Ban) allows is now refused for the ban's duration. Counted
/// once per ban, by the request whose refusal started it (not per request the ban refuses),
/// in every mode (in [`Mode::Shadow`](crate::rate_limit::Mode::Shadow) the store bans, the layer lets the
/// requests through). Each ban is also logged at INFO, target `ratekeeper`.
pub const BANS_TOTAL: &str = "ratekeeper_bans_total";

/// One count per request a degraded-response fallback answered (see
/// [`RateLimitLayer::with_fallback`](crate::RateLimitLayer::with_fallback)), labels `policy`
/// (the policy that limited it, or `store-unavailable`) and `reason` (`limited`, or
/// `store_unavailable` when the store could not decide under
/// [`FailurePolicy::Degrade`](ratekeeper_core::store::FailurePolicy::Degrade)).
pub const DEGRADED_TOTAL: &str = "ratekeeper_degraded_total";

/// Gauge: an [adaptive](crate::adaptive) limit's current in-flight limit, labels `name` (the
/// layer's name) and `key`.
pub const ADAPTIVE_LIMIT: &str = "ratekeeper_adaptive_limit";
/// Gauge: requests in flight (admitted, response body not ended), labels `name` and `key`.
pub const ADAPTIVE_IN_FLIGHT: &str = "ratekeeper_adaptive_in_flight";
/// Gauge: the latency estimate of the last update interval (its percentile latency), in
/// seconds, labels `name` and `key`.
pub const ADAPTIVE_LATENCY_SECONDS: &str = "ratekeeper_adaptive_latency_seconds";
/// Gauge: the measured minimum latency (`minRTT`), in seconds, labels `name` and `key`.
pub const ADAPTIVE_MIN_LATENCY_SECONDS: &str = "ratekeeper_adaptive_min_latency_seconds";
/// Counter: requests by outcome, labels `name`, `partition` and `outcome` (`admitted`, or
/// `shed` for a request the layer answered because its partition was over its share at the
/// limit).
pub const ADAPTIVE_REQUESTS_TOTAL: &str = "ratekeeper_adaptive_requests_total";
/// Counter: requests of keys beyond [`AdaptiveConcurrencyBuilder::max_keys`](crate::adaptive::AdaptiveConcurrencyBuilder::max_keys), which share
/// one overflow limiter (key label `overflow`), label `name`.
pub const ADAPTIVE_OVERFLOW_TOTAL: &str = "ratekeeper_adaptive_overflow_total";
