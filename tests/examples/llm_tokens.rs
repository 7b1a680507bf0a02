//! The `llm_tokens` example over real HTTP on loopback: a streamed answer is charged exactly
//! the tokens it sent (the estimate reserved, then settled at the stream's end), a stream
//! the client cancels is charged what it produced, and an estimate that does not fit is
//! refused with the usual 429.
//!
//! The app is the example's own code (`examples/llm_tokens.rs`, included below) with its
//! store on a `ManualClock`: the token budget does not refill during a test, so every count
//! is exact. The budget is read from the store with a free probe (a charge of 0 units).

use std::sync::Arc;
use std::time::Duration;

use ratekeeper_axum::core::Key;
use ratekeeper_axum::core::clock::ManualClock;
use ratekeeper_axum::core::store::{Charge, MemoryStore};
use ratekeeper_tests::{TestServer, fresh_connection_client};

// The example file itself, so the test exercises exactly what `cargo run --example
// llm_tokens` serves; its `main` is unused here.
#[allow(dead_code, unreachable_pub)]
#[path = "../../examples/llm_tokens.rs"]
mod llm_tokens;

use llm_tokens::{Model, TOKENS_PER_MINUTE, TokenLimit};

/// The example's app on a manual clock, its limit (to read the store) and its model.
async fn start() -> (TokenLimit<ManualClock>, Arc<Model>, TestServer) {
    let limit = llm_tokens::limit(ManualClock::new()).expect("the example's limit is valid");
    let model = Arc::new(Model::default());
    let app = llm_tokens::app(limit.clone(), Arc::clone(&model));
    let server = TestServer::start(app)
        .await
        .with_client(fresh_connection_client());
    (limit, model, server)
}

/// The tokens alice has left, read without charging anything.
fn tokens_left(limit: &TokenLimit<ManualClock>) -> u64 {
    let store: &MemoryStore<Key, ManualClock> = limit.store();
    let tokens = limit.policy_ids()[0];
    let alice = Key::from("key:alice");
    let decisions = store
        .check_now(&[Charge::new(tokens, &alice, 0)])
        .expect("a probe of a registered policy");
    u64::from(decisions.as_slice()[0].remaining())
}

/// A prompt of `words` words.
fn prompt(words: usize) -> String {
    vec!["token"; words].join(" ")
}

/// `POST /v1/completions` as alice.
async fn complete(server: &TestServer, words: usize, max_tokens: u64) -> reqwest::Response {
    let body = serde_json::json!({ "prompt": prompt(words), "max_tokens": max_tokens });
    server
        .post("/v1/completions")
        .header("x-api-key", "sk-alice")
        .body(body.to_string())
        .send()
        .await
        .expect("request to the example app")
}

/// `r` of `policy` in the IETF `RateLimit` field (`"tokens";r=9900;t=1, ...`).
fn ietf_remaining(res: &reqwest::Response, policy: &str) -> u64 {
    let field = res.headers()["ratelimit"].to_str().unwrap();
    let item = field
        .split(", ")
        .find(|item| item.starts_with(&format!("\"{policy}\";")))
        .unwrap_or_else(|| panic!("no {policy} item in {field}"));
    let r = item
        .split(';')
        .find_map(|p| p.strip_prefix("r="))
        .unwrap_or_else(|| panic!("no r= in {item}"));
    r.parse().unwrap()
}

/// The `data:` lines of a server-sent-events body.
fn data_lines(body: &str) -> Vec<&str> {
    body.lines().filter(|l| l.starts_with("data:")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_answer_is_charged_exactly_the_tokens_it_sent() {
    let (limit, model, server) = start().await;
    let full = u64::from(TOKENS_PER_MINUTE);

    let res = complete(&server, 20, 100).await;
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["content-type"], "text/event-stream");
    // The headers describe the state after the estimate.
    assert_eq!(ietf_remaining(&res, "tokens"), full - 100);
    assert_eq!(ietf_remaining(&res, "requests"), 59);
    let body = res.text().await.unwrap();
    let lines = data_lines(&body);
    assert_eq!(lines.len(), 21, "{body}");
    assert_eq!(lines.last(), Some(&"data: [DONE]"));
    // Settled at the stream's end: 20 tokens, not the 100 reserved.
    assert_eq!(tokens_left(&limit), full - 20);

    // The next response shows the settled state, minus its own estimate.
    let res = complete(&server, 5, 50).await;
    assert_eq!(ietf_remaining(&res, "tokens"), full - 20 - 50);
    assert_eq!(ietf_remaining(&res, "requests"), 58);
    assert_eq!(data_lines(&res.text().await.unwrap()).len(), 6);
    assert_eq!(tokens_left(&limit), full - 25);
    assert_eq!(model.generated(), 25);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_stream_is_charged_what_it_produced() {
    let (limit, model, server) = start().await;
    let full = u64::from(TOKENS_PER_MINUTE);

    // 2 000 tokens asked for, 5 ms each: the client reads three and hangs up.
    let mut res = complete(&server, 2000, 2000).await;
    assert_eq!(ietf_remaining(&res, "tokens"), full - 2000);
    let mut received = String::new();
    while data_lines(&received).len() < 3 {
        let chunk = res.chunk().await.unwrap().expect("the stream goes on");
        received.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    drop(res);

    // The server learns of it at its next write, drops the stream and settles.
    let mut waited = Duration::ZERO;
    while tokens_left(&limit) == full - 2000 {
        assert!(
            waited < Duration::from_secs(20),
            "the cancelled stream was never settled"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
        waited += Duration::from_millis(10);
    }
    let produced = model.generated();
    assert!((3..2000).contains(&produced), "{produced} tokens produced");
    assert_eq!(tokens_left(&limit), full - produced);
    // Nothing more is generated (or charged) for the dropped stream.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(model.generated(), produced);
    assert_eq!(tokens_left(&limit), full - produced);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_estimate_that_does_not_fit_is_refused_with_a_429() {
    let (limit, _model, server) = start().await;
    let full = u64::from(TOKENS_PER_MINUTE);

    // Two long answers in flight hold 4 096 tokens each (the cap on `max_tokens`).
    let mut first = complete(&server, 4096, 100_000).await;
    let mut second = complete(&server, 4096, 100_000).await;
    assert_eq!(first.status(), 200);
    assert_eq!(ietf_remaining(&second, "tokens"), full - 2 * 4096);
    first.chunk().await.unwrap().expect("a first token");
    second.chunk().await.unwrap().expect("a first token");

    // 1 808 tokens left: a third request reserving 4 096 does not fit.
    let refused = complete(&server, 10, 4096).await;
    assert_eq!(refused.status(), 429);
    assert!(refused.headers().contains_key("retry-after"));
    assert_eq!(ietf_remaining(&refused, "tokens"), full - 2 * 4096);
    assert_eq!(
        refused.headers()["content-type"],
        "application/problem+json"
    );
    let problem: serde_json::Value = serde_json::from_str(&refused.text().await.unwrap()).unwrap();
    assert_eq!(problem["status"], 429);
    // The refused request charged nothing.
    assert_eq!(tokens_left(&limit), full - 2 * 4096);
    // A smaller one fits.
    let small = complete(&server, 3, 1000).await;
    assert_eq!(small.status(), 200);
    drop((first, second));
}
