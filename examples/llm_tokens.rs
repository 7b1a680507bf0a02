//! A language-model endpoint limited by the tokens it generates, as AI gateways do:
//! `POST /v1/completions` with `x-api-key: sk-alice` (or `sk-bob`) and a JSON body
//! `{"prompt": "...", "max_tokens": 50}` streams its answer as server-sent events, one
//! `data: <token>` event per token, then `data: [DONE]`. (The model here is a stand-in: it
//! echoes the prompt's words, one token per word, up to `max_tokens`.)
//!
//! Per API key: **10 000 tokens per minute** and **60 requests per minute**. A token budget
//! cannot be charged exactly up front, as the answer's length is known only at its end, so
//! it is **reserved, then settled**:
//!
//! 1. a layer outside the limit reads `max_tokens` from the JSON body (256 when absent,
//!    at most 4 096, the model's longest answer) into a request extension;
//! 2. the limit charges that estimate to "tokens" and 1 to "requests", and answers `429`
//!    (problem+json, `Retry-After`) when either does not fit;
//! 3. as the answer streams, a tally counts its `data:` events; when the stream ends, or
//!    the client goes away mid-stream, the "tokens" charge is settled to the tokens actually
//!    sent (the rest of the estimate is given back).
//!
//! As the estimate is an upper bound (the model never writes more than `max_tokens`), no
//! key can go over its budget. The rate-limit headers (`RateLimit` per the IETF draft,
//! and `X-RateLimit-*` for the policy with the fewest units left) show the state after the
//! estimate; the next response shows the settled state.
//!
//! ```text
//! ADDR=127.0.0.1:3000 RUST_LOG=info,ratekeeper::usage=debug cargo run --example llm_tokens
//! curl -sN -i -H 'x-api-key: sk-alice' -d '{"prompt": "the quick brown fox", "max_tokens": 100}' \
//!   http://127.0.0.1:3000/v1/completions
//! # ratelimit: "tokens";r=9900;t=1, "requests";r=59;t=1   (the estimate: 100 reserved)
//! # data: the ... data: fox, data: [DONE]                 (4 tokens)
//! # and in the log: settling rate-limit charges to their true cost ... corrections=[(100, 4)]
//! ```
//!
//! (A real clock refills 10 000 tokens a minute, one every 6 ms: the test of this example
//! runs it on a manual clock to show the budget charged exactly.)

use std::convert::Infallible;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use ratekeeper_axum::core::clock::{Clock, MonotonicClock};
use ratekeeper_axum::core::store::MemoryStore;
use ratekeeper_axum::key::HeaderKey;
use ratekeeper_axum::policy::Plan;
use ratekeeper_axum::rate_limit::BoxRateLimitLayer;
use ratekeeper_axum::report::HeaderStyle;
use ratekeeper_axum::usage::{BodyEvent, Usage};
use ratekeeper_axum::{
    BuildError, RateLimitLayer, RequestParts, core::Key, core::Policy, core::Quota,
};

/// Tokens per minute (and burst) per API key.
pub const TOKENS_PER_MINUTE: u32 = 10_000;
/// Requests per minute (and burst) per API key.
pub const REQUESTS_PER_MINUTE: u32 = 60;
/// The estimate when the request does not say `max_tokens`.
pub const DEFAULT_MAX_TOKENS: u64 = 256;
/// The model's longest answer: `max_tokens` is capped here (and so is the estimate).
pub const MAX_TOKENS: u64 = 4_096;
/// The largest request body read (bytes); a larger one is answered `413`.
pub const MAX_BODY: usize = 64 * 1024;
/// The time the stand-in model takes per token.
pub const TOKEN_INTERVAL: Duration = Duration::from_millis(5);

/// The request's `max_tokens`, read from its JSON body by [`read_max_tokens`] before the
/// rate limit sees the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaxTokens(pub u64);

/// Reads `max_tokens` from the JSON body (at most [`MAX_BODY`] bytes) into a [`MaxTokens`]
/// request extension, and passes the request on with the same body.
async fn read_max_tokens(req: Request, next: Next) -> Response {
    let (parts, body) = req.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MAX_BODY).await else {
        return (StatusCode::PAYLOAD_TOO_LARGE, "request body too large\n").into_response();
    };
    let max_tokens = serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .and_then(|v| v.get("max_tokens")?.as_u64());
    let mut req = Request::from_parts(parts, Body::from(bytes));
    if let Some(n) = max_tokens {
        req.extensions_mut().insert(MaxTokens(n));
    }
    next.run(req).await
}

/// The tokens a request may generate, which it reserves: its `max_tokens` (at least 1,
/// [`DEFAULT_MAX_TOKENS`] when absent), capped at [`MAX_TOKENS`].
pub fn estimate(req: &RequestParts<'_>) -> u64 {
    req.extensions()
        .get::<MaxTokens>()
        .map_or(DEFAULT_MAX_TOKENS, |m| m.0)
        .clamp(1, MAX_TOKENS)
}

/// The charges of a request: its [`estimate`] to "tokens", 1 to "requests".
fn charge(req: &RequestParts<'_>, plan: &mut Plan<'_>) {
    plan.charge_cost("tokens", estimate(req)).charge("requests");
}

/// Counts the tokens of a server-sent-events answer: one per `data:` line, but the closing
/// `data: [DONE]`. Lines may be split across body frames; only a line's first bytes are
/// kept while it is incomplete.
pub fn sse_tokens() -> Usage {
    Usage::body(|_head| {
        let mut tokens = 0u64;
        let mut line: Vec<u8> = Vec::new();
        move |event: BodyEvent<'_>| {
            if let BodyEvent::Data(data) = event {
                for &byte in data {
                    if byte == b'\n' {
                        let text = line.strip_suffix(b"\r").unwrap_or(&line);
                        if text.starts_with(b"data:") && text != b"data: [DONE]" {
                            tokens += 1;
                        }
                        line.clear();
                    } else if line.len() < 16 {
                        line.push(byte);
                    }
                }
            }
            tokens
        }
    })
}

/// The demo API keys: `sk-alice` and `sk-bob` (any other key is a `400`; put your own
/// authentication here).
fn api_key(raw: &str) -> Option<Key> {
    match raw {
        "sk-alice" => Some(Key::from("key:alice")),
        "sk-bob" => Some(Key::from("key:bob")),
        _ => None,
    }
}

/// The limit's type, named by its store (whose clock is `C`) alone: a boxed layer.
pub type TokenLimit<C> = BoxRateLimitLayer<MemoryStore<Key, C>>;

/// The limit: per API key, "tokens" ([`TOKENS_PER_MINUTE`], charged the [`estimate`], then
/// settled by [`sse_tokens`]) and "requests" ([`REQUESTS_PER_MINUTE`]), in memory on
/// `clock`.
///
/// # Errors
///
/// A [`BuildError`] if the settings above were inconsistent (they are not).
pub fn limit<C: Clock>(clock: C) -> Result<TokenLimit<C>, BuildError> {
    let per_minute = |n: u32| Quota::per_minute(NonZeroU32::new(n).unwrap_or(NonZeroU32::MIN));
    RateLimitLayer::builder()
        .policy(Policy::new("tokens", per_minute(TOKENS_PER_MINUTE)))
        .policy(Policy::new("requests", per_minute(REQUESTS_PER_MINUTE)))
        .key(HeaderKey::validated("x-api-key", api_key))
        .resolver(charge)
        .usage("tokens", sse_tokens())
        .headers(HeaderStyle::Both)
        .store(MemoryStore::with_clock(clock))
        .build()
        .map(RateLimitLayer::boxed)
}

/// The stand-in model: it counts every token it generates (a real app would export this as
/// a metric).
#[derive(Debug, Default)]
pub struct Model {
    generated: AtomicU64,
}

impl Model {
    /// Tokens generated so far, over all requests.
    pub fn generated(&self) -> u64 {
        self.generated.load(Ordering::Relaxed)
    }
}

/// `POST /v1/completions`: the prompt's words, one token each, up to `max_tokens`, as
/// server-sent events, then `data: [DONE]`.
async fn complete(State(model): State<Arc<Model>>, body: Bytes) -> Response {
    let Ok(request) = serde_json::from_slice::<serde_json::Value>(&body) else {
        return (StatusCode::BAD_REQUEST, "the body must be JSON\n").into_response();
    };
    let prompt = request.get("prompt").and_then(|p| p.as_str()).unwrap_or("");
    let max_tokens = request
        .get("max_tokens")
        .and_then(|m| m.as_u64())
        .unwrap_or(DEFAULT_MAX_TOKENS)
        .min(MAX_TOKENS);
    let words: Vec<String> = prompt
        .split_whitespace()
        .take(usize::try_from(max_tokens).unwrap_or(usize::MAX))
        .map(str::to_owned)
        .collect();
    // The state: the model and the words left, `None` once `[DONE]` was sent.
    let tokens =
        futures_util::stream::unfold(Some((model, words.into_iter())), |state| async move {
            let (model, mut words) = state?;
            let Some(word) = words.next() else {
                return Some((Ok::<_, Infallible>(Event::default().data("[DONE]")), None));
            };
            tokio::time::sleep(TOKEN_INTERVAL).await;
            model.generated.fetch_add(1, Ordering::Relaxed);
            Some((Ok(Event::default().data(word)), Some((model, words))))
        });
    Sse::new(tokens).into_response()
}

/// The app: `POST /v1/completions` behind [`read_max_tokens`] and `limit`, generating with
/// `model`. Serve it as it is (the key is the API key, not the client address).
pub fn app<C: Clock>(limit: TokenLimit<C>, model: Arc<Model>) -> Router {
    Router::new()
        .route("/v1/completions", post(complete))
        .with_state(model)
        // Outside-in from the last one added: the body is read, then the limit, then the
        // handler.
        .layer(limit)
        .layer(middleware::from_fn(read_max_tokens))
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    ratekeeper_examples::init_tracing();
    let app = app(limit(MonotonicClock::new())?, Arc::default());
    ratekeeper_examples::serve(app, &ratekeeper_examples::listen_addr()).await?;
    Ok(())
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    ratekeeper_examples::exit(run().await)
}
