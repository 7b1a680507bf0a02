//! Every header style over real HTTP, byte for byte, on 200 and 429, with two policies and a
//! manual clock; and `Retry-After` is never 0 and never fractional.

use std::num::NonZeroU32;
use std::time::Duration;

use ratekeeper_axum::core::clock::ManualClock;
use ratekeeper_axum::core::store::MemoryStore;
use ratekeeper_axum::report::{HeaderStyle, PartitionKey, ResetFormat};
use ratekeeper_axum::{RateLimitLayer, core::Policy, core::Quota};
use ratekeeper_tests::{TestServer, ok_app};

const PROBLEM_BURST: &str = "{\"type\":\"https://iana.org/assignments/http-problem-types#quota-exceeded\",\
\"title\":\"Too Many Requests\",\"status\":429,\
\"detail\":\"quota exceeded for policy burst; retry after 1 s\",\"violated-policies\":[\"burst\"]}";

/// "burst": 2 per second (burst 2); "daily": 1000 per day. Keyed by peer IP.
async fn serve(
    style: HeaderStyle,
    reset: ResetFormat,
    pk: Option<PartitionKey>,
    clock: ManualClock,
) -> TestServer {
    let mut builder = RateLimitLayer::builder()
        .policy(Policy::new(
            "burst",
            Quota::per_second(NonZeroU32::new(2).unwrap()),
        ))
        .policy(Policy::new(
            "daily",
            Quota::per_day(NonZeroU32::new(1000).unwrap()),
        ))
        .store(MemoryStore::with_clock(clock))
        .headers(style)
        .reset_format(reset);
    if let Some(pk) = pk {
        builder = builder.partition_key(pk);
    }
    TestServer::start(ok_app().layer(builder.build().unwrap())).await
}

/// Every header but `date`, sorted, as `name: value` lines.
fn header_lines(res: &reqwest::Response) -> Vec<String> {
    let mut lines: Vec<String> = res
        .headers()
        .iter()
        .filter(|(n, _)| n.as_str() != "date")
        .map(|(n, v)| format!("{}: {}", n, v.to_str().unwrap()))
        .collect();
    lines.sort();
    lines
}

fn sorted(lines: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = lines.iter().map(|s| (*s).to_owned()).collect();
    v.sort();
    v
}

/// Rate-limit header lines expected for one response in `style`.
struct Expect<'a> {
    x: [&'a str; 3],
    ietf: &'a str,
}

const POLICY: &str = "ratelimit-policy: \"burst\";q=2;w=1, \"daily\";q=1000;w=86400";

fn rate_lines(style: HeaderStyle, e: &Expect<'_>, pk: Option<&str>) -> Vec<String> {
    let x = || {
        vec![
            format!("x-ratelimit-limit: {}", e.x[0]),
            format!("x-ratelimit-remaining: {}", e.x[1]),
            format!("x-ratelimit-reset: {}", e.x[2]),
        ]
    };
    let ietf = || match pk {
        None => vec![POLICY.to_owned(), format!("ratelimit: {}", e.ietf)],
        Some(pk) => vec![
            format!(
                "ratelimit-policy: \"burst\";q=2;w=1;pk={pk}, \"daily\";q=1000;w=86400;pk={pk}"
            ),
            format!(
                "ratelimit: {}",
                e.ietf.replace(", ", &format!(";pk={pk}, ")) + ";pk=" + pk
            ),
        ],
    };
    match style {
        HeaderStyle::XRateLimit => x(),
        HeaderStyle::Ietf => ietf(),
        HeaderStyle::Both => x().into_iter().chain(ietf()).collect(),
        HeaderStyle::IetfLegacy => vec![
            format!("ratelimit-limit: {}", e.x[0]),
            format!("ratelimit-remaining: {}", e.x[1]),
            format!("ratelimit-reset: {}", e.x[2]),
        ],
        _ => vec![],
    }
}

async fn check_style(style: HeaderStyle, reset: ResetFormat, pk: Option<(&str, &str)>) {
    let clock = match reset {
        ResetFormat::UnixEpoch => ManualClock::with_unix_origin(Duration::from_secs(1_700_000_000)),
        _ => ManualClock::new(),
    };
    let server = serve(
        style,
        reset,
        pk.map(|(salt, _)| PartitionKey::salted(salt)),
        clock.clone(),
    )
    .await;
    let pk = pk.map(|(_, value)| value);
    let reset_s = |delta: &'static str| match reset {
        ResetFormat::UnixEpoch => "1700000001",
        _ => delta,
    };

    // t = 0: two 200s.
    let steps = [
        (
            Expect {
                x: ["2", "1", reset_s("1")],
                ietf: "\"burst\";r=1;t=1, \"daily\";r=999;t=87",
            },
            200,
        ),
        (
            Expect {
                x: ["2", "0", reset_s("1")],
                ietf: "\"burst\";r=0;t=1, \"daily\";r=998;t=173",
            },
            200,
        ),
        // t = 0: denied by "burst" for 0.5 s.
        (
            Expect {
                x: ["2", "0", reset_s("1")],
                ietf: "\"burst\";r=0;t=1, \"daily\";r=998;t=173",
            },
            429,
        ),
    ];
    for (i, (expect, status)) in steps.iter().enumerate() {
        let res = server.get("/").send().await.unwrap();
        assert_eq!(res.status(), *status, "{style:?} step {i}");
        let mut want = rate_lines(style, expect, pk);
        if *status == 200 {
            want.extend([
                "content-length: 2".to_owned(),
                "content-type: text/plain; charset=utf-8".to_owned(),
            ]);
            let got = header_lines(&res);
            assert_eq!(
                got,
                sorted(&want.iter().map(|s| &**s).collect::<Vec<_>>()),
                "{style:?} step {i}"
            );
            assert_eq!(res.text().await.unwrap(), "ok");
        } else {
            want.extend([
                "cache-control: no-store".to_owned(),
                format!("content-length: {}", PROBLEM_BURST.len()),
                "content-type: application/problem+json".to_owned(),
                "retry-after: 1".to_owned(),
            ]);
            let got = header_lines(&res);
            assert_eq!(
                got,
                sorted(&want.iter().map(|s| &**s).collect::<Vec<_>>()),
                "{style:?} step {i}"
            );
            assert_eq!(res.text().await.unwrap(), PROBLEM_BURST);
        }
    }

    // t = 0.25 s: still denied, 0.25 s to wait: Retry-After rounds up to 1.
    clock.advance(Duration::from_millis(250));
    let res = server.get("/").send().await.unwrap();
    assert_eq!(res.status(), 429);
    let mut want = rate_lines(
        style,
        &Expect {
            x: ["2", "0", reset_s("1")],
            ietf: "\"burst\";r=0;t=1, \"daily\";r=998;t=173",
        },
        pk,
    );
    want.extend([
        "cache-control: no-store".to_owned(),
        format!("content-length: {}", PROBLEM_BURST.len()),
        "content-type: application/problem+json".to_owned(),
        "retry-after: 1".to_owned(),
    ]);
    assert_eq!(
        header_lines(&res),
        sorted(&want.iter().map(|s| &**s).collect::<Vec<_>>())
    );

    // t = 0.5 s: allowed again; "burst" is full again 1 s later (epoch 1_700_000_001.5 -> ...002).
    clock.advance(Duration::from_millis(250));
    let res = server.get("/").send().await.unwrap();
    assert_eq!(res.status(), 200);
    let reset_last = match reset {
        ResetFormat::UnixEpoch => "1700000002",
        _ => "1",
    };
    let mut want = rate_lines(
        style,
        &Expect {
            x: ["2", "0", reset_last],
            ietf: "\"burst\";r=0;t=1, \"daily\";r=997;t=259",
        },
        pk,
    );
    want.extend([
        "content-length: 2".to_owned(),
        "content-type: text/plain; charset=utf-8".to_owned(),
    ]);
    assert_eq!(
        header_lines(&res),
        sorted(&want.iter().map(|s| &**s).collect::<Vec<_>>())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x_ratelimit_style_byte_for_byte() {
    check_style(HeaderStyle::XRateLimit, ResetFormat::DeltaSeconds, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x_ratelimit_epoch_reset_byte_for_byte() {
    check_style(HeaderStyle::XRateLimit, ResetFormat::UnixEpoch, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ietf_draft_11_style_byte_for_byte() {
    check_style(HeaderStyle::Ietf, ResetFormat::DeltaSeconds, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ietf_draft_11_with_hashed_partition_key() {
    // SHA-256("e2e-salt" 0x00 "ip:127.0.0.1"), first 16 bytes, base64 (computed outside Rust).
    check_style(
        HeaderStyle::Ietf,
        ResetFormat::DeltaSeconds,
        Some(("e2e-salt", ":+MTxdYJGXNwk+aYBbUhKQg==:")),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ietf_legacy_style_byte_for_byte() {
    check_style(HeaderStyle::IetfLegacy, ResetFormat::DeltaSeconds, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_styles_byte_for_byte() {
    check_style(HeaderStyle::Both, ResetFormat::DeltaSeconds, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_rate_limit_headers_but_retry_after_stays() {
    check_style(HeaderStyle::None, ResetFormat::DeltaSeconds, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_is_never_zero_and_never_fractional() {
    let clock = ManualClock::new();
    // 2 per 5 s, burst 2: T = 2.5 s, so waits are fractional seconds.
    let layer = RateLimitLayer::builder()
        .policy(Policy::new(
            "slow",
            Quota::new(2, Duration::from_secs(5)).unwrap(),
        ))
        .store(MemoryStore::with_clock(clock.clone()))
        .build()
        .unwrap();
    let server = TestServer::start(ok_app().layer(layer)).await;
    for _ in 0..2 {
        assert_eq!(server.get("/").send().await.unwrap().status(), 200);
    }
    // At t the wait is 2.5 s - t: 2.5 s -> 3, 1.5 s -> 2, 0.5 s -> 1, 1 ns -> 1.
    let offsets_ns: [(u64, &str); 6] = [
        (0, "3"),
        (1_000_000_000, "2"),
        (1_500_000_000, "1"),
        (2_000_000_000, "1"),
        (2_499_000_000, "1"),
        (2_499_999_999, "1"),
    ];
    for (at, want) in offsets_ns {
        clock.set(at);
        let res = server.get("/").send().await.unwrap();
        assert_eq!(res.status(), 429, "t = {at} ns");
        let value = res.headers()["retry-after"].to_str().unwrap();
        assert_eq!(value, want, "t = {at} ns");
        assert!(value.bytes().all(|b| b.is_ascii_digit()) && value != "0");
    }
    clock.set(2_500_000_000);
    assert_eq!(server.get("/").send().await.unwrap().status(), 200);
}
