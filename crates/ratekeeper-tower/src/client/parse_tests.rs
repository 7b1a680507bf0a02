//! Unit tests of the announcement parsers (`parse.rs`).

use super::*;
use http::HeaderValue;

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(*k, HeaderValue::from_static(v));
    }
    h
}

const NOW: u64 = 1_700_000_000;

fn wait(status: u16, pairs: &[(&'static str, &'static str)]) -> Option<u64> {
    let status = StatusCode::from_u16(status).unwrap();
    announced_wait_at(status, &headers(pairs), at(NOW)).map(|d| d.as_secs())
}

#[test]
fn retry_after_delay_seconds() {
    assert_eq!(wait(429, &[("retry-after", "6")]), Some(6));
    assert_eq!(wait(429, &[("retry-after", " 0 ")]), Some(0));
    assert_eq!(wait(503, &[("retry-after", "120")]), Some(120));
    // Only a 429 or 503 asks to wait with Retry-After (a redirect may carry one too).
    assert_eq!(wait(301, &[("retry-after", "6")]), None);
    assert_eq!(wait(200, &[("retry-after", "6")]), None);
}

#[test]
fn retry_after_http_dates_in_all_three_forms() {
    // 1_700_000_060 is Tue, 14 Nov 2023 22:14:20 GMT.
    assert_eq!(
        wait(429, &[("retry-after", "Tue, 14 Nov 2023 22:14:20 GMT")]),
        Some(60)
    );
    assert_eq!(
        wait(429, &[("retry-after", "Tuesday, 14-Nov-23 22:14:20 GMT")]),
        Some(60)
    );
    assert_eq!(
        wait(429, &[("retry-after", "Tue Nov 14 22:14:20 2023")]),
        Some(60)
    );
    // A date in the past: no wait.
    assert_eq!(
        wait(429, &[("retry-after", "Tue, 14 Nov 2023 22:12:20 GMT")]),
        Some(0)
    );
}

#[test]
fn malformed_retry_after_is_ignored() {
    for bad in [
        "",
        "-1",
        "1.5",
        "+3",
        "6s",
        "soon",
        "Tue, 99 Nov 2023 22:14:20 GMT",
        "0x10",
    ] {
        let h = {
            let mut h = HeaderMap::new();
            h.insert(RETRY_AFTER, HeaderValue::from_str(bad).unwrap());
            h
        };
        assert_eq!(
            announced_wait_at(StatusCode::TOO_MANY_REQUESTS, &h, at(NOW)),
            None,
            "{bad:?}"
        );
    }
    // Two values: which one? Neither.
    assert_eq!(
        wait(429, &[("retry-after", "1"), ("retry-after", "2")]),
        None
    );
    // Non-UTF-8 bytes.
    let mut h = HeaderMap::new();
    h.insert(RETRY_AFTER, HeaderValue::from_bytes(b"\xff\xfe").unwrap());
    assert_eq!(
        announced_wait_at(StatusCode::TOO_MANY_REQUESTS, &h, at(NOW)),
        None
    );
}

#[test]
fn huge_numbers_are_ignored_not_overflowed() {
    assert_eq!(
        wait(429, &[("retry-after", "99999999999999999999999999999")]),
        None
    );
    assert_eq!(
        wait(
            200,
            &[
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", "999999999999999999999999")
            ]
        ),
        None
    );
    assert_eq!(
        wait(200, &[("ratelimit", "\"a\";r=0;t=999999999999999")]),
        None
    );
    // Beyond the 15 digits of a structured-field integer: malformed.
    assert_eq!(
        wait(200, &[("ratelimit", "\"a\";r=0;t=9999999999999999")]),
        None
    );
    let long = HeaderValue::from_str(&"9".repeat(MAX_VALUE_LEN + 1)).unwrap();
    let mut h = HeaderMap::new();
    h.insert(RETRY_AFTER, long);
    assert_eq!(
        announced_wait_at(StatusCode::TOO_MANY_REQUESTS, &h, at(NOW)),
        None
    );
}

/// Resets in the wrong unit or in the past (the reports
/// <https://github.com/RocketChat/docs-old/issues/1358>, a reset sent in Unix milliseconds, and
/// <https://github.com/withcoral/coral/issues/89>, a reset in the past taken as a huge wait): a
/// reset written as Unix milliseconds (13 digits) is read as milliseconds, not as Unix seconds
/// 50 000 years ahead; a Unix time in the past is no wait; every field reads its numbers by the
/// same plausibility rules.
#[test]
fn reset_values_are_read_by_plausibility_in_every_field() {
    let now_ms = NOW * 1000;
    let exhausted = |reset: String| {
        let mut h = HeaderMap::new();
        h.insert(X_REMAINING, HeaderValue::from_static("0"));
        h.insert(X_LIMIT_FOR_TEST, HeaderValue::from_static("100"));
        h.insert(X_RESET, HeaderValue::from_str(&reset).unwrap());
        announced_wait_at(StatusCode::OK, &h, at(NOW))
    };
    // (a) Unix ms + 1 500 ms: 1.5 s.
    assert_eq!(
        exhausted((now_ms + 1500).to_string()),
        Some(Duration::from_millis(1500))
    );
    // (b) Unix s − 5: already past, no wait.
    assert_eq!(exhausted((NOW - 5).to_string()), Some(Duration::ZERO));
    // Unix ms in the past: no wait. Delay seconds and Unix seconds as before.
    assert_eq!(exhausted((now_ms - 5000).to_string()), Some(Duration::ZERO));
    assert_eq!(exhausted("30".to_owned()), Some(Duration::from_secs(30)));
    assert_eq!(
        exhausted((NOW + 30).to_string()),
        Some(Duration::from_secs(30))
    );
    // More than a year ahead in any unit, or beyond Unix ms: implausible, ignored.
    let year = MAX_ANNOUNCED_SECS;
    assert_eq!(exhausted((NOW + year + 1).to_string()), None);
    assert_eq!(exhausted((now_ms + (year + 1) * 1000).to_string()), None);
    assert_eq!(exhausted((year + 1).to_string()), None);
    assert_eq!(exhausted(year.to_string()), Some(Duration::from_secs(year)));
    assert_eq!(exhausted("1000000000000000".to_owned()), None);
    // The same rules in Retry-After, the legacy trio and the IETF `t`.
    let ms = (now_ms + 2500).to_string();
    let mut h = HeaderMap::new();
    h.insert(RETRY_AFTER, HeaderValue::from_str(&ms).unwrap());
    assert_eq!(
        announced_wait_at(StatusCode::TOO_MANY_REQUESTS, &h, at(NOW)),
        Some(Duration::from_millis(2500))
    );
    let mut h = HeaderMap::new();
    h.insert(LEGACY_REMAINING, HeaderValue::from_static("0"));
    h.insert(LEGACY_RESET, HeaderValue::from_str(&ms).unwrap());
    assert_eq!(
        announced_wait_at(StatusCode::OK, &h, at(NOW)),
        Some(Duration::from_millis(2500))
    );
    let mut h = HeaderMap::new();
    let ietf = format!("\"a\";r=0;t={ms}");
    h.insert(RATELIMIT, HeaderValue::from_str(&ietf).unwrap());
    assert_eq!(
        announced_wait_at(StatusCode::OK, &h, at(NOW)),
        Some(Duration::from_millis(2500))
    );
    // An HTTP-date more than a year ahead is ignored too.
    assert_eq!(
        wait(429, &[("retry-after", "Sun, 14 Nov 2027 22:14:20 GMT")]),
        None
    );
}

/// `X-RateLimit-Limit`, which the reader ignores (a test fixture only).
const X_LIMIT_FOR_TEST: HeaderName = HeaderName::from_static("x-ratelimit-limit");

#[test]
fn ietf_ratelimit_items() {
    assert_eq!(
        wait(200, &[("ratelimit", "\"default\";r=0;t=30")]),
        Some(30)
    );
    // Some left: no wait (a recorded one is shortened).
    assert_eq!(wait(200, &[("ratelimit", "\"default\";r=5;t=30")]), Some(0));
    // The longest wait among exhausted policies; others do not count.
    assert_eq!(
        wait(
            200,
            &[(
                "ratelimit",
                "\"burst\";r=0;t=2, \"day\";r=0;t=3600, \"x\";r=9;t=9999"
            )]
        ),
        Some(3600)
    );
    // Several field lines are one list.
    assert_eq!(
        wait(
            200,
            &[
                ("ratelimit", "\"a\";r=1;t=5"),
                ("ratelimit", "\"b\";r=0;t=7")
            ]
        ),
        Some(7)
    );
    // Other parameters (pk, unknown ones) and token names are fine.
    assert_eq!(
        wait(
            200,
            &[("ratelimit", "\"a\";r=0;t=4;pk=:AAE=:;x=?1;y=1.5;z=tok/en;w")]
        ),
        Some(4)
    );
    assert_eq!(wait(200, &[("ratelimit", "default;r=0;t=8")]), Some(8));
    // r=0 without t says nothing about when.
    assert_eq!(wait(200, &[("ratelimit", "\"a\";r=0")]), None);
    assert_eq!(wait(200, &[("ratelimit", "")]), None);
}

#[test]
fn malformed_ietf_fields_are_ignored_whole() {
    for bad in [
        "\"a\";r=0;t=30,",
        "\"a\";r=0;t=-1",
        "\"a\";r=-0;t=30",
        "\"a\";r=0;t=3.5",
        "\"a\";r=0;t=\"30\"",
        "\"a;r=0;t=30",
        "\"a\";R=0;t=30",
        "\"a\";r=0;t=30 \"b\";r=0;t=5",
        "\"a\";r=0;t=30, ,\"b\"",
        "\"a\";r=0;t",
        "=;r=0;t=30",
        "\"a\\x\";r=0;t=30",
    ] {
        let mut h = HeaderMap::new();
        h.insert(RATELIMIT, HeaderValue::from_str(bad).unwrap());
        assert_eq!(ietf_ratelimit(&h, at(NOW)), None, "{bad:?}");
    }
    // A malformed line spoils the whole list, even when another line is fine.
    assert_eq!(
        wait(
            200,
            &[
                ("ratelimit", "\"a\";r=0;t=7"),
                ("ratelimit", "\"b\";r=zero")
            ]
        ),
        None
    );
}

#[test]
fn x_ratelimit_delta_and_unix_reset() {
    assert_eq!(
        wait(
            200,
            &[("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", "60")]
        ),
        Some(60)
    );
    // Some left: no wait (a recorded one is shortened).
    assert_eq!(
        wait(
            200,
            &[("x-ratelimit-remaining", "1"), ("x-ratelimit-reset", "60")]
        ),
        Some(0)
    );
    // A Unix time (GitHub's convention): the time until then.
    assert_eq!(
        wait(
            200,
            &[
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", "1700000045")
            ]
        ),
        Some(45)
    );
    assert_eq!(
        wait(
            200,
            &[
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", "1600000000")
            ]
        ),
        Some(0)
    );
    // The fields of IETF drafts -00 to -03 read the same way.
    assert_eq!(
        wait(
            200,
            &[("ratelimit-remaining", "0"), ("ratelimit-reset", "9")]
        ),
        Some(9)
    );
    // A 429 names the longest of what it announces.
    assert_eq!(
        wait(
            429,
            &[
                ("retry-after", "6"),
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", "60")
            ]
        ),
        Some(60)
    );
}

#[test]
fn malformed_x_ratelimit_is_ignored() {
    for (rem, reset) in [
        ("0", ""),
        ("0", "soon"),
        ("0", "-5"),
        ("0", "1.5"),
        ("zero", "60"),
        ("-1", "60"),
        ("", "60"),
    ] {
        let mut h = HeaderMap::new();
        h.insert(X_REMAINING, HeaderValue::from_str(rem).unwrap());
        h.insert(X_RESET, HeaderValue::from_str(reset).unwrap());
        assert_eq!(
            announced_wait_at(StatusCode::OK, &h, at(NOW)),
            None,
            "{rem:?} {reset:?}"
        );
    }
    assert_eq!(wait(200, &[("x-ratelimit-remaining", "0")]), None);
    assert_eq!(wait(200, &[("x-ratelimit-reset", "60")]), None);
}

#[test]
fn no_byte_string_panics() {
    // Every one- and two-byte value (of visible ASCII, SP, HTAB and obs-text) in every field.
    let alphabet: Vec<u8> = (0x20..=0x7e).chain([b'\t', 0x80, 0xff]).collect();
    for &a in &alphabet {
        for &b in &alphabet {
            for v in [
                vec![a],
                vec![a, b],
                vec![b'"', a, b],
                vec![b'0', b';', a, b],
            ] {
                let Ok(value) = HeaderValue::from_bytes(&v) else {
                    continue;
                };
                let mut h = HeaderMap::new();
                for name in [RATELIMIT, X_REMAINING, X_RESET, RETRY_AFTER] {
                    h.insert(name, value.clone());
                }
                let w = announced_wait_at(StatusCode::TOO_MANY_REQUESTS, &h, at(NOW));
                assert!(w.is_none_or(|w| w.as_secs() <= MAX_ANNOUNCED_SECS), "{v:?}");
            }
        }
    }
}
