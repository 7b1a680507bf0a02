//! The harness: a server on loopback ports with a config written to a temporary directory,
//! a manual clock set to a Unix time, and a gRPC client.

use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use ratekeeper_core::clock::ManualClock;
use ratekeeper_core::store::FailurePolicy;
use ratekeeper_rls::Server;
use ratekeeper_rls::settings::Settings;
use tonic::transport::Channel;

use crate::redis_support::{RedisCluster, RedisServer};

/// Thursday 2025-07-31 00:00:00 UTC, a multiple of every unit up to WEEK, plus 30 s: the
/// clock of every test starts here, 30 s into a minute (so `duration_until_reset` of a
/// MINUTE limit is 30).
pub(crate) const START_UNIX_SECS: u64 = 1_753_920_000 + 30;

/// Where the server keeps its counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backend {
    Memory,
    Redis,
    /// Redis with units leased to the instance (`--store tiered`).
    Tiered,
    /// A 3-primary Redis Cluster (`REDIS_TYPE=cluster`).
    Cluster,
}

/// A running server and what the test needs to talk to it.
pub(crate) struct Rls {
    pub(crate) server: Option<Server>,
    pub(crate) client: RateLimitServiceClient<Channel>,
    pub(crate) clock: ManualClock,
    pub(crate) dir: tempfile::TempDir,
    pub(crate) redis: Option<RedisServer>,
    /// Kept alive (killed on drop) while the server uses it.
    pub(crate) _cluster: Option<RedisCluster>,
}

impl Rls {
    /// A server on `backend` serving `yaml` (one file) with extra `env` variables.
    pub(crate) async fn start(backend: Backend, yaml: &str, env: &[(&str, &str)]) -> Rls {
        let dir = tempfile::tempdir().expect("temporary directory");
        std::fs::write(dir.path().join("config.yaml"), yaml).expect("write the config");
        Self::start_in(backend, dir, env, FailurePolicy::Allow).await
    }

    /// `start`, with the store's failure policy.
    pub(crate) async fn start_failing(
        backend: Backend,
        yaml: &str,
        env: &[(&str, &str)],
        on_failure: FailurePolicy,
    ) -> Rls {
        let dir = tempfile::tempdir().expect("temporary directory");
        std::fs::write(dir.path().join("config.yaml"), yaml).expect("write the config");
        Self::start_in(backend, dir, env, on_failure).await
    }

    /// A server on `backend` serving the files already in `dir`.
    pub(crate) async fn start_in(
        backend: Backend,
        dir: tempfile::TempDir,
        env: &[(&str, &str)],
        on_failure: FailurePolicy,
    ) -> Rls {
        let redis = matches!(backend, Backend::Redis | Backend::Tiered).then(RedisServer::start);
        let cluster = (backend == Backend::Cluster).then(RedisCluster::start);
        let mut vars: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        if let Some(r) = &redis {
            vars.push(("REDIS_URL".to_owned(), r.url()));
            // A decision deadline that a loaded test machine meets: these tests check
            // decisions, not the failure policy.
            vars.push(("REDIS_TIMEOUT".to_owned(), "30s".to_owned()));
        }
        if let Some(c) = &cluster {
            c.wait_ok(Duration::from_secs(60));
            vars.push(("REDIS_URL".to_owned(), c.urls().join(",")));
            vars.push(("REDIS_TYPE".to_owned(), "cluster".to_owned()));
            vars.push(("REDIS_TIMEOUT".to_owned(), "30s".to_owned()));
        }
        let config = dir.path().display().to_string();
        let store = if backend == Backend::Tiered {
            "tiered"
        } else {
            ""
        };
        let mut args = vec![
            "ratekeeper-rls",
            "--config",
            &config,
            "--grpc",
            "127.0.0.1:0",
            "--http",
            "127.0.0.1:0",
            "--debug",
            "127.0.0.1:0",
        ];
        if !store.is_empty() {
            args.extend(["--store", store]);
        }
        let lookup = move |name: &str| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
        let (settings, _warnings) = Settings::parse(args, lookup).expect("settings parse");
        let clock = ManualClock::new();
        clock.set_elapsed(Duration::from_secs(START_UNIX_SECS));
        let server = Server::builder(settings)
            .clock(clock.clone())
            .reload_interval(Duration::from_millis(50))
            .on_store_failure(on_failure)
            .bind()
            .await
            .expect("the server starts");
        let client =
            RateLimitServiceClient::connect(format!("http://{}", server.local_grpc_addr()))
                .await
                .expect("the gRPC client connects");
        Rls {
            server: Some(server),
            client,
            clock,
            dir,
            redis,
            _cluster: cluster,
        }
    }

    pub(crate) fn server(&self) -> &Server {
        self.server.as_ref().expect("the server is running")
    }

    /// One call; panics on a gRPC error.
    pub(crate) async fn call(&mut self, request: RateLimitRequest) -> RateLimitResponse {
        self.client
            .should_rate_limit(request)
            .await
            .expect("ShouldRateLimit answers")
            .into_inner()
    }

    /// One call, the gRPC error kept.
    pub(crate) async fn try_call(
        &mut self,
        request: RateLimitRequest,
    ) -> Result<RateLimitResponse, tonic::Status> {
        self.client
            .should_rate_limit(request)
            .await
            .map(tonic::Response::into_inner)
    }

    /// `GET path` on the HTTP (main) listener: (status, body).
    pub(crate) async fn http_get(&self, path: &str) -> (u16, String) {
        get(&format!("http://{}{path}", self.server().local_http_addr())).await
    }

    /// `GET path` on the debug listener: (status, body).
    pub(crate) async fn debug_get(&self, path: &str) -> (u16, String) {
        get(&format!(
            "http://{}{path}",
            self.server().local_debug_addr()
        ))
        .await
    }
}

pub(crate) async fn get(url: &str) -> (u16, String) {
    let r = reqwest::get(url).await.expect("HTTP GET answers");
    let status = r.status().as_u16();
    (status, r.text().await.expect("a body"))
}

/// A descriptor of `(key, value)` entries.
pub(crate) fn desc(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).to_owned(),
                value: (*v).to_owned(),
            })
            .collect(),
        ..RateLimitDescriptor::default()
    }
}

/// `desc` with its own `hits_addend`.
pub(crate) fn desc_hits(entries: &[(&str, &str)], hits: u64) -> RateLimitDescriptor {
    RateLimitDescriptor {
        hits_addend: Some(UInt64Value { value: hits }),
        ..desc(entries)
    }
}

/// `desc` with Envoy's `RateLimitOverride` (`unit` as `RateLimitUnit`: 1 s, 2 min, 3 h, 4 d).
pub(crate) fn desc_override(
    entries: &[(&str, &str)],
    requests_per_unit: u32,
    unit: i32,
) -> RateLimitDescriptor {
    RateLimitDescriptor {
        limit: Some(RateLimitOverride {
            requests_per_unit,
            unit,
        }),
        ..desc(entries)
    }
}

/// A request for `domain` with `descriptors` and the request-level `hits_addend`.
pub(crate) fn req(
    domain: &str,
    descriptors: Vec<RateLimitDescriptor>,
    hits_addend: u32,
) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors,
        hits_addend,
    }
}

pub(crate) fn ok() -> i32 {
    Code::Ok as i32
}

pub(crate) fn over() -> i32 {
    Code::OverLimit as i32
}

/// (code, limit_remaining) of a status.
pub(crate) fn cr(s: &DescriptorStatus) -> (i32, u32) {
    (s.code, s.limit_remaining)
}

/// The value of the Prometheus sample `name{labels}` in `text` (labels as written in the
/// exposition, e.g. `domain="d",key1="k",key2=""`), 0 when absent.
pub(crate) fn sample(text: &str, name: &str, labels: &str) -> f64 {
    let prefix = if labels.is_empty() {
        format!("{name} ")
    } else {
        format!("{name}{{{labels}}} ")
    };
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Generates one test per backend: `$name::memory` and `$name::redis`, each running
/// `$body(backend)`.
#[macro_export]
macro_rules! on_both_stores {
    ($name:ident, $body:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn memory() {
                super::$body($crate::support::Backend::Memory).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn redis() {
                super::$body($crate::support::Backend::Redis).await;
            }
        }
    };
}
