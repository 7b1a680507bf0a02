//! The layer's own answers to gRPC requests: trailers-only responses instead of HTTP
//! statuses, which gRPC clients would read as `UNAVAILABLE` (429, 503) or `INTERNAL` (400).
//!
//! Only layers that serve gRPC answer this way (`grpc(true)` on the builder): elsewhere a
//! client could send `content-type: application/grpc` and turn its own 429 into a 200. Only
//! the deny path looks at the request, once.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD_NO_PAD;
use bytes::Bytes;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderValue, StatusCode, Version};

use crate::headers::{GRPC_MESSAGE, GRPC_STATUS, GRPC_STATUS_DETAILS_BIN};

/// The start of every gRPC media type, in lower case.
const PREFIX: &[u8] = b"application/grpc";

/// gRPC status `INVALID_ARGUMENT`.
const INVALID_ARGUMENT: u8 = 3;
/// gRPC status `RESOURCE_EXHAUSTED`.
const RESOURCE_EXHAUSTED: u8 = 8;
/// gRPC status `INTERNAL`.
const INTERNAL: u8 = 13;
/// gRPC status `UNAVAILABLE`.
const UNAVAILABLE: u8 = 14;

/// The `type_url` of `google.rpc.RetryInfo` in a `google.protobuf.Any`.
const RETRY_INFO_TYPE_URL: &str = "type.googleapis.com/google.rpc.RetryInfo";

/// The `content-type` of a gRPC call, `None` for any other request, by the protocols'
/// grammars: gRPC over HTTP/2 (`application/grpc` or `application/grpc+<format>`, on an
/// HTTP/2 request only, as that protocol requires) and gRPC-Web (`application/grpc-web`,
/// `application/grpc-web-text`, each with an optional `+<format>`, on any HTTP version). The
/// media type is compared case-insensitively (RFC 9110 §8.3.1) and may carry parameters
/// (`; charset=...`); `application/grpcfoo` is not gRPC. The layer's answer carries the same
/// value, so a gRPC-Web client gets a gRPC-Web response.
#[inline]
pub(crate) fn grpc_content_type(version: Version, headers: &HeaderMap) -> Option<HeaderValue> {
    let value = headers.get(CONTENT_TYPE)?;
    let bytes = value.as_bytes().trim_ascii_start();
    // Every gRPC media type starts with `application/grpc` (16 bytes): most requests of a
    // layer that serves gRPC end here, without splitting or lower-casing anything.
    let (prefix, _) = bytes.split_at_checked(PREFIX.len())?;
    if !prefix.eq_ignore_ascii_case(PREFIX) {
        return None;
    }
    let media = bytes
        .split(|&b| b == b';')
        .next()
        .unwrap_or_default()
        .trim_ascii();
    let subtype = media.get(b"application/".len()..)?;
    let (base, format) = match subtype.iter().position(|&b| b == b'+') {
        Some(plus) => (&subtype[..plus], Some(&subtype[plus + 1..])),
        None => (subtype, None),
    };
    if format.is_some_and(|f| {
        f.is_empty()
            || !f
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(b))
    }) {
        return None;
    }
    let ok = if base.eq_ignore_ascii_case(b"grpc") {
        version == Version::HTTP_2
    } else {
        base.eq_ignore_ascii_case(b"grpc-web") || base.eq_ignore_ascii_case(b"grpc-web-text")
    };
    ok.then(|| value.clone())
}

/// Rewrites an answer of the layer (a 429, the fail-closed 503, a key error) as a gRPC
/// trailers-only response: HTTP 200, the request's `content-type` (`content_type`, from
/// [`grpc_content_type`]), `grpc-status`,
/// a percent-encoded `grpc-message` and an empty body. Every other field (`Retry-After`, the
/// rate-limit fields, `Cache-Control`) stays, as response metadata.
///
/// - 429 → `RESOURCE_EXHAUSTED` (8), naming `policy` and the retry time, with a
///   `grpc-status-details-bin` holding a `google.rpc.Status` whose one detail is a
///   `google.rpc.RetryInfo` of the same delay. When the cost can never fit (a 429 without
///   `Retry-After`) the status is still `RESOURCE_EXHAUSTED`, but without any retry time.
/// - 503 → `UNAVAILABLE` (14), with the same `grpc-status-details-bin` when it has a
///   `Retry-After` (the fail-closed 503 always does).
/// - another 4xx (a request without a key) → `INVALID_ARGUMENT` (3), another 5xx → `INTERNAL`
///   (13), with the plain-text body as the message.
pub(crate) fn trailers_only(
    status: StatusCode,
    headers: &mut HeaderMap,
    body: &[u8],
    policy: Option<&str>,
    content_type: HeaderValue,
) -> (StatusCode, Bytes) {
    let retry_secs = headers
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let (code, message) = match status {
        StatusCode::TOO_MANY_REQUESTS => {
            let policy = policy.unwrap_or("rate limit");
            let message = match retry_secs {
                Some(secs) => format!("rate limit \"{policy}\" exceeded; retry after {secs} s"),
                None => format!(
                    "rate limit \"{policy}\" exceeded: the request costs more than the policy can ever allow; do not retry"
                ),
            };
            (RESOURCE_EXHAUSTED, message)
        }
        StatusCode::SERVICE_UNAVAILABLE => (UNAVAILABLE, "rate limiter unavailable".to_owned()),
        s => {
            let code = if s.is_client_error() {
                INVALID_ARGUMENT
            } else {
                INTERNAL
            };
            (code, String::from_utf8_lossy(body).trim_end().to_owned())
        }
    };
    headers.remove(CONTENT_LENGTH);
    headers.insert(CONTENT_TYPE, content_type);
    headers.insert(GRPC_STATUS.clone(), code_value(code));
    let encoded = percent_encode(&message);
    if let Ok(value) = HeaderValue::try_from(encoded) {
        headers.insert(GRPC_MESSAGE.clone(), value);
    }
    if let (RESOURCE_EXHAUSTED | UNAVAILABLE, Some(secs)) = (code, retry_secs) {
        let details = STANDARD_NO_PAD.encode(rpc_status_with_retry(code, &message, secs));
        if let Ok(value) = HeaderValue::try_from(details) {
            headers.insert(GRPC_STATUS_DETAILS_BIN.clone(), value);
        }
    }
    (StatusCode::OK, Bytes::new())
}

fn code_value(code: u8) -> HeaderValue {
    match code {
        INVALID_ARGUMENT => HeaderValue::from_static("3"),
        RESOURCE_EXHAUSTED => HeaderValue::from_static("8"),
        UNAVAILABLE => HeaderValue::from_static("14"),
        _ => HeaderValue::from_static("13"),
    }
}

/// Percent-encodes a `grpc-message` as the gRPC over HTTP/2 protocol says: every byte
/// outside `%x20-%x7E`, and `%` itself, becomes `%XX` (UTF-8 bytes, upper-case hex).
pub(crate) fn percent_encode(message: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = String::with_capacity(message.len());
    for &b in message.as_bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0x0f)]));
        }
    }
    out
}

/// The protobuf encoding of `google.rpc.Status { code, message, details: [Any(RetryInfo {
/// retry_delay: Duration { seconds } })] }`.
fn rpc_status_with_retry(code: u8, message: &str, secs: u64) -> Vec<u8> {
    // google.protobuf.Duration { int64 seconds = 1; }
    let mut duration = Vec::with_capacity(11);
    if secs > 0 {
        duration.push(0x08);
        varint(secs, &mut duration);
    }
    // google.rpc.RetryInfo { Duration retry_delay = 1; }
    let mut retry_info = Vec::with_capacity(duration.len() + 2);
    bytes_field(1, &duration, &mut retry_info);
    // google.protobuf.Any { string type_url = 1; bytes value = 2; }
    let mut any = Vec::with_capacity(RETRY_INFO_TYPE_URL.len() + retry_info.len() + 4);
    bytes_field(1, RETRY_INFO_TYPE_URL.as_bytes(), &mut any);
    bytes_field(2, &retry_info, &mut any);
    // google.rpc.Status { int32 code = 1; string message = 2; repeated Any details = 3; }
    let mut status = Vec::with_capacity(message.len() + any.len() + 8);
    status.push(0x08);
    varint(u64::from(code), &mut status);
    bytes_field(2, message.as_bytes(), &mut status);
    bytes_field(3, &any, &mut status);
    status
}

/// A length-delimited field (wire type 2); `field` is below 16, so its tag is one byte.
fn bytes_field(field: u8, data: &[u8], out: &mut Vec<u8>) {
    out.push((field << 3) | 2);
    varint(data.len() as u64, out);
    out.extend_from_slice(data);
}

fn varint(mut n: u64, out: &mut Vec<u8>) {
    while n >= 0x80 {
        out.push((n as u8 & 0x7f) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRPC: HeaderValue = HeaderValue::from_static("application/grpc");

    #[test]
    fn percent_encoding_follows_the_grpc_spec() {
        assert_eq!(percent_encode("retry after 1 s"), "retry after 1 s");
        assert_eq!(percent_encode("100% \"q\""), "100%25 \"q\"");
        assert_eq!(percent_encode("é\n"), "%C3%A9%0A");
    }

    #[test]
    fn detects_grpc_content_types_by_their_grammar() {
        let h2 = Version::HTTP_2;
        let h1 = Version::HTTP_11;
        let mut h = HeaderMap::new();
        assert_eq!(grpc_content_type(h2, &h), None);
        for other in [
            "application/json",
            "application/grpcfoo",
            "application/grpc+",
            "application/grpc-webx",
            "text/grpc",
            "application/grpc+pro to",
        ] {
            h.insert(CONTENT_TYPE, HeaderValue::from_static(other));
            assert_eq!(grpc_content_type(h2, &h), None, "{other}");
        }
        for grpc in [
            "application/grpc",
            "application/grpc+proto",
            "Application/GRPC",
            "application/grpc; charset=utf-8",
        ] {
            h.insert(CONTENT_TYPE, HeaderValue::from_static(grpc));
            assert_eq!(
                grpc_content_type(h2, &h),
                Some(HeaderValue::from_static(grpc))
            );
            // gRPC proper is HTTP/2 only.
            assert_eq!(grpc_content_type(h1, &h), None, "{grpc}");
        }
        for web in [
            "application/grpc-web",
            "application/grpc-web+proto",
            "application/grpc-web-text",
        ] {
            h.insert(CONTENT_TYPE, HeaderValue::from_static(web));
            for version in [h1, h2] {
                assert_eq!(
                    grpc_content_type(version, &h),
                    Some(HeaderValue::from_static(web))
                );
            }
        }
    }

    #[test]
    fn a_grpc_web_call_gets_a_grpc_web_answer() {
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, HeaderValue::from_static("7"));
        let (status, body) = trailers_only(
            StatusCode::TOO_MANY_REQUESTS,
            &mut headers,
            b"",
            Some("api"),
            HeaderValue::from_static("application/grpc-web+proto"),
        );
        assert_eq!(status, StatusCode::OK);
        assert!(body.is_empty());
        assert_eq!(headers[CONTENT_TYPE], "application/grpc-web+proto");
        assert_eq!(headers["grpc-status"], "8");
    }

    #[test]
    fn varints_match_protobuf() {
        let mut out = Vec::new();
        varint(300, &mut out);
        assert_eq!(out, [0xac, 0x02]);
        out.clear();
        varint(1, &mut out);
        assert_eq!(out, [0x01]);
    }

    #[test]
    fn retry_info_encoding_is_byte_exact() {
        let bytes = rpc_status_with_retry(8, "m", 2);
        let mut expected = vec![0x08, 0x08, 0x12, 0x01, b'm', 0x1a, 48, 0x0a, 40];
        expected.extend_from_slice(RETRY_INFO_TYPE_URL.as_bytes());
        expected.extend_from_slice(&[0x12, 4, 0x0a, 2, 0x08, 2]);
        assert_eq!(bytes, expected);
    }

    #[test]
    fn a_429_becomes_resource_exhausted_with_retry_info() {
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, HeaderValue::from_static("3"));
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        headers.insert(CONTENT_LENGTH, HeaderValue::from_static("120"));
        let (status, body) = trailers_only(
            StatusCode::TOO_MANY_REQUESTS,
            &mut headers,
            b"{}",
            Some("burst"),
            GRPC,
        );
        assert_eq!(status, StatusCode::OK);
        assert!(body.is_empty());
        assert_eq!(headers[CONTENT_TYPE], "application/grpc");
        assert!(headers.get(CONTENT_LENGTH).is_none());
        assert_eq!(headers["grpc-status"], "8");
        assert_eq!(
            headers["grpc-message"],
            "rate limit \"burst\" exceeded; retry after 3 s"
        );
        assert_eq!(headers[RETRY_AFTER], "3");
        let details = STANDARD_NO_PAD
            .decode(headers["grpc-status-details-bin"].as_bytes())
            .unwrap();
        assert_eq!(
            details,
            rpc_status_with_retry(8, "rate limit \"burst\" exceeded; retry after 3 s", 3)
        );
    }

    #[test]
    fn cannot_fit_has_no_retry_information() {
        let mut headers = HeaderMap::new();
        trailers_only(
            StatusCode::TOO_MANY_REQUESTS,
            &mut headers,
            b"",
            Some("burst"),
            GRPC,
        );
        assert_eq!(headers["grpc-status"], "8");
        assert_eq!(
            headers["grpc-message"],
            "rate limit \"burst\" exceeded: the request costs more than the policy can ever allow; do not retry"
        );
        assert!(headers.get("grpc-status-details-bin").is_none());
        assert!(headers.get(RETRY_AFTER).is_none());
    }

    /// The fail-closed 503 keeps its message and says when to retry, as a 429 does: the
    /// `retry-after` metadata and a `RetryInfo` of the same seconds.
    #[test]
    fn a_fail_closed_503_becomes_unavailable_with_retry_info() {
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, HeaderValue::from_static("2"));
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        let (status, body) = trailers_only(
            StatusCode::SERVICE_UNAVAILABLE,
            &mut headers,
            b"{}",
            None,
            GRPC,
        );
        assert_eq!(status, StatusCode::OK);
        assert!(body.is_empty());
        assert_eq!(headers[CONTENT_TYPE], "application/grpc");
        assert_eq!(headers["grpc-status"], "14");
        assert_eq!(headers["grpc-message"], "rate limiter unavailable");
        assert_eq!(headers[RETRY_AFTER], "2");
        let details = STANDARD_NO_PAD
            .decode(headers["grpc-status-details-bin"].as_bytes())
            .unwrap();
        assert_eq!(
            details,
            rpc_status_with_retry(14, "rate limiter unavailable", 2)
        );
    }

    #[test]
    fn fail_closed_and_key_errors_map_to_their_codes() {
        let mut headers = HeaderMap::new();
        trailers_only(
            StatusCode::SERVICE_UNAVAILABLE,
            &mut headers,
            b"x",
            None,
            GRPC,
        );
        assert_eq!(headers["grpc-status"], "14");
        assert_eq!(headers["grpc-message"], "rate limiter unavailable");
        // Without a `Retry-After` there is no retry time to repeat.
        assert!(headers.get("grpc-status-details-bin").is_none());

        let mut headers = HeaderMap::new();
        trailers_only(
            StatusCode::BAD_REQUEST,
            &mut headers,
            b"missing x-api-key\n",
            None,
            GRPC,
        );
        assert_eq!(headers["grpc-status"], "3");
        assert_eq!(headers["grpc-message"], "missing x-api-key");

        let mut headers = HeaderMap::new();
        trailers_only(
            StatusCode::INTERNAL_SERVER_ERROR,
            &mut headers,
            b"misconfigured\n",
            None,
            GRPC,
        );
        assert_eq!(headers["grpc-status"], "13");
    }
}
