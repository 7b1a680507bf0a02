//! The answer to a request the layer cannot key ([`Unkeyed`]): an RFC 9457 problem+json
//! `400 Bad Request` in public words (`500` for a server misconfiguration), replaceable
//! through [`Rejection::unkeyed`](super::Rejection::unkeyed) like the 429.

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderValue, Response, StatusCode};

use crate::key::KeyError;

/// The body of the default `400`: the request lacks what the rate limit identifies clients
/// by. It names no header or extractor (the layer's configuration stays private).
const BAD_REQUEST: &[u8] = br#"{"type":"about:blank","title":"Bad Request","status":400,"detail":"The request does not carry what this API identifies clients by for its rate limit (an API key, a credential or a client address), so it cannot be admitted."}"#;

/// The body of the default `500`: the server cannot key any request (no peer address, say).
const INTERNAL: &[u8] = br#"{"type":"about:blank","title":"Internal Server Error","status":500,"detail":"The server cannot apply its rate limit to this request."}"#;

/// A request the layer could not key, as a [`Rejection`](super::Rejection) sees it: no
/// extractor (after every `.or(...)` fallback) found what it reads, or the server is not set
/// up to provide it.
///
/// The default answer ([`Unkeyed::response`]) is an RFC 9457 `application/problem+json`
/// document of type `about:blank`:
///
/// - **`400 Bad Request`** for a missing key ([`KeyError::Missing`]): title
///   `Bad Request`, a `detail` in public words that names no header or extractor. Not
///   `401`: a `401` must carry a `WWW-Authenticate` challenge for the API's auth scheme
///   (RFC 9110 §15.5.2), which the rate limiter does not know; an auth layer that runs
///   first answers `401` itself. To key such requests instead of refusing them, add a
///   fallback extractor (`HeaderKey::raw("x-api-key").or(PeerIp::new())`).
/// - **`500 Internal Server Error`** for a misconfiguration ([`KeyError::Misconfigured`]),
///   also logged as an error.
///
/// A gRPC call to a layer that serves gRPC gets the matching trailers-only answer
/// (`INVALID_ARGUMENT`, `INTERNAL`) instead.
#[derive(Debug, Clone, Copy)]
pub struct Unkeyed<'a> {
    error: &'a KeyError,
}

impl<'a> Unkeyed<'a> {
    pub(crate) const fn new(error: &'a KeyError) -> Self {
        Self { error }
    }

    /// Why the request has no key. Its text names the extractor's input (`key header
    /// absent`): fine for a log line, not meant for clients.
    pub const fn error(&self) -> &'a KeyError {
        self.error
    }

    /// The status of the default answer: `400` for a missing key, `500` for a
    /// misconfiguration.
    pub fn status(&self) -> StatusCode {
        self.error.status()
    }

    /// The default answer's problem+json body.
    pub fn problem_json(&self) -> Bytes {
        if self.status().is_server_error() {
            Bytes::from_static(INTERNAL)
        } else {
            Bytes::from_static(BAD_REQUEST)
        }
    }

    /// The default answer: [`Unkeyed::status`] with the [`Unkeyed::problem_json`] body and
    /// `Content-Type: application/problem+json`.
    pub fn response(&self) -> Response<Bytes> {
        let mut res = Response::new(self.problem_json());
        *res.status_mut() = self.status();
        res.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        res
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_bodies_are_problem_details_in_public_words() {
        for (err, status) in [
            (KeyError::Missing("key header absent"), 400),
            (KeyError::Misconfigured("no peer address"), 500),
        ] {
            let res = Unkeyed::new(&err).response();
            assert_eq!(res.status().as_u16(), status);
            assert_eq!(res.headers()[CONTENT_TYPE], "application/problem+json");
            let v: serde_json::Value = serde_json::from_slice(res.body()).unwrap();
            assert_eq!(v["status"], status);
            assert_eq!(v["type"], "about:blank");
            let detail = v["detail"].as_str().unwrap();
            assert!(
                !detail.contains("header absent") && !detail.contains("peer"),
                "{detail}"
            );
        }
    }
}
