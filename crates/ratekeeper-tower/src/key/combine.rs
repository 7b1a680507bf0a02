//! Combinators: [`Or`] (fall back when a key is missing) and tuples (several keys at once).

use http::Request;
use ratekeeper_core::Key;

use super::{KeyError, KeyExtractor};

/// Tries `first`; when it reports [`KeyError::Missing`], tries `second`. A
/// [`KeyError::Misconfigured`] from `first` is returned as is (a broken server is not an
/// anonymous client).
///
/// # Example
///
/// ```
/// use http::Request;
/// use ratekeeper_core::Key;
/// use ratekeeper_tower::key::{GlobalKey, HeaderKey, KeyExtractor, Or};
///
/// let key = Or::new(HeaderKey::raw(http::header::HeaderName::from_static("x-api-key")), GlobalKey);
/// assert_eq!(key.extract(&Request::new(())).unwrap(), Key::Global);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Or<A, B> {
    first: A,
    second: B,
}

impl<A, B> Or<A, B> {
    /// `first`, falling back to `second` when the key is missing.
    pub const fn new(first: A, second: B) -> Self {
        Self { first, second }
    }

    /// Adds one more fallback after this chain.
    pub fn or<C>(self, next: C) -> Or<Self, C> {
        Or::new(self, next)
    }
}

impl<Body, A, B> KeyExtractor<Body> for Or<A, B>
where
    A: KeyExtractor<Body>,
    B: KeyExtractor<Body>,
{
    fn extract(&self, req: &Request<Body>) -> Result<Key, KeyError> {
        match self.first.extract(req) {
            Err(e) if e.is_missing() => self.second.extract(req),
            other => other,
        }
    }
}

/// Several extractors at once: the key is the tuple of their keys (for example
/// `(route, client)`), missing when any part is missing.
///
/// # Example
///
/// ```
/// use http::Request;
/// use ratekeeper_tower::key::{GlobalKey, KeyExtractor, Tuple};
///
/// let key = Tuple((GlobalKey, GlobalKey)).extract(&Request::new(())).unwrap();
/// assert_eq!(key.to_string(), "(global,global)");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuple<T>(pub T);

impl<Body, A, B> KeyExtractor<Body> for Tuple<(A, B)>
where
    A: KeyExtractor<Body>,
    B: KeyExtractor<Body>,
{
    fn extract(&self, req: &Request<Body>) -> Result<Key, KeyError> {
        Ok(Key::tuple([self.0.0.extract(req)?, self.0.1.extract(req)?]))
    }
}

impl<Body, A, B, C> KeyExtractor<Body> for Tuple<(A, B, C)>
where
    A: KeyExtractor<Body>,
    B: KeyExtractor<Body>,
    C: KeyExtractor<Body>,
{
    fn extract(&self, req: &Request<Body>) -> Result<Key, KeyError> {
        Ok(Key::tuple([
            self.0.0.extract(req)?,
            self.0.1.extract(req)?,
            self.0.2.extract(req)?,
        ]))
    }
}
