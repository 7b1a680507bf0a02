//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`, as envoyproxy/ratelimit
//! answers it.
//!
//! For each request descriptor, in order:
//!
//! 1. the rule: the descriptor's `limit` (Envoy's `RateLimitOverride`) when the domain is
//!    known, else the config's match ([`RateLimitConfig::lookup`]);
//! 2. rules whose `name` another matched rule `replaces` are dropped (no limit);
//! 3. `unlimited` rules answer `OK` with `limit_remaining` 4294967295, uncounted;
//! 4. a rule of `requests_per_unit: 0` refuses without the store;
//! 5. every other rule charges its hits to its own counter in the store (a fixed window of
//!    `unit` seconds aligned on the Unix epoch, or the rule's `algorithm` over its `period`),
//!    the descriptors of one request concurrently.
//!
//! Hits: the descriptor's `hits_addend` when set (0 reads the counter without charging it),
//! else the request's `hits_addend`, where 0 counts as 1.
//!
//! The overall code is `OVER_LIMIT` when a descriptor outside quota mode is over, or when
//! the request has quota-mode descriptors and all of them are over; the global shadow mode
//! then answers `OK` (the descriptor statuses keep their codes). See the crate's
//! [`compat`](crate::compat) module for where this differs from the reference.

mod decide;
mod ietf;
mod outcome;
mod response;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use arc_swap::ArcSwapOption;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

use crate::config::{OnStoreFailure, RateLimitConfig};
use crate::limiter::Limiter;
use crate::settings::{HeaderFormat, ResponseHeaderNames, Settings};
use crate::stats::{self, Stats};

pub use decide::ServiceError;

/// What changes the service's answers, from [`Settings`].
#[derive(Debug, Clone)]
pub(crate) struct Options {
    pub(crate) shadow_mode: bool,
    pub(crate) quota_mode: bool,
    pub(crate) headers: Option<ResponseHeaderNames>,
    pub(crate) header_format: HeaderFormat,
    pub(crate) problem_details: bool,
    pub(crate) dynamic_metadata: bool,
    pub(crate) near_limit_ratio: f32,
    pub(crate) cache_key_prefix: String,
    /// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`: a request's descriptors are charged
    /// all-or-nothing.
    pub(crate) stop_increment_when_over_limit: bool,
    /// What a limit without its own `on_store_failure` answers when the store fails.
    pub(crate) on_store_failure: OnStoreFailure,
}

impl Options {
    pub(crate) fn from_settings(s: &Settings) -> Self {
        Self {
            shadow_mode: s.shadow_mode,
            quota_mode: s.quota_mode,
            headers: s.response_headers.clone(),
            header_format: s.response_headers_format,
            problem_details: s.problem_details,
            dynamic_metadata: s.response_dynamic_metadata,
            near_limit_ratio: s.near_limit_ratio,
            cache_key_prefix: s.cache_key_prefix.clone(),
            stop_increment_when_over_limit: s.stop_increment_when_over_limit,
            on_store_failure: s.on_store_failure,
        }
    }
}

/// The state every call shares: the config in force, the store, the stats.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) config: ArcSwapOption<RateLimitConfig>,
    pub(crate) limiter: Limiter,
    pub(crate) stats: Stats,
    pub(crate) options: Options,
    /// Calls being answered now (gRPC and `/json`).
    pub(crate) in_flight: AtomicUsize,
}

/// Counts a call in flight while it lives.
struct InFlight<'a>(&'a AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Shared {
    /// Puts `config` in force for the calls that start from now on.
    pub(crate) fn swap_config(&self, config: RateLimitConfig) {
        self.config.store(Some(Arc::new(config)));
    }

    /// The answer to one request, or why it is refused. Counts the call's errors.
    pub(crate) async fn should_rate_limit(
        &self,
        request: &RateLimitRequest,
    ) -> Result<RateLimitResponse, ServiceError> {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        let _guard = InFlight(&self.in_flight);
        let result = decide::decide(self, request).await;
        if let Err(e) = &result {
            stats::should_rate_limit_error(e.err_type());
        }
        result
    }
}

/// The tonic service: `RateLimitServiceServer::new(RateLimiter)`.
#[derive(Debug, Clone)]
pub struct RateLimiter {
    pub(crate) shared: Arc<Shared>,
}

#[tonic::async_trait]
impl RateLimitService for RateLimiter {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        let started = Instant::now();
        let result = self.shared.should_rate_limit(request.get_ref()).await;
        stats::call("ShouldRateLimit", started.elapsed().as_secs_f64());
        result
            .map(tonic::Response::new)
            .map_err(ServiceError::into_status)
    }
}
