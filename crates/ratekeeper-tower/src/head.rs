//! [`RequestHead`]: a request without its body, as closure strategies see it.
//!
//! A strategy trait generic over the request body (`Resolve<B>`) cannot have a blanket impl
//! for closures without naming the body type, so a closure had to be wrapped. The strategy
//! traits instead take the request through a generic method and hand closures this
//! body-independent view (as tower-http's predicates take the response's parts). Building
//! it copies five references; its accessors read like [`http::Request`]'s.
//!
//! ```
//! use http::{Method, Request};
//! use ratekeeper_tower::head::RequestHead;
//!
//! let req = Request::post("/search?q=x").header("x-api-key", "k1").body(vec![1u8, 2, 3]).unwrap();
//! let head = RequestHead::new(&req);
//! assert_eq!(head.method(), Method::POST);
//! assert_eq!(head.uri().path(), "/search");
//! assert_eq!(head.headers()["x-api-key"], "k1");
//! ```

use http::{Extensions, HeaderMap, Method, Request, Uri, Version};

/// A borrowed request without its body: method, URI, version, headers and extensions.
#[derive(Debug, Clone, Copy)]
pub struct RequestHead<'a> {
    method: &'a Method,
    uri: &'a Uri,
    version: Version,
    headers: &'a HeaderMap,
    extensions: &'a Extensions,
}

impl<'a> RequestHead<'a> {
    /// The head of `req`.
    #[inline]
    pub fn new<B>(req: &'a Request<B>) -> Self {
        Self {
            method: req.method(),
            uri: req.uri(),
            version: req.version(),
            headers: req.headers(),
            extensions: req.extensions(),
        }
    }

    /// The request method.
    #[inline]
    pub fn method(&self) -> &'a Method {
        self.method
    }

    /// The request URI.
    #[inline]
    pub fn uri(&self) -> &'a Uri {
        self.uri
    }

    /// The HTTP version.
    #[inline]
    pub fn version(&self) -> Version {
        self.version
    }

    /// The request headers.
    #[inline]
    pub fn headers(&self) -> &'a HeaderMap {
        self.headers
    }

    /// The request extensions (the peer address, an authenticated user, axum's
    /// `MatchedPath`).
    #[inline]
    pub fn extensions(&self) -> &'a Extensions {
        self.extensions
    }
}

impl<'a, B> From<&'a Request<B>> for RequestHead<'a> {
    #[inline]
    fn from(req: &'a Request<B>) -> Self {
        Self::new(req)
    }
}
