//! Which requests share what a server announced.

use http::request::Parts;

/// Names the bucket a request belongs to: requests with the same key wait for the same
/// announcement.
///
/// Implemented by [`Origin`] (the default) and by every `Fn(&http::request::Parts) -> String`,
/// so a closure can key by anything in the request line and headers, such as the API token a
/// request carries.
///
/// ```
/// use axum::http::Request;
/// use ratekeeper_tower::client::{ClientKey, Origin};
///
/// let (parts, ()) = Request::get("https://api.example.com/v1/items").body(()).unwrap().into_parts();
/// assert_eq!(Origin.key(&parts), "https://api.example.com:443");
///
/// let by_token = |p: &axum::http::request::Parts| {
///     let token = p.headers.get("authorization").and_then(|v| v.to_str().ok());
///     token.unwrap_or("anonymous").to_owned()
/// };
/// assert_eq!(by_token.key(&parts), "anonymous");
/// ```
pub trait ClientKey {
    /// The key of the request whose head is `parts`.
    fn key(&self, parts: &Parts) -> String;
}

impl<F> ClientKey for F
where
    F: Fn(&Parts) -> String,
{
    fn key(&self, parts: &Parts) -> String {
        self(parts)
    }
}

/// The default key: the request's origin, `scheme://host:port`, with the scheme's default
/// port filled in (`http` 80, `https` 443) and the host lower-cased.
///
/// A request whose URI has no authority (a relative URI, as sent to a local tower service)
/// is keyed by its `Host` header instead (`http` assumed); one with neither shares the key
/// `""` with every such request.
///
/// ```
/// use axum::http::Request;
/// use ratekeeper_tower::client::{ClientKey, Origin};
///
/// let key = |req: Request<()>| Origin.key(&req.into_parts().0);
/// assert_eq!(key(Request::get("http://127.0.0.1:3000/a?b").body(()).unwrap()), "http://127.0.0.1:3000");
/// assert_eq!(key(Request::get("http://Example.COM/").body(()).unwrap()), "http://example.com:80");
/// assert_eq!(key(Request::get("/").header("host", "localhost:8080").body(()).unwrap()), "http://localhost:8080");
/// assert_eq!(key(Request::get("/").body(()).unwrap()), "");
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Origin;

impl ClientKey for Origin {
    fn key(&self, parts: &Parts) -> String {
        let scheme = parts.uri.scheme_str().unwrap_or("http");
        let authority = match parts.uri.authority() {
            Some(a) => Some((a.host().to_owned(), a.port_u16())),
            None => parts
                .headers
                .get(http::header::HOST)
                .and_then(|h| h.to_str().ok())
                .and_then(|h| h.parse::<http::uri::Authority>().ok())
                .map(|a| (a.host().to_owned(), a.port_u16())),
        };
        let Some((host, port)) = authority else {
            return String::new();
        };
        let port = port.unwrap_or(if scheme.eq_ignore_ascii_case("https") {
            443
        } else {
            80
        });
        format!(
            "{}://{}:{port}",
            scheme.to_ascii_lowercase(),
            host.to_ascii_lowercase()
        )
    }
}
