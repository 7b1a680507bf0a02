//! Unit tests of the reporter: bodies, numbers, header styles, merging, the 429 template.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CACHE_CONTROL, RETRY_AFTER};
use http::{HeaderMap, HeaderValue, Response};
use ratekeeper_core::store::Decisions;
use ratekeeper_core::{Decision, Policy};

use super::headers::number;
use super::problem::problem_json;
use super::*;
use crate::headers::*;
use ratekeeper_core::{Outcome, Quota};
use std::num::NonZeroU32;

fn reporter() -> Reporter {
    let q = Quota::per_minute(NonZeroU32::new(10).unwrap());
    Reporter::new(
        &[Policy::new("default", q)],
        HeaderStyle::XRateLimit,
        ResetFormat::DeltaSeconds,
    )
}

#[test]
fn sub_second_retry_after_rounds_up_to_one() {
    let d = Decision::new(
        Outcome::Denied {
            retry_after: Duration::from_millis(1),
        },
        10,
        0,
        Duration::from_millis(1),
    );
    let (status, headers, body) =
        reporter().limited(&Decisions::new([d]), &[0], None, || Duration::ZERO);
    assert_eq!(status, 429);
    assert_eq!(headers[RETRY_AFTER], "1");
    assert_eq!(headers[&X_RATELIMIT_RESET], "1");
    assert_eq!(headers[CACHE_CONTROL], "no-store");
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["violated-policies"][0], "default");
    assert_eq!(v["type"], QUOTA_EXCEEDED_TYPE);
}

#[derive(serde::Serialize)]
struct Problem<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    title: &'static str,
    status: u16,
    detail: String,
    #[serde(rename = "violated-policies")]
    violated_policies: Vec<&'a str>,
}

/// The serde_json rendering the direct writer replaces.
fn serde_body(violated: &[&str], retry_secs: Option<u64>) -> Vec<u8> {
    let detail = match retry_secs {
        Some(secs) => format!(
            "quota exceeded for policy {}; retry after {secs} s",
            violated.join(", ")
        ),
        None => format!(
            "the request's cost is larger than the capacity (burst) of policy {}: it can never be \
             allowed",
            violated.join(", ")
        ),
    };
    serde_json::to_vec(&Problem {
        kind: QUOTA_EXCEEDED_TYPE,
        title: "Too Many Requests",
        status: 429,
        detail,
        violated_policies: violated.to_vec(),
    })
    .unwrap()
}

/// Policy names as the validated builder allows them, and names it would reject, which the
/// reporter must still write as valid JSON: quotes, backslashes, control characters,
/// non-ASCII, the retry mark itself and what follows it in the body.
const ODD_NAMES: [&str; 6] = [
    "we\"ird\\",
    "ctl\u{1}\n\t",
    "späti-\u{1F600}",
    "\u{0}",
    "x\u{0} s\",\"violated-policies\":[",
    "</script>",
];

#[test]
fn problem_body_is_what_serde_json_writes() {
    for names in [
        &["default"][..],
        &["burst", "daily"],
        &["we\"ird\\", "ctl\u{1}"],
        &ODD_NAMES,
    ] {
        for retry in [Some(1), Some(86_400), Some(u64::MAX), None] {
            let fast = problem_json(names, retry);
            assert_eq!(
                String::from_utf8_lossy(&fast),
                String::from_utf8_lossy(&serde_body(names, retry))
            );
        }
    }
}

#[test]
fn problem_body_bytes_for_a_plain_name() {
    let parts = ProblemParts::new("per-ip.v2_x");
    let body = parts.render(17).unwrap();
    assert_eq!(
        std::str::from_utf8(&body).unwrap(),
        "{\"type\":\"https://iana.org/assignments/http-problem-types#quota-exceeded\",\
         \"title\":\"Too Many Requests\",\"status\":429,\
         \"detail\":\"quota exceeded for policy per-ip.v2_x; retry after 17 s\",\
         \"violated-policies\":[\"per-ip.v2_x\"]}"
    );
}

#[test]
fn precomputed_problem_parts_are_what_serde_json_writes() {
    for name in ["default"].into_iter().chain(ODD_NAMES) {
        let parts = ProblemParts::new(name);
        for secs in [0, 1, 600, 86_400, u64::MAX] {
            let body = parts.render(secs).expect("parts are made for every name");
            assert_eq!(
                String::from_utf8_lossy(&body),
                String::from_utf8_lossy(&serde_body(&[name], Some(secs)))
            );
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(v["violated-policies"][0], name);
            assert_eq!(v["status"], 429);
            assert_eq!(
                v["detail"],
                format!("quota exceeded for policy {name}; retry after {secs} s")
            );
        }
    }
}

#[test]
fn numbers_small_and_large() {
    for n in [
        0,
        1,
        9,
        10,
        99,
        1023,
        1024,
        86_400,
        u64::from(u32::MAX),
        u64::MAX,
    ] {
        assert_eq!(number(n), n.to_string().as_str());
    }
}

#[test]
fn cannot_fit_has_no_retry_after() {
    let d = Decision::new(Outcome::CannotFit, 10, 10, Duration::ZERO);
    let (_, headers, body) =
        reporter().limited(&Decisions::new([d]), &[0], None, || Duration::ZERO);
    assert!(headers.get(RETRY_AFTER).is_none());
    assert!(String::from_utf8(body.to_vec()).unwrap().contains("never"));
}

#[test]
fn epoch_reset_rounds_up() {
    let mut r = reporter();
    r.reset = ResetFormat::UnixEpoch;
    let d = Decision::new(Outcome::Allowed, 2, 0, Duration::from_millis(1));
    let mut h = HeaderMap::new();
    r.headers(
        &Decisions::new([d]),
        &[0],
        None,
        || Duration::from_millis(1_700_000_009_999),
        &mut h,
    );
    assert_eq!(h[&X_RATELIMIT_RESET], "1700000010");
}

#[test]
fn ietf_lists_every_policy_once() {
    let mut r = Reporter::new(
        &[
            Policy::new("burst", Quota::per_minute(NonZeroU32::new(100).unwrap())),
            Policy::new("daily", Quota::per_day(NonZeroU32::new(1000).unwrap())),
        ],
        HeaderStyle::Both,
        ResetFormat::DeltaSeconds,
    );
    let ds = Decisions::new([
        Decision::new(Outcome::Allowed, 100, 42, Duration::from_millis(17_200)),
        Decision::new(Outcome::Allowed, 1000, 999, Duration::from_secs(87)),
    ]);
    let mut h = HeaderMap::new();
    h.insert(RATELIMIT.clone(), HeaderValue::from_static("stale"));
    r.headers(&ds, &[0, 1], None, || Duration::ZERO, &mut h);
    assert_eq!(
        h[&RATELIMIT_POLICY],
        "\"burst\";q=100;w=60, \"daily\";q=1000;w=86400"
    );
    assert_eq!(h[&RATELIMIT], "\"burst\";r=42;t=18, \"daily\";r=999;t=87");
    assert_eq!(h.get_all(&RATELIMIT).iter().count(), 1);
    assert_eq!(h[&X_RATELIMIT_REMAINING], "42");

    r.style = HeaderStyle::IetfLegacy;
    let mut h = HeaderMap::new();
    r.headers(&ds, &[0, 1], None, || Duration::ZERO, &mut h);
    assert_eq!(h[&RATELIMIT_LIMIT], "100");
    assert_eq!(h[&RATELIMIT_REMAINING], "42");
    assert_eq!(h[&RATELIMIT_RESET], "18");
    assert!(h.get(&RATELIMIT).is_none());
}

#[test]
fn custom_rejection_keeps_status_and_gets_headers_once() {
    let mut r = reporter();
    r.rejection = Some(Arc::new(|l: &Limited<'_>| {
        let mut res = Response::new(Bytes::from_static(b"{}"));
        *res.status_mut() = l.status();
        res.headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from_static("0"));
        res.headers_mut()
            .append(X_RATELIMIT_LIMIT.clone(), HeaderValue::from_static("1000"));
        res
    }));
    let d = Decision::new(
        Outcome::Denied {
            retry_after: Duration::from_millis(2_500),
        },
        10,
        0,
        Duration::from_secs(60),
    );
    let (status, headers, body) = r.limited(&Decisions::new([d]), &[0], None, || Duration::ZERO);
    assert_eq!(status, 429);
    assert_eq!(&body[..], b"{}");
    assert_eq!(headers[RETRY_AFTER], "3");
    assert_eq!(headers.get_all(&X_RATELIMIT_LIMIT).iter().count(), 1);
    assert_eq!(headers[&X_RATELIMIT_LIMIT], "10");
}

/// A 429 the layer writes states its body's length, once, on the usual path and on the
/// general one; a rejection's own (wrong) `Content-Length` is replaced.
#[test]
fn every_429_carries_the_length_of_its_body() {
    use http::header::CONTENT_LENGTH;

    let d = Decision::new(
        Outcome::Denied {
            retry_after: Duration::from_millis(2_500),
        },
        10,
        0,
        Duration::from_secs(60),
    );
    let ds = Decisions::new([d]);
    let usual = reporter();
    let mut custom = reporter();
    custom.rejection = Some(Arc::new(|l: &Limited<'_>| {
        let mut res = Response::new(Bytes::from_static(b"slow down"));
        *res.status_mut() = l.status();
        res.headers_mut()
            .insert(CONTENT_LENGTH, HeaderValue::from_static("9999"));
        res
    }));
    let mut windowless = reporter();
    windowless.windowless = true;
    for r in [usual, custom, windowless] {
        let (_, headers, body) = r.limited(&ds, &[0], None, || Duration::ZERO);
        assert_eq!(headers.get_all(CONTENT_LENGTH).iter().count(), 1);
        assert_eq!(headers[CONTENT_LENGTH], body.len().to_string().as_str());
    }
}

/// A usual 429 answered again with the same numbers (kept from the last one) is the one
/// rendered anew, field for field and byte for byte, and a change of any number renders
/// again.
#[test]
fn a_repeated_429_is_the_one_rendered_anew() {
    let denied = |retry_ms: u64, remaining: u32, reset_ms: u64| {
        Decisions::new([Decision::new(
            Outcome::Denied {
                retry_after: Duration::from_millis(retry_ms),
            },
            10,
            remaining,
            Duration::from_millis(reset_ms),
        )])
    };
    let fields = |h: &HeaderMap| {
        h.iter()
            .map(|(n, v)| format!("{n}: {}", v.to_str().unwrap()))
            .collect::<Vec<_>>()
    };
    let kept = reporter();
    // (decisions, whether an answer is kept after it)
    for (i, (ds, holds)) in [
        (denied(2_500, 0, 60_000), false),
        (denied(2_500, 0, 60_000), true),
        (denied(2_500, 0, 60_000), true),
        (denied(2_500, 0, 60_000), true),
        (denied(3_500, 0, 60_000), false),
        (denied(3_500, 0, 60_000), true),
        (denied(3_500, 1, 60_000), false),
        (denied(3_500, 1, 61_000), false),
        (denied(3_500, 1, 61_000), true),
        (denied(3_500, 1, 61_000), true),
        (denied(2_500, 0, 60_000), false),
    ]
    .into_iter()
    .enumerate()
    {
        let fresh = reporter().limited(&ds, &[0], None, || Duration::ZERO);
        let again = kept.limited(&ds, &[0], None, || Duration::ZERO);
        assert_eq!(fields(&again.1), fields(&fresh.1), "#{i}");
        assert_eq!(again.2, fresh.2, "#{i}");
        assert_eq!(again.0, fresh.0, "#{i}");
        assert_eq!(kept.recent_429.holds_an_answer(), holds, "#{i}");
    }
}

#[test]
fn an_earlier_more_restrictive_report_is_kept() {
    let r = reporter();
    let report = |remaining: u32, reset_secs: u64, h: &mut HeaderMap| {
        let d = Decision::new(
            Outcome::Allowed,
            10,
            remaining,
            Duration::from_secs(reset_secs),
        );
        r.headers(&Decisions::new([d]), &[0], None, || Duration::ZERO, h);
    };
    let fields = |h: &HeaderMap| {
        [
            &X_RATELIMIT_LIMIT,
            &X_RATELIMIT_REMAINING,
            &X_RATELIMIT_RESET,
        ]
        .map(|n| {
            h.get(n)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("-")
                .to_owned()
        })
    };
    // (inner remaining, inner reset) then this layer's (5, 60): what the response says.
    for (inner, want) in [
        // Inner reported fewer remaining: it stays.
        ((2, 30), ["10", "2", "30"]),
        // Inner reported more remaining: this layer's state replaces it.
        ((7, 30), ["10", "5", "60"]),
        // As many remaining: the later reset wins, whichever layer wrote it.
        ((5, 90), ["10", "5", "90"]),
        ((5, 30), ["10", "5", "60"]),
    ] {
        let mut h = HeaderMap::new();
        report(inner.0, inner.1, &mut h);
        report(5, 60, &mut h);
        assert_eq!(fields(&h), want, "inner {inner:?}");
    }
    // A field that is not a number is replaced.
    let mut h = HeaderMap::new();
    h.insert(
        X_RATELIMIT_REMAINING.clone(),
        HeaderValue::from_static("lots"),
    );
    report(5, 60, &mut h);
    assert_eq!(fields(&h), ["10", "5", "60"]);
    assert_eq!(h.len(), 3);
}

/// An inner report whose reset is a Unix time in seconds or in milliseconds is compared as the
/// wait it means; an implausible one is replaced by this layer's report.
#[test]
fn an_inner_reset_in_unix_seconds_or_milliseconds_is_compared_as_a_wait() {
    let r = reporter();
    let now_secs: u64 = 1_700_000_000;
    let unix_now = || Duration::from_secs(1_700_000_000);
    // This layer: 10 limit, 5 remaining, reset in 60 s (as a delta).
    let d = Decision::new(Outcome::Allowed, 10, 5, Duration::from_secs(60));
    for (inner_reset, want_reset) in [
        // 90 s away in Unix seconds, then in Unix milliseconds: later than 60 s, kept.
        ((now_secs + 90).to_string(), (now_secs + 90).to_string()),
        (
            ((now_secs + 90) * 1_000).to_string(),
            ((now_secs + 90) * 1_000).to_string(),
        ),
        // 30 s away in Unix milliseconds: earlier than 60 s, this layer's reset wins.
        (((now_secs + 30) * 1_000).to_string(), "60".to_owned()),
        // Beyond Unix milliseconds: implausible, replaced.
        ("99999999999999999".to_owned(), "60".to_owned()),
    ] {
        let mut h = HeaderMap::new();
        h.insert(X_RATELIMIT_LIMIT.clone(), HeaderValue::from_static("10"));
        h.insert(X_RATELIMIT_REMAINING.clone(), HeaderValue::from_static("5"));
        h.insert(
            X_RATELIMIT_RESET.clone(),
            HeaderValue::from_str(&inner_reset).unwrap(),
        );
        r.headers(&Decisions::new([d]), &[0], None, unix_now, &mut h);
        assert_eq!(
            h[&X_RATELIMIT_RESET],
            want_reset.as_str(),
            "inner {inner_reset}"
        );
        assert_eq!(h[&X_RATELIMIT_REMAINING], "5");
    }
}

#[test]
fn the_429_template_writes_what_the_general_path_writes() {
    let fast = reporter();
    // The same default rejection, given explicitly, takes the general path.
    let mut general = reporter();
    general.rejection = Some(Arc::new(ProblemJson));
    let fields = |h: &HeaderMap| {
        h.iter()
            .map(|(n, v)| format!("{n}: {}", v.to_str().unwrap()))
            .collect::<Vec<_>>()
    };
    for (remaining, retry_ms, reset_ms, epoch) in [
        (0, 2_500, 60_000, false),
        (0, 1, 1, false),
        (3, 90_000, 3_600_000, false),
        (0, 999_999_000, 86_400_000_000, true),
    ] {
        let d = Decision::new(
            Outcome::Denied {
                retry_after: Duration::from_millis(retry_ms),
            },
            10,
            remaining,
            Duration::from_millis(reset_ms),
        );
        let ds = Decisions::new([d]);
        let mut fast = fast.clone();
        let mut general = general.clone();
        if epoch {
            fast.reset = ResetFormat::UnixEpoch;
            general.reset = ResetFormat::UnixEpoch;
        }
        let now = || Duration::from_secs(1_700_000_000);
        let a = fast.limited(&ds, &[0], None, now);
        let b = general.limited(&ds, &[0], None, now);
        assert!(
            fast.template_fits(&Limited::new(&ds, &fast.names, &[0], &fast.problems))
                .is_some()
        );
        assert_eq!(a.0, b.0);
        assert_eq!(fields(&a.1), fields(&b.1));
        assert_eq!(a.2, b.2);
    }
    // Cannot fit (no Retry-After) takes the general path.
    let ds = Decisions::new([Decision::new(Outcome::CannotFit, 10, 10, Duration::ZERO)]);
    assert!(
        fast.template_fits(&Limited::new(&ds, &fast.names, &[0], &fast.problems))
            .is_none()
    );
}

#[test]
fn advertised_quota_is_the_capacity_over_the_full_refill_time() {
    use ratekeeper_core::Algorithm;

    use super::headers::advertised_quota;
    let q = |limit: u32, period_ms: u64, burst: u32| {
        Quota::new(limit, Duration::from_millis(period_ms))
            .unwrap()
            .with_burst(burst)
            .unwrap()
    };
    // The advertised quota bounds Remaining.
    for (quota, algorithm, want) in [
        (q(1, 1_000, 10), Algorithm::Gcra, (10, 10)),
        (q(100, 60_000, 10), Algorithm::Gcra, (10, 6)),
        (q(10, 60_000, 10), Algorithm::Gcra, (10, 60)),
        (q(1, 1_000, 10), Algorithm::LeakyBucket, (10, 10)),
        (q(100, 60_000, 10), Algorithm::LeakyBucket, (10, 6)),
        // Sub-second refill rounds up to 1 s.
        (q(1_000, 1_000, 10), Algorithm::Gcra, (10, 1)),
        // The quota's own refill time, not the sum of rounded-up emission intervals:
        // 7 × 142 857 143 ns is 1.000000001 s, but 7 per second advertises w=1.
        (q(7, 1_000, 7), Algorithm::Gcra, (7, 1)),
        (q(3, 1_000, 3), Algorithm::LeakyBucket, (3, 1)),
        // 1 per ns still advertises its period.
        (
            q(1_000_000_000, 1_000, 1_000_000_000),
            Algorithm::Gcra,
            (1_000_000_000, 1),
        ),
        // Window algorithms: limit and period (they take no burst).
        (q(1, 1_000, 1), Algorithm::FixedWindow, (1, 1)),
        (q(100, 60_000, 100), Algorithm::SlidingWindow, (100, 60)),
        (q(100, 60_000, 100), Algorithm::SlidingLog, (100, 60)),
    ] {
        let policy = Policy::new("p", quota).with_algorithm(algorithm);
        assert_eq!(advertised_quota(&policy), want, "{algorithm:?} {quota:?}");
    }
}

#[test]
fn remaining_is_never_shown_above_the_advertised_quota() {
    let quota = Quota::per_second(NonZeroU32::new(1).unwrap())
        .with_burst(10)
        .unwrap();
    let r = Reporter::new(
        &[Policy::new("p1", quota)],
        HeaderStyle::Both,
        ResetFormat::DeltaSeconds,
    );
    // A decision that says limit 1 (the per-period limit) and remaining 9 (the bucket), and
    // one whose state is above the quota (written under a larger one).
    for (remaining, shown) in [(9, 9), (10, 10), (25, 10)] {
        let d = Decision::new(Outcome::Allowed, 1, remaining, Duration::from_secs(1));
        let mut h = HeaderMap::new();
        r.headers(&Decisions::new([d]), &[0], None, || Duration::ZERO, &mut h);
        assert_eq!(h[&X_RATELIMIT_LIMIT], "10");
        assert_eq!(h[&X_RATELIMIT_REMAINING], shown.to_string().as_str());
        assert_eq!(h[&RATELIMIT_POLICY], "\"p1\";q=10;w=10");
        assert_eq!(h[&RATELIMIT], format!("\"p1\";r={shown};t=1").as_str());
    }
}

#[test]
fn problem_body_cache_gives_the_body_of_the_seconds_asked() {
    let parts = ProblemParts::new("default");
    for secs in [17, 17, 18, 17, 0, 0, u64::MAX] {
        let body = parts.render(secs).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&body),
            String::from_utf8_lossy(&serde_body(&["default"], Some(secs)))
        );
    }
}
