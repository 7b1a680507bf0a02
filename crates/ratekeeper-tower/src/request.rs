//! [`RequestParts`]: the borrowed view of a request that closures used as strategies see.

use http::{Extensions, HeaderMap, Method, Request, Uri, Version};

/// The head of a request, borrowed from a [`Request`](https://docs.rs/http/1/http/request/struct.Request.html) of any body type.
///
/// The strategy traits ([`KeyExtractor`](crate::key::KeyExtractor),
/// [`Cost`](crate::cost::Cost)) have no body type parameter: their method is generic over the
/// body, so one extractor works for every service it is layered on. A closure cannot be
/// generic, so closures are strategies when they take a `&RequestParts<'_>`, which has no
/// body type: the method, URI, version, headers and extensions of the request, borrowed (a
/// few pointers, nothing copied or allocated).
///
/// ```
/// use axum::http::{Method, Request};
/// use ratekeeper_tower::RequestParts;
///
/// let req = Request::post("/search?q=x").header("x-tenant", "acme").body(()).unwrap();
/// let parts = RequestParts::new(&req);
/// assert_eq!(parts.method(), Method::POST);
/// assert_eq!(parts.uri().path(), "/search");
/// assert_eq!(parts.headers()["x-tenant"], "acme");
/// ```
#[derive(Debug, Clone, Copy)]
pub struct RequestParts<'a> {
    method: &'a Method,
    uri: &'a Uri,
    version: Version,
    headers: &'a HeaderMap,
    extensions: &'a Extensions,
}

impl<'a> RequestParts<'a> {
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

    /// The request target.
    #[inline]
    pub fn uri(&self) -> &'a Uri {
        self.uri
    }

    /// The HTTP version.
    #[inline]
    pub fn version(&self) -> Version {
        self.version
    }

    /// The header fields.
    #[inline]
    pub fn headers(&self) -> &'a HeaderMap {
        self.headers
    }

    /// The extensions (peer address, authenticated user, matched route, ...).
    #[inline]
    pub fn extensions(&self) -> &'a Extensions {
        self.extensions
    }
}

impl<'a, B> From<&'a Request<B>> for RequestParts<'a> {
    #[inline]
    fn from(req: &'a Request<B>) -> Self {
        Self::new(req)
    }
}
