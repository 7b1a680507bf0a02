//! [`HeaderKey`]: an API key or other credential from a request header.

use http::Request;
use http::header::HeaderName;
use ratekeeper_core::Key;

use super::{KeyError, KeyExtractor};

/// Header values longer than this many bytes are treated as missing by [`HeaderKey::raw`].
pub const MAX_RAW_LEN: usize = 256;

/// Keys by a request header, usually an API key.
///
/// An absent header, an empty value, a value that is not visible ASCII / UTF-8 (`0xFF`
/// bytes) or, in raw mode, a value longer than [`MAX_RAW_LEN`] bytes is
/// [`KeyError::Missing`], so `.or(PeerIp::new())` falls back to the client IP instead of
/// merging everyone into one `""` bucket.
///
/// Prefer [`HeaderKey::validated`]: it maps the raw value to the principal it authenticates
/// (or `None` for an unknown key, which is then missing too), so rotating or re-spelling a key
/// never creates a fresh bucket. [`HeaderKey::raw`] keys on the header text itself
/// (`(x-api-key,<value>)`), which is only safe when something before the limiter has
/// already rejected unknown keys.
///
/// # Example
///
/// ```
/// use axum::http::Request;
/// use ratekeeper_core::Key;
/// use ratekeeper_tower::key::{HeaderKey, KeyExtractor};
///
/// let api_key = HeaderKey::validated("x-api-key", |raw: &str| match raw {
///     "key-alice" => Some(Key::from("user:alice")),
///     _ => None,
/// });
/// let req = |v: &str| Request::builder().header("x-api-key", v).body(()).unwrap();
/// assert_eq!(api_key.extract(&req("key-alice")).unwrap(), Key::from("user:alice"));
/// assert!(api_key.extract(&req("rotate-0001")).unwrap_err().is_missing());
/// assert!(api_key.extract(&req("")).unwrap_err().is_missing());
/// ```
#[derive(Debug, Clone)]
pub struct HeaderKey<V = Raw> {
    name: HeaderName,
    validate: V,
}

/// The raw-value strategy of [`HeaderKey::raw`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Raw;

impl HeaderKey<Raw> {
    /// Keys on the raw header value, as the tuple `(<header name>,<value>)`.
    ///
    /// # Panics
    ///
    /// When `name` is not a valid lower-case header name (a constant in the program; see
    /// [`HeaderName::from_static`](https://docs.rs/http/1/http/header/struct.HeaderName.html#method.from_static)).
    pub fn raw(name: &'static str) -> Self {
        Self::raw_name(HeaderName::from_static(name))
    }

    /// Like [`HeaderKey::raw`] for a header name built at run time.
    pub fn raw_name(name: HeaderName) -> Self {
        Self {
            name,
            validate: Raw,
        }
    }
}

impl<V> HeaderKey<V> {
    /// Keys on the principal `validate` maps the header value to; `None` (an unknown or
    /// invalid credential) counts as missing.
    ///
    /// # Panics
    ///
    /// When `name` is not a valid lower-case header name (a constant in the program; see
    /// [`HeaderName::from_static`](https://docs.rs/http/1/http/header/struct.HeaderName.html#method.from_static)).
    pub fn validated(name: &'static str, validate: V) -> Self {
        Self {
            name: HeaderName::from_static(name),
            validate,
        }
    }

    /// Like [`HeaderKey::validated`] for a header name built at run time.
    pub fn validated_name(name: HeaderName, validate: V) -> Self {
        Self { name, validate }
    }

    /// The header this extractor reads.
    pub fn name(&self) -> &HeaderName {
        &self.name
    }

    fn value<'r, B>(&self, req: &'r Request<B>) -> Result<&'r str, KeyError> {
        let value = req
            .headers()
            .get(&self.name)
            .ok_or(KeyError::Missing("key header absent"))?;
        let text = value
            .to_str()
            .map_err(|_| KeyError::Missing("key header is not visible ASCII"))?
            .trim();
        if text.is_empty() {
            return Err(KeyError::Missing("key header empty"));
        }
        Ok(text)
    }
}

impl KeyExtractor for HeaderKey<Raw> {
    fn extract<B>(&self, req: &Request<B>) -> Result<Key, KeyError> {
        let text = self.value(req)?;
        if text.len() > MAX_RAW_LEN {
            return Err(KeyError::Missing("key header too long"));
        }
        Ok(Key::tuple([Key::from(self.name.as_str()), Key::from(text)]))
    }
}

impl<V> KeyExtractor for HeaderKey<V>
where
    V: Fn(&str) -> Option<Key> + Send + Sync + 'static,
{
    fn extract<B>(&self, req: &Request<B>) -> Result<Key, KeyError> {
        let text = self.value(req)?;
        (self.validate)(text).ok_or(KeyError::Missing("key header not recognised"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(v: &[u8]) -> Request<()> {
        let mut req = Request::new(());
        req.headers_mut()
            .insert("x-api-key", http::HeaderValue::from_bytes(v).unwrap());
        req
    }

    #[test]
    fn raw_values() {
        let k = HeaderKey::raw("x-api-key");
        assert_eq!(
            k.extract(&req(b"abc")).unwrap().to_string(),
            "(x-api-key,abc)"
        );
        assert!(k.extract(&req(b"")).unwrap_err().is_missing());
        assert!(k.extract(&req(b"\xFF\xFE")).unwrap_err().is_missing());
        assert!(k.extract(&req(&[b'a'; 300])).unwrap_err().is_missing());
        assert!(k.extract(&Request::new(())).unwrap_err().is_missing());
    }
}
