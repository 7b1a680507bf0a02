//! Combinators: [`Or`] (fall back when a key is missing) and tuples (several keys at once).

use http::Request;
use ratekeeper_core::Key;

use super::{ForwardedIp, KeyError, KeyExtractor};

/// Tries `first`; when it reports [`KeyError::Missing`], tries `second`. A
/// [`KeyError::Misconfigured`] from `first` is returned as is (a broken server is not an
/// anonymous client).
///
/// # Example
///
/// ```
/// use axum::http::Request;
/// use ratekeeper_core::Key;
/// use ratekeeper_tower::key::{GlobalKey, HeaderKey, KeyExtractor, Or};
///
/// let key = Or::new(HeaderKey::raw("x-api-key"), GlobalKey);
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

impl<A, B> KeyExtractor for Or<A, B>
where
    A: KeyExtractor,
    B: KeyExtractor,
{
    fn extract<Body>(&self, req: &Request<Body>) -> Result<Key, KeyError> {
        match self.first.extract(req) {
            Err(e) if e.is_missing() => self.second.extract(req),
            other => other,
        }
    }

    fn keys_by_peer(&self) -> bool {
        self.first.keys_by_peer() || self.second.keys_by_peer()
    }

    fn trusted_proxies(&self) -> Option<&ForwardedIp> {
        self.first
            .trusted_proxies()
            .or_else(|| self.second.trusted_proxies())
    }

    fn check(&self) -> Result<(), crate::BuildError> {
        self.first.check()?;
        self.second.check()
    }
}

/// Tuples of extractors are extractors: the key is the tuple of their keys (for example
/// `(MatchedRoute, PeerIp::new())` for a bucket per route and client), missing when any part
/// is missing. Implemented for pairs and triples.
///
/// ```
/// use axum::http::Request;
/// use ratekeeper_tower::key::{GlobalKey, KeyExtractor};
///
/// let key = (GlobalKey, GlobalKey).extract(&Request::new(())).unwrap();
/// assert_eq!(key.to_string(), "(global,global)");
/// ```
impl<A, B> KeyExtractor for (A, B)
where
    A: KeyExtractor,
    B: KeyExtractor,
{
    fn extract<Body>(&self, req: &Request<Body>) -> Result<Key, KeyError> {
        Ok(Key::tuple([self.0.extract(req)?, self.1.extract(req)?]))
    }

    fn keys_by_peer(&self) -> bool {
        self.0.keys_by_peer() || self.1.keys_by_peer()
    }

    fn trusted_proxies(&self) -> Option<&ForwardedIp> {
        self.0
            .trusted_proxies()
            .or_else(|| self.1.trusted_proxies())
    }

    fn check(&self) -> Result<(), crate::BuildError> {
        self.0.check()?;
        self.1.check()
    }
}

impl<A, B, C> KeyExtractor for (A, B, C)
where
    A: KeyExtractor,
    B: KeyExtractor,
    C: KeyExtractor,
{
    fn extract<Body>(&self, req: &Request<Body>) -> Result<Key, KeyError> {
        Ok(Key::tuple([
            self.0.extract(req)?,
            self.1.extract(req)?,
            self.2.extract(req)?,
        ]))
    }

    fn keys_by_peer(&self) -> bool {
        self.0.keys_by_peer() || self.1.keys_by_peer() || self.2.keys_by_peer()
    }

    fn trusted_proxies(&self) -> Option<&ForwardedIp> {
        self.0
            .trusted_proxies()
            .or_else(|| self.1.trusted_proxies())
            .or_else(|| self.2.trusted_proxies())
    }

    fn check(&self) -> Result<(), crate::BuildError> {
        self.0.check()?;
        self.1.check()?;
        self.2.check()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::{GlobalKey, HeaderKey, PeerAddr, PeerIp};

    #[test]
    fn or_falls_back_only_when_missing() {
        let api = HeaderKey::raw("x-api-key").in_clear();
        let chain = api.or(PeerIp::new()).or(GlobalKey);
        let mut req = Request::new(());
        // No peer: PeerIp is misconfigured, which is not "missing": no fallback to global.
        assert!(!chain.extract(&req).unwrap_err().is_missing());
        req.extensions_mut()
            .insert(PeerAddr("192.0.2.1:1".parse().unwrap()));
        assert_eq!(chain.extract(&req).unwrap().to_string(), "ip:192.0.2.1");
        req.headers_mut().insert("x-api-key", "k".parse().unwrap());
        assert_eq!(chain.extract(&req).unwrap().to_string(), "(x-api-key,k)");
    }

    /// Combinations report the trust rules of their first part that has some.
    #[test]
    fn combinations_report_the_first_trust_rules() {
        use crate::key::ForwardedIp;
        let a = ForwardedIp::trusting(["10.0.0.0/8".parse().unwrap()]);
        let b = ForwardedIp::trusting(["127.0.0.0/8".parse().unwrap()]);
        let api = HeaderKey::raw("x-api-key").in_clear();
        assert_eq!(api.trusted_proxies(), None);
        assert_eq!(api.clone().or(PeerIp::new()).trusted_proxies(), None);
        assert_eq!(api.clone().or(a.clone()).trusted_proxies(), Some(&a));
        assert_eq!(a.clone().or(b.clone()).trusted_proxies(), Some(&a));
        assert_eq!((GlobalKey, b.clone()).trusted_proxies(), Some(&b));
        assert_eq!((api, GlobalKey, a.clone()).trusted_proxies(), Some(&a));
    }

    #[test]
    fn tuples_are_missing_when_a_part_is() {
        let api = HeaderKey::raw("x-api-key").in_clear();
        let mut req = Request::new(());
        assert!(
            (GlobalKey, api.clone())
                .extract(&req)
                .unwrap_err()
                .is_missing()
        );
        req.headers_mut().insert("x-api-key", "k".parse().unwrap());
        assert_eq!(
            (GlobalKey, api, GlobalKey)
                .extract(&req)
                .unwrap()
                .to_string(),
            "(global,(x-api-key,k),global)"
        );
    }
}
