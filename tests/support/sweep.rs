//! Generators and properties of the adversarial-input sweep, shared by the `cargo fuzz`
//! targets in `fuzz/` (nightly, libFuzzer) and the bounded, seeded property sweep in
//! `tests/sweep/main.rs` (stable, proptest, run by `.ci/run`).
//!
//! Every target is a `fn(&[u8])`: the bytes drive a [`Gen`] that builds a structured input
//! (quota strings, policy documents, forwarded headers, header keys, upstream rate-limit
//! headers, whole request traces against extreme configurations) from dictionaries of
//! interesting tokens, and the target panics when a property does not hold. Exhausted input
//! reads as zeros, so every byte string is a valid case and shrinking works on bytes.
//!
//! Properties checked:
//!
//! - nothing panics (parsers, extractors, the layer on its request path);
//! - every response is well formed: rate-limit numbers are canonical decimals, `Remaining`
//!   never exceeds `Limit`, a 429 carries an integer `Retry-After` of at least 1 second
//!   unless the request can never fit (then it has none), and a problem+json body parses;
//! - every `Retry-After` is honoured: on a manual clock, the same request sent again after
//!   waiting it, with nothing in between, is admitted;
//! - the edges (`edges`): a memory store driven by checks, refunds, resets, sweeps and clock
//!   steps (with `max_keys` and its overflow state) decides exactly as a reference model in
//!   which a refund gives back what its charge still holds on the state and in the life it
//!   was charged on; configuration errors are one line; a polite client reads resets by
//!   plausibility, never waits beyond its maximum and lets a later answer shorten a wait;
//!   distinct compact keys never share a budget.
//!
//! Not checked here: that a check's cost does not grow with the state one key holds. That is
//! a timing property, measured by the per-algorithm scaling benchmark (time per check at n
//! and 4n entries for one key), not by a test.

use std::convert::Infallible;
use std::num::{NonZeroU8, NonZeroU32, NonZeroUsize};
use std::str::FromStr;
use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use ratekeeper_axum::key::{ForwardedIp, HeaderKey, KeyExtractor, PeerAddr, Source};
use ratekeeper_axum::rate_limit::Mode;
use ratekeeper_axum::report::{HeaderStyle, ResetFormat};
use ratekeeper_axum::{RateLimitLayer, RequestParts, core::Algorithm, core::Policy, core::Quota};
use ratekeeper_core::clock::ManualClock;
use ratekeeper_core::store::MemoryStore;
use tower::ServiceExt;

mod edges;

pub use edges::{compact_keys, config_document, polite_headers, refund_receipts};

/// A proptest runner with a fixed seed, so every run checks the same inputs and a failure
/// reproduces: `cases` cases (times the `SWEEP_CASES` environment variable, default 1) from
/// `default_seed` (or the number in `SWEEP_SEED`), shrinking at most `max_shrink_iters` times.
/// Returns the runner and the seed it used (to name in a failure).
pub fn seeded_runner(
    cases: u32,
    default_seed: u64,
    max_shrink_iters: u32,
) -> (proptest::test_runner::TestRunner, u64) {
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
    let env = |name: &str| std::env::var(name).ok();
    let factor: u32 = env("SWEEP_CASES").and_then(|v| v.parse().ok()).unwrap_or(1);
    let seed: u64 = env("SWEEP_SEED")
        .and_then(|v| v.parse().ok())
        .unwrap_or(default_seed);
    let mut bytes = [0u8; 32];
    for (i, chunk) in bytes.chunks_mut(8).enumerate() {
        chunk.copy_from_slice(&seed.wrapping_add(i as u64).to_le_bytes());
    }
    let config = Config {
        cases: cases.saturating_mul(factor),
        failure_persistence: None,
        rng_algorithm: RngAlgorithm::ChaCha,
        max_shrink_iters,
        ..Config::default()
    };
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &bytes);
    (TestRunner::new_with_rng(config, rng), seed)
}

/// Reads structured values from fuzzer bytes; reads past the end give zeros.
#[derive(Debug)]
pub struct Gen<'a> {
    data: &'a [u8],
}

impl<'a> Gen<'a> {
    /// A generator over `data`.
    pub fn new(data: &'a [u8]) -> Self {
        Self { data }
    }

    /// One byte (0 once the input is used up).
    pub fn byte(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }

    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        let wide = u16::from_le_bytes([self.byte(), self.byte()]);
        usize::from(wide) % n
    }

    /// Whether the next byte is odd.
    pub fn flip(&mut self) -> bool {
        self.byte() & 1 == 1
    }

    /// One of `items` (which must not be empty).
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        let i = self.below(items.len());
        items[i]
    }

    /// A `u64` spread over every magnitude: a bit length, then that many random bits.
    pub fn magnitude(&mut self) -> u64 {
        let bits = u32::from(self.byte() % 65);
        let mut v = 0u64;
        for _ in 0..8 {
            v = (v << 8) | u64::from(self.byte());
        }
        match bits {
            0 => 0,
            64 => v,
            b => v & ((1u64 << b) - 1) | (1u64 << (b - 1)),
        }
    }

    /// Up to `max` tokens of `dictionary`, sometimes with a raw byte in between, joined.
    pub fn text(&mut self, dictionary: &[&str], max: usize) -> String {
        let n = self.below(max + 1);
        let mut out = String::new();
        for _ in 0..n {
            if self.byte() < 16 {
                out.push(char::from(self.byte() & 0x7f));
            } else {
                out.push_str(self.pick(dictionary));
            }
        }
        out
    }
}

/// Tokens of the quota string syntax, with the numbers at the edges of every type.
const QUOTA_TOKENS: &[&str] = &[
    "0",
    "1",
    "2",
    "7",
    "10",
    "60",
    "1000",
    "213504",
    "4294967295",
    "4294967296",
    "18446744073709551615",
    "18446744073709551616",
    "-1",
    "+1",
    "1_000",
    "1.5",
    "/",
    " per ",
    "per",
    " ",
    "  ",
    "burst",
    " burst ",
    "ns",
    "us",
    "µs",
    "ms",
    "s",
    "sec",
    "m",
    "min",
    "h",
    "hour",
    "d",
    "day",
    "days",
    "week",
    "x",
    "\t",
    "é",
    "٣",
];

/// Parses a quota string built from `data`; a quota that parses is displayed and parsed
/// back to the same quota, and its capacity and advertised window are computed for every
/// algorithm.
pub fn quota_string(data: &[u8]) {
    let mut g = Gen::new(data);
    let s = g.text(QUOTA_TOKENS, 8);
    check_quota_text(&s);
}

fn check_quota_text(s: &str) {
    let Ok(q) = Quota::from_str(s) else { return };
    let shown = q.to_string();
    let back = Quota::from_str(&shown)
        .unwrap_or_else(|e| panic!("{s:?} displays as {shown:?}, which does not parse: {e}"));
    assert_eq!(
        (back.limit(), back.period_nanos(), back.burst()),
        (q.limit(), q.period_nanos(), q.burst()),
        "{s:?} → {shown:?}"
    );
    for algorithm in Algorithm::ALL {
        let policy = Policy::new("p", q).with_algorithm(algorithm);
        let _ = policy.capacity();
        let _ = policy.advertised();
    }
}

/// Tokens of a policy document (JSON).
const POLICY_TOKENS: &[&str] = &[
    "{",
    "}",
    "\"name\"",
    "\"quota\"",
    "\"algorithm\"",
    ":",
    ",",
    "\"p\"",
    "\"a.b-c_9\"",
    "\"\"",
    "\"bad name\"",
    "\"10/min\"",
    "\"1/day burst 4294967295\"",
    "\"0/s\"",
    "\"gcra\"",
    "\"leaky_bucket\"",
    "\"fixed_window\"",
    "\"sliding_log\"",
    "\"sliding_window\"",
    "\"concurrency\"",
    "\"nope\"",
    "null",
    "1",
    "[",
    "]",
    "\"extra\"",
    "true",
];

/// Deserializes a policy document built from `data` (mostly well-formed, with every field
/// varied); one that deserializes is validated and survives a serialize round trip.
pub fn policy_document(data: &[u8]) {
    let mut g = Gen::new(data);
    let doc = if g.flip() {
        g.text(POLICY_TOKENS, 12)
    } else {
        let name = g.pick(&["\"p\"", "\"a.b-c_9\"", "\"\"", "\"x y\"", "7"]);
        let quota = format!("\"{}\"", g.text(QUOTA_TOKENS, 6).replace('"', ""));
        let algorithm = g.pick(&[
            "",
            ",\"algorithm\":\"gcra\"",
            ",\"algorithm\":\"sliding_log\"",
            ",\"algorithm\":\"leaky_bucket\"",
            ",\"algorithm\":\"concurrency\"",
            ",\"algorithm\":\"x\"",
            ",\"extra\":1",
        ]);
        format!("{{\"name\":{name},\"quota\":{quota}{algorithm}}}")
    };
    let Ok(policy) = serde_json::from_str::<Policy>(&doc) else {
        return;
    };
    let _ = policy.validate();
    let json = serde_json::to_string(&policy).expect("a policy serializes");
    let back: Policy = serde_json::from_str(&json)
        .unwrap_or_else(|e| panic!("{doc} → {json}, which does not deserialize: {e}"));
    assert_eq!(back.name(), policy.name());
    assert_eq!(back.algorithm(), policy.algorithm());
}

/// Tokens of `X-Forwarded-For` and `Forwarded` values.
const FORWARDED_TOKENS: &[&str] = &[
    "for=",
    "For=",
    "by=",
    "proto=https",
    ";",
    ",",
    ", ",
    " ",
    "\"",
    "[",
    "]",
    ":",
    "_",
    "_abc",
    "_x.y-z",
    "192.0.2.43",
    "198.51.100.7",
    "10.0.0.1",
    "127.0.0.1",
    "0.0.0.0",
    "255.255.255.255",
    "224.0.0.1",
    "2001:db8::1",
    "::ffff:10.0.0.1",
    "::",
    "ff02::1",
    "4711",
    "80",
    "123456",
    "unknown",
    "_hidden",
    "=",
    "%",
    "1.2.3",
    "999.1.1.1",
];

/// Extracts `ForwardedIp` keys from forwarded headers built from `data`, for both sources
/// and both trust models: never an error or a panic, always an address key, and the peer
/// when the peer is not trusted.
pub fn forwarded(data: &[u8]) {
    let mut g = Gen::new(data);
    let source = if g.flip() {
        Source::Forwarded
    } else {
        Source::XForwardedFor
    };
    let name = match source {
        Source::Forwarded => "forwarded",
        _ => "x-forwarded-for",
    };
    let cidrs = g.flip();
    let ip = if cidrs {
        ForwardedIp::trusting(["10.0.0.0/8".parse().expect("a CIDR")])
    } else {
        let hops = NonZeroU8::new(g.byte() % 4 + 1).unwrap_or(NonZeroU8::MIN);
        ForwardedIp::hops(hops)
    }
    .source(source);
    let peer = g.pick(&["10.0.0.5", "203.0.113.9", "::ffff:10.0.0.7"]);
    let mut req = Request::new(());
    for _ in 0..g.below(3) {
        let value = g.text(FORWARDED_TOKENS, 12);
        if let Ok(value) = HeaderValue::from_str(&value) {
            req.headers_mut().append(name, value);
        }
    }
    let peer_ip: std::net::IpAddr = peer.parse().expect("an address");
    req.extensions_mut()
        .insert(PeerAddr(std::net::SocketAddr::new(peer_ip, 1)));
    let key = ip
        .extract(&req)
        .unwrap_or_else(|e| panic!("no key for {:?}: {e}", req.headers()))
        .to_string();
    assert!(
        key.starts_with("ip:") || key.starts_with("net:"),
        "{key} for {:?}",
        req.headers()
    );
    if cidrs && peer == "203.0.113.9" {
        assert_eq!(key, "ip:203.0.113.9", "an untrusted peer is the key");
    }
}

/// Extracts a raw `HeaderKey` from `x-api-key` lines built from `data` (any bytes a header
/// value may hold, long values, several lines): never a panic, the same answer twice.
pub fn header_key(data: &[u8]) {
    let mut g = Gen::new(data);
    let extractor = HeaderKey::raw("x-api-key");
    let mut req = Request::new(());
    for _ in 0..g.below(3) {
        let len = match g.byte() % 4 {
            0 => g.below(8),
            1 => g.below(300),
            _ => g.below(5000),
        };
        let fill = g.byte();
        let bytes: Vec<u8> = (0..len)
            .map(|i| fill.wrapping_add(i as u8) | 0x20)
            .collect();
        if let Ok(value) = HeaderValue::from_bytes(&bytes) {
            req.headers_mut().append("x-api-key", value);
        }
    }
    let first = extractor.extract(&req).map(|k| k.to_string());
    let second = extractor.extract(&req).map(|k| k.to_string());
    assert_eq!(
        first.as_ref().ok(),
        second.as_ref().ok(),
        "a key is deterministic"
    );
}

/// Upstream rate-limit values a handler may pass on.
const UPSTREAM_NUMBERS: &[&str] = &[
    "0",
    "1",
    "5",
    "9",
    "30",
    "+5",
    " 0 ",
    "007",
    "00",
    "-1",
    "1e3",
    "0x5",
    "",
    " ",
    "18446744073709551615",
    "18446744073709551616",
    "1700000000",
    "4000000000",
    "abc",
    "\"p\";r=0;t=5",
    "\"q\";q=1;w=1",
];

const STYLES: [HeaderStyle; 5] = [
    HeaderStyle::XRateLimit,
    HeaderStyle::Ietf,
    HeaderStyle::IetfLegacy,
    HeaderStyle::Both,
    HeaderStyle::None,
];

thread_local! {
    static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a current-thread tokio runtime");
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    RUNTIME.with(|rt| rt.block_on(f))
}

/// Sends one request through a layer (10 per minute, any header style) to a handler that
/// sets rate-limit headers built from `data`, as a handler passing on an upstream's would;
/// the response must be well formed ([`check_response`]).
pub fn header_merge(data: &[u8]) {
    let mut g = Gen::new(data);
    let style = g.pick(&STYLES);
    let reset = g.pick(&[ResetFormat::DeltaSeconds, ResetFormat::UnixEpoch]);
    let names = [
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
        "ratelimit-limit",
        "ratelimit-remaining",
        "ratelimit-reset",
        "ratelimit",
        "ratelimit-policy",
    ];
    let mut upstream = Vec::new();
    for name in names {
        if g.flip() {
            upstream.push((name, g.pick(UPSTREAM_NUMBERS)));
        }
    }
    let clock = ManualClock::with_unix_origin(Duration::from_secs(1_700_000_000));
    let Ok(layer) = RateLimitLayer::builder()
        .policy(Policy::new(
            "api",
            Quota::per_minute(NonZeroU32::new(10).unwrap_or(NonZeroU32::MIN)),
        ))
        .store(MemoryStore::with_clock(clock))
        .key(ratekeeper_axum::key::GlobalKey)
        .headers(style)
        .reset_format(reset)
        .build()
    else {
        panic!("a plain layer builds");
    };
    let svc = tower::ServiceBuilder::new()
        .layer(layer)
        .service_fn(move |_req: Request<()>| {
            let upstream = upstream.clone();
            async move {
                let mut res = Response::new(String::new());
                for (name, value) in upstream {
                    if let Ok(value) = HeaderValue::from_str(value) {
                        res.headers_mut().append(name, value);
                    }
                }
                Ok::<_, Infallible>(res)
            }
        });
    block_on(async {
        let res = svc.oneshot(Request::new(())).await.expect("infallible");
        check_response(style, res.status(), res.headers(), None);
    });
}

/// A rate-limit number exactly as a well-formed response writes it.
fn canonical(value: &HeaderValue) -> Option<u64> {
    let bytes = value.as_bytes();
    let ok = match bytes {
        [] => false,
        [b'0'] => true,
        [b'0', ..] => false,
        digits => digits.iter().all(u8::is_ascii_digit),
    };
    ok.then(|| value.to_str().ok()?.parse().ok()).flatten()
}

/// Checks one response: canonical numeric rate-limit headers of the fields `style` writes,
/// `Remaining <= Limit`, and on a 429 an integer `Retry-After >= 1` (absent only when the
/// request can never fit) and a parsable problem+json body (`body`, when given). Returns the
/// `Retry-After` seconds.
pub fn check_response(
    style: HeaderStyle,
    status: StatusCode,
    headers: &HeaderMap,
    body: Option<&[u8]>,
) -> Option<u64> {
    let (x, legacy) = match style {
        HeaderStyle::XRateLimit | HeaderStyle::Both => (true, false),
        HeaderStyle::IetfLegacy => (false, true),
        _ => (false, false),
    };
    let owned = [x, legacy];
    for (names, _) in [
        [
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset",
        ],
        ["ratelimit-limit", "ratelimit-remaining", "ratelimit-reset"],
    ]
    .into_iter()
    .zip(owned)
    .filter(|(_, owned)| *owned)
    {
        let [limit, remaining, reset] = names.map(|n| {
            let all: Vec<&HeaderValue> = headers.get_all(n).iter().collect();
            assert!(
                all.len() <= 1,
                "{n} appears {} times: {headers:?}",
                all.len()
            );
            all.first().map(|v| {
                canonical(v).unwrap_or_else(|| panic!("{n}: {v:?} is not a decimal: {headers:?}"))
            })
        });
        let _ = reset;
        if let (Some(limit), Some(remaining)) = (limit, remaining) {
            assert!(
                remaining <= limit,
                "remaining {remaining} > limit {limit}: {headers:?}"
            );
        }
    }
    let retry_after = headers.get("retry-after").map(|v| {
        let secs = canonical(v).unwrap_or_else(|| panic!("Retry-After {v:?} is not an integer"));
        assert!(secs >= 1, "Retry-After 0: {headers:?}");
        secs
    });
    if status == StatusCode::TOO_MANY_REQUESTS {
        if let Some(body) = body {
            let problem = headers
                .get("content-type")
                .is_some_and(|v| v.as_bytes().starts_with(b"application/problem+json"));
            if problem {
                let json: serde_json::Value = serde_json::from_slice(body)
                    .unwrap_or_else(|e| panic!("problem+json body does not parse: {e}"));
                assert_eq!(json["status"], 429, "{json}");
            }
        }
    } else {
        assert!(retry_after.is_none(), "Retry-After on a {status}");
    }
    retry_after
}

/// Request costs at every edge.
fn cost(g: &mut Gen<'_>) -> u64 {
    match g.byte() % 4 {
        0 => g.pick(&[1, 1, 2, 3]),
        1 => g.pick(&[0, 10, 213_504, u64::from(u32::MAX), u64::MAX]),
        _ => g.magnitude() % 1_000_001,
    }
}

fn quota(g: &mut Gen<'_>) -> Quota {
    let limit = g.pick(&[1, 2, 3, 10, 1000, u32::MAX]);
    let limit = NonZeroU32::new(limit).unwrap_or(NonZeroU32::MIN);
    let period = match g.byte() % 3 {
        0 => g.pick(&[
            1,
            1_000_000,
            1_000_000_000,
            60_000_000_000,
            86_400_000_000_000,
            u64::MAX / 2,
            u64::MAX,
        ]),
        _ => g.magnitude().max(1),
    };
    // A quota refused (a tolerance past u64::MAX ns): per second, or per day.
    let q = Quota::from_nanos(limit, period)
        .or_else(|| Quota::from_nanos(limit, 1_000_000_000))
        .unwrap_or(Quota::per_day(limit));
    match g.byte() % 3 {
        0 => q,
        1 => q.with_burst(g.pick(&[1, 2, 5, 100, u32::MAX])).unwrap_or(q),
        _ => q
            .with_burst(u32::try_from(g.magnitude() >> 32).unwrap_or(1).max(1))
            .unwrap_or(q),
    }
}

/// Where the manual clock saturates.
const END_OF_TIME: Duration = Duration::from_nanos(u64::MAX);

const ALGORITHMS: [Algorithm; 5] = [
    Algorithm::Gcra,
    Algorithm::LeakyBucket,
    Algorithm::FixedWindow,
    Algorithm::SlidingLog,
    Algorithm::SlidingWindow,
];

/// A whole layer on a manual clock with an extreme configuration built from `data` (one to
/// three policies of any algorithm, limits and periods at the edges of their types, bursts
/// up to `u32::MAX`, any header style, sometimes `with_max_keys`), then a trace of requests
/// (keys, costs up to `u64::MAX`, time steps up to `u64::MAX` ns). Every response must be well
/// formed ([`check_response`]), and every 429 with a `Retry-After` is honoured: the same
/// request sent again after advancing the clock by it, with nothing in between, passes.
pub fn layer_trace(data: &[u8]) {
    let mut g = Gen::new(data);
    let clock = ManualClock::with_unix_origin(Duration::from_secs(1_700_000_000));
    let mut store = MemoryStore::with_clock(clock.clone());
    // What was built and sent, for the failure message.
    let mut log = String::new();
    if g.byte() % 4 == 0 {
        let max = NonZeroUsize::new(g.below(3) + 1).unwrap_or(NonZeroUsize::MIN);
        log.push_str(&format!("max_keys {max}; "));
        store = store.with_max_keys(max);
    }
    let style = g.pick(&STYLES);
    let mut builder = RateLimitLayer::builder()
        .store(store)
        .key(HeaderKey::raw("x-key"))
        .cost_fn(|req: &RequestParts<'_>| {
            req.headers()
                .get("x-cost")
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(1)
        })
        .headers(style)
        .reset_format(g.pick(&[ResetFormat::DeltaSeconds, ResetFormat::UnixEpoch]))
        .mode(Mode::Reject);
    for i in 0..=g.below(3) {
        let algorithm = g.pick(&ALGORITHMS);
        let quota = quota(&mut g);
        // Only GCRA and the leaky bucket take a burst; the others are built without one.
        let quota = match algorithm {
            Algorithm::Gcra | Algorithm::LeakyBucket => quota,
            _ => quota.with_burst(quota.limit()).unwrap_or(quota),
        };
        log.push_str(&format!("p{i}: {algorithm:?} {quota}; "));
        builder = builder.policy(Policy::new(format!("p{i}"), quota).with_algorithm(algorithm));
    }
    let Ok(layer) = builder.build() else { return };
    let svc = tower::ServiceBuilder::new()
        .layer(layer)
        .service_fn(|_req: Request<()>| async {
            Ok::<_, Infallible>(Response::new(String::new()))
        });
    let send = |key: &'static str, cost: u64| {
        let svc = svc.clone();
        async move {
            let req = Request::builder()
                .header("x-key", key)
                .header("x-cost", cost.to_string())
                .body(())
                .expect("a request");
            let res = svc.oneshot(req).await.expect("infallible");
            let (parts, body) = res.into_parts();
            let body = http_body_util::BodyExt::collect(body)
                .await
                .expect("a complete body")
                .to_bytes();
            let retry = check_response(style, parts.status, &parts.headers, Some(&body));
            (parts.status, retry, parts.headers)
        }
    };
    let steps = g.below(12) + 1;
    let mut now = Duration::ZERO;
    block_on(async {
        for _ in 0..steps {
            let step = match g.byte() % 4 {
                0 => Duration::ZERO,
                1 => Duration::from_nanos(g.pick(&[1, 1_000_000, 1_000_000_000, 59_000_000_000])),
                2 => Duration::from_nanos(g.magnitude() >> g.byte().min(63)),
                _ => Duration::from_secs(g.pick(&[1, 3_600, 86_400])),
            };
            // The manual clock saturates at `u64::MAX` ns (584 years), where time stops and
            // no wait can be honoured: the trace ends before it.
            let Some(later) = now.checked_add(step).filter(|&t| t < END_OF_TIME) else {
                return;
            };
            now = later;
            clock.set_elapsed(now);
            let key = g.pick(&["a", "b", "c"]);
            let cost = cost(&mut g);
            let (status, retry, headers) = send(key, cost).await;
            log.push_str(&format!("\n+{step:?} {key} cost {cost}: {status}"));
            if status != StatusCode::TOO_MANY_REQUESTS {
                continue;
            }
            let Some(secs) = retry else { continue };
            let Some(later) = now
                .checked_add(Duration::from_secs(secs))
                .filter(|&t| t < END_OF_TIME)
            else {
                return;
            };
            now = later;
            clock.set_elapsed(now);
            let (again, _, after) = send(key, cost).await;
            log.push_str(&format!(
                "\n+{secs}s {key} cost {cost} (the same again): {again}"
            ));
            assert_ne!(
                again,
                StatusCode::TOO_MANY_REQUESTS,
                "key {key:?} cost {cost} denied with Retry-After {secs}, then denied again \
                 after waiting it\n{log}\nfirst: {headers:?}\nthen: {after:?}"
            );
        }
    });
}
